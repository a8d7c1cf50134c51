#version 460
// Backward of the conv + SiLU into the raw projection, time-blocked (conv.glsl), walking each
// block's tokens from the last. With pre recomputed and dpre = dy * silu'(pre), raw position t
// feeds the conv outputs t + (K-1) - j through tap j:
//   dqkv[b,t,c] = sum_j dpre[b, t+(K-1)-j, c] * conv[c,j]   (terms past the window's end are zero)
// and the same for the conv state's rows t = -(K-1) .. -1 into dconv_state [B, K-1, C]. The gradient
// of the conv state out (the last K-1 rows of conv_state and qkv, STATE_DCONV_OUT) adds to the rows
// it was taken from.
// The K-1 outputs after the block (its halo) are recomputed, not read from a neighbour.
// It also sums the block's share of the conv weights' gradient, dconv[c, j] = sum_t dpre[t, c] *
// qkv[t-(K-1)+j, c] over the block's own outputs t, into dconv_part (param_sum.comp adds the blocks
// in a fixed order).
// The build with DV_FROM_YV (the chunked backward on the matrix units) makes the v channels' dy as
// it reads it, dv = beta Yv from chunk_dstate_mma's Yv, which writes no dv.
#include "common.glsl"
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Qkv { vec4 qkv4[]; };    // [B, T, C] raw projection
layout(set = 0, binding = 0) readonly buffer Qkv2 { uvec2 qkv2[]; };  // the same, bfloat16 (BF16_QKV)
layout(set = 0, binding = 1) readonly buffer Conv { float conv[]; };  // [C, K]
layout(set = 0, binding = 2) readonly buffer Dy { vec4 dy4[]; };      // [B, T, C] grad of y
layout(set = 0, binding = 3) writeonly buffer Dqkv { vec4 dqkv4[]; }; // [B, T, C]
layout(set = 0, binding = 3) writeonly buffer Dqkv2 { uvec2 dqkv2[]; };  // the same, bfloat16 (BF16_DQKV)
layout(set = 0, binding = 4) writeonly buffer DconvPart { vec4 dconv_part4[]; };  // [B, ceil(T/TB), K, C/4] per block
layout(set = 0, binding = 5) readonly buffer ConvState { vec4 conv_state4[]; };    // [B, K-1, C] (STATE_CONV)
layout(set = 0, binding = 6) writeonly buffer DconvState { vec4 dconv_state4[]; }; // [B, K-1, C]
layout(set = 0, binding = 7) readonly buffer DconvOut { vec4 dconv_out4[]; };      // [B, K-1, C] (STATE_DCONV_OUT)
#ifdef DV_FROM_YV
layout(set = 0, binding = 8) readonly buffer Yv4 { vec4 yv4[]; };     // [B, T, nv*D/4] Yv (dv = beta Yv)
layout(set = 0, binding = 9) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]: beta at [1]
#endif

#include "conv.glsl"

// dy at token t of the block's channels (t in the window).
vec4 dy_at(ConvBlock k, int t) { return dy4[conv_at(k, t)]; }
#ifdef DV_FROM_YV
// dy at token t loaded ahead of its use as a scale and a factor, dy = s d (the v channels' beta and
// Yv, the others' 1 and dy), multiplied where used.
void fetch_dy(ConvBlock k, int t, out vec4 d, out float s) {
  const uint c = 4u * k.c4, v0 = 2u * pc.nk * D;  // the v channels follow q and k
  s = 1.0;
  if (c >= v0) {
    const uint bt = k.b * pc.t + uint(t), h = (c - v0) / D;
    s = gates[(pc.nb * pc.t + bt) * pc.nv + h];
    d = yv4[(bt * pc.nv * D + c - v0) / 4u];
  } else {
    d = dy_at(k, t);
  }
}
#endif

// The input at raw position t loaded ahead of its use: a bfloat16 row in the window as its bits
// (widened where used by fetched_input), any other as float32.
void fetch_input(ConvBlock k, int t, inout vec4 x, inout uvec2 x2) {
  if (bf16(BF16_QKV) && t >= 0) x2 = qkv2[conv_at(k, t)];
  else x = input_at(k, t);
}
vec4 fetched_input(int t, vec4 x, uvec2 x2) {
  return bf16(BF16_QKV) && t >= 0 ? widen_bf16x4(x2) : x;
}

// One position u of the walk, its oldest input x_u (at u - (K-1)) and dy_u given: dpre(u) enters dp,
// the block's share of dconv takes it, and raw position u, now finished, leaves as dqkv; then the
// inputs shift for u - 1.
void walk_position(ConvBlock k, int u, int t_end, int out_from, vec4 w[KT], vec4 x_u, vec4 dy_u,
                   inout vec4 x[KT], inout vec4 dp[KT], inout vec4 dw[KT]) {
  x[0] = x_u;
  vec4 pre = vec4(0.0);
  [[unroll]] for (uint j = 0u; j < KT; ++j) pre = fma(w[j], x[j], pre);
  // shift: dp[j] <- dp[j+1], the new dpre(u) enters at the end (dp[K-1] = dpre at t + 0 for t = u)
  [[unroll]] for (uint j = 0u; j + 1u < KT; ++j) dp[j] = dp[j + 1u];
  dp[KT - 1u] = dy_u * silu_bwd(pre);
  if (u < t_end) {  // the block's own outputs (the halo's are its neighbour's)
    [[unroll]] for (uint j = 0u; j < KT; ++j) dw[j] = fma(dp[KT - 1u], x[j], dw[j]);
    // raw position t = u is finished once dpre(u) .. dpre(u + K-1) are known: dp[K-1-m] = dpre(u + m)
    vec4 acc = vec4(0.0);
    [[unroll]] for (uint j = 0u; j < KT; ++j) acc = fma(dp[j], w[j], acc);  // dp[j] = dpre(u + (K-1) - j)
    if (has(STATE_DCONV_OUT) && u >= out_from) acc += dconv_out4[state_at(k, u - out_from)];
    if (bf16(BF16_DQKV)) dqkv2[conv_at(k, u)] = round_bf16x4(acc);
    else dqkv4[conv_at(k, u)] = acc;
  }
  [[unroll]] for (uint j = KT - 1u; j > 0u; --j) x[j] = x[j - 1u];
}

void main() {
  ConvBlock k;
  if (!conv_block(k)) return;
  vec4 w[KT];
  conv_taps(k, w);
  const int t_end = int(min(k.t0 + TB, pc.t));  // one past the block's last token
  // x[j]: the input at u - (K-1) + j while dpre(u) is made; dp[j]: dpre at t + (K-1) - j for the
  // raw position t being finished (dp[0] is the furthest ahead). Outputs at or past T have dpre 0.
  vec4 x[KT], dp[KT], dw[KT];  // dw[j]: the block's sum of dpre * input for tap j
  [[unroll]] for (uint j = 0u; j < KT; ++j) {
    dp[j] = vec4(0.0);
    dw[j] = vec4(0.0);
  }
  // Walk u from the last output that reads the block (t_end - 1 + K - 1) down to the block's start;
  // u's inputs are u - (K-1) .. u, read from the newest down: keep them in x, shifting right.
  const int u_hi = min(t_end - 1 + int(KT - 1u), int(pc.t) - 1);
  [[unroll]] for (uint j = 1u; j < KT; ++j)  // x[1..K-1]: inputs u_hi - (K-1) + j
    x[j] = input_at(k, u_hi - int(KT - 1u) + int(j));
  // rows from T-(K-1) on were also the conv state out
  const int out_from = int(pc.t) - int(KT - 1u);
#ifdef DV_FROM_YV
  // The DV_FROM_YV build, whose dy of the v channels is two loads, loads two positions a round, both
  // before either is stored (faster than at use; loaded a position ahead as below it was slower).
  // What is loaded is carried as loaded (a bfloat16 input as its bits, dy as its two factors) and
  // made into values where its position is walked, so that u's walk does not wait on u - 1's loads.
  for (int u = u_hi; u >= int(k.t0); u -= 2) {
    const bool two = u > int(k.t0);
    vec4 x_u = vec4(0.0), x_v = vec4(0.0), d_u, d_v = vec4(0.0);  // x_v, d_v, s_v: u - 1's
    uvec2 x_u2 = uvec2(0u), x_v2 = uvec2(0u);
    float s_u, s_v = 0.0;
    fetch_input(k, u - int(KT - 1u), x_u, x_u2);
    fetch_dy(k, u, d_u, s_u);
    if (two) {
      fetch_input(k, u - 1 - int(KT - 1u), x_v, x_v2);
      fetch_dy(k, u - 1, d_v, s_v);
    }
    walk_position(k, u, t_end, out_from, w, fetched_input(u - int(KT - 1u), x_u, x_u2), s_u * d_u, x, dp, dw);
    if (two) walk_position(k, u - 1, t_end, out_from, w, fetched_input(u - 1 - int(KT - 1u), x_v, x_v2), s_v * d_v, x, dp, dw);
  }
#else
  // The plain build loads u - 1's input and dy while it works on u's, a bfloat16 input carried as
  // its bits and widened where it is used (widened at the load, the loop's back edge waits on it).
  vec4 x_next = vec4(0.0), dy_next = vec4(0.0);  // u's input (u - (K-1)) and dy, loaded ahead
  uvec2 x_next2 = uvec2(0u);
  fetch_input(k, u_hi - int(KT - 1u), x_next, x_next2);
  dy_next = dy_at(k, u_hi);
  for (int u = u_hi; u >= int(k.t0); --u) {
    const vec4 x_u = fetched_input(u - int(KT - 1u), x_next, x_next2), dy_u = dy_next;
    if (u > int(k.t0)) {
      fetch_input(k, u - 1 - int(KT - 1u), x_next, x_next2);
      dy_next = dy_at(k, u - 1);
    }
    walk_position(k, u, t_end, out_from, w, x_u, dy_u, x, dp, dw);
  }
#endif
  if (k.t0 == 0u) {
    // The conv state's rows r = 0 .. K-2 (position r - (K-1)) feed outputs r - j >= 0 through tap j;
    // now dp[K-1-m] = dpre(m).
    [[unroll]] for (uint r = 0u; r + 1u < KT; ++r) {
      vec4 acc = vec4(0.0);
      [[unroll]] for (uint j = 0u; j <= r; ++j) acc = fma(dp[KT - 1u - r + j], w[j], acc);
      const int from = int(r) - int(KT - 1u) - out_from;  // its row in the conv state out, if T < K-1
      if (has(STATE_DCONV_OUT) && from >= 0) acc += dconv_out4[state_at(k, from)];
      dconv_state4[state_at(k, int(r))] = acc;
    }
  }
  const uint blk = k.b * ((pc.t + TB - 1u) / TB) + k.t0 / TB, c4n = pc.c_dim / 4u;
  [[unroll]] for (uint j = 0u; j < KT; ++j) dconv_part4[(blk * KT + j) * c4n + k.c4] = dw[j];
}
