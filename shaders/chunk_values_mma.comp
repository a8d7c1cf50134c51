#version 460
// Chunked backward on the matrix units, pass 3 of 4: chunk_values.comp's products over the value dims,
// as 16x16x16 products of GL_NV_cooperative_matrix (mma.glsl), one workgroup per (window b, v-head h,
// pair of chunks a = 2p, b = 2p + 1), CH = 16. Per chunk, with S its start state and dS the gradient
// of its end state, both stored [column c][row r]:
//   X1 = dO S^T,   dW = -dU S^T,   X2 = U dS^T,   <dO_i, u_j>,  <dU_i, v_j>,   Gamma <dS, S>
// The tape and chunk_dstate_mma keep states only at the pairs' edges: S0 at the start of a (a
// checkpoint; zero for the first pair) and dSe at the end of b (zero for the last). The state between
// the two chunks and its gradient are made here again, as the serial passes made them:
//   Sm = Gamma_a S0 + K~_a^T U_a,   dSm = Gamma_b dSe + Q~_b^T dO_b - W_b^T dU_b
// (W_b: chunk_w stored it with the tape)
// so that the states, most of this pass's traffic, are read once per two chunks.
// The layout: 16 subgroups; subgroup s makes chunk s / 8's products at key dims r = 16 (s % 8) ..
// + 15, all transposed, with the states on the left (S^T [r][c] is a column-major read of a stage
// [c][r]), so that the one it makes again (Sm^T for chunk b, dSm^T for chunk a) feeds its products
// without leaving its registers:
//   X1^T = S^T dO^T,  dW^T = -S^T dU^T,  X2^T = dS^T U^T,  Sm^T = Gamma_a S0^T + K~_a^T U_a, ...
// The value dims c pass through shared memory 16 at a time (8 rounds): the two states' 16 rows [c][r]
// and the eight operands' (dO, dU, U, V of both chunks) 16 columns [i][c], as fp16 pairs, loaded
// DEPTH rounds ahead with coalesced vec4 reads. K~_a^T, Q~_b^T and -W_b^T stay in registers.
// Leaves what chunk_values leaves, per chunk, for chunk_grads_mma: the records' first dq^ and dk^
// terms gamma_i X1 and (Gamma / gamma_i) X2, dW, the pair dots and Gamma <dS, S>.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 512) in;               // 16 subgroups of 32 (the host requires exactly 32)
layout(constant_id = 0) const uint SG = 32;

#include "chunk_grads.glsl"

// vec4 views of chunk_grads.glsl's bindings, and the forward's W.
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };  // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 3) readonly buffer Y4 { vec4 y4[]; };      // [B, T, C/4]
layout(set = 0, binding = 4) readonly buffer U4 { vec4 u4[]; };      // [B, T, nv*D/4] u (the forward's tape)
layout(set = 0, binding = 5) readonly buffer Do4 { vec4 do4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 6) readonly buffer Du4 { vec4 du4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 9) readonly buffer Ck4 { vec4 ck4[]; };    // [B, nv, pair slots, D, D/4] S0
layout(set = 0, binding = 10) readonly buffer Dsc4 { vec4 dsc4[]; }; // [B, nv, pair slots, D, D/4] dSe
layout(set = 0, binding = 15) readonly buffer Wf4 { vec4 wf4[]; };   // [B, T, nv, D/4] W (the forward's)

#define RC 16u    // value dims per round
#define DEPTH 2u  // rounds of loads in flight (H200: 1.005 ms against 1.023 at 3, whose registers spill)
// The stages are arrays of uvec2 (4 halves: one 64-bit store per invocation and array), which the
// matrix loads index in uvec2s.
#define SDP 34u  // row stride (uvec2s) of the staged states: 272 bytes, rows in distinct banks
#define OPP 6u   // row stride (uvec2s) of the staged operands: 48 bytes, likewise
shared uvec2 st_hi[2u * RC * SDP], st_lo[2u * RC * SDP];    // S0, dSe: [state][c][r]
shared uvec2 op_hi[8u * 16u * OPP], op_lo[8u * 16u * OPP];  // dO, dU, U, V of a, then of b: [operand][i][c]
shared float tiles[16u * 256u];  // per subgroup, one fp32 16 x 16 tile [i][r] on its way out
shared float lgp[2u * 16u];     // lg of chunks a and b
shared float red[16u];          // per subgroup: its share of its chunk's <dS, S>
// The operands' slots in op_hi, op_lo (chunk a; chunk b's are 4 further).
#define OP_DO 0u
#define OP_DU 1u
#define OP_U 2u
#define OP_V 3u

// One invocation's loads of a round: vec4 tid of each state's 16 x 128 rows and of the operands'
// 8 x 16 x 16.
struct Round {
  vec4 s0, ds, op;
};

Round fetch_round(Chunk ka, Chunk kb, uint tid, uint c0, uint s0_at, uint ds_at, bool has_s0, bool has_ds) {
  Round f;
  const uint at = ((c0 + tid / 32u) * D) / 4u + tid % 32u;  // row c0 + tid / 32, elements 4 (tid % 32) ..
  f.s0 = has_s0 ? ck4[s0_at / 4u + at] : vec4(0.0);
  f.ds = has_ds ? dsc4[ds_at / 4u + at] : vec4(0.0);
  const uint slot = tid / 64u, i = (tid / 4u) % 16u, col = c0 + 4u * (tid % 4u);
  const Chunk k = slot < 4u ? ka : kb;
  const uint which = slot % 4u;
  f.op = vec4(0.0);
  if (i < k.L) {
    const uint bt = k.b * pc.t + k.t0 + i;
    const uint o = ((bt * pc.nv + k.h) * D + col) / 4u;
    if (which == OP_DO) f.op = do4[o];
    else if (which == OP_DU) f.op = du4[o];
    else if (which == OP_U) f.op = u4[o];
    else f.op = y4[(bt * pc.c_dim + 2u * pc.nk * D + k.h * D + col) / 4u];
  }
  return f;
}

void stage_round(Round f, uint tid) {
  const uint at = (tid / 32u) * SDP + tid % 32u;
  PUT_SPLIT4(st_hi, st_lo, at, f.s0)
  PUT_SPLIT4(st_hi, st_lo, RC * SDP + at, f.ds)
  PUT_SPLIT4(op_hi, op_lo, (tid / 4u) * OPP + tid % 4u, f.op)  // (operand tid / 64, row (tid / 4) % 16)
}

// Operand `slot` of the stage as the right factor: [i][c] (row-major) or its transpose [c][i].
#define LOAD_OP(h, l, slot, transposed)                                \
  {                                                                    \
    coopMatLoadNV(h, op_hi, (slot) * 16u * OPP, OPP, transposed);      \
    coopMatLoadNV(l, op_lo, (slot) * 16u * OPP, OPP, transposed);      \
  }
float dot_tiles(F32M x, F32M y) {
  float s = 0.0;
  for (int e = 0; e < x.length(); ++e) s += x[e] * y[e];
  return s;
}

// Stages a chunk's [16][128] operand rows (each invocation's vec4) at region `at0` of st, split.
void stage_rows(uint at0, vec4 x, uint tid) { PUT_SPLIT4(st_hi, st_lo, at0 + (tid / 32u) * SDP + tid % 32u, x) }

void main() {
  const uint nch = (pc.t + CH - 1u) / CH, npair = (nch + 1u) / 2u;
  const uint wg = linear_group();  // (b*nv + h)*npair + p
  if (wg >= pc.nb * pc.nv * npair) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint bh = wg / npair, p = wg % npair, b = bh / pc.nv, h = bh % pc.nv;
  const bool has_b = 2u * p + 1u < nch;
  const Chunk ka = chunk_of(b, h, 2u * p);
  Chunk kb = chunk_of(b, h, has_b ? 2u * p + 1u : 2u * p);
  if (!has_b) kb.L = 0u;  // no chunk b: its operands are zero, and nothing of it is stored
  const uint slots = max(npair, 2u) - 1u;
  const bool has_s0 = p > 0u, has_ds = 2u * p + 2u < nch;
  // (0 where there is no such state: in range, should a compiler load before it selects.)
  const uint s0_at = has_s0 ? (bh * slots + p - 1u) * D * D : 0u, ds_at = has_ds ? (bh * slots + p) * D * D : 0u;

  Round ring[DEPTH];
  [[unroll]] for (uint n = 0u; n < DEPTH; ++n) ring[n] = fetch_round(ka, kb, tid, n * RC, s0_at, ds_at, has_s0, has_ds);

  // The rows of the constant left factors below (row tid / 32, elements 4 (tid % 32) ..): k^ of a,
  // q^ and W of b, loaded before the barrier that their scales wait for.
  const uint fi = tid / 32u, fr4 = tid % 32u;
  vec4 fk = vec4(0.0), fq = vec4(0.0), fw = vec4(0.0);
  if (fi < ka.L) fk = qkn4[((pc.nb * pc.t + ka.b * pc.t + ka.t0 + fi) * pc.nk + ka.ko) * (D / 4u) + fr4];
  if (fi < kb.L) {
    fq = qkn4[((kb.b * pc.t + kb.t0 + fi) * pc.nk + kb.ko) * (D / 4u) + fr4];
    fw = wf4[head_row(kb, fi) * (D / 4u) + fr4];
  }
  if (tid < 32u) lgp[tid] = tid < 16u ? chunk_lg(ka, tid) : has_b ? chunk_lg(kb, tid - 16u) : 0.0;
  barrier();
  const float lgam_a = lgp[15], gam_a = exp(lgam_a), gam_b = has_b ? exp(lgp[31]) : 0.0;

  // Subgroup sg makes chunk ab's products (0: a, 1: b) at key dims r = 16 q ..
  const uint ab = sg / 8u, q = sg % 8u;
  // Its constant left factors [r][i]: chunk a's Q~_b^T and -W_b^T (for dSm), chunk b's K~_a^T (for
  // Sm), staged [i][r] in st and read column-major.
  F16M c1h, c1l, c2h = F16M(0.0), c2l = F16M(0.0);
  {
    stage_rows(0u, exp(lgam_a - lgp[fi]) * fk, tid);  // K~_a (rows past the chunk: zero)
    stage_rows(RC * SDP, exp(lgp[16u + fi]) * fq, tid);  // Q~_b
    PUT_SPLIT4(op_hi, op_lo, fi * SDP + fr4, -fw)      // -W_b, in the operands' stage (16 SDP rows fit in 8 x 16 OPP)
    barrier();
    const uint from = ab == 0u ? RC * SDP : 0u;  // Q~_b or K~_a
    coopMatLoadNV(c1h, st_hi, from + 4u * q, SDP, true);
    coopMatLoadNV(c1l, st_lo, from + 4u * q, SDP, true);
    if (ab == 0u) {  // -W_b^T: column-major loads of the [i][r] stage
      coopMatLoadNV(c2h, op_hi, 4u * q, SDP, true);
      coopMatLoadNV(c2l, op_lo, 4u * q, SDP, true);
    }
  }

  // The chunk's X1^T, dW^T (without its sign), X2^T: [r][i]
  F32M x1 = F32M(0.0), w = F32M(0.0), x2 = F32M(0.0);
  F32M pd = F32M(0.0);  // subgroups 8, 9: dO_a U_a^T, dU_a V_a^T; 10, 11: the same of b ([i][j])
  float sdot_part = 0.0;  // this invocation's share of <dSm, S0> (chunk a) or <dSe, Sm> (chunk b)
  const uint ops = 4u * ab;  // the chunk's operand slots
  // The loop is unrolled so that the ring's slots are fixed.
  [[unroll]] for (uint n = 0u; n < D / RC; ++n) {
    const Round cur = ring[n % DEPTH];
    barrier();  // the previous round's readers of the stage are done
    stage_round(cur, tid);
    if (n + DEPTH < D / RC) ring[n % DEPTH] = fetch_round(ka, kb, tid, (n + DEPTH) * RC, s0_at, ds_at, has_s0, has_ds);
    barrier();

    // The stored state this chunk reads at its edge: S0^T (a) or dSe^T (b), [r][c] (column-major
    // reads of the [c][r] stage); and the one it makes again from the other: dSm^T (a) or Sm^T (b).
    F16M eh, el, bh_, bl, ah, al;
    coopMatLoadNV(eh, st_hi, ab * RC * SDP + 4u * q, SDP, true);
    coopMatLoadNV(el, st_lo, ab * RC * SDP + 4u * q, SDP, true);
    coopMatLoadNV(ah, st_hi, (1u - ab) * RC * SDP + 4u * q, SDP, true);
    coopMatLoadNV(al, st_lo, (1u - ab) * RC * SDP + 4u * q, SDP, true);
    const F32M edge = F32M(eh) + F32M(el) * (1.0 / LO), other = F32M(ah) + F32M(al) * (1.0 / LO);
    F32M made;
    if (ab == 0u) {  // dSm^T = Gamma_b dSe^T + Q~_b^T dO_b - W_b^T dU_b
      made = other * gam_b;
      LOAD_OP(bh_, bl, 4u + OP_DO, false)
      mma_split_into(made, c1h, c1l, bh_, bl);
      LOAD_OP(bh_, bl, 4u + OP_DU, false)
      mma_split_into(made, c2h, c2l, bh_, bl);
      sdot_part += dot_tiles(made, edge);
    } else {  // Sm^T = Gamma_a S0^T + K~_a^T U_a
      made = other * gam_a;
      LOAD_OP(bh_, bl, OP_U, false)
      mma_split_into(made, c1h, c1l, bh_, bl);
      sdot_part += dot_tiles(edge, made);
    }
    // S^T on the left: S0^T (a) or Sm^T (b); dS^T: dSm^T (a) or dSe^T (b)
    split(made, ah, al);
    F16M sh, sl, dh, dl;
    if (ab == 0u) { sh = eh; sl = el; dh = ah; dl = al; }
    else { sh = ah; sl = al; dh = eh; dl = el; }
    LOAD_OP(bh_, bl, ops + OP_DO, true)
    mma_split_into(x1, sh, sl, bh_, bl);
    LOAD_OP(bh_, bl, ops + OP_DU, true)
    mma_split_into(w, sh, sl, bh_, bl);
    LOAD_OP(bh_, bl, ops + OP_U, true)
    mma_split_into(x2, dh, dl, bh_, bl);

    // The pair dots: dO or dU [i][c] times U or V read column-major, [c][j] = [j][c]^T.
    if (sg >= 8u && sg < 12u) {
      const uint left = ((sg - 8u) / 2u) * 4u + sg % 2u;  // dO with U, dU with V, of a then of b
      LOAD_OP(ah, al, left, false)
      LOAD_OP(bh_, bl, left + 2u, true)
      mma_split_into(pd, ah, al, bh_, bl);
    }
  }

  // Out, through the subgroup's tile: rows i < L of its chunk, its 16 columns.
  const Chunk k = ab == 0u ? ka : kb;
  const uint t_at = sg * 256u, col0 = 16u * q, lg0 = 16u * ab;
  const float lgam = lgp[lg0 + 15u];
  STORE_TILE_T(x1, t_at, lane, k.L, rec, head_row(k, i_) * RW + col0, exp(lgp[lg0 + i_]))
  STORE_TILE_T(x2, t_at, lane, k.L, rec, head_row(k, i_) * RW + D + col0, exp(lgam - lgp[lg0 + i_]))  // the dK~ term (in dK-)
  STORE_TILE_T(w, t_at, lane, k.L, dw, head_row(k, i_) * D + col0, -1.0)
  const uint chunk_a = bh * nch + 2u * p;  // [B, nv, nch] index of chunk a
  if (sg >= 8u && sg < 12u && (sg < 10u || has_b))
    coopMatStoreNV(pd, pairs, ((chunk_a + (sg - 8u) / 2u) * 2u + sg % 2u) * 256u, 16u, false);  // [i][j]

  sdot_part = subgroupAdd(sdot_part);
  if (subgroupElect()) red[sg] = sdot_part;
  barrier();
  if (tid < 2u && (tid == 0u || has_b)) {
    float x = 0.0;
    [[unroll]] for (uint g = 0u; g < 8u; ++g) x += red[8u * tid + g];
    sdot[chunk_a + tid] = (tid == 0u ? gam_a : gam_b) * x;
  }
}
