#version 460
// Gated RMSNorm backward: one workgroup of D invocations per (b, t, h) row. With
// w = norm * silu(z) and out = o * inv * w:
//   dz = dout * o * inv * norm * silu'(z);   do = inv * w * dout - o * inv^3 * <w dout, o> / D
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer O { float o_pre[]; };      // [B, T, nv*D]
layout(set = 0, binding = 1) readonly buffer Z { float z[]; };          // [B, T, nv*D]
layout(set = 0, binding = 2) readonly buffer Norm { float norm_w[]; };  // [D]
layout(set = 0, binding = 3) readonly buffer Inv { float inv_rms[]; };  // [B, T, nv]
layout(set = 0, binding = 4) readonly buffer Dout { float dout[]; };    // [B, T, nv*D]
layout(set = 0, binding = 5) writeonly buffer Dz { float dz[]; };       // [B, T, nv*D]
layout(set = 0, binding = 6) writeonly buffer Do { float do_[]; };      // [B, T, nv*D] grad of o

#include "workgroup_sum.glsl"

void main() {
  const uint row = linear_group();
  if (row >= pc.nb * pc.t * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint i = row * D + tid;
  const float o = o_pre[i], zz = z[i], d = dout[i], inv = inv_rms[row];
  const float wd = norm_w[tid] * silu(zz) * d;
  const float coef = workgroup_sum(wd * o) / float(D) * inv * inv * inv;
  dz[i] = d * o * inv * norm_w[tid] * silu_bwd(zz);
  do_[i] = inv * wd - o * coef;
}
