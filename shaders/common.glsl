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
  uint pad0;
  uint pad1;
  uint pad2;
  float eps;    // rms_eps of the output norm
  float fpad0;
  float fpad1;
  float fpad2;
} pc;

// y, the conv output the recurrences read, holds only the v channels: [B, T, nv*D] (q and k leave
// conv_fwd normalized, in qkn). The element index of token row bt's head h, column 0:
uint y_at(uint bt, uint h) { return (bt * pc.nv + h) * D; }

// Grids are folded into (x, y) under maxComputeWorkGroupCount by the host (gpu::Recorder::dispatch).
uint linear_group() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float silu(float x) { return x / (1.0 + exp(-x)); }
vec4 silu(vec4 x) { return x / (1.0 + exp(-x)); }
// d/dx silu(x) = s + x s (1 - s), s = sigmoid(x)
float silu_bwd(float x) { float s = sigmoid(x); return s * (1.0 + x * (1.0 - s)); }
vec4 silu_bwd(vec4 x) { const vec4 s = 1.0 / (1.0 + exp(-x)); return s * (1.0 + x * (1.0 - s)); }
float softplus(float x) { return x > 20.0 ? x : log(1.0 + exp(x)); }
// log g = -exp(a_log) softplus(a + dt_bias), written once: gate_prep's g and the chunked passes' lg
// must agree bit for bit.
float log_gate(float a_log_h, float arg) { return -exp(a_log_h) * softplus(arg); }
