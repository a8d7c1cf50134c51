#version 460
// The gated RMSNorm backward's row sums, for chunk_dstate_mma where its workgroups hold a share of
// each row's columns (SPLIT > 1, chunk_mma.glsl): for each row (b, t, v-head), with w = norm silu(z),
//   row_sums[row] = sum over the D columns of w dout o
// (chunk_dstate_mma makes dO = inv w dout - o inv^3 row_sums / D from it). One subgroup of 32 per
// row, a vec4 per lane; z and dout float32, or bfloat16 (Push::flags BF16_Z, BF16_DOUT).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 256) in;  // 8 subgroups of 32 (the host requires exactly 32)

layout(set = 0, binding = 0) readonly buffer O4 { vec4 o4[]; };          // [B, T, nv*D/4] o before the norm (tape)
layout(set = 0, binding = 1) readonly buffer Z4 { vec4 z4[]; };          // [B, T, nv*D/4] the norm's gate input
layout(set = 0, binding = 1) readonly buffer Z2 { uvec2 z2[]; };         // the same, bfloat16 (BF16_Z)
layout(set = 0, binding = 2) readonly buffer Dout4 { vec4 dout4[]; };    // [B, T, nv*D/4] grad of the output
layout(set = 0, binding = 2) readonly buffer Dout2 { uvec2 dout2[]; };   // the same, bfloat16 (BF16_DOUT)
layout(set = 0, binding = 3) readonly buffer Norm4 { vec4 norm4[]; };    // [D/4] RMSNorm weight
layout(set = 0, binding = 4) writeonly buffer RowSums { float row_sums[]; };  // [B, T, nv]

void main() {
  const uint row = linear_group() * 8u + gl_SubgroupID;  // (b*T + t)*nv + h
  if (row >= pc.nb * pc.t * pc.nv) return;               // (the whole subgroup)
  const uint lane = gl_SubgroupInvocationID, at = row * (D / 4u) + lane;
  const vec4 z = has(BF16_Z) ? widen_bf16x4(z2[at]) : z4[at];
  const vec4 d = has(BF16_DOUT) ? widen_bf16x4(dout2[at]) : dout4[at];
  const float s = subgroupAdd(dot(norm4[lane] * silu(z) * d, o4[at]));
  if (lane == 0u) row_sums[row] = s;
}
