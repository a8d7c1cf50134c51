#version 460
// Chunked backward, pass 1 of 3: one workgroup per (window b, v-head h, chunk c) builds the chunk's
// intra-chunk operators (chunk.glsl): T = (I + A)^-1, W = T diag(beta gamma) K and P.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) writeonly buffer Wm { float w_out[]; };    // [B, T, nv, D]  rows of W
layout(set = 0, binding = 4) writeonly buffer Tm { float t_out[]; };    // [B, T, nv, CH] rows of T
layout(set = 0, binding = 5) writeonly buffer Pm { float p_out[]; };    // [B, T, nv, CH] rows of P

#include "chunk.glsl"

shared float sa[CH * CH], st[CH * CH];  // A, T: [row i][column j]

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const Chunk k = chunk_of(wg / nch / pc.nv, (wg / nch) % pc.nv, wg % nch);
  load_chunk_gates(k, tid);

  // A and P: one dot product of D per (i, j), j <= i.
  for (uint e = tid; e < CH * CH; e += 256u) {
    const uint i = e / CH, j = e % CH;
    float a = 0.0, p = 0.0;
    if (j <= i && i < k.L) {
      float kk = 0.0, qk = 0.0;
      for (uint r = 0u; r < D; ++r) {
        const float kj = k_at(k, j, r);
        kk = fma(k_at(k, i, r), kj, kk);
        qk = fma(q_at(k, i, r), kj, qk);
      }
      const float decay = exp(lg[i] - lg[j]);
      if (j < i) a = bet[i] * decay * kk;
      p = decay * qk;
    }
    sa[e] = a;
    if (i < k.L) p_out[head_row(k, i) * CH + j] = p;
  }
  barrier();
  // T row by row (forward substitution): T[i][m] = [i == m] - sum_{m <= j < i} A[i][j] T[j][m].
  for (uint i = 0u; i < CH; ++i) {
    if (tid < CH) {
      const uint m = tid;
      float x = i == m ? 1.0 : 0.0;
      for (uint j = m; j < i; ++j) x = fma(-sa[i * CH + j], st[j * CH + m], x);
      st[i * CH + m] = x;
    }
    barrier();
  }
  for (uint e = tid; e < CH * CH; e += 256u)
    if (e / CH < k.L) t_out[head_row(k, e / CH) * CH + e % CH] = st[e];
  // W[i][r] = sum_{j <= i} T[i][j] beta_j gamma_j k_j[r]
  for (uint e = tid; e < CH * D; e += 256u) {
    const uint i = e / D, r = e % D;
    if (i >= k.L) continue;
    float w = 0.0;
    for (uint j = 0u; j <= i; ++j) w = fma(st[i * CH + j] * bet[j] * exp(lg[j]), k_at(k, j, r), w);
    w_out[head_row(k, i) * D + r] = w;
  }
}
