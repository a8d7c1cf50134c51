// SPDX-License-Identifier: MIT
#include "kernels.hpp"

#include <algorithm>
#include <vector>

#include "gdn/bindings.hpp"
#include "vk/spirv_reflect.hpp"

namespace gdn::detail {

std::shared_ptr<gpu::Pipeline> make_pipeline(gpu::Device& dev, const char* name, std::span<const std::uint32_t> spirv,
                                             std::vector<std::uint32_t> spec, std::uint32_t subgroup_size) {
  return dev.pipeline({.name = name, .spirv = spirv, .push_constant_bytes = sizeof(Push), .spec = std::move(spec),
                       .required_subgroup_size = subgroup_size, .full_subgroups = subgroup_size != 0});
}

std::uint64_t shared_bytes_of(const char* name, std::span<const std::uint32_t> spirv, std::vector<std::uint32_t> spec) {
  return gpu::reflect_shader(name, spirv, spec).shared_bytes;
}

std::string shared_why_not(const DeviceInfo& info, std::initializer_list<ShaderRef> shaders,
                           const std::vector<std::uint32_t>& spec, const std::string& hint) {
  for (const auto& s : shaders) {
    const std::uint64_t bytes = shared_bytes_of(s.name, s.spirv, spec);
    if (bytes > info.max_shared_memory)
      return std::string(s.name) + " needs " + std::to_string(bytes) + " bytes of shared memory and the device has " +
             std::to_string(info.max_shared_memory) + hint;
  }
  return "";
}

CommonKernels build_common(gpu::Device& dev, std::uint32_t conv_taps) {
  CommonKernels k{.gate_prep = make_pipeline<bindings::gate_prep>(dev),
                  .param_part = make_pipeline<bindings::param_part>(dev),
                  .param_sum = make_pipeline<bindings::param_sum>(dev, {conv_taps}),
                  .conv_state_out = make_pipeline<bindings::conv_state_out>(dev),
                  .dev = &dev,
                  .conv_taps = conv_taps};
  k.conv_fwd(0);
  k.conv_bwd(0);
  return k;
}

const gpu::Pipeline& CommonKernels::conv_fwd(std::uint32_t flags) const {
  return *make_pipeline<bindings::conv_fwd>(*dev, conv_spec(conv_taps, flags));
}
const gpu::Pipeline& CommonKernels::conv_bwd(std::uint32_t flags) const {
  return *make_pipeline<bindings::conv_bwd>(*dev, conv_spec(conv_taps, flags));
}

std::shared_ptr<gpu::Pipeline> build_to_bf16(gpu::Device& dev) {
  return make_pipeline<bindings::to_bf16>(dev);
}

SubgroupChoice choose_subgroup_size(const DeviceInfo& info) {
  if (!info.subgroup_shuffle)
    return {0, "the device has no subgroup shuffle and arithmetic operations in compute shaders"};
  // The kernels put 8 lanes on a column and need whole subgroups in a 256-invocation workgroup.
  auto usable = [](std::uint32_t s) { return s >= 8 && s <= 64 && (s & (s - 1)) == 0; };
  if (info.min_subgroup_size == info.max_subgroup_size) {
    if (usable(info.subgroup_size)) return {info.subgroup_size, ""};
    return {0, "subgroups of " + std::to_string(info.subgroup_size) + " (the kernels need 8, 16, 32 or 64)"};
  }
  if (!info.subgroup_size_control)
    return {0, "subgroup sizes vary (" + std::to_string(info.min_subgroup_size) + " to " +
                   std::to_string(info.max_subgroup_size) + ") and " +
                   (std::ranges::count(info.not_enabled, "subgroupSizeControl")
                        ? "the adopted device was created without subgroupSizeControl and computeFullSubgroups "
                          "(Context::requirements lists them)"
                        : "the device cannot fix one per pipeline")};
  for (std::uint32_t s : {32u, 64u, 16u, 8u})  // 32: four columns per subgroup, the layout tuned for
    if (usable(s) && s >= info.min_subgroup_size && s <= info.max_subgroup_size) return {s, ""};
  return {0, "no subgroup size of 8, 16, 32 or 64 in the device's range"};
}

}  // namespace gdn::detail
