#version 460
// Gated RMSNorm forward over the o of rec_fwd2: one workgroup of D invocations per (b, t, h) row.
//   out = o / sqrt(mean(o^2) + eps) * norm * silu(z)
// z and out float32, or bfloat16 (Push::flags BF16_Z, BF16_OUT).
#include "common.glsl"
layout(local_size_x = 128) in;

layout(set = 0, binding = 0) readonly buffer O { float o_pre[]; };      // [B, T, nv*D]
layout(set = 0, binding = 1) readonly buffer Z { float z[]; };          // [B, T, nv*D]
layout(set = 0, binding = 1) readonly buffer Z2 { uint z_h[]; };        // the same, bfloat16 pairs (BF16_Z)
layout(set = 0, binding = 2) readonly buffer Norm { float norm_w[]; };  // [D]
layout(set = 0, binding = 3) writeonly buffer Out { float out_[]; };    // [B, T, nv*D]
layout(set = 0, binding = 3) writeonly buffer Out2 { uint out_h[]; };   // the same, bfloat16 pairs (BF16_OUT)
layout(set = 0, binding = 4) writeonly buffer Inv { float inv_rms[]; }; // [B, T, nv]

#include "workgroup_sum.glsl"
#include "bf16_row.glsl"

void main() {
  const uint row = linear_group();  // (b*T + t)*nv + h
  if (row >= pc.nb * pc.t * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint i = row * D + tid;
  const float o = o_pre[i];
  const float inv = 1.0 / sqrt(workgroup_sum(o * o) / float(D) + pc.eps);
  const float zz = STREAM_AT(has(BF16_Z), z_h, z, i);
  const float y = o * inv * norm_w[tid] * silu(zz);
  if (has(BF16_OUT)) {
    bf16_row[tid] = y;
    barrier();
    BF16_ROW_STORE(out_h, row * D, tid)
  } else {
    out_[i] = y;
  }
  if (tid == 0u) inv_rms[row] = inv;
}
