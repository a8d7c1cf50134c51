// SPDX-License-Identifier: MIT
#pragma once

#include <cstddef>
#include <cstdint>
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

/// A Vulkan device the caller created, to run gdn on (Context::adopt). The handles are VkInstance,
/// VkPhysicalDevice and VkDevice as void* (this header includes no Vulkan header); gdn uses them and
/// never destroys them: keep them alive until the Context and everything made on it are gone.
/// gdn submits to the queue given: the caller must not submit to it from another thread during a
/// gdn call (Vulkan's external synchronization of a queue).
struct ExternalDevice {
  void* instance = nullptr;
  void* physical_device = nullptr;
  void* device = nullptr;
  std::uint32_t queue_family = 0;  // a family with compute
  std::uint32_t queue_index = 0;
  /// What the caller enabled when it created the device, of DeviceRequirements' features: a kernel
  /// family that needs one left off does not run (as on a device without it).
  bool subgroup_size_control = false;  // Vulkan 1.3's subgroupSizeControl and computeFullSubgroups
  bool cooperative_matrix = false;     // VK_NV_cooperative_matrix's cooperativeMatrix, with shaderFloat16
};

/// What gdn's kernels use of a physical device, for a caller that creates the device itself: enable
/// these extensions and features (those the device has) to let every kernel family run.
struct DeviceRequirements {
  std::uint32_t api_version = 0;        // VK_API_VERSION_1_2 at least
  std::vector<std::string> extensions = {};  // e.g. "VK_NV_cooperative_matrix"
  std::vector<std::string> features = {};    // VkPhysicalDevice*Features members, e.g.
                                        // "VkPhysicalDeviceVulkan13Features::subgroupSizeControl"
};

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

  /// Runs on a device the caller created (ExternalDevice). Throws std::invalid_argument for a missing
  /// handle or a queue without compute, gdn::Error for a device gdn cannot use.
  static std::shared_ptr<Context> adopt(const ExternalDevice& device);
  /// What to enable on `physical_device` (a VkPhysicalDevice) when creating a device to adopt.
  static DeviceRequirements requirements(void* physical_device);

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
