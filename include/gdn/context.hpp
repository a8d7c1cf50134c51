// SPDX-License-Identifier: MIT
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/device_info.hpp"

namespace gdn {

namespace detail {
struct ContextImpl;
struct Access;  // the library's own way in (src/detail.hpp)
}

/// A Vulkan device and what the library keeps on it (pipelines, the pipeline cache). Share one
/// Context between the layers of a model. Threads may share it: its calls take turns.
class Context {
 public:
  struct Options {
    /// Device index or name substring; empty: a discrete GPU, then integrated, then CPU.
    std::string device;
    /// Enable the Khronos validation layer (where installed); errors go to on_validation_error.
    bool validate = false;
    /// Called with each validation error message; default: printed to stderr.
    std::function<void(std::string_view)> on_validation_error;

    /// Options from the environment: GDN_DEVICE (index or name substring) and GDN_VALIDATE=1.
    static Options from_env();
  };

  /// Opens the device. Throws gdn::Error when no usable Vulkan device is found.
  static std::shared_ptr<Context> create(const Options& options = Options::from_env());

  /// Every Vulkan device the loader sees (for `gdn info`).
  static std::vector<DeviceInfo> devices();

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// The chosen device.
  const DeviceInfo& device() const;
  /// Device memory held by the library's buffers (tensors, tapes, workspaces) on this device.
  std::size_t allocated_bytes() const;
  /// Compute pipelines built on this device so far: the Context keeps them, one per shader and
  /// specialization, and every Layer on it shares them (a second Layer of a config builds none).
  std::size_t pipelines_built() const;


 private:
  friend struct detail::Access;
  explicit Context(std::unique_ptr<detail::ContextImpl> impl);
  std::unique_ptr<detail::ContextImpl> impl_;
};

}  // namespace gdn
