// SPDX-License-Identifier: MIT
// The `gdn` command-line tool: `gdn info`, `gdn run` (SPEC.md, "The command-line contract") and
// `gdn bench`. One function, testable in-process: no global state, no exit(), no std::cout.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace gdn::cli {

/// Exit codes of main().
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;  // the device or the library failed (gdn::Error, I/O)
inline constexpr int kExitUsage = 2;    // bad flags or inputs that do not fit together

/// Runs the tool with command-line `args` (without the program name); results to `out`,
/// messages ("gdn: ...") to `err`. Returns the process exit code.
int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// The help text of `gdn --help`.
std::string usage();

}  // namespace gdn::cli
