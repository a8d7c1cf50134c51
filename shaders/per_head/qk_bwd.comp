#version 460
// q/k backward, per-head family: one workgroup of D threads per (b, t, k-head). Sums the per-v-head
// dq^/dk^ of the rep value heads that read this key head, then the l2-norm backward into dy's q and
// k parts.
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; }; // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Nq { float nq[]; };   // [2][B, T, nk]
layout(set = 0, binding = 2) readonly buffer Dqk { float dqk[]; }; // [2][B, T, nv, D] per-v-head dq^, dk^
layout(set = 0, binding = 3) buffer Dy { float dy[]; };            // [B, T, C]: writes the q and k parts

shared float red[2 * D];
#include "l2_bwd.glsl"

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
  // the l2-norm backward: <dq^, q^> and <dk^, k^> by a tree in red, then the element
  const uint n = pc.nb * pc.t * pc.nk;
  const float qh = qkn[idx * D + tid], kh = qkn[(n + idx) * D + tid];
  red[tid] = dq * qh;
  red[D + tid] = dk * kh;
  barrier();
  for (uint s = D / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      red[tid] += red[tid + s];
      red[D + tid] += red[D + tid + s];
    }
    barrier();
  }
  const vec2 raw = l2_backward(dq, dk, qh, kh, vec2(red[0], red[D]), vec2(nq[idx], nq[n + idx]));
  dy[bt * pc.c_dim + ko * D + tid] = raw.x;
  dy[bt * pc.c_dim + pc.nk * D + ko * D + tid] = raw.y;
}
