#version 460
// Depthwise causal conv + SiLU over time, time-blocked (conv.glsl), with the q/k l2 norms fused in:
//   y[b,t,c] = silu(sum_j conv[c,j] * qkv[b, t-(K-1)+j, c]), conv_state's rows before the window
//   q^ = q / (sqrt(sum q^2 + 1e-6) * sqrt(D)),  k^ = k / sqrt(sum k^2 + 1e-6)   (per token and k-head)
// The v channels go to y ([B, T, nv*D]). The q and k channels leave only as q^, k^ and their sums of squares + 1e-6:
// nothing else reads them (the backward's qk_bwd and qk_bwd2 make q and k back from those).
// A head's D channels are 32 neighbouring invocations of one token block (C/4 is a multiple of 32),
// whose sums of squares per token meet in shared memory: no subgroup size assumed.
#include "common.glsl"
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Qkv { vec4 qkv4[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 0) readonly buffer Qkv2 { uvec2 qkv2[]; };  // the same, bfloat16 (BF16_QKV)
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) writeonly buffer Y { vec4 y4[]; };       // [B, T, nv*D] conv + silu of the v channels
layout(set = 0, binding = 3) writeonly buffer Qkn4 { vec4 qkn4[]; };  // [2][B, T, nk, D/4] q^, k^
#define TB 8u  // tokens per invocation: its outputs wait in registers (16 needs 113 registers and is slower)
layout(set = 0, binding = 4) writeonly buffer Nq { float nq[]; };     // [2][B, T, nk] sum q^2 + 1e-6, sum k^2 + 1e-6
layout(set = 0, binding = 5) readonly buffer ConvState { vec4 conv_state4[]; };  // [B, K-1, C] (STATE_CONV)

#include "conv.glsl"

#define SQP (TB + 1u)  // row stride of sq: invocations' rows fall in distinct banks
shared float sq[64u * SQP];   // [invocation][token s of the block]: its 4 channels' sum of squares
shared float norm2[2u * TB];  // [group of 32 invocations][token s]: the head's sum of squares + 1e-6

void main() {
  ConvBlock k;
  const bool live = conv_block(k);  // (no early return: the workgroup meets at barriers)
  const uint lid = gl_LocalInvocationIndex, g = lid / 32u;
  const bool qk = live && 4u * k.c4 < 2u * pc.nk * D;  // the same for each group of 32
  vec4 y[TB];                                          // the block's outputs (q and k channels)
  if (live) {
    vec4 w[KT], x[KT];  // x[j]: the input at t - (K-1) + j for the token t being computed
    conv_taps(k, w);
    [[unroll]] for (uint j = 0u; j + 1u < KT; ++j) {
      x[j] = input_at(k, int(k.t0) - int(KT - 1u) + int(j));
    }
    // Every token's load is unconditional (a token past the window's end reads its last row and
    // is dropped), so that the block's loads can all be in flight at once.
    [[unroll]] for (uint s = 0u; s < TB; ++s) {
      const bool in_window = k.t0 + s < pc.t;
      const int t = int(min(k.t0 + s, pc.t - 1u));
      x[KT - 1u] = qkv_at(conv_at(k, t));
      vec4 pre = vec4(0.0);
      [[unroll]] for (uint j = 0u; j < KT; ++j) pre = fma(w[j], x[j], pre);
      y[s] = in_window ? silu(pre) : vec4(0.0);
      if (!qk && in_window) y4[(y_at(k.b * pc.t + uint(t), 0u) + 4u * k.c4 - 2u * pc.nk * D) / 4u] = y[s];
      [[unroll]] for (uint j = 0u; j + 1u < KT; ++j) x[j] = x[j + 1u];
    }
  }
  [[unroll]] for (uint s = 0u; s < TB; ++s) sq[lid * SQP + s] = qk ? dot(y[s], y[s]) : 0.0;
  barrier();
  if (lid % 32u < TB) {  // invocation s of each group: token s's sum over the group
    const uint s = lid % 32u;
    float acc = 0.0;
    for (uint m = 0u; m < 32u; ++m) acc += sq[(32u * g + m) * SQP + s];
    norm2[g * TB + s] = acc + 1e-6;
  }
  barrier();
  if (!qk) return;
  const bool is_q = 4u * k.c4 < pc.nk * D;
  const uint c = 4u * k.c4 - (is_q ? 0u : pc.nk * D), ko = c / D;  // channel within q or k, its head
  const uint n = pc.nb * pc.t * pc.nk;
  [[unroll]] for (uint s = 0u; s < TB; ++s) {
    if (k.t0 + s >= pc.t) break;
    const float n2 = norm2[g * TB + s];
    const uint idx = (is_q ? 0u : n) + (k.b * pc.t + k.t0 + s) * pc.nk + ko;  // (which, b, t, k-head)
    qkn4[(idx * D + c % D) / 4u] = y[s] / (is_q ? sqrt(n2) * sqrt(float(D)) : sqrt(n2));
    if (lid % 32u == 0u) nq[idx] = n2;
  }
}
