#version 460
// Backward of conv + SiLU into the raw projection: one thread per (b, t, c).
// Raw position t feeds the conv outputs t + (K-1) - j through tap j.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkv { float qkv[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) readonly buffer Dy { float dy[]; };      // [B, T, C] grad of conv + silu output
layout(set = 0, binding = 3) writeonly buffer Dqkv { float dqkv[]; }; // [B, T, C]

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  if (i >= pc.nb * pc.t * pc.c_dim) return;
  const uint c = i % pc.c_dim;
  const uint bt = i / pc.c_dim;
  const uint ti = bt % pc.t;
  const uint row0 = bt - ti;
  float acc = 0.0;
  for (uint j = 0u; j < pc.kk; ++j) {
    const uint to = ti + (pc.kk - 1u) - j;
    if (to >= pc.t) continue;
    float pre = 0.0;  // the conv output at `to` before the SiLU, recomputed
    for (uint q = 0u; q < pc.kk; ++q) {
      const int pos = int(to) - int(pc.kk - 1u) + int(q);
      if (pos >= 0) pre += qkv[(row0 + uint(pos)) * pc.c_dim + c] * conv[c * pc.kk + q];
    }
    acc += dy[(row0 + to) * pc.c_dim + c] * silu_bwd(pre) * conv[c * pc.kk + j];
  }
  dqkv[i] = acc;
}
