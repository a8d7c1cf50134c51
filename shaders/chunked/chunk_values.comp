#version 460
// Chunked backward, pass 3 of 4 (before chunk_grads): one workgroup per (window b, v-head h, chunk c)
// makes the chunk's products over the value dims, all chunks in parallel. With S0 the chunk's start
// state (a checkpoint; zero for chunk 0) and dS its end-state gradient (chunk_dstate; zero for the last):
//   X1 = dO S0^T,   dW = -dU S0^T,   X2 = U dS^T,   <dO_i, u_j>,  <dU_i, v_j>,   <dS, S0>
// and the key-dim pair dots <dW_i, k_j>, and leaves, for chunk_grads: the record's first dq^ and
// dk^ terms gamma_i X1 and (Gamma / gamma_i) X2, dW, three of the four pair-dot matrices (chunk_prep
// leaves G = <k_i, k_j>) and Gamma <dS, S0>. This is most of the backward's arithmetic and all its
// reads of the states.
// The three products are [CHQ x D] = [CHQ x D] [D x D]^T, summed over the value dims c, 8 a round:
// the round's columns of S0, dS (whole, D rows) and of dO, dU, U, V are staged in shared memory
// (double-buffered: one barrier a round, the next round's loads in flight during this one's work).
// Each invocation makes a 4 x 4 block (4 chunk rows i, 4 state rows r) of each product over half of
// the round's columns, so that one vec4 read of a staged operand feeds 16 FMAs, and 2 x 2 blocks of
// the pair dots; the two halves are added through shared memory at the end.
// Where the matrix units run, chunk_pair_bwd_mma.comp (phase 1) makes the same products on them.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8 .. 64 (the pipeline's; not used here)

#include "chunk_grads.glsl"

const uint CHQ = (CH + 15u) / 16u * 16u;  // chunk rows padded to 16 or 32 (padding rows are zero)
const uint HI = CHQ / 4u;                 // chunk rows of an invocation's blocks: 4 or 8
const uint RT = 8u;                       // value dims c a round (RT / 2 for each half)
const uint PB = CHQ * CHQ / 256u;         // 2 x 2 pair-dot blocks of an invocation: 1 or 4

// One staging buffer, in vec4s: S0[c][r], dS[c][r] (the round's RT columns, D rows each), then the
// operands [o][c][i] (o: dO, dU, U, V; CHQ rows each). Two of them; after the rounds the same memory
// holds one product [i][r] (CHQ x D) or the pair dots while the halves are added, and k (key_dots).
const uint BUFV = 2u * RT * D / 4u + 4u * RT * CHQ / 4u;
const uint NKP = CHQ / 16u, KR = D / NKP / 4u, KP = KR + 1u;  // key_dots' passes, vec4s a row
const uint SMV = 2u * BUFV > CHQ * D / 4u + CHQ * KP ? 2u * BUFV : CHQ * D / 4u + CHQ * KP;
shared vec4 sm[SMV];
shared float red[256u / 8u];  // per subgroup: its share of <dS, S0>

uint s0_v(uint b, uint c, uint r4) { return b * BUFV + c * (D / 4u) + r4; }
uint ds_v(uint b, uint c, uint r4) { return b * BUFV + RT * D / 4u + c * (D / 4u) + r4; }
uint op_v(uint b, uint o, uint c, uint i4) { return b * BUFV + 2u * RT * D / 4u + (o * RT + c) * (CHQ / 4u) + i4; }

// The carried states at a window's edges, element [r][c] of (window, head) bh: chunk 0's S0 is
// h0's where carried in, else zero; the last chunk's dS is dht's where carried in, else zero. (The
// other chunks' are stored: checkpoints and chunk_dstate's, [col][row], read as vec4s.)
float carried_s0(uint bh, uint r, uint c) { return has(STATE_H0) ? h0[(bh * D + r) * D + c] : 0.0; }
float carried_ds(uint bh, uint r, uint c) { return has(STATE_CARRY) ? dht[(bh * D + r) * D + c] : 0.0; }

// What an invocation loads for a round: a vec4 of S0's and of dS's RT x D columns (column
// tid / 32, rows 4 (tid % 32) ..: the round's 8 columns are 256 contiguous vec4s of a stored state)
// and CHQ / 16 (row, column) pairs of the operands (pair p = tid + 256 q: p < 8 CHQ dO and dU of
// row p / 8, else v and kv; column p % 8).
struct Round {
  vec4 s0, ds;
  vec2 op[2];  // CHQ / 16 of them used
};

Round load_round(Chunk k, uint bh, bool s0_stored, uint s0_at, bool ds_stored, uint ds_at, uint c0, uint tid) {
  Round x;
  x.op[1] = vec2(0.0);
  {
    const uint c = c0 + tid / 32u, r = 4u * (tid % 32u);
    if (s0_stored) x.s0 = ck4[(s0_at + c * D + r) / 4u];
    else [[unroll]] for (uint l = 0u; l < 4u; ++l) x.s0[l] = carried_s0(bh, r + l, c);
    if (ds_stored) x.ds = dsc4[(ds_at + c * D + r) / 4u];
    else [[unroll]] for (uint l = 0u; l < 4u; ++l) x.ds[l] = carried_ds(bh, r + l, c);
  }
  [[unroll]] for (uint q = 0u; q < CHQ / 16u; ++q) {
    const uint p = tid + 256u * q, i = (p / RT) % CHQ, at = head_row(k, i) * D + c0 + p % RT;
    x.op[q] = vec2(0.0);
    if (i < k.L) x.op[q] = p < RT * CHQ ? vec2(do_in[at], du_in[at]) : vec2(y[at], kv_in[at]);
  }
  return x;
}

// The round into staging buffer b; adds its share of <dS, S0> to extra.
void put_round(Round x, uint b, uint tid, inout float extra) {
  sm[s0_v(b, tid / 32u, tid % 32u)] = x.s0;
  sm[ds_v(b, tid / 32u, tid % 32u)] = x.ds;
  extra += dot(x.s0, x.ds);
  [[unroll]] for (uint q = 0u; q < CHQ / 16u; ++q) {
    const uint p = tid + 256u * q, i = (p / RT) % CHQ, c = p % RT;
    if (p < RT * CHQ) {
      sm[op_v(b, 0u, c, i / 4u)][i % 4u] = x.op[q].x;  // dO
      sm[op_v(b, 1u, c, i / 4u)][i % 4u] = x.op[q].y;  // dU
    } else {
      // u = beta (v - kv) and v (bet[] holds CH rows; padding rows are zero)
      sm[op_v(b, 2u, c, i / 4u)][i % 4u] = (i < CH ? bet[i] : 0.0) * (x.op[q].x - x.op[q].y);
      sm[op_v(b, 3u, c, i / 4u)][i % 4u] = x.op[q].x;
    }
  }
}

// The first row i and column j of invocation u's 2 x 2 pair-dot block q (u < 128; both even).
uvec2 pair_block(uint u, uint q) {
  const uint n = u % 64u + 64u * q;
  return 2u * uvec2(n / (CHQ / 2u), n % (CHQ / 2u));
}

// The key-dim pair dots <dW_i, k_j> (chunk_grads' dT), with dU S0^T = -dW in
// sm[i * D / 4 + r / 4] (as the halves left it): k staged after it, a row of KP vec4s each (padded
// against bank conflicts), over NKP passes of D / NKP key dims where CHQ rows of D would not fit.
void key_dots(Chunk k, uint wg, uint tid) {
  const uint KO = CHQ * D / 4u;  // k[j][r of the pass] at sm[KO + j KP + r / 4]
  float xk[CHQ * CHQ / 256u];
  [[unroll]] for (uint q = 0u; q < CHQ * CHQ / 256u; ++q) xk[q] = 0.0;
  [[unroll]] for (uint ps = 0u; ps < NKP; ++ps) {
    barrier();
    for (uint e = tid; e < CHQ * KR * 4u; e += 256u) {
      const uint j = e / (KR * 4u), rr = e % (KR * 4u);
      sm[KO + j * KP + rr / 4u][rr % 4u] = j < k.L ? k_at(k, j, ps * KR * 4u + rr) : 0.0;
    }
    barrier();
    [[unroll]] for (uint q = 0u; q < CHQ * CHQ / 256u; ++q) {
      const uint n = tid + 256u * q, i = n / CHQ, j = n % CHQ;
      [[dont_unroll]] for (uint r4 = 0u; r4 < KR; ++r4) {
        xk[q] += dot(sm[i * (D / 4u) + ps * KR + r4], sm[KO + j * KP + r4]);
      }
    }
  }
  [[unroll]] for (uint q = 0u; q < CHQ * CHQ / 256u; ++q) {
    const uint n = tid + 256u * q, i = n / CHQ, j = n % CHQ;
    if (i < CH && j < CH) pairs[(wg * 4u + 3u) * CH * CH + i * CH + j] = -xk[q];
  }
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / nch;
  const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, wg % nch);
  const uint slots = max(nch, 2u) - 1u;
  // S0: a checkpoint, or for chunk 0 h0; dS: chunk_dstate's, or for the last chunk dht
  const bool s0_stored = k.c > 0u, ds_stored = k.c + 1u < nch;
  // (0 where there is no such state: in range, should a compiler load before it selects)
  const uint s0_at = s0_stored ? (bh * slots + k.c - 1u) * D * D : 0u, ds_at = ds_stored ? (bh * slots + k.c) * D * D : 0u;
  load_chunk_rows(k, tid);

  // Invocation (half, ig, rb): value dims half*RT/2 .. of each round; chunk rows ig*HI ..; state rows
  // 4 rb ... Within 32 invocations 8 rb by 4 ig, so that a staged read touches one 128-byte row.
  const uint half_ = tid / 128u, u = tid % 128u;
  const uint ig = (u % 32u) / 8u, rb = (u / 32u) * 8u + u % 8u;
  vec4 x1[HI], w[HI], x2[HI];  // [chunk row of the block][state rows 4 rb ..]
  vec4 pd[PB];                 // 2 x 2 pair-dot blocks (pair_block): (i, j), (i, j+1), (i+1, j), (i+1, j+1)
  [[unroll]] for (uint l = 0u; l < HI; ++l) { x1[l] = vec4(0.0); w[l] = vec4(0.0); x2[l] = vec4(0.0); }
  [[unroll]] for (uint l = 0u; l < PB; ++l) pd[l] = vec4(0.0);
  const uint pm = u / 64u;  // 0: <dO_i, u_j>, 1: <dU_i, v_j>
  float extra = 0.0;           // this invocation's share of <dS, S0>

  Round nx = load_round(k, bh, s0_stored, s0_at, ds_stored, ds_at, 0u, tid);
  put_round(nx, 0u, tid, extra);
  barrier();
  for (uint rd = 0u; rd < D / RT; ++rd) {
    const uint b = rd % 2u;
    const bool more = rd + 1u < D / RT;
    if (more) nx = load_round(k, bh, s0_stored, s0_at, ds_stored, ds_at, (rd + 1u) * RT, tid);
    [[unroll]] for (uint cc = 0u; cc < RT / 2u; ++cc) {
      const uint c = half_ * (RT / 2u) + cc;
      const vec4 s0 = sm[s0_v(b, c, rb)], ds = sm[ds_v(b, c, rb)];
      [[unroll]] for (uint h = 0u; h < HI / 4u; ++h) {
        const vec4 a0 = sm[op_v(b, 0u, c, ig * (HI / 4u) + h)];
        const vec4 a1 = sm[op_v(b, 1u, c, ig * (HI / 4u) + h)];
        const vec4 a2 = sm[op_v(b, 2u, c, ig * (HI / 4u) + h)];
        [[unroll]] for (uint l = 0u; l < 4u; ++l) {
          x1[4u * h + l] = fma(vec4(a0[l]), s0, x1[4u * h + l]);
          w[4u * h + l] = fma(vec4(a1[l]), s0, w[4u * h + l]);
          x2[4u * h + l] = fma(vec4(a2[l]), ds, x2[4u * h + l]);
        }
      }
      [[unroll]] for (uint q = 0u; q < PB; ++q) {
        const uvec2 ij = pair_block(u, q);
        const vec4 a4 = sm[op_v(b, pm, c, ij.x / 4u)], b4 = sm[op_v(b, 2u + pm, c, ij.y / 4u)];
        const vec2 a = ij.x % 4u == 0u ? a4.xy : a4.zw, bb = ij.y % 4u == 0u ? b4.xy : b4.zw;
        pd[q] = fma(vec4(a.xx, a.yy), bb.xyxy, pd[q]);
      }
    }
    if (more) put_round(nx, 1u - b, tid, extra);
    barrier();
  }

  // ---- the halves added through shared memory, then stored whole rows at a time ----
  [[unroll]] for (uint g = 0u; g < 3u; ++g) {  // X1, X2, then dW (key_dots reads it in shared memory)
    if (half_ == 1u)
      [[unroll]] for (uint l = 0u; l < HI; ++l) sm[(ig * HI + l) * (D / 4u) + rb] = g == 0u ? x1[l] : g == 2u ? w[l] : x2[l];
    barrier();
    if (half_ == 0u)
      [[unroll]] for (uint l = 0u; l < HI; ++l) sm[(ig * HI + l) * (D / 4u) + rb] += g == 0u ? x1[l] : g == 2u ? w[l] : x2[l];
    barrier();
    for (uint e = tid; e < CHQ * D; e += 256u) {
      const uint i = e / D, r = e % D;
      if (i < k.L) {
        const float x = sm[e / 4u][e % 4u];
        const uint row = head_row(k, i);
        if (g == 0u) rec[row * RW + r] = exp(lg_of(i)) * x;
        else if (g == 2u) dw[row * D + r] = -x;
        else rec[row * RW + D + r] = exp(lgd(CH - 1u, i)) * x;  // the dK~ term (in dK-)
      }
    }
    if (g == 2u) key_dots(k, wg, tid);
    barrier();
  }
  if (half_ == 1u) [[unroll]] for (uint q = 0u; q < PB; ++q) sm[u * PB + q] = pd[q];
  barrier();
  if (half_ == 0u)
    [[unroll]] for (uint q = 0u; q < PB; ++q) {
      const uvec2 ij = pair_block(u, q);
      const vec4 v = pd[q] + sm[u * PB + q];
      [[unroll]] for (uint m = 0u; m < 4u; ++m) {
        const uint i = ij.x + m / 2u, j = ij.y + m % 2u;
        if (i < CH && j < CH) pairs[(wg * 4u + pm) * CH * CH + i * CH + j] = v[m];
      }
    }
  extra = subgroupAdd(extra);
  if (subgroupElect()) red[gl_SubgroupID] = extra;
  barrier();
  if (tid == 0u) {
    float x = 0.0;
    for (uint p = 0u; p < gl_NumSubgroups; ++p) x += red[p];
    sdot[wg] = exp(lg_of(CH - 1u)) * x;
  }
}
