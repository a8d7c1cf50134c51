#version 460
// Depthwise causal conv + SiLU over time, time-blocked (conv.glsl):
//   y[b,t,c] = silu(sum_j conv[c,j] * qkv[b, t-(K-1)+j, c]), zero before the window.
#include "common.glsl"
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Qkv { vec4 qkv4[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) writeonly buffer Y { vec4 y4[]; };       // [B, T, C] conv + silu

#include "conv.glsl"

void main() {
  ConvBlock k;
  if (!conv_block(k)) return;
  vec4 w[KT], x[KT];  // x[j]: the input at t - (K-1) + j for the token t being computed
  conv_taps(k, w);
  [[unroll]] for (uint j = 0u; j + 1u < KT; ++j) {
    const int t = int(k.t0) - int(KT - 1u) + int(j);
    x[j] = t >= 0 ? qkv4[conv_at(k, t)] : vec4(0.0);
  }
  for (uint s = 0u; s < TB && k.t0 + s < pc.t; ++s) {
    const int t = int(k.t0 + s);
    x[KT - 1u] = qkv4[conv_at(k, t)];
    vec4 pre = vec4(0.0);
    [[unroll]] for (uint j = 0u; j < KT; ++j) pre = fma(w[j], x[j], pre);
    y4[conv_at(k, t)] = silu(pre);
    [[unroll]] for (uint j = 0u; j + 1u < KT; ++j) x[j] = x[j + 1u];
  }
}
