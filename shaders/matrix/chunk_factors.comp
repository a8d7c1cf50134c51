#version 460
// The matrix units' backward, between chunk_dstate_mma and chunk_pair_bwd_mma: each chunk's 16 x 16
// matrices, from the pair dots chunk_dstate_mma summed over the value dims (the sum of its SPLIT
// workgroups' shares, mma.glsl), and from them the right
// factors of chunk_pair_bwd_mma's phase 2 products, so that the pair pass makes its [CH x D]
// results with no step between its barriers' worth of 16 x 16 work (chunk.glsl's forms, CH = 16):
//   M = decay o <dO_i, u_j>   (j <= i)          Z = T^T dT = [beta_j <Yv_i, x_j>]
//   dA = -Z T^T,   F = dA o decay   (j < i)     (decay_ij = exp(lg_i - lg_j))
// and the factors [m][i], as fp16 pairs (mma.glsl) ready for the matrix units' loads:
//   diag(beta gamma),  M^T,  M,  E1 = [beta_i F_im],  E2 = [beta_m F_mi]
// It also writes each row's dbeta into its record: sum_j F_ij G_ij (G = K K^T, chunk_prep_fwd's
// tape) plus sum_c X o Yv (the pair dot <Yv_i, x_i>).
// The factors but diag(beta gamma) leave scaled by powers of two of the head's exponents (mma.glsl),
// as chunk_pair_bwd_mma's products take them: M^T and M by 2^(ev + eo) (M is <dO, u>), E1 and E2 by
// 2^(ev + eu) (F is <Yv, x> times T). M^T and M leave without their diagonal, which goes to mdiag
// in fp32 (its true value): its terms cancel in d(log g) (chunk_pair_bwd_mma adds them to dq^ and dk^ only), and with
// no decay in them they would leave their rounding where a strong decay makes d(log g) tiny.
// One workgroup of 256 per (window b, v-head h, chunk c); invocation (i, j) = (tid / 16, tid % 16).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 256) in;  // subgroups of 32 (the host requires exactly 32): a row is 16 lanes of one

layout(set = 0, binding = 0) readonly buffer Gates { float gates[]; };   // [3][B, T, nv]: beta at [1]
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };       // [2][B, T, nv] lg hi, lo (the forward's)
layout(set = 0, binding = 2) readonly buffer Tm { float t_in[]; };       // [B, T, nv, CH] T (the forward's)
layout(set = 0, binding = 3) readonly buffer Gm { float g_in[]; };       // [B, nk, nch, CH, CH] G = K K^T (chunk_prep_fwd)
layout(set = 0, binding = 4) readonly buffer Pdots { float pdots[]; };   // [B, nv, nch][SPLIT][2][16][16] <dO_i, u_j>, <Yv_i, x_j>
layout(set = 0, binding = 5) writeonly buffer Fac { uvec2 fac[]; };      // [B, nv, nch][NCF][hi, lo][16 m][4] factors
layout(set = 0, binding = 6) writeonly buffer Rec { float rec[]; };      // [B, T, nv][RW] records: writes dbeta
layout(set = 0, binding = 7) readonly buffer Vscale { float vscale[]; };  // [2][B, nv][SPLIT] ev, es (chunk_fwd_mma)
layout(set = 0, binding = 8) readonly buffer Dscale { float dscale[]; };  // [3][B, nv][SPLIT] eo, ed, eu (chunk_dstate_mma)
layout(set = 0, binding = 9) writeonly buffer Mdiag { float mdiag[]; };   // [B, nv, nch][16] M_ii

#define CHUNK_NO_QKN
#include "chunk.glsl"
#include "chunk_factors.glsl"

shared float zs[256], ts[256], ms[256], fs[256];  // Z, T, M, F [i][j]

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex, i = tid / 16u, j = tid % 16u;
  const uint bh = wg / nch, b = bh / pc.nv, h = bh % pc.nv;
  const Chunk k = chunk_of(b, h, wg % nch);
  const bool live = i < k.L && j < k.L;
  const vec2 lg_i = chunk_lg(k, i), lg_j = chunk_lg(k, j);
  const float decay = exp(lg_diff(lg_i.x, lg_i.y, lg_j.x, lg_j.y));  // (used where j <= i)
  const float be_j = chunk_beta(k, j);
  float m = 0.0, yx = 0.0, g = 0.0;  // yx: <Yv_i, x_j>
  if (live) {
    float ou = 0.0;
    [[unroll]] for (uint s = 0u; s < SPLIT; ++s) {
      const uint at = (wg * SPLIT + s) * 512u + tid;
      ou += pdots[at];
      yx += pdots[at + 256u];
    }
    if (j <= i) m = decay * ou;
    g = g_in[((b * pc.nk + k.ko) * nch + k.c) * 256u + tid];
  }
  const uint nbv = pc.nb * pc.nv;
  const float ev = HEAD_EXPONENT(vscale, bh);
  const int e_m = int(ev + HEAD_EXPONENT(dscale, bh)), e_f = int(ev + HEAD_EXPONENT(dscale, 2u * nbv + bh));
  if (i == j) mdiag[wg * 16u + i] = m;
  const float z = be_j * yx;
  ms[tid] = m;
  zs[tid] = z;
  ts[tid] = i < k.L ? t_in[head_row(k, i) * CH + j] : 0.0;
  if (i == 0u) {  // chunk.glsl's: beta and lg of the chunk's rows
    bet[j] = be_j;
    lg[j] = lg_j.x;
    lgl[j] = lg_j.y;
  }
  barrier();

  float nda = 0.0;  // -dA = Z T^T
  [[unroll]] for (uint n = 0u; n < 16u; ++n) nda = fma(zs[i * 16u + n], ts[j * 16u + n], nda);
  const float f = j < i && i < k.L ? -nda * decay : 0.0;
  fs[tid] = f;

  // dbeta_i = sum_j F_ij G_ij + sum_c X o Yv (= <Yv_i, x_i>): row i is lanes 16 (i % 2) .. of a subgroup
  float db = f * g + (i == j ? yx : 0.0);
  db += subgroupShuffleXor(db, 1u);
  db += subgroupShuffleXor(db, 2u);
  db += subgroupShuffleXor(db, 4u);
  db += subgroupShuffleXor(db, 8u);
  if (j == 0u && i < k.L) rec[head_row(k, i) * RW + 2u * D + 1u] = db;
  barrier();

  // The factors, item n: factor n / 64, row m = (n / 4) % 16, columns 4 q .. 4 q + 3 (q = n % 4).
  for (uint n = tid; n < NCF * 64u; n += 256u) {
    const uint c = n / 64u, r = (n / 4u) % 16u, q = n % 4u;
    vec4 x;
    [[unroll]] for (uint l = 0u; l < 4u; ++l) {
      const uint col = 4u * q + l;
      if (c == CF_BG) x[l] = r == col ? bet[col] * exp(lg_of(col)) : 0.0;
      else if (c == CF_MT) x[l] = r == col ? 0.0 : ms[col * 16u + r];
      else if (c == CF_M) x[l] = r == col ? 0.0 : ms[r * 16u + col];
      else if (c == CF_E1) x[l] = bet[col] * fs[col * 16u + r];
      else x[l] = bet[r] * fs[r * 16u + col];
    }
    if (c == CF_MT || c == CF_M) x *= pow2(e_m);
    else if (c != CF_BG) x *= pow2(e_f);
    const uint at = factor_at(wg, c, r) + q;
    PUT_SPLIT4_RIGHT_TO(fac[at], fac[at + 64u], x)  // hi, lo: 64 uvec2s apart (chunk_factors.glsl)
  }
}
