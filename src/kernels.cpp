// SPDX-License-Identifier: MIT
#include "kernels.hpp"

#include "gdn/spirv.hpp"

namespace gdn::detail {
namespace {

std::unique_ptr<gpu::Pipeline> make(gpu::Device& dev, const char* name, std::span<const std::uint32_t> spirv,
                                    std::uint32_t bindings, std::uint32_t shared_bytes) {
  return dev.create_pipeline({.name = name, .spirv = spirv, .bindings = bindings,
                              .push_constant_bytes = sizeof(Push), .spec = {}, .required_subgroup_size = 0,
                              .full_subgroups = false, .shared_bytes = shared_bytes});
}

constexpr std::uint32_t kD = 128;

}  // namespace

CommonKernels build_common(gpu::Device& dev) {
  return {.conv_fwd = make(dev, "conv_fwd", spirv::conv_fwd, 3, 0),
          .conv_bwd = make(dev, "conv_bwd", spirv::conv_bwd, 4, 0),
          .qk_prep = make(dev, "qk_prep", spirv::qk_prep, 3, 2 * kD * 4),
          .gate_prep = make(dev, "gate_prep", spirv::gate_prep, 5, 0)};
}

PerHeadKernels build_per_head(gpu::Device& dev) {
  return {.rec_fwd = make(dev, "rec_fwd", spirv::rec_fwd, 9, (16 * kD + 5 * kD) * 4),
          .rec_bwd = make(dev, "rec_bwd", spirv::rec_bwd, 17, (16 * kD + 7 * kD) * 4),
          .qk_bwd = make(dev, "qk_bwd", spirv::qk_bwd, 4, 2 * kD * 4)};
}

}  // namespace gdn::detail
