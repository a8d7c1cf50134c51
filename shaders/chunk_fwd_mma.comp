#version 460
// Chunked forward on the matrix units: the recurrence of a window as one serial pass over its
// chunks of CH = 16 tokens (chunk.glsl), from the operators chunk_prep's FORWARD build made for
// every chunk at once (W, U' = T diag(beta) V, P, lg). With S0 the state at the chunk's start:
//   U = U' - W S0                  the chunk's u rows (the tape keeps them in place of kv)
//   O = diag(gamma) Q S0 + P U     the chunk's output rows, before the norm
//   S_end = Gamma S0 + K~^T U      K~ = diag(Gamma / gamma) K
// The layout (chunk_mma.glsl, shared with chunk_dstate_mma, this pass's backward): S^T [column][row]
// in registers, so that the register-held matrices stay on the left of the products:
//   U^T = U'^T - S^T W^T,   O^T = S^T Q~^T + U^T P^T,   S^T <- Gamma S^T + U^T K~
// Precision: fp32 operands as fp16 pairs, mma.glsl.
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
#include "mma.glsl"

layout(local_size_x = 256) in;              // 8 subgroups of 32 (the host requires exactly 32)
layout(constant_id = 0) const uint SG = 32;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [B, T, nv] lg (chunk_prep, forward)
layout(set = 0, binding = 2) readonly buffer Wm4 { vec4 w4[]; };        // [B, T, nv, D/4] W (chunk_prep, forward)
layout(set = 0, binding = 3) buffer Up4 { vec4 up4[]; };                // [B, T, nv*D/4] U' in, U out
layout(set = 0, binding = 4) readonly buffer Pm4 { vec4 p4[]; };        // [B, T, nv, CH/4] P (chunk_prep, forward)
layout(set = 0, binding = 5) writeonly buffer O4 { vec4 o4[]; };        // [B, T, nv*D/4] o before the norm
layout(set = 0, binding = 6) writeonly buffer Ck { float ck[]; };       // [B, nv, max(nch-1,1), D cols, D rows]

#include "chunk.glsl"
#include "chunk_mma.glsl"

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint bh = linear_group();  // b*nv + h
  if (bh >= pc.nb * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint b = bh / pc.nv, h = bh % pc.nv;
  const uint slots = max(nch, 2u) - 1u;
  const uint col0 = 16u * sg;                        // the subgroup's first state column
  const uint t_u = sg * 512u, t_o = t_u + 256u;      // its two tiles: U' (then U on its way out), O
  const uint t_lane = tile_lane(lane);

  F32M st[8];  // S^T: [column][row 16 rt ..]
  [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) st[rt] = F32M(0.0);

  for (uint c = 0u; c < nch; ++c) {
    const Chunk k = chunk_of(b, h, c);
    const Operators cur = fetch_operators(k, tid);
    vec4 up[2];
    FETCH_TILE(up4, k, lane, col0, up)
    barrier();  // the previous chunk's readers of the staged operands are done
    stage_operators(cur, tid);
    [[unroll]] for (uint e = 0u; e < 2u; ++e) put_tile(t_u + t_lane + 4u * e, up[e]);
    barrier();

    // The state at the chunk's start, for the backward (chunk 0 starts at zero: not stored).
    if (pc.keep != 0u && c > 0u)
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
        coopMatStoreNV(st[rt], ck, ((bh * slots + c - 1u) * D + col0) * D + 16u * rt, D, false);

    // U^T = U'^T - S^T W^T and O^T = S^T Q~^T, sharing the split of S^T (W^T, Q~^T: column-major loads)
    F32M u, u_lo = F32M(0.0), o = F32M(0.0), o_lo = F32M(0.0);
    coopMatLoadNV(u, tiles, t_u, 16u, true);
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
      F16M sh, sl, bh_, bl;
      split(st[rt], sh, sl);
      coopMatLoadNV(bh_, wh, 16u * rt, DP, true);
      coopMatLoadNV(bl, wl, 16u * rt, DP, true);
      MMA_SPLIT(u, u_lo, sh, sl, bh_, bl)
      coopMatLoadNV(bh_, qh, 16u * rt, DP, true);
      coopMatLoadNV(bl, ql, 16u * rt, DP, true);
      MMA_SPLIT(o, o_lo, sh, sl, bh_, bl)
    }
    u = unsplit(u, u_lo);
    F16M uh, ul;
    split(u, uh, ul);
    {  // O^T += U^T P^T (P^T [j][i]: a column-major load of P [i][j])
      F16M bh_, bl;
      coopMatLoadNV(bh_, ph, 0u, PP, true);
      coopMatLoadNV(bl, pl, 0u, PP, true);
      MMA_SPLIT(o, o_lo, uh, ul, bh_, bl)
    }
    o = unsplit(o, o_lo);
    coopMatStoreNV(u, tiles, t_u, 16u, true);  // U [i][column]
    coopMatStoreNV(o, tiles, t_o, 16u, true);  // O [i][column]
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    {
      const uint i = lane / 2u;
      if (i < k.L) {
        const uint at = (head_row(k, i) * D + col0 + 8u * (lane % 2u)) / 4u;
        up4[at] = tile4_at(t_u + t_lane);
        up4[at + 1u] = tile4_at(t_u + t_lane + 4u);
        o4[at] = tile4_at(t_o + t_lane);
        o4[at + 1u] = tile4_at(t_o + t_lane + 4u);
      }
    }

    // S^T <- Gamma S^T + U^T K~   (K~: row-major loads of the stage)
    const float gam = exp(cur.lgam);
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
      F16M bh_, bl;
      coopMatLoadNV(bh_, kh, 16u * rt, DP, false);
      coopMatLoadNV(bl, kl, 16u * rt, DP, false);
      F32M acc = st[rt] * gam, lo = F32M(0.0);
      MMA_SPLIT(acc, lo, uh, ul, bh_, bl)
      st[rt] = unsplit(acc, lo);
    }
  }
}
