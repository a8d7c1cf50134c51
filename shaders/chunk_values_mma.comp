#version 460
// Chunked backward on the matrix units, pass 3 of 4: chunk_values.comp's products over the value dims,
// as 16x16x16 products of GL_NV_cooperative_matrix (mma.glsl), one workgroup per (window b, v-head h,
// chunk c), CH = 16. With S0 the chunk's start state (a checkpoint; zero for chunk 0) and dS its
// end-state gradient (chunk_dstate_mma; zero for the last), both stored [column c][row r]:
//   X1 = dO S0^T,   dW = -dU S0^T,   X2 = U dS^T,   <dO_i, u_j>,  <dU_i, v_j>,   Gamma <dS, S0>
// A state stored [c][r] is, read row-major, the right operand S0^T [c][r] itself: X1 = dO (16 x D)
// times that (D x D). The value dims c go through shared memory 16 at a time (8 rounds): the two
// states' 16 rows [c][r] and the four operands' 16 columns [i][c], as fp16 pairs, loaded a round
// ahead with coalesced vec4 reads (the states' 128 KiB per chunk are most of this pass's traffic).
// Subgroup s makes columns r = 16 s .. 16 s + 15 of X1, dW and X2; subgroups 0 and 1 also the pair
// dots dO U^T and dU V^T. Leaves what chunk_values leaves, for chunk_grads_mma: the records' first dq^
// and dk^ terms gamma_i X1 and (Gamma / gamma_i) X2, dW, the pair dots and Gamma <dS, S0>.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 256) in;               // 8 subgroups of 32 (the host requires exactly 32)
layout(constant_id = 0) const uint SG = 32;

#define MATRIX_UNITS
#include "chunk_grads.glsl"

// vec4 views of chunk_grads.glsl's bindings.
layout(set = 0, binding = 3) readonly buffer Y4 { vec4 y4[]; };      // [B, T, C/4]
layout(set = 0, binding = 4) readonly buffer U4 { vec4 u4[]; };      // [B, T, nv*D/4] u (the forward's tape)
layout(set = 0, binding = 5) readonly buffer Do4 { vec4 do4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 6) readonly buffer Du4 { vec4 du4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 9) readonly buffer Ck4 { vec4 ck4[]; };    // [B, nv, slots, D, D/4]
layout(set = 0, binding = 10) readonly buffer Dsc4 { vec4 dsc4[]; }; // [B, nv, slots, D, D/4]

#define RC 16u    // value dims per round
#define DEPTH 3u  // rounds of loads in flight (H200: 1.78, 1.58, 1.49, 1.50 ms at 1 to 4; 182 to 241 registers)
// The stages are arrays of uvec2 (4 halves: one 64-bit store per invocation and array), which the
// matrix loads index in uvec2s.
#define SDP 34u  // row stride (uvec2s) of the staged states: 272 bytes, rows in distinct banks
#define OPP 6u   // row stride (uvec2s) of the staged operands: 48 bytes, likewise
shared uvec2 st_hi[2u * RC * SDP], st_lo[2u * RC * SDP];    // S0, dS: [state][c][r]
shared uvec2 op_hi[4u * 16u * OPP], op_lo[4u * 16u * OPP];  // dO, dU, U, V: [operand][i][c]
shared float tiles[8u * 256u];  // per subgroup, one fp32 16 x 16 tile [i][r] on its way out
shared float red[8u];           // per subgroup: its share of <dS, S0>

// One invocation's loads of a round: vec4s tid and tid + 256 of each state's 16 x 128 rows, and vec4
// tid of the operands' 4 x 16 x 16.
struct Round {
  vec4 s0[2], ds[2], op;
};

Round fetch_round(Chunk k, uint tid, uint c0, uint s0_at, uint ds_at, bool has_s0, bool has_ds) {
  Round f;
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint v = tid + 256u * e;  // row c0 + v / 32, elements 4 (v % 32) ..
    const uint at = ((c0 + v / 32u) * D) / 4u + v % 32u;
    f.s0[e] = has_s0 ? ck4[s0_at / 4u + at] : vec4(0.0);
    f.ds[e] = has_ds ? dsc4[ds_at / 4u + at] : vec4(0.0);
  }
  const uint which = tid / 64u, i = (tid / 4u) % 16u, col = c0 + 4u * (tid % 4u);
  f.op = vec4(0.0);
  if (i < k.L) {
    const uint bt = k.b * pc.t + k.t0 + i;
    const uint at = ((bt * pc.nv + k.h) * D + col) / 4u;
    if (which == 0u) f.op = do4[at];
    else if (which == 1u) f.op = du4[at];
    else if (which == 2u) f.op = u4[at];
    else f.op = y4[(bt * pc.c_dim + 2u * pc.nk * D + k.h * D + col) / 4u];
  }
  return f;
}

void stage_round(Round f, uint tid) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint v = tid + 256u * e;
    const uint at = (v / 32u) * SDP + v % 32u;
    PUT_SPLIT4(st_hi, st_lo, at, f.s0[e])
    PUT_SPLIT4(st_hi, st_lo, RC * SDP + at, f.ds[e])
  }
  PUT_SPLIT4(op_hi, op_lo, ((tid / 64u) * 16u + (tid / 4u) % 16u) * OPP + tid % 4u, f.op)
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint bh = wg / nch;
  const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, wg % nch);
  const uint slots = max(nch, 2u) - 1u;
  const bool has_s0 = k.c > 0u, has_ds = k.c + 1u < nch;
  // (0 where there is no such state: in range, should a compiler load before it selects.)
  const uint s0_at = has_s0 ? (bh * slots + k.c - 1u) * D * D : 0u, ds_at = has_ds ? (bh * slots + k.c) * D * D : 0u;
  load_chunk_rows(k, tid);
  const float lgam = lg[CH - 1u];

  F32M x1 = F32M(0.0), x1_lo = F32M(0.0), w = F32M(0.0), w_lo = F32M(0.0), x2 = F32M(0.0), x2_lo = F32M(0.0);
  F32M pd = F32M(0.0), pd_lo = F32M(0.0);  // subgroup 0: dO U^T; subgroup 1: dU V^T
  float extra = 0.0;                       // this invocation's share of <dS, S0>
  // The rounds' loads are issued DEPTH rounds ahead (a ring of registers; the loop is unrolled so
  // that its slots are fixed): a round's compute is short, and a state's 128 KiB need many bytes in
  // flight per SM to stream at the memory's rate.
  Round ring[DEPTH];
  [[unroll]] for (uint n = 0u; n < DEPTH; ++n) ring[n] = fetch_round(k, tid, n * RC, s0_at, ds_at, has_s0, has_ds);
  [[unroll]] for (uint n = 0u; n < D / RC; ++n) {
    const Round cur = ring[n % DEPTH];
    [[unroll]] for (uint e = 0u; e < 2u; ++e) extra += dot(cur.s0[e], cur.ds[e]);
    barrier();  // the previous round's readers of the stage are done
    stage_round(cur, tid);
    if (n + DEPTH < D / RC) ring[n % DEPTH] = fetch_round(k, tid, (n + DEPTH) * RC, s0_at, ds_at, has_s0, has_ds);
    barrier();

    F16M ah, al, bh_, bl;
    // S0^T [c][r] at the subgroup's columns: X1 += dO S0^T, W += dU S0^T
    coopMatLoadNV(bh_, st_hi, 4u * sg, SDP, false);
    coopMatLoadNV(bl, st_lo, 4u * sg, SDP, false);
    coopMatLoadNV(ah, op_hi, 0u, OPP, false);
    coopMatLoadNV(al, op_lo, 0u, OPP, false);
    MMA_SPLIT(x1, x1_lo, ah, al, bh_, bl)
    coopMatLoadNV(ah, op_hi, 16u * OPP, OPP, false);
    coopMatLoadNV(al, op_lo, 16u * OPP, OPP, false);
    MMA_SPLIT(w, w_lo, ah, al, bh_, bl)
    // dS^T [c][r]: X2 += U dS^T
    coopMatLoadNV(bh_, st_hi, RC * SDP + 4u * sg, SDP, false);
    coopMatLoadNV(bl, st_lo, RC * SDP + 4u * sg, SDP, false);
    coopMatLoadNV(ah, op_hi, 2u * 16u * OPP, OPP, false);
    coopMatLoadNV(al, op_lo, 2u * 16u * OPP, OPP, false);
    MMA_SPLIT(x2, x2_lo, ah, al, bh_, bl)
    // The pair dots: operand sg (dO or dU) [i][c] times operand sg + 2 (U or V) read column-major,
    // [c][j] = [j][c]^T.
    if (sg < 2u) {
      coopMatLoadNV(ah, op_hi, sg * 16u * OPP, OPP, false);
      coopMatLoadNV(al, op_lo, sg * 16u * OPP, OPP, false);
      coopMatLoadNV(bh_, op_hi, (sg + 2u) * 16u * OPP, OPP, true);
      coopMatLoadNV(bl, op_lo, (sg + 2u) * 16u * OPP, OPP, true);
      MMA_SPLIT(pd, pd_lo, ah, al, bh_, bl)
    }
  }

  // Out, through the subgroup's tile: rows i < L, its 16 columns.
  const uint t_at = sg * 256u, col0 = 16u * sg;
  STORE_TILE(unsplit(x1, x1_lo), t_at, lane, k.L, rec, head_row(k, i_) * RW + col0, exp(lg[i_]))
  STORE_TILE(unsplit(x2, x2_lo), t_at, lane, k.L, rec, head_row(k, i_) * RW + D + col0, exp(lgam - lg[i_]))  // the dK~ term (in dK-)
  STORE_TILE(unsplit(w, w_lo), t_at, lane, k.L, dw, head_row(k, i_) * D + col0, -1.0)
  if (sg < 2u) coopMatStoreNV(unsplit(pd, pd_lo), pairs, (wg * 2u + sg) * 256u, 16u, false);  // [i][j]

  extra = subgroupAdd(extra);
  if (subgroupElect()) red[sg] = extra;
  barrier();
  if (tid == 0u) {
    float x = 0.0;
    [[unroll]] for (uint p = 0u; p < 8u; ++p) x += red[p];
    sdot[wg] = exp(lgam) * x;
  }
}
