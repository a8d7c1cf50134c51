// SPDX-License-Identifier: MIT
// The layer behind gdn::Layer: its family (families/family.hpp: the registry picks it, it declares its
// tape's and workspace's buffers and records its passes), its parameters, its input checks and calls.
// The layer names no family; the kernels' math lives in shaders/, the Vulkan plumbing in vk/.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "detail.hpp"
#include "gdn/layer.hpp"
#include "families/family.hpp"

namespace gdn::detail {
inline constexpr std::size_t kF = sizeof(float);

inline std::uint64_t next_layer_id() {
  static std::atomic<std::uint64_t> id{1};
  return id++;
}

inline void expect_size(const char* tensor, std::size_t got, std::size_t want, const std::string& shape) {
  if (got != want)
    throw std::invalid_argument(std::string(tensor) + " has " + std::to_string(got) + " elements, expected " +
                                std::to_string(want) + " (" + shape + ")");
}

inline void expect_shape(const char* tensor, const Tensor& t, std::vector<std::int64_t> want) {
  if (t.empty()) throw std::invalid_argument(std::string(tensor) + " is an empty tensor, expected " + shape_str(want));
  if (t.shape() != want)
    throw std::invalid_argument(std::string(tensor) + " is " + shape_str(t.shape()) + ", expected " + shape_str(want));
}

// Parameters, states and their gradients are float32 (only the boundary streams may be bfloat16).
inline void expect_f32(const char* tensor, const Tensor& t) {
  if (!t.empty() && t.dtype() != DType::Float32)
    throw std::invalid_argument(std::string(tensor) + " ('" + t.name() + "') is " + to_string(t.dtype()) +
                                ", expected float32 (states, parameters and their gradients are float32; qkv, z, "
                                "a, b, out, dout and their gradients may be bfloat16)");
}


/// A part of a call that runs as several (windows b0 .. b0+nb-1, tokens t0 .. t0+nt-1 of each; nb > 1
/// only with whole windows): its buffers fit one storage binding where the whole call's do not, or
/// it is (a run of) one sequence of a packed call, or nb consecutive sequences of nt tokens each
/// (rows t0 .. t0 + nb nt - 1 of the packed stream). Its windows' states are rows s0 .. s0+nb-1 of the
/// call's states; `first`: it starts them (from h0 and conv_state, else zero), else it continues the
/// part before it; `last`: it ends them (into the carry), else the part after it continues.
struct Part {
  int b0 = 0, nb = 0, t0 = 0, nt = 0;
  int s0 = 0;
  bool first = true, last = true;
  bool operator==(const Part&) const = default;
};

struct TapeState {
  std::uint64_t layer_id = 0;  // its layer, hence its kernel family and checkpoint layout
  int B = 0, T = 0;            // the call's windows and tokens
  int S = 0;                   // rows of its states: B, or the sequences of a packed call
  DeviceInputs inputs;         // shared with the caller (device API) or owned (host API)
  bool owns_inputs = false;
  BufferSet fwd;               // what the forward wrote (the family's forward_buffers), in one part
  // A call run as parts (layer_parts.cpp): each part's own tape, whose inputs are views of the call's,
  // copies of its a and b rows, and the states between parts (`owned`).
  std::vector<Part> parts;
  std::vector<std::shared_ptr<TapeState>> part_tapes;
  std::vector<Tensor> owned;
  std::shared_ptr<const void> slabs;  // a part's: the allocations its own buffers are ranges of

  bool recorded() const { return !fwd.empty() || !part_tapes.empty(); }
};

struct LayerImpl {
  std::shared_ptr<Context> ctx;
  gpu::Device& dev;
  Config cfg;                       // variant and checkpoint_interval resolved to what runs
  std::uint64_t id = next_layer_id();
  Tensor conv, a_log, dt_bias, norm;
  std::unique_ptr<Family> family;
  // What one run of the family's passes writes beside its tape and the call's tensors, kept between
  // calls of one shape: work[0], and one more set for each further lane where a packed call's
  // sequences run side by side (layer_parts.cpp).
  struct Work {
    BufferSet scratch_fwd;     // for forwards without a tape
    BufferSet bwd;             // the backward's workspace
    BufferSet param_work;      // the parameter-gradient passes' partial sums (conv_bwd's, param_part's)
    BufferSet family_scratch;  // the family's scratch_buffers
    // float32 stand-ins of bfloat16 da and db, rounded after the backward (shaders/common/to_bf16.comp):
    // param_sum reads da as float32. (Every other bfloat16 stream is read or written by the passes.)
    Tensor da32, db32;
  };
  std::vector<Work> work = std::vector<Work>(1);
  // Each lane's parameters' gradients over its sequences, [lanes][...] (layer_parts.cpp), and the
  // pass that adds them up (shaders/common/param_lanes.comp), built at the first call in lanes.
  Tensor lane_sums;
  std::shared_ptr<gpu::Pipeline> param_lanes;
  // Host API staging: device copies of host inputs (tape-less), the output and the gradients.
  DeviceInputs host_in;
  Tensor host_out, host_dout;
  DeviceGrads host_grads;
  DeviceCarry host_carry, host_dcarry;
  bool profiling = false;
  std::vector<KernelTime> timings;
  // Held by every call of the public Layer: threads sharing a layer take turns (its workspaces and
  // host staging are one per layer).
  std::recursive_mutex calls;

  LayerImpl(std::shared_ptr<Context> c, const Config& config, const Params& p)
      : ctx(std::move(c)), dev(device_of(*ctx)), cfg(config) {
    validate_config(p);
    if (const char* e = std::getenv("GDN_CHECK_FINITE"); e && std::string_view(e) == "1") cfg.check_finite = true;
    const FamilyEntry& entry = resolve_family();
    conv = upload({cfg.channels(), cfg.conv_taps}, "conv", p.conv);
    a_log = upload({cfg.nv}, "a_log", p.a_log);
    dt_bias = upload({cfg.nv}, "dt_bias", p.dt_bias);
    norm = upload({kHeadDim}, "norm", p.norm);
    const std::uint32_t subgroup_size = entry.variant == Variant::PerHead ? 0 : choose_subgroup_size(dev.info()).size;
    family = entry.make(FamilyArgs{dev, cfg, subgroup_size, LayerParams{conv, a_log, dt_bias, norm}});
  }

  void validate_config(const Params& p) const {
    cfg.check();
    const std::size_t C = cfg.channels(), K = cfg.conv_taps, nv = cfg.nv;
    expect_size("conv", p.conv.size(), C * K, "[C, K] = [" + std::to_string(C) + ", " + std::to_string(K) + "]");
    expect_size("a_log", p.a_log.size(), nv, "[nv] = [" + std::to_string(nv) + "]");
    expect_size("dt_bias", p.dt_bias.size(), nv, "[nv] = [" + std::to_string(nv) + "]");
    expect_size("norm", p.norm.size(), kD, "[D] = [128]");
  }

  // Picks the family: the first of registry() that runs here (Variant::Auto), or the one asked for
  // (an Error naming why it cannot run). Sets cfg.variant, cfg.checkpoint_interval (0 resolved) and
  // cfg.matrix_units to what runs.
  const FamilyEntry& resolve_family() {
    const DeviceInfo& info = dev.info();
    const Variant want = cfg.variant;
    for (const auto& e : registry()) {
      if (want != Variant::Auto && want != e.variant) continue;
      const int cs = cfg.checkpoint_interval ? cfg.checkpoint_interval : e.default_interval;
      const std::string why = e.why_not(info, cfg, cs);
      if (why.empty()) {
        cfg.variant = e.variant;
        cfg.checkpoint_interval = cs;
        cfg.matrix_units = e.matrix_units;
        if (!e.matrix_units) cfg.precision = Precision::Exact;  // no matrix-unit products run
        return e;
      }
      if (e.matrix_units) continue;  // the same family's CUDA-core module comes next
      if (want == e.variant || e.variant == Variant::PerHead)
        throw Error("the " + std::string(to_string(e.variant)) + " kernels cannot run on '" + info.name + "': " + why +
                    (e.variant == Variant::PerHead ? ""
                                                   : "; use Variant::Auto (--variant auto: the first family that runs "
                                                     "here) or Variant::PerHead (--variant per-head)"));
    }
    throw Error("no kernel family runs on '" + info.name + "'");
  }

  Tensor upload(std::vector<std::int64_t> shape, const char* name, const std::vector<float>& data) {
    Tensor t(ctx, std::move(shape), name);
    t.upload(data);
    return t;
  }

  // Makes f the buffers `decls()` declares for (B, T, keep) unless it holds them already; `grow`:
  // unless it holds buffers at least as large (the parts of one call, the largest first). Buffers
  // replaced while a call records are retired, not freed, until its work is done.
  template <class Decls>
  void ensure(BufferSet& f, int B, int T, bool keep, Decls&& decls, bool grow = false) {
    if (f.B == B && f.T == T && f.keep == keep && (!f.empty() || f.made)) return;
    if (grow && f.made && f.keep == keep) {
      const auto want = decls();
      bool fits = want.size() == f.buffers.size();
      for (std::size_t i = 0; fits && i < want.size(); ++i) fits = want[i].floats * kF <= f.buffers[i]->bytes;
      if (fits) {
        f.B = B;
        f.T = T;
        return;
      }
    }
    if (!f.empty()) {
      refuse_if_outstanding(B, T);
      retired.push_back(std::make_shared<BufferSet>(std::move(f)));
    }
    f = BufferSet{};  // frees the old buffers before allocating the new ones
    for (const auto& d : decls()) f.buffers.push_back(dev.create_buffer(d.name, d.floats * kF));
    f.B = B;
    f.T = T;
    f.keep = keep;
    f.made = true;
  }

  // Recorded or submitted work not yet released may read buffers that a call of another shape would free.
  void refuse_if_outstanding(std::int64_t B, std::int64_t T) const {
    for (const auto& w : outstanding)
      if (!w.expired())
        throw Error("layer: a call of another shape (B " + std::to_string(B) + ", T " + std::to_string(T) +
                    ") would free buffers that recorded work of this layer still uses; destroy its gdn::Recorded "
                    "(after its command buffer has completed) first");
  }

  // ---- bfloat16 da and db (Work::da32, db32) ----
  std::shared_ptr<gpu::Pipeline> to_bf16;  // built at the first bfloat16 call

  // t where it is float32 (or empty), else a float32 tensor of t's shape: `slot`, or a view of its
  // first elements where it is larger.
  Tensor f32_of(const Tensor& t, Tensor& slot) {
    if (t.empty() || t.dtype() == DType::Float32) return t;
    if (!to_bf16) to_bf16 = build_to_bf16(dev);
    grow(slot, t.shape(), t.name() + " (float32)", t.shape()[0], t.shape().size() > 1 ? t.shape()[1] : 1);
    return slot.shape() == t.shape() ? slot : sub_tensor(slot, 0, t.shape(), slot.name());
  }
  // Makes `slot` (a float32 tensor kept between calls) hold at least shape's elements: where it holds
  // fewer, a new one of `shape`, the old one retired (recorded work may still read it; a call of B, T
  // is refused while such work is outstanding).
  void grow(Tensor& slot, const std::vector<std::int64_t>& shape, const std::string& name, std::int64_t B,
            std::int64_t T) {
    if (!slot.empty() && slot.numel() >= checked_numel(shape, name)) return;
    if (!slot.empty()) {
      refuse_if_outstanding(B, T);
      retired.push_back(std::make_shared<Tensor>(slot));
    }
    slot = Tensor(ctx, shape, name);
  }
  // A view of t's elements from `first` on, shaped `shape` (first * element size a multiple of the
  // device's storage-buffer offset alignment).
  Tensor sub_tensor(const Tensor& t, std::int64_t first, std::vector<std::int64_t> shape, const std::string& name) const {
    return Tensor::wrap(ctx, t.vk_buffer(), t.vk_offset() + std::size_t(first) * dtype_bytes(t.dtype()), std::move(shape),
                        name, t.dtype());
  }
  // Rounds the float32 stand-in `from` into bfloat16 `to` where they differ.
  void record_cast(gpu::Recorder& r, const Tensor& from, const Tensor& to, const char* role) const {
    if (storage_of(from).buffer == storage_of(to).buffer) return;
    const std::uint64_t n = std::uint64_t(from.numel()), groups = ((n + 1) / 2 + 255) / 256;
    Push pc;
    pc.n = std::uint32_t(n);
    r.dispatch(*to_bf16, bindings::to_bf16{.src = view(from), .dst = view(to)}, pc, groups);
    r.mark(std::string("to_bf16 ") + role);
  }

  // The parameter-gradient passes' partial sums: conv_bwd's per (window, block of tokens), [blocks,
  // K, C]; param_part's per group of rows, [groups, D] (one float where the family leaves dnorm's).
  std::vector<BufferDecl> param_buffers(int B, int T) const {
    const std::size_t blocks = std::size_t(B) * ((T + kConvBwdTokens - 1) / kConvBwdTokens);
    const std::size_t groups =
        family->leaves_dnorm_parts() ? 0 : param_groups(std::uint64_t(B) * T * cfg.nv);
    return {{"dconv per block", blocks * cfg.conv_taps * std::size_t(cfg.channels())},
            {"dnorm per group of rows", std::max<std::size_t>(groups * kHeadDim, 1)}};
  }

  // dnorm from the tape's o and 1/rms with z and dout; dconv from conv_bwd's blocks; ddt_bias and
  // da_log from da (shaders/common/param_part.comp, param_sum.comp).
  void record_param_grads(gpu::Recorder& r, const Work& w, const TapeState& st, const Tensor& z,
                          const Tensor& dout, const DeviceGrads& g, bool accumulate);

  // ---- checks ----

  // Checks the inputs; B and T from qkv, S the rows of the states (B, or the packed sequences).
  void check_inputs(const DeviceInputs& in, int& B, int& T, int& S) const {
    if (in.qkv.empty()) throw std::invalid_argument("qkv is an empty tensor, expected [B, T, " + std::to_string(cfg.channels()) + "]");
    const auto& s = in.qkv.shape();
    if (s.size() != 3 || s[2] != cfg.channels())
      throw std::invalid_argument("qkv is " + shape_str(s) + ", expected [B, T, " + std::to_string(cfg.channels()) + "]");
    B = int(s[0]);
    T = int(s[1]);
    expect_shape("z", in.z, {B, T, cfg.value_dim()});
    expect_shape("a", in.a, {B, T, cfg.nv});
    expect_shape("b", in.b, {B, T, cfg.nv});
    for (const Tensor* t : {&in.qkv, &in.z, &in.a, &in.b}) check_context(*t);
    S = B;
    if (!in.cu_seqlens.empty()) S = check_seqlens(in.cu_seqlens, B, T);
    if (!in.h0.empty()) expect_shape("h0", in.h0, state_shape(S));
    if (!in.conv_state.empty()) expect_shape("conv_state", in.conv_state, conv_state_shape(S));
    for (const Tensor* t : {&in.h0, &in.conv_state})
      if (!t->empty()) check_context(*t);
    expect_f32("h0", in.h0);
    expect_f32("conv_state", in.conv_state);
  }
  // The sequences of a packed call (cu_seqlens: N+1 offsets into [1, T, ...], 0 first, T last,
  // increasing: no empty sequence), or an error naming the offending index.
  static int check_seqlens(const std::vector<std::int64_t>& cu, int B, int T);
  std::vector<std::int64_t> state_shape(int B) const { return {B, cfg.nv, kHeadDim, kHeadDim}; }
  std::vector<std::int64_t> conv_state_shape(int B) const { return {B, cfg.conv_taps - 1, cfg.channels()}; }
  // The conv state out of each window, the last K-1 rows of [conv_state; qkv]: qkv's rows and, for a
  // window shorter than K-1, conv_state's (zero without one); one pass (conv_state_out.comp).
  void record_conv_state_out(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out_state, int B, int T);

  void check_context(const Tensor& t) const {
    if (storage_of(t).ctx.get() != ctx.get())
      throw std::invalid_argument("tensor '" + t.name() + "' lives on another Context than the layer");
  }

  void check_tape(const TapeState* st) const {
    if (!st || !st->recorded()) throw std::invalid_argument("tape: backward from a tape that no forward has recorded");
    if (st->layer_id != id) throw std::invalid_argument("tape: recorded by another layer; a tape belongs to the layer whose forward filled it");
  }

  // ---- recording ----

  // Where a call records into a caller's command buffer (Layer::record_forward, record_backward), or
  // whether it submits without waiting (Layer::submit_*); what that work holds until it is done (its
  // descriptor sets, and what the call retired), which its Recorded or Pending takes.
  VkCommandBuffer record_into = VK_NULL_HANDLE;
  bool submit_only = false;
  std::vector<std::shared_ptr<void>> held;
  std::vector<std::unique_ptr<gpu::Device::Submission>> submitted;
  std::vector<std::weak_ptr<void>> outstanding;  // the Recorded and Pending of this layer (expired once gone)
  // The host API's transfers, made in the call's own submission (run)
  std::vector<gpu::Device::Transfer> host_up, host_down;

  // What a call's work may still use that the call itself replaced or made (buffers outgrown while it
  // recorded, the states between its parts): held until its work is done (run), or by its Recorded
  // or Pending.
  std::vector<std::shared_ptr<void>> retired;

  template <class Body>
  void run(Body&& body) {
    if (record_into != VK_NULL_HANDLE) {
      held.push_back(dev.record(record_into, [&](gpu::Recorder& r) { body(r); }));
    } else if (submit_only) {
      submitted.push_back(dev.submit([&](gpu::Recorder& r) { body(r); }));
    }
    if (record_into != VK_NULL_HANDLE || submit_only) {
      for (auto& x : retired) held.push_back(std::move(x));
      retired.clear();
      timings.clear();
      return;
    }
    auto intervals = dev.run([&](gpu::Recorder& r) { body(r); }, profiling, host_up, host_down);
    retired.clear();
    host_up.clear();
    host_down.clear();
    timings.clear();
    if (!profiling) return;
    double total = 0;
    for (auto& iv : intervals) {
      total += iv.ms;
      timings.push_back({iv.label, iv.ms, iv.bytes});
    }
    timings.push_back({"total", total});
  }

  // ---- Config::check_finite ----

  // The first NaN or Inf of tensor t, as "NAME element i (index [..]) is NaN", or "".
  static std::string first_nonfinite(const Tensor& t) {
    if (t.empty()) return "";
    const std::vector<float> v = t.download();
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::isfinite(v[i])) continue;
      std::vector<std::int64_t> idx(t.shape().size());
      std::int64_t rest = std::int64_t(i);
      for (std::size_t k = idx.size(); k-- > 0;) {
        idx[k] = rest % t.shape()[k];
        rest /= t.shape()[k];
      }
      return t.name() + " element " + std::to_string(i) + " (index " + shape_str(idx) + ") is " +
             (std::isnan(v[i]) ? "NaN" : "Inf");
    }
    return "";
  }
  void check_inputs_finite(const char* call, std::initializer_list<const Tensor*> ts) const {
    for (const Tensor* t : ts)
      if (auto m = t ? first_nonfinite(*t) : ""; !m.empty())
        throw std::invalid_argument(std::string(call) + ": " + m + " (Config::check_finite)");
  }
  void check_outputs_finite(const char* call, std::initializer_list<const Tensor*> ts) const {
    for (const Tensor* t : ts)
      if (auto m = t ? first_nonfinite(*t) : ""; !m.empty())
        throw Error(std::string(call) + ": " + m + ", from finite inputs (Config::check_finite)");
  }

  // ---- the calls ----

  // Push::flags for the states a call of `in` has: h0 and conv_state given, the state out asked for
  // (forward: s.ht) or its gradient given (backward: s.dht), the conv state out's gradient given.
  static void set_flags(States& s, const DeviceInputs& in) {
    s.flags = (in.h0.empty() ? 0 : kStateH0) | (in.conv_state.empty() ? 0 : kStateConv) |
              (s.ht.empty() && s.dht.empty() ? 0 : kStateCarry) | (s.dconv_out.empty() ? 0 : kStateDconvOut);
  }

  void forward(const DeviceInputs& in, Tensor& out, Tape* tape, DeviceCarry* carry) {
    int B = 0, T = 0, S = 0;
    check_inputs(in, B, T, S);
    // the outputs given are checked before any is allocated
    const std::vector<std::int64_t> out_shape{B, T, cfg.value_dim()};
    if (!out.empty()) {
      expect_shape("out", out, out_shape);
      check_context(out);
    }
    using Out = std::tuple<Tensor*, const char*, std::vector<std::int64_t>>;
    const std::vector<Out> carried =
        carry ? std::vector<Out>{{&carry->ht, "ht", state_shape(S)}, {&carry->conv_state, "conv_state out", conv_state_shape(S)}}
              : std::vector<Out>{};
    for (const auto& [t, name, shape] : carried) {
      if (t->empty()) continue;
      expect_shape(name, *t, shape);
      expect_f32(name, *t);
      check_context(*t);
    }
    if (out.empty()) out = Tensor(ctx, out_shape, "out", in.qkv.dtype());
    for (const auto& [t, name, shape] : carried)
      if (t->empty()) *t = Tensor(ctx, shape, name);
    if (cfg.check_finite) check_inputs_finite("forward", {&in.qkv, &in.z, &in.a, &in.b, &in.h0, &in.conv_state});
    const std::vector<Part> plan = in.cu_seqlens.empty() ? plan_parts(B, T) : plan_sequences(in.cu_seqlens);
    if (plan.size() > 1 || !in.cu_seqlens.empty()) {
      forward_parts(in, out, tape, carry, plan);
    } else {
      BufferSet* f = &work[0].scratch_fwd;
      if (tape) {
        auto& st = tape_state(*tape);
        if (!st.part_tapes.empty() || (st.recorded() && st.layer_id != id)) {  // another layout's buffers go
          refuse_if_outstanding(B, T);
          st.parts.clear();
          st.part_tapes.clear();
          st.owned.clear();
          st.fwd = BufferSet{};
        }
        st.layer_id = id;
        st.B = B;
        st.T = T;
        st.S = S;
        st.inputs = in;
        st.owns_inputs = false;
        f = &st.fwd;
      }
      ensure(*f, B, T, tape != nullptr, [&] { return family->forward_buffers(B, T, tape != nullptr); });
      ensure(work[0].family_scratch, B, T, false, [&] { return family->scratch_buffers(B, T); });
      States s;
      if (carry) s.ht = carry->ht;
      set_flags(s, in);
      run([&](gpu::Recorder& r) { record_forward_part(r, work[0], in, out, *f, s, carry ? &carry->conv_state : nullptr); });
    }
    if (cfg.check_finite) check_outputs_finite("forward", {&out, carry ? &carry->ht : nullptr, carry ? &carry->conv_state : nullptr});
  }

  // One forward of (f.B, f.T) windows and tokens with w: the family's passes between the casts of
  // bfloat16 streams, and the conv state out where `conv_state_out` is given.
  void record_forward_part(gpu::Recorder& r, Work& w, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                           const States& s, const Tensor* conv_state_out);
  // One backward of a part (or of the whole call) from its tape with w: g's input gradients of its
  // rows, the parameters' gradients added to g's where `accumulate`.
  void record_backward_part(gpu::Recorder& r, Work& w, const TapeState& st, const Tensor& dout, const DeviceGrads& g,
                            const States& s, bool accumulate);

  // ---- calls run as parts (layer_parts.cpp) ----
  // The parts of a call of B windows of T tokens: one (the call) where every buffer fits one storage
  // binding and T is within Config::part_tokens, else groups of whole windows, else runs of tokens of
  // one window (a multiple of the checkpoint interval; the state carried from one to the next).
  std::vector<Part> plan_parts(int B, int T) const;
  // The most tokens of a window (of T) one part takes: Config::part_tokens where set, and on a driver
  // that ends an invocation's loops after DeviceInfo::max_loop_iterations, what the family's passes
  // stay within (Family::loop_iterations_per_token).
  int part_cap(int T) const;
  // Whether nb windows of nt tokens fit one storage binding.
  bool fits_range(int nb, int nt) const;
  // The tokens of a window's run where a window of T (or more than cap) does not fit: the longest
  // multiple of the interval that does.
  int run_tokens(int T, int cap) const;
  // The parts of a packed call: each sequence one part, or runs of its tokens where it does not fit;
  // consecutive sequences of one length one part of as many windows as fit.
  std::vector<Part> plan_sequences(const std::vector<std::int64_t>& cu) const;
  void forward_parts(const DeviceInputs& in, const Tensor& out, Tape* tape, DeviceCarry* carry,
                     const std::vector<Part>& plan);
  void backward_parts(const TapeState& st, const Tensor& dout, const DeviceGrads& g, const DeviceCarry* dcarry);

  void backward(const Tape& tape, const Tensor& dout, DeviceGrads& g, const DeviceCarry* dcarry) {
    const TapeState* st = tape_state_ptr(tape);
    check_tape(st);
    const int B = st->B, T = st->T, S = st->S;
    expect_shape("dout", dout, {B, T, cfg.value_dim()});
    if (dcarry && !dcarry->ht.empty()) {
      expect_shape("dht", dcarry->ht, state_shape(S));
      expect_f32("dht", dcarry->ht);
      check_context(dcarry->ht);
    }
    if (dcarry && !dcarry->conv_state.empty()) {
      expect_shape("dconv_state out", dcarry->conv_state, conv_state_shape(S));
      expect_f32("dconv_state out", dcarry->conv_state);
      check_context(dcarry->conv_state);
    }
    // The gradients given are checked, then the others allocated: an input's gradient takes the
    // input's dtype, the rest are float32.
    const DeviceInputs& in = st->inputs;
    struct Grad {
      Tensor* t;
      const char* name;
      std::vector<std::int64_t> shape;
      DType dtype;
    };
    std::vector<Grad> grads{{&g.dqkv, "dqkv", {B, T, cfg.channels()}, in.qkv.dtype()},
                            {&g.dz, "dz", {B, T, cfg.value_dim()}, in.z.dtype()},
                            {&g.da, "da", {B, T, cfg.nv}, in.a.dtype()},
                            {&g.db, "db", {B, T, cfg.nv}, in.b.dtype()},
                            {&g.dconv_state, "dconv_state", conv_state_shape(S), DType::Float32}};
    if (cfg.param_grads)
      grads.insert(grads.end(), {{&g.dconv, "dconv", {cfg.channels(), cfg.conv_taps}, DType::Float32},
                                 {&g.da_log, "da_log", {cfg.nv}, DType::Float32},
                                 {&g.ddt_bias, "ddt_bias", {cfg.nv}, DType::Float32},
                                 {&g.dnorm, "dnorm", {kHeadDim}, DType::Float32}});
    if (!in.h0.empty()) grads.push_back({&g.dh0, "dh0", state_shape(S), DType::Float32});
    check_context(dout);
    for (const auto& x : grads) {
      if (x.t->empty()) continue;
      expect_shape(x.name, *x.t, x.shape);
      if (x.dtype == DType::Float32) expect_f32(x.name, *x.t);
      check_context(*x.t);
    }
    for (const auto& x : grads)
      if (x.t->empty()) *x.t = Tensor(ctx, x.shape, x.name, x.dtype);
    if (cfg.check_finite)
      check_inputs_finite("backward", {&dout, dcarry ? &dcarry->ht : nullptr, dcarry ? &dcarry->conv_state : nullptr});
    if (st->part_tapes.empty()) {
      ensure(work[0].bwd, B, T, true, [&] { return family->backward_buffers(B, T); });
      ensure(work[0].param_work, B, T, true, [&] { return param_buffers(B, T); });
      States s;
      if (dcarry) {
        s.dht = dcarry->ht;
        s.dconv_out = dcarry->conv_state;
      }
      if (!in.h0.empty()) s.dh0 = g.dh0;
      set_flags(s, in);
      run([&](gpu::Recorder& r) { record_backward_part(r, work[0], *st, dout, g, s, false); });
    } else {
      backward_parts(*st, dout, g, dcarry);
    }
    if (cfg.check_finite)
      check_outputs_finite("backward", {&g.dqkv, &g.dz, &g.da, &g.db, &g.dconv, &g.da_log, &g.ddt_bias, &g.dnorm,
                                        &g.dh0, &g.dconv_state});
  }

  static TapeState& tape_state(Tape& t);
  static const TapeState* tape_state_ptr(const Tape& t);
};

}  // namespace gdn::detail
