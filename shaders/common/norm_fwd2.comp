#version 460
// Gated RMSNorm forward over the o of rec_fwd2 (and of the split chunk_fwd_mma), NORM_ROWS rows
// (b, t, h) per workgroup (norm_rows.glsl):
//   out = o / sqrt(mean(o^2) + eps) * norm * silu(z)
// z and out float32, or bfloat16 (Push::flags BF16_Z, BF16_OUT).
#include "common.glsl"
#include "norm_rows.glsl"

layout(set = 0, binding = 0) readonly buffer O { vec4 o4[]; };          // [B, T, nv*D/4]
layout(set = 0, binding = 1) readonly buffer Z { vec4 z4[]; };          // [B, T, nv*D/4]
layout(set = 0, binding = 1) readonly buffer Z2 { uvec2 z2[]; };        // the same, bfloat16 (BF16_Z)
layout(set = 0, binding = 2) readonly buffer Norm { vec4 norm4[]; };    // [D/4]
layout(set = 0, binding = 3) writeonly buffer Out { vec4 out4[]; };     // [B, T, nv*D/4]
layout(set = 0, binding = 3) writeonly buffer Out2 { uvec2 out2[]; };   // the same, bfloat16 (BF16_OUT)
layout(set = 0, binding = 4) writeonly buffer Inv { float inv_rms[]; }; // [B, T, nv]

void main() {
  const uint place = norm_place(), lane = place % NORM_LANES;
  const uint row = linear_group() * NORM_ROWS + place / NORM_LANES;  // (b*T + t)*nv + h
  const bool live = row < pc.nb * pc.t * pc.nv;  // (no early return: row_sum may meet at a barrier)
  const uint at = row * NORM_LANES + lane;
  const vec4 o = live ? o4[at] : vec4(0.0);
  const vec4 z = live ? (has(BF16_Z) ? widen_bf16x4(z2[at]) : z4[at]) : vec4(0.0);
  const float inv = 1.0 / sqrt(row_sum(dot(o, o), place) / float(D) + pc.eps);
  if (!live) return;
  const vec4 y = o * inv * norm4[lane] * silu(z);
  if (has(BF16_OUT)) out2[at] = round_bf16x4(y);
  else out4[at] = y;
  if (lane == 0u) inv_rms[row] = inv;
}
