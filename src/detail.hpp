// SPDX-License-Identifier: MIT
// The library's private types behind the public handles (Context, Tensor).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gdn/context.hpp"
#include "gdn/tensor.hpp"
#include "vk/device.hpp"

namespace gdn::detail {

struct ContextImpl {
  explicit ContextImpl(const gpu::DeviceOptions& o) : device(o) {}
  gpu::Device device;
};

struct TensorStorage {
  std::shared_ptr<Context> ctx;  // keeps the device alive as long as the buffer
  std::vector<std::int64_t> shape;
  DType dtype = DType::Float32;
  std::unique_ptr<gpu::Buffer> buffer;
};

// The library's access to what the public handles hide.
struct Access {
  static ContextImpl& impl(Context& c) { return *c.impl_; }
  static TensorStorage& storage(const Tensor& t) { return *t.storage_; }
};

inline gpu::Device& device_of(Context& c) { return Access::impl(c).device; }
inline TensorStorage& storage_of(const Tensor& t) { return Access::storage(t); }

/// The elements of `shape`, refusing a dimension < 1 or a size whose bytes overflow (naming tensor `name`).
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, const std::string& name);
/// Device bytes of n elements of d: bfloat16 pairs are 4-byte words (the kernels' unit).
std::size_t storage_bytes(std::int64_t n, DType d);

}  // namespace gdn::detail
