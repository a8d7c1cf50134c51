#version 460
// Backward recurrence (checkpointed BPTT), column-split family: one workgroup per (window b, v-head h,
// block of 32 columns); see column_split.glsl. Segments of CS steps are walked in reverse. Each is
// replayed from its checkpoint with the recorded kv (u = beta (v - kv) exactly as in the forward)
// into a register history: hist[j] = S after step t0+j-1, hist[0] = the checkpoint. The history
// stays on chip because in memory it would be 32 bytes per state element and step, several times the
// backward's whole budget of memory traffic (its cost: registers, one workgroup per SM). Then the reverse sweep of
// docs/spec.md, per column j, with dS carried in registers across segments:
//   dS += q^ do;  dq^ += S_t do (a sum over columns);  du = dS . k^;  dkv = -beta du;
//   dk^ += dS u + (g S_{t-1}) dkv (over columns);
//   e = dS + k^ dkv;  dg += <e, S_{t-1}>;  dS = g e
// The sums over columns leave as per-workgroup partials, dqk [B, T, nv][NWG][257] (dq^ 0..127,
// dk^ 128..255, dg 256), that qk_bwd2 adds up over the workgroups and the rep heads. du leaves in
// dy's v part; qk_bwd2 turns it into dv = beta du and dbeta = <du, v - kv> (no reduction here).
#include "common.glsl"
#include "column_split.glsl"
layout(local_size_x = 256) in;

// CS: the most steps a segment may have (the history's size). GPU builds fix it at compile time
// (-DCSMAX=4, 8, 16: every register index a constant once the loops are unrolled); the rolled build
// for CPU drivers takes it as a specialization constant. The segment length itself is pc.cs <= CS.
#ifdef CSMAX
#define CS CSMAX
#else
layout(constant_id = 1) const uint CS = 8;
#endif
// The segment's steps are unrolled by hand (one include of the step per J, below) so that every
// hist[] index is a constant and the history stays in registers: drivers and the SPIR-V optimizer
// leave a loop with barriers rolled, and hist[] then lives in memory. CPU drivers (lavapipe) take
// minutes to compile the unrolled code; they get a rolled build (-DROLLED_SEGMENTS) of the same steps.

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 1) readonly buffer Qkn { vec4 qkn4[]; };      // [2][B, T, nk, D/4]
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 3) readonly buffer Kv { float kv_in[]; };     // [B, T, nv*D]
layout(set = 0, binding = 4) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 5) readonly buffer Ck { vec4 ck4[]; };        // [B, nv, max(nseg-1,1), D cols, D/4]
layout(set = 0, binding = 6) writeonly buffer Dqk { float dqk[]; };     // [B, T, nv][NWG][257] partials
layout(set = 0, binding = 7) writeonly buffer Dy { float dy[]; };       // [B, T, C]: writes the v part
// the carried state: the first segment replays from h0 (STATE_H0, else zero); dS starts at dht
// (STATE_CARRY, else zero) and ends as dh0 (written where h0 was given). [B, nv, D, D] S[k][v] each.
layout(set = 0, binding = 8) readonly buffer H0 { float h0[]; };
layout(set = 0, binding = 9) readonly buffer Dht { float dht[]; };
layout(set = 0, binding = 10) writeonly buffer Dh0 { float dh0[]; };

#define PW 257u  // words per partial record
// Row sums over the columns of a subgroup: butterfly stages across the column lane bits. After them
// each lane holds VALS rows: rg*16 + (its column-bit offsets) + 0 .. VALS-1.
const uint STAGES = SG >= 64u ? 3u : (SG >= 32u ? 2u : (SG >= 16u ? 1u : 0u));
const uint VALS = RPL >> STAGES;
// Subgroup partials meet in SLOTS shared records, in ROUNDS rounds when there are more subgroups.
const uint NSUB = WG_SIZE / SG;
const uint SLOTS = NSUB < 8u ? NSUB : 8u;
const uint ROUNDS = NSUB / SLOTS;
// Records of RB steps are buffered before one barrier sums them: the sweep's warps then meet once
// every RB steps instead of every step. (With ROUNDS > 1 every step has barriers anyway: RB = 1.)
const uint RB = ROUNDS > 1u ? 1u : (CS > 8u ? 2u : 4u);

shared vec4 bq[CS * D / 4u], bk[CS * D / 4u];  // [step][row/4]
shared float bv[CS * COLS], bkv[CS * COLS], bdo[CS * COLS];  // [step][column of the block]
shared float bg[CS], bb[CS];
shared float wpart[RB * SLOTS * PW];  // [buffered step][slot][record]

// One butterfly stage across the column lane bit `mask`: the lane keeps half of its n values (the
// upper half where its bit is set) and adds its partner's copy of that half.
#define BUTTERFLY_STAGE(a, n, mask)                                                        \
  {                                                                                        \
    const bool hi = (gl_SubgroupInvocationID & (mask)) != 0u;                              \
    [[unroll]] for (uint i = 0u; i < (n) / 2u; ++i) {                                      \
      const float keep = hi ? a[i + (n) / 2u] : a[i];                                      \
      const float give = hi ? a[i] : a[i + (n) / 2u];                                      \
      a[i] = keep + subgroupShuffleXor(give, (mask));                                      \
    }                                                                                      \
  }

// In place: a[0 .. VALS-1] become the sums over the subgroup's columns of this lane's share of rows.
// Stages written out (no loop over them), so every index into a[] is a constant.
void butterfly(inout float a[RPL]) {
  if (STAGES > 0u) BUTTERFLY_STAGE(a, 16u, 8u)
  if (STAGES > 1u) BUTTERFLY_STAGE(a, 8u, 16u)
  if (STAGES > 2u) BUTTERFLY_STAGE(a, 4u, 32u)
}

// The first row of the lane's share after butterfly(): the upper half at every stage whose bit is set.
uint butterfly_row0() {
  const uint lane = gl_SubgroupInvocationID;
  uint r = row_group() * RPL;
  if (STAGES > 0u && (lane & 8u) != 0u) r += 8u;
  if (STAGES > 1u && (lane & 16u) != 0u) r += 4u;
  if (STAGES > 2u && (lane & 32u) != 0u) r += 2u;
  return r;
}

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
  const uint sub = gl_SubgroupID;
  const uint row0 = butterfly_row0();

  float ds[RPL];  // dS[rg*RPL + r][col]
  [[unroll]] for (uint r = 0u; r < RPL; ++r) ds[r] = has(STATE_CARRY) ? dht[(bh * D + rg * RPL + r) * D + col] : 0.0;
  float hist[CS + 1u][RPL];

  for (uint sgi = 0u; sgi < pc.nseg; ++sgi) {
    const uint seg = pc.nseg - 1u - sgi;
    const uint t0 = seg * pc.cs;
    const uint nst = min(pc.cs, pc.t - t0);
    // ---- stage the segment's operands ----
    barrier();
    for (uint e = lid; e < CS * D / 4u; e += WG_SIZE) {
      const uint j = e / (D / 4u), r4 = e % (D / 4u);
      if (j < nst) {
        const uint bt = b * pc.t + t0 + j;
        bq[e] = qkn4[qk_at(QK_Q, bt, ko) / 4u + r4];
        bk[e] = qkn4[qk_at(QK_K, bt, ko) / 4u + r4];
      }
    }
    for (uint e = lid; e < CS * COLS; e += WG_SIZE) {
      const uint j = e / COLS;
      if (j < nst) {
        const uint bt = b * pc.t + t0 + j;
        const uint c = h * D + blk * COLS + e % COLS;
        bv[e] = y[y_at(bt, 0u) + c];
        bkv[e] = kv_in[bt * pc.nv * D + c];
        bdo[e] = do_in[bt * pc.nv * D + c];
      }
    }
    if (lid < nst) {
      const uint bt = b * pc.t + t0 + lid;
      bg[lid] = gates[bt * pc.nv + h];
      bb[lid] = gates[(n_bt + bt) * pc.nv + h];
    }
    // ---- the segment's start state ----
    if (seg > 0u) {
      const uint at = ((bh * slots + seg - 1u) * D * D + col * D + rg * RPL) / 4u;
      [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
        const vec4 c = ck4[at + q4];
        hist[0][4u * q4] = c.x; hist[0][4u * q4 + 1u] = c.y; hist[0][4u * q4 + 2u] = c.z; hist[0][4u * q4 + 3u] = c.w;
      }
    } else {
      [[unroll]] for (uint r = 0u; r < RPL; ++r) hist[0][r] = has(STATE_H0) ? h0[(bh * D + rg * RPL + r) * D + col] : 0.0;
    }
    barrier();
    // ---- replay: hist[J+1] = g hist[J] + k^ u, with the forward's exact operations ----
#ifdef ROLLED_SEGMENTS
    [[dont_unroll]] for (uint j_ = 0u; j_ < CS; ++j_) {
#define J j_
#include "rec_bwd2_replay_step.glsl"
#undef J
    }
#else
#if CS > 0
#define J 0u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 1
#define J 1u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 2
#define J 2u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 3
#define J 3u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 4
#define J 4u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 5
#define J 5u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 6
#define J 6u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 7
#define J 7u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 8
#define J 8u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 9
#define J 9u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 10
#define J 10u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 11
#define J 11u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 12
#define J 12u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 13
#define J 13u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 14
#define J 14u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#if CS > 15
#define J 15u
#include "rec_bwd2_replay_step.glsl"
#undef J
#endif
#endif
    // ---- reverse sweep: S_t = hist[J+1], S_{t-1} = hist[J] ----
#ifdef ROLLED_SEGMENTS
    [[dont_unroll]] for (uint jr = 0u; jr < CS; ++jr) {
      const uint j_ = CS - 1u - jr;
#define J j_
#include "rec_bwd2_sweep_step.glsl"
#undef J
    }
#else
#if CS > 15
#define J 15u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 14
#define J 14u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 13
#define J 13u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 12
#define J 12u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 11
#define J 11u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 10
#define J 10u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 9
#define J 9u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 8
#define J 8u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 7
#define J 7u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 6
#define J 6u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 5
#define J 5u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 4
#define J 4u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 3
#define J 3u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 2
#define J 2u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 1
#define J 1u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#if CS > 0
#define J 0u
#include "rec_bwd2_sweep_step.glsl"
#undef J
#endif
#endif
  }
  if (has(STATE_H0))
    [[unroll]] for (uint r = 0u; r < RPL; ++r) dh0[(bh * D + rg * RPL + r) * D + col] = ds[r];
}
