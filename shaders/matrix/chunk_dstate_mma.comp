#version 460
// Chunked backward on the matrix units, the serial pass: the sums of chunk_dstate.comp (which runs
// where the device has no cooperative matrices) as 16x16x16 products of GL_NV_cooperative_matrix,
// from the operators the matrix units' forward left on the tape (P, T, lg: no chunk_prep here).
//   dU = P^T dO + K~ dS                           K~ = diag(Gamma / gamma) K
//   Yv = T^T dU
//   dS <- Gamma dS + Q~^T dO - K^T diag(beta gamma) Yv    Q~ = diag(gamma) Q
// (W^T dU with W = T diag(beta gamma) K: no pass makes W). The layout (chunk_mma.glsl): dS^T
// [column][row] in registers; the transposed products put every register-held matrix on the left:
//   dU^T = dO^T P + dS^T K~^T,   Yv^T = dU^T T,   dS^T <- Gamma dS^T + dO^T Q~ - Yv^T diag(beta gamma) K
// The gated RMSNorm backward of norm_bwd2 is fused in: each chunk's dO rows are made here from the
// layer's output gradient, with w = norm * silu(z) (each subgroup sums its 16 columns of <w dout, o>
// before the chunk's first barrier, the workgroup adds the 8 sums and makes dO between the barriers
// of the staging: off the chain after them),
//   dz = dout * o * inv * norm * silu'(z),   dO = inv * w * dout - o * inv^3 * <w dout, o> / D
// (dz is the layer's gradient; dO leaves for chunk_pair_bwd_mma), and the chunk's share of the norm
// weight's gradient, sum over its rows of dout o inv silu(z) (no pass reads o, z, dout again for it).
// With SPLIT > 1 (chunk_mma.glsl) a workgroup holds a share of each row's columns, and helper
// subgroups make the norm's backward: <w dout, o> of whole rows (rsb below) and dO (hdo).
// Each chunk's dU leaves as Yv, the form every later use takes: dv = diag(beta) Yv (the layer's v
// gradient, made by conv_bwd as it reads it), dbeta's value-dim term sum_c X o Yv (the diagonal of
// the pair dot X Yv^T below, which chunk_factors reads there), and in chunk_pair_bwd_mma dT and dW
// through
//   T^T dT = (Yv X^T) diag(beta),   W^T dU = K^T diag(beta gamma) Yv,   dW^T T = -S^T Yv^T.
// Its stores are made off the serial chain: unsplit, at the end of the chunk's step while the state
// update's products are in flight; split, at the start of the next step while the next chunk's
// operators are on their way. So are the chunk's pair dots for
// chunk_pair_bwd_mma, <dO_i, u_j> and <Yv_i, x_j> over the value dims: each subgroup leaves its
// share (its 16 columns) in its two tiles, and the workgroup adds the 8 shares between the next
// step's two barriers (with SPLIT > 1, each workgroup's share of them: chunk_factors adds the shares).
// Precision: fp32 operands as fp16 pairs, mma.glsl. As in chunk_fwd_mma, each subgroup keeps its own
// scales for its 16 columns, chosen again at every chunk, one per quantity whose magnitude goes its
// own way (dS is about |q^| |dO|, dU and Yv |q^| |k^| |dO|, and q^, k^ are small where qkv is):
// 2^eo dO, eo from the chunk's largest |dO|; 2^ed dS, ed set by each update from a bound on the new
// state (state_exponent, chunk_mma.glsl); 2^eu dU and Yv, eu from the larger of the bounds of dU's
// two terms (P's and K~'s exponents, and the state's exact largest value, reduced beside the
// staging); and 2^ev U and X (the forward's exponent, vscale). It stores dO, Yv, dS and the pair dots as their true values; dscale keeps each
// head's smallest eo, ed and eu, the scales the later passes' products take dO, dS and Yv at.
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
layout(set = 0, binding = 1) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (the forward's)
layout(set = 0, binding = 2) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]: beta at [1]
layout(set = 0, binding = 3) writeonly buffer Do4 { vec4 do4[]; };      // [B, T, nv*D/4] grad of o, for the later passes
layout(set = 0, binding = 4) writeonly buffer Yv4 { vec4 yv4[]; };      // [B, T, nv*D/4] Yv = T^T dU
layout(set = 0, binding = 4) writeonly buffer Yv { float yv[]; };        // the same, as floats
layout(set = 0, binding = 5) writeonly buffer Dsc { float dsc[]; };     // [B, nv, pair slots, D cols, D rows]
layout(set = 0, binding = 6) readonly buffer Pm4 { vec4 p4[]; };        // [B, T, nv, CH/4] P (the forward's)
layout(set = 0, binding = 7) readonly buffer O4 { vec4 o4[]; };         // [B, T, nv*D/4] o before the norm (tape)
layout(set = 0, binding = 8) readonly buffer Z4 { vec4 z4[]; };         // [B, T, nv*D/4] the norm's gate input
layout(set = 0, binding = 8) readonly buffer Z2 { uvec2 z2[]; };        // the same, bfloat16 (BF16_Z)
layout(set = 0, binding = 9) readonly buffer Norm4 { vec4 norm4[]; };   // [D/4] RMSNorm weight
layout(set = 0, binding = 10) readonly buffer Inv { float inv_rms[]; }; // [B, T, nv] 1/rms (tape)
layout(set = 0, binding = 11) readonly buffer Dout4 { vec4 dout4[]; };  // [B, T, nv*D/4] grad of the output
layout(set = 0, binding = 11) readonly buffer Dout2 { uvec2 dout2[]; }; // the same, bfloat16 (BF16_DOUT)
layout(set = 0, binding = 12) writeonly buffer Dz4 { vec4 dz4[]; };     // [B, T, nv*D/4] grad of z
layout(set = 0, binding = 12) writeonly buffer Dz2 { uvec2 dz2[]; };    // the same, bfloat16 (BF16_DZ)
layout(set = 0, binding = 13) readonly buffer Tm4 { vec4 t4[]; };        // [B, T, nv, CH/4] T (the forward's)
layout(set = 0, binding = 14) readonly buffer X4 { vec4 x4[]; };         // [B, T, nv*D/4] X (chunk_fwd_mma's tape)
layout(set = 0, binding = 15) readonly buffer U4 { vec4 u4[]; };         // [B, T, nv*D/4] u (the forward's tape)
layout(set = 0, binding = 16) writeonly buffer Pdots { float pdots[]; }; // [B, nv, nch][SPLIT][2][16][16] <dO_i, u_j>, <Yv_i, x_j>
layout(set = 0, binding = 17) readonly buffer Vscale { float vscale[]; };  // [2][B, nv][SPLIT] eu, es (chunk_fwd_mma): ev = eu
layout(set = 0, binding = 18) writeonly buffer Dscale { float dscale[]; }; // [3][B, nv][SPLIT] eo, ed, eu
layout(set = 0, binding = 19) readonly buffer Eqk { float eqkb[]; };   // [B, nk, nch] eqk (chunk_prep_fwd)
layout(set = 0, binding = 20) readonly buffer Ep { float epb[]; };     // [B, nv, nch] ep (chunk_prep_fwd)
// the carried state's gradient, [B, nv, D, D] dS[k][v]: at the end (STATE_CARRY, else zero) and at
// the start
layout(set = 0, binding = 21) readonly buffer Dht { float dht[]; };
layout(set = 0, binding = 22) writeonly buffer Dh0 { float dh0[]; };
// each chunk's share of the norm weight's gradient, sum over its rows of dout o inv silu(z) (param_sum
// adds the chunks in order)
layout(set = 0, binding = 23) writeonly buffer DnormPart { vec4 dnorm_part4[]; };  // [B, nv, nch][D/4]

#include "chunk.glsl"
#define DSTATE_STAGE
#if SERIAL_SPLIT == 1
#define ROW_PART_SETS 2u  // a chunk's row sums are put before its first barrier, read between its barriers
#endif
#include "chunk_mma.glsl"

// SPLIT > 1: helper subgroup NSG + s makes the norm's backward of subgroup s's columns before each
// chunk's first barrier (the row sums from rsb below), and leaves 2^eo dO [i][column] and
// the largest |dO| here (two of each, by the chunk's parity: a chunk's are read until the next
// chunk's first barrier), so that the subgroups that hold columns start from dO. (The split builds'
// only: preprocessor conditions, so that the unsplit build holds none of their code.)
#if SERIAL_SPLIT > 1
shared float hdo[2u * NSG * 256u];
shared float hom[2u * NSG];
// The rows' <w dout, o> over all D columns, w = norm silu(z) (the norm's backward needs whole rows),
// of the chunk the norm helpers work on and of the next, by the chunk's parity: [parity][i]. Helper
// subgroups 4 .. 7 (row helpers) make them a chunk ahead, before the chunk's first barrier, as the
// norm helpers make dO: off the serial chain.
shared float rsb[2u * 16u];
// Rows 4 (sg - 4) .. + 3 of chunk k's <w dout, o> into rsb[slot] (rows past the chunk: 0). Lane l
// sums row 4 (sg - 4) + l / 8 at vec4s l % 8 + 8 j of it, the 8 lanes of the row add their sums.
void put_row_sums(Chunk k, uint sg, uint lane, uint slot) {
  const uint i = 4u * (sg - 4u) + lane / 8u;
  float s = 0.0;
  if (i < k.L) {
    const uint row = head_row(k, i);  // [B, T, nv] row of the [B, T, nv*D] tensors
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      const uint c4 = lane % 8u + 8u * j, at = row * (D / 4u) + c4;
      const vec4 z = bf16(BF16_Z) ? widen_bf16x4(z2[at]) : z4[at];
      const vec4 d = bf16(BF16_DOUT) ? widen_bf16x4(dout2[at]) : dout4[at];
      s += dot(norm4[c4] * silu(z) * d, o4[at]);
    }
  }
  [[unroll]] for (uint m = 1u; m < 8u; m *= 2u) s += subgroupShuffleXor(s, m);
  if (lane % 8u == 0u) rsb[slot * 16u + i] = s;
}
#endif

// The norm's inputs of chunk k, loaded a chunk ahead into main's o_next, inv_next, z_next and g_next:
// the lane's elements of its o, z and dout rows at the 16 columns from c0, and the forward's 1/rms
// of rows tile_row(lane, e) (rows past the chunk: 0).
#define FETCH_NORM_INPUTS(k, lane, c0)                                                                          \
  {                                                                                                             \
    FETCH_TILE(o4, k, lane, c0, o_next)                                                                         \
    [[unroll]] for (uint e_ = 0u; e_ < 2u; ++e_)                                                                \
      inv_next[e_] = tile_row(lane, e_) < (k).L ? inv_rms[head_row(k, tile_row(lane, e_))] : 0.0;             \
    FETCH_STREAM(BF16_Z, z4, z2, k, lane, c0, z_next)                                                           \
    FETCH_STREAM(BF16_DOUT, dout4, dout2, k, lane, c0, g_next)                                                  \
  }

// Yv of chunk k, held transposed and split as the state update took it (yh, yl: Yv^T [column][i]):
// stores Yv at the subgroup's 16 columns (a whole chunk's rows straight from the registers, a short
// chunk's through the subgroup's tile at t_at), then leaves its share of the pair dot X Yv^T ([j][i])
// in that tile (the step left U dO^T's in the dO tile). The lane's X rows (xr) of the chunk's rows
// tile_row(lane, e) come loaded.
// Yv^T and X come scaled by 2^eu and 2^ev: Yv is stored times inv_sc = 2^-eu, the share times
// inv_p = 2^-(ev + eu).
void yv_out(Chunk k, F16M yh, F16M yl, vec4 xr[2], uint t_at, uint lane, uint col0, float inv_sc, float inv_p) {
  const F32M y = (F32M(yh) + F32M(yl) * (1.0 / LO)) * inv_sc;  // (to 2^-22: the split's accuracy)
  if (k.L == CH) {
    coopMatStoreNV(y, yv, head_row(k, 0u) * D + col0, pc.nv * D, true);  // Yv [i][column]
  } else {
    coopMatStoreNV(y, tiles, t_at, 16u, true);  // Yv [i][column]
    TILE_SYNC()
    STORE_TILE_ROWS(yv4, k, lane, col0, t_at, tile_lane(lane))
    TILE_SYNC()  // the lanes' reads of the tile are done
  }
  F16M xh_, xl_;
  {
    F32M m;
    PUT_LANE_TILE(t_at, lane, xr)
    TILE_SYNC()
    coopMatLoadNV(m, tiles, t_at, 16u, false);  // X [j][c]
    split(m, xh_, xl_);
    TILE_SYNC()
  }
  F32M p = F32M(0.0);
  mma_split_into(p, xh_, xl_, yh, yl);
  coopMatStoreNV(p * inv_p, tiles, t_at, 16u, false);
}

// The subgroup's share of a chunk's pair dots U dO^T [j][i] (the lane's u rows, 2^eo dO^T split as
// oh, ol), times inv_p, into tile t_out; U passes through tile t_u. (Split, made while dU's products
// are in flight; unsplit, at the end of the step with yv_out, while the update's are.)
void u_do_share(vec4 u[2], F16M oh, F16M ol, float sv, float inv_p, uint t_u, uint t_out, uint lane) {
  F32M m;
  F16M ah, al;
  const vec4 us[2] = vec4[2](sv * u[0], sv * u[1]);
  PUT_LANE_TILE(t_u, lane, us)
  TILE_SYNC()  // and every lane's load of dO^T is done
  coopMatLoadNV(m, tiles, t_u, 16u, false);  // U [j][c]
  split(m, ah, al);
  m = F32M(0.0);
  mma_split_into(m, ah, al, oh, ol);
  coopMatStoreNV(m * inv_p, tiles, t_out, 16u, false);
}

// The pair dots of chunk k: the sums of the NSG subgroups' shares that yv_out left in their tiles
// (between two barriers), into the workgroup's slot; invocation tid at elements [j][i] = [e / 16][e % 16],
// e = tid (256 invocations, 256 elements).
void sum_pair_dots(Chunk k, uint bh, uint nch, uint tid) {
  const uint e = tid;
  float s_ou = 0.0, s_yx = 0.0;
  [[unroll]] for (uint g = 0u; g < NSG; ++g) {
    s_ou += tiles[g * 512u + e];
    s_yx += tiles[g * 512u + 256u + e];
  }
  const uint at = ((bh * nch + k.c) * SPLIT + linear_group() % SPLIT) * 512u + (e % 16u) * 16u + e / 16u;  // [i][j]
  pdots[at] = s_ou;
  pdots[at + 256u] = s_yx;
}

// The norm's backward of chunk k's rows tile_row(lane, e) at the 4 columns from col0 + 4 (lane % 4)
// (the lane's o, z, dout as g, 1/rms as inv, w dout as wd; rs the rows' <w dout, o>): dO, and the
// stores of dO (for the later passes) and dz.
void norm_backward(Chunk k, uint lane, uint col0, vec2 rs, float inv[2], vec4 wd[2], vec4 o[2], vec4 z[2], vec4 g[2],
                   vec4 nw, out vec4 dO[2]) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint i = tile_row(lane, e), at = tile_at(k, i, col0, lane);
    const float coef = rs[e] / float(D) * inv[e] * inv[e] * inv[e];
    dO[e] = inv[e] * wd[e] - o[e] * coef;
    if (i < k.L) {
      do4[at] = dO[e];
      const vec4 dz = g[e] * o[e] * inv[e] * nw * silu_bwd(z[e]);
      if (bf16(BF16_DZ))
        dz2[at] = round_bf16x4(dz);
      else
        dz4[at] = dz;
    }
  }
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint bh = split_head();  // b*nv + h
  if (bh >= pc.nb * pc.nv) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint b = bh / pc.nv, h = bh % pc.nv;
  const uint slots = max((nch + 1u) / 2u, 2u) - 1u;  // one per pair of chunks but the last
  const uint col0 = split_col0(sg);                  // the subgroup's first state column
  const bool cols = holds_columns(sg);  // else a helper: it stages operators, adds the pair dots and
                                        // (norm_helper) makes the norm's backward
  // SPLIT > 1: a helper that makes the norm's backward of subgroup hs's columns, from ncol0
  const uint hs = sg - min(sg, NSG);
  const bool norm_helper = SPLIT > 1u && !cols && hs < NSG;
  const uint ncol0 = norm_helper ? 16u * (NSG * (linear_group() % SPLIT) + hs) : col0;
  const uint t_do = sg * 512u, t_du = t_do + 256u;  // its two tiles: dO (then its U dO^T share), Yv (then X Yv^T)
  const uint t_lane = tile_lane(lane);
  // The lane's share of the norm: rows tile_row(lane, e) of each chunk, columns ncol0 + 4 (lane % 4) ..
  const vec4 nw = norm4[(ncol0 + 4u * (lane % 4u)) / 4u];

  const int ev = int(HEAD_EXPONENT(vscale, bh));
  const float sv = pow2(ev);
  int ed = 0, eu = 0;  // the exponents of dS (carried from chunk to chunk) and of the last chunk's dU, Yv
  int eo_min = int(NO_EXPONENT), ed_min = int(NO_EXPONENT), eu_min = int(NO_EXPONENT);  // the smallest over the window (of chunks with nonzero values;
                                                  // for dS the exponent of its largest value)
  float s_lane = 0.0;  // the lane's largest |2^ed dS|, made as the update leaves its tiles

  // dS^T's tiles from dht (STATE_CARRY): column-major loads of its [k][v] rows; ed from its largest
  // value
#define LOAD_DHT()                                                                    \
  {                                                                                   \
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {                                    \
      coopMatLoadNV(dst[rt], dht, (bh * D + 16u * rt) * D + col0, D, true);           \
      s_lane = max(s_lane, tile_absmax(dst[rt]));                                     \
    }                                                                                 \
    ed = state_exponent(subgroup_max32(s_lane));                                      \
    const float sc = pow2(ed);                                                        \
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) dst[rt] = dst[rt] * sc;              \
    s_lane *= sc;                                                                     \
  }
  F32M dst[8];  // 2^ed dS^T: [column][row 16 rt ..]
#if SERIAL_SPLIT > 1
  // (the split builds load dht in the loop's first step, the unsplit one here: each measured faster
  // so, docs/performance.md)
  [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) dst[rt] = F32M(0.0);
#else
  if (STATES && has(STATE_CARRY)) LOAD_DHT()
  else {
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) dst[rt] = F32M(0.0);
  }
#endif

  // A chunk's o, z, dout rows and 1/rms (the norm's inputs) and u rows are loaded while the chunk
  // after it (the one before in this pass's order) updates its state, so that their latency is off
  // the chain.
  // Its operators are loaded here, not a chunk ahead: ahead measured slower wherever they were loaded
  // (their registers cost more than the latency they hide).
  // (Split, the subgroups that hold columns load u only, the norm helpers the norm's inputs only.)
  vec4 o_next[2], z_next[2], g_next[2], u_next[2];  // z and dout (g) as FETCH_STREAM loads them
  float inv_next[2];  // 1/rms of the lane's two rows
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    o_next[e] = vec4(0.0); z_next[e] = vec4(0.0); g_next[e] = vec4(0.0); u_next[e] = vec4(0.0);
    inv_next[e] = 0.0;
  }
  {
    const Chunk k0 = chunk_of(b, h, nch - 1u);
    if (cols) FETCH_TILE(u4, k0, lane, col0, u_next)
    if (SPLIT == 1u || norm_helper) {
      FETCH_NORM_INPUTS(k0, lane, ncol0)
    }
  }
#if SERIAL_SPLIT > 1
  if (sg >= 4u) put_row_sums(chunk_of(b, h, nch - 1u), sg, lane, 0u);  // the first chunk's
  barrier();
#endif
  F16M yth, ytl;  // 2^eu Yv^T of the chunk, split (the state update's left operand, and yv_out's)
  vec4 xr[2];   // the chunk's X rows, loaded during its step for yv_out
  for (uint cc = 0u; cc < nch; ++cc) {
    const Chunk k = chunk_of(b, h, nch - 1u - cc);
    const Operators cur = fetch_operators(k, tid);
#if SERIAL_SPLIT > 1
    if (STATES && cc == 0u && has(STATE_CARRY)) LOAD_DHT()
    if (cc > 0u && cols)  // the chunk before (unsplit: at the end of its own step)
      yv_out(chunk_of(b, h, nch - cc), yth, ytl, xr, t_du, lane, col0, pow2(-eu), pow2(-(eu + ev)));
#endif
    vec4 o[2] = o_next, u[2] = u_next, wd[2];
    const vec4 z[2] = {stream_value(BF16_Z, z_next[0]), stream_value(BF16_Z, z_next[1])};
    const vec4 g[2] = {stream_value(BF16_DOUT, g_next[0]), stream_value(BF16_DOUT, g_next[1])};
    const float inv[2] = inv_next;
    float part[2];
    if (SPLIT == 1u || norm_helper) {
      vec4 dn = vec4(0.0);  // the lane's 4 columns of the chunk's dnorm share, over its two rows
      [[unroll]] for (uint e = 0u; e < 2u; ++e) {
        const vec4 sz = silu(z[e]);
        wd[e] = nw * sz * g[e];
        part[e] = dot(wd[e], o[e]);
        dn += g[e] * o[e] * inv[e] * sz;
      }
      // over the 8 lanes of those columns (lane / 4 picks the rows), then lanes 0 .. 3 store them
      [[unroll]] for (uint m = 4u; m < 32u; m *= 2u) dn += subgroupShuffleXor(dn, m);
      if (lane < 4u) dnorm_part4[((bh * nch + nch - 1u - cc) * D + ncol0) / 4u + lane] = dn;
    }
    // Unsplit, the rows' <w dout, o> before the first barrier (set cc % 2: the chunk before reads the
    // other between its barriers), so that dO is made between the barriers, off the chain after them.
#if SERIAL_SPLIT == 1
    [[unroll]] for (uint e = 0u; e < 2u; ++e) put_row_part(part[e], sg, lane, e, cc & 1u);
#else
    if (norm_helper) {  // dO of subgroup hs's columns, from the row helpers' sums, for it to start from
      vec4 dO[2];
      const vec2 rs = vec2(rsb[(cc & 1u) * 16u + tile_row(lane, 0u)], rsb[(cc & 1u) * 16u + tile_row(lane, 1u)]);
      norm_backward(k, lane, ncol0, rs, inv, wd, o, z, g, nw, dO);
      const float omax = SUBGROUP_ABSMAX8(dO);
      const uint at = (cc & 1u) * NSG * 256u + hs * 256u + t_lane;
      [[unroll]] for (uint e = 0u; e < 2u; ++e) PUT_FLOAT4(hdo, at + 128u * e, pow2(scale_exponent(omax)) * dO[e])
      if (lane == 0u) hom[(cc & 1u) * NSG + hs] = omax;
      if (cc + 1u < nch) {  // the next chunk's norm inputs
        const Chunk kn = chunk_of(b, h, nch - 2u - cc);
        FETCH_NORM_INPUTS(kn, lane, ncol0)
      }
    }
    // the next chunk's row sums (rsb[parity of cc] is read above, the other one written here: the
    // next chunk's barriers order both against the next step)
    if (sg >= 4u && cc + 1u < nch) put_row_sums(chunk_of(b, h, nch - 2u - cc), sg, lane, (cc + 1u) & 1u);
#endif
    // The end-state gradient dS [column][row] of each pair of chunks (2p, 2p + 1), for
    // chunk_pair_bwd_mma, which makes the one between them again (the last chunk's is dht or zero);
    // before the barriers, off the chain after them.
    if (cols && k.c + 1u < nch && k.c % 2u == 1u)
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
        coopMatStoreNV(dst[rt] * pow2(-ed), dsc, ((bh * slots + k.c / 2u) * D + col0) * D + 16u * rt, D, false);
    barrier();  // the previous chunk's readers of the staged operands and of row_part are done
    // the largest |dS| of the subgroup's columns, reduced beside the staging
    const float s_start = subgroup_max32(s_lane) * pow2(-ed);
    if (cc > 0u) sum_pair_dots(chunk_of(b, h, nch - cc), bh, nch, tid);
    stage_operators(cur, tid);
    vec4 dO[2];   // unsplit: the chunk's dO at the subgroup's columns
    float omax;   // the largest |dO| of the subgroup's columns
#if SERIAL_SPLIT == 1
    norm_backward(k, lane, col0, vec2(row_total(tile_row(lane, 0u), cc & 1u), row_total(tile_row(lane, 1u), cc & 1u)),
                  inv, wd, o, z, g, nw, dO);
    omax = SUBGROUP_ABSMAX8(dO);
#else
    omax = cols ? hom[(cc & 1u) * NSG + sg] : 0.0;  // its helper's
#endif
    // the chunk's scales (between the barriers: off the chain after them): eo of dO, ed of the
    // state, eu of dU and Yv
    int eo = 0;
    if (cols) {
      eo = scale_exponent(omax);
      if (omax > 0.0) eo_min = min(eo_min, eo);
      if (s_start > 0.0) {
        // dS^T K~^T at 2^(ed + eqk) is under 128 |2^ed dS| 2^1 < 2^(td + 9), td = floor(log2(2^ed |dS|))
        const int td = int(floatBitsToUint(s_start * pow2(ed)) >> 23u) - 127;
        eu = min(eo + cur.ep, ed + cur.eqk - td);
        ed_min = min(ed_min, scale_exponent(s_start));
      } else {  // (the state is zero: any ed holds it; this one puts dU's two terms at one scale)
        eu = eo + cur.ep;
        ed = eu - cur.eqk;
      }
      if (omax > 0.0 || s_start > 0.0) eu_min = min(eu_min, eu);
    }
    barrier();
    if (cols) {  // the subgroup's columns (a helper waits at the next chunk's first barrier)
#if SERIAL_SPLIT == 1
      [[unroll]] for (uint e = 0u; e < 2u; ++e) PUT_TILE4(t_do + t_lane + 128u * e, pow2(eo) * dO[e])
      TILE_SYNC()  // the subgroup's dO tile is in
#endif

      // dU^T = dO^T P + dS^T K~^T   (P [j][i]: a row-major load; K~^T: column-major loads of the [i][r] stage)
      F32M dOt;  // 2^eo dO^T
#if SERIAL_SPLIT > 1
      coopMatLoadNV(dOt, hdo, (cc & 1u) * NSG * 256u + sg * 256u, 16u, true);
#else
      coopMatLoadNV(dOt, tiles, t_do, 16u, true);
#endif
      F16M oh, ol;
      split(dOt, oh, ol);
      // (2^ep P and 2^eqk K~ staged: dO^T P alone first, at 2^(eo + ep), brought to dS^T K~^T's
      // 2^(ed + eqk), then the sum to 2^eu)
      F32M du = F32M(0.0), du_lo = F32M(0.0);
      {
        F16M bh_, bl;
        coopMatLoadNV(bh_, ph, 0u, PP, false);
        coopMatLoadNV(bl, pl, 0u, PP, false);
        mma_split_into(du, oh, ol, bh_, bl);
        du = du * pow2(ed + cur.eqk - eo - cur.ep);
      }
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
        F16M sh, sl, bh_, bl;
        split_state(dst[rt], sh, sl);
        coopMatLoadNV(bh_, kh, 4u * rt, DP, true);
        coopMatLoadNV(bl, kl, 4u * rt, DP, true);
        MMA_SPLIT(du, du_lo, sh, sl, bh_, bl)
      }
#if SERIAL_SPLIT > 1
      // The subgroup's share of the pair dots U dO^T ([j][i]), into the dO tile (t_du is free here),
      // made while dU's products are in flight (faster than before them or after Yv; unsplit, faster
      // at the step's end).
      u_do_share(u, oh, ol, sv, pow2(-(eo + ev)), t_du, t_do, lane);
#endif
      du = unsplit(du, du_lo) * pow2(eu - ed - cur.eqk);

      FETCH_TILE(x4, k, lane, col0, xr)
      xr[0] *= sv;
      xr[1] *= sv;
      if (cc + 1u < nch) {
        const Chunk kn = chunk_of(b, h, nch - 2u - cc);
        FETCH_TILE(u4, kn, lane, col0, u_next)
#if SERIAL_SPLIT == 1  // (split: the helpers load the norm's inputs)
        FETCH_NORM_INPUTS(kn, lane, col0)
#endif
      }
      // Yv^T = dU^T T   (T [m][i]: a row-major load of its stage)
      F16M uh, ul;
      split(du, uh, ul);
      float y_max;  // the largest |2^eu Yv|
      {
        F16M bh_, bl;
        coopMatLoadNV(bh_, th, 0u, PP, false);
        coopMatLoadNV(bl, tl, 0u, PP, false);
        F32M yt = F32M(0.0), y_lo = F32M(0.0);
        MMA_SPLIT(yt, y_lo, uh, ul, bh_, bl)
        yt = unsplit(yt, y_lo);
        y_max = subgroup_max32(tile_absmax(yt));
        split(yt, yth, ytl);
      }
      // dS^T <- Gamma dS^T + dO^T Q~ - Yv^T diag(beta gamma) K   (Q~, -diag(beta gamma) K: row-major
      // loads of the stages): the first product at 2^(eo + eqk), the second at 2^(eu + eqk)
      const float gam = exp(cur.lgam.x + cur.lgam.y);
      // The new dS at 2^en (state_exponent), from the bound Gamma |dS| + 16 rows of |Q~|,
      // |diag(beta gamma) K| < 2^(1 - eqk) times |dO| and |Yv|.
      const int en = state_exponent(gam * s_start + 32.0 * pow2(-cur.eqk) * (omax + y_max * pow2(-eu)));
      const float to_o = gam * pow2(eo + cur.eqk - ed), o_to_u = pow2(eu - eo), from_u = pow2(en - eu - cur.eqk);
      s_lane = 0.0;
      [[unroll]] for (uint rt = 0u; rt < 8u; ++rt) {
        F16M qb, ql_, wb, wl_;
        coopMatLoadNV(qb, qh, 4u * rt, DP, false);
        coopMatLoadNV(ql_, ql, 4u * rt, DP, false);
        coopMatLoadNV(wb, xh, 4u * rt, DP, false);
        coopMatLoadNV(wl_, xl, 4u * rt, DP, false);
        F32M acc = dst[rt] * to_o, lo = F32M(0.0);
        MMA_SPLIT(acc, lo, oh, ol, qb, ql_)
        acc = acc * o_to_u;
        lo = lo * o_to_u;
        MMA_SPLIT(acc, lo, yth, ytl, wb, wl_)
        dst[rt] = unsplit(acc, lo) * from_u;
        s_lane = max(s_lane, tile_absmax(dst[rt]));
      }
      ed = en;
#if SERIAL_SPLIT == 1
      u_do_share(u, oh, ol, sv, pow2(-(eo + ev)), t_du, t_do, lane);
      TILE_SYNC()  // every lane's load of U is done: yv_out takes its tile
      // the chunk's Yv and X Yv^T share, while the update's products are in flight (the split builds
      // make them at the next step's start: here they cost their helpers' registers, and were slower)
      yv_out(k, yth, ytl, xr, t_du, lane, col0, pow2(-eu), pow2(-(eu + ev)));
#endif
    }
  }
#if SERIAL_SPLIT > 1
  if (cols) yv_out(chunk_of(b, h, 0u), yth, ytl, xr, t_du, lane, col0, pow2(-eu), pow2(-(eu + ev)));  // the last chunk's (chunk 0)
#endif
  // dS now is the gradient of chunk 0's start state: dh0 (where the forward had h0)
  if (STATES && has(STATE_H0) && cols)
    [[unroll]] for (uint rt = 0u; rt < 8u; ++rt)
      coopMatStoreNV(dst[rt] * pow2(-ed), dh0, (bh * D + 16u * rt) * D + col0, D, true);
  barrier();
  sum_pair_dots(chunk_of(b, h, 0u), bh, nch, tid);
  const float eo_head = workgroup_min_after(float(eo_min), sg, lane);
  const float ed_head = workgroup_min_after(float(ed_min), sg, lane);
  const float eu_head = workgroup_min_after(float(eu_min), sg, lane);
  if (tid == 0u) {  // the workgroup's slot (HEAD_EXPONENT, mma.glsl)
    const uint n = pc.nb * pc.nv, part = linear_group() % SPLIT;
    dscale[bh * SPLIT + part] = eo_head;
    dscale[(n + bh) * SPLIT + part] = ed_head;
    dscale[(2u * n + bh) * SPLIT + part] = eu_head;
  }
}
