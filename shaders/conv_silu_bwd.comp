#version 460
// Backward through the SiLU of the conv, in place: dy[b,t,c] *= silu'(pre[b,t,c]), with the
// pre-activation pre = sum_j conv[c,j] * qkv[b, t-(K-1)+j, c] recomputed. One thread per (b, t, c).
// conv_bwd then needs only dy: each pre-activation is recomputed once, not once per tap.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkv { float qkv[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) buffer Dy { float dy[]; };               // [B, T, C]: grad of y in, of pre out

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  if (i >= pc.nb * pc.t * pc.c_dim) return;
  const uint c = i % pc.c_dim;
  const uint bt = i / pc.c_dim;
  const uint ti = bt % pc.t;
  const uint row0 = bt - ti;  // (b, 0)
  float pre = 0.0;
  for (uint j = 0u; j < pc.kk; ++j) {
    const int pos = int(ti) - int(pc.kk - 1u) + int(j);
    if (pos >= 0) pre += qkv[(row0 + uint(pos)) * pc.c_dim + c] * conv[c * pc.kk + j];
  }
  dy[i] *= silu_bwd(pre);
}
