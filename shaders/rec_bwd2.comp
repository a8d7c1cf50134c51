#version 460
// Backward recurrence (checkpointed BPTT), column-split family: one workgroup per (window b, v-head h,
// block of 32 columns); see column_split.glsl. Segments of CS steps are walked in reverse. Each is
// replayed from its checkpoint with the recorded kv (u = beta (v - kv) exactly as in the forward)
// into a register history: hist[j] = S after step t0+j-1, hist[0] = the checkpoint. Keeping the
// history on chip is what makes this fast: spilled to memory it is 32 bytes per state element and
// step, several times the backward's whole budget of memory traffic. Then the reverse sweep of
// SPEC.md, per column j, with dS carried in registers across segments:
//   dS += q^ do;  dq^ += S_t do (a sum over columns);  du = dS . k^;  dv = beta du;
//   dbeta += du (v - kv);  dkv = -beta du;  dk^ += dS u + (g S_{t-1}) dkv (over columns);
//   e = dS + k^ dkv;  dg += <e, S_{t-1}>;  dS = g e
// The sums over columns leave as per-workgroup partials, dqk [B, T, nv][NWG][258] (dq^ 0..127,
// dk^ 128..255, dbeta 256, dg 257), that qk_bwd2 adds up over the workgroups and the rep heads.
#include "common.glsl"
#include "column_split.glsl"
layout(local_size_x = 256) in;

layout(constant_id = 1) const uint CS = 8;  // steps per segment (the checkpoint interval, <= T)
// The segment loops are unrolled so that hist[] indices are constants and the history stays in
// registers. CPU drivers (lavapipe) take minutes to compile that; they get a rolled build
// (-DROLLED_SEGMENTS, rec_bwd2_rolled) of the same source.
#ifdef ROLLED_SEGMENTS
#define SEGMENT_LOOP [[dont_unroll]]
#else
#define SEGMENT_LOOP [[unroll]]
#endif

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, C]: v at 2*nk*D + h*D
layout(set = 0, binding = 1) readonly buffer Qkn { vec4 qkn4[]; };      // [2][B, T, nk, D/4]
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 3) readonly buffer Kv { float kv_in[]; };     // [B, T, nv*D]
layout(set = 0, binding = 4) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 5) readonly buffer Ck { vec4 ck4[]; };        // [B, nv, max(nseg-1,1), D cols, D/4]
layout(set = 0, binding = 6) writeonly buffer Dqk { float dqk[]; };     // [B, T, nv][NWG][258] partials
layout(set = 0, binding = 7) writeonly buffer Dy { float dy[]; };       // [B, T, C]: writes the v part

#define PW 258u  // words per partial record
// Row sums over the columns of a subgroup: butterfly stages across the column lane bits. After them
// each lane holds VALS rows: rg*16 + (its column-bit offsets) + 0 .. VALS-1.
const uint STAGES = SG >= 64u ? 3u : (SG >= 32u ? 2u : (SG >= 16u ? 1u : 0u));
const uint VALS = RPL >> STAGES;
// Subgroup partials meet in SLOTS shared records, in ROUNDS rounds when there are more subgroups.
const uint NSUB = WG_SIZE / SG;
const uint SLOTS = NSUB < 8u ? NSUB : 8u;
const uint ROUNDS = NSUB / SLOTS;

shared vec4 bq[CS * D / 4u], bk[CS * D / 4u];  // [step][row/4]
shared float bv[CS * COLS], bkv[CS * COLS], bdo[CS * COLS];  // [step][column of the block]
shared float bg[CS], bb[CS];
shared float wpart[2u * SLOTS * PW];  // [parity][slot][record], double-buffered across steps

// In place: a[0 .. VALS-1] become the sums over the subgroup's columns of this lane's share of rows.
void butterfly(inout float a[RPL]) {
  [[unroll]] for (uint st = 0u; st < 3u; ++st) {
    if (st < STAGES) {
      const uint half_ = 8u >> st;
      const bool hi = (gl_SubgroupInvocationID & (8u << st)) != 0u;
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        if (i < half_) {
          const float keep = hi ? a[i + half_] : a[i];
          const float give = hi ? a[i] : a[i + half_];
          a[i] = keep + subgroupShuffleXor(give, 8u << st);
        }
      }
    }
  }
}

uint butterfly_row0() {
  uint r = row_group() * RPL;
  [[unroll]] for (uint st = 0u; st < 3u; ++st)
    if (st < STAGES && (gl_SubgroupInvocationID & (8u << st)) != 0u) r += 8u >> st;
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

  float ds[RPL];
  [[unroll]] for (uint r = 0u; r < RPL; ++r) ds[r] = 0.0;
  float hist[CS + 1u][RPL];
  uint par = 0u;

  for (uint sgi = 0u; sgi < pc.nseg; ++sgi) {
    const uint seg = pc.nseg - 1u - sgi;
    const uint t0 = seg * CS;
    const uint nst = min(CS, pc.t - t0);
    // ---- stage the segment's operands ----
    barrier();
    for (uint e = lid; e < CS * D / 4u; e += WG_SIZE) {
      const uint j = e / (D / 4u), r4 = e % (D / 4u);
      if (j < nst) {
        const uint bt = b * pc.t + t0 + j;
        bq[e] = qkn4[(bt * pc.nk + ko) * (D / 4u) + r4];
        bk[e] = qkn4[((n_bt + bt) * pc.nk + ko) * (D / 4u) + r4];
      }
    }
    for (uint e = lid; e < CS * COLS; e += WG_SIZE) {
      const uint j = e / COLS;
      if (j < nst) {
        const uint bt = b * pc.t + t0 + j;
        const uint c = h * D + blk * COLS + e % COLS;
        bv[e] = y[bt * pc.c_dim + 2u * pc.nk * D + c];
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
      [[unroll]] for (uint r = 0u; r < RPL; ++r) hist[0][r] = 0.0;
    }
    barrier();
    // ---- replay: hist[j+1] = g hist[j] + k^ u, with the forward's exact operations ----
    SEGMENT_LOOP for (uint j = 0u; j < CS; ++j) {
      if (j < nst) {
        const float g = bg[j];
        const float u = bb[j] * (bv[j * COLS + cw] - bkv[j * COLS + cw]);
        [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
          const vec4 kk = bk[j * (D / 4u) + rg * 4u + q4];
          hist[j + 1u][4u * q4] = fma(kk.x, u, hist[j][4u * q4] * g);
          hist[j + 1u][4u * q4 + 1u] = fma(kk.y, u, hist[j][4u * q4 + 1u] * g);
          hist[j + 1u][4u * q4 + 2u] = fma(kk.z, u, hist[j][4u * q4 + 2u] * g);
          hist[j + 1u][4u * q4 + 3u] = fma(kk.w, u, hist[j][4u * q4 + 3u] * g);
        }
      }
    }
    // ---- reverse sweep: S_t = hist[j+1], S_{t-1} = hist[j] ----
    SEGMENT_LOOP for (uint jr = 0u; jr < CS; ++jr) {
      const uint j = CS - 1u - jr;
      if (j < nst) {
        const uint bt = b * pc.t + t0 + j;
        const float g = bg[j], beta = bb[j];
        const float vc = bv[j * COLS + cw] - bkv[j * COLS + cw];  // v - kv
        const float u = beta * vc;
        const float dd = bdo[j * COLS + cw];
        float q[RPL], k[RPL];
        [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
          const vec4 qq = bq[j * (D / 4u) + rg * 4u + q4];
          const vec4 kk = bk[j * (D / 4u) + rg * 4u + q4];
          q[4u * q4] = qq.x; q[4u * q4 + 1u] = qq.y; q[4u * q4 + 2u] = qq.z; q[4u * q4 + 3u] = qq.w;
          k[4u * q4] = kk.x; k[4u * q4 + 1u] = kk.y; k[4u * q4 + 2u] = kk.z; k[4u * q4 + 3u] = kk.w;
        }
        float dq_part[RPL], dk_part[RPL];
        float d0 = 0.0, d1 = 0.0;
        [[unroll]] for (uint r = 0u; r < RPL; ++r) {
          ds[r] = fma(q[r], dd, ds[r]);
          dq_part[r] = hist[j + 1u][r] * dd;
        }
        [[unroll]] for (uint r = 0u; r < RPL; r += 2u) {
          d0 = fma(ds[r], k[r], d0);
          d1 = fma(ds[r + 1u], k[r + 1u], d1);
        }
        const float du = column_sum(d0 + d1);
        const float dkv = -beta * du;
        const float gdkv = g * dkv;
        float dg0 = 0.0, dg1 = 0.0;
        [[unroll]] for (uint r = 0u; r < RPL; ++r) {
          dk_part[r] = fma(ds[r], u, hist[j][r] * gdkv);
          const float e = fma(k[r], dkv, ds[r]);
          if ((r & 1u) == 0u) dg0 = fma(e, hist[j][r], dg0); else dg1 = fma(e, hist[j][r], dg1);
          ds[r] = g * e;
        }
        if (rg == 0u) dy[bt * pc.c_dim + 2u * pc.nk * D + h * D + col] = beta * du;  // dv
        // ---- sums over columns: subgroup butterflies, then the subgroups' records in shared memory ----
        butterfly(dq_part);
        butterfly(dk_part);
        const float dbeta_sub = subgroupAdd(rg == 0u ? du * vc : 0.0);
        const float dg_sub = subgroupAdd(dg0 + dg1);
        const uint base = par * SLOTS * PW;
        for (uint rd = 0u; rd < ROUNDS; ++rd) {
          if (sub / SLOTS == rd) {
            const uint rec = base + (sub % SLOTS) * PW;
            [[unroll]] for (uint i = 0u; i < VALS; ++i) {
              wpart[rec + row0 + i] = (rd == 0u ? 0.0 : wpart[rec + row0 + i]) + dq_part[i];
              wpart[rec + D + row0 + i] = (rd == 0u ? 0.0 : wpart[rec + D + row0 + i]) + dk_part[i];
            }
            if (subgroupElect()) {
              wpart[rec + 256u] = (rd == 0u ? 0.0 : wpart[rec + 256u]) + dbeta_sub;
              wpart[rec + 257u] = (rd == 0u ? 0.0 : wpart[rec + 257u]) + dg_sub;
            }
          }
          barrier();
        }
        const uint out_at = ((bt * pc.nv + h) * NWG + blk) * PW;
        float acc = 0.0;
        for (uint sl = 0u; sl < SLOTS; ++sl) acc += wpart[base + sl * PW + lid];
        dqk[out_at + lid] = acc;
        if (lid < 2u) {
          float acc2 = 0.0;
          for (uint sl = 0u; sl < SLOTS; ++sl) acc2 += wpart[base + sl * PW + 256u + lid];
          dqk[out_at + 256u + lid] = acc2;
        }
        par ^= 1u;
      }
    }
  }
}
