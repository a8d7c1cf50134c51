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
/// Whether a memory-bound kernel that moved `bytes` (128 MB or more: fewer are bound by launch
/// latency) in `ms` ran far below the copy ceiling (under 30% of it: conv_fwd reaches about 64% on the
/// H200); never on a CPU driver.
bool kernel_slowed(double bytes, double ms, double copy_gb_per_s, bool cpu);

/// The flags, for --help.
std::string usage();

}  // namespace gdn::bench
