#version 460
// Forward recurrence + gated RMSNorm, per-head family: one workgroup per (window b, v-head h).
//   S <- g S;  kv = S^T k^;  u = beta (v - kv);  S <- S + k^ (x) u;  o = S^T q^
//   out = o / sqrt(mean(o^2) + eps) * norm * silu(z)
// With pc.keep, S is checkpointed at the start of every segment but the first (slot seg-1 holds
// the state after step seg*cs - 1), for rec_bwd's replay. S starts at h0 (STATE_H0) or zero; with
// STATE_CARRY the state after the last step goes to ht. z and out float32, or bfloat16 (Push::flags
// BF16_Z, BF16_OUT).
#include "common.glsl"
#include "per_head.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 1) readonly buffer Qkn { float qkn[]; };      // [2][B, T, nk, D]
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 3) readonly buffer Z { float z[]; };          // [B, T, nv*D]
layout(set = 0, binding = 3) readonly buffer Z2 { uint z_h[]; };        // the same, bfloat16 pairs (BF16_Z)
layout(set = 0, binding = 4) readonly buffer Norm { float norm_w[]; };  // [D]
layout(set = 0, binding = 5) writeonly buffer Out { float out_[]; };    // [B, T, nv*D]
layout(set = 0, binding = 5) writeonly buffer Out2 { uint out_h[]; };   // the same, bfloat16 pairs (BF16_OUT)
layout(set = 0, binding = 6) writeonly buffer O { float o_pre[]; };     // [B, T, nv*D] o before the norm
layout(set = 0, binding = 7) writeonly buffer Inv { float inv_rms[]; }; // [B, T, nv]
layout(set = 0, binding = 8) writeonly buffer Ck { float ck[]; };       // [B, nv, max(nseg-1,1), D*D]
layout(set = 0, binding = 9) readonly buffer H0 { float h0[]; };        // [B, nv, D, D] (STATE_H0)
layout(set = 0, binding = 10) writeonly buffer Ht { float ht[]; };      // [B, nv, D, D] (STATE_CARRY)

shared float sq[D], sk[D], sv[D], su[D], so[D];
#include "bf16_row.glsl"

void main() {
  const uint bh = linear_group();  // b*nv + h
  if (bh >= pc.nb * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint b = bh / pc.nv, h = bh % pc.nv, ko = h / (pc.nv / pc.nk);
  const uint ty = tid / 16u, tx = tid % 16u;
  const uint n_bt = pc.nb * pc.t;
  const uint ck_slots = max(pc.nseg, 2u) - 1u;
  float s[64];
  [[unroll]] for (uint e = 0u; e < 64u; ++e) s[e] = has(STATE_H0) ? h0[carried_at(bh, ty, tx, e)] : 0.0;

  for (uint ti = 0u; ti < pc.t; ++ti) {
    const uint bt = b * pc.t + ti;
    if (tid < D) {
      sq[tid] = qkn[qk_at(QK_Q, bt, ko) + tid];
      sk[tid] = qkn[qk_at(QK_K, bt, ko) + tid];
      sv[tid] = y[y_at(bt, h) + tid];
    }
    barrier();
    const float g = gates[bt * pc.nv + h];
    const float beta = gates[(n_bt + bt) * pc.nv + h];
    // S <- g S ; kv = S^T k^ (column sums)
    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
      float acc = 0.0;
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        s[i * 8u + j] *= g;
        acc += s[i * 8u + j] * sk[ty * 8u + i];
      }
      col_partial(ty, tx, j, acc);
    }
    barrier();
    if (tid < D) su[tid] = beta * (sv[tid] - reduce16(tid));
    barrier();
    // S += k^ (x) u ; o = S^T q^
    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
      float acc = 0.0;
      const float u = su[tx * 8u + j];
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        s[i * 8u + j] += sk[ty * 8u + i] * u;
        acc += s[i * 8u + j] * sq[ty * 8u + i];
      }
      col_partial(ty, tx, j, acc);
    }
    barrier();
    float o = 0.0;
    if (tid < D) {
      o = reduce16(tid);
      so[tid] = o * o;
    }
    barrier();
    for (uint st = D / 2u; st > 0u; st >>= 1u) {
      if (tid < st) so[tid] += so[tid + st];
      barrier();
    }
    const float inv = 1.0 / sqrt(so[0] / float(D) + pc.eps);
    const uint vi = bt * pc.nv * D + h * D + tid;
    if (tid < D) {
      const float zz = STREAM_AT(has(BF16_Z), z_h, z, vi);
      const float y = o * inv * norm_w[tid] * silu(zz);
      if (has(BF16_OUT))
        bf16_row[tid] = y;  // stored after the step's last barrier
      else
        out_[vi] = y;
      o_pre[vi] = o;
    }
    if (tid == 0u) inv_rms[bt * pc.nv + h] = inv;
    const uint seg_next = (ti + 1u) / pc.cs;
    if (pc.keep != 0u && (ti + 1u) % pc.cs == 0u && seg_next < pc.nseg) {
      const uint base = (bh * ck_slots + seg_next - 1u) * STATE_WORDS;
      [[unroll]] for (uint e = 0u; e < 64u; ++e) ck[base + e * 256u + tid] = s[e];
    }
    barrier();  // so[0] is read above before the next step's writes
    if (has(BF16_OUT)) BF16_ROW_STORE(out_h, vi - tid, tid)
  }
  if (has(STATE_CARRY))
    [[unroll]] for (uint e = 0u; e < 64u; ++e) ht[carried_at(bh, ty, tx, e)] = s[e];
}
