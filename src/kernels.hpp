// SPDX-License-Identifier: MIT
// The host side of the shaders' interface: the push-constant block of shaders/common/common.glsl, and the
// pipelines of the three kernel families with their binding counts and shared memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "gdn/layer.hpp"
#include "vk/device.hpp"

namespace gdn::detail {

/// Mirrors `Push` in shaders/common/common.glsl: same field order, std430 (4-byte words), 64 bytes.
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
  std::uint32_t pad0 = 0, pad1 = 0, pad2 = 0;
  float eps = 0;            // rms_eps
  float fpad0 = 0, fpad1 = 0, fpad2 = 0;
};
static_assert(sizeof(Push) == 64, "Push must match the GLSL push-constant block");

/// Kernels every family uses: the conv (with the q/k l2 norms), the gate preparation, the conv's backward.
struct CommonKernels {
  std::shared_ptr<gpu::Pipeline> conv_fwd, conv_bwd, gate_prep;
};
/// Tokens per invocation of conv_fwd and conv_bwd (TB in shaders/common/conv_fwd.comp, conv.glsl).
constexpr std::uint64_t kConvFwdTokens = 8, kConvBwdTokens = 32;
/// Workgroups of 64 invocations for B windows of T tokens and C channels, `tokens` per invocation
/// (shaders/common/conv.glsl).
inline std::uint64_t conv_groups(std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t tokens) {
  return (B * ((T + tokens - 1) / tokens) * (C / 4) + 63) / 64;
}

/// The per-head family (shaders/per_head/rec_fwd.comp, rec_bwd.comp, qk_bwd.comp).
struct PerHeadKernels {
  std::shared_ptr<gpu::Pipeline> rec_fwd, rec_bwd, qk_bwd;
};

/// The column-split family (shaders/subgroup/rec_fwd2.comp ... qk_bwd2.comp), for one subgroup size.
struct SubgroupKernels {
  std::uint32_t subgroup_size = 0;
  std::shared_ptr<gpu::Pipeline> rec_fwd2, norm_fwd2, norm_bwd2, qk_bwd2;  // qk_bwd2: null where not built
  /// rec_bwd2 holds a segment's states in registers: one pipeline per segment length, built on demand.
  std::map<std::uint32_t, std::shared_ptr<gpu::Pipeline>> rec_bwd2;
  const gpu::Pipeline& backward_for(gpu::Device& dev, std::uint32_t interval);
};

/// Words per (token, v-head, column block) record of rec_bwd2's partials: dq^ 128, dk^ 128, dg.
inline constexpr std::uint32_t kPartialWords = 257;
/// Column blocks (workgroups) per (window, v-head) of the column-split family.
inline constexpr std::uint32_t kColumnBlocks = 4;

/// The chunked family (shaders/chunk_*.comp) for one chunk length: its backward, and with the matrix
/// units its forward (elsewhere the forward is the column-split one).
struct ChunkedKernels {
  std::shared_ptr<gpu::Pipeline> chunk_prep, chunk_dstate, chunk_values, chunk_grads, qk_bwd;
  /// chunk_dstate on the matrix units (chunk_dstate_mma.comp), and chunk_values and
  /// chunk_grads as one pass per pair of chunks (chunk_pair_bwd_mma.comp); null where they do not run.
  /// chunk_dstate_mma takes kMatrixDstateBlocks workgroups per (window, v-head), chunk_dstate
  /// kColumnBlocks. Between them chunk_factors (chunk_factors.comp, one workgroup per chunk) makes the
  /// pair pass's 16 x 16 right factors.
  std::shared_ptr<gpu::Pipeline> chunk_dstate_mma, chunk_factors, chunk_pair_bwd_mma;
  /// The matrix units' chunked forward: chunk_prep_fwd (one workgroup per (window, k-head, chunk),
  /// for the v-heads that share the k-head), then
  /// chunk_fwd_mma (one per (window, v-head)); null where the matrix units do not run.
  std::shared_ptr<gpu::Pipeline> chunk_prep_fwd, chunk_fwd_mma;
  /// conv_bwd for the matrix units' backward (conv_bwd.comp with DV_FROM_YV): dv = beta Yv made as it
  /// is read (chunk_dstate_mma writes Yv, no dv); null where the matrix units do not run.
  std::shared_ptr<gpu::Pipeline> conv_bwd_yv;
};
inline constexpr std::uint32_t kMatrixDstateBlocks = 1;
/// 16 x 16 factors per chunk that chunk_factors makes for the pair pass (NCF in shaders/matrix/chunk_factors.glsl).
inline constexpr std::uint32_t kChunkFactors = 5;
/// Checkpoint intervals when the config leaves it at 0: the replay segment of the subgroup and
/// per-head families, the chunk length of the chunked one.
inline constexpr int kDefaultInterval = 8;
inline constexpr int kDefaultChunk = 16;
/// The longest chunk the chunked kernels take (their per-invocation row arrays hold 16 of 32 rows):
/// the public bound, Config::check's.
inline constexpr std::uint32_t kMaxChunk = std::uint32_t(gdn::kMaxChunk);
/// Words per (token, v-head) record of chunk_grads: dq^ 128, dk^ 128, d(log g), dbeta.
inline constexpr std::uint32_t kChunkRecordWords = 258;

/// The conv kernels are specialised for `conv_taps` taps.
CommonKernels build_common(gpu::Device& dev, std::uint32_t conv_taps);
PerHeadKernels build_per_head(gpu::Device& dev);

/// The subgroup size the column-split kernels would run with on this device, or an explanation of
/// why they cannot run there.
struct SubgroupChoice {
  std::uint32_t size = 0;  // 0: not available
  std::string why_not;
};
SubgroupChoice choose_subgroup_size(const DeviceInfo& info);
/// The column-split forward (rec_fwd2, norm_fwd2) and the norm's backward (norm_bwd2), which the
/// chunked family on CUDA cores runs too; `with_backward`: also qk_bwd2 (the chunked family has its own).
SubgroupKernels build_subgroup(gpu::Device& dev, std::uint32_t subgroup_size, bool with_backward);
/// Empty where the column-split backward fits the device at checkpoint interval `cs`, else why not.
std::string subgroup_backward_why_not(const DeviceInfo& info, std::uint32_t subgroup_size, std::uint32_t cs);

/// Empty where the chunked backward can run chunks of `chunk` tokens on this device, else why not.
std::string chunked_why_not(const DeviceInfo& info, std::uint32_t subgroup_size, std::uint32_t chunk);
/// Empty where the matrix-unit kernels of the chunked family run chunks of `chunk` tokens here, else why not.
std::string chunked_matrix_why_not(const DeviceInfo& info, std::uint32_t chunk);
/// With `matrix_units` the matrix-unit kernels (chunked_matrix_why_not must be empty), else the
/// CUDA-core chunk_prep, chunk_dstate, chunk_values and chunk_grads; the others stay null.
ChunkedKernels build_chunked(gpu::Device& dev, std::uint32_t subgroup_size, std::uint32_t chunk, bool matrix_units,
                             std::uint32_t conv_taps);

}  // namespace gdn::detail
