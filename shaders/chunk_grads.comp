#version 460
// Chunked backward, pass 3 of 3: one workgroup per (window b, v-head h, chunk c) turns the chunk's dU
// and end-state gradient dS (chunk_dstate) into the gradients of its inputs, all chunks in parallel.
// With the forms of chunk.glsl, S0 the chunk's start state (a checkpoint; zero for chunk 0):
//   dQ = diag(gamma) dO S0^T + M K,           M[i][j] = exp(lg_i - lg_j) <dO_i, u_j>  (j <= i)
//   dW = -dU S0^T,   Yv = T^T dU,   Yk = T^T dW,   dV = diag(beta) Yv
//   dT[i][j] = beta_j (<dU_i, v_j> + gamma_j <dW_i, k_j>),   dA = -T^T dT T^T  (strictly lower)
//   F = dA * exp(lg_i - lg_j),   E = diag(beta) F
//   dK = diag(Gamma / gamma) U dS^T + diag(beta gamma) Yk + M^T Q + (E + E^T) K
//   dbeta_i = <v_i, Yv_i> + gamma_i <k_i, Yk_i> + sum_j F_ij <k_i, k_j>
//   dlg_i  = <q_i, dQ_i> + <k_i, dK+_i - dK-_i>  (+ Gamma <dS, S0> + sum_j <k_j, dK~_j> at i = CH-1)
// where dK+ are the terms of dK whose factor grows with gamma_i (the W and E K terms) and dK- those
// that shrink (K~, M^T Q, E^T K), the diagonal of M left out of both (its terms cancel);
// d(log g_m) = sum_{i >= m} dlg_i. Leaves per (token, v-head) a record
// [dq^ (D), dk^ (D), d(log g), dbeta] for qk_bwd2 and dv in dy's v part.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8 .. 64

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) readonly buffer Y { float y[]; };          // [B, T, C]: v at 2*nk*D + h*D
layout(set = 0, binding = 4) readonly buffer Kv { float kv_in[]; };     // [B, T, nv*D] kv per step (tape)
layout(set = 0, binding = 5) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 6) readonly buffer Du { float du_in[]; };     // [B, T, nv*D] dU (chunk_dstate)
layout(set = 0, binding = 7) coherent buffer Wm { float dw[]; };        // [B, T, nv, D]: W in, dW written here
layout(set = 0, binding = 8) readonly buffer Tm { float t_in[]; };      // [B, T, nv, CH] (chunk_prep)
layout(set = 0, binding = 9) readonly buffer Ck { float ck[]; };        // [B, nv, slots, D cols, D rows] S0
layout(set = 0, binding = 10) readonly buffer Dsc { float dsc[]; };     // [B, nv, slots, D cols, D rows] dS
layout(set = 0, binding = 11) writeonly buffer Rec { float rec[]; };    // [B, T, nv][RW]
layout(set = 0, binding = 12) writeonly buffer Dy { float dy[]; };      // [B, T, C]: writes the v part

#include "chunk.glsl"

#define RW 258u   // record words: dq^ 0..127, dk^ 128..255, d(log g) 256, dbeta 257
#define RPT 16u   // rows per invocation: invocation (r, half) owns rows half*HR .. half*HR + HR-1 of column r
#define TILE 16u  // columns of dO, dU, U staged per round of the S0 / dS products
const uint HR = (CH + 1u) / 2u;
const uint NSR = D / SG;  // subgroups per row half

shared float sT[CH * CH], sG[CH * CH], sM[CH * CH], sF[CH * CH];  // [row i][column j]
shared float tile[3u * TILE * CH];  // [operand][column][row i]; later dT T^T
shared float red[2u * CH * NSR];    // per-row partial sums of dlg and dbeta
shared float red_extra[256u / 8u];
shared float dlg[CH];

float u_at(Chunk k, uint i, uint col) {  // u = beta (v - kv), as the forward made it
  const uint bt = k.b * pc.t + k.t0 + i;
  return bet[i] * (y[bt * pc.c_dim + 2u * pc.nk * D + k.h * D + col] - kv_in[(bt * pc.nv + k.h) * D + col]);
}
float v_at(Chunk k, uint i, uint col) { return y[(k.b * pc.t + k.t0 + i) * pc.c_dim + 2u * pc.nk * D + k.h * D + col]; }

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / nch;
  const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, wg % nch);
  const uint slots = max(nch, 2u) - 1u;
  const bool has_s0 = k.c > 0u, has_ds = k.c + 1u < nch;
  load_chunk_gates(k, tid);
  const float lgam = lg[CH - 1u];
  for (uint e = tid; e < CH * CH; e += 256u) sT[e] = e / CH < k.L ? t_in[head_row(k, e / CH) * CH + e % CH] : 0.0;

  const uint r = tid % D, half_ = tid / D;
  const uint i0 = half_ * HR;
  float dq[RPT], dk[RPT], dks[RPT];  // dks: dK+ - dK- (for dlg)
  float extra = 0.0;                 // this invocation's share of dlg at CH-1

  // ---- the products with S0 and dS: X1 = dO S0^T, dW = -dU S0^T, X2 = U dS^T ----
  {
    float x1[RPT], x2[RPT], w[RPT];
    [[unroll]] for (uint s = 0u; s < RPT; ++s) { x1[s] = 0.0; x2[s] = 0.0; w[s] = 0.0; }
    if (has_s0 || has_ds) {
      const uint s0_at = (bh * slots + k.c - 1u) * D * D, ds_at = (bh * slots + k.c) * D * D;
      for (uint c0 = 0u; c0 < D; c0 += TILE) {
        barrier();
        for (uint e = tid; e < 3u * TILE * CH; e += 256u) {
          const uint which = e / (TILE * CH), col = c0 + (e / CH) % TILE, i = e % CH;
          float x = 0.0;
          if (i < k.L) {
            if (which == 0u) x = do_in[head_row(k, i) * D + col];
            else if (which == 1u) x = du_in[head_row(k, i) * D + col];
            else x = u_at(k, i, col);
          }
          tile[e] = x;
        }
        barrier();
        for (uint cc = 0u; cc < TILE; ++cc) {
          const float s0 = has_s0 ? ck[s0_at + (c0 + cc) * D + r] : 0.0;
          const float sd = has_ds ? dsc[ds_at + (c0 + cc) * D + r] : 0.0;
          if (half_ == 0u) extra = fma(s0, sd, extra);
          [[unroll]] for (uint s = 0u; s < RPT; ++s) {
            if (s >= HR || i0 + s >= CH) break;
            x1[s] = fma(s0, tile[cc * CH + i0 + s], x1[s]);
            w[s] = fma(-s0, tile[(TILE + cc) * CH + i0 + s], w[s]);
            x2[s] = fma(sd, tile[(2u * TILE + cc) * CH + i0 + s], x2[s]);
          }
        }
      }
    }
    extra *= exp(lgam);  // Gamma <dS, S0>
    [[unroll]] for (uint s = 0u; s < RPT; ++s) {
      const uint i = i0 + s;
      dq[s] = 0.0; dk[s] = 0.0; dks[s] = 0.0;
      if (s >= HR || i >= k.L) continue;
      dq[s] = exp(lg[i]) * x1[s];
      const float kt = exp(lgam - lg[i]) * x2[s];  // dK~ term
      dk[s] = kt;
      dks[s] = -kt;
      extra = fma(k_at(k, i, r), kt, extra);
      dw[head_row(k, i) * D + r] = w[s];
    }
  }
  memoryBarrierBuffer();
  barrier();

  // ---- CH x CH: G = K K^T, M, dT ----
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float g = 0.0, m = 0.0, dt = 0.0;
    if (i < k.L && j < k.L) {
      float duv = 0.0, dwk = 0.0, dou = 0.0;
      const uint ri = head_row(k, i) * D;
      for (uint c = 0u; c < D; ++c) {
        const float kj = k_at(k, j, c);
        g = fma(k_at(k, i, c), kj, g);
        duv = fma(du_in[ri + c], v_at(k, j, c), duv);
        dwk = fma(dw[ri + c], kj, dwk);
        if (j <= i) dou = fma(do_in[ri + c], u_at(k, j, c), dou);
      }
      dt = bet[j] * (duv + exp(lg[j]) * dwk);
      if (j <= i) m = exp(lg[i] - lg[j]) * dou;
    }
    sG[e] = g;
    sM[e] = m;
    sF[e] = dt;  // dT for now
  }
  barrier();
  // ---- dA = -T^T dT T^T: first Z = dT T^T (into tile), then F = -(T^T Z) * decay, strictly lower ----
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float z = 0.0;
    for (uint m = 0u; m < CH; ++m) z = fma(sF[i * CH + m], sT[j * CH + m], z);
    tile[e] = z;
  }
  barrier();
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float f = 0.0;
    if (j < i && i < k.L) {
      for (uint m = 0u; m < CH; ++m) f = fma(sT[m * CH + i], tile[m * CH + j], f);
      f = -f * exp(lg[i] - lg[j]);
    }
    sF[e] = f;
  }
  barrier();

  // ---- CH x D: the rest of dQ, dK; Yv, Yk ----
  float yv[RPT], yk[RPT];
  [[unroll]] for (uint s = 0u; s < RPT; ++s) { yv[s] = 0.0; yk[s] = 0.0; }
  for (uint m = 0u; m < k.L; ++m) {
    const float km = k_at(k, m, r), qm = q_at(k, m, r);
    const float dum = du_in[head_row(k, m) * D + r], dwm = dw[head_row(k, m) * D + r];
    [[unroll]] for (uint s = 0u; s < RPT; ++s) {
      const uint i = i0 + s;
      if (s >= HR || i >= CH) break;
      if (m != i) {  // the diagonal's dlg terms cancel exactly: it is added after the row sums
        dq[s] = fma(sM[i * CH + m], km, dq[s]);
        const float mt = sM[m * CH + i] * qm;
        dk[s] += mt;
        dks[s] -= mt;
      }
      const float e1 = bet[i] * sF[i * CH + m], e2 = bet[m] * sF[m * CH + i];
      dk[s] = fma(e1 + e2, km, dk[s]);
      dks[s] = fma(e1 - e2, km, dks[s]);
      yv[s] = fma(sT[m * CH + i], dum, yv[s]);
      yk[s] = fma(sT[m * CH + i], dwm, yk[s]);
    }
  }
  // ---- outputs, and the row sums of dlg and dbeta ----
  [[unroll]] for (uint s = 0u; s < RPT; ++s) {
    const uint i = i0 + s;
    if (s >= HR) break;
    float ra = 0.0, rb = 0.0;
    if (i < k.L) {
      const float ki = k_at(k, i, r), gi = exp(lg[i]);
      const float kw = bet[i] * gi * yk[s];
      dk[s] += kw;
      dks[s] += kw;
      const float qi = q_at(k, i, r), mii = sM[i * CH + i];
      ra = qi * dq[s] + ki * dks[s];
      rb = v_at(k, i, r) * yv[s] + gi * ki * yk[s];
      const uint row = head_row(k, i);
      rec[row * RW + r] = fma(mii, ki, dq[s]);
      rec[row * RW + D + r] = fma(mii, qi, dk[s]);
      const uint bt = k.b * pc.t + k.t0 + i;
      dy[bt * pc.c_dim + 2u * pc.nk * D + k.h * D + r] = bet[i] * yv[s];
    }
    ra = subgroupAdd(ra);
    rb = subgroupAdd(rb);
    if (subgroupElect() && i < CH) {
      red[i * NSR + r / SG] = ra;
      red[(CH + i) * NSR + r / SG] = rb;
    }
  }
  extra = subgroupAdd(extra);
  if (subgroupElect()) red_extra[gl_SubgroupID] = extra;
  barrier();
  if (tid < CH) {
    float x = 0.0;
    if (tid < k.L)
      for (uint p = 0u; p < NSR; ++p) x += red[tid * NSR + p];
    if (tid == CH - 1u)
      for (uint p = 0u; p < gl_NumSubgroups; ++p) x += red_extra[p];
    dlg[tid] = x;
  }
  barrier();
  if (tid < k.L) {
    const uint i = tid;
    float dlogg = 0.0;
    for (uint m = i; m < CH; ++m) dlogg += dlg[m];
    float db = 0.0;
    for (uint p = 0u; p < NSR; ++p) db += red[(CH + i) * NSR + p];
    for (uint j = 0u; j < i; ++j) db = fma(sF[i * CH + j], sG[i * CH + j], db);
    const uint row = head_row(k, i);
    rec[row * RW + 2u * D] = dlogg;
    rec[row * RW + 2u * D + 1u] = db;
  }
}
