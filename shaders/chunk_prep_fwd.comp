#version 460
// The matrix units' chunked forward, pass 1 of 2: every chunk's operators for chunk_fwd_mma, all
// chunks at once. One workgroup per (window b, key head, chunk c) makes them for each v-head h of
// the key head's group (the nv / nk v-heads that share its k^ and q^), from the head-independent
// pair dots, made once per group (chunk.glsl's forms):
//   G = K K^T,   H = Q K^T
//   A_h[i][j] = beta_i exp(lg_i - lg_j) G[i][j]  (j < i),   T_h = (I + A_h)^-1
//   P_h[i][j] = exp(lg_i - lg_j) H[i][j]  (j <= i)
// with lg and beta of head h. Stores T, P and lg. (W = T diag(beta gamma) K is not made: the matrix
// units' passes take its products as ones with diag(gamma) K and T diag(beta).)
// The per-head part runs HB heads at a time (the group of the 27B shape, 3, in one batch).
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };   // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) writeonly buffer Tm { float t_out[]; };    // [B, T, nv, CH] rows of T
layout(set = 0, binding = 4) writeonly buffer Lgc { float lgc[]; };     // [B, T, nv] lg (chunk.glsl)
layout(set = 0, binding = 5) writeonly buffer Pm { float p_out[]; };    // [B, T, nv, CH] rows of P

// The chunk's rows: CH = 16 (the matrix units' chunk; the host builds this pass for no other).
#define R 16u
#define HB 4u    // v-heads per batch of the per-head part
#define KP 33u   // row stride (vec4s) of the k^, q^ stage: 528 bytes, so rows fall in distinct banks
shared vec4 ks[R * KP], qs[R * KP];  // k^, q^ of the chunk: [row i][element r / 4]
shared float gram[R * R], hqk[R * R];  // G, H: [i][j]
shared float lgs[HB * R], bets[HB * R];  // the batch's lg (after the scan) and beta: [head][row]
shared float sa[HB * R * R];  // A_h [head][i][j]

void main() {
  const uint nch = (pc.t + R - 1u) / R;
  const uint wg = linear_group();  // (b*nk + ko)*nch + c
  if (wg >= pc.nb * pc.nk * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint b = wg / nch / pc.nk, ko = (wg / nch) % pc.nk, c = wg % nch;
  const uint t0 = c * R, L = min(R, pc.t - t0), group = pc.nv / pc.nk;
  const uint bt0 = b * pc.t + t0;  // row of the chunk's first token in [B, T, ...] tensors

  // Stage k^ and q^: 2 x 16 rows of 32 vec4, four vec4 per invocation (vec4 e: k^ for e < 512).
  [[unroll]] for (uint q = 0u; q < 4u; ++q) {
    const uint e = tid + 256u * q, is_k = e < R * 32u ? 1u : 0u, i = (e / 32u) % R, r4 = e % 32u;
    const uint row = is_k * pc.nb * pc.t + bt0 + i;  // in qkn's [2][B, T] rows (q^ first)
    const vec4 x = i < L ? qkn4[(row * pc.nk + ko) * (D / 4u) + r4] : vec4(0.0);
    if (is_k != 0u) ks[i * KP + r4] = x; else qs[i * KP + r4] = x;
  }
  barrier();
  {  // G and H: invocation (i, j) makes both elements (i, j)
    const uint i = tid / R, j = tid % R;
    vec4 g4 = vec4(0.0), h4 = vec4(0.0);
    for (uint r4 = 0u; r4 < 32u; ++r4) {
      const vec4 kj = ks[j * KP + r4];
      g4 = fma(ks[i * KP + r4], kj, g4);
      h4 = fma(qs[i * KP + r4], kj, h4);
    }
    gram[tid] = g4.x + g4.y + g4.z + g4.w;
    hqk[tid] = h4.x + h4.y + h4.z + h4.w;
  }

  const uint n = pc.nb * pc.t * pc.nv;  // gates is [3][B, T, nv]
  for (uint h0 = 0u; h0 < group; h0 += HB) {
    const uint nh = min(HB, group - h0);
    const uint hfirst = ko * group + h0;  // the batch's first v-head
    barrier();  // the last batch's readers of lgs, bets, sa are done (and the first's G, H are in)
    if (tid < nh * R) {  // gates: invocation (head, row i); the padding rows get beta 0, log g 0
      const uint i = tid % R, h = hfirst + tid / R;
      float l = 0.0, be = 0.0;
      if (i < L) {
        const uint at = (bt0 + i) * pc.nv + h;
        be = gates[n + at];
        l = -exp(a_log[h]) * softplus(gates[2u * n + at]);  // log g, exactly as gate_prep's exponent
      }
      lgs[tid] = l;
      bets[tid] = be;
    }
    barrier();
    if (tid < nh) {  // the scan of each head's log g, serially
      float acc = 0.0;
      for (uint i = 0u; i < R; ++i) {
        acc += lgs[tid * R + i];
        lgs[tid * R + i] = acc;
      }
    }
    barrier();
    if (tid < nh * R && tid % R < L) lgc[(bt0 + tid % R) * pc.nv + hfirst + tid / R] = lgs[tid];
    // A_h and P_h: invocation (i, j) of each head
    for (uint hb = 0u; hb < nh; ++hb) {
      const uint i = tid / R, j = tid % R;
      const float decay = j <= i ? exp(lgs[hb * R + i] - lgs[hb * R + j]) : 0.0;
      sa[hb * R * R + tid] = j < i ? bets[hb * R + i] * decay * gram[tid] : 0.0;
      if (i < L) p_out[((bt0 + i) * pc.nv + hfirst + hb) * R + j] = decay * hqk[tid];
    }
    barrier();
    if (tid < nh * R) {
      // Column m of T_h by forward substitution, T[i][m] = [i == m] - sum_{j < i} A[i][j] T[j][m] (rows
      // above m come out zero), in registers: the column depends on nothing but itself.
      const uint hb = tid / R, m = tid % R, h = hfirst + hb;
      float x[R];
      [[unroll]] for (uint i = 0u; i < R; ++i) {
        float s = i == m ? 1.0 : 0.0;
        [[unroll]] for (uint j = 0u; j < i; ++j) s = fma(-sa[(hb * R + i) * R + j], x[j], s);
        x[i] = s;
      }
      [[unroll]] for (uint i = 0u; i < R; ++i)
        if (i < L) t_out[((bt0 + i) * pc.nv + h) * R + m] = x[i];
    }
  }
}
