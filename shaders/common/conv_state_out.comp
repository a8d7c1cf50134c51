#version 460
// The conv state out of each window: the last K-1 rows of [conv_state; the window's qkv rows], so
// conv_state's rows where the window has fewer than K-1 tokens (zero without one), qkv widened where
// it is bfloat16 (BF16_QKV). One invocation per element of [B, K-1, C].
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkv { float qkv[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 0) readonly buffer Qkv2 { uint qkv2[]; };   // the same, bfloat16 pairs (BF16_QKV)
layout(set = 0, binding = 1) readonly buffer ConvState { float conv_state[]; };  // [B, K-1, C] (STATE_CONV)
layout(set = 0, binding = 2) writeonly buffer StateOut { float state_out[]; };    // [B, K-1, C]

void main() {
  const uint C = pc.c_dim, K1 = pc.kk - 1u;
  const uint i = linear_group() * 256u + gl_LocalInvocationIndex;
  if (i >= pc.nb * K1 * C) return;
  const uint c = i % C, j = (i / C) % K1, b = i / (C * K1);
  // row T + j of the window's K-1 + T rows [conv_state; qkv]
  const uint r = pc.t + j;
  float v = 0.0;
  if (r < K1) {
    if (has(STATE_CONV)) v = conv_state[(b * K1 + r) * C + c];
  } else {
    const uint at = (b * pc.t + r - K1) * C + c;
    v = STREAM_AT(has(BF16_QKV), qkv2, qkv, at);
  }
  state_out[i] = v;
}
