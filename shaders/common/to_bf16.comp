#version 460
// A float32 result stored into a bfloat16 boundary tensor, rounded to nearest even (bf16_bits,
// common.glsl): pc.n elements, one 4-byte word (two elements) per invocation.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Src { float src[]; };   // [n]
layout(set = 0, binding = 1) buffer Dst { uint dst[]; };             // [ceil(n/2)] bfloat16 pairs

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  const uint e = 2u * i;
  if (e >= pc.n) return;
  if (e + 1u < pc.n) {
    dst[i] = round_bf16x2(vec2(src[e], src[e + 1u]));
  } else {  // an odd count's last element: the word's upper half is not the tensor's, kept as it is
    atomicAnd(dst[i], 0xFFFF0000u);
    atomicOr(dst[i], bf16_bits(src[e]));
  }
}
