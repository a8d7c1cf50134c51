// SPDX-License-Identifier: MIT
#pragma once

#include <stdexcept>
#include <string>

namespace gdn {

/// A failure the caller can act on: a Vulkan error, a device limit (buffer range, shared memory,
/// workgroup count) or a memory shortfall. Bad caller input is std::invalid_argument instead.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("gdn: " + what) {}
};

}  // namespace gdn
