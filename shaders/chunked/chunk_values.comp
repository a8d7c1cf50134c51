#version 460
// Chunked backward, pass 3 of 4 (before chunk_grads): one workgroup per (window b, v-head h, chunk c)
// makes the chunk's products over the value dims, all chunks in parallel. With S0 the chunk's start
// state (a checkpoint; zero for chunk 0) and dS its end-state gradient (chunk_dstate; zero for the last):
//   X1 = dO S0^T,   dW = -dU S0^T,   X2 = U dS^T,   <dO_i, u_j>,  <dU_i, v_j>,   <dS, S0>
// and leaves, for chunk_grads: the record's first dq^ and dk^ terms gamma_i X1 and (Gamma / gamma_i) X2,
// dW, the two pair-dot matrices and Gamma <dS, S0>. This is most of the backward's arithmetic and all
// its reads of the states; as a pass of its own it runs more workgroups per SM than it did inside
// chunk_grads (fewer registers), and chunk_grads more too.
// Where the matrix units run, chunk_pair_bwd_mma.comp (phase 1) makes the same products on them.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint SG = 32;  // subgroup size, 8 .. 64

#include "chunk_grads.glsl"
#include "chunk_grads_staging.glsl"

shared vec4 tile4[4u * TILE * CHP / 4u];  // staged operands [operand][column][row i]
shared float red[256u / 8u];              // per subgroup: its share of <dS, S0>

// S0[r][c] of (window, head) bh's chunk: its checkpoint ([col][row] at s0_at) where stored, else
// (chunk 0) h0's or zero. dS[r][c] likewise: chunk_dstate's, else (the last chunk) dht's or zero.
float s0_el(bool stored, uint s0_at, uint bh, uint r, uint c) {
  if (stored) return ck[s0_at + c * D + r];
  return has(STATE_H0) ? h0[(bh * D + r) * D + c] : 0.0;
}
float ds_el(bool stored, uint ds_at, uint bh, uint r, uint c) {
  if (stored) return dsc[ds_at + c * D + r];
  return has(STATE_CARRY) ? dht[(bh * D + r) * D + c] : 0.0;
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
  const bool has_s0 = s0_stored || has(STATE_H0), has_ds = ds_stored || has(STATE_CARRY);
  load_chunk_rows(k, tid);
  const float lgam = lg_of(CH - 1u);

  const uint r = tid % D, half_ = tid / D;
  const uint i0 = half_ * HR;
  const uint pi = tid / 16u, pj = tid % 16u;  // the (i, j) pair block
  const bool pair_ok = pi < HR && pj < HR;    // 2 pi < CHP
  float extra = 0.0;                // this invocation's share of <dS, S0>
  vec2 duv[2], dou[2];              // pair dots <dU_i, v_j>, <dO_i, u_j>: [i of the block][j of the block]
  duv[0] = vec2(0.0); duv[1] = vec2(0.0); dou[0] = vec2(0.0); dou[1] = vec2(0.0);

  // ---- over the value dims c: X1 = dO S0^T, dW = -dU S0^T, X2 = U dS^T, and the pair dots ----
  {
    vec4 x1[HR4], x2[HR4], w[HR4];
    [[unroll]] for (uint s = 0u; s < HR4; ++s) { x1[s] = vec4(0.0); x2[s] = vec4(0.0); w[s] = vec4(0.0); }
    // (0 where there is no such state: in range, should a compiler load before it selects)
    const uint s0_at = s0_stored ? (bh * slots + k.c - 1u) * D * D : 0u, ds_at = ds_stored ? (bh * slots + k.c) * D * D : 0u;
    const uint OP = TILE * CHP / 4u;  // vec4s per staged operand
    float pre[PRE];
    float s0n[TILE], sdn[TILE];  // the next round's S0[r][c], dS[r][c], loaded a round ahead too
    [[unroll]] for (uint q = 0u; q < PRE; ++q) pre[q] = value_operand(k, 0u, tid + 256u * q);
    [[unroll]] for (uint cc = 0u; cc < TILE; ++cc) {
      s0n[cc] = s0_el(s0_stored, s0_at, bh, r, cc);
      sdn[cc] = ds_el(ds_stored, ds_at, bh, r, cc);
    }
    for (uint c0 = 0u; c0 < D; c0 += TILE) {
      barrier();
      [[unroll]] for (uint q = 0u; q < PRE; ++q) {
        const uint e = tid + 256u * q;
        if (e < 4u * TILE * CHP) tile4[staged_at(e) / 4u][staged_at(e) % 4u] = pre[q];
      }
      const float s0c[TILE] = s0n, sdc[TILE] = sdn;
      if (c0 + TILE < D) {
        [[unroll]] for (uint q = 0u; q < PRE; ++q) pre[q] = value_operand(k, c0 + TILE, tid + 256u * q);
        [[unroll]] for (uint cc = 0u; cc < TILE; ++cc) {
          s0n[cc] = s0_el(s0_stored, s0_at, bh, r, c0 + TILE + cc);
          sdn[cc] = ds_el(ds_stored, ds_at, bh, r, c0 + TILE + cc);
        }
      }
      barrier();
      [[unroll]] for (uint cc = 0u; cc < TILE; ++cc) {
        if (has_s0 || has_ds) {
          const float s0 = s0c[cc], sd = sdc[cc];
          if (half_ == 0u) extra = fma(s0, sd, extra);
          [[unroll]] for (uint s = 0u; s < HR4; ++s) {
            const uint at = cc * CHP / 4u + i0 / 4u + s;
            x1[s] = fma(vec4(s0), tile4[at], x1[s]);
            w[s] = fma(vec4(-s0), tile4[OP + at], w[s]);
            x2[s] = fma(vec4(sd), tile4[2u * OP + at], x2[s]);
          }
        }
        if (pair_ok) {
          const uint ai = cc * CHP + 2u * pi, aj = cc * CHP + 2u * pj;
          const vec2 doi = vec2(tile4[ai / 4u][ai % 4u], tile4[ai / 4u][ai % 4u + 1u]);
          const vec2 dui = vec2(tile4[OP + ai / 4u][ai % 4u], tile4[OP + ai / 4u][ai % 4u + 1u]);
          const vec2 uj = vec2(tile4[2u * OP + aj / 4u][aj % 4u], tile4[2u * OP + aj / 4u][aj % 4u + 1u]);
          const vec2 vj = vec2(tile4[3u * OP + aj / 4u][aj % 4u], tile4[3u * OP + aj / 4u][aj % 4u + 1u]);
          [[unroll]] for (uint a = 0u; a < 2u; ++a) {
            duv[a] = fma(vec2(dui[a]), vj, duv[a]);
            dou[a] = fma(vec2(doi[a]), uj, dou[a]);
          }
        }
      }
    }
    [[unroll]] for (uint s = 0u; s < HR4; ++s)
      [[unroll]] for (uint l = 0u; l < 4u; ++l) {
        const uint i = i0 + 4u * s + l;
        if (i < k.L) {
          const uint row = head_row(k, i);
          rec[row * RW + r] = exp(lg_of(i)) * x1[s][l];
          rec[row * RW + D + r] = exp(lgd(CH - 1u, i)) * x2[s][l];  // the dK~ term (in dK-)
          dw[row * D + r] = w[s][l];
        }
      }
  }
  if (pair_ok)
    [[unroll]] for (uint a = 0u; a < 2u; ++a)
      [[unroll]] for (uint b2 = 0u; b2 < 2u; ++b2) {
        const uint i = 2u * pi + a, j = 2u * pj + b2;
        if (i < CH && j < CH) {
          pairs[(wg * 2u) * CH * CH + i * CH + j] = dou[a][b2];
          pairs[(wg * 2u + 1u) * CH * CH + i * CH + j] = duv[a][b2];
        }
      }
  extra = subgroupAdd(extra);
  if (subgroupElect()) red[gl_SubgroupID] = extra;
  barrier();
  if (tid == 0u) {
    float x = 0.0;
    for (uint p = 0u; p < gl_NumSubgroups; ++p) x += red[p];
    sdot[wg] = exp(lgam) * x;
  }
}
