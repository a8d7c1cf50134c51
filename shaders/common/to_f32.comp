#version 460
// A bfloat16 boundary tensor widened to float32 (exact): pc.n elements, one 4-byte word (two
// elements, the first in the low half) per invocation.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };      // [ceil(n/2)] bfloat16 pairs
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };    // [n]

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  const uint e = 2u * i;
  if (e >= pc.n) return;
  const vec2 x = widen_bf16x2(src[i]);
  dst[e] = x.x;
  if (e + 1u < pc.n) dst[e + 1u] = x.y;
}
