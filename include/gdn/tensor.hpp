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
  /// A view of float32 elements of a caller's buffer: `vk_buffer` (a VkBuffer on ctx's device, made
  /// with storage and transfer-source/destination usage) from byte `offset` (a multiple of the
  /// device's minStorageBufferOffsetAlignment), shaped `shape`. No copy; the buffer is the caller's
  /// and stays so (keep it alive while the tensor or a tape holding it lives).
  static Tensor wrap(std::shared_ptr<Context> ctx, std::uint64_t vk_buffer, std::size_t offset,
                     std::vector<std::int64_t> shape, std::string name = "tensor");

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
  /// The VkBuffer handle and the byte offset of the first element in it, for interop with a caller's
  /// own Vulkan code on the same device.
  std::uint64_t vk_buffer() const;
  std::size_t vk_offset() const;


 private:
  friend struct detail::Access;
  std::shared_ptr<detail::TensorStorage> storage_;
};

/// "[2, 3, 4]", for messages.
std::string shape_str(std::span<const std::int64_t> shape);

}  // namespace gdn
