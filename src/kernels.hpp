// SPDX-License-Identifier: MIT
// What the kernel families share on the host side: the push-constant block of
// shaders/common/common.glsl, the common kernels (conv, gates) and their recording, pipelines made
// from embedded SPIR-V, and the subgroup size the column-split and chunked kernels take.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "detail.hpp"
#include "gdn/bindings.hpp"
#include "gdn/layer.hpp"
#include "vk/device.hpp"

namespace gdn::detail {

inline constexpr std::size_t kD = kHeadDim;

/// Mirrors `Push` in shaders/common/common.glsl: same field order, std430 (4-byte words), 64 bytes
/// (each pipeline checks the size against its SPIR-V).
struct Push {
  std::uint32_t nb = 0;     // windows (B)
  std::uint32_t t = 0;      // tokens per window (T)
  std::uint32_t nv = 0;     // value heads
  std::uint32_t nk = 0;     // key heads
  std::uint32_t c_dim = 0;  // raw projection channels
  std::uint32_t kk = 0;     // conv taps
  std::uint32_t cs = 0;     // checkpoint interval
  std::uint32_t nseg = 0;   // ceil(T / cs)
  std::uint32_t keep = 0;   // record the tape
  std::uint32_t flags = 0;  // the carried states a call has (kState*), bfloat16 streams (kBf16*)
  std::uint32_t n = 0;      // elements of a cast (to_bf16), groups of param_sum
  std::uint32_t pad2 = 0;
  float eps = 0;            // rms_eps
  float fpad0 = 0, fpad1 = 0, fpad2 = 0;
};
static_assert(sizeof(Push) == 64, "Push must match the GLSL push-constant block");
/// Rows (b, t, v-head) per workgroup of norm_fwd2, as shaders/common/norm_rows.glsl's NORM_ROWS
/// (norm_bwd2 takes a group of kParamRows rows a workgroup).
inline constexpr std::uint32_t kNormRows = 4;
/// Workgroups of norm_fwd2 over `rows` rows.
inline std::uint64_t norm_groups(std::uint64_t rows) { return (rows + kNormRows - 1) / kNormRows; }
/// Push::flags, as common.glsl's STATE_*.
inline constexpr std::uint32_t kStateH0 = 1, kStateConv = 2, kStateCarry = 4, kStateDconvOut = 8;
/// Push::flags of param_sum, as common.glsl's PARAM_ACCUMULATE.
inline constexpr std::uint32_t kParamAccumulate = 16;
/// The boundary streams that are bfloat16, which the passes read and write as such (common.glsl's
/// BF16_QKV ..): Push::flags, and the specialization constant BF16 of the matrix-unit passes and
/// the conv kernels.
inline constexpr std::uint32_t kBf16Qkv = 32, kBf16Dqkv = 64, kBf16Z = 128, kBf16Out = 256, kBf16Dout = 512,
                               kBf16Dz = 1024, kBf16A = 2048, kBf16B = 4096;

/// The device's pipeline for an embedded shader and specialization (built once per device, shared by
/// layers); its bindings and shared memory are the SPIR-V's own (vk/spirv_reflect.hpp).
std::shared_ptr<gpu::Pipeline> make_pipeline(gpu::Device& dev, const char* name, std::span<const std::uint32_t> spirv,
                                             std::vector<std::uint32_t> spec = {}, std::uint32_t subgroup_size = 0);
/// The same for the shader of `Bindings` (gdn::bindings::<shader>), under its own name.
template <class Bindings>
std::shared_ptr<gpu::Pipeline> make_pipeline(gpu::Device& dev, std::vector<std::uint32_t> spec = {},
                                             std::uint32_t subgroup_size = 0) {
  return make_pipeline(dev, Bindings::kName, Bindings::spirv(), std::move(spec), subgroup_size);
}
/// The shared memory a shader declares under specialization constants `spec` (bytes).
std::uint64_t shared_bytes_of(const char* name, std::span<const std::uint32_t> spirv, std::vector<std::uint32_t> spec);
/// Empty where every shader of `shaders` (name, SPIR-V) fits the device's shared memory under
/// `spec`, else which one needs how much.
struct ShaderRef {
  const char* name;
  std::span<const std::uint32_t> spirv;
};
template <class Bindings>
ShaderRef shader() {
  return {Bindings::kName, Bindings::spirv()};
}
std::string shared_why_not(const DeviceInfo& info, std::initializer_list<ShaderRef> shaders,
                           const std::vector<std::uint32_t>& spec, const std::string& hint);

/// The conv kernels' specialization constants: 0 the taps, 6 the bfloat16 streams of Push::flags
/// they read or write (kBf16Qkv, kBf16Dqkv; shaders/common/conv.glsl).
inline std::vector<std::uint32_t> conv_spec(std::uint32_t conv_taps, std::uint32_t flags) {
  return {conv_taps, 0, 0, 0, 0, 0, flags & (kBf16Qkv | kBf16Dqkv)};
}
/// Kernels every family uses: the conv (with the q/k l2 norms), the gate preparation, the conv's
/// backward, the parameters' gradients (param_part, param_sum) and the conv state out.
struct CommonKernels {
  std::shared_ptr<gpu::Pipeline> gate_prep, param_part, param_sum, conv_state_out;
  gpu::Device* dev = nullptr;
  std::uint32_t conv_taps = 0;
  /// The conv kernels for a call's Push::flags: one build per combination of its bfloat16 streams,
  /// the float32 one made with the family, the others on first use (the device keeps them).
  const gpu::Pipeline& conv_fwd(std::uint32_t flags) const;
  const gpu::Pipeline& conv_bwd(std::uint32_t flags) const;
};
/// The rounding of a float32 stand-in into a bfloat16 tensor (shaders/common/to_bf16.comp): the
/// layer's for da and db, which param_sum reads as float32.
std::shared_ptr<gpu::Pipeline> build_to_bf16(gpu::Device& dev);
/// The conv kernels are specialised for `conv_taps` taps.
CommonKernels build_common(gpu::Device& dev, std::uint32_t conv_taps);
/// Tokens per invocation of conv_fwd and conv_bwd (TB in shaders/common/conv_fwd.comp, conv.glsl).
constexpr std::uint64_t kConvFwdTokens = 8, kConvBwdTokens = 32;
/// Rows (b, t, v-head) per group of dnorm's shares: param_part's (R in shaders/common/param_part.comp) and
/// norm_bwd2's (PARAM_ROWS in shaders/common/norm_bwd2.comp).
constexpr std::uint64_t kParamRows = 64;
/// Groups of kParamRows rows over `rows` rows (param_part's and norm_bwd2's workgroups).
inline std::uint64_t param_groups(std::uint64_t rows) { return (rows + kParamRows - 1) / kParamRows; }
/// Workgroups of 64 invocations for B windows of T tokens and C channels, `tokens` per invocation
/// (shaders/common/conv.glsl).
inline std::uint64_t conv_groups(std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t tokens) {
  return (B * ((T + tokens - 1) / tokens) * (C / 4) + 63) / 64;
}

/// The subgroup size the column-split and chunked kernels would run with on this device, or an
/// explanation of why they cannot run there.
struct SubgroupChoice {
  std::uint32_t size = 0;  // 0: not available
  std::string why_not;
};
SubgroupChoice choose_subgroup_size(const DeviceInfo& info);

/// Checkpoint intervals where the config leaves 0: the replay segment of the subgroup and per-head
/// families, the chunk length of the chunked ones.
inline constexpr int kDefaultInterval = 8;
inline constexpr int kDefaultChunk = 16;
/// The longest chunk the chunked kernels take (their per-invocation row arrays hold 16 of 32 rows):
/// the public bound, Config::check's.
inline constexpr std::uint32_t kMaxChunk = std::uint32_t(gdn::kMaxChunk);

}  // namespace gdn::detail
