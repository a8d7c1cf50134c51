#version 460
// q/k backward, column-split family: one workgroup of D invocations per (b, t, k-head). Adds up the
// per-workgroup partials of rec_bwd2 over the NWG column blocks and the rep value heads of this key
// head and applies the l2-norm backward into dy's q and k parts. For each of those value heads it
// turns rec_bwd2's du (left in dy's v part) into dv = beta du and dbeta = <du, v - kv>, and gives
//   da = dg * g * (-exp(a_log)) * sigmoid(a + dt_bias),  db = dbeta * beta (1 - beta)
// The chunked backward's build (-DCHUNKED) reads one record per (token, v-head) from chunk_grads,
// [dq^, dk^, d(log g) = dg * g, dbeta], and finds dv already in dy.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 128) in;

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

#include "workgroup_sum.glsl"
#define L2_SUBGROUP_SUMS
#include "l2_bwd.glsl"

void main() {
  const uint idx = linear_group();  // (b*T + t)*nk + key head
  if (idx >= pc.nb * pc.t * pc.nk) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint ko = idx % pc.nk;
  const uint bt = idx / pc.nk;
  const uint n_bt = pc.nb * pc.t;
  const uint rep = pc.nv / pc.nk;
  float dq = 0.0, dk = 0.0;
  for (uint r = 0u; r < rep; ++r) {
    const uint at = (bt * pc.nv + ko * rep + r) * NWG * PW;
    [[unroll]] for (uint w = 0u; w < NWG; ++w) {
      dq += dqk[at + w * PW + tid];
      dk += dqk[at + w * PW + D + tid];
    }
  }
  for (uint r = 0u; r < rep; ++r) {
    const uint h = ko * rep + r;
    const float beta = gates[(n_bt + bt) * pc.nv + h];
    const uint at = (bt * pc.nv + h) * NWG * PW;
#ifdef CHUNKED
    const float dbeta = dqk[at + 257u];
    const float dlogg = dqk[at + 256u];
#else
    const uint vi = bt * pc.c_dim + 2u * pc.nk * D + h * D + tid;  // column tid of head h's v in dy
    const float du = dy[vi];
    dy[vi] = beta * du;  // dv
    const float dbeta = workgroup_sum(du * (y[y_at(bt, h) + tid] - kv[(bt * pc.nv + h) * D + tid]));
    float dg = 0.0;
    [[unroll]] for (uint w = 0u; w < NWG; ++w) dg += dqk[at + w * PW + 256u];
    const float dlogg = dg * gates[bt * pc.nv + h];
#endif
    if (tid == 0u) {
      const float arg = gates[(2u * n_bt + bt) * pc.nv + h];
      da[bt * pc.nv + h] = dlogg * (-exp(a_log[h])) * sigmoid(arg);
      db[bt * pc.nv + h] = dbeta * beta * (1.0 - beta);
    }
  }
  float dq_raw, dk_raw;
  l2_backward(tid, idx, dq, dk, dq_raw, dk_raw);
  dy[bt * pc.c_dim + ko * D + tid] = dq_raw;
  dy[bt * pc.c_dim + pc.nk * D + ko * D + tid] = dk_raw;
}
