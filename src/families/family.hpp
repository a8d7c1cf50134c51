// SPDX-License-Identifier: MIT
// A kernel family behind one interface: what the layer (layer_impl.hpp) knows of any of them. Each
// family lives in one module here (per_head.cpp, subgroup.cpp, chunked.cpp, chunked_mma.cpp) and one
// shader folder; registry() lists them in the order Variant::Auto tries them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "detail.hpp"
#include "gdn/device_info.hpp"
#include "gdn/layer.hpp"
#include "kernels.hpp"
#include "vk/device.hpp"

namespace gdn::detail {

/// A buffer a family declares: its name (what Tape::buffers() reports) and its size in floats.
struct BufferDecl {
  const char* name;
  std::size_t floats;
};

/// The device buffers of one forward (a tape's) or one backward (the layer's workspace) for a shape,
/// in the order the family declared them: buffer i is the family's own enumerator i.
struct BufferSet {
  int B = 0, T = 0;
  bool keep = false;
  bool made = false;  // by ensure (a set may declare no buffers)
  std::vector<std::unique_ptr<gpu::Buffer>> buffers;

  const gpu::Buffer& operator[](std::size_t i) const { return *buffers[i]; }
  bool empty() const { return buffers.empty(); }
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& b : buffers) n += b->bytes;
    return n;
  }
};

/// The layer's parameters on the device, which every family's passes read.
struct LayerParams {
  const Tensor& conv;     // [C, K]
  const Tensor& a_log;    // [nv]
  const Tensor& dt_bias;  // [nv]
  const Tensor& norm;     // [D]
};

inline gpu::BufferView view(const gpu::Buffer& b) { return {&b}; }
inline gpu::BufferView view(const Tensor& t) { return {storage_of(t).buffer.get()}; }
/// t's view, or where t is empty (a state not given: its flag is off, the shader reads nothing) other's,
/// marked as a stand-in.
inline gpu::BufferView view_or(const Tensor& t, const Tensor& other) {
  if (!t.empty()) return view(t);
  gpu::BufferView v = view(other);
  v.stand_in = true;
  return v;
}

/// The kBf16* bits (Push::flags, and the matrix-unit passes' specialization constant BF16) of the
/// tensors among ts that are bfloat16.
inline std::uint32_t bf16_bits(std::initializer_list<std::pair<const Tensor&, std::uint32_t>> ts) {
  std::uint32_t m = 0;
  for (const auto& [t, bit] : ts)
    if (!t.empty() && t.dtype() == DType::BFloat16) m |= bit;
  return m;
}

/// The recurrent states of one call (empty tensors where absent) and Push::flags for them and the
/// conv states: a forward reads in.h0 and writes ht; a backward reads in.h0 (the tape's) and dht and
/// writes dh0.
struct States {
  Tensor ht;   // forward: the state after the last token (empty: not asked for)
  Tensor dht;  // backward: its gradient (empty: zero)
  Tensor dh0;  // backward: the gradient of h0 (where h0 was given)
  Tensor dconv_out;  // backward: the gradient of the conv state out (empty: zero)
  std::uint32_t flags = 0;
  // Other windows' passes run beside these (a packed call's lanes): the device is busy without
  // splitting a window's work further. A tape's backward has its forward's.
  bool side_by_side = false;
};

class Family {
 public:
  virtual ~Family() = default;
  /// The segment (chunk) length its passes take for windows of T tokens.
  virtual int interval(int T) const = 0;
  /// A bound on the loop iterations a token of a window costs one invocation of its passes (forward
  /// or backward, at any interval it takes; measured on llvmpipe, with a margin): on a driver that
  /// ends an invocation's loops after DeviceInfo::max_loop_iterations in all, the layer runs at most
  /// that many over this many tokens of a window as one part.
  virtual int loop_iterations_per_token() const = 0;
  /// What one forward of B windows of T tokens writes (`keep`: for a backward, a tape's).
  virtual std::vector<BufferDecl> forward_buffers(int B, int T, bool keep) const = 0;
  /// What one backward of (B, T) needs beyond its tape.
  virtual std::vector<BufferDecl> backward_buffers(int B, int T) const = 0;
  /// Records a forward into r: out from `in`, writing f (forward_buffers' set), with scratch
  /// (scratch_buffers' set).
  virtual void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                              const BufferSet& scratch, const States& s) = 0;
  /// Records a backward: the input gradients of g (dqkv, dz, da, db) from dout and the tape (its
  /// inputs and forward set), with the workspace w (backward_buffers' set); its conv backward leaves
  /// its blocks' sums of dconv in dconv_part (the layer's param passes sum them).
  virtual void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                               const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part,
                               const States& s) = 0;
  /// What the layer's parameter-gradient passes read of a tape: o before the norm [B, T, nv*D], 1/rms
  /// [B, T, nv] and the gates [3][B, T, nv] (g, beta, a + dt_bias).
  struct NormTape {
    const gpu::Buffer &o, &inv, &gates;
  };
  virtual NormTape norm_tape(const BufferSet& f) const = 0;

  /// Where its backward left the norm weight's gradient in groups of rows ([groups][D], param_sum
  /// adds them in order), and how many, for the workspace w; none: the layer's param_part makes them
  /// from norm_tape().
  struct DnormParts {
    const gpu::Buffer* buffer = nullptr;
    std::uint64_t groups = 0;
  };
  virtual DnormParts dnorm_parts(const BufferSet&) const { return {}; }
  /// Whether dnorm_parts names its backward's (then the layer holds no param_part buffer).
  virtual bool leaves_dnorm_parts() const { return false; }

  /// The common kernels it built (the layer records the parameter-gradient passes with them).
  virtual const CommonKernels& common_kernels() const = 0;
  /// What one forward of (B, T) needs beyond its tape and keeps for no backward (the layer holds it).
  virtual std::vector<BufferDecl> scratch_buffers(int, int) const { return {}; }

  /// The push constants of every pass (shaders/common/common.glsl).
  Push push(const Config& cfg, int B, int T, bool keep, const States& s) const {
    const int cs = interval(T);
    return Push{.nb = std::uint32_t(B), .t = std::uint32_t(T), .nv = std::uint32_t(cfg.nv), .nk = std::uint32_t(cfg.nk),
                .c_dim = std::uint32_t(cfg.channels()), .kk = std::uint32_t(cfg.conv_taps), .cs = std::uint32_t(cs),
                .nseg = std::uint32_t((T + cs - 1) / cs), .keep = keep ? 1u : 0u, .flags = s.flags,
                .eps = cfg.rms_eps};
  }
};

/// What the layer is given to make a family: its device, config (variant and interval resolved),
/// the subgroup size its kernels run at (the column-split and chunked ones), and its parameters.
struct FamilyArgs {
  gpu::Device& dev;
  const Config& cfg;
  std::uint32_t subgroup_size;
  LayerParams params;
};

/// The common passes as every family records them (shaders/common/).
inline void record_conv_fwd(gpu::Recorder& r, const CommonKernels& k, const Config& cfg, const LayerParams& p,
                            const DeviceInputs& in, const gpu::Buffer& y, const gpu::Buffer& qkn, const gpu::Buffer& nq,
                            const Push& pc) {
  r.dispatch(k.conv_fwd(pc.flags),
             bindings::conv_fwd{.qkv = view(in.qkv), .conv = view(p.conv), .y = view(y), .qkn = view(qkn), .nq = view(nq),
                                .conv_state = view_or(in.conv_state, in.qkv)},
             pc,
             conv_groups(pc.nb, pc.t, std::uint64_t(cfg.channels()), kConvFwdTokens));
  r.mark("conv_fwd");  // the q/k l2 norms fused in
}
inline void record_gate_prep(gpu::Recorder& r, const CommonKernels& k, const Config& cfg, const LayerParams& p,
                             const DeviceInputs& in, const gpu::Buffer& gates, const Push& pc) {
  r.dispatch(*k.gate_prep,
             bindings::gate_prep{.a = view(in.a), .bw = view(in.b), .a_log = view(p.a_log), .dt_bias = view(p.dt_bias),
                                 .gates = view(gates)},
             pc,
             (std::uint64_t(pc.nb) * pc.t * std::uint64_t(cfg.nv) + 255) / 256);
  r.mark("gate_prep");
}
inline void record_conv_bwd(gpu::Recorder& r, const CommonKernels& k, const Config& cfg, const LayerParams& p,
                            const DeviceInputs& in, const gpu::Buffer& dy, const DeviceGrads& g,
                            const gpu::Buffer& dconv_part, const Tensor& dconv_out, const Push& pc) {
  r.dispatch(k.conv_bwd(pc.flags),
             bindings::conv_bwd{.qkv = view(in.qkv), .conv = view(p.conv), .dy = view(dy), .dqkv = view(g.dqkv),
                                .dconv_part = view(dconv_part), .conv_state = view_or(in.conv_state, in.qkv),
                                .dconv_state = view(g.dconv_state), .dconv_out = view_or(dconv_out, in.qkv)},
             pc,
             conv_groups(pc.nb, pc.t, std::uint64_t(cfg.channels()), kConvBwdTokens));
  r.mark("conv_bwd");
}
/// Slots of stored states (checkpoints, end-state gradients) for `groups` groups of segments
/// between them: one per edge between groups, at least one (so that the buffer can be bound).
inline std::size_t state_slots(int groups) { return std::size_t(std::max(groups, 2) - 1); }

/// A family as the registry lists it.
struct FamilyEntry {
  Variant variant;       // the Config::variant that asks for it
  bool matrix_units;     // runs on the matrix units (Config::matrix_units asks for it)
  int default_interval;  // its checkpoint interval where the config leaves 0
  /// Empty where it runs on the device at the config with checkpoint interval `cs`, else why not.
  std::string (*why_not)(const DeviceInfo& info, const Config& cfg, int cs);
  std::unique_ptr<Family> (*make)(const FamilyArgs& args);
};

/// Every family, in the order Variant::Auto tries them: chunked on the matrix units, chunked on CUDA
/// cores, subgroup (column split), per-head.
std::span<const FamilyEntry> registry();

/// Why no kernel with 256 invocations per workgroup runs on the device ("" where they do).
std::string workgroup_why_not(const DeviceInfo& info);

// The families' entries (each in its module).
extern const FamilyEntry kPerHeadFamily, kSubgroupFamily, kChunkedFamily, kChunkedMatrixFamily;

}  // namespace gdn::detail
