#version 460
// Chunked backward, pass 2 of 3: the only serial pass. One workgroup per (window b, v-head h, block
// of 32 state columns) walks the chunks in reverse with dS (the gradient of the chunk's end state;
// zero after the window) in shared memory. Columns are independent here, as in the forward. Per chunk
// (chunk.glsl for T, W, P, lg):
//   dU = P^T dO + K~ dS                           the gradient of the chunk's u rows
//   dS <- Gamma dS + Q^T diag(gamma) dO - W^T dU   the gradient of its start state
// dU and the chunk's dS (before the update) leave for chunk_grads, which does the rest in parallel.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) readonly buffer Wm { float w_in[]; };      // [B, T, nv, D]  (chunk_prep)
layout(set = 0, binding = 4) readonly buffer Pm { float p_in[]; };      // [B, T, nv, CH] (chunk_prep)
layout(set = 0, binding = 5) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 6) writeonly buffer Du { float du_out[]; };   // [B, T, nv*D] dU
layout(set = 0, binding = 7) writeonly buffer Dsc { float dsc[]; };     // [B, nv, max(nch-1,1), D cols, D rows]

#include "chunk.glsl"

#define COLS 32u  // state columns per workgroup
#define NWG 4u    // workgroups per (window, head)
#define DSP (D + 1u)  // padded column stride of ds: both passes below read it without bank conflicts

shared float ds[COLS * DSP];                       // dS [column j][row r]
shared vec4 sdo[CH * COLS / 4u], sdu[CH * COLS / 4u];  // dO, dU [token i][column j / 4]
shared float sp[CH * CH];                          // P [i][j]

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint slots = max(nch, 2u) - 1u;
  for (uint e = tid; e < COLS * DSP; e += 256u) ds[e] = 0.0;

  for (uint cc = 0u; cc < nch; ++cc) {
    const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u - cc);
    barrier();  // the previous chunk's readers of lg, sdo, sdu, sp are done
    load_chunk_gates(k, tid);
    for (uint e = tid; e < CH * COLS; e += 256u) {
      const uint i = e / COLS;
      sdo[e / 4u][e % 4u] = i < k.L ? do_in[head_row(k, i) * D + blk * COLS + e % COLS] : 0.0;
    }
    for (uint e = tid; e < CH * CH; e += 256u) {
      const uint i = e / CH;
      sp[e] = i < k.L ? p_in[head_row(k, i) * CH + e % CH] : 0.0;
    }
    barrier();
    const float lgam = lg[CH - 1u];

    // dU[i][j] = sum_{m >= i} P[m][i] dO[m][j] + (Gamma / gamma_i) <k_i, dS[:, j]>
    {
      const uint j = tid % COLS, ig = tid / COLS;  // 8 row groups: rows ig, ig + 8, ig + 16, ig + 24
      float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
      const uint k4 = ((pc.nb * pc.t + k.b * pc.t + k.t0) * pc.nk + k.ko) * (D / 4u);  // k^ of token t0, as vec4
      for (uint r4 = 0u; r4 < D / 4u; ++r4) {
        const vec4 d = vec4(ds[j * DSP + 4u * r4], ds[j * DSP + 4u * r4 + 1u], ds[j * DSP + 4u * r4 + 2u],
                            ds[j * DSP + 4u * r4 + 3u]);
        [[unroll]] for (uint s = 0u; s < 4u; ++s) {
          const uint i = ig + 8u * s;
          if (i < k.L) acc[s] += dot(qkn4[k4 + i * pc.nk * (D / 4u) + r4], d);
        }
      }
      [[unroll]] for (uint s = 0u; s < 4u; ++s) {
        const uint i = ig + 8u * s;
        if (i >= CH) break;
        float du = exp(lgam - lg[i]) * acc[s];
        for (uint m = i; m < k.L; ++m) du = fma(sp[m * CH + i], sdo[(m * COLS + j) / 4u][j % 4u], du);
        if (i >= k.L) du = 0.0;
        sdu[(i * COLS + j) / 4u][j % 4u] = du;
        if (i < k.L) du_out[head_row(k, i) * D + blk * COLS + j] = du;
      }
    }
    // The chunk's end-state gradient, for chunk_grads (the last chunk's is zero: not stored).
    if (k.c + 1u < nch)
      for (uint e = tid; e < COLS * D; e += 256u) {
        const uint j = e / D, r = e % D;
        dsc[((bh * slots + k.c) * D + blk * COLS + j) * D + r] = ds[j * DSP + r];
      }
    barrier();

    // dS[r][j] <- Gamma dS[r][j] + sum_i gamma_i q_i[r] dO[i][j] - sum_i W[i][r] dU[i][j]
    {
      const uint r = tid % D, jg = tid / D;  // 2 groups of 16 columns
      const float gam = exp(lgam);
      float acc[16];
      [[unroll]] for (uint jj = 0u; jj < 16u; ++jj) acc[jj] = gam * ds[(jg * 16u + jj) * DSP + r];
      for (uint i = 0u; i < k.L; ++i) {
        const float qv = exp(lg[i]) * q_at(k, i, r);
        const float wv = w_in[head_row(k, i) * D + r];
        [[unroll]] for (uint j4 = 0u; j4 < 4u; ++j4) {
          const uint at = (i * COLS + jg * 16u) / 4u + j4;
          const vec4 a = sdo[at], b = sdu[at];
          [[unroll]] for (uint l = 0u; l < 4u; ++l) acc[4u * j4 + l] = fma(qv, a[l], fma(-wv, b[l], acc[4u * j4 + l]));
        }
      }
      [[unroll]] for (uint jj = 0u; jj < 16u; ++jj) ds[(jg * 16u + jj) * DSP + r] = acc[jj];
    }
  }
}
