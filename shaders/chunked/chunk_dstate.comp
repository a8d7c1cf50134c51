#version 460
// Chunked backward, pass 2 of 4: the only serial pass. One workgroup per (window b, v-head h, block
// of 16 state columns) walks the chunks in reverse with dS (the gradient of the chunk's end state;
// after the window dht with STATE_CARRY, else zero) in shared memory, and leaves the last (the
// gradient of the window's start state) in dh0, where h0 was given. Columns are independent here.
// Per chunk (chunk.glsl for W, lg):
//   dU = P^T dO + K~ dS                           the gradient of the chunk's u rows (P^T dO: chunk_prep)
//   dS <- Gamma dS + Q^T diag(gamma) dO - W^T dU   the gradient of its start state
// dU and the chunk's dS (before the update) leave for chunk_values and chunk_grads, which do the rest in parallel.
// The chunk's rows pass through shared memory SUB at a time (a round), each round's operands loaded
// during the round before.
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#define WG 256u  // invocations
layout(local_size_x = WG) in;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (chunk_prep)
layout(set = 0, binding = 2) readonly buffer Wm4 { vec4 w4[]; };        // [B, T, nv, D/4] W (chunk_prep)
layout(set = 0, binding = 3) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 4) buffer Du { float du[]; };                 // [B, T, nv*D] P^T dO in, dU out
layout(set = 0, binding = 5) writeonly buffer Dsc { float dsc[]; };     // [B, nv, max(nch-1,1), D cols, D rows]
layout(set = 0, binding = 6) readonly buffer Dht { float dht[]; };      // [B, nv, D, D] S[k][v] (STATE_CARRY)
layout(set = 0, binding = 7) writeonly buffer Dh0 { float dh0[]; };     // [B, nv, D, D]

#define CHUNK_NO_GATES
#include "chunk.glsl"

// 16 columns a workgroup (8 per head): small enough (21 KB of shared memory) for two to share a
// multiprocessor, each with its own barriers, and a call of few windows still has many workgroups
#define COLS 16u        // state columns per workgroup
#define NWG (D / COLS)  // workgroups per (window, head)
#define SUB (WG / (D / 4u))  // chunk rows per round: SUB * D/4 = WG, one vec4 per invocation
#define RPO (COLS / 4u)      // dU: rows per octet (SUB * COLS outputs over WG / 8 octets)
#define CPI (COLS * D / WG)  // the update: columns of dS per invocation
#define DSP (D + 1u)  // padded column stride of ds: both passes below read it without bank conflicts

shared float ds[COLS * DSP];  // dS [column j][row r]
shared vec4 sk[SUB * D / 4u], sq[SUB * D / 4u], sw[SUB * D / 4u];  // k^, gamma q^, W [row i][r/4]
shared vec4 sdo[SUB * COLS / 4u], sdu[SUB * COLS / 4u];             // dO, dU [row i][column j/4]

// One thread's share of a round's operands, loaded a round ahead (software pipelining: the loads of
// the next round are in flight while this one computes).
struct Round {
  vec4 k, q, w;  // k^, q^, W of row e / (D/4), element group e % (D/4), e = tid (SUB*D/4 = WG)
  float dO;      // dO of row tid / COLS, column tid % COLS (tid < SUB * COLS)
  float pdo;     // P^T dO of row du_row(tid), column du_col(tid)
};

// dU's layout: octet o = tid / 8 (8 lanes of one subgroup) makes rows RPO (o / COLS) .. + RPO-1 of
// column o % COLS, lane rg = tid % 8 summing over the rows r of its vec4s r4 = rg + 8 m; the octet's
// sums end in lane rg as row RPO (o / COLS) + rg / (8 / RPO).
uint du_row(uint tid) { return tid / 8u / COLS * RPO + tid % 8u / (8u / RPO); }
uint du_col(uint tid) { return tid / 8u % COLS; }

// Sums p[ii] (RPO = 4 rows) over the 8 lanes of an octet (transpose-reduce: 4 shuffles); lanes rg
// and rg ^ 1 both get row rg / 2's total.
float octet_sum(float p[RPO], uint rg) {
  float a[2];
  const bool b2 = (rg & 4u) != 0u, b1 = (rg & 2u) != 0u;
  [[unroll]] for (uint l = 0u; l < 2u; ++l)
    a[l] = (b2 ? p[l + 2u] : p[l]) + subgroupShuffleXor(b2 ? p[l] : p[l + 2u], 4u);
  const float c = (b1 ? a[1] : a[0]) + subgroupShuffleXor(b1 ? a[0] : a[1], 2u);
  return c + subgroupShuffleXor(c, 1u);
}

Round fetch(Chunk k, uint i0, uint tid, uint blk) {
  Round f;
  f.k = vec4(0.0); f.q = vec4(0.0); f.w = vec4(0.0); f.dO = 0.0; f.pdo = 0.0;
  const uint i = i0 + tid / (D / 4u), r4 = tid % (D / 4u);
  if (i < k.L) {
    const uint bt = k.b * pc.t + k.t0 + i;
    f.k = qkn4[qk_at(QK_K, bt, k.ko) / 4u + r4];
    f.q = qkn4[qk_at(QK_Q, bt, k.ko) / 4u + r4];
    f.w = w4[head_row(k, i) * (D / 4u) + r4];
  }
  const uint iu = i0 + tid / COLS;
  if (iu < k.L && tid < SUB * COLS) f.dO = do_in[head_row(k, iu) * D + blk * COLS + tid % COLS];
  const uint id = i0 + du_row(tid);
  if (id < k.L) f.pdo = du[head_row(k, id) * D + blk * COLS + du_col(tid)];
  return f;
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*NWG + block
  if (wg >= pc.nb * pc.nv * NWG) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint bh = wg / NWG, blk = wg % NWG;
  const uint slots = max(nch, 2u) - 1u;
  for (uint e = tid; e < COLS * D; e += WG) {
    const uint j = e / D, rr = e % D;
    ds[j * DSP + rr] = has(STATE_CARRY) ? dht[(bh * D + rr) * D + blk * COLS + j] : 0.0;
  }
  const uint r = tid % D, jg = tid / D;        // the update: row r of dS, CPI columns jg*CPI ..
  const uint ju = du_col(tid), iu = du_row(tid), rg = tid % 8u;  // dU: column ju, row iu of the round's rows
  Round next = fetch(chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u), 0u, tid, blk);
  vec2 lg_next = tid < CH ? chunk_lg(chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u), tid) : vec2(0.0);

  for (uint cc = 0u; cc < nch; ++cc) {
    const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, nch - 1u - cc);
    // (the previous chunk's readers of lg, ds and the staged rows are done: its last barrier)
    if (tid < CH) {
      lg[tid] = lg_next.x;
      lgl[tid] = lg_next.y;
    }
    if (tid < CH && k.c > 0u) lg_next = chunk_lg(chunk_of(bh / pc.nv, bh % pc.nv, k.c - 1u), tid);  // ahead
    barrier();
    const float lgam = lg_of(CH - 1u);
    // The chunk's end-state gradient, for chunk_values (the last chunk's is dht: not stored).
    if (k.c + 1u < nch)
      for (uint e = tid; e < COLS * D; e += WG) {
        const uint j = e / D, rr = e % D;
        dsc[((bh * slots + k.c) * D + blk * COLS + j) * D + rr] = ds[j * DSP + rr];
      }
    float acc[CPI];
    [[unroll]] for (uint jj = 0u; jj < CPI; ++jj) acc[jj] = exp(lgam) * ds[(jg * CPI + jj) * DSP + r];

    for (uint i0 = 0u; i0 < k.L; i0 += SUB) {
      if (i0 > 0u) barrier();  // the previous round's readers are done (the first round's: above)
      const Round cur = next;
      sk[tid] = cur.k;
      sq[tid] = exp(lg_of(min(i0 + tid / (D / 4u), CH - 1u))) * cur.q;
      sw[tid] = cur.w;
      if (tid < SUB * COLS) sdo[tid / 4u][tid % 4u] = cur.dO;
      if (i0 + SUB < k.L) next = fetch(k, i0 + SUB, tid, blk);
      else if (k.c > 0u) next = fetch(chunk_of(bh / pc.nv, bh % pc.nv, k.c - 1u), 0u, tid, blk);
      barrier();
      // dU[i][j] = (P^T dO)[i][j] + (Gamma / gamma_i) <k_i, dS[:, j]>
      {
        // (ds and sk reads conflict-free: a subgroup's 4 octets take 4 adjacent columns, DSP odd;
        // an octet's lanes 8 adjacent vec4s of a row, shared by the 4 octets)
        float p[RPO];
        [[unroll]] for (uint ii = 0u; ii < RPO; ++ii) p[ii] = 0.0;
        const uint ib = iu - rg / (8u / RPO);  // the octet's first row
        [[unroll]] for (uint m = 0u; m < D / 32u; ++m) {
          const uint r4 = rg + 8u * m, at = ju * DSP + 4u * r4;
          const vec4 d4 = vec4(ds[at], ds[at + 1u], ds[at + 2u], ds[at + 3u]);
          [[unroll]] for (uint ii = 0u; ii < RPO; ++ii) {
            const vec4 k4 = sk[(ib + ii) * (D / 4u) + r4];
            p[ii] = fma(k4.x, d4.x, fma(k4.y, d4.y, fma(k4.z, d4.z, fma(k4.w, d4.w, p[ii]))));
          }
        }
        const float a = octet_sum(p, rg);
        const uint i = i0 + iu;
        const bool writer = rg % (8u / RPO) == 0u;  // one lane of those holding the row's total
        float x = 0.0;
        if (i < k.L) {
          x = cur.pdo + exp(lgd(CH - 1u, i)) * a;
          if (writer) du[head_row(k, i) * D + blk * COLS + ju] = x;
        }
        if (writer) sdu[(iu * COLS + ju) / 4u][ju % 4u] = x;
      }
      barrier();
      // dS[r][j] += sum_i gamma_i q_i[r] dO[i][j] - W[i][r] dU[i][j], for the round's rows
      for (uint il = 0u; il < SUB; ++il) {
        const float qv = sq[il * (D / 4u) + r / 4u][r % 4u];
        const float wv = sw[il * (D / 4u) + r / 4u][r % 4u];
        [[unroll]] for (uint j4 = 0u; j4 < CPI / 4u; ++j4) {
          const uint at = (il * COLS + jg * CPI) / 4u + j4;
          const vec4 a = sdo[at], b = sdu[at];
          [[unroll]] for (uint l = 0u; l < 4u; ++l) acc[4u * j4 + l] = fma(qv, a[l], fma(-wv, b[l], acc[4u * j4 + l]));
        }
      }
    }
    barrier();  // every dU of the chunk has read the old dS, and every reader of lg and the staged rows is done
    [[unroll]] for (uint jj = 0u; jj < CPI; ++jj) ds[(jg * CPI + jj) * DSP + r] = acc[jj];
  }
  barrier();
  for (uint e = tid; e < COLS * D && has(STATE_H0); e += WG) {
    const uint j = e / D, rr = e % D;
    dh0[(bh * D + rr) * D + blk * COLS + j] = ds[j * DSP + rr];
  }
}
