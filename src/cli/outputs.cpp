// SPDX-License-Identifier: MIT
// `gdn run`'s outputs: written into a staging directory in --out, then swapped into place, so that a
// failure at any point leaves --out as it was (docs/spec.md).
#include <cerrno>
#include <charconv>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "cli/cli.hpp"
#include "cli/npy.hpp"

namespace gdn::cli {
namespace {

namespace fs = std::filesystem;

// ---- gdn run: outputs ----------------------------------------------------------------------------

// A staging directory: ".gdn-run-<pid>-<random>.partial" in --out. It holds the new files, the old
// ones moved aside (NAME.npy.old) and a manifest: one line per output, "NAME 1" where --out held
// something under NAME.npy before the run, "NAME 0" where it did not.
constexpr std::string_view kStagingPrefix = ".gdn-run-", kStagingSuffix = ".partial";

// Puts `dir` back as the manifest of `staging` says it was, and removes `staging`.
void roll_back(const fs::path& dir, const fs::path& staging) {
  std::error_code ec;
  std::ifstream manifest(staging / "manifest");
  std::string name;
  int had_old = 0;
  while (manifest >> name >> had_old) {
    const fs::path target = dir / (name + ".npy"), old = staging / (name + ".npy.old");
    if (had_old) {
      if (fs::exists(fs::symlink_status(old, ec))) {  // moved aside: the target, if any, is new
        fs::remove_all(target, ec);
        fs::rename(old, target, ec);
      }
    } else {
      fs::remove_all(target, ec);  // new, where nothing was
    }
  }
  manifest.close();
  fs::remove_all(staging, ec);
}

// Rolls back and removes the staging directories in `dir` whose run is gone (killed mid-swap).
void recover_stale(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (!n.starts_with(kStagingPrefix) || !n.ends_with(kStagingSuffix)) continue;
    const std::string pid_text = n.substr(kStagingPrefix.size(), n.find('-', kStagingPrefix.size()) - kStagingPrefix.size());
    long pid = 0;
    const auto [ptr, perr] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (perr != std::errc() || pid <= 0 || pid == long(::getpid())) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // still running (or not ours to judge)
    roll_back(dir, it->path());
  }
}

}  // namespace

void write_outputs(const fs::path& dir, const std::vector<Output>& outputs,
                   const std::function<void(const std::string&)>& before_swap) {
  std::error_code ec;
  const bool created = !fs::exists(dir, ec);
  if (created && !fs::create_directories(dir, ec) && ec)
    throw std::runtime_error("--out " + dir.string() + ": cannot create the directory: " + ec.message());
  recover_stale(dir);
  for (const auto& o : outputs) {  // never replace what is not an earlier output
    const auto st = fs::symlink_status(dir / (o.name + ".npy"), ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
      throw std::invalid_argument("--out " + dir.string() + ": " + o.name +
                                  ".npy exists and is not a regular file (gdn run replaces only its own outputs)");
  }
  const fs::path staging = dir / (std::string(kStagingPrefix) + std::to_string(::getpid()) + "-" +
                                  std::to_string(std::random_device{}()) + std::string(kStagingSuffix));
  bool staged = false;
  try {
    if (!fs::create_directory(staging, ec))
      throw std::runtime_error("--out " + dir.string() + ": cannot write: " + ec.message());
    staged = true;
    {
      std::ofstream manifest(staging / "manifest");
      for (const auto& o : outputs)
        manifest << o.name << ' ' << (fs::exists(fs::symlink_status(dir / (o.name + ".npy"), ec)) ? 1 : 0) << '\n';
      if (!manifest.flush()) throw std::runtime_error("--out " + dir.string() + ": cannot write the staging manifest");
    }
    for (const auto& o : outputs) npy::write_f32(staging / (o.name + ".npy"), o.shape, o.data);
    for (const auto& o : outputs) {
      if (before_swap) before_swap(o.name);
      const fs::path target = dir / (o.name + ".npy");
      if (fs::exists(fs::symlink_status(target, ec))) {
        fs::rename(target, staging / (o.name + ".npy.old"), ec);
        if (ec) throw std::runtime_error(target.string() + ": cannot move it aside: " + ec.message());
      }
      fs::rename(staging / (o.name + ".npy"), target, ec);
      if (ec) throw std::runtime_error(target.string() + ": cannot move the new file into place: " + ec.message());
    }
    fs::remove_all(staging, ec);  // the old files with it
  } catch (...) {
    if (staged) roll_back(dir, staging);
    if (created) fs::remove(dir, ec);  // only if still empty
    throw;
  }
}

}  // namespace gdn::cli
