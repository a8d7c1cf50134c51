// Shared by every gdn compute shader: the push-constant block (mirrored by gdn::detail::Push in
// src/kernels.hpp, same field order, 64 bytes), the head dim, the grid folding and the activations.
#extension GL_EXT_control_flow_attributes : require

// dk = dv = 128 for every linear-attention head of the models this library serves.
#define D 128u

layout(push_constant) uniform Push {
  uint nb;      // windows (B)
  uint t;       // tokens per window (T)
  uint nv;      // value heads
  uint nk;      // key heads
  uint c_dim;   // channels of the raw projection: 2*nk*D + nv*D
  uint kk;      // conv taps (K)
  uint cs;      // checkpoint interval (steps per replay segment)
  uint nseg;    // segments per window: ceil(T / cs)
  uint keep;    // 1: record what the backward reads (checkpoints, kv)
  uint flags;   // the states carried in and out, the bfloat16 streams: STATE_*, BF16_* below
  uint n;       // elements of a cast (to_bf16), groups of param_sum
  uint pad2;
  float eps;    // rms_eps of the output norm
  float fpad0;
  float fpad1;
  float fpad2;
} pc;

// pc.flags: which carried states a call has (absent ones are zero and their buffers not read)
#define STATE_H0 1u          // h0 given (forward and backward)
#define STATE_CONV 2u        // conv_state given
#define STATE_CARRY 4u       // forward: write ht; backward: dht given
#define STATE_DCONV_OUT 8u   // backward: the gradient of the conv state out given
#define PARAM_ACCUMULATE 16u // param_sum: add to the parameters' gradients (a call run as parts)
// The boundary streams that are bfloat16 (the host's kBf16*, src/kernels.hpp): the passes that read or
// write one take its binding as bfloat16 pairs or quads too. The matrix-unit passes and the conv
// kernels take these bits as their specialization constant BF16 (shaders/matrix/mma.glsl, conv.glsl),
// the others in pc.flags.
#define BF16_QKV 32u
#define BF16_DQKV 64u
#define BF16_Z 128u
#define BF16_OUT 256u
#define BF16_DOUT 512u
#define BF16_DZ 1024u
#define BF16_A 2048u
#define BF16_B 4096u
bool has(uint flag) { return (pc.flags & flag) != 0u; }

// bfloat16 storage: a word holds two elements, the first in its low half. Four channels are a uvec2.
vec2 widen_bf16x2(uint w) { return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xFFFF0000u)); }
vec4 widen_bf16x4(uvec2 w) { return vec4(widen_bf16x2(w.x), widen_bf16x2(w.y)); }
// Element i of a bfloat16 tensor from its word w = words[i / 2].
float widen_bf16_at(uint w, uint i) { return uintBitsToFloat((i & 1u) == 0u ? w << 16 : w & 0xFFFF0000u); }
// Element i of a stream bound twice, as bfloat16 pairs (`words`) and as float32 (`floats`): the first
// where is_bf16 (a stream's BF16_* bit), else the second.
#define STREAM_AT(is_bf16, words, floats, i) ((is_bf16) ? widen_bf16_at(words[(i) / 2u], (i)) : floats[i])
// x's bfloat16 bits: ties to even, overflow to Inf, NaN kept quiet (gdn::to_bfloat16).
uint bf16_bits(float x) {
  const uint u = floatBitsToUint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
uint round_bf16x2(vec2 v) { return bf16_bits(v.x) | (bf16_bits(v.y) << 16); }
uvec2 round_bf16x4(vec4 v) { return uvec2(round_bf16x2(v.xy), round_bf16x2(v.zw)); }

// y, the conv output the recurrences read, holds only the v channels: [B, T, nv*D] (q and k leave
// conv_fwd normalized, in qkn). The element index of token row bt's head h, column 0:
uint y_at(uint bt, uint h) { return (bt * pc.nv + h) * D; }
// q^ and k^ (conv_fwd's normalized q and k), [2][B, T, nk, D]: the element index of token row bt's
// key head ko, column 0, in q^ (QK_Q) or k^ (QK_K).
#define QK_Q 0u
#define QK_K 1u
uint qk_at(uint which, uint bt, uint ko) { return ((which * pc.nb * pc.t + bt) * pc.nk + ko) * D; }

// Grids are folded into (x, y) under maxComputeWorkGroupCount by the host (gpu::Recorder::dispatch).
uint linear_group() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float silu(float x) { return x / (1.0 + exp(-x)); }
vec4 silu(vec4 x) { return x / (1.0 + exp(-x)); }
// d/dx silu(x) = s + x s (1 - s), s = sigmoid(x)
float silu_bwd(float x) { float s = sigmoid(x); return s * (1.0 + x * (1.0 - s)); }
vec4 silu_bwd(vec4 x) { const vec4 s = 1.0 / (1.0 + exp(-x)); return s * (1.0 + x * (1.0 - s)); }
// log(1 + u) for 0 <= u <= 1 to fp32 accuracy, as 2 atanh(s) with s = u / (2 + u) <= 1/3 (the
// series to s^15): log(1.0 + u) loses u's low bits in the sum, all of them below u = 6e-8.
float log1p_unit(float u) {
  const float s = u / (2.0 + u), s2 = s * s;
  float p = 1.0 / 15.0;
  [[unroll]] for (int n = 13; n >= 1; n -= 2) p = fma(p, s2, 1.0 / float(n));
  return 2.0 * s * p;
}
// softplus(x) = log(1 + e^x), and x itself above 20 (the model's convention).
float softplus(float x) { return x > 20.0 ? x : max(x, 0.0) + log1p_unit(exp(-abs(x))); }
// log g = -exp(a_log) softplus(a + dt_bias), written once: gate_prep's g and the chunked passes' lg
// must agree bit for bit.
float log_gate(float a_log_h, float arg) { return -exp(a_log_h) * softplus(arg); }
// The chunked families keep the cumulative log gates of a chunk as pairs of floats (chunk.glsl):
// hi += x, with the rounding error added to lo (Knuth's two-sum): hi + lo holds the sum to ~2^-48.
void add_two(inout float hi, inout float lo, float x) {
  precise const float s = hi + x;
  precise const float bp = s - hi;
  precise const float err = (hi - (s - bp)) + (x - bp);
  hi = s;
  lo += err;
}
// (a_hi + a_lo) - (b_hi + b_lo), to fp32's accuracy when it is small beside them.
float lg_diff(float a_hi, float a_lo, float b_hi, float b_lo) { return (a_hi - b_hi) + (a_lo - b_lo); }

// The gates of one (b, t, v-head) from the raw a and b and head h's a_log and dt_bias (gate_prep,
// chunk_prep_fwd): what [3][B, T, nv] gates holds (g, beta, a + dt_bias), and log g.
struct Gate {
  float g, beta, arg, lg;
};
Gate make_gate(float a, float b, float a_log_h, float dt_bias_h) {
  Gate x;
  x.arg = a + dt_bias_h;
  x.lg = log_gate(a_log_h, x.arg);
  x.g = exp(x.lg);
  x.beta = sigmoid(b);
  return x;
}
