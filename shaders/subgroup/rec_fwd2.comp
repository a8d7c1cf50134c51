#version 460
// Forward recurrence, column-split family: one workgroup of 64 invocations per (window b, v-head h,
// block of 32 state columns), four per head. Lane layout: 8 lanes share a group of 4 columns, each
// lane holding 16 rows of those 4 columns (64 registers): lane bits 0-2 = row group rg (rows
// rg*16 .. rg*16+15), higher bits = column group cg (columns cg*4 .. cg*4+3 of the block).
// Each k^/q^ value a lane reads from shared memory serves its four columns, so shared-memory
// bandwidth stays below the FMA rate; sums over a column's 128 rows take 4 + 3 shuffles for the
// lane's four columns together (transpose-reduce, then gather).
//   S[:,c] <- g S[:,c];  kv_c = S[:,c] . k^;  u_c = beta (v_c - kv_c);  S[:,c] += k^ u_c;  o_c = S[:,c] . q^
// The decay is applied lazily: the lanes hold S~ with S = cs S~, and each step multiplies the scalar
// cs by g in place of every state value (three FMAs an element a step, not four):
//   cs <- g cs;  kv_c = cs (S~[:,c] . k^);  S~[:,c] += k^ (u_c / cs);  o_c = cs (S~[:,c] . q^)
// Where cs would fall under 2^-30 it is folded into the state first (S~ <- cs S~, cs <- 1; g is the
// head's, so the branch is uniform), so that u / cs stays within 2^30 of u; a decay that underflows
// to 0 zeroes the state there, as it does S.
// S starts at h0 (STATE_H0) or zero; with STATE_CARRY the state after the last step goes to ht.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8..64

layout(set = 0, binding = 0) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 1) readonly buffer Qkn { vec4 qkn4[]; };      // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 3) writeonly buffer O { float o_pre[]; };     // [B, T, nv*D]
layout(set = 0, binding = 4) writeonly buffer Kv { float kv_out[]; };   // [B, T, nv*D] (pc.keep)
layout(set = 0, binding = 5) writeonly buffer Ck { vec4 ck4[]; };       // [B, nv, max(nseg-1,1), D cols, D/4]
layout(set = 0, binding = 6) readonly buffer H0 { float h0[]; };        // [B, nv, D, D] S[k][v] (STATE_H0)
layout(set = 0, binding = 7) writeonly buffer Ht { float ht[]; };       // [B, nv, D, D] (STATE_CARRY)

#define NWG 4u
#define COLS 32u
// Steps staged per block. Small on purpose: the driver sizes the shared-memory carve-out so that
// more than 20 KiB per workgroup costs resident warps, and this kernel lives on resident warps
// (measured: each doubling of TS past 4 slower).
#ifndef TS
#define TS 4u
#endif
// q^/k^ rows of a step as 32 vec4, padded to 36: vec4 r4 sits at r4 + r4/8, so the 8 row groups of
// a column group (vec4 rg*4 + i) fall in 8 distinct 16-byte bank slots: conflict-free 128-bit loads.
#define STEP4 36u
shared vec4 fq[TS * STEP4], fk[TS * STEP4];
shared float fv[TS * COLS];
shared float fg[TS], fb[TS];

// The smallest lazy decay scale (S = cs S~) before it is folded into the state.
const float kFold = 1.0 / 1073741824.0;  // 2^-30

uint padded(uint r4) { return r4 + (r4 >> 3u); }

// Sums over the 8 lanes of a column group of the lane's 4 partial column sums p[0..3]. Returns the
// total of column cstar = 2*bit0 + bit1 of the lane (every lane of the group gets one column).
float transpose_reduce(float p0, float p1, float p2, float p3, uint lane) {
  const bool b0 = (lane & 1u) != 0u, b1 = (lane & 2u) != 0u;
  // stage 1 (xor 1): keep columns {0,1} or {2,3}, hand over the other pair
  const float k0 = b0 ? p2 : p0, k1 = b0 ? p3 : p1;
  const float g0 = b0 ? p0 : p2, g1 = b0 ? p1 : p3;
  const float a0 = k0 + subgroupShuffleXor(g0, 1u);
  const float a1 = k1 + subgroupShuffleXor(g1, 1u);
  // stage 2 (xor 2): keep one of the pair
  const float a = (b1 ? a1 : a0) + subgroupShuffleXor(b1 ? a0 : a1, 2u);
  // stage 3 (xor 4): the other half of the rows
  return a + subgroupShuffleXor(a, 4u);
}

// One invocation's share of a block's operands, loaded a block ahead (the loads of the next block
// are in flight while this one's steps run): q^, k^ vec4 e = lid + 64 m of the block's TS * D/4,
// v element lid + 64 m of its TS * COLS, and g, beta of step lid (lid < TS).
struct Block {
  vec4 q[TS * D / 256u], k[TS * D / 256u];
  float v[TS * COLS / 64u];
  float g, beta;
};

Block fetch(uint b, uint h, uint ko, uint blk, uint tb, uint lid) {
  Block f;
  const uint nst = min(TS, pc.t - tb), n_bt = pc.nb * pc.t;
  [[unroll]] for (uint m = 0u; m < TS * D / 256u; ++m) {
    const uint e = lid + 64u * m, j = e / (D / 4u), r4 = e % (D / 4u);
    const uint bt = b * pc.t + tb + min(j, nst - 1u);  // past the window's end: a row that is there
    f.q[m] = qkn4[qk_at(QK_Q, bt, ko) / 4u + r4];
    f.k[m] = qkn4[qk_at(QK_K, bt, ko) / 4u + r4];
  }
  [[unroll]] for (uint m = 0u; m < TS * COLS / 64u; ++m) {
    const uint e = lid + 64u * m, j = min(e / COLS, nst - 1u);
    f.v[m] = y[y_at(b * pc.t + tb + j, h) + blk * COLS + e % COLS];
  }
  const uint bt = b * pc.t + tb + min(lid, nst - 1u);
  f.g = lid < TS ? gates[bt * pc.nv + h] : 0.0;
  f.beta = lid < TS ? gates[(n_bt + bt) * pc.nv + h] : 0.0;
  return f;
}

void stash(Block f, uint lid) {
  [[unroll]] for (uint m = 0u; m < TS * D / 256u; ++m) {
    const uint e = lid + 64u * m, j = e / (D / 4u), r4 = e % (D / 4u);
    fq[j * STEP4 + padded(r4)] = f.q[m];
    fk[j * STEP4 + padded(r4)] = f.k[m];
  }
  [[unroll]] for (uint m = 0u; m < TS * COLS / 64u; ++m) fv[lid + 64u * m] = f.v[m];
  if (lid < TS) { fg[lid] = f.g; fb[lid] = f.beta; }
}

void main() {
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = gl_SubgroupInvocationID;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint b = bh / pc.nv, h = bh % pc.nv, ko = h / (pc.nv / pc.nk);
  const uint rg = lane & 7u;
  const uint cg = gl_SubgroupID * (SG / 8u) + (lane >> 3u);
  const uint cstar = 2u * (lane & 1u) + ((lane >> 1u) & 1u);  // the column transpose_reduce returns
  const uint col0 = blk * COLS + cg * 4u;                     // first of the lane's 4 columns
  const uint slots = max(pc.nseg, 2u) - 1u;
  float s[4][16];  // s[c][r] = S~[rg*16 + r][col0 + c]
  float cs = 1.0;  // S = cs S~
  [[unroll]] for (uint c = 0u; c < 4u; ++c)
    [[unroll]] for (uint r = 0u; r < 16u; ++r)
      s[c][r] = has(STATE_H0) ? h0[(bh * D + rg * 16u + r) * D + col0 + c] : 0.0;

  Block nxt = fetch(b, h, ko, blk, 0u, lid);
  // A step's o leaves at the next step (the last one's after the loop): its sums over the rows are
  // reduced beside the next step's S~ . k^ sums, so that the two shuffle chains overlap.
  float po[4] = float[4](0.0, 0.0, 0.0, 0.0);  // the pending step's partial sums of S~ . q^
  float cs_o = 0.0;                            // its cs
  uint vi_o = 0u;                              // o_pre's index of its column total (pend)
  bool pend = false;
  uint seg_step = 0u, seg_next = 0u;  // steps into the segment, and the segments completed
  for (uint tb = 0u; tb < pc.t; tb += TS) {
    const uint nst = min(TS, pc.t - tb);
    barrier();  // the previous block's readers are done
    stash(nxt, lid);
    if (tb + TS < pc.t) nxt = fetch(b, h, ko, blk, tb + TS, lid);  // in flight during this block's steps
    barrier();
    for (uint j = 0u; j < nst; ++j) {
      const uint ti = tb + j;
      const float beta = fb[j];
      cs *= fg[j];
      if (cs < kFold) {
        [[unroll]] for (uint c = 0u; c < 4u; ++c)
          [[unroll]] for (uint r = 0u; r < 16u; ++r) s[c][r] *= cs;
        cs = 1.0;
      }
      const float inv_cs = 1.0 / cs;
      float k[16];
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        const vec4 kk = fk[j * STEP4 + padded(rg * 4u + i)];
        k[4u * i] = kk.x; k[4u * i + 1u] = kk.y; k[4u * i + 2u] = kk.z; k[4u * i + 3u] = kk.w;
      }
      float p[4];
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        float a0 = 0.0, a1 = 0.0;
        [[unroll]] for (uint r = 0u; r < 16u; r += 2u) {
          a0 = fma(s[c][r], k[r], a0);
          a1 = fma(s[c][r + 1u], k[r + 1u], a1);
        }
        p[c] = a0 + a1;
      }
      const float kv_star = cs * transpose_reduce(p[0], p[1], p[2], p[3], lane);
      const float o_prev = cs_o * transpose_reduce(po[0], po[1], po[2], po[3], lane);
      if (pend && rg < 4u) o_pre[vi_o] = o_prev;  // lanes rg and rg^4 hold the same column total
      // gather the other three columns' totals: column cstar ^ m lives on lane ^ (m: bit1 -> 1, bit0 -> 2)
      const float x1 = subgroupShuffleXor(kv_star, 2u);  // column cstar ^ 1
      const float x2 = subgroupShuffleXor(kv_star, 1u);  // column cstar ^ 2
      const float x3 = subgroupShuffleXor(kv_star, 3u);  // column cstar ^ 3
      float u[4];
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        const uint m = c ^ cstar;
        const float kv = m == 0u ? kv_star : (m == 1u ? x1 : (m == 2u ? x2 : x3));
        u[c] = beta * (fv[j * COLS + cg * 4u + c] - kv) * inv_cs;  // u_c / cs
      }
      float q[16];
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        const vec4 qq = fq[j * STEP4 + padded(rg * 4u + i)];
        q[4u * i] = qq.x; q[4u * i + 1u] = qq.y; q[4u * i + 2u] = qq.z; q[4u * i + 3u] = qq.w;
      }
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        float a0 = 0.0, a1 = 0.0;
        [[unroll]] for (uint r = 0u; r < 16u; r += 2u) {
          s[c][r] = fma(k[r], u[c], s[c][r]);
          s[c][r + 1u] = fma(k[r + 1u], u[c], s[c][r + 1u]);
          a0 = fma(s[c][r], q[r], a0);
          a1 = fma(s[c][r + 1u], q[r + 1u], a1);
        }
        po[c] = a0 + a1;
      }
      cs_o = cs;
      vi_o = (b * pc.t + ti) * pc.nv * D + h * D + col0 + cstar;
      pend = true;
      if (pc.keep != 0u && rg < 4u) kv_out[vi_o] = kv_star;
      if (++seg_step == pc.cs) {  // the state after the segment's last step: a checkpoint
        seg_step = 0u;
        ++seg_next;
        if (pc.keep != 0u && seg_next < pc.nseg) {
          const uint at = ((bh * slots + seg_next - 1u) * D * D + col0 * D + rg * 16u) / 4u;
          [[unroll]] for (uint c = 0u; c < 4u; ++c)
            [[unroll]] for (uint i = 0u; i < 4u; ++i)
              ck4[at + c * (D / 4u) + i] = cs * vec4(s[c][4u * i], s[c][4u * i + 1u], s[c][4u * i + 2u], s[c][4u * i + 3u]);
        }
      }
    }
  }
  {  // the last step's o
    const float o_last = cs_o * transpose_reduce(po[0], po[1], po[2], po[3], lane);
    if (pend && rg < 4u) o_pre[vi_o] = o_last;
  }
  if (has(STATE_CARRY))
    [[unroll]] for (uint c = 0u; c < 4u; ++c)
      [[unroll]] for (uint r = 0u; r < 16u; ++r) ht[(bh * D + rg * 16u + r) * D + col0 + c] = cs * s[c][r];
}
