#version 460
// q/k l2 norms: one workgroup of D threads per (b, t, k-head).
//   q^ = q / (sqrt(sum q^2 + 1e-6) * sqrt(D)),  k^ = k / sqrt(sum k^2 + 1e-6)
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };       // [B, T, C] conv + silu output
layout(set = 0, binding = 1) writeonly buffer Qkn { float qkn[]; };  // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 2) writeonly buffer Nq { float nq[]; };    // [2][B, T, nk] sum q^2 + 1e-6, sum k^2 + 1e-6

shared float red[2 * D];

void main() {
  const uint idx = linear_group();  // (b*T + t)*nk + key head
  if (idx >= pc.nb * pc.t * pc.nk) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint ko = idx % pc.nk;
  const uint bt = idx / pc.nk;
  const float q = y[bt * pc.c_dim + ko * D + tid];
  const float k = y[bt * pc.c_dim + pc.nk * D + ko * D + tid];
  red[tid] = q * q;
  red[D + tid] = k * k;
  barrier();
  for (uint s = D / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      red[tid] += red[tid + s];
      red[D + tid] += red[D + tid + s];
    }
    barrier();
  }
  const float nq2 = red[0] + 1e-6;
  const float nk2 = red[D] + 1e-6;
  const uint n = pc.nb * pc.t * pc.nk;
  qkn[idx * D + tid] = q / (sqrt(nq2) * sqrt(float(D)));
  qkn[(n + idx) * D + tid] = k / sqrt(nk2);
  if (tid == 0u) {
    nq[idx] = nq2;
    nq[n + idx] = nk2;
  }
}
