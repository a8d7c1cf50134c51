#version 460
// Forward recurrence, column-split family: one workgroup per (window b, v-head h, block of 32
// columns); see column_split.glsl for the layout. Per step, per column j:
//   S[:,j] <- g S[:,j];  kv_j = S[:,j] . k^;  u_j = beta (v_j - kv_j);  S[:,j] += k^ u_j;  o_j = S[:,j] . q^
// Writes o (pre-norm; norm_fwd2 applies the gated RMSNorm). With pc.keep it also records kv per step
// (the backward's replay then rebuilds u bit for bit without the dot product) and S at the start of
// every segment but the first: slot seg-1 = [col][row], 16 KiB per 32-column block.
// Per-step operands are staged through shared memory TS steps at a time: one coalesced load and two
// barriers per block instead of a global-memory stall every step.
#include "common.glsl"
#include "column_split.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, C]: v at 2*nk*D + h*D
layout(set = 0, binding = 1) readonly buffer Qkn { vec4 qkn4[]; };      // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 3) writeonly buffer O { float o_pre[]; };     // [B, T, nv*D]
layout(set = 0, binding = 4) writeonly buffer Kv { float kv_out[]; };   // [B, T, nv*D] (pc.keep)
layout(set = 0, binding = 5) writeonly buffer Ck { vec4 ck4[]; };       // [B, nv, max(nseg-1,1), D cols, D/4]

#define TS 16u
shared vec4 fq[TS * D / 4u], fk[TS * D / 4u];  // [step][row/4]
shared float fv[TS * COLS];                    // [step][column of the block]
shared float fg[TS], fb[TS];

void main() {
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint lid = gl_LocalInvocationIndex;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint b = bh / pc.nv, h = bh % pc.nv, ko = h / (pc.nv / pc.nk);
  const uint cw = column_in_workgroup(), rg = row_group();
  const uint col = blk * COLS + cw;
  const uint n_bt = pc.nb * pc.t;
  const uint slots = max(pc.nseg, 2u) - 1u;
  float s[RPL];
  [[unroll]] for (uint r = 0u; r < RPL; ++r) s[r] = 0.0;

  for (uint tb = 0u; tb < pc.t; tb += TS) {
    const uint nst = min(TS, pc.t - tb);
    barrier();  // the previous block's readers are done
    for (uint e = lid; e < TS * D / 4u; e += WG_SIZE) {
      const uint j = e / (D / 4u), r4 = e % (D / 4u);
      if (j < nst) {
        const uint bt = b * pc.t + tb + j;
        fq[e] = qkn4[(bt * pc.nk + ko) * (D / 4u) + r4];
        fk[e] = qkn4[((n_bt + bt) * pc.nk + ko) * (D / 4u) + r4];
      }
    }
    for (uint e = lid; e < TS * COLS; e += WG_SIZE) {
      const uint j = e / COLS;
      if (j < nst) fv[e] = y[(b * pc.t + tb + j) * pc.c_dim + 2u * pc.nk * D + h * D + blk * COLS + e % COLS];
    }
    if (lid < nst) {
      const uint bt = b * pc.t + tb + lid;
      fg[lid] = gates[bt * pc.nv + h];
      fb[lid] = gates[(n_bt + bt) * pc.nv + h];
    }
    barrier();
    for (uint j = 0u; j < nst; ++j) {
      const uint ti = tb + j;
      const uint bt = b * pc.t + ti;
      const float g = fg[j], beta = fb[j];
      float k[RPL];
      [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
        const vec4 kk = fk[j * (D / 4u) + rg * 4u + q4];
        k[4u * q4] = kk.x; k[4u * q4 + 1u] = kk.y; k[4u * q4 + 2u] = kk.z; k[4u * q4 + 3u] = kk.w;
      }
      float p0 = 0.0, p1 = 0.0;  // two chains: half the FMA latency on the critical path
      [[unroll]] for (uint r = 0u; r < RPL; r += 2u) {
        s[r] *= g;
        s[r + 1u] *= g;
        p0 = fma(s[r], k[r], p0);
        p1 = fma(s[r + 1u], k[r + 1u], p1);
      }
      const float kv = column_sum(p0 + p1);
      const float u = beta * (fv[j * COLS + cw] - kv);
      [[unroll]] for (uint r = 0u; r < RPL; ++r) s[r] = fma(k[r], u, s[r]);
      float o0 = 0.0, o1 = 0.0;
      [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
        const vec4 qq = fq[j * (D / 4u) + rg * 4u + q4];
        o0 = fma(s[4u * q4], qq.x, o0);
        o1 = fma(s[4u * q4 + 1u], qq.y, o1);
        o0 = fma(s[4u * q4 + 2u], qq.z, o0);
        o1 = fma(s[4u * q4 + 3u], qq.w, o1);
      }
      const float o = column_sum(o0 + o1);
      const uint vi = bt * pc.nv * D + h * D + col;
      if (rg == 0u) {
        o_pre[vi] = o;
        if (pc.keep != 0u) kv_out[vi] = kv;
      }
      const uint seg_next = (ti + 1u) / pc.cs;
      if (pc.keep != 0u && (ti + 1u) % pc.cs == 0u && seg_next < pc.nseg) {
        const uint at = ((bh * slots + seg_next - 1u) * D * D + col * D + rg * RPL) / 4u;
        [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4)
          ck4[at + q4] = vec4(s[4u * q4], s[4u * q4 + 1u], s[4u * q4 + 2u], s[4u * q4 + 3u]);
      }
    }
  }
}
