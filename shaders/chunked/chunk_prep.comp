#version 460
// Chunked backward, pass 1 of 4: one workgroup per (window b, k-head, chunk c) builds, for each
// v-head h that shares the k-head, the chunk's intra-chunk operators (chunk.glsl): T = (I + A)^-1
// and W = T diag(beta gamma) K, and the part of the gradient of the chunk's u rows that stays inside
// the chunk, P^T dO (chunk_dstate adds the rest); and stores the chunk's cumulative log gates lg for
// the other two passes. The pair dots <k_i, k_j>, <q_i, k_j> are the k-head's: made once for all
// its v-heads, and G = <k_i, k_j> left for chunk_grads in each v-head's pair-dot slot.
#include "common.glsl"
layout(local_size_x = 256) in;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) writeonly buffer Wm { float w_out[]; };    // [B, T, nv, D]  rows of W
layout(set = 0, binding = 4) writeonly buffer Tm { float t_out[]; };    // [B, T, nv, CH] rows of T
layout(set = 0, binding = 5) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 6) writeonly buffer Du { float du_out[]; };   // [B, T, nv*D] P^T dO
layout(set = 0, binding = 7) writeonly buffer Lgc { float lgc[]; };     // [2][B, T, nv] lg hi, lo (chunk.glsl)
// [B, nv, nch][4][CH][CH] chunk_grads' pair dots (chunk_grads.glsl): this pass writes G = <k_i, k_j> (slot 2)
layout(set = 0, binding = 8) writeonly buffer Pairs { float pairs[]; };

#define CHUNK_GATES_FROM_SCAN

#include "chunk.glsl"

#define TILE 16u  // key dims staged per round of the pair dot products
const uint CHP = (CH + 7u) / 8u * 8u;  // rows padded to a multiple of 8 (as chunk_grads)
const uint HR = CHP / 2u;

shared float sa[CH * CH];        // A [i][j]
shared vec4 sp4[CH * CHP / 4u];  // P [m][i] (i contiguous)
shared vec4 st4[CH * CHP / 4u];  // T^T [j][i] (i contiguous): W's loop reads 4 rows i at once
shared vec4 tile4[2u * TILE * CHP / 4u];  // k^, q^ [operand][key dim][row i]

// Staged element e of round r0: (operand k^ or q^, row i, key dim r0 + e % TILE), read along rows
// (coalesced), stored [operand][key dim][row] (rows contiguous); loaded one round ahead.
uint staged_at(uint e) { return (e / (TILE * CHP) * TILE + e % TILE) * CHP + (e / TILE) % CHP; }
float key_operand(Chunk k, uint r0, uint e) {
  const uint which = e / (TILE * CHP), i = (e / TILE) % CHP, r = r0 + e % TILE;
  if (i >= k.L || which > 1u) return 0.0;
  return which == 0u ? k_at(k, i, r) : q_at(k, i, r);
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nk + ko)*nch + c
  if (wg >= pc.nb * pc.nk * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint ratio = pc.nv / pc.nk, ko = (wg / nch) % pc.nk;  // v-heads ko*ratio .. share k-head ko
  const Chunk kc = chunk_of(wg / nch / pc.nk, ko * ratio, wg % nch);  // the k-head's rows

  // The pair dots <k_i, k_j>, <q_i, k_j>: invocation (pi, pj) owns the 2 x 2 block
  // (2 pi .. 2 pi + 1, 2 pj .. 2 pj + 1); the key dims pass through shared memory TILE at a time.
  const uint pi = tid / 16u, pj = tid % 16u;
  const bool pair_ok = pi < HR && pj < HR;
  vec2 kk[2], qk[2];
  kk[0] = vec2(0.0); kk[1] = vec2(0.0); qk[0] = vec2(0.0); qk[1] = vec2(0.0);
  const uint OP = TILE * CHP / 4u;
  float pre[4];  // this invocation's elements of the next round (2 * TILE * CHP / 256 <= 4)
  [[unroll]] for (uint q = 0u; q < 4u; ++q) pre[q] = key_operand(kc, 0u, tid + 256u * q);
  for (uint r0 = 0u; r0 < D; r0 += TILE) {
    barrier();
    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
      const uint e = tid + 256u * q;
      if (e < 2u * TILE * CHP) tile4[staged_at(e) / 4u][staged_at(e) % 4u] = pre[q];
    }
    if (r0 + TILE < D)
      [[unroll]] for (uint q = 0u; q < 4u; ++q) pre[q] = key_operand(kc, r0 + TILE, tid + 256u * q);
    barrier();
    if (pair_ok)
      for (uint rr = 0u; rr < TILE; ++rr) {
        const uint ai = rr * CHP + 2u * pi, aj = rr * CHP + 2u * pj;
        const vec2 ki = vec2(tile4[ai / 4u][ai % 4u], tile4[ai / 4u][ai % 4u + 1u]);
        const vec2 qi = vec2(tile4[OP + ai / 4u][ai % 4u], tile4[OP + ai / 4u][ai % 4u + 1u]);
        const vec2 kj = vec2(tile4[aj / 4u][aj % 4u], tile4[aj / 4u][aj % 4u + 1u]);
        [[unroll]] for (uint a = 0u; a < 2u; ++a) {
          kk[a] = fma(vec2(ki[a]), kj, kk[a]);
          qk[a] = fma(vec2(qi[a]), kj, qk[a]);
        }
      }
  }

  for (uint vh = 0u; vh < ratio; ++vh) {  // v-head kc.h + vh
    const Chunk k = chunk_of(kc.b, kc.h + vh, kc.c);
    barrier();  // the v-head before's readers of the gates and operators are done
    load_chunk_gates(k, tid);
    if (tid < k.L) {
      lgc[head_row(k, tid)] = lg[tid];
      lgc[pc.nb * pc.t * pc.nv + head_row(k, tid)] = lgl[tid];
    }
    // A and P of the v-head from the pair dots and its gates; G (rows past the chunk zero)
    if (pair_ok)
      [[unroll]] for (uint a = 0u; a < 2u; ++a)
        [[unroll]] for (uint b2 = 0u; b2 < 2u; ++b2) {
          const uint i = 2u * pi + a, j = 2u * pj + b2;
          if (i >= CH || j >= CH) continue;
          pairs[(((k.b * pc.nv + k.h) * nch + k.c) * 4u + 2u) * CH * CH + i * CH + j] = kk[a][b2];
          float av = 0.0, p = 0.0;
          if (j <= i && i < k.L) {
            const float decay = exp(lgd(i, j));
            if (j < i) av = bet[i] * decay * kk[a][b2];
            p = decay * qk[a][b2];
          }
          sa[i * CH + j] = av;
          sp4[(i * CHP + j) / 4u][j % 4u] = p;
        }
    for (uint e = tid; e < CH * CHP / 4u; e += 256u) st4[e] = vec4(0.0);
    for (uint e = tid; e < CH * CHP; e += 256u)
      if (e % CHP >= CH) sp4[e / 4u][e % 4u] = 0.0;  // the padding columns
    barrier();
    // T by forward substitution, T[i][m] = [i == m] - sum_{j < i} A[i][j] T[j][m] (T[j][m] = 0 for
    // j < m): column m depends on nothing but itself, so invocation m makes it alone, in registers
    // (the loops unrolled; every invocation reads the same A[i][j]), and one barrier follows.
    if (tid < CH) {
      const uint m = tid;
      float tc[CH];
      [[unroll]] for (uint i = 0u; i < CH; ++i) {
        float x = i == m ? 1.0 : 0.0;
        [[unroll]] for (uint j = 0u; j < i; ++j) x = fma(-sa[i * CH + j], tc[j], x);
        tc[i] = x;
        st4[(m * CHP + i) / 4u][i % 4u] = x;
      }
    }
    barrier();
    for (uint e = tid; e < CH * CH; e += 256u) {
      const uint i = e / CH, j = e % CH;
      if (i >= k.L) continue;
      t_out[head_row(k, i) * CH + j] = st4[(j * CHP + i) / 4u][i % 4u];
    }
    // W[i][r] = sum_{j <= i} T[i][j] beta_j gamma_j k_j[r] and (P^T dO)[i][r] = sum_{m >= i} P[m][i] dO[m][r]:
    // invocation (r, half) owns rows half*HR .. half*HR + HR-1 of column r.
    {
      const uint r = tid % D, i0 = (tid / D) * HR;
      vec4 w[HR / 4u], pd[HR / 4u];
      [[unroll]] for (uint s = 0u; s < HR / 4u; ++s) { w[s] = vec4(0.0); pd[s] = vec4(0.0); }
      for (uint j0 = 0u; j0 < k.L; j0 += 4u) {  // four rows' loads in flight at once
        float kj[4], dj[4];
        [[unroll]] for (uint jj = 0u; jj < 4u; ++jj) {
          const uint j = min(j0 + jj, k.L - 1u);
          kj[jj] = bet[j] * exp(lg_of(j)) * k_at(k, j, r);
          dj[jj] = do_in[head_row(k, j) * D + r];
        }
        [[unroll]] for (uint jj = 0u; jj < 4u; ++jj) {
          const uint j = j0 + jj;
          if (j >= k.L) break;
          [[unroll]] for (uint s = 0u; s < HR / 4u; ++s) {
            w[s] = fma(st4[(j * CHP + i0) / 4u + s], vec4(kj[jj]), w[s]);
            pd[s] = fma(sp4[(j * CHP + i0) / 4u + s], vec4(dj[jj]), pd[s]);
          }
        }
      }
      [[unroll]] for (uint s = 0u; s < HR / 4u; ++s)
        [[unroll]] for (uint l = 0u; l < 4u; ++l) {
          const uint i = i0 + 4u * s + l;
          if (i < k.L) {
            w_out[head_row(k, i) * D + r] = w[s][l];
            du_out[head_row(k, i) * D + r] = pd[s][l];
          }
        }
    }
  }
}
