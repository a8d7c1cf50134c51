// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <cstring>
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

/// How a tensor's elements are stored. The layer computes in float32 whatever its boundary tensors
/// hold (a bfloat16 element is widened exactly on load, rounded to nearest even on store).
enum class DType {
  Float32,
  BFloat16,  // the upper 16 bits of a float32: 8 exponent bits, 7 mantissa bits
};
/// "float32", "bfloat16".
const char* to_string(DType d);
/// Bytes of one element.
inline std::size_t dtype_bytes(DType d) { return d == DType::BFloat16 ? 2 : 4; }

/// x rounded to the nearest bfloat16 (ties to even; above bfloat16's largest finite value: Inf; NaN
/// stays NaN), as its 16 bits. The device's stores round the same way.
inline std::uint16_t to_bfloat16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return std::uint16_t((u >> 16) | 0x40u);  // NaN: quiet, keeps the sign
  return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/// The float32 a bfloat16 holds (exact).
inline float from_bfloat16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

/// A row-major tensor in device memory, of float32 or bfloat16 elements. A cheap handle: copies share
/// the same buffer.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates (uninitialised) device memory for `shape`; `name` appears in error messages.
  Tensor(std::shared_ptr<Context> ctx, std::vector<std::int64_t> shape, std::string name = "tensor",
         DType dtype = DType::Float32);
  /// A view of elements of a caller's buffer: `vk_buffer` (a VkBuffer on ctx's device, made with
  /// storage and transfer-source/destination usage) from byte `offset` (a multiple of the device's
  /// minStorageBufferOffsetAlignment), shaped `shape`, of `dtype`. No copy; the buffer is the caller's
  /// and stays so (keep it alive while the tensor or a tape holding it lives). A bfloat16 view of an
  /// odd number of elements spans its bytes rounded up to a multiple of 4: the 2 bytes after its last
  /// element must lie in the buffer (the layer's stores keep them as they are; fill() does not).
  static Tensor wrap(std::shared_ptr<Context> ctx, std::uint64_t vk_buffer, std::size_t offset,
                     std::vector<std::int64_t> shape, std::string name = "tensor", DType dtype = DType::Float32);

  bool empty() const { return storage_ == nullptr; }
  const std::vector<std::int64_t>& shape() const;
  std::int64_t numel() const;
  const std::string& name() const;
  DType dtype() const;
  /// Bytes its elements occupy on the device (bfloat16: rounded up to a multiple of 4).
  std::size_t bytes() const;

  /// Host -> device; `data.size()` must equal numel(). A bfloat16 tensor stores each value rounded
  /// to nearest even (to_bfloat16).
  void upload(std::span<const float> data);
  /// bfloat16 bits host -> device, as they are; only into a bfloat16 tensor.
  void upload_bf16(std::span<const std::uint16_t> bits);
  /// Device -> host (a bfloat16 tensor's elements widened, exactly).
  std::vector<float> download() const;
  /// A bfloat16 tensor's bits; only from a bfloat16 tensor.
  std::vector<std::uint16_t> download_bf16() const;
  /// Sets every element to `value` (rounded to bfloat16 in a bfloat16 tensor; NaN poisons an output
  /// in tests).
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
