// SPDX-License-Identifier: MIT
// The bench behind `gdn bench` and `gdn-bench`: uses the public API only, as a training loop would.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "gdn/peaks.hpp"

namespace gdn::bench {

/// Runs the bench with command-line `args` (without the program and subcommand names); prints the
/// table to `out`, progress and errors to `err`. Returns the process exit code.
int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// Whether a GPU slowed during the timed work: either ceiling measured after it below 85% of the
/// one measured before (never on a CPU driver, whose times are no performance figures).
bool slowed(const DevicePeaks& before, const DevicePeaks& after, bool cpu);
/// Whether ceilings measured later in a bench run (the start or the end of an attempt) fell below
/// 95% of the best measured in it: a device that slowed before an attempt started, and stayed slow
/// through it, passes slowed() (seen on an H100: fp32 FMA at 86% of the first measure throughout
/// an attempt that followed a discarded one, every kernel 10% to 15% slower; and at 92% and 95% at
/// an attempt's start and end, the compute-bound kernels 6% slower). A steady H100 measured its
/// ceilings within 0.2% of each other. Never on a CPU driver.
bool below_best(const DevicePeaks& best, const DevicePeaks& now, bool cpu);
/// Whether a memory-bound kernel that moved `bytes` (128 MB or more: fewer are bound by launch
/// latency) in `ms` ran below `share` of the copy ceiling; never on a CPU driver.
bool kernel_slowed(double bytes, double ms, double copy_gb_per_s, double share, bool cpu);
/// The share of the copy ceiling below which conv_fwd counts as slowed: it reaches 72% (H200) to 84%
/// (H100) of the copy with float32 qkv, 53% to 71% with bfloat16 qkv (half the bytes in flight), and
/// runs that were slowed as a whole (every kernel about twice its time) showed it at 41% and 58%.
double conv_slowed_share(bool bf16_qkv);

/// The flags, for --help.
std::string usage();

}  // namespace gdn::bench
