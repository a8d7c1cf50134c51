#version 460
// The norm weight's gradient, first of two passes: per group of R rows (b, t, v-head) of the
// [B, T, nv] x D layout, each invocation d sums
//   dout[row, d] * o[row, d] * inv_rms[row] * silu(z[row, d])
// over the group's rows, in order, into part[group][d] (param_sum.comp adds the groups in order: two
// runs give bitwise the same sums). dout and z float32, or bfloat16 (Push::flags BF16_DOUT, BF16_Z).
#include "common.glsl"
layout(local_size_x = 128) in;  // one invocation per column d (D = 128)

#define R 64u  // rows per group (ParamRows on the host)

layout(set = 0, binding = 0) readonly buffer Dout { float dout[]; };  // [B, T, nv*D]
layout(set = 0, binding = 0) readonly buffer Dout2 { uint dout_h[]; };  // the same, bfloat16 pairs (BF16_DOUT)
layout(set = 0, binding = 1) readonly buffer O { float o[]; };        // [B, T, nv*D] o before the norm (tape)
layout(set = 0, binding = 2) readonly buffer Inv { float inv_rms[]; };  // [B, T, nv] (tape)
layout(set = 0, binding = 3) readonly buffer Z { float z[]; };        // [B, T, nv*D]
layout(set = 0, binding = 3) readonly buffer Z2 { uint z_h[]; };      // the same, bfloat16 pairs (BF16_Z)
layout(set = 0, binding = 4) writeonly buffer Part { float part[]; }; // [groups][D]

void main() {
  const uint g = linear_group(), d = gl_LocalInvocationIndex;
  const uint rows = pc.nb * pc.t * pc.nv;
  if (g * R >= rows) return;
  float s = 0.0;
  for (uint r = g * R; r < min(rows, g * R + R); ++r) {
    const uint at = r * D + d;
    const float d = STREAM_AT(has(BF16_DOUT), dout_h, dout, at);
    const float zz = STREAM_AT(has(BF16_Z), z_h, z, at);
    s += d * o[at] * inv_rms[r] * silu(zz);
  }
  part[g * D + d] = s;
}
