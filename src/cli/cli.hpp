// SPDX-License-Identifier: MIT
// The `gdn` command-line tool: `gdn info`, `gdn run` (docs/spec.md, "The command-line contract") and
// `gdn bench`. One function, testable in-process: no global state, no exit(), no std::cout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
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

/// One output file of `gdn run`: NAME.npy, float32 of `shape`.
struct Output {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

/// Writes `outputs` into `dir` (created if missing) so that a failure at any point leaves `dir`
/// exactly as it was: every file is written into a staging directory inside `dir` first; then, output
/// by output, what `dir` held under that name (a file, or anything else) is moved into the staging
/// directory and the new file moved into place; a failure moves the old ones back. A staging
/// directory that a killed run left behind (its process gone) is rolled back and removed first. An
/// output name that `dir` holds as anything but a regular file is refused (std::invalid_argument).
/// `before_swap(name)`, where given, runs before each output is swapped in (tests inject failures).
void write_outputs(const std::filesystem::path& dir, const std::vector<Output>& outputs,
                   const std::function<void(const std::string&)>& before_swap = {});

}  // namespace gdn::cli
