#version 460
// Backward recurrence (checkpointed BPTT) + gated RMSNorm backward, per-head family: one workgroup
// per (window b, v-head h). Segments of cs steps are walked in reverse; each is replayed from its
// checkpoint into the scratch (S after every step, kv per step), then swept backwards with dS
// carried in registers across segments (docs/spec.md, "Backward"):
//   do from the norm backward; dS += q^ (x) do; dq^ = S_t do; du = dS^T k^; dv = beta du;
//   dbeta = <du, v - kv>; dkv = -beta du; dS_pre = dS + k^ (x) dkv; dk^ = dS u + (g S_{t-1}) dkv;
//   dg = <dS_pre, S_{t-1}>; dS = g dS_pre.
// dq^ and dk^ leave per v-head (dqk); qk_bwd sums the rep heads of a key head. The first segment
// replays from h0 (STATE_H0) or zero; dS starts at dht (STATE_CARRY) or zero and ends as dh0 (written
// where h0 was given). z, dout and dz float32, or bfloat16 (Push::flags BF16_Z, BF16_DOUT, BF16_DZ).
#include "common.glsl"
#include "per_head.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 1) readonly buffer Qkn { float qkn[]; };      // [2][B, T, nk, D]
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]: g, beta, a+dt_bias
layout(set = 0, binding = 3) readonly buffer Z { float z[]; };          // [B, T, nv*D]
layout(set = 0, binding = 3) readonly buffer Z2 { uint z_h[]; };        // the same, bfloat16 pairs (BF16_Z)
layout(set = 0, binding = 4) readonly buffer Norm { float norm_w[]; };  // [D]
layout(set = 0, binding = 5) readonly buffer O { float o_pre[]; };      // [B, T, nv*D]
layout(set = 0, binding = 6) readonly buffer Inv { float inv_rms[]; };  // [B, T, nv]
layout(set = 0, binding = 7) readonly buffer Ck { float ck[]; };        // [B, nv, max(nseg-1,1), D*D]
layout(set = 0, binding = 8) readonly buffer Dout { float dout[]; };    // [B, T, nv*D]
layout(set = 0, binding = 8) readonly buffer Dout2 { uint dout_h[]; };  // the same, bfloat16 pairs (BF16_DOUT)
layout(set = 0, binding = 9) buffer Scr { float scr[]; };               // [B, nv, cs, D*D] replayed S_t
layout(set = 0, binding = 10) buffer Kvs { float kvs[]; };              // [B, nv, cs, D] replayed kv
layout(set = 0, binding = 11) writeonly buffer Dqk { float dqk[]; };    // [2][B, T, nv, D] dq^, dk^
layout(set = 0, binding = 12) writeonly buffer Dy { float dy[]; };      // [B, T, C]: writes the v part
layout(set = 0, binding = 13) writeonly buffer Dz { float dz[]; };      // [B, T, nv*D]
layout(set = 0, binding = 13) writeonly buffer Dz2 { uint dz_h[]; };    // the same, bfloat16 pairs (BF16_DZ)
layout(set = 0, binding = 14) writeonly buffer Da { float da[]; };      // [B, T, nv]
layout(set = 0, binding = 15) writeonly buffer Db { float db[]; };      // [B, T, nv]
layout(set = 0, binding = 16) readonly buffer ALog { float a_log[]; };  // [nv]
layout(set = 0, binding = 17) readonly buffer H0 { float h0[]; };       // [B, nv, D, D] (STATE_H0)
layout(set = 0, binding = 18) readonly buffer Dht { float dht[]; };     // [B, nv, D, D] (STATE_CARRY)
layout(set = 0, binding = 19) writeonly buffer Dh0 { float dh0[]; };    // [B, nv, D, D]

shared float sq[D], sk[D], svc[D], sdo[D], su[D], sdkv[D], sdk[D];
#include "bf16_row.glsl"

// Element e of the state segment seg starts from: its checkpoint, or for the first h0 (or zero).
float segment_start(uint seg, uint ck_at, uint bh, uint ty, uint tx, uint e) {
  if (seg > 0u) return ck[ck_at + e * 256u + ty * 16u + tx];
  return has(STATE_H0) ? h0[carried_at(bh, ty, tx, e)] : 0.0;
}

void main() {
  const uint bh = linear_group();  // b*nv + h
  if (bh >= pc.nb * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint b = bh / pc.nv, h = bh % pc.nv, ko = h / (pc.nv / pc.nk);
  const uint ty = tid / 16u, tx = tid % 16u;
  const uint n_bt = pc.nb * pc.t;
  const uint ck_slots = max(pc.nseg, 2u) - 1u;
  const float ea = exp(a_log[h]);
  const uint scr0 = bh * pc.cs * STATE_WORDS;
  const uint kvs0 = bh * pc.cs * D;
  float ds[64], st[64], sp[64];  // dS; S_t; S_{t-1}
  [[unroll]] for (uint e = 0u; e < 64u; ++e) ds[e] = has(STATE_CARRY) ? dht[carried_at(bh, ty, tx, e)] : 0.0;

  for (uint sgi = 0u; sgi < pc.nseg; ++sgi) {
    const uint seg = pc.nseg - 1u - sgi;
    const uint t0 = seg * pc.cs;
    const uint nst = min(pc.cs, pc.t - t0);
    const uint ck_at = seg > 0u ? (bh * ck_slots + seg - 1u) * STATE_WORDS : 0u;  // used only for seg > 0

    // ---- replay the segment from its checkpoint: S_t and kv of every step into the scratch ----
    [[unroll]] for (uint e = 0u; e < 64u; ++e) sp[e] = segment_start(seg, ck_at, bh, ty, tx, e);
    for (uint j = 0u; j < nst; ++j) {
      const uint bt = b * pc.t + t0 + j;
      if (tid < D) {
        sk[tid] = qkn[qk_at(QK_K, bt, ko) + tid];
        svc[tid] = y[y_at(bt, h) + tid];
      }
      barrier();
      const float g = gates[bt * pc.nv + h];
      const float beta = gates[(n_bt + bt) * pc.nv + h];
      [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) {
        float acc = 0.0;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
          sp[i * 8u + jj] *= g;
          acc += sp[i * 8u + jj] * sk[ty * 8u + i];
        }
        col_partial(ty, tx, jj, acc);
      }
      barrier();
      if (tid < D) {
        const float kv = reduce16(tid);
        kvs[kvs0 + j * D + tid] = kv;
        su[tid] = beta * (svc[tid] - kv);
      }
      barrier();
      [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) {
        const float u = su[tx * 8u + jj];
        [[unroll]] for (uint i = 0u; i < 8u; ++i) sp[i * 8u + jj] += sk[ty * 8u + i] * u;
      }
      [[unroll]] for (uint e = 0u; e < 64u; ++e) scr[scr0 + j * STATE_WORDS + e * 256u + tid] = sp[e];
      barrier();
    }
    memoryBarrierBuffer();
    barrier();

    // ---- reverse sweep over the segment ----
    [[unroll]] for (uint e = 0u; e < 64u; ++e) st[e] = sp[e];  // S after the segment's last step
    for (uint rr = 0u; rr < nst; ++rr) {
      const uint j = nst - 1u - rr;
      const uint bt = b * pc.t + t0 + j;
      const uint vi = bt * pc.nv * D + h * D + tid;
      if (j > 0u) {
        [[unroll]] for (uint e = 0u; e < 64u; ++e) sp[e] = scr[scr0 + (j - 1u) * STATE_WORDS + e * 256u + tid];
      } else {
        [[unroll]] for (uint e = 0u; e < 64u; ++e) sp[e] = segment_start(seg, ck_at, bh, ty, tx, e);
      }
      const float g = gates[bt * pc.nv + h];
      const float beta = gates[(n_bt + bt) * pc.nv + h];
      const float arg = gates[(2u * n_bt + bt) * pc.nv + h];
      const float inv = inv_rms[bt * pc.nv + h];
      float o = 0.0, wsz = 0.0, d = 0.0;
      if (tid < D) {
        sq[tid] = qkn[qk_at(QK_Q, bt, ko) + tid];
        sk[tid] = qkn[qk_at(QK_K, bt, ko) + tid];
        svc[tid] = y[y_at(bt, h) + tid] - kvs[kvs0 + j * D + tid];  // v - kv
        // gated RMSNorm backward: out = o * inv * w * silu(z)
        o = o_pre[vi];
        const float zz = STREAM_AT(has(BF16_Z), z_h, z, vi);
        d = STREAM_AT(has(BF16_DOUT), dout_h, dout, vi);
        wsz = norm_w[tid] * silu(zz);
        red[tid] = d * wsz * o;
        const float dzi = d * o * inv * norm_w[tid] * silu_bwd(zz);
        if (has(BF16_DZ))
          bf16_row[tid] = dzi;  // stored after the next barrier
        else
          dz[vi] = dzi;
      }
      barrier();
      for (uint s2 = D / 2u; s2 > 0u; s2 >>= 1u) {
        if (tid < s2) red[tid] += red[tid + s2];
        barrier();
      }
      const float coef = red[0] / float(D) * inv * inv * inv;
      barrier();
      if (has(BF16_DZ)) BF16_ROW_STORE(dz_h, vi - tid, tid)
      if (tid < D) {
        sdo[tid] = inv * wsz * d - o * coef;  // do
        su[tid] = beta * svc[tid];            // u
      }
      barrier();
      // dS += q^ (x) do ; dq^ = S_t do (row sums)
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        float acc = 0.0;
        const float qi = sq[ty * 8u + i];
        [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) {
          const float dj = sdo[tx * 8u + jj];
          ds[i * 8u + jj] += qi * dj;
          acc += st[i * 8u + jj] * dj;
        }
        row_partial(ty, tx, i, acc);
      }
      barrier();
      if (tid < D) dqk[(bt * pc.nv + h) * D + tid] = reduce16(tid);
      barrier();
      // du = dS^T k^ (column sums)
      [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) {
        float acc = 0.0;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) acc += ds[i * 8u + jj] * sk[ty * 8u + i];
        col_partial(ty, tx, jj, acc);
      }
      barrier();
      float du = 0.0;
      if (tid < D) du = reduce16(tid);
      barrier();
      // dk^ part one = dS u (row sums)
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        float acc = 0.0;
        [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) acc += ds[i * 8u + jj] * su[tx * 8u + jj];
        row_partial(ty, tx, i, acc);
      }
      barrier();
      if (tid < D) {
        sdk[tid] = reduce16(tid);
        dy[bt * pc.c_dim + 2u * pc.nk * D + h * D + tid] = beta * du;  // dv
        sdkv[tid] = -beta * du;                                         // dkv
      }
      barrier();
      if (tid < D) red[tid] = du * svc[tid];  // dbeta partials
      barrier();
      for (uint s2 = D / 2u; s2 > 0u; s2 >>= 1u) {
        if (tid < s2) red[tid] += red[tid + s2];
        barrier();
      }
      const float dbeta = red[0];
      barrier();
      // dS_pre = dS + k^ (x) dkv ; dk^ += (g S_{t-1}) dkv ; dg = <dS_pre, S_{t-1}> ; dS = g dS_pre
      float dg_part = 0.0;
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        float acc = 0.0;
        const float ki = sk[ty * 8u + i];
        [[unroll]] for (uint jj = 0u; jj < 8u; ++jj) {
          const uint e = i * 8u + jj;
          const float dkv = sdkv[tx * 8u + jj];
          const float dspre = ds[e] + ki * dkv;
          acc += (sp[e] * g) * dkv;
          dg_part += dspre * sp[e];
          ds[e] = g * dspre;
        }
        row_partial(ty, tx, i, acc);
      }
      barrier();
      if (tid < D) dqk[((n_bt + bt) * pc.nv + h) * D + tid] = sdk[tid] + reduce16(tid);
      barrier();
      red[tid] = dg_part;
      barrier();
      for (uint s2 = 128u; s2 > 0u; s2 >>= 1u) {
        if (tid < s2) red[tid] += red[tid + s2];
        barrier();
      }
      if (tid == 0u) {
        const float dg = red[0];
        da[bt * pc.nv + h] = dg * g * (-ea) * sigmoid(arg);
        db[bt * pc.nv + h] = dbeta * beta * (1.0 - beta);
      }
      [[unroll]] for (uint e = 0u; e < 64u; ++e) st[e] = sp[e];
      barrier();
    }
  }
  if (has(STATE_H0))
    [[unroll]] for (uint e = 0u; e < 64u; ++e) dh0[carried_at(bh, ty, tx, e)] = ds[e];
}
