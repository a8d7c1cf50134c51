#version 460
// Chunked backward on the matrix units, the serial pass: the sums of chunk_dstate.comp (which runs
// where the device has no cooperative matrices) as 16x16x16 products of GL_NV_cooperative_matrix,
// from the operators the matrix units' forward left on the tape (W, P, lg: no chunk_prep here).
//   dU = P^T dO + K~ dS                           K~ = diag(Gamma / gamma) K
//   dS <- Gamma dS + Q~^T dO - W^T dU              Q~ = diag(gamma) Q
// Chunks of CH = 16 tokens (one tile of rows). One workgroup per (window b, v-head h, block of
// 16 * NSG state columns); subgroup s owns columns 16 s .. 16 s + 15 of the block and keeps them
// transposed, dS^T [its 16 columns][row r], as eight fp32 tiles in registers (rows 16 rt .. 16 rt + 15).
// Columns are independent, so the subgroups never exchange results: the workgroup only shares the
// staging of K~, Q~, W and P. The transposed products put every register-held matrix on the left:
//   dU^T = dO^T P + dS^T K~^T,   dS^T <- Gamma dS^T + dO^T Q~ - dU^T W
// Precision: fp32 operands as fp16 pairs, mma.glsl.
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
#include "mma.glsl"

// Subgroups of 32 per workgroup (the host requires subgroups of exactly 32). 8, one workgroup per
// head, measured faster than 4 (0.63 against 0.86 ms on the H200 at the 27B shape).
#define NSG 8u
layout(local_size_x = 32 * NSG) in;
layout(constant_id = 0) const uint SG = 32;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [B, T, nv] lg (chunk_prep)
layout(set = 0, binding = 2) readonly buffer Wm4 { vec4 w4[]; };        // [B, T, nv, D/4] W (chunk_prep)
layout(set = 0, binding = 3) readonly buffer Do4 { vec4 do4[]; };       // [B, T, nv*D/4] grad of o
layout(set = 0, binding = 4) writeonly buffer Du4 { vec4 du4[]; };      // [B, T, nv*D/4] dU
layout(set = 0, binding = 5) writeonly buffer Dsc { float dsc[]; };     // [B, nv, max(nch-1,1), D cols, D rows]
layout(set = 0, binding = 6) readonly buffer Pm4 { vec4 p4[]; };        // [B, T, nv, CH/4] P (the forward's)

#include "chunk.glsl"

#define COLS (16u * NSG)  // state columns per workgroup
#define SE (16u / NSG)    // staged rows per invocation: rows tid / 32 + NSG e
#define NWG (D / COLS)    // workgroups per (window, head)
// Staged [row i][element r] operands, rows DP halves apart: 272 bytes, so the 8 rows that one
// 128-bit matrix load phase reads fall in distinct banks; P [i][j] rows PP apart (48 bytes, likewise).
#define DP 136u
#define PP 24u
shared float16_t kh[16u * DP], kl[16u * DP];  // K~ hi, lo
shared float16_t qh[16u * DP], ql[16u * DP];  // Q~ hi, lo
shared float16_t wh[16u * DP], wl[16u * DP];  // -W hi, lo
shared float16_t ph[16u * PP], pl[16u * PP];  // P hi, lo
// Per subgroup, two fp32 16 x 16 tiles [row i][column]: dO, and dU on its way out.
shared float tiles[NSG * 2u * 256u];

// One invocation's share of a chunk's operands.
struct Stage {
  vec4 k[SE], q[SE], w[SE];  // rows i = tid / 32 + NSG e, elements 4 (tid % 32) .. of k^, q^, W
  float lgi[SE], lgam;       // lg of those rows, and of the chunk's last row (log Gamma)
  vec4 p;                    // P row tid / 4, columns 4 (tid % 4) .. (invocations 0 .. 63)
  vec4 dO[2];                // the subgroup's dO: row lane / 2, columns 8 (lane % 2) + 4 e ..
};

Stage fetch(Chunk k, uint tid, uint lane, uint col0) {
  Stage f;
  [[unroll]] for (uint e = 0u; e < SE; ++e) {
    const uint i = tid / 32u + NSG * e, r4 = tid % 32u;
    f.k[e] = vec4(0.0); f.q[e] = vec4(0.0); f.w[e] = vec4(0.0);
    f.lgi[e] = chunk_lg(k, i);
    if (i < k.L) {
      const uint bt = k.b * pc.t + k.t0 + i;
      f.k[e] = qkn4[((pc.nb * pc.t + bt) * pc.nk + k.ko) * (D / 4u) + r4];
      f.q[e] = qkn4[(bt * pc.nk + k.ko) * (D / 4u) + r4];
      f.w[e] = w4[head_row(k, i) * (D / 4u) + r4];
    }
  }
  f.lgam = chunk_lg(k, CH - 1u);
  f.p = vec4(0.0);
  if (tid < 64u && tid / 4u < k.L) f.p = p4[head_row(k, tid / 4u) * (CH / 4u) + tid % 4u];
  const uint i = lane / 2u;
  [[unroll]] for (uint e = 0u; e < 2u; ++e)
    f.dO[e] = i < k.L ? do4[(head_row(k, i) * D + col0 + 8u * (lane % 2u) + 4u * e) / 4u] : vec4(0.0);
  return f;
}

// Stores a vec4 into the fp32 tiles at element `at`.
void put_tile(uint at, vec4 x) { tiles[at] = x.x; tiles[at + 1u] = x.y; tiles[at + 2u] = x.z; tiles[at + 3u] = x.w; }
vec4 tile4_at(uint at) { return vec4(tiles[at], tiles[at + 1u], tiles[at + 2u], tiles[at + 3u]); }

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint b = bh / pc.nv, h = bh % pc.nv;
  const uint slots = max(nch, 2u) - 1u;
  const uint col0 = blk * COLS + 16u * sg;  // the subgroup's first state column
  const uint t_do = sg * 512u, t_du = t_do + 256u;  // its two [i][column] tiles in `tiles`
  const uint t_lane = (lane / 2u) * 16u + 8u * (lane % 2u);  // the lane's 8 elements of a tile

  F32M dst[8];  // dS^T: [column][row 16 rt ..]
  [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) dst[rt] = F32M(0.0);

  for (uint cc = 0u; cc < nch; ++cc) {
    const Chunk k = chunk_of(b, h, nch - 1u - cc);
    // Loaded here, not a chunk ahead: measured as fast, and 50 registers fewer (H200).
    const Stage cur = fetch(k, tid, lane, col0);
    barrier();  // the previous chunk's readers of the staged operands are done
    [[unroll]] for (uint e = 0u; e < SE; ++e) {
      const uint at = (tid / 32u + NSG * e) * DP + 4u * (tid % 32u);
      PUT_SPLIT(kh, kl, at, exp(cur.lgam - cur.lgi[e]) * cur.k[e])
      PUT_SPLIT(qh, ql, at, exp(cur.lgi[e]) * cur.q[e])
      PUT_SPLIT(wh, wl, at, -cur.w[e])
    }
    [[unroll]] for (uint e = 0u; e < 2u; ++e) put_tile(t_do + t_lane + 4u * e, cur.dO[e]);
    if (tid < 64u) PUT_SPLIT(ph, pl, (tid / 4u) * PP + 4u * (tid % 4u), cur.p)
    barrier();

    // The chunk's end-state gradient dS [column][row], for chunk_grads (the last chunk's is zero).
    if (k.c + 1u < nch)
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
        coopMatStoreNV(dst[rt], dsc, ((bh * slots + k.c) * D + col0) * D + 16u * rt, D, false);

    // dU^T = dO^T P + dS^T K~^T   (P [j][i]: a row-major load; K~^T: column-major loads of the [i][r] stage)
    F32M dOt;  // dO^T
    coopMatLoadNV(dOt, tiles, t_do, 16u, true);
    F16M oh, ol;
    split(dOt, oh, ol);
    F32M du = F32M(0.0), du_lo = F32M(0.0);
    {
      F16M bh_, bl;
      coopMatLoadNV(bh_, ph, 0u, PP, false);
      coopMatLoadNV(bl, pl, 0u, PP, false);
      MMA_SPLIT(du, du_lo, oh, ol, bh_, bl)
    }
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
      F16M sh, sl, bh_, bl;
      split(dst[rt], sh, sl);
      coopMatLoadNV(bh_, kh, 16u * rt, DP, true);
      coopMatLoadNV(bl, kl, 16u * rt, DP, true);
      MMA_SPLIT(du, du_lo, sh, sl, bh_, bl)
    }
    du = unsplit(du, du_lo);
    coopMatStoreNV(du, tiles, t_du, 16u, true);  // dU [i][column]
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    {
      const uint i = lane / 2u;
      if (i < k.L) {
        const uint at = (head_row(k, i) * D + col0 + 8u * (lane % 2u)) / 4u;
        du4[at] = tile4_at(t_du + t_lane);
        du4[at + 1u] = tile4_at(t_du + t_lane + 4u);
      }
    }

    // dS^T <- Gamma dS^T + dO^T Q~ - dU^T W   (Q~, -W: row-major loads of the stages)
    F16M uh, ul;
    split(du, uh, ul);
    const float gam = exp(cur.lgam);
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
      F16M qb, ql_, wb, wl_;
      coopMatLoadNV(qb, qh, 16u * rt, DP, false);
      coopMatLoadNV(ql_, ql, 16u * rt, DP, false);
      coopMatLoadNV(wb, wh, 16u * rt, DP, false);
      coopMatLoadNV(wl_, wl, 16u * rt, DP, false);
      F32M acc = dst[rt] * gam, lo = F32M(0.0);
      MMA_SPLIT(acc, lo, oh, ol, qb, ql_)
      MMA_SPLIT(acc, lo, uh, ul, wb, wl_)
      dst[rt] = unsplit(acc, lo);
    }
  }
}
