// SPDX-License-Identifier: MIT
#include "kernels.hpp"

#include <algorithm>
#include <vector>

#include "gdn/spirv.hpp"

namespace gdn::detail {
namespace {

// The device's pipeline for the shader and specialization (built once per device, shared by layers).
std::shared_ptr<gpu::Pipeline> make(gpu::Device& dev, const char* name, std::span<const std::uint32_t> spirv,
                                    std::uint32_t bindings, std::uint32_t shared_bytes,
                                    std::vector<std::uint32_t> spec = {}, std::uint32_t subgroup_size = 0) {
  return dev.pipeline({.name = name, .spirv = spirv, .bindings = bindings,
                              .push_constant_bytes = sizeof(Push), .spec = std::move(spec),
                              .required_subgroup_size = subgroup_size, .full_subgroups = subgroup_size != 0,
                              .shared_bytes = shared_bytes});
}

constexpr std::uint32_t kD = 128;
constexpr std::uint32_t kChunkGradsBindings = 15;  // shaders/chunked/chunk_grads.glsl, for chunk_values and chunk_grads

}  // namespace

CommonKernels build_common(gpu::Device& dev, std::uint32_t conv_taps) {
  // conv_fwd's shared memory: its per-token sums of squares [64][TB + 1] and head sums [2][TB].
  constexpr std::uint32_t tb = kConvFwdTokens;
  return {.conv_fwd = make(dev, "conv_fwd", spirv::conv_fwd, 5, (64 * (tb + 1) + 2 * tb) * 4, {conv_taps}),
          .conv_bwd = make(dev, "conv_bwd", spirv::conv_bwd, 4, 0, {conv_taps}),
          .gate_prep = make(dev, "gate_prep", spirv::gate_prep, 5, 0)};
}

PerHeadKernels build_per_head(gpu::Device& dev) {
  return {.rec_fwd = make(dev, "rec_fwd", spirv::rec_fwd, 9, (16 * kD + 5 * kD) * 4),
          .rec_bwd = make(dev, "rec_bwd", spirv::rec_bwd, 17, (16 * kD + 7 * kD) * 4),
          .qk_bwd = make(dev, "qk_bwd", spirv::qk_bwd, 4, 2 * kD * 4)};
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

namespace {
// Shared memory of the column-split kernels (bytes), mirrored from their declarations.
constexpr std::uint32_t kFwdStagedSteps = 4;  // TS of rec_fwd2.comp
constexpr std::uint32_t rec_fwd2_shared() {
  return kFwdStagedSteps * (36 * 16 * 2 + 32 * 4 + 2 * 4);
}
// (In 64 bits: an interval of millions must compare as too large, not wrap.)
constexpr std::uint64_t rec_bwd2_shared(std::uint64_t cs, std::uint64_t sg) {
  const std::uint64_t slots = std::min<std::uint64_t>(256 / sg, 8);
  const std::uint64_t rounds = 256 / sg / slots;
  const std::uint64_t buffered = rounds > 1 ? 1 : (cs > 8 ? 2 : 4);  // RB of rec_bwd2.comp
  return cs * (kD * 4 * 2 + 3 * 32 * 4 + 2 * 4) + buffered * slots * kPartialWords * 4;
}
}  // namespace

SubgroupKernels build_subgroup(gpu::Device& dev, std::uint32_t sg, bool with_backward) {
  SubgroupKernels k;
  k.subgroup_size = sg;
  k.rec_fwd2 = make(dev, "rec_fwd2", spirv::rec_fwd2, 6, rec_fwd2_shared(), {sg}, sg);
  k.norm_fwd2 = make(dev, "norm_fwd2", spirv::norm_fwd2, 5, kD * 4);
  k.norm_bwd2 = make(dev, "norm_bwd2", spirv::norm_bwd2, 7, kD * 4);
  if (with_backward) k.qk_bwd2 = make(dev, "qk_bwd2", spirv::qk_bwd2, 10, 0, {sg}, sg);
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
  const auto bytes = rec_bwd2_shared(backward_build(info, cs).capacity, subgroup_size);
  if (bytes <= info.max_shared_memory) return "";
  return "its backward at a checkpoint interval of " + std::to_string(cs) + " needs " + std::to_string(bytes) +
         " bytes of shared memory and the device has " + std::to_string(info.max_shared_memory) +
         " (a smaller interval needs less)";
}

const gpu::Pipeline& SubgroupKernels::backward_for(gpu::Device& dev, std::uint32_t cs) {
  auto& p = rec_bwd2[cs];
  if (!p) {
    const auto build = backward_build(dev.info(), cs);
    p = make(dev, ("rec_bwd2 (interval " + std::to_string(cs) + ")").c_str(), build.code, 8,
             std::uint32_t(rec_bwd2_shared(build.capacity, subgroup_size)), {subgroup_size, build.capacity}, subgroup_size);
  }
  return *p;
}

namespace {
// Shared memory of the chunked kernels (bytes), mirrored from their declarations.
constexpr std::uint32_t chunk_prep_shared(std::uint32_t ch) {
  const std::uint32_t chp = (ch + 7) / 8 * 8;  // CHP
  return (3 * ch + ch * ch + 2 * ch * chp + 2 * 16 * chp) * 4;
}
// chunk_prep_fwd: two fp32 16 x 16 tiles per subgroup (8), G and H, and per head of a batch of 4: lg (hi, lo),
// beta, A; the subgroups' maxima (part_max).
constexpr std::uint32_t chunk_prep_fwd_shared() { return (8 * 512 + 2 * 256 + 4 * (3 * 16 + 256) + 8 * 4) * 4; }
constexpr std::uint32_t chunk_dstate_shared(std::uint32_t ch) {
  return (3 * ch + 32 * (kD + 1) + 3 * 8 * kD + 2 * 8 * 32) * 4;
}
// The matrix units' serial passes (chunk_fwd_mma, chunk_dstate_mma) stage alike (chunk_mma.glsl):
// K~, Q~, -diag(gamma) K or -diag(beta gamma) K as fp16 pairs [16 rows][136], P and T diag(beta) or T as fp16 pairs [16][24],
// two fp32 16 x 16 tiles per subgroup (8); lg (hi, lo), bet; the row sums of the norm's forward or backward
// ([8][16]).
constexpr std::uint32_t matrix_pass_shared() {
  return 6 * 16 * 136 * 2 + 2 * 2 * 16 * 24 * 2 + 8 * 2 * 256 * 4 + 3 * 16 * 4 + 8 * 16 * 4;
}
constexpr std::uint32_t chunk_values_shared(std::uint32_t ch) {
  const std::uint32_t chp = (ch + 7) / 8 * 8;  // CHP
  return (3 * ch + 4 * 8 * chp + 256 / 8) * 4;
}
// chunk_pair_bwd_mma: phase 1's stages (two states' [32][528 bytes] and six operands' [16][144]),
// whose memory phase 2's tiles take; both chunks' two row scales, the subgroups' sums and row shares.
constexpr std::uint32_t chunk_pair_bwd_mma_shared() {
  return 2 * 32 * 528 + 6 * 16 * 144 + (2 * 2 * 16 + 16 + 16 + 16 * 16) * 4;
}
// chunk_factors: four fp32 16 x 16 matrices, the chunk's lg (hi, lo) and beta.
constexpr std::uint32_t chunk_factors_shared() { return (4 * 256 + 3 * 16) * 4; }
constexpr std::uint32_t chunk_grads_shared(std::uint32_t ch, std::uint32_t sg) {
  const std::uint32_t chp = (ch + 7) / 8 * 8;  // CHP
  return (3 * ch + 5 * ch * chp + 4 * 8 * chp + 3 * ch + 2 * ch * (kD / sg) + 256 / 8) * 4;
}
}  // namespace

std::string chunked_why_not(const DeviceInfo& info, std::uint32_t sg, std::uint32_t chunk) {
  if (chunk < 1 || chunk > kMaxChunk)
    return "its chunk length is the checkpoint interval, " + std::to_string(chunk) + " here, and must be 1 to " +
           std::to_string(kMaxChunk);
  const auto bytes = std::max({chunk_prep_shared(chunk), chunk_dstate_shared(chunk), chunk_grads_shared(chunk, sg)});
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
  const auto bytes = std::max({chunk_prep_fwd_shared(), matrix_pass_shared(), chunk_factors_shared(),
                               chunk_pair_bwd_mma_shared()});
  if (bytes > info.max_shared_memory)
    return "they need " + std::to_string(bytes) + " bytes of shared memory and the device has " +
           std::to_string(info.max_shared_memory);
  return "";
}

ChunkedKernels build_chunked(gpu::Device& dev, std::uint32_t sg, std::uint32_t ch, bool matrix_units,
                             std::uint32_t conv_taps) {
  ChunkedKernels k;
  k.qk_bwd = make(dev, "qk_bwd2 (chunked)", spirv::qk_bwd2_chunked, 10, 0, {sg}, sg);
  if (!matrix_units) {
    k.chunk_prep = make(dev, "chunk_prep", spirv::chunk_prep, 8, chunk_prep_shared(ch), {sg, ch});
    k.chunk_dstate = make(dev, "chunk_dstate", spirv::chunk_dstate, 6, chunk_dstate_shared(ch), {sg, ch});
    k.chunk_values = make(dev, "chunk_values", spirv::chunk_values, kChunkGradsBindings, chunk_values_shared(ch), {sg, ch}, sg);
    k.chunk_grads = make(dev, "chunk_grads", spirv::chunk_grads, kChunkGradsBindings, chunk_grads_shared(ch, sg), {sg, ch}, sg);
  } else {
    k.chunk_dstate_mma =
        make(dev, "chunk_dstate_mma", spirv::chunk_dstate_mma, 21, matrix_pass_shared(), {32, ch}, 32);
    k.chunk_factors = make(dev, "chunk_factors", spirv::chunk_factors, 10, chunk_factors_shared(), {32, ch}, 32);
    k.chunk_pair_bwd_mma = make(dev, "chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma, 14,
                                chunk_pair_bwd_mma_shared(), {32, ch}, 32);
    k.chunk_prep_fwd = make(dev, "chunk_prep_fwd", spirv::chunk_prep_fwd, 12, chunk_prep_fwd_shared(), {}, 32);
    k.chunk_fwd_mma = make(dev, "chunk_fwd_mma", spirv::chunk_fwd_mma, 17, matrix_pass_shared(), {32, ch}, 32);
    k.conv_bwd_yv = make(dev, "conv_bwd (dv from Yv)", spirv::conv_bwd_yv, 6, 0, {conv_taps});
  }
  return k;
}

}  // namespace gdn::detail
