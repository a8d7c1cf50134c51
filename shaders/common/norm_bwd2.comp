#version 460
// Gated RMSNorm backward, one workgroup per group of PARAM_ROWS rows (b, t, h), NORM_ROWS rows at a
// time (norm_rows.glsl). With w = norm * silu(z) and out = o * inv * w:
//   dz = dout * o * inv * norm * silu'(z);   do = inv * w * dout - o * inv^3 * <w dout, o> / D
// and the group's share of the norm weight's gradient, in a fixed order (param_sum.comp adds the
// groups in order: two runs give bitwise the same sums):
//   dnorm_part[group][d] = sum over the group's rows of dout * o * inv * silu(z)
// z, dout and dz float32, or bfloat16 (Push::flags BF16_Z, BF16_DOUT, BF16_DZ).
#include "common.glsl"
#include "norm_rows.glsl"

#define PARAM_ROWS 64u  // rows per group (kParamRows on the host)

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
layout(set = 0, binding = 7) writeonly buffer DnormPart { vec4 dnorm_part4[]; };  // [groups, D/4]

shared vec4 dn_slot[NORM_ROWS * NORM_LANES];  // [row slot][column quad]: the slots' dnorm sums

void main() {
  const uint place = norm_place(), lane = place % NORM_LANES, slot = place / NORM_LANES;
  const uint rows = pc.nb * pc.t * pc.nv, g = linear_group();
  const vec4 nw = norm4[lane];
  vec4 dn = vec4(0.0);  // the slot's rows' dnorm terms, in row order
  for (uint r0 = g * PARAM_ROWS; r0 < (g + 1u) * PARAM_ROWS; r0 += NORM_ROWS) {
    const uint row = r0 + slot;  // (b*T + t)*nv + h
    const bool live = row < rows;  // (the whole workgroup loops: row_sum may meet at a barrier)
    const uint at = row * NORM_LANES + lane;
    vec4 o = vec4(0.0), z = vec4(0.0), d = vec4(0.0);
    float inv = 0.0;
    if (live) {
      o = o4[at];
      z = has(BF16_Z) ? widen_bf16x4(z2[at]) : z4[at];
      d = has(BF16_DOUT) ? widen_bf16x4(dout2[at]) : dout4[at];
      inv = inv_rms[row];
    }
    const vec4 sz = silu(z), wd = nw * sz * d;
    const float coef = row_sum(dot(wd, o), place) / float(D) * inv * inv * inv;
    if (!rows_in_subgroups()) barrier();  // row_part is written again next round
    dn += d * o * inv * sz;
    if (live) {
      const vec4 dzi = d * o * inv * nw * silu_bwd(z);
      do4[at] = inv * wd - o * coef;
      if (has(BF16_DZ)) dz2[at] = round_bf16x4(dzi);
      else dz4[at] = dzi;
    }
  }
  dn_slot[place] = dn;
  barrier();
  if (slot == 0u) {
    vec4 s = dn_slot[lane];
    for (uint k = 1u; k < NORM_ROWS; ++k) s += dn_slot[k * NORM_LANES + lane];
    dnorm_part4[g * NORM_LANES + lane] = s;
  }
}
