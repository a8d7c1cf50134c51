#version 460
// The matrix units' chunked forward with a tape, after chunk_prep_fwd: every chunk's
//   W_h = T_h diag(beta_h gamma_h) K        ([CH x D], chunk.glsl's form)
// for the backward's serial passes (chunk_dstate_mma, chunk_pair_bwd_mma), which take each product
// with W as one step on their chains. The forward (chunk_fwd_mma) takes W S0 as T diag(beta)
// (diag(gamma) K S0) and reads no W: without a tape this pass does not run.
// One workgroup per (window b, key head, chunk c), for the nv / nk v-heads that share the key head's
// k^; subgroup s makes W's columns 16 s .. 16 s + 15 on the matrix units (mma.glsl).
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 256) in;  // 8 subgroups of 32 (the host requires exactly 32)

layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]: beta at [1]
layout(set = 0, binding = 2) readonly buffer Lgc { float lgc[]; };      // [B, T, nv] lg (chunk_prep_fwd)
layout(set = 0, binding = 3) readonly buffer Tm { float t_in[]; };      // [B, T, nv, CH] T (chunk_prep_fwd)
layout(set = 0, binding = 4) writeonly buffer Wm4 { vec4 w4[]; };       // [B, T, nv, D/4] W

#define R 16u  // the chunk's rows (CH = 16: the host builds this pass for no other)
#define HB 4u  // v-heads per batch (the group of the 27B shape, 3, in one)
shared float tiles[8u * 256u];  // per subgroup one fp32 16 x 16 tile: k^ [j][r], then W [i][r] on its way out
shared float tbg[HB * R * R];   // T_h diag(beta gamma) [head][i][j] of the batch

void main() {
  const uint nch = (pc.t + R - 1u) / R;
  const uint wg = linear_group();  // (b*nk + ko)*nch + c
  if (wg >= pc.nb * pc.nk * nch) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint b = wg / nch / pc.nk, ko = (wg / nch) % pc.nk, c = wg % nch;
  const uint L = min(R, pc.t - c * R), group = pc.nv / pc.nk;
  const uint bt0 = b * pc.t + c * R;  // row of the chunk's first token in [B, T, ...] tensors
  // The lane's share (tile_row, tile_lane) of the subgroup's tile, and its 4 columns of a W row.
  const uint t_at = sg * 256u, lane_at = t_at + tile_lane(lane), r4 = 4u * sg + lane % 4u;

  F16M kh, kl;  // K [j][r] at the subgroup's 16 key dims, split: the right factor of every head's W
  {
    [[unroll]] for (uint e = 0u; e < 2u; ++e) {
      const uint j = tile_row(lane, e), at = lane_at + 128u * e;
      const vec4 k = j < L ? qkn4[qk_at(QK_K, bt0 + j, ko) / 4u + r4] : vec4(0.0);
      PUT_TILE4(at, k)
    }
    TILE_SYNC()
    F32M x;
    coopMatLoadNV(x, tiles, t_at, 16u, false);
    split(x, kh, kl);
  }

  const uint i = tid / R, j = tid % R, n = pc.nb * pc.t * pc.nv;  // invocation (i, j); gates is [3][B, T, nv]
  for (uint h0 = 0u; h0 < group; h0 += HB) {
    const uint nh = min(HB, group - h0), hfirst = ko * group + h0;
    barrier();  // the last batch's readers of tbg are done (and every subgroup's K is split)
    [[unroll]] for (uint hb = 0u; hb < HB; ++hb) {
      const uint h = hfirst + hb;
      float x = 0.0;  // T is lower triangular: j <= i < L
      if (hb < nh && i < L && j <= i)
        x = t_in[((bt0 + i) * pc.nv + h) * R + j] * gates[n + (bt0 + j) * pc.nv + h] * exp(lgc[(bt0 + j) * pc.nv + h]);
      tbg[hb * R * R + tid] = x;
    }
    barrier();
    for (uint hb = 0u; hb < nh; ++hb) {
      F32M t, w = F32M(0.0);
      F16M th, tl;
      coopMatLoadNV(t, tbg, hb * R * R, R, false);
      split(t, th, tl);
      mma_split_into(w, th, tl, kh, kl);
      coopMatStoreNV(w, tiles, t_at, 16u, false);  // [i][r]
      TILE_SYNC()
      [[unroll]] for (uint e = 0u; e < 2u; ++e) {
        const uint row = tile_row(lane, e), at = lane_at + 128u * e;
        if (row < L)
          w4[((bt0 + row) * pc.nv + hfirst + hb) * (D / 4u) + r4] = TILE4_AT(at);
      }
      subgroupBarrier();  // every lane's reads of the tile are done before the next head's store
    }
  }
}
