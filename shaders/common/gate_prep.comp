#version 460
// Gates: one thread per (b, t, v-head).
//   g = exp(-exp(a_log[h]) * softplus(a + dt_bias[h])),  beta = sigmoid(b)
// a and b float32, or bfloat16 (Push::flags BF16_A, BF16_B).
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer A { float a[]; };           // [B, T, nv]
layout(set = 0, binding = 0) readonly buffer A2 { uint a_h[]; };         // the same, bfloat16 pairs (BF16_A)
layout(set = 0, binding = 1) readonly buffer Bw { float b[]; };          // [B, T, nv]
layout(set = 0, binding = 1) readonly buffer Bw2 { uint b_h[]; };        // the same, bfloat16 pairs (BF16_B)
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };    // [nv]
layout(set = 0, binding = 3) readonly buffer DtBias { float dt_bias[]; };// [nv]
layout(set = 0, binding = 4) writeonly buffer Gates { float gates[]; };  // [3][B, T, nv]: g, beta, a + dt_bias

void main() {
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  const uint n = pc.nb * pc.t * pc.nv;
  if (i >= n) return;
  const uint h = i % pc.nv;
  const float av = STREAM_AT(has(BF16_A), a_h, a, i);
  const float bv = STREAM_AT(has(BF16_B), b_h, b, i);
  const Gate x = make_gate(av, bv, a_log[h], dt_bias[h]);
  gates[i] = x.g;
  gates[n + i] = x.beta;
  gates[2u * n + i] = x.arg;
}
