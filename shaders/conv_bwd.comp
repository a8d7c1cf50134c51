#version 460
// Backward of the depthwise causal conv into the raw projection: one thread per (b, t, c).
// Raw position t feeds the conv outputs t + (K-1) - j through tap j:
//   dqkv[b,t,c] = sum_j dpre[b, t+(K-1)-j, c] * conv[c,j]   (terms past the window's end are zero)
// dpre (the gradient of the pre-activation) comes from conv_silu_bwd.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 1) readonly buffer Dpre { float dpre[]; };  // [B, T, C]
layout(set = 0, binding = 2) writeonly buffer Dqkv { float dqkv[]; }; // [B, T, C]

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
    if (to < pc.t) acc += dpre[(row0 + to) * pc.c_dim + c] * conv[c * pc.kk + j];
  }
  dqkv[i] = acc;
}
