#version 460
// Chunked forward on the matrix units: the recurrence of a window as one serial pass over its
// chunks of CH = 16 tokens (chunk.glsl), from the operators chunk_prep_fwd made for every chunk at
// once (T, P, lg). With S0 the state at the chunk's start:
//   U = T diag(beta) (V - K^ S0)   the chunk's u rows (the tape keeps them in place of kv);
//                                  K^ = diag(gamma) K, so that W S0 = T diag(beta) K^ S0 (W is not made)
//   O = diag(gamma) Q S0 + P U     the chunk's output rows, before the norm
//   S_end = Gamma S0 + K~^T U      K~ = diag(Gamma / gamma) K
// The layout (chunk_mma.glsl, shared with chunk_dstate_mma, this pass's backward): S^T [column][row]
// in registers, so that the register-held matrices stay on the left of the products:
//   U^T = (V^T - S^T K^^T) (T diag(beta))^T,   O^T = S^T Q~^T + U^T P^T,   S^T <- Gamma S^T + U^T K~
// The gated RMSNorm of norm_fwd2 is fused in: each chunk's O rows leave as the layer's output
//   out = O / sqrt(mean(O^2) + eps) * norm * silu(z)
// (each subgroup sums its 16 columns of every row, the workgroup adds the 8 sums), and O itself, u,
// X = V - K^ S0 and 1/rms only where a tape keeps them for the backward (chunk_pair_bwd_mma's dT
// and dbeta are products with X). With SPLIT > 1 (chunk_mma.glsl) O always leaves, and norm_fwd2
// makes the output from it.
// Precision: fp32 operands as fp16 pairs, mma.glsl. A subgroup's 16 state columns evolve apart from
// the others' (the delta rule is separable along the value dims), so each subgroup keeps its own
// scales, two of them, since S is about |k^| times V and k^ is small where qkv is: it works on
// 2^eu V (so on 2^eu U and X), eu from the chunk's largest |v|, and on 2^es S, es set by each
// update from a bound on the new state (state_exponent, chunk_mma.glsl), and stores U, X, O and the
// states as their true values. vscale keeps each head's smallest eu and the smallest exponent that
// puts a state's exact largest value in [1, 2) (reduced off the chain, a chunk late), the scales of
// U and X and of S in the backward's products.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#ifndef SERIAL_SPLIT
#define SERIAL_SPLIT 1  // workgroups per (window, v-head): the builds <name>_split2, _split4 define 2, 4
#endif
#include "mma.glsl"

layout(constant_id = 0) const uint SG = 32;  // subgroups of 32 (the host requires exactly 32)
// The build that carries state (h0, ht; dht, dh0): a pipeline of its own, so that the plain build
// spends no registers on it.
layout(constant_id = 2) const bool STATES = false;

layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };    // the same, as vec4
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (chunk_prep_fwd)
layout(set = 0, binding = 2) readonly buffer Tm4 { vec4 t4[]; };        // [B, T, nv, CH/4] T (chunk_prep_fwd)
layout(set = 0, binding = 3) writeonly buffer Up4 { vec4 up4[]; };      // [B, T, nv*D/4] U (tape)
layout(set = 0, binding = 3) writeonly buffer Up { float up[]; };         // the same, as floats
layout(set = 0, binding = 4) readonly buffer Pm4 { vec4 p4[]; };        // [B, T, nv, CH/4] P (chunk_prep_fwd)
layout(set = 0, binding = 5) writeonly buffer O4 { vec4 o4[]; };        // [B, T, nv*D/4] o before the norm (tape)
layout(set = 0, binding = 6) writeonly buffer Ck { float ck[]; };       // [B, nv, pair slots, D cols, D rows]
layout(set = 0, binding = 7) readonly buffer Z4 { vec4 z4[]; };         // [B, T, nv*D/4] the norm's gate input
layout(set = 0, binding = 7) readonly buffer Z2 { uvec2 z2[]; };        // the same, bfloat16 (BF16_Z)
layout(set = 0, binding = 8) readonly buffer Norm4 { vec4 norm4[]; };   // [D/4] RMSNorm weight
layout(set = 0, binding = 9) writeonly buffer Out4 { vec4 out4[]; };    // [B, T, nv*D/4] the layer's output
layout(set = 0, binding = 9) writeonly buffer Out2 { uvec2 out2[]; };   // the same, bfloat16 (BF16_OUT)
layout(set = 0, binding = 10) writeonly buffer Inv { float inv_rms[]; };  // [B, T, nv] 1/rms (tape)
layout(set = 0, binding = 11) readonly buffer Gates { float gates[]; }; // [3][B, T, nv]: beta at [1]
layout(set = 0, binding = 12) readonly buffer Y4 { vec4 y4[]; };        // [B, T, nv*D/4] v (y_at)
layout(set = 0, binding = 13) writeonly buffer Xp4 { vec4 xp4[]; };     // [B, T, nv*D/4] X = V - K^ S0 (tape)
layout(set = 0, binding = 13) writeonly buffer Xp { float xp[]; };       // the same, as floats
layout(set = 0, binding = 14) writeonly buffer Vscale { float vscale[]; }; // [2][B, nv][SPLIT] eu, es (tape)
layout(set = 0, binding = 15) readonly buffer Eqk { float eqkb[]; };   // [B, nk, nch] eqk (chunk_prep_fwd)
layout(set = 0, binding = 16) readonly buffer Ep { float epb[]; };     // [B, nv, nch] ep (chunk_prep_fwd)
// the carried state, [B, nv, D, D] S[k][v]: the start (STATE_H0, else zero) and the end (STATE_CARRY)
layout(set = 0, binding = 17) readonly buffer H0 { float h0[]; };
layout(set = 0, binding = 18) writeonly buffer Ht { float ht[]; };

#include "chunk.glsl"
#define ROW_PART_SETS 2u  // a chunk's row sums are read during the next chunk's products
#if SERIAL_SPLIT > 1
// Split, the helper subgroups load everything a step takes, a chunk ahead: the first 128 of their
// invocations the operators (4 rows each), split into fp16 pairs as their loads come in and stored
// between the barriers; helper NSG + s subgroup s's V, which it stages scaled, with its largest
// value; and the chunk's scalars. The subgroups that hold columns load nothing (no load of theirs
// is in flight during their products, nor held across them).
#define OPERATOR_FETCHERS 128u
#endif
#include "chunk_mma.glsl"
#if SERIAL_SPLIT > 1
// The helpers' hand-over to the column subgroups: the chunk's largest |v| at column subgroup s's
// columns (at s), and the chunk's lg (hi, lo) of its last row, eqk and ep (at 0 .. 3). 8 floats
// each: sized NSG and 4, the split-4 build (an 8-byte vmax_stage) gave NaN on the H100 (NVIDIA
// 580), its indices all in range (cause not found); split 2 (16 bytes) and 8 floats were right.
shared float vmax_stage[8];
shared float scalar_stage[8];
#endif

// The lane's elements (tile_row, tile_lane) of chunk k's V rows at the subgroup's 16 columns from
// col0; rows past the chunk are zero.
void fetch_v(Chunk k, uint lane, uint col0, out vec4 x[2]) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint i = tile_row(lane, e);
    x[e] = i < k.L ? y4[(y_at(k.b * pc.t + k.t0 + i, k.h) + col0 + 4u * (lane % 4u)) / 4u]
                   : vec4(0.0);
  }
}

// The layer's output rows of chunk k from its O rows (the lane's o8; z as FETCH_STREAM loaded it)
// once every subgroup's row sums of O^2 are in row_part (set k.c % 2).
void put_output(Chunk k, vec4 o8[2], vec4 z[2], vec4 nw, uint col0, uint lane, uint sg) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint i = tile_row(lane, e);
    if (i < k.L) {
      const float inv = 1.0 / sqrt(row_total(i, k.c & 1u) / float(D) + pc.eps);
      const vec4 y = o8[e] * inv * nw * silu(stream_value(BF16_Z, z[e]));
      const uint at = tile_at(k, i, col0, lane);
      if (bf16(BF16_OUT))
        out2[at] = round_bf16x4(y);
      else
        out4[at] = y;
      if (pc.keep != 0u && sg == 0u && lane % 4u == 0u) inv_rms[head_row(k, i)] = inv;
    }
  }
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint bh = split_head();  // b*nv + h
  if (bh >= pc.nb * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint b = bh / pc.nv, h = bh % pc.nv;
  const uint slots = max((nch + 1u) / 2u, 2u) - 1u;  // checkpoints: one per pair of chunks but the first
  const uint col0 = split_col0(sg);                  // the subgroup's first state column
  const bool cols = holds_columns(sg);  // else a helper: it loads and stages (split: all a step takes)
  // the invocation's share of the operators' fetch and staging (OPERATOR_FETCHERS)
  const uint fid = SPLIT == 1u ? tid : cols ? 0u : tid - NSG * 32u;
  const bool fetches = SPLIT == 1u || (!cols && fid < OPERATOR_FETCHERS);
  // the subgroups that load V: each its own (unsplit), helper NSG + s subgroup s's (split)
  const bool v_helper = SPLIT > 1u && !cols && sg - NSG < NSG;
  const bool loads_v = SPLIT == 1u || v_helper;
  const uint v_col0 = v_helper ? split_col0(sg - NSG) : col0;
  const uint t_u = sg * 512u, t_o = t_u + 256u;      // its two tiles: V (then U on its way out), O
  const uint t_lane = tile_lane(lane);
  // The lane's share of the norm: rows tile_row(lane, e) of each chunk, columns col0 + 4 (lane % 4) ..
  const vec4 nw = norm4[(col0 + 4u * (lane % 4u)) / 4u];

  int es = 0;                   // the exponent of the state now
  int eu_min = int(NO_EXPONENT), es_min = int(NO_EXPONENT);  // the smallest eu and scale_exponent(|S|) over the window
                                   // (of chunks with nonzero values)
  F32M st[8];  // 2^es S^T: [column][row 16 rt ..]
  if (STATES && has(STATE_H0)) {  // S^T's tiles are column-major loads of h0's [k][v] rows; es from its largest value
    float m = 0.0;  // the lane's largest |S0|
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
      coopMatLoadNV(st[rt], h0, (bh * D + 16u * rt) * D + col0, D, true);
      m = max(m, tile_absmax(st[rt]));
    }
    es = state_exponent(subgroup_max32(m));
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) st[rt] = st[rt] * pow2(es);
  } else {
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) st[rt] = F32M(0.0);
  }

  // A chunk's operators and V are loaded while the chunk before makes its products, from the barrier
  // after which that chunk's staged copies are all that is read (their registers are free then),
  // so that their latency is off the serial chain (loaded after the products, they had only the state
  // update to land).
  Operators next = no_operators();
#if SERIAL_SPLIT > 1
  SplitOperators prep = no_split_operators();  // split: a fetcher's share of the next chunk's, split as loaded
  OperatorScalars next_sc = OperatorScalars(vec2(0.0), 0, 0);
#endif
  vec4 v_next[2] = vec4[2](vec4(0.0), vec4(0.0));
  {
    const Chunk k0 = chunk_of(b, h, 0u);
#if SERIAL_SPLIT > 1
    if (fetches) {
      const Operators f = fetch_operators(k0, fid);
      prep = prepare_operators(f);
      next_sc = scalars_of(f);
    }
#else
    if (fetches) next = fetch_operators(k0, fid);
#endif
    if (loads_v) fetch_v(k0, lane, v_col0, v_next);
  }
  // the largest |v| of the next chunk's rows at the subgroup's (split: its V helper's) columns,
  // reduced during the chunk before
  float vmax_next = SUBGROUP_ABSMAX8(v_next);
  // A chunk's output waits for every subgroup's row sums: it is written while the next chunk's
  // products are in flight (the last chunk's after the loop), which saves a barrier per chunk.
  vec4 o_prev[2], z_prev[2];
  for (uint c = 0u; c < nch; ++c) {
    const Chunk k = chunk_of(b, h, c);
    const Operators cur = next;
    const vec4 v[2] = v_next;
    // the chunk's scales: eu of V, es of the state (split: the column subgroups' after the barriers)
#if SERIAL_SPLIT > 1
    float vmax;
    int eu;
    float inv_su;
    OperatorScalars cs;
#else
    const OperatorScalars cs = scalars_of(cur);
    const float vmax = vmax_next;
    const int eu = scale_exponent(vmax);
    if (vmax > 0.0) eu_min = min(eu_min, eu);
    const float inv_su = pow2(-eu);
#endif
    vec4 z[2];
    barrier();  // the previous chunk's readers of the staged operands are done, its row sums are in
#if SERIAL_SPLIT > 1
    if (fetches) store_operators(prep, fid);
    if (v_helper) {  // subgroup s's V tile, 2^eu V
      const uint s = sg - NSG;
      [[unroll]] for (uint e = 0u; e < 2u; ++e) PUT_TILE4(s * 512u + t_lane + 128u * e, pow2(scale_exponent(vmax_next)) * v[e])
      if (lane == 0u) vmax_stage[s] = vmax_next;
    }
    if (fetches && fid == 0u) {
      scalar_stage[0] = next_sc.lgam.x;
      scalar_stage[1] = next_sc.lgam.y;
      scalar_stage[2] = float(next_sc.eqk);
      scalar_stage[3] = float(next_sc.ep);
    }
#else
    stage_operators(cur, tid);
    if (cols) [[unroll]] for (uint e = 0u; e < 2u; ++e) PUT_TILE4(t_u + t_lane + 128u * e, pow2(eu) * v[e])
#endif
    barrier();
#if SERIAL_SPLIT > 1
    vmax = vmax_stage[min(sg, NSG - 1u)];
    eu = scale_exponent(vmax);
    if (vmax > 0.0) eu_min = min(eu_min, eu);
    inv_su = pow2(-eu);
    cs = OperatorScalars(vec2(scalar_stage[0], scalar_stage[1]), int(scalar_stage[2]), int(scalar_stage[3]));
#endif
    // z after the barriers: loaded before them, its bfloat16 loads held up the barriers' wait. A
    // float32 z is the chunk's own, held a step until its output; unsplit, a bfloat16 z is the chunk
    // before's, loaded in the step that writes its output (each the faster of the two). (The split
    // builds, whose output norm_fwd2 makes, load it unused: skipped there, they were no faster, and
    // slower in bfloat16.)
    if (!bf16(BF16_Z) || SPLIT > 1u)
      FETCH_STREAM(BF16_Z, z4, z2, k, lane, col0, z)
    else if (c > 0u)
      FETCH_STREAM(BF16_Z, z4, z2, chunk_of(b, h, c - 1u), lane, col0, z)
    if (SPLIT == 1u && c + 1u < nch) {  // the next chunk's operands (cur and v are staged; split: the helpers', below)
      const Chunk k1 = chunk_of(b, h, c + 1u);
      next = fetch_operators(k1, tid);
      fetch_v(k1, lane, col0, v_next);
    }
    if (cols) {  // the subgroup's columns (a helper waits at the next chunk's first barrier)
      // The state at the start of each pair of chunks, for the backward (chunk_pair_bwd_mma makes the
      // one between them again; chunk 0 starts at h0 or zero: not stored).
      if (pc.keep != 0u && c > 0u && c % 2u == 0u)
        [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
          coopMatStoreNV(st[rt] * pow2(-es), ck, ((bh * slots + c / 2u - 1u) * D + col0) * D + 16u * rt, D, false);

      // -S^T K^^T and O^T = S^T Q~^T, sharing the split of S^T (K^^T, Q~^T: column-major loads), at
      // 2^(es + eqk); then X^T = V^T - S^T K^^T at 2^eu, and U^T = X^T (T diag(beta))^T
      F32M x = F32M(0.0), x_lo = F32M(0.0), o = F32M(0.0), o_lo = F32M(0.0);
      float s_lane = 0.0;  // the lane's largest |2^es S|
#if SERIAL_SPLIT > 1
      // X's sums in two chains, the even row tiles' in x and the odd ones' in x2: split, a
      // multiprocessor quarter runs one column subgroup, which has nothing else to issue while a sum
      // waits for the one before
      F32M x2 = F32M(0.0), x2_lo = F32M(0.0);
#endif
      // row tile rt's products: -S^T K^^T into x (split: the odd tiles' into x2), S^T Q~^T into o
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
        F16M sh, sl, bh_, bl;
        s_lane = max(s_lane, tile_absmax(st[rt]));
        split_state(st[rt], sh, sl);
        coopMatLoadNV(bh_, xh, 4u * rt, DP, true);  // -K^
        coopMatLoadNV(bl, xl, 4u * rt, DP, true);
#if SERIAL_SPLIT > 1
        if ((rt & 1u) != 0u) {
          MMA_SPLIT(x2, x2_lo, sh, sl, bh_, bl)
        } else
#endif
        MMA_SPLIT(x, x_lo, sh, sl, bh_, bl)
        coopMatLoadNV(bh_, qh, 4u * rt, DP, true);
        coopMatLoadNV(bl, ql, 4u * rt, DP, true);
        MMA_SPLIT(o, o_lo, sh, sl, bh_, bl)
      }
#if SERIAL_SPLIT > 1
      x = x + x2;
      x_lo = x_lo + x2_lo;
#endif
      // the chunk before's output, while the products are in flight (its row sums are in set
      // (c - 1) % 2; this chunk's go to the other)
      if (SPLIT == 1u && c > 0u) put_output(chunk_of(b, h, c - 1u), o_prev, bf16(BF16_Z) ? z : z_prev, nw, col0, lane, sg);
      F32M u = F32M(0.0);
      {
        F16M xh, xl, bh_, bl;
        F32M vt;
        coopMatLoadNV(vt, tiles, t_u, 16u, true);  // 2^eu V^T [column][j]
        const F32M xs = vt + unsplit(x, x_lo) * pow2(eu - es - cs.eqk);
        if (pc.keep != 0u) {  // X for the backward: a whole chunk's rows straight from the registers
          if (k.L == CH) {
            coopMatStoreNV(xs * inv_su, xp, head_row(k, 0u) * D + col0, pc.nv * D, true);  // X [i][column]
          } else {  // the last chunk of a window, short: its rows through the V tile (free since V^T was loaded)
            TILE_SYNC()  // every lane's load of V^T is done
            coopMatStoreNV(xs * inv_su, tiles, t_u, 16u, true);
            TILE_SYNC()
            STORE_TILE_ROWS(xp4, k, lane, col0, t_u, t_lane)
            TILE_SYNC()  // read before U takes the tile
          }
        }
        split(xs, xh, xl);
        coopMatLoadNV(bh_, th, 0u, PP, true);
        coopMatLoadNV(bl, tl, 0u, PP, true);
        mma_split_into(u, xh, xl, bh_, bl);
      }
      const float s_start = subgroup_max32(s_lane) * pow2(-es);  // the largest |S0| of the subgroup's columns
      if (s_start > 0.0) es_min = min(es_min, scale_exponent(s_start));
      const float u_max = subgroup_max32(tile_absmax(u));  // of 2^eu U
      F16M uh, ul;
      split(u, uh, ul);
      {  // O^T += U^T P^T (P^T [j][i]: a column-major load of P [i][j]), each scaled back
        F16M bh_, bl;
        coopMatLoadNV(bh_, ph, 0u, PP, true);
        coopMatLoadNV(bl, pl, 0u, PP, true);
        F32M op = F32M(0.0);
        mma_split_into(op, uh, ul, bh_, bl);
        o = unsplit(o, o_lo) * pow2(-(es + cs.eqk)) + op * pow2(-(eu + cs.ep));
      }
      // U for the tape: a whole chunk's rows straight from the registers, as X; a short last chunk's
      // through the V tile with O
      const bool u_tile = pc.keep != 0u && k.L < CH;
      if (pc.keep != 0u && k.L == CH) coopMatStoreNV(u * inv_su, up, head_row(k, 0u) * D + col0, pc.nv * D, true);  // U [i][column]
      if (u_tile) coopMatStoreNV(u * inv_su, tiles, t_u, 16u, true);
      coopMatStoreNV(o, tiles, t_o, 16u, true);  // O [i][column]
      TILE_SYNC()
      vec4 o8[2];  // the lane's elements of O
      [[unroll]] for (uint e = 0u; e < 2u; ++e) {
        const uint i = tile_row(lane, e), at = tile_at(k, i, col0, lane);
        o8[e] = TILE4_AT(t_o + t_lane + 128u * e);
        if (i < k.L) {
          if (u_tile) up4[at] = TILE4_AT(t_u + t_lane + 128u * e);
          if (pc.keep != 0u || SPLIT > 1u) o4[at] = o8[e];
        }
        if (SPLIT == 1u) put_row_part(dot(o8[e], o8[e]), sg, lane, e, c & 1u);  // the sum of O^2 over the row
      }

      const float gam = exp(cs.lgam.x + cs.lgam.y);

      // S^T <- Gamma S^T + U^T K~   (K~: row-major loads of the stage), the product at 2^(eu + eqk), the
      // sum to 2^en (state_exponent) from the bound Gamma |S0| + 16 rows of |K~| < 2^(1 - eqk) (eqk is
      // from the chunk's largest |k^|, the decays are at most 1) times |U|.
      if (SPLIT == 1u) vmax_next = SUBGROUP_ABSMAX8(v_next);  // (stale after the last chunk: unused)
      const int en = state_exponent(gam * s_start + 32.0 * u_max * pow2(-(eu + cs.eqk)));
      const float to_p = gam * pow2(eu + cs.eqk - es), from_p = pow2(en - eu - cs.eqk);
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
        F16M bh_, bl;
        coopMatLoadNV(bh_, kh, 4u * rt, DP, false);
        coopMatLoadNV(bl, kl, 4u * rt, DP, false);
        F32M acc = st[rt] * to_p, lo = F32M(0.0);
        MMA_SPLIT(acc, lo, uh, ul, bh_, bl)
        st[rt] = unsplit(acc, lo) * from_p;
      }
      es = en;

      // (the next chunk reads these row sums in its products and writes the other set; the chunk
      // after it writes this set after its second barrier, by when those reads are done)
      o_prev = o8;
      z_prev = z;
#if SERIAL_SPLIT > 1
      prep = no_split_operators();  // (the helpers' alone: none of it is live in the products)
      v_next = vec4[2](vec4(0.0), vec4(0.0));
#endif
    }
#if SERIAL_SPLIT > 1
    else if (c + 1u < nch) {  // the helpers: the next chunk's operators and V
      const Chunk k1 = chunk_of(b, h, c + 1u);
      if (fetches) {
        const Operators f = fetch_operators(k1, fid);
        prep = prepare_operators(f);
        next_sc = scalars_of(f);
      }
      if (v_helper) {
        fetch_v(k1, lane, v_col0, v_next);
        vmax_next = SUBGROUP_ABSMAX8(v_next);
      }
    }
#endif
  }
  if (STATES && has(STATE_CARRY) && cols)
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
      coopMatStoreNV(st[rt] * pow2(-es), ht, (bh * D + 16u * rt) * D + col0, D, true);
  if (SPLIT == 1u) {
    barrier();
    if (bf16(BF16_Z)) FETCH_STREAM(BF16_Z, z4, z2, chunk_of(b, h, nch - 1u), lane, col0, z_prev)
    put_output(chunk_of(b, h, nch - 1u), o_prev, z_prev, nw, col0, lane, sg);
  }
  const float eu_head = workgroup_min_after(float(eu_min), sg, lane);
  const float es_head = workgroup_min_after(float(es_min), sg, lane);
  if (tid == 0u) {  // the workgroup's slot (HEAD_EXPONENT, mma.glsl)
    const uint part = linear_group() % SPLIT;
    vscale[bh * SPLIT + part] = eu_head;
    vscale[(pc.nb * pc.nv + bh) * SPLIT + part] = es_head;
  }
}
