#version 460
// Chunked backward, pass 2 of 4: the only serial pass. One workgroup per (window b, v-head h, block
// of 32 state columns) walks the chunks in reverse with dS (the gradient of the chunk's end state;
// after the window dht with STATE_CARRY, else zero) in registers, and leaves the last (the
// gradient of the window's start state) in dh0, where h0 was given. Columns are independent here.
// Per chunk (chunk.glsl for W, lg):
//   dU = P^T dO + K~ dS                           the gradient of the chunk's u rows (P^T dO: chunk_prep)
//   dS <- Gamma dS + Q^T diag(gamma) dO - W^T dU   the gradient of its start state
// dU and the chunk's dS (before the update) leave for chunk_values and chunk_grads, which do the rest in parallel.
// dS lives in registers: a group of 32 invocations holds 4 columns, each invocation 4 rows of them,
// so that dU's sums over the rows stay within the group (a transpose-reduce over its lanes, through
// shared memory only where a subgroup is smaller than the group). The chunk's rows pass through
// double-buffered shared memory SUB at a time (a round), each round's operands loaded during the
// round before, with the log decays its invocation applies (no shared copy of the chunk's gates):
// one workgroup barrier a round, where a subgroup holds the group (dU's exchange within the group
// then needs only the subgroup's).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#define WG 256u  // invocations
layout(local_size_x = WG) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8 .. 128

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (chunk_prep)
layout(set = 0, binding = 2) readonly buffer Wm4 { vec4 w4[]; };        // [B, T, nv, D/4] W (chunk_prep)
layout(set = 0, binding = 3) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 4) buffer Du { float du[]; };                 // [B, T, nv*D] P^T dO in, dU out
layout(set = 0, binding = 5) writeonly buffer Dsc4 { vec4 dsc4[]; };   // [B, nv, max(nch-1,1), D cols, D rows / 4]
layout(set = 0, binding = 6) readonly buffer Dht { float dht[]; };      // [B, nv, D, D] S[k][v] (STATE_CARRY)
layout(set = 0, binding = 7) writeonly buffer Dh0 { float dh0[]; };     // [B, nv, D, D]

#define CHUNK_NO_GATES
#define CHUNK_NO_SHARED_GATES
#include "chunk.glsl"

// 4 state columns a group: a staged k^, q^ or W vec4 feeds 4 columns' FMAs, and dU's transpose-reduce
// over the group's 32 lanes ends with one value a lane (NV = GL)
#define CPG 4u               // state columns per group
#define GL (D / 4u)          // invocations of a group: 4 rows each; group g = tid / GL holds columns CPG g ..
#define NG (WG / GL)         // groups
#define COLS (NG * CPG)      // state columns per workgroup: 32, 4 workgroups per head (kDstateBlocks)
#define NWG (D / COLS)       // workgroups per (window, head)
#define SUB (WG / (D / 4u))  // chunk rows per round: SUB * D/4 = WG, one vec4 per invocation
#define NV (CPG * SUB)       // dU values a group makes per round: SUB rows x CPG columns, v = CPG i + column
// The group's lanes within one subgroup, and the halving steps of dU's transpose-reduce made there
// (one per lane bit within the subgroup)
const uint LS = SG < GL ? SG : GL;
const uint HALVINGS = LS >= 32u ? 5u : LS >= 16u ? 4u : LS >= 8u ? 3u : LS >= 4u ? 2u : 1u;
const uint NJ = NV >> HALVINGS;  // values a lane holds after them

shared vec4 sk[2][SUB * D / 4u], sq[2][SUB * D / 4u], sw[2][SUB * D / 4u];  // k^, gamma q^, W [row i][r/4]
shared vec4 sdo[2][SUB * NG], sdu[SUB * NG];  // dO, dU [row i][group g]: columns CPG g ..
shared float red[LS < GL ? WG * NJ : 1u];     // dU's partial sums across the subgroups of a group

// One thread's share of a round's operands, loaded a round ahead (software pipelining: the loads of
// the next round are in flight while this one computes).
struct Round {
  vec4 k, q, w;  // k^, q^, W of row e / (D/4), element group e % (D/4), e = tid (SUB*D/4 = WG)
  float dO;      // dO of row tid / COLS, column tid % COLS (tid < SUB * COLS)
  float pdo;     // P^T dO of the value the thread's lane owns (owned_value)
  vec2 lgq;      // lg (hi, lo) of the row whose q^ it stages
  vec2 lgu;      // lg of the owned value's row
  vec2 lge;      // lg of the chunk's last row (log Gamma), with a chunk's first round only
};

// The dU value (v = CPG i + column) that lane t of a group totals: where the whole group is one
// subgroup's, the one its transpose-reduce left it; else t.
uint owned_value(uint t) { return LS == GL ? bitfieldReverse(t) >> (32u - HALVINGS) : t; }

Round fetch(Chunk k, uint i0, uint tid, uint blk) {
  Round f;
  f.k = vec4(0.0); f.q = vec4(0.0); f.w = vec4(0.0); f.dO = 0.0; f.pdo = 0.0;
  const uint i = i0 + tid / (D / 4u), r4 = tid % (D / 4u);
  f.lgq = chunk_lg(k, min(i, CH - 1u));
  f.lge = i0 == 0u ? chunk_lg(k, CH - 1u) : vec2(0.0);
  if (i < k.L) {
    const uint bt = k.b * pc.t + k.t0 + i;
    f.k = qkn4[qk_at(QK_K, bt, k.ko) / 4u + r4];
    f.q = qkn4[qk_at(QK_Q, bt, k.ko) / 4u + r4];
    f.w = w4[head_row(k, i) * (D / 4u) + r4];
  }
  const uint iu = i0 + tid / COLS;
  if (iu < k.L && tid < SUB * COLS) f.dO = do_in[head_row(k, iu) * D + blk * COLS + tid % COLS];
  const uint t = tid % GL, v = owned_value(t), id = i0 + v / CPG;
  f.lgu = chunk_lg(k, min(id, CH - 1u));
  if (id < k.L) f.pdo = du[head_row(k, id) * D + blk * COLS + CPG * (tid / GL) + v % CPG];
  return f;
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint slots = max(nch, 2u) - 1u;
  const uint g = tid / GL, t = tid % GL;  // columns blk*COLS + CPG g + c of dS, rows 4t .. 4t + 3
  const uint col = blk * COLS + CPG * g;
  vec4 ds[CPG];  // dS (the gradient of the current chunk's end state) [column c][its 4 rows]
  [[unroll]] for (uint c = 0u; c < CPG; ++c)
    [[unroll]] for (uint l = 0u; l < 4u; ++l)
      ds[c][l] = has(STATE_CARRY) ? dht[(bh * D + 4u * t + l) * D + col + c] : 0.0;
  Round next = fetch(chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u), 0u, tid, blk);

  uint buf = 0u;
  for (uint cc = 0u; cc < nch; ++cc) {
    const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u - cc);
    // The chunk's end-state gradient, for chunk_values (the last chunk's is dht: not stored).
    if (k.c + 1u < nch)
      [[unroll]] for (uint c = 0u; c < CPG; ++c) dsc4[((bh * slots + k.c) * D + col + c) * (D / 4u) + t] = ds[c];
    vec4 acc[CPG];
    const vec2 lge = next.lge;  // (the chunk's first round is next)
    [[unroll]] for (uint c = 0u; c < CPG; ++c) acc[c] = exp(lge.x + lge.y) * ds[c];

    for (uint i0 = 0u; i0 < k.L; i0 += SUB, buf ^= 1u) {
      // (buffer buf was last read two rounds ago, before the last round's barrier)
      const Round cur = next;
      sk[buf][tid] = cur.k;
      sq[buf][tid] = exp(cur.lgq.x + cur.lgq.y) * cur.q;
      sw[buf][tid] = cur.w;
      if (tid < SUB * COLS) sdo[buf][(tid / COLS) * NG + (tid % COLS) / CPG][tid % CPG] = cur.dO;
      if (i0 + SUB < k.L) next = fetch(k, i0 + SUB, tid, blk);
      else if (k.c > 0u) next = fetch(chunk_of(bh / pc.nv, bh % pc.nv, k.c - 1u), 0u, tid, blk);
      barrier();
      // dU[i][j] = (P^T dO)[i][j] + (Gamma / gamma_i) <k_i, dS[:, j]>: the lane's 4 rows of each,
      // then summed over the group
      float p[NV];
      [[unroll]] for (uint i = 0u; i < SUB; ++i) {
        const vec4 k4 = sk[buf][i * (D / 4u) + t];
        [[unroll]] for (uint c = 0u; c < CPG; ++c) p[CPG * i + c] = dot(k4, ds[c]);
      }
      // dS's first update term, sum_i gamma_i q_i[r] dO[i][j], beside the transpose-reduce's shuffles
      [[unroll]] for (uint i = 0u; i < SUB; ++i) {
        const vec4 qv = sq[buf][i * (D / 4u) + t], a = sdo[buf][i * NG + g];
        [[unroll]] for (uint c = 0u; c < CPG; ++c) acc[c] = fma(qv, vec4(a[c]), acc[c]);
      }
      // transpose-reduce: each step halves the values a lane holds, over lane bit m (the first
      // steps over the low bits, all within the subgroup)
      [[unroll]] for (uint h = 0u; h < HALVINGS; ++h) {
        const uint m = 1u << h, half_ = NV >> (h + 1u);
        const bool up = (t & m) != 0u;
        [[unroll]] for (uint j = 0u; j < half_; ++j) {
          const float keep = up ? p[j + half_] : p[j], send = up ? p[j] : p[j + half_];
          p[j] = keep + subgroupShuffleXor(send, m);
        }
      }
      float total = p[0];  // the group within one subgroup: lane t holds value owned_value(t)
      if (LS < GL) {  // partial sums over each subgroup's lanes, added across the group's subgroups
        [[unroll]] for (uint j = 0u; j < NJ; ++j) red[tid * NJ + j] = p[j];
        barrier();
        const uint lane = bitfieldReverse(t / NJ) >> (32u - HALVINGS);  // the lane holding value t
        total = 0.0;
        [[unroll]] for (uint s = 0u; s < GL / LS; ++s) total += red[(g * GL + s * LS + lane) * NJ + t % NJ];
      }
      {
        const uint v = owned_value(t), i = i0 + v / CPG;
        float x = 0.0;
        if (i < k.L) {
          x = cur.pdo + exp(lg_diff(lge.x, lge.y, cur.lgu.x, cur.lgu.y)) * total;
          du[head_row(k, i) * D + col + v % CPG] = x;
        }
        sdu[(v / CPG) * NG + g][v % CPG] = x;
      }
      // sdu's slots of a group are its own: where the group is one subgroup, that subgroup's barrier
      // (the next round's writes of sdu come after its workgroup barrier)
      if (LS == GL) {
        subgroupMemoryBarrierShared();
        subgroupBarrier();
      } else {
        barrier();
      }
      // dS[r][j] -= sum_i W[i][r] dU[i][j], for the round's rows
      [[unroll]] for (uint i = 0u; i < SUB; ++i) {
        const vec4 wv = sw[buf][i * (D / 4u) + t], b = sdu[i * NG + g];
        [[unroll]] for (uint c = 0u; c < CPG; ++c) acc[c] = fma(-wv, vec4(b[c]), acc[c]);
      }
    }
    ds = acc;
  }
  if (has(STATE_H0))
    [[unroll]] for (uint c = 0u; c < CPG; ++c)
      [[unroll]] for (uint l = 0u; l < 4u; ++l) dh0[(bh * D + 4u * t + l) * D + col + c] = ds[c][l];
}
