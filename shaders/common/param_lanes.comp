#version 460
// The parameters' gradients of a packed call whose sequences ran in lanes side by side: each lane's
// param_sum outputs (its sequences' sums, added in its order) added over the lanes in order, so two
// runs give bitwise the same sums.
//   sums: [lanes][stride], a lane's dconv [C*K] at 0, dnorm [D], ddt_bias [nv] and da_log [nv] each
//   from the next multiple of 64 floats (the host's ParamSumLayout, layer_parts.cpp); lanes = pc.nb.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Sums { float sums[]; };
layout(set = 0, binding = 1) writeonly buffer Dconv { float dconv[]; };     // [C, K]
layout(set = 0, binding = 2) writeonly buffer Dnorm { float dnorm[]; };     // [D]
layout(set = 0, binding = 3) writeonly buffer DdtBias { float ddt_bias[]; };  // [nv]
layout(set = 0, binding = 4) writeonly buffer DaLog { float da_log[]; };    // [nv]

uint align64(uint n) { return (n + 63u) & ~63u; }

void main() {
  const uint ck = pc.c_dim * pc.kk, o_norm = align64(ck), o_dt = o_norm + align64(D), o_alog = o_dt + align64(pc.nv);
  const uint stride = o_alog + align64(pc.nv);
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  if (i >= ck + D + 2u * pc.nv) return;
  // output i: its section and the element's place in a lane's sums
  const uint at = i < ck ? i : i < ck + D ? o_norm + (i - ck) : i < ck + D + pc.nv ? o_dt + (i - ck - D) : o_alog + (i - ck - D - pc.nv);
  float s = 0.0;
  for (uint l = 0u; l < pc.nb; ++l) s += sums[l * stride + at];
  if (i < ck) dconv[i] = s;
  else if (i < ck + D) dnorm[i - ck] = s;
  else if (i < ck + D + pc.nv) ddt_bias[i - ck - D] = s;
  else da_log[i - ck - D - pc.nv] = s;
}
