// The depthwise causal conv's layout and blocking (conv_fwd, conv_bwd).
//
// One invocation per (window b, block of TB tokens, 4 channels): it walks its tokens with the
// K = KT taps' inputs in registers, so each input element is read once (plus K-1 halo tokens per
// block), as vec4 along channels (coalesced: neighbouring invocations hold neighbouring channels).
// The conv: pre[b,t,c] = sum_j conv[c,j] * qkv[b, t-(K-1)+j, c], where rows before the window are
// conv_state's ([B, K-1, C], zero when none is given); y = silu(pre).
layout(constant_id = 0) const uint KT = 4;  // conv taps (Config::conv_taps), fixed per pipeline
// The boundary streams of the pass that are bfloat16 (common.glsl's BF16_QKV, BF16_DQKV), as the
// matrix-unit passes take them (mma.glsl): fixed per pipeline, so that each build's loop holds only
// its own loads (faster than the push constant's flags).
layout(constant_id = 6) const uint BF16 = 0u;
bool bf16(uint stream) { return (BF16 & stream) != 0u; }
#ifndef TB
#define TB 32u  // tokens per invocation (conv_bwd, faster than 16 or 8; conv_fwd, which holds its
                // outputs until the norms are in: 8)
#endif

struct ConvBlock {
  uint b, t0, c4;  // window, first token, channel quad (channels 4 c4 .. 4 c4 + 3)
};

// The invocation's block, or false past the last one. Blocks: [B][ceil(T/TB)][C/4], channel fastest.
bool conv_block(out ConvBlock k) {
  const uint c4n = pc.c_dim / 4u, nblk = (pc.t + TB - 1u) / TB;
  const uint id = linear_group() * 64u + gl_LocalInvocationIndex;
  k.c4 = id % c4n;
  k.t0 = (id / c4n) % nblk * TB;
  k.b = id / (c4n * nblk);
  return k.b < pc.nb;
}

// Element (b, t, channel quad) of a [B, T, C] tensor as a vec4 index; t may be out of the window.
uint conv_at(ConvBlock k, int t) { return ((k.b * pc.t + uint(t)) * pc.c_dim) / 4u + k.c4; }
// Element (b, row r, channel quad) of a [B, K-1, C] conv state as a vec4 index; row K-1+t holds t < 0.
uint state_at(ConvBlock k, int r) { return ((k.b * (KT - 1u) + uint(r)) * pc.c_dim) / 4u + k.c4; }

// qkv's channel quad at vec4 index i, float32 or (BF16_QKV) bfloat16.
vec4 qkv_at(uint i) { return bf16(BF16_QKV) ? widen_bf16x4(qkv2[i]) : qkv4[i]; }

// The raw input at t >= -(K-1): qkv's row, or before the window conv_state's (zero without one).
vec4 input_at(ConvBlock k, int t) {
  if (t >= 0) return qkv_at(conv_at(k, t));
  return has(STATE_CONV) ? conv_state4[state_at(k, int(KT - 1u) + t)] : vec4(0.0);
}

// The taps of the block's four channels: w[j] = conv[4 c4 + l, j] for l = 0..3.
void conv_taps(ConvBlock k, out vec4 w[KT]) {
  [[unroll]] for (uint j = 0u; j < KT; ++j)
    [[unroll]] for (uint l = 0u; l < 4u; ++l) w[j][l] = conv[(4u * k.c4 + l) * KT + j];
}
