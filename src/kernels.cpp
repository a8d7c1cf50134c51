// SPDX-License-Identifier: MIT
#include "kernels.hpp"

#include <algorithm>
#include <vector>

#include "gdn/spirv.hpp"
#include "vk/spirv_reflect.hpp"

namespace gdn::detail {
namespace {

// The device's pipeline for the shader and specialization (built once per device, shared by layers);
// its bindings and shared memory are the SPIR-V's own (vk/spirv_reflect.hpp).
std::shared_ptr<gpu::Pipeline> make(gpu::Device& dev, const char* name, std::span<const std::uint32_t> spirv,
                                    std::vector<std::uint32_t> spec = {}, std::uint32_t subgroup_size = 0) {
  return dev.pipeline({.name = name, .spirv = spirv, .push_constant_bytes = sizeof(Push), .spec = std::move(spec),
                       .required_subgroup_size = subgroup_size, .full_subgroups = subgroup_size != 0});
}

// The shared memory a shader declares under specialization constants `spec` (bytes).
std::uint64_t shared_of(const char* name, std::span<const std::uint32_t> spirv, std::vector<std::uint32_t> spec) {
  return gpu::reflect_shader(name, spirv, spec).shared_bytes;
}

}  // namespace

CommonKernels build_common(gpu::Device& dev, std::uint32_t conv_taps) {
  return {.conv_fwd = make(dev, "conv_fwd", spirv::conv_fwd, {conv_taps}),
          .conv_bwd = make(dev, "conv_bwd", spirv::conv_bwd, {conv_taps}),
          .gate_prep = make(dev, "gate_prep", spirv::gate_prep)};
}

PerHeadKernels build_per_head(gpu::Device& dev) {
  return {.rec_fwd = make(dev, "rec_fwd", spirv::rec_fwd),
          .rec_bwd = make(dev, "rec_bwd", spirv::rec_bwd),
          .qk_bwd = make(dev, "qk_bwd", spirv::qk_bwd)};
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
                   std::to_string(info.max_subgroup_size) + ") and the device cannot fix one per pipeline"};
  for (std::uint32_t s : {32u, 64u, 16u, 8u})  // 32: four columns per subgroup, the layout tuned for
    if (usable(s) && s >= info.min_subgroup_size && s <= info.max_subgroup_size) return {s, ""};
  return {0, "no subgroup size of 8, 16, 32 or 64 in the device's range"};
}

SubgroupKernels build_subgroup(gpu::Device& dev, std::uint32_t sg, bool with_backward) {
  SubgroupKernels k;
  k.subgroup_size = sg;
  k.rec_fwd2 = make(dev, "rec_fwd2", spirv::rec_fwd2, {sg}, sg);
  k.norm_fwd2 = make(dev, "norm_fwd2", spirv::norm_fwd2);
  k.norm_bwd2 = make(dev, "norm_bwd2", spirv::norm_bwd2);
  if (with_backward) k.qk_bwd2 = make(dev, "qk_bwd2", spirv::qk_bwd2, {sg}, sg);
  return k;
}

namespace {
// Which build of rec_bwd2 runs an interval. GPU builds fix the history's size at compile time (4, 8
// or 16 steps; a shorter interval runs in a larger build). CPU drivers, and intervals over 16, get
// the build with rolled segment loops and the size as a specialization constant: the same math,
// minutes less to compile on lavapipe.
struct BackwardBuild {
  std::span<const std::uint32_t> code;
  std::uint32_t capacity;  // steps of history
};
BackwardBuild backward_build(const DeviceInfo& info, std::uint32_t cs) {
  if (info.type == "cpu" || cs > 16) return {spirv::rec_bwd2_rolled, cs};
  if (cs <= 4) return {spirv::rec_bwd2_cs4, 4};
  if (cs <= 8) return {spirv::rec_bwd2_cs8, 8};
  return {spirv::rec_bwd2_cs16, 16};
}
}  // namespace

std::string subgroup_backward_why_not(const DeviceInfo& info, std::uint32_t subgroup_size, std::uint32_t cs) {
  const auto build = backward_build(info, cs);
  const auto bytes = shared_of("rec_bwd2", build.code, {subgroup_size, build.capacity});
  if (bytes <= info.max_shared_memory) return "";
  return "its backward at a checkpoint interval of " + std::to_string(cs) + " needs " + std::to_string(bytes) +
         " bytes of shared memory and the device has " + std::to_string(info.max_shared_memory) +
         " (a smaller interval needs less)";
}

const gpu::Pipeline& SubgroupKernels::backward_for(gpu::Device& dev, std::uint32_t cs) {
  auto& p = rec_bwd2[cs];
  if (!p) {
    const auto build = backward_build(dev.info(), cs);
    p = make(dev, ("rec_bwd2 (interval " + std::to_string(cs) + ")").c_str(), build.code, {subgroup_size, build.capacity},
             subgroup_size);
  }
  return *p;
}

std::string chunked_why_not(const DeviceInfo& info, std::uint32_t sg, std::uint32_t chunk) {
  if (chunk < 1 || chunk > kMaxChunk)
    return "its chunk length is the checkpoint interval, " + std::to_string(chunk) + " here, and must be 1 to " +
           std::to_string(kMaxChunk);
  const std::vector<std::uint32_t> spec{sg, chunk};
  const auto bytes = std::max({shared_of("chunk_prep", spirv::chunk_prep, spec), shared_of("chunk_dstate", spirv::chunk_dstate, spec),
                               shared_of("chunk_values", spirv::chunk_values, spec), shared_of("chunk_grads", spirv::chunk_grads, spec)});
  if (bytes <= info.max_shared_memory) return "";
  return "chunks of " + std::to_string(chunk) + " need " + std::to_string(bytes) +
         " bytes of shared memory and the device has " + std::to_string(info.max_shared_memory) +
         " (a shorter checkpoint interval needs less)";
}

std::string chunked_matrix_why_not(const DeviceInfo& info, std::uint32_t chunk) {
  if (!info.matrix_f16_16x16x16) return "the device has no 16x16x16 fp16 cooperative matrix (VK_NV_cooperative_matrix)";
  if (chunk != 16) return "they take chunks of 16 tokens, the checkpoint interval is " + std::to_string(chunk);
  const bool sg32 = info.subgroup_size_control ? info.min_subgroup_size <= 32 && 32 <= info.max_subgroup_size
                                               : info.subgroup_size == 32;
  if (!sg32) return "they need subgroups of 32 invocations";
  const std::vector<std::uint32_t> spec{32, chunk};
  const auto bytes = std::max({shared_of("chunk_prep_fwd", spirv::chunk_prep_fwd, {}),
                               shared_of("chunk_fwd_mma", spirv::chunk_fwd_mma, spec),
                               shared_of("chunk_dstate_mma", spirv::chunk_dstate_mma, spec),
                               shared_of("chunk_factors", spirv::chunk_factors, spec),
                               shared_of("chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma, spec)});
  if (bytes > info.max_shared_memory)
    return "they need " + std::to_string(bytes) + " bytes of shared memory and the device has " +
           std::to_string(info.max_shared_memory);
  return "";
}

ChunkedKernels build_chunked(gpu::Device& dev, std::uint32_t sg, std::uint32_t ch, bool matrix_units,
                             std::uint32_t conv_taps) {
  ChunkedKernels k;
  k.qk_bwd = make(dev, "qk_bwd2 (chunked)", spirv::qk_bwd2_chunked, {sg}, sg);
  if (!matrix_units) {
    k.chunk_prep = make(dev, "chunk_prep", spirv::chunk_prep, {sg, ch});
    k.chunk_dstate = make(dev, "chunk_dstate", spirv::chunk_dstate, {sg, ch});
    k.chunk_values = make(dev, "chunk_values", spirv::chunk_values, {sg, ch}, sg);
    k.chunk_grads = make(dev, "chunk_grads", spirv::chunk_grads, {sg, ch}, sg);
  } else {
    k.chunk_dstate_mma = make(dev, "chunk_dstate_mma", spirv::chunk_dstate_mma, {32, ch}, 32);
    k.chunk_factors = make(dev, "chunk_factors", spirv::chunk_factors, {32, ch}, 32);
    k.chunk_pair_bwd_mma = make(dev, "chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma, {32, ch}, 32);
    k.chunk_prep_fwd = make(dev, "chunk_prep_fwd", spirv::chunk_prep_fwd, {}, 32);
    k.chunk_fwd_mma = make(dev, "chunk_fwd_mma", spirv::chunk_fwd_mma, {32, ch}, 32);
    k.conv_bwd_yv = make(dev, "conv_bwd (dv from Yv)", spirv::conv_bwd_yv, {conv_taps});
  }
  return k;
}

}  // namespace gdn::detail
