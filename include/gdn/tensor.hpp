// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gdn {

class Context;
namespace detail {
struct TensorStorage;
struct Access;  // the library's own way in (src/detail.hpp)
}

/// A float32, row-major tensor in device memory. A cheap handle: copies share the same buffer.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates (uninitialised) device memory for `shape`; `name` appears in error messages.
  Tensor(std::shared_ptr<Context> ctx, std::vector<std::int64_t> shape, std::string name = "tensor");

  bool empty() const { return storage_ == nullptr; }
  const std::vector<std::int64_t>& shape() const;
  std::int64_t numel() const;
  const std::string& name() const;

  /// Host -> device; `data.size()` must equal numel().
  void upload(std::span<const float> data);
  /// Device -> host.
  std::vector<float> download() const;
  /// Sets every element to `value` (NaN poisons an output in tests).
  void fill(float value);
  /// The VkBuffer handle, for interop with a caller's own Vulkan code on the same device.
  std::uint64_t vk_buffer() const;


 private:
  friend struct detail::Access;
  std::shared_ptr<detail::TensorStorage> storage_;
};

/// "[2, 3, 4]", for messages.
std::string shape_str(std::span<const std::int64_t> shape);

}  // namespace gdn
