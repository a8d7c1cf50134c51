#version 460
// Chunked backward, pass 4 of 4: one workgroup per (window b, v-head h, chunk c) turns the chunk's dU
// (chunk_dstate) and its products over the value and key dims (chunk_values: X1, dW, X2, the pair
// dots <dO_i, u_j>, <dU_i, v_j>, <dW_i, k_j> and Gamma <dS, S0>; chunk_prep: G = <k_i, k_j>) into
// the gradients of its inputs, all chunks in parallel.
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
// The matrix units' path runs chunk_pair_bwd_mma.comp (phase 2) in its place.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8 .. 64

#include "chunk_grads.glsl"
// Rows i of the chunk padded to CHP (a multiple of 8): invocation (r, half) owns rows
// half*HR .. half*HR + HR-1 of column r (HR a multiple of 4: vec4 reads of the [m][i] matrices), and
// invocation (pi, pj) = (tid / 16, tid % 16) the 2 x 2 block of (i, j) pairs (2 pi .. 2 pi + 1, 2 pj ..).
const uint CHP = (CH + 7u) / 8u * 8u;
const uint HR = CHP / 2u;
const uint HR4 = HR / 4u;
const uint NSR = D / SG;  // subgroups per row half

float v_at(Chunk k, uint i, uint col) { return y[y_at(k.b * pc.t + k.t0 + i, k.h) + col]; }

// CH x CHP matrices, [m][i] (i contiguous, rows of CHP floats). Roles change as the pass goes on:
shared vec4 mT[CH * CHP / 4u];   // T[m][i]
shared vec4 mA[CH * CHP / 4u];   // M[i][j] (j <= i), diagonal then removed: M[m][i] in the last phase
shared vec4 mB[CH * CHP / 4u];   // G = K K^T; then Mt[m][i] = M[i][m]
shared vec4 mC[CH * CHP / 4u];   // dT; then F = dA * decay
shared vec4 mD[CH * CHP / 4u];   // Ep[m][i] = beta_i F[i][m] + beta_m F[m][i]
shared vec4 mE[CH * CHP / 4u];   // Z = dT T^T; then Em[m][i] = beta_i F[i][m] - beta_m F[m][i]
shared float mdiag[CH], dbeta_a[CH], dlg[CH];
shared float ra_acc[CH * NSR], rb_acc[CH * NSR];  // row partials of dlg, dbeta: [row i][subgroup of its half]

// Adds x, summed over the subgroup (a share of row i's columns), to row i's partial in acc. Every
// invocation calls it; the elected lane is the same each time, so one invocation owns each slot.
#define ROW_ADD(acc, i, x)                                         \
  {                                                                \
    const float t_ = subgroupAdd(x);                               \
    if (subgroupElect() && (i) < CH) acc[(i) * NSR + r / SG] += t_; \
  }
shared float red_extra[256u / 8u];

#define AT(m, i) ((m) * CHP + (i))  // scalar index into a [m][i] matrix
// Scalar element `at` of one of the vec4 matrices above.
#define T_(at) mT[(at) / 4u][(at) % 4u]
#define A_(at) mA[(at) / 4u][(at) % 4u]
#define B_(at) mB[(at) / 4u][(at) % 4u]
#define C_(at) mC[(at) / 4u][(at) % 4u]
#define D_(at) mD[(at) / 4u][(at) % 4u]
#define E_(at) mE[(at) / 4u][(at) % 4u]

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / nch;
  const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, wg % nch);
  load_chunk_rows(k, tid);
  for (uint e = tid; e < CH * NSR; e += 256u) { ra_acc[e] = 0.0; rb_acc[e] = 0.0; }
  for (uint e = tid; e < CH * CHP; e += 256u) {
    const uint m = e / CHP, i = e % CHP;
    T_(e) = m < k.L && i < CH ? t_in[head_row(k, m) * CH + i] : 0.0;
  }

  const uint r = tid % D, half_ = tid / D;
  const uint i0 = half_ * HR;
  const uint pi = tid / 16u, pj = tid % 16u;  // the (i, j) pair block
  const bool pair_ok = pi < HR && pj < HR;    // 2 pi < CHP
  float extra = tid == 0u ? sdot[wg] : 0.0;  // this invocation's share of dlg at CH-1 (Gamma <dS, S0>)
  // chunk_values' pair dots <dU_i, v_j>, <dO_i, u_j>, <k_i, k_j>, <dW_i, k_j>: [i of the block][j of the block]
  vec2 duv[2], dou[2], gkk[2], dwk[2];

  barrier();  // ra_acc and rb_acc are zero
  // ---- chunk_values' products: the record starts with gamma_i X1 (dq^) and (Gamma / gamma_i) X2 ----
  [[unroll]] for (uint s = 0u; s < HR4; ++s)
    [[unroll]] for (uint l = 0u; l < 4u; ++l) {
      const uint i = i0 + 4u * s + l;
      float a = 0.0;
      if (i < k.L) {
        const uint row = head_row(k, i);
        const float ki = k_at(k, i, r), kt = rec[row * RW + D + r];  // kt: the dK~ term (in dK-)
        extra = fma(ki, kt, extra);
        // dQ's and dK's terms so far wait in the record (dK+ - dK- = -dK there); the last phase adds the rest.
        a = q_at(k, i, r) * rec[row * RW + r] - ki * kt;
      }
      ROW_ADD(ra_acc, i, a)
    }
  if (pair_ok)
    [[unroll]] for (uint a = 0u; a < 2u; ++a)
      [[unroll]] for (uint b2 = 0u; b2 < 2u; ++b2) {
        const uint i = min(2u * pi + a, CH - 1u), j = min(2u * pj + b2, CH - 1u);
        dou[a][b2] = pairs[(wg * 4u) * CH * CH + i * CH + j];
        duv[a][b2] = pairs[(wg * 4u + 1u) * CH * CH + i * CH + j];
        gkk[a][b2] = pairs[(wg * 4u + 2u) * CH * CH + i * CH + j];
        dwk[a][b2] = pairs[(wg * 4u + 3u) * CH * CH + i * CH + j];
      }

  // ---- the pairs: G (mB), M (mA), dT (mC), all [i][j] ----
  if (pair_ok)
    [[unroll]] for (uint a = 0u; a < 2u; ++a)
      [[unroll]] for (uint b2 = 0u; b2 < 2u; ++b2) {
        const uint i = 2u * pi + a, j = 2u * pj + b2;
        if (i >= CH) continue;
        float g = 0.0, m = 0.0, dt = 0.0;
        if (i < k.L && j < k.L) {
          g = gkk[a][b2];
          dt = bet[j] * (duv[a][b2] + exp(lg_of(j)) * dwk[a][b2]);
          if (j <= i) m = exp(lgd(i, j)) * dou[a][b2];
        }
        B_(AT(i, j)) = g;
        A_(AT(i, j)) = m;
        C_(AT(i, j)) = dt;
      }
  barrier();
  // ---- dA = -T^T dT T^T: Z = dT T^T (into mE), then F = -(T^T Z) * decay, strictly lower ----
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float z = 0.0;
    for (uint m = 0u; m < CH; ++m) z = fma(C_(AT(i, m)), T_(AT(j, m)), z);
    E_(AT(i, j)) = z;
  }
  barrier();
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float f = 0.0;
    if (j < i && i < k.L) {
      for (uint m = 0u; m < CH; ++m) f = fma(T_(AT(m, i)), E_(AT(m, j)), f);
      f = -f * exp(lgd(i, j));
    }
    C_(AT(i, j)) = f;
  }
  barrier();
  // ---- dbeta's A term; the coefficient matrices of the last phase, [m][i] ----
  if (tid < CH) {
    float x = 0.0;
    for (uint j = 0u; j < tid; ++j) x = fma(C_(AT(tid, j)), B_(AT(tid, j)), x);
    dbeta_a[tid] = x;
    mdiag[tid] = A_(AT(tid, tid));
  }
  barrier();
  for (uint e = tid; e < CH * CHP; e += 256u) {
    const uint m = e / CHP, i = e % CHP;
    float mt = 0.0, ep = 0.0, em = 0.0;
    if (i < CH && i != m) {
      mt = A_(AT(i, m));
      const float e1 = bet[i] * C_(AT(i, m)), e2 = bet[m] * C_(AT(m, i));
      ep = e1 + e2;
      em = e1 - e2;
    }
    B_(e) = mt;
    D_(e) = ep;
    E_(e) = em;
  }
  barrier();
  for (uint m = tid; m < CH; m += 256u) A_(AT(m, m)) = 0.0;  // the diagonal of M goes in after the row sums
  barrier();

  // ---- over the chunk's rows m: Yv = T^T dU, Yk = T^T dW; dv and dbeta's row terms ----
  {
    vec4 yv[HR4], yk[HR4];
    [[unroll]] for (uint s = 0u; s < HR4; ++s) { yv[s] = vec4(0.0); yk[s] = vec4(0.0); }
    for (uint m0 = 0u; m0 < k.L; m0 += 4u) {  // four rows' loads in flight at once
      float dum[4], dwm[4];
      [[unroll]] for (uint mm = 0u; mm < 4u; ++mm) {
        const uint m = min(m0 + mm, k.L - 1u);
        dum[mm] = du_in[head_row(k, m) * D + r];
        dwm[mm] = dw[head_row(k, m) * D + r];
      }
      [[unroll]] for (uint mm = 0u; mm < 4u; ++mm) {
        const uint m = m0 + mm;
        if (m >= k.L) break;
        [[unroll]] for (uint s = 0u; s < HR4; ++s) {
          const vec4 t = mT[(m * CHP + i0) / 4u + s];
          yv[s] = fma(t, vec4(dum[mm]), yv[s]);
          yk[s] = fma(t, vec4(dwm[mm]), yk[s]);
        }
      }
    }
    [[unroll]] for (uint s = 0u; s < HR4; ++s)
      [[unroll]] for (uint l = 0u; l < 4u; ++l) {
        const uint i = i0 + 4u * s + l;
        float a = 0.0, b2 = 0.0;
        if (i < k.L) {
          const float ki = k_at(k, i, r), gi = exp(lg_of(i));
          const float kw = bet[i] * gi * yk[s][l];  // the W term of dK (in dK+)
          a = ki * kw;
          b2 = v_at(k, i, r) * yv[s][l] + gi * ki * yk[s][l];
          const uint row = head_row(k, i), bt = k.b * pc.t + k.t0 + i;
          rec[row * RW + D + r] += kw;
          dy[bt * pc.c_dim + 2u * pc.nk * D + k.h * D + r] = bet[i] * yv[s][l];
        }
        ROW_ADD(ra_acc, i, a)
        ROW_ADD(rb_acc, i, b2)
      }
  }
  // ---- over the chunk's rows m: the rest of dQ and dK (M, E terms) ----
  {
    vec4 dq[HR4], dk[HR4], dks[HR4];  // dks: dK+ - dK- (for dlg)
    [[unroll]] for (uint s = 0u; s < HR4; ++s) { dq[s] = vec4(0.0); dk[s] = vec4(0.0); dks[s] = vec4(0.0); }
    for (uint m0 = 0u; m0 < k.L; m0 += 4u) {  // four rows' loads in flight at once
      float km[4], qm[4];
      [[unroll]] for (uint mm = 0u; mm < 4u; ++mm) {
        const uint m = min(m0 + mm, k.L - 1u);
        km[mm] = k_at(k, m, r);
        qm[mm] = q_at(k, m, r);
      }
      [[unroll]] for (uint mm = 0u; mm < 4u; ++mm) {
        const uint m = m0 + mm;
        if (m >= k.L) break;
        [[unroll]] for (uint s = 0u; s < HR4; ++s) {
          const uint at = (m * CHP + i0) / 4u + s;
          const vec4 mr = mA[at], mt = mB[at], ep = mD[at], em = mE[at];
          dq[s] = fma(mt, vec4(km[mm]), dq[s]);
          dk[s] = fma(mr, vec4(qm[mm]), fma(ep, vec4(km[mm]), dk[s]));
          dks[s] = fma(-mr, vec4(qm[mm]), fma(em, vec4(km[mm]), dks[s]));
        }
      }
    }
    [[unroll]] for (uint s = 0u; s < HR4; ++s)
      [[unroll]] for (uint l = 0u; l < 4u; ++l) {
        const uint i = i0 + 4u * s + l;
        float a = 0.0;
        if (i < k.L) {
          const float ki = k_at(k, i, r), qi = q_at(k, i, r);
          a = qi * dq[s][l] + ki * dks[s][l];
          const uint row = head_row(k, i);
          rec[row * RW + r] += fma(mdiag[i], ki, dq[s][l]);
          rec[row * RW + D + r] += fma(mdiag[i], qi, dk[s][l]);
        }
        ROW_ADD(ra_acc, i, a)
      }
  }
  extra = subgroupAdd(extra);
  if (subgroupElect()) red_extra[gl_SubgroupID] = extra;
  barrier();
  if (tid < CH) {
    float x = 0.0;
    if (tid < k.L)
      for (uint p = 0u; p < NSR; ++p) x += ra_acc[tid * NSR + p];
    if (tid == CH - 1u)
      for (uint p = 0u; p < gl_NumSubgroups; ++p) x += red_extra[p];
    dlg[tid] = x;
  }
  barrier();
  if (tid < k.L) {
    const uint i = tid;
    float dlogg = 0.0;
    for (uint m = i; m < CH; ++m) dlogg += dlg[m];
    float db = dbeta_a[i];
    for (uint p = 0u; p < NSR; ++p) db += rb_acc[i * NSR + p];
    const uint row = head_row(k, i);
    rec[row * RW + 2u * D] = dlogg;
    rec[row * RW + 2u * D + 1u] = db;
  }
}
