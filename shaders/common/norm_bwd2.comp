#version 460
// Gated RMSNorm backward: one workgroup of D invocations per (b, t, h) row. With
// w = norm * silu(z) and out = o * inv * w:
//   dz = dout * o * inv * norm * silu'(z);   do = inv * w * dout - o * inv^3 * <w dout, o> / D
// z, dout and dz float32, or bfloat16 (Push::flags BF16_Z, BF16_DOUT, BF16_DZ).
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer O { float o_pre[]; };      // [B, T, nv*D]
layout(set = 0, binding = 1) readonly buffer Z { float z[]; };          // [B, T, nv*D]
layout(set = 0, binding = 1) readonly buffer Z2 { uint z_h[]; };        // the same, bfloat16 pairs (BF16_Z)
layout(set = 0, binding = 2) readonly buffer Norm { float norm_w[]; };  // [D]
layout(set = 0, binding = 3) readonly buffer Inv { float inv_rms[]; };  // [B, T, nv]
layout(set = 0, binding = 4) readonly buffer Dout { float dout[]; };    // [B, T, nv*D]
layout(set = 0, binding = 4) readonly buffer Dout2 { uint dout_h[]; };  // the same, bfloat16 pairs (BF16_DOUT)
layout(set = 0, binding = 5) writeonly buffer Dz { float dz[]; };       // [B, T, nv*D]
layout(set = 0, binding = 5) writeonly buffer Dz2 { uint dz_h[]; };     // the same, bfloat16 pairs (BF16_DZ)
layout(set = 0, binding = 6) writeonly buffer Do { float do_[]; };      // [B, T, nv*D] grad of o

#include "workgroup_sum.glsl"
#include "bf16_row.glsl"

void main() {
  const uint row = linear_group();
  if (row >= pc.nb * pc.t * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint i = row * D + tid;
  const float o = o_pre[i], inv = inv_rms[row];
  const float zz = STREAM_AT(has(BF16_Z), z_h, z, i);
  const float d = STREAM_AT(has(BF16_DOUT), dout_h, dout, i);
  const float wd = norm_w[tid] * silu(zz) * d;
  const float coef = workgroup_sum(wd * o) / float(D) * inv * inv * inv;
  const float dzi = d * o * inv * norm_w[tid] * silu_bwd(zz);
  do_[i] = inv * wd - o * coef;
  if (has(BF16_DZ)) {
    bf16_row[tid] = dzi;
    barrier();
    BF16_ROW_STORE(dz_h, row * D, tid)
  } else {
    dz[i] = dzi;
  }
}
