#version 460
// Gated RMSNorm backward, NORM_ROWS rows (b, t, h) per workgroup (norm_rows.glsl). With
// w = norm * silu(z) and out = o * inv * w:
//   dz = dout * o * inv * norm * silu'(z);   do = inv * w * dout - o * inv^3 * <w dout, o> / D
// z, dout and dz float32, or bfloat16 (Push::flags BF16_Z, BF16_DOUT, BF16_DZ).
#include "common.glsl"
#include "norm_rows.glsl"

layout(set = 0, binding = 0) readonly buffer O { vec4 o4[]; };          // [B, T, nv*D/4]
layout(set = 0, binding = 1) readonly buffer Z { vec4 z4[]; };          // [B, T, nv*D/4]
layout(set = 0, binding = 1) readonly buffer Z2 { uvec2 z2[]; };        // the same, bfloat16 (BF16_Z)
layout(set = 0, binding = 2) readonly buffer Norm { vec4 norm4[]; };    // [D/4]
layout(set = 0, binding = 3) readonly buffer Inv { float inv_rms[]; };  // [B, T, nv]
layout(set = 0, binding = 4) readonly buffer Dout { vec4 dout4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 4) readonly buffer Dout2 { uvec2 dout2[]; };  // the same, bfloat16 (BF16_DOUT)
layout(set = 0, binding = 5) writeonly buffer Dz { vec4 dz4[]; };       // [B, T, nv*D/4]
layout(set = 0, binding = 5) writeonly buffer Dz2 { uvec2 dz2[]; };     // the same, bfloat16 (BF16_DZ)
layout(set = 0, binding = 6) writeonly buffer Do { vec4 do4[]; };       // [B, T, nv*D/4] grad of o

void main() {
  const uint place = norm_place(), lane = place % NORM_LANES;
  const uint row = linear_group() * NORM_ROWS + place / NORM_LANES;  // (b*T + t)*nv + h
  const bool live = row < pc.nb * pc.t * pc.nv;  // (no early return: row_sum may meet at a barrier)
  const uint at = row * NORM_LANES + lane;
  vec4 o = vec4(0.0), z = vec4(0.0), d = vec4(0.0);
  float inv = 0.0;
  if (live) {
    o = o4[at];
    z = has(BF16_Z) ? widen_bf16x4(z2[at]) : z4[at];
    d = has(BF16_DOUT) ? widen_bf16x4(dout2[at]) : dout4[at];
    inv = inv_rms[row];
  }
  const vec4 nw = norm4[lane];
  const vec4 wd = nw * silu(z) * d;
  const float coef = row_sum(dot(wd, o), place) / float(D) * inv * inv * inv;
  if (!live) return;
  const vec4 dzi = d * o * inv * nw * silu_bwd(z);
  do4[at] = inv * wd - o * coef;
  if (has(BF16_DZ)) dz2[at] = round_bf16x4(dzi);
  else dz4[at] = dzi;
}
