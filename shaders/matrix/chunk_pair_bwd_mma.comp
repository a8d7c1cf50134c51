#version 460
// Chunked backward on the matrix units, the last pass: chunk_values.comp's products over the value
// dims, then chunk_grads.comp's gradients of the chunk's inputs, for a pair of chunks per workgroup
// (window b, v-head h, chunks a = 2p, b = 2p + 1), CH = 16, so that the products go from one phase
// to the next in registers. 16 subgroups of 32; subgroup s works on chunk s / 8 at key dims, and in
// phase 2 also value dims, 16 (s % 8) .. + 15.
//
// Phase 1, the value-dim products. Per chunk, with S its start state and dS the gradient of its end
// state, both stored [column c][row r]:
//   X1 = dO S^T,   Y = Yv S^T,   X2 = U dS^T,   Gamma <dS, S>
// with Yv = T^T dU, which chunk_dstate_mma made (dW T = -Y: dW = -dU S^T). It also made the pair
// dots <dO_i, u_j> and <Yv_i, x_j>, with X = V - diag(gamma) K S0 (U = T diag(beta) X).
// The tape and chunk_dstate_mma keep states only at the pairs' edges: S0 at the start of a (a
// checkpoint; h0 or zero for the first pair) and dSe at the end of b (dht or zero for the last). The state between
// the two chunks and its gradient are made here again, as the serial passes made them:
//   Sm = Gamma_a S0 + K~_a^T U_a,   dSm = Gamma_b dSe + Q~_b^T dO_b - K_b^T diag(beta_b gamma_b) Yv_b
// (W_b^T dU_b = K_b^T diag(beta gamma) T_b^T dU_b), so that the states, most of this pass's
// traffic, are read once per two chunks. The diagonal scalings go onto the operands as they are
// staged: U~ = diag(Gamma / gamma) U and dO~ = diag(gamma) dO, so that K~_a^T U_a = K_a^T U~_a and
// Q~_b^T dO_b = Q_b^T dO~_b, and phase 2's X1g and X2g below come out of phase 1 as such. Each
// subgroup makes its chunk's products transposed, with the states on the left (S^T [r][c] is a
// column-major read of a stage [c][r]), so that the one it makes again (Sm^T for chunk b, dSm^T for
// chunk a) feeds its products without leaving its registers:
//   X1g^T = S^T dO~^T,  Y^T = S^T Yv^T,  X2g^T = dS^T U~^T,  Sm^T = Gamma_a S0^T + K_a^T U~_a, ...
// The value dims c pass through shared memory 32 at a time (4 rounds, two 16-column blocks each):
// the two states' 32 rows [c][r] and the six operands' (dO, Yv, U of both chunks) 32 columns [i][c],
// as fp16 pairs, loaded DEPTH rounds ahead with coalesced vec4 reads. K_a^T, Q_b^T and
// -(diag(beta gamma) K_b)^T stay in registers.
//
// Phase 2, each half of the workgroup its chunk's gradients, from X1g^T, Y^T and X2g^T as phase 1
// left them in its registers (the forms are chunk_grads.comp's, but for X and Yv). The chunk's
// 16 x 16 matrices M and F (chunk_factors.comp, from the pair dots chunk_dstate_mma made) come as the
// right factors [m][i] of the products, fp16 pairs loaded from memory (chunk_factors.glsl):
//   diag(beta gamma),  M^T,  M,  E1 = [beta_i F_im],  E2 = [beta_m F_mi]
// and each subgroup makes its columns of every [CH x D] result, transposed ([column][i]):
//   dQ^T  = X1g^T + K^T M^T              (M with its diagonal)
//   dM^T  = X2g^T + Q^T M + K^T E2       dK^T = dM^T - Y^T diag(beta gamma) + K^T E1
// with X1g = diag(gamma) X1 = dO~ S^T and X2g = diag(Gamma / gamma) X2 = U~ dS^T
// (dW^T T diag(beta gamma) = -Y^T diag(beta gamma)). The row sums of d(log g) come from
// element-wise products of tiles of one layout:
//   dlg_i  = sum_c [q o dQ + k o (dK - 2 dM)]_ic   (+ Gamma <dS, S0> + <K, X2g> at i = CH-1)
// (dK - 2 dM = dK+ - dK- of chunk_grads.comp: the diagonal of M cancels in it). The record's dq^,
// dk^ and d(log g) are written once (qk_bwd2 reads them; chunk_factors wrote its dbeta). Phase 2
// has two barriers: one before its first tile (its tiles take phase 1's stages; its loads are issued
// before it) and one before the rows' sums.
//
// Scales (mma.glsl): the states, u, dO and Yv come as their true values and are staged as
// 2^es S0, 2^ed dSe, 2^ev U~, 2^eo dO~, 2^eu Yv (the head's exponents of chunk_fwd_mma and
// chunk_dstate_mma; chunk_factors' factors carry 2^(ev + eo) and 2^(ev + eu)), q^ and k^ as 2^eqk
// times theirs (the chunk's exponent, chunk_prep_fwd). Each product comes out at the sum of its
// operands' exponents; a sum of products of different scales is made in one accumulator rescaled
// (exactly) to each product's scale before it, and the records are stored as true values.
//
// Shared memory: one float array, `tiles`, holds phase 1's stages (46.5 KiB of fp16 pairs, two
// halves to a float) and then phase 2's fp32 16 x 16 tile per subgroup (16 KiB); with the sums below
// it is 47.9 KiB, under the 48 KiB a workgroup gets on the devices this pass runs on.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 512) in;               // 16 subgroups of 32 (the host requires exactly 32)
layout(constant_id = 0) const uint SG = 32;
// The build that carries state (h0, ht; dht, dh0): a pipeline of its own, so that the plain build
// spends no registers on it.
layout(constant_id = 2) const bool STATES = false;

// The bindings, in the order of src/families/chunked_mma.cpp's dispatch of this pass.
layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };      // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };     // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]: beta at [1]
layout(set = 0, binding = 2) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (the forward's)
layout(set = 0, binding = 3) readonly buffer Fac { uvec2 fac[]; };      // [B, nv, nch][factor][hi, lo][16][4] (chunk_factors)
// Phase 1's ring of loads (bindings 4 to 8) is volatile: so marked, the loads stay where they are
// issued, DEPTH rounds ahead of their use (faster than without; docs/performance.md). The serial
// passes' prefetches so marked measured slower or no faster.
layout(set = 0, binding = 4) volatile readonly buffer U4 { vec4 u4[]; };      // [B, T, nv*D/4] u (the forward's tape)
layout(set = 0, binding = 5) volatile readonly buffer Do4 { vec4 do4[]; };    // [B, T, nv*D/4] dO (chunk_dstate_mma)
layout(set = 0, binding = 6) volatile readonly buffer Yv4 { vec4 yv4[]; };    // [B, T, nv*D/4] Yv = T^T dU (chunk_dstate_mma)
layout(set = 0, binding = 7) volatile readonly buffer Ck4 { vec4 ck4[]; };    // [B, nv, pair slots, D, D/4] S0
layout(set = 0, binding = 8) volatile readonly buffer Dsc4 { vec4 dsc4[]; };  // [B, nv, pair slots, D, D/4] dSe
layout(set = 0, binding = 9) writeonly buffer Rec { float rec[]; };     // [B, T, nv][RW] records (qk_bwd2 reads them)
layout(set = 0, binding = 10) readonly buffer Vscale { float vscale[]; };  // [2][B, nv][SPLIT] ev, es (chunk_fwd_mma)
layout(set = 0, binding = 11) readonly buffer Dscale { float dscale[]; };  // [3][B, nv][SPLIT] eo, ed, eu (chunk_dstate_mma)
layout(set = 0, binding = 12) readonly buffer Eqk { float eqkb[]; };      // [B, nk, nch] eqk (chunk_prep_fwd)
layout(set = 0, binding = 13) readonly buffer Mdiag { float mdiag[]; };   // [B, nv, nch][16] M_ii (chunk_factors)
// the carried state [B, nv, D, D] S[k][v]: the first pair's S0 (STATE_H0), the last pair's dSe
// (STATE_CARRY); else zero
layout(set = 0, binding = 14) readonly buffer H0 { float h0[]; };
layout(set = 0, binding = 15) readonly buffer Dht { float dht[]; };

#define CHUNK_NO_SHARED_GATES  // (sc_do, sc_u below)
#include "chunk.glsl"
#include "chunk_factors.glsl"

#define RC 32u    // value dims per round: two 16-column blocks (four rounds, eight barriers)
#define DEPTH 1u  // rounds of loads in flight
// The stages are rows of fp16 pairs, each row's hi halves then its lo halves, in uvec2s (4 halves:
// one 64-bit store per invocation), which the matrix loads index in uvec2s (POOL_LOAD):
// - the states S0, dSe, [state][c][r]: rows of 32 hi + 32 lo uvec2 and 2 of padding, SDR apart
//   (528 bytes: the 8 rows of one 128-bit matrix load phase fall in distinct banks);
// - the operands dO, Yv, U of a, then of b, [operand][i][c]: rows of 8 hi + 8 lo and 2 of
//   padding, OPR apart (144 bytes, likewise).
#define SDR 66u
#define SLO 32u  // offset of a state row's lo halves
#define OPR 18u
#define OLO 8u   // offset of an operand row's lo halves
#define NOP 6u   // operands staged
#define OPB (2u * RC * SDR)             // the operand stage's start
#define POOL (OPB + NOP * 16u * OPR)    // 5952 uvec2s, 46.5 KiB
shared float tiles[2u * POOL];  // phase 1: the stages (uvec2 at = floats 2 at, 2 at + 1); phase 2: per subgroup a 16 x 16 tile
shared float sc_do[2u * 16u], sc_u[2u * 16u];  // chunks a and b: gamma_i (dO~'s row scales), Gamma / gamma_i (U~'s)
shared float red[16u];      // per subgroup: its share of its chunk's <dS, S>
shared float extra_p[16u];  // per subgroup: its share of <K, X2g>
shared float row_p[16u * 16u];  // per subgroup: its share of the row sums of dlg [sg][i]

// A matrix load of the stages at uvec2 `at`, rows `stride` uvec2s apart.
#define POOL_LOAD(m, at, stride, col_major) coopMatLoadNV(m, tiles, 2u * (at), 2u * (stride), col_major)
// Stores x split into its fp16 pair: the hi halves at uvec2 `at`, the lo halves `lo` further.
void put_split4(uint at, uint lo, vec4 x) {
  const vec4 h = hi_part(x);
  const uvec2 hh = pack_half4(h), ll = pack_half4((x - h) * LO);
  tiles[2u * at] = uintBitsToFloat(hh.x);
  tiles[2u * at + 1u] = uintBitsToFloat(hh.y);
  tiles[2u * (at + lo)] = uintBitsToFloat(ll.x);
  tiles[2u * (at + lo) + 1u] = uintBitsToFloat(ll.y);
}

// ---- phase 1 ----

// The operands' slots in the operand stage (chunk a; chunk b's are 3 further).
#define OP_DO 0u
#define OP_YV 1u
#define OP_U 2u

// One invocation's loads of a round: vec4s tid and tid + 512 of each state's 32 x 128 rows (rows
// tid / 32 and 16 + tid / 32), and of the operands' 6 x 16 x 32 (768 vec4s: the second for tid < 256).
struct Round {
  vec4 s0[2], ds[2], op[2];
};

// Elements [c][r .. r+3] of a carried state of (window, head) bh ([k][v] rows: four loads).
vec4 carried4(bool h0_not_dht, uint bh, uint c, uint r) {
  vec4 x;
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint at = (bh * D + r + l) * D + c;
    x[l] = h0_not_dht ? h0[at] : dht[at];
  }
  return x;
}

// s0_at, ds_at: the states' slots where stored (s0_stored, ds_stored); else the first pair's S0 is
// h0 (STATE_H0) and the last pair's dSe dht (STATE_CARRY), or zero.
Round fetch_round(Chunk ka, Chunk kb, uint tid, uint c0, uint bh, uint s0_at, uint ds_at, bool s0_stored,
                  bool ds_stored) {
  Round f;
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint c = c0 + tid / 32u + 16u * e, at = (c * D) / 4u + tid % 32u;  // row c, elements 4 (tid % 32) ..
    f.s0[e] = s0_stored ? ck4[s0_at / 4u + at]
                        : STATES && has(STATE_H0) ? carried4(true, bh, c, 4u * (tid % 32u)) : vec4(0.0);
    f.ds[e] = ds_stored ? dsc4[ds_at / 4u + at]
                        : STATES && has(STATE_CARRY) ? carried4(false, bh, c, 4u * (tid % 32u)) : vec4(0.0);
  }
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint o = tid + 512u * e, slot = o / 128u, i = (o / 8u) % 16u, col = c0 + 4u * (o % 8u);
    const Chunk k = slot < 3u ? ka : kb;
    const uint which = slot % 3u;
    f.op[e] = vec4(0.0);
    if (slot < NOP && i < k.L) {
      const uint bt = k.b * pc.t + k.t0 + i;
      const uint at = ((bt * pc.nv + k.h) * D + col) / 4u;
      if (which == OP_DO) f.op[e] = do4[at];
      else if (which == OP_YV) f.op[e] = yv4[at];
      else f.op[e] = u4[at];
    }
  }
  return f;
}

// The stages' scales: 2^es S0, 2^ed dSe, 2^ev U~, 2^eo dO~, 2^eu Yv.
struct Scales {
  float s, d, v, o, u;
};
void stage_round(Round f, uint tid, Scales sc) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint at = (tid / 32u + 16u * e) * SDR + tid % 32u;
    put_split4(at, SLO, sc.s * f.s0[e]);
    put_split4(RC * SDR + at, SLO, sc.d * f.ds[e]);
    const uint o = tid + 512u * e, slot = o / 128u;  // (operand, its chunk's row, uvec2 o % 8)
    if (o < NOP * 128u) {
      const uint row = 16u * (slot / 3u) + (o / 8u) % 16u;
      const uint which = slot % 3u;
      const float rs = which == OP_DO ? sc_do[row] : which == OP_U ? sc_u[row] : 1.0;  // dO~, U~, Yv
      const float es = which == OP_DO ? sc.o : which == OP_U ? sc.v : sc.u;
      put_split4(OPB + (o / 8u) * OPR + o % 8u, OLO, rs * (es * f.op[e]));
    }
  }
}
// Stages a chunk's [16][128] operand rows (each invocation's vec4) at row `row0` of the state stage.
void stage_rows(uint row0, vec4 x, uint tid) { put_split4((row0 + tid / 32u) * SDR + tid % 32u, SLO, x); }

// Columns 16 j .. of operand `slot` of the stage as the right factor: [i][c] (row-major) or its
// transpose [c][i].
#define LOAD_OP(h, l, slot, j, transposed)                                   \
  {                                                                          \
    POOL_LOAD(h, OPB + (slot) * 16u * OPR + 4u * (j), OPR, transposed);       \
    POOL_LOAD(l, OPB + (slot) * 16u * OPR + 4u * (j) + OLO, OPR, transposed); \
  }
// The state stage from row `row` at uvec2 `col`, read column-major: [r][c] of a [c][r] stage.
#define LOAD_STATE_T(h, l, row, col)                        \
  {                                                         \
    POOL_LOAD(h, (row) * SDR + (col), SDR, true);           \
    POOL_LOAD(l, (row) * SDR + (col) + SLO, SDR, true);     \
  }

// ---- phase 2 ----

// The lane's share (tile_row, tile_lane) of a subgroup's operand tile [i][column] at its 16 columns
// from col0; rows past the chunk are zero.
void fetch_operand(Chunk k, uint lane, uint col0, uint which, out vec4 x[2]) {  // which: QK_Q or QK_K
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint i = tile_row(lane, e), c4 = (col0 + 4u * (lane % 4u)) / 4u;
    x[e] = i < k.L ? qkn4[qk_at(which, k.b * pc.t + k.t0 + i, k.ko) / 4u + c4] : vec4(0.0);
  }
}
// Writes x^T [column][i] to the chunk's records at word w0 .. (its 16 columns): a whole chunk's
// rows straight from the registers, a short chunk's (the last of a window) through the subgroup's
// tile (faster than through the tile for every chunk).
void store_rows(F32M x, Chunk k, uint t_at, uint lane, uint w0) {
  if (k.L == CH) coopMatStoreNV(x, rec, head_row(k, 0u) * RW + w0, pc.nv * RW, true);  // rows i RW nv apart
  else STORE_TILE_T(x, t_at, lane, k.L, rec, head_row(k, i_) * RW + w0, 1.0)
}
// The subgroup's share of the row sums of x^T [column][i] over its 16 columns.
void row_share(F32M x, uint t_at, uint lane, uint sg) {
  coopMatStoreNV(x, tiles, t_at, 16u, false);  // [column][i]
  TILE_SYNC()
  if (lane < 16u) {
    float s = 0.0;
    [[unroll]] for (uint c = 0u; c < 16u; ++c) s += tiles[t_at + c * 16u + lane];
    row_p[sg * 16u + lane] = s;
  }
  subgroupBarrier();
}
float row_share_at(uint sg, uint i) { return row_p[sg * 16u + i]; }

float dot_tiles(F32M x, F32M y) {  // this lane's share of sum x o y
  float s = 0.0;
  for (int e = 0; e < x.length(); ++e) s = fma(x[e], y[e], s);
  return s;
}
F32M times(F32M x, F32M y) {  // element-wise (one layout: F32M's)
  F32M z = x;
  for (int e = 0; e < z.length(); ++e) z[e] = x[e] * y[e];
  return z;
}

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
  const bool s0_stored = p > 0u, ds_stored = 2u * p + 2u < nch;
  // (0 where there is no such state: in range, should a compiler load before it selects.)
  const uint s0_at = s0_stored ? (bh * slots + p - 1u) * D * D : 0u, ds_at = ds_stored ? (bh * slots + p) * D * D : 0u;

  const uint nbv = pc.nb * pc.nv;
  const int ev = int(HEAD_EXPONENT(vscale, bh)), es = int(HEAD_EXPONENT(vscale, nbv + bh));
  const int eo = int(HEAD_EXPONENT(dscale, bh)), ed = int(HEAD_EXPONENT(dscale, nbv + bh)),
            eu = int(HEAD_EXPONENT(dscale, 2u * nbv + bh));
  const Scales scales = Scales(pow2(es), pow2(ed), pow2(ev), pow2(eo), pow2(eu));

  Round ring[DEPTH];
  [[unroll]] for (uint n = 0u; n < DEPTH; ++n) ring[n] = fetch_round(ka, kb, tid, n * RC, bh, s0_at, ds_at, s0_stored, ds_stored);

  // The rows of the constant left factors below (row tid / 32, elements 4 (tid % 32) ..): k^ of a,
  // q^ and k^ of b, and beta of b (for -diag(beta gamma) K_b), loaded before the barrier.
  const uint fi = tid / 32u, fr4 = tid % 32u;
  vec4 fk = vec4(0.0), fq = vec4(0.0), fkb = vec4(0.0);
  const float beta_b = chunk_beta(kb, fi);
  if (fi < ka.L) fk = qkn4[qk_at(QK_K, ka.b * pc.t + ka.t0 + fi, ka.ko) / 4u + fr4];
  if (fi < kb.L) {
    fq = qkn4[qk_at(QK_Q, kb.b * pc.t + kb.t0 + fi, kb.ko) / 4u + fr4];
    fkb = qkn4[qk_at(QK_K, kb.b * pc.t + kb.t0 + fi, kb.ko) / 4u + fr4];
  }
  if (tid < 32u) {
    const Chunk kr = tid < 16u ? ka : kb;
    const uint i = tid % 16u;
    const vec2 l = tid < 16u || has_b ? chunk_lg(kr, i) : vec2(0.0), lgam = tid < 16u || has_b ? chunk_lg(kr, CH - 1u) : vec2(0.0);
    sc_do[tid] = exp(l.x + l.y);
    sc_u[tid] = exp(lg_diff(lgam.x, lgam.y, l.x, l.y));
  }
  barrier();
  const float gam_a = sc_do[15], gam_b = has_b ? sc_do[31] : 1.0;  // (no chunk b: dSm = dSe)
  // 2^eqk of chunks a and b
  const int eqk_a = int(eqkb[(b * pc.nk + ka.ko) * nch + ka.c]);
  const int eqk_b = has_b ? int(eqkb[(b * pc.nk + kb.ko) * nch + kb.c]) : 0;
  const float sq_a = pow2(eqk_a), sq_b = pow2(eqk_b);

  // Subgroup sg makes chunk ab's products (0: a, 1: b) at key dims r = 16 q ..
  const uint ab = sg / 8u, q = sg % 8u;
  // Its constant left factors [r][i]: chunk a's Q_b^T and -(diag(beta gamma) K_b)^T (for dSm),
  // chunk b's K_a^T (for Sm), staged [i][r] and read column-major.
  F16M c1h, c1l, c2h = F16M(0.0), c2l = F16M(0.0);
  {
    stage_rows(0u, sq_a * fk, tid);  // 2^eqk K_a (rows past the chunk: zero)
    stage_rows(16u, sq_b * fq, tid);  // 2^eqk Q_b
    stage_rows(RC, -(beta_b * sc_do[16u + fi]) * (sq_b * fkb), tid);  // 2^eqk -diag(beta gamma) K_b
    barrier();
    LOAD_STATE_T(c1h, c1l, ab == 0u ? 16u : 0u, 4u * q)  // Q_b or K_a
    if (ab == 0u) LOAD_STATE_T(c2h, c2l, RC, 4u * q)   // -(diag(beta gamma) K_b)^T
  }

  // The chunk's X1g^T, Y^T, X2g^T: [r][i]
  F32M x1 = F32M(0.0), w = F32M(0.0), x2 = F32M(0.0);
  float sdot_part = 0.0;  // this invocation's share of <dSm, S0> (chunk a) or <dSe, Sm> (chunk b), at 2^(ed + es)
  const uint ops = 3u * ab;  // the chunk's operand slots
  // The loop is unrolled so that the ring's slots are fixed.
  [[unroll]] for (uint n = 0u; n < D / RC; ++n) {
    const Round cur = ring[n % DEPTH];
    barrier();  // the previous round's readers of the stage are done
    stage_round(cur, tid, scales);
    if (n + DEPTH < D / RC) ring[n % DEPTH] = fetch_round(ka, kb, tid, (n + DEPTH) * RC, bh, s0_at, ds_at, s0_stored, ds_stored);
    barrier();
    [[unroll]] for (uint j = 0u; j < RC / 16u; ++j) {  // the round's 16-column blocks
      // The stored state this chunk reads at its edge: S0^T (a) or dSe^T (b), [r][c] (column-major
      // reads of the [c][r] stage); and the one it makes again from the other: dSm^T (a) or Sm^T (b),
      // hi alone in FAST (mma_hi_into) as the serial passes' states.
      F16M eh, el, bh_, bl, ah, al;
      LOAD_STATE_T(eh, el, ab * RC + 16u * j, 4u * q)
      LOAD_STATE_T(ah, al, (1u - ab) * RC + 16u * j, 4u * q)
      const F32M edge = F32M(eh) + F32M(el) * (1.0 / LO), other = F32M(ah) + F32M(al) * (1.0 / LO);
      F32M made;
      if (ab == 0u) {  // dSm^T = Gamma_b dSe^T + Q_b^T dO~_b - K_b^T diag(beta gamma) Yv_b, at 2^ed
        made = other * (gam_b * pow2(eo + eqk_b - ed));
        LOAD_OP(bh_, bl, 3u + OP_DO, j, false)
        mma_hi_into(made, c1h, c1l, bh_, bl);
        made = made * pow2(eu - eo);
        LOAD_OP(bh_, bl, 3u + OP_YV, j, false)
        mma_hi_into(made, c2h, c2l, bh_, bl);
        made = made * pow2(ed - eu - eqk_b);
        sdot_part += dot_tiles(made, edge);
      } else {  // Sm^T = Gamma_a S0^T + K_a^T U~_a, at 2^es
        made = other * (gam_a * pow2(ev + eqk_a - es));
        LOAD_OP(bh_, bl, OP_U, j, false)
        mma_hi_into(made, c1h, c1l, bh_, bl);
        made = made * pow2(es - ev - eqk_a);
        sdot_part += dot_tiles(edge, made);
      }
      // S^T on the left: S0^T (a) or Sm^T (b); dS^T: dSm^T (a) or dSe^T (b)
      split(made, ah, al);
      F16M sh, sl, dh, dl;
      if (ab == 0u) { sh = eh; sl = el; dh = ah; dl = al; }
      else { sh = ah; sl = al; dh = eh; dl = el; }
      LOAD_OP(bh_, bl, ops + OP_DO, j, true)
      mma_split_into(x1, sh, sl, bh_, bl);
      LOAD_OP(bh_, bl, ops + OP_YV, j, true)
      mma_split_into(w, sh, sl, bh_, bl);
      LOAD_OP(bh_, bl, ops + OP_U, j, true)
      mma_split_into(x2, dh, dl, bh_, bl);
    }
  }

  // ---- phase 2: the subgroup's chunk k, its columns col0 .. (key dims and value dims) ----
  const Chunk k = ab == 0u ? ka : kb;
  const uint col0 = 16u * q, t_at = sg * 256u, n = bh * nch + k.c;  // n: chunk_factors' index
  // The chunk's factors (chunk_factors.glsl), loaded at once: their latency off the products' chain
  // (faster than loading each before its product).
  F16M fh[NCF], fl[NCF];
  [[unroll]] for (uint c = 0u; c < NCF; ++c) {
    coopMatLoadNV(fh[c], fac, factor_at(n, c, 0u), FP, false);
    coopMatLoadNV(fl[c], fac, factor_at(n, c, 0u) + 64u, FP, false);
  }
  vec4 xk[2], xq[2];  // its operand tiles
  fetch_operand(k, lane, col0, QK_K, xk);
  fetch_operand(k, lane, col0, QK_Q, xq);
  sdot_part = subgroupAdd(sdot_part) * pow2(-(ed + es));
  if (subgroupElect()) red[sg] = sdot_part;
  // K^T in fp32 (for the element-wise products) and split, and -Y^T split: the left operands of the
  // products below.
  F32M kt;
  F16M kth, ktl, wth, wtl;
  barrier();  // phase 1's reads of the stages are done: its memory becomes the subgroups' tiles
  PUT_LANE_TILE(t_at, lane, xk)
  TILE_SYNC()
  coopMatLoadNV(kt, tiles, t_at, 16u, true);
  const int eqk = ab == 0u ? eqk_a : eqk_b;  // the chunk's: each product's left operand is 2^eqk times its own
  const float sq = pow2(eqk);
  split(kt * sq, kth, ktl);
  split(w * -sq, wth, wtl);
  TILE_SYNC()  // every lane's loads of the tile are done

  // ---- the subgroup's columns of the [CH x D] results, transposed ----
  F32M asum;          // the element-wise terms of dlg
  float extra = 0.0;  // this invocation's share of <K, X2g> (dlg at CH-1)
  {  // dM^T = X2g^T + Q^T M + K^T E2,  dK^T = dM^T - Y^T diag(beta gamma) + K^T E1
    F32M qt;
    F16M qh, ql;
    PUT_LANE_TILE(t_at, lane, xq)
    TILE_SYNC()
    coopMatLoadNV(qt, tiles, t_at, 16u, true);
    split(qt * sq, qh, ql);
    TILE_SYNC()
    // md [column][i] = M_ii, the diagonal of M in the tiles' layout
    [[unroll]] for (uint e = 0u; e < 8u; ++e) tiles[t_at + lane + 32u * e] = mdiag[n * 16u + lane % 16u];
    TILE_SYNC()
    F32M md;
    coopMatLoadNV(md, tiles, t_at, 16u, false);
    TILE_SYNC()
    extra = dot_tiles(kt, x2) * pow2(-(ed + ev));
    // (X1g^T is at 2^(es + eo), X2g^T at 2^(ed + ev), Y^T at 2^(es + eu); the products with M at
    // 2^(eqk + ev + eo), with E1, E2 at 2^(eqk + ev + eu), with diag(beta gamma) at 2^(eqk + es + eu))
    const int s_m = eqk + ev + eo, s_f = eqk + ev + eu, s_w = eqk + es + eu;
    F32M dm = x2 * pow2(s_m - (ed + ev));  // X2g^T
    mma_exact_into(dm, qh, ql, fh[CF_M], fl[CF_M]);
    dm = dm * pow2(s_f - s_m);
    mma_exact_into(dm, kth, ktl, fh[CF_E2], fl[CF_E2]);
    F32M dk = dm * pow2(s_w - s_f);
    mma_exact_into(dk, wth, wtl, fh[CF_BG], fl[CF_BG]);
    dk = dk * pow2(s_f - s_w);
    mma_exact_into(dk, kth, ktl, fh[CF_E1], fl[CF_E1]);
    dk = dk * pow2(-s_f);
    dm = dm * pow2(-s_f);
    // (dM and dK without M's diagonal so far: its terms cancel in dlg, and go to the records only)
    store_rows(dk + times(qt, md), k, t_at, lane, D + col0);
    asum = times(kt, dk - dm * 2.0);
    // dQ^T = X1g^T + K^T M^T
    F32M dq = x1 * pow2(s_m - (es + eo));  // X1g^T
    mma_exact_into(dq, kth, ktl, fh[CF_MT], fl[CF_MT]);
    dq = dq * pow2(-s_m);
    store_rows(dq + times(kt, md), k, t_at, lane, col0);
    asum = asum + times(qt, dq);
    row_share(asum, t_at, lane, sg);
  }
  extra = subgroupAdd(extra);
  if (subgroupElect()) extra_p[sg] = extra;
  barrier();

  // ---- the rows, by the chunk's first subgroup, lane l < 16 at row i = 15 - l:
  // d(log g_i) = sum_{m >= i} dlg_m as a sum over lanes 0 .. l ----
  if (q == 0u) {
    const uint i = 15u - min(lane, 15u);
    float a = 0.0;
    if (lane < 16u) {
      if (i < k.L)
        [[unroll]] for (uint s = 0u; s < 8u; ++s) a += row_share_at(8u * ab + s, i);
      if (i == CH - 1u)  // Gamma <dS, S0> + <K, X2g>
        [[unroll]] for (uint s = 0u; s < 8u; ++s) a += (ab == 0u ? gam_a : gam_b) * red[8u * ab + s] + extra_p[8u * ab + s];
    }
    const float dlogg = subgroupInclusiveAdd(a);
    if (lane < 16u && i < k.L) rec[head_row(k, i) * RW + 2u * D] = dlogg;
  }
}
