#version 460
// Depthwise causal conv + SiLU over time: one thread per (b, t, c).
//   y[b,t,c] = silu(sum_j conv[c,j] * qkv[b, t-(K-1)+j, c]), zero before the window.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkv { float qkv[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };       // [B, T, C] conv + silu

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  if (i >= pc.nb * pc.t * pc.c_dim) return;
  const uint c = i % pc.c_dim;
  const uint bt = i / pc.c_dim;
  const uint ti = bt % pc.t;
  const uint row0 = bt - ti;  // (b, 0)
  float acc = 0.0;
  for (uint j = 0u; j < pc.kk; ++j) {
    const int pos = int(ti) - int(pc.kk - 1u) + int(j);
    if (pos >= 0) acc += qkv[(row0 + uint(pos)) * pc.c_dim + c] * conv[c * pc.kk + j];
  }
  y[i] = silu(acc);
}
