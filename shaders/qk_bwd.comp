#version 460
// q/k backward: one workgroup of D threads per (b, t, k-head). Sums the per-v-head dq^/dk^ of the
// rep value heads that read this key head, then the l2-norm backward into dy's q and k parts:
//   dq = dq^/n - q <dq^, q> / (n |q|^2_eps)  with n = sqrt(sum q^2 + 1e-6) (* sqrt(D) for q).
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };     // [B, T, C] conv + silu output
layout(set = 0, binding = 1) readonly buffer Nq { float nq[]; };   // [2][B, T, nk]
layout(set = 0, binding = 2) readonly buffer Dqk { float dqk[]; }; // [2][B, T, nv, D] per-v-head dq^, dk^
layout(set = 0, binding = 3) buffer Dy { float dy[]; };            // [B, T, C]: writes the q and k parts

shared float red[2 * D];

void main() {
  const uint idx = linear_group();  // (b*T + t)*nk + key head
  if (idx >= pc.nb * pc.t * pc.nk) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint ko = idx % pc.nk;
  const uint bt = idx / pc.nk;
  const uint n_bt = pc.nb * pc.t;
  const uint rep = pc.nv / pc.nk;
  float dq = 0.0, dk = 0.0;
  for (uint r = 0u; r < rep; ++r) {
    const uint h = ko * rep + r;
    dq += dqk[(bt * pc.nv + h) * D + tid];
    dk += dqk[((n_bt + bt) * pc.nv + h) * D + tid];
  }
  const float q = y[bt * pc.c_dim + ko * D + tid];
  const float k = y[bt * pc.c_dim + pc.nk * D + ko * D + tid];
  red[tid] = dq * q;
  red[D + tid] = dk * k;
  barrier();
  for (uint s = D / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      red[tid] += red[tid + s];
      red[D + tid] += red[D + tid + s];
    }
    barrier();
  }
  const uint n = pc.nb * pc.t * pc.nk;
  const float nq2 = nq[idx];
  const float nk2 = nq[n + idx];
  const float invq = 1.0 / (sqrt(nq2) * sqrt(float(D)));
  const float invk = 1.0 / sqrt(nk2);
  dy[bt * pc.c_dim + ko * D + tid] = invq * dq - q * red[0] * invq / nq2;
  dy[bt * pc.c_dim + pc.nk * D + ko * D + tid] = invk * dk - k * red[D] * invk / nk2;
}
