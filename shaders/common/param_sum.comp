#version 460
// The parameters' gradients, summed over the windows and tokens of one backward in a fixed order (no
// float atomics: two runs give bitwise the same sums). One invocation per output:
//   dconv[c, j]  = sum over conv_bwd's blocks of their dconv_part       (ids 0 .. C K - 1)
//   dnorm[d]     = sum over param_part's groups of their part            (next D)
//   ddt_bias[h]  = sum_{b,t} da[b, t, h]                                  (next nv)
//   da_log[h]    = sum_{b,t} da[b, t, h] * softplus(x) / sigmoid(x),  x = a + dt_bias   (next nv)
// (d log g / d a_log = -exp(a_log) softplus(x), d log g / d a = -exp(a_log) sigmoid(x): their ratio
// turns da into da_log's terms; it is 1 + e^x / 2 to fp32 accuracy below x = -20.)
#include "common.glsl"
layout(local_size_x = 64) in;

layout(constant_id = 0) const uint KT = 4;  // conv taps
#define TB 32u   // conv_bwd's tokens per block (conv.glsl)
#define R 64u    // param_part's rows per group

layout(set = 0, binding = 0) readonly buffer DconvPart { float dconv_part[]; };  // [B, ceil(T/TB), K, C]
layout(set = 0, binding = 1) readonly buffer Part { float part[]; };             // [groups][D]
layout(set = 0, binding = 2) readonly buffer Da { float da[]; };                 // [B, T, nv]
layout(set = 0, binding = 3) readonly buffer Gates { float gates[]; };           // [3][B, T, nv]: a + dt_bias at [2]
layout(set = 0, binding = 4) writeonly buffer Dconv { float dconv[]; };          // [C, K]
layout(set = 0, binding = 5) writeonly buffer Dnorm { float dnorm[]; };          // [D]
layout(set = 0, binding = 6) writeonly buffer DdtBias { float ddt_bias[]; };     // [nv]
layout(set = 0, binding = 7) writeonly buffer DaLog { float da_log[]; };         // [nv]

// softplus(x) / sigmoid(x) = softplus(x) (1 + e^-x)
float sp_over_sig(float x) { return x < -20.0 ? 1.0 + 0.5 * exp(x) : softplus(x) * (1.0 + exp(-x)); }

void main() {
  uint i = linear_group() * 64u + gl_LocalInvocationIndex;
  const uint C = pc.c_dim, blocks = pc.nb * ((pc.t + TB - 1u) / TB), n = pc.nb * pc.t * pc.nv;
  if (i < C * KT) {  // dconv[c][j]: the partials are [block][j][c]
    const uint c = i / KT, j = i % KT;
    float s = 0.0;
    for (uint b = 0u; b < blocks; ++b) s += dconv_part[(b * KT + j) * C + c];
    dconv[i] = s;
    return;
  }
  i -= C * KT;
  if (i < D) {
    const uint groups = (n + R - 1u) / R;
    float s = 0.0;
    for (uint g = 0u; g < groups; ++g) s += part[g * D + i];
    dnorm[i] = s;
    return;
  }
  i -= D;
  if (i < 2u * pc.nv) {
    const uint h = i % pc.nv;
    const bool log_a = i >= pc.nv;
    float s = 0.0;
    for (uint bt = 0u; bt < pc.nb * pc.t; ++bt) {
      const uint at = bt * pc.nv + h;
      s += log_a ? da[at] * sp_over_sig(gates[2u * n + at]) : da[at];
    }
    if (log_a) da_log[h] = s;
    else ddt_bias[h] = s;
  }
}
