#version 460
// q/k backward, column-split and chunked families: one subgroup per (b, t, k-head) row, SG lanes
// (the subgroup size, required at pipeline creation), lane l holding elements l + SG e (e < D / SG)
// of the row; 128 / SG rows per workgroup. Its sums are subgroup sums: no shared memory, no barrier.
// Adds up the per-workgroup partials of rec_bwd2 over the NWG column blocks and the rep value heads
// of this key head and applies the l2-norm backward into dy's q and k parts. For each of those value
// heads it turns rec_bwd2's du (left in dy's v part) into dv = beta du and dbeta = <du, v - kv>, and
// gives
//   da = dg * g * (-exp(a_log)) * sigmoid(a + dt_bias),  db = dbeta * beta (1 - beta)
// The chunked backward's build (-DCHUNKED) reads one record per (token, v-head) from its gradient
// pass, [dq^, dk^, d(log g) = dg * g, dbeta] (RW words), and finds dv already in dy.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 128) in;
layout(constant_id = 0) const uint SG = 32;  // 8 .. 64 (a power of two)
const uint PER = D / SG;                     // elements per lane

#ifdef CHUNKED
#define NWG 1u
#define PW 258u
#else
#define NWG 4u
#define PW 257u
#endif

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 1) readonly buffer Nq { float nq[]; };        // [2][B, T, nk]
layout(set = 0, binding = 2) readonly buffer Dqk { float dqk[]; };      // [B, T, nv][NWG][PW]
layout(set = 0, binding = 3) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 4) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 5) buffer Dy { float dy[]; };                 // [B, T, C]: writes q and k parts
layout(set = 0, binding = 6) writeonly buffer Da { float da[]; };       // [B, T, nv]
layout(set = 0, binding = 7) writeonly buffer Db { float db[]; };       // [B, T, nv]
layout(set = 0, binding = 8) readonly buffer Kv { float kv[]; };        // [B, T, nv*D] kv per step (tape)
layout(set = 0, binding = 9) readonly buffer Qkn { float qkn[]; };      // [2][B, T, nk, D] q^, k^

#include "l2_bwd.glsl"

void main() {
  const uint idx = linear_group() * (128u / SG) + gl_SubgroupID;  // (b*T + t)*nk + key head
  if (idx >= pc.nb * pc.t * pc.nk) return;  // the whole subgroup: nothing below waits for others
  const uint lane = gl_SubgroupInvocationID;
  const uint ko = idx % pc.nk;
  const uint bt = idx / pc.nk;
  const uint n_bt = pc.nb * pc.t;
  const uint rep = pc.nv / pc.nk;
  float dq[PER], dk[PER];
  [[unroll]] for (uint e = 0u; e < PER; ++e) {
    dq[e] = 0.0;
    dk[e] = 0.0;
  }
  for (uint r = 0u; r < rep; ++r) {
    const uint h = ko * rep + r;
    const uint at = (bt * pc.nv + h) * NWG * PW;
    [[unroll]] for (uint w = 0u; w < NWG; ++w)
      [[unroll]] for (uint e = 0u; e < PER; ++e) {
        dq[e] += dqk[at + w * PW + lane + SG * e];
        dk[e] += dqk[at + w * PW + D + lane + SG * e];
      }
    const float beta = gates[(n_bt + bt) * pc.nv + h];
#ifdef CHUNKED
    const float dbeta = dqk[at + 257u];
    // d(log g) = dg g: exactly 0 where g underflows (the record's sums of the chunk's terms cancel
    // there only to rounding, and A = exp(a_log) would scale what is left)
    const float dlogg = gates[bt * pc.nv + h] == 0.0 ? 0.0 : dqk[at + 256u];
#else
    float dbeta_part = 0.0;  // the lane's share of <du, v - kv>
    [[unroll]] for (uint e = 0u; e < PER; ++e) {
      const uint c = lane + SG * e;
      const uint vi = bt * pc.c_dim + 2u * pc.nk * D + h * D + c;  // column c of head h's v in dy
      const float du = dy[vi];
      dy[vi] = beta * du;  // dv
      dbeta_part += du * (y[y_at(bt, h) + c] - kv[(bt * pc.nv + h) * D + c]);
    }
    const float dbeta = subgroupAdd(dbeta_part);
    float dg = 0.0;
    [[unroll]] for (uint w = 0u; w < NWG; ++w) dg += dqk[at + w * PW + 256u];
    const float dlogg = dg * gates[bt * pc.nv + h];
#endif
    if (lane == 0u) {
      const float arg = gates[(2u * n_bt + bt) * pc.nv + h];
      da[bt * pc.nv + h] = dlogg * (-exp(a_log[h])) * sigmoid(arg);
      db[bt * pc.nv + h] = dbeta * beta * (1.0 - beta);
    }
  }
  // the l2-norm backward: <dq^, q^> and <dk^, k^> over the row, then each element
  const uint n = pc.nb * pc.t * pc.nk;
  float qh[PER], kh[PER];
  vec2 dots_part = vec2(0.0);
  [[unroll]] for (uint e = 0u; e < PER; ++e) {
    qh[e] = qkn[qk_at(QK_Q, bt, ko) + lane + SG * e];
    kh[e] = qkn[qk_at(QK_K, bt, ko) + lane + SG * e];
    dots_part += vec2(dq[e] * qh[e], dk[e] * kh[e]);
  }
  const vec2 dots = subgroupAdd(dots_part);
  const vec2 norms = vec2(nq[idx], nq[n + idx]);
  [[unroll]] for (uint e = 0u; e < PER; ++e) {
    const vec2 raw = l2_backward(dq[e], dk[e], qh[e], kh[e], dots, norms);
    dy[bt * pc.c_dim + ko * D + lane + SG * e] = raw.x;
    dy[bt * pc.c_dim + pc.nk * D + ko * D + lane + SG * e] = raw.y;
  }
}
