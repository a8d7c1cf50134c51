#version 460
// The parameters' gradients, summed over the windows and tokens of one backward in a fixed order (no
// float atomics: two runs give bitwise the same sums):
//   dconv[c, j]  = sum over conv_bwd's blocks of their dconv_part
//   dnorm[d]     = sum over the groups of rows of their part (param_part's, or the family's
//                  backward's: pc.n groups)
//   ddt_bias[h]  = sum_{b,t} da[b, t, h]
//   da_log[h]    = sum_{b,t} da[b, t, h] * softplus(x) / sigmoid(x),  x = a + dt_bias
// (d log g / d a_log = -exp(a_log) softplus(x), d log g / d a = -exp(a_log) sigmoid(x): their ratio
// turns da into da_log's terms; it is 1 + e^x / 2 to fp32 accuracy below x = -20.)
// With PARAM_ACCUMULATE the sums are added to what the outputs hold (a call run as parts: each part's
// backward adds its own, in the parts' fixed order).
#include "common.glsl"
layout(local_size_x = 256) in;
#define WG 256u

layout(constant_id = 0) const uint KT = 4;  // conv taps
#define TB 32u   // conv_bwd's tokens per block (conv.glsl)

layout(set = 0, binding = 0) readonly buffer DconvPart { float dconv_part[]; };  // [B, ceil(T/TB), K, C]
layout(set = 0, binding = 1) readonly buffer Part { float part[]; };             // [pc.n groups][D]
layout(set = 0, binding = 2) readonly buffer Da { float da[]; };                 // [B, T, nv]
layout(set = 0, binding = 3) readonly buffer Gates { float gates[]; };           // [3][B, T, nv]: a + dt_bias at [2]
layout(set = 0, binding = 4) buffer Dconv { float dconv[]; };          // [C, K]
layout(set = 0, binding = 5) buffer Dnorm { float dnorm[]; };          // [D]
layout(set = 0, binding = 6) buffer DdtBias { float ddt_bias[]; };     // [nv]
layout(set = 0, binding = 7) buffer DaLog { float da_log[]; };         // [nv]

shared vec2 tree[WG];

// The value an output takes for this backward's sum s: s, or s added to the earlier parts'.
float total_of(float held, float s) { return has(PARAM_ACCUMULATE) ? held + s : s; }

// softplus(x) / sigmoid(x) = softplus(x) (1 + e^-x)
float sp_over_sig(float x) { return x < -20.0 ? 1.0 + 0.5 * exp(x) : softplus(x) * (1.0 + exp(-x)); }

// The workgroup's sum of v (two sums at once), by a fixed tree over shared memory; invocation 0 gets it.
vec2 tree_sum(vec2 v, uint tid) {
  tree[tid] = v;
  barrier();
  for (uint half_ = WG / 2u; half_ > 0u; half_ /= 2u) {
    if (tid < half_) tree[tid] += tree[tid + half_];
    barrier();
  }
  return tree[0];
}

// Workgroups: first ceil(C K / WG) of dconv, one output an invocation (each sums few blocks); then
// one per dnorm[d] and one per head (ddt_bias[h] and da_log[h] together), whose long sums each
// invocation takes a strided share of, added by tree_sum.
void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint C = pc.c_dim, blocks = pc.nb * ((pc.t + TB - 1u) / TB), n = pc.nb * pc.t * pc.nv;
  const uint conv_groups = (C * KT + WG - 1u) / WG;
  uint g = linear_group();
  if (g < conv_groups) {  // dconv[c][j] from the partials [block][j][c]: i = j C + c reads along c
    const uint i = g * WG + tid;
    if (i >= C * KT) return;
    const uint j = i / C, c = i % C;
    float s = 0.0;
    for (uint b = 0u; b < blocks; ++b) s += dconv_part[(b * KT + j) * C + c];
    dconv[c * KT + j] = total_of(dconv[c * KT + j], s);
    return;
  }
  g -= conv_groups;
  if (g < D) {  // dnorm[g]: the groups of rows
    float s = 0.0;
    for (uint q = tid; q < pc.n; q += WG) s += part[q * D + g];
    const float total = tree_sum(vec2(s, 0.0), tid).x;
    if (tid == 0u) dnorm[g] = total_of(dnorm[g], total);
    return;
  }
  g -= D;
  if (g < pc.nv) {  // head g: ddt_bias = sum da, da_log = sum da softplus / sigmoid
    vec2 s = vec2(0.0);
    for (uint bt = tid; bt < pc.nb * pc.t; bt += WG) {
      const uint at = bt * pc.nv + g;
      s += da[at] * vec2(1.0, sp_over_sig(gates[2u * n + at]));
    }
    const vec2 total = tree_sum(s, tid);
    if (tid == 0u) {
      ddt_bias[g] = total_of(ddt_bias[g], total.x);
      da_log[g] = total_of(da_log[g], total.y);
    }
  }
}
