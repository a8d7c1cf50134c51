#version 460
// The matrix units' chunked forward, pass 1 of 2: every chunk's operators for chunk_fwd_mma, all
// chunks at once. One workgroup per (window b, key head, chunk c) makes them for each v-head h of
// the key head's group (the nv / nk v-heads that share its k^ and q^), from the head-independent
// pair dots, made once per group (chunk.glsl's forms):
//   G = K K^T,   H = Q K^T
//   A_h[i][j] = beta_i exp(lg_i - lg_j) G[i][j]  (j < i),   T_h = (I + A_h)^-1
//   P_h[i][j] = exp(lg_i - lg_j) H[i][j]  (j <= i)
// with lg and beta of head h. Stores T, P and lg, the gates g, beta and a + dt_bias (gate_prep's
// work, fused in: the matrix units' forward runs no gate_prep), and G where a tape is kept (the
// backward's dbeta reads it). No pass makes W = T diag(beta gamma) K: the forward takes its products
// as ones with diag(gamma) K and T diag(beta), the backward as ones with diag(beta gamma) K and T.
// G and H are 16 x 16 x 128 products on the matrix units (mma.glsl): subgroup s makes their shares
// over key dims 16 s .. 16 s + 15 (from its q^, k^ scaled by a power of two, its shares scaled back),
// the workgroup adds the 8. The per-head part runs HB heads at a time (the group of the 27B shape, 3,
// in one batch).
// It also stores the exponents with which the later passes stage the chunk's operators (mma.glsl's
// scale_exponent): eqk from the largest |q^|, |k^| of the chunk (q^ and k^ are small when qkv is:
// the l2 norms' 1e-6 dominates below about 1e-3), ep from the largest |P_h| of each head.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 256) in;  // 8 subgroups of 32 (the host requires exactly 32)

layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };   // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 1) writeonly buffer Gates { float gates[]; }; // [3][B, T, nv]: g, beta, a + dt_bias
layout(set = 0, binding = 2) readonly buffer ALog { float a_log[]; };   // [nv]
layout(set = 0, binding = 3) writeonly buffer Tm { float t_out[]; };    // [B, T, nv, CH] rows of T
layout(set = 0, binding = 4) writeonly buffer Lgc { float lgc[]; };     // [2][B, T, nv] lg hi, lo (chunk.glsl)
layout(set = 0, binding = 5) writeonly buffer Pm { float p_out[]; };    // [B, T, nv, CH] rows of P
layout(set = 0, binding = 6) readonly buffer A { float a_in[]; };       // [B, T, nv] the layer's input a
layout(set = 0, binding = 6) readonly buffer A2 { uint a_h[]; };        // the same, bfloat16 pairs (BF16_A)
layout(set = 0, binding = 7) readonly buffer Bw { float b_in[]; };      // [B, T, nv] the layer's input b
layout(set = 0, binding = 7) readonly buffer Bw2 { uint b_h[]; };       // the same, bfloat16 pairs (BF16_B)
layout(set = 0, binding = 8) readonly buffer DtBias { float dt_bias[]; };  // [nv]
layout(set = 0, binding = 9) writeonly buffer Gm { float g_out[]; };    // [B, nk, nch, CH, CH] G (tape)
layout(set = 0, binding = 10) writeonly buffer Eqk { float eqk_out[]; };  // [B, nk, nch] eqk
layout(set = 0, binding = 11) writeonly buffer Ep { float ep_out[]; };    // [B, nv, nch] ep

// The chunk's rows: CH = 16 (the matrix units' chunk; the host builds this pass for no other).
#define R 16u
#define HB 4u    // v-heads per batch of the per-head part
shared float tiles[8u * 512u];  // per subgroup two fp32 16 x 16 tiles: k^, q^ [i][r]; then its shares of G, H [i][j]
shared float gram[R * R], hqk[R * R];  // G, H: [i][j]
shared float lgs[HB * R], lgsl[HB * R], bets[HB * R];  // the batch's lg (hi, lo: after the scan) and beta: [head][row]
shared float sa[HB * R * R];  // A_h [head][i][j]
shared float part_max[8u * HB];  // per subgroup: its largest |q^|, |k^|; then per head of a batch, |P_h|

float subgroup_max32(float x) {
  [[unroll]] for (uint m = 1u; m < 32u; m *= 2u) x = max(x, subgroupShuffleXor(x, m));
  return x;
}

// The gates of invocation (head hfirst + tid / R, row i = tid % R) of a batch of nh heads, made by
// make_gate as gate_prep makes them (this pass replaces it): stores g, beta, a + dt_bias for the
// later passes and returns (beta, log g); the padding rows and the invocations past the batch get (0, 0).
vec2 gate_row(uint tid, uint hfirst, uint nh, uint bt0, uint L) {
  const uint i = tid % R, h = hfirst + tid / R, n = pc.nb * pc.t * pc.nv;  // gates is [3][B, T, nv]
  if (tid >= nh * R || i >= L) return vec2(0.0);
  const uint at = (bt0 + i) * pc.nv + h;
  const float a = STREAM_AT(bf16(BF16_A), a_h, a_in, at);
  const float b = STREAM_AT(bf16(BF16_B), b_h, b_in, at);
  const Gate x = make_gate(a, b, a_log[h], dt_bias[h]);
  gates[at] = x.g;
  gates[n + at] = x.beta;
  gates[2u * n + at] = x.arg;
  return vec2(x.beta, x.lg);
}

void main() {
  const uint nch = (pc.t + R - 1u) / R;
  const uint wg = linear_group();  // (b*nk + ko)*nch + c
  if (wg >= pc.nb * pc.nk * nch) return;
  const uint tid = gl_LocalInvocationIndex;
  const uint b = wg / nch / pc.nk, ko = (wg / nch) % pc.nk, c = wg % nch;
  const uint t0 = c * R, L = min(R, pc.t - t0), group = pc.nv / pc.nk;
  const uint bt0 = b * pc.t + t0;  // row of the chunk's first token in [B, T, ...] tensors

  // The first batch's gates, loaded before the pair dots so that the two loads' latencies overlap.
  vec2 gr = gate_row(tid, ko * group, min(HB, group), bt0, L);

  {  // G and H: the subgroup's shares over its 16 key dims, then their sum
    const uint lane = gl_SubgroupInvocationID, t0k = gl_SubgroupID * 512u, t0q = t0k + 256u;
    vec4 ks[2] = vec4[2](vec4(0.0), vec4(0.0)), qs[2] = ks;
    [[unroll]] for (uint e = 0u; e < 2u; ++e) {  // the lane's share (tile_row, tile_lane) of the tiles
      const uint i = tile_row(lane, e);
      const uint r4 = 4u * gl_SubgroupID + lane % 4u;
      if (i < L) {
        qs[e] = qkn4[qk_at(QK_Q, bt0 + i, ko) / 4u + r4];
        ks[e] = qkn4[qk_at(QK_K, bt0 + i, ko) / 4u + r4];
      }
    }
    const float m = subgroup_max32(max(max4(max(abs(qs[0]), abs(qs[1]))), max4(max(abs(ks[0]), abs(ks[1])))));
    if (lane == 0u) part_max[gl_SubgroupID] = m;
    const int e_sub = scale_exponent(m);
    const float s_sub = pow2(e_sub);
    [[unroll]] for (uint e = 0u; e < 2u; ++e) {
      const uint at = tile_lane(lane) + 128u * e;
      PUT_TILE4(t0k + at, s_sub * ks[e])
      PUT_TILE4(t0q + at, s_sub * qs[e])
    }
    TILE_SYNC()
    F32M x;
    F16M kth, ktl, ah, al;
    coopMatLoadNV(x, tiles, t0k, 16u, true);  // K^T [r][j]
    split(x, kth, ktl);
    F32M g = F32M(0.0), hq = F32M(0.0);
    coopMatLoadNV(x, tiles, t0k, 16u, false);  // K [i][r]
    split(x, ah, al);
    mma_split_into(g, ah, al, kth, ktl);
    coopMatLoadNV(x, tiles, t0q, 16u, false);  // Q [i][r]
    split(x, ah, al);
    mma_split_into(hq, ah, al, kth, ktl);
    subgroupBarrier();  // every lane's loads of the tiles are done
    const float back = pow2(-2 * e_sub);
    coopMatStoreNV(g * back, tiles, t0k, 16u, false);
    coopMatStoreNV(hq * back, tiles, t0q, 16u, false);
    barrier();
    if (tid == 0u) {
      float mq = 0.0;
      [[unroll]] for (uint s = 0u; s < 8u; ++s) mq = max(mq, part_max[s]);
      eqk_out[wg] = float(scale_exponent(mq));  // wg = (b*nk + ko)*nch + c
    }
    float gs = 0.0, hs = 0.0;
    [[unroll]] for (uint s = 0u; s < 8u; ++s) {
      gs += tiles[s * 512u + tid];
      hs += tiles[s * 512u + 256u + tid];
    }
    gram[tid] = gs;
    hqk[tid] = hs;
    if (pc.keep != 0u) g_out[wg * R * R + tid] = gs;  // wg = (b*nk + ko)*nch + c
  }

  for (uint h0 = 0u; h0 < group; h0 += HB) {
    const uint nh = min(HB, group - h0);
    const uint hfirst = ko * group + h0;  // the batch's first v-head
    barrier();  // the last batch's readers of lgs, bets, sa are done (and the first's G, H are in)
    if (tid < HB * R) {  // (whole subgroups, for the shuffles)
      // lg: the inclusive scan of the head's log g over its R rows, lanes R hb .. R hb + R - 1
      float hi = gr.y, lo = 0.0;
      const uint lane = gl_SubgroupInvocationID;
      [[unroll]] for (uint d = 1u; d < R; d *= 2u) {
        const float up = subgroupShuffle(hi, lane >= d ? lane - d : lane);
        const float up_lo = subgroupShuffle(lo, lane >= d ? lane - d : lane);
        if (tid % R >= d) {
          add_two(hi, lo, up);
          lo += up_lo;
        }
      }
      lgs[tid] = hi;
      lgsl[tid] = lo;
      bets[tid] = gr.x;
      if (tid < nh * R && tid % R < L) {
        const uint at = (bt0 + tid % R) * pc.nv + hfirst + tid / R;
        lgc[at] = hi;
        lgc[pc.nb * pc.t * pc.nv + at] = lo;
      }
    }
    if (h0 + HB < group) gr = gate_row(tid, hfirst + HB, min(HB, group - h0 - HB), bt0, L);
    barrier();
    // A_h and P_h: invocation (i, j) of each head
    for (uint hb = 0u; hb < nh; ++hb) {
      const uint i = tid / R, j = tid % R;
      const float decay = j <= i ? exp(lg_diff(lgs[hb * R + i], lgsl[hb * R + i], lgs[hb * R + j], lgsl[hb * R + j])) : 0.0;
      sa[hb * R * R + tid] = j < i ? bets[hb * R + i] * decay * gram[tid] : 0.0;
      const float p = i < L ? decay * hqk[tid] : 0.0;
      if (i < L) p_out[((bt0 + i) * pc.nv + hfirst + hb) * R + j] = p;
      const float pm = subgroup_max32(abs(p));
      if (gl_SubgroupInvocationID == 0u) part_max[gl_SubgroupID * HB + hb] = pm;
    }
    barrier();
    if (tid < nh) {
      float mp = 0.0;
      [[unroll]] for (uint s = 0u; s < 8u; ++s) mp = max(mp, part_max[s * HB + tid]);
      ep_out[(b * pc.nv + hfirst + tid) * nch + c] = float(scale_exponent(mp));
    }
    if (tid < nh * R) {
      // Column m of T_h by forward substitution, T[i][m] = [i == m] - sum_{j < i} A[i][j] T[j][m] (rows
      // above m come out zero), in registers: the column depends on nothing but itself.
      const uint hb = tid / R, m = tid % R, h = hfirst + hb;
      float x[R];
      [[unroll]] for (uint i = 0u; i < R; ++i) {
        float s = i == m ? 1.0 : 0.0;
        [[unroll]] for (uint j = 0u; j < i; ++j) s = fma(-sa[(hb * R + i) * R + j], x[j], s);
        x[i] = s;
      }
      [[unroll]] for (uint i = 0u; i < R; ++i)
        if (i < L) t_out[((bt0 + i) * pc.nv + h) * R + m] = x[i];
    }
  }
}
