// SPDX-License-Identifier: MIT
// The layer behind gdn::Layer: its buffers (workspaces and tapes), its input checks and calls. The
// order of each family's kernels is layer_record.cpp's; the kernels' math lives in shaders/, the
// Vulkan plumbing in vk/.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "detail.hpp"
#include "gdn/layer.hpp"
#include "kernels.hpp"

namespace gdn::detail {
inline constexpr std::size_t kD = kHeadDim;
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


/// Buffers one forward writes, sized for (B, T). A tape owns one set; the layer owns another for
/// forwards without a tape (whose checkpoint buffer is never written).
struct ForwardState {
  int B = 0, T = 0;
  bool keep = false;
  std::unique_ptr<gpu::Buffer> y;      // [B, T, nv*D] conv + silu output, v channels (q and k: qkn);
                                       // the matrix units' path keeps it in LayerImpl::y_scratch
  std::unique_ptr<gpu::Buffer> qkn;    // [2][B, T, nk, D] q^, k^
  std::unique_ptr<gpu::Buffer> nq;     // [2][B, T, nk] squared norms + 1e-6
  std::unique_ptr<gpu::Buffer> gates;  // [3][B, T, nv] g, beta, a + dt_bias
  std::unique_ptr<gpu::Buffer> o;      // [B, T, nv*D] o before the norm (the matrix units' forward,
                                       // whose norm is fused in: with a tape only)
  std::unique_ptr<gpu::Buffer> inv;    // [B, T, nv] 1/rms
  std::unique_ptr<gpu::Buffer> ck;     // state checkpoints (layout per family)
  std::unique_ptr<gpu::Buffer> kv;     // [B, T, nv*D] kv per step (column-split family, with a tape);
                                       // the matrix units' chunked forward: u per step (with a tape)
  // The matrix units' chunked forward's per-chunk operators (chunk_prep_fwd), which
  // its backward reuses: [B, T, nv, X] with X = CH (T, P), 1 (lg).
  std::unique_ptr<gpu::Buffer> tm, pm, lgc;
  // With a tape, what the matrix units' backward takes its dT and dbeta from: X = V - diag(gamma) K S0
  // per chunk ([B, T, nv*D], chunk_fwd_mma) and G = K K^T ([B, nk, chunks, CH, CH], chunk_prep_fwd).
  std::unique_ptr<gpu::Buffer> x, gm;
  // The matrix units' power-of-two exponents (shaders/matrix/mma.glsl): each head's for U and X and for
  // the states ([2][B, nv]), and per chunk the q^, k^ one ([B, nk, chunks]) and the P one ([B, nv, chunks]).
  std::unique_ptr<gpu::Buffer> vscale, eqk, ep;

  /// Every buffer slot (empty ones too), in one place for bytes() and Tape::buffers().
  std::array<const std::unique_ptr<gpu::Buffer>*, 16> slots() const {
    return {&y, &qkn, &nq, &gates, &o, &inv, &ck, &kv, &tm, &pm, &lgc, &x, &gm, &vscale, &eqk, &ep};
  }
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto* b : slots())
      if (*b) n += (*b)->bytes;
    return n;
  }
};

struct TapeState {
  std::uint64_t layer_id = 0;  // its layer, hence its kernel family and checkpoint layout
  DeviceInputs inputs;  // shared with the caller (device API) or owned (host API)
  bool owns_inputs = false;
  ForwardState fwd;
};

/// Scratch of one backward, sized for (B, T).
struct BackwardState {
  int B = 0, T = 0;
  std::unique_ptr<gpu::Buffer> scr;  // per-head: [B, nv, cs, D*D] replayed states
  std::unique_ptr<gpu::Buffer> kvs;  // per-head: [B, nv, cs, D] replayed kv
  std::unique_ptr<gpu::Buffer> dqk;  // per-head: [2][B, T, nv, D] dq^, dk^; column-split: [B, T, nv][4][257] partials
  std::unique_ptr<gpu::Buffer> do_;  // column-split: [B, T, nv*D] grad of o
  std::unique_ptr<gpu::Buffer> dy;   // [B, T, C] grad of the conv + silu output
  // The chunked backward's (shaders/chunked/chunk.glsl); dqk holds its records [B, T, nv][258].
  std::unique_ptr<gpu::Buffer> w;    // [B, T, nv, D] W, then dW
  std::unique_ptr<gpu::Buffer> tm;   // [B, T, nv, CH] T = (I + A)^-1
  std::unique_ptr<gpu::Buffer> du;   // [B, T, nv*D] grad of the chunks' u rows (matrix units: Yv = T^T dU)
  std::unique_ptr<gpu::Buffer> pdots;  // matrix units: [B, nv, nch][2][16][16] <dO_i, u_j>, <Yv_i, x_j>
  std::unique_ptr<gpu::Buffer> fac;    // matrix units: [B, nv, nch][kChunkFactors][2][16][16] fp16 factors (shaders/matrix/chunk_factors.glsl)
  std::unique_ptr<gpu::Buffer> dscale; // matrix units: [3][B, nv] each head's exponents of dO, dS and Yv (mma.glsl)
  std::unique_ptr<gpu::Buffer> mdiag;  // matrix units: [B, nv, nch][16] M's diagonal (shaders/matrix/chunk_factors.comp)
  std::unique_ptr<gpu::Buffer> dsc;  // [B, nv, state_slots, D, D] grad of each chunk's (matrix units: pair's) end state
  std::unique_ptr<gpu::Buffer> lgc;  // [2][B, T, nv] cumulative log gates within each chunk (hi, lo)
  std::unique_ptr<gpu::Buffer> pairs;  // [B, nv, nch][2][CH][CH] chunk_values' pair dots
  std::unique_ptr<gpu::Buffer> sdot;   // [B, nv, nch] chunk_values' Gamma <dS, S0>

  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto* b : {&scr, &kvs, &dqk, &do_, &dy, &w, &tm, &du, &pdots, &fac, &dscale, &mdiag, &dsc, &lgc, &pairs, &sdot})
      if (*b) n += (*b)->bytes;
    return n;
  }
};

struct LayerImpl {
  std::shared_ptr<Context> ctx;
  gpu::Device& dev;
  Config cfg;                       // variant and checkpoint_interval resolved to what runs
  std::uint32_t subgroup_size = 0;  // the column-split and chunked families', where they run
  std::uint64_t id = next_layer_id();
  Tensor conv, a_log, dt_bias, norm;
  CommonKernels common;
  PerHeadKernels per_head;    // built for Variant::PerHead
  SubgroupKernels subgroup;   // built for Variant::Subgroup and Variant::Chunked (its forward)
  ChunkedKernels chunked;     // built for Variant::Chunked
  ForwardState scratch_fwd;  // for forwards without a tape
  // The matrix units' path's conv output (v): only its forward reads it (the backward reads X in its
  // place), so no tape keeps it. Grows to the largest shape seen.
  std::unique_ptr<gpu::Buffer> y_scratch;
  BackwardState bwd;
  // Host API staging: device copies of host inputs (tape-less), the output and the gradients.
  DeviceInputs host_in;
  Tensor host_out, host_dout;
  DeviceGrads host_grads;
  bool profiling = false;
  std::vector<KernelTime> timings;

  LayerImpl(std::shared_ptr<Context> c, const Config& config, const Params& p)
      : ctx(std::move(c)), dev(device_of(*ctx)), cfg(config) {
    validate_config(p);
    if (const char* e = std::getenv("GDN_CHECK_FINITE"); e && std::string_view(e) == "1") cfg.check_finite = true;
    resolve_variant(cfg.variant);
    conv = upload({cfg.channels(), cfg.conv_taps}, "conv", p.conv);
    a_log = upload({cfg.nv}, "a_log", p.a_log);
    dt_bias = upload({cfg.nv}, "dt_bias", p.dt_bias);
    norm = upload({kHeadDim}, "norm", p.norm);
    common = build_common(dev, std::uint32_t(cfg.conv_taps));
    cfg.matrix_units = cfg.matrix_units && cfg.variant == Variant::Chunked &&
                       chunked_matrix_why_not(dev.info(), std::uint32_t(cfg.checkpoint_interval)).empty();
    if (cfg.variant == Variant::PerHead)
      per_head = build_per_head(dev);
    else if (!cfg.matrix_units)  // the matrix units' chunked passes replace every column-split kernel
      subgroup = build_subgroup(dev, subgroup_size, cfg.variant == Variant::Subgroup);
    if (cfg.variant == Variant::Chunked)
      chunked = build_chunked(dev, subgroup_size, std::uint32_t(cfg.checkpoint_interval), cfg.matrix_units,
                              std::uint32_t(cfg.conv_taps));
  }

  void validate_config(const Params& p) const {
    cfg.check();
    const std::size_t C = cfg.channels(), K = cfg.conv_taps, nv = cfg.nv;
    expect_size("conv", p.conv.size(), C * K, "[C, K] = [" + std::to_string(C) + ", " + std::to_string(K) + "]");
    expect_size("a_log", p.a_log.size(), nv, "[nv] = [" + std::to_string(nv) + "]");
    expect_size("dt_bias", p.dt_bias.size(), nv, "[nv] = [" + std::to_string(nv) + "]");
    expect_size("norm", p.norm.size(), kD, "[D] = [128]");
  }

  // Sets cfg.variant (Auto resolved), cfg.checkpoint_interval (0 resolved) and, for the column-split
  // and chunked families, subgroup_size: the first family of family_support() that runs, or the one
  // asked for (an Error naming why it cannot run).
  void resolve_variant(Variant v) {
    const auto families = family_support(*ctx, cfg);
    auto take = [&](const FamilySupport& f) {
      cfg.variant = f.variant;
      cfg.checkpoint_interval = f.checkpoint_interval;
      if (f.variant != Variant::PerHead) subgroup_size = choose_subgroup_size(dev.info()).size;
    };
    for (const auto& f : families) {
      if (v != Variant::Auto && v != f.variant) continue;
      if (f.runs) return take(f);
      if (v == f.variant || f.variant == Variant::PerHead)
        throw Error("the " + std::string(to_string(f.variant)) + " kernels cannot run on '" + dev.info().name + "': " +
                    f.why_not +
                    (f.variant == Variant::PerHead ? ""
                                                   : "; use Variant::Auto (--variant auto: the first family that runs "
                                                     "here) or Variant::PerHead (--variant per-head)"));
    }
  }

  Tensor upload(std::vector<std::int64_t> shape, const char* name, const std::vector<float>& data) {
    Tensor t(ctx, std::move(shape), name);
    t.upload(data);
    return t;
  }

  std::unique_ptr<gpu::Buffer> buffer(const char* name, std::size_t floats) { return dev.create_buffer(name, floats * kF); }

  // An interval longer than the window is the window: one segment, and scratch for T states only.
  // The chunked kernels take the configured length as a pipeline constant: one partial chunk.
  int interval(int T) const {
    return cfg.variant == Variant::Chunked ? cfg.checkpoint_interval : std::min(cfg.checkpoint_interval, T);
  }
  int nseg(int T) const { return (T + interval(T) - 1) / interval(T); }
  // Groups of chunks between stored states: pairs on the matrix units (chunk_pair_bwd_mma takes a pair
  // per workgroup and makes the state between its chunks again), else single segments.
  int state_groups(int T) const {
    const int per_group = chunked.chunk_pair_bwd_mma ? 2 : 1;
    return (nseg(T) + per_group - 1) / per_group;
  }
  // Slots of the stored states (the checkpoints, and the chunked backward's end-state gradients):
  // one per edge between groups, at least one.
  std::size_t state_slots(int T) const { return std::size_t(std::max(state_groups(T), 2) - 1); }

  Push push(int B, int T, bool keep) const {
    return Push{.nb = std::uint32_t(B), .t = std::uint32_t(T), .nv = std::uint32_t(cfg.nv), .nk = std::uint32_t(cfg.nk),
                .c_dim = std::uint32_t(cfg.channels()), .kk = std::uint32_t(cfg.conv_taps),
                .cs = std::uint32_t(interval(T)), .nseg = std::uint32_t(nseg(T)),
                .keep = keep ? 1u : 0u, .eps = cfg.rms_eps};
  }

  void ensure(ForwardState& f, int B, int T, bool keep) {
    if (f.B == B && f.T == T && f.keep == keep && f.qkn) return;
    f = ForwardState{};  // frees the old buffers before allocating the new ones
    const std::size_t BT = std::size_t(B) * T, nv = cfg.nv, nk = cfg.nk;
    // v; the q and k channels leave normalized, in qkn
    if (!chunked.chunk_fwd_mma) f.y = buffer("v (conv output)", BT * nv * kD);
    else if (!y_scratch || y_scratch->bytes < BT * nv * kD * kF) y_scratch = buffer("v (conv output)", BT * nv * kD);
    f.qkn = buffer("qk_hat", 2 * BT * nk * kD);
    f.nq = buffer("qk_norms", 2 * BT * nk);
    f.gates = buffer("gates", 3 * BT * nv);
    f.o = buffer("o (pre-norm)", BT * nv * kD);
    f.inv = buffer("inv_rms", BT * nv);
    // Checkpoints (every family): the state at the start of segments (chunks) 1 .. nseg-1 (segment 0 starts
    // at zero); the matrix units' chunked forward keeps only those of even chunks (state_slots).
    const std::size_t slots = keep ? state_slots(T) : 0;
    f.ck = buffer("checkpoints", std::max<std::size_t>(1, std::size_t(B) * nv * slots * kD * kD));
    if (chunked.chunk_fwd_mma) {
      const std::size_t ch = interval(T);
      f.kv = buffer("u per step", keep ? BT * nv * kD : 1);
      // for the backward only: X and G
      f.x = buffer("X per chunk", keep ? BT * nv * kD : 1);
      f.gm = buffer("G per chunk", keep ? std::size_t(B) * nk * nseg(T) * ch * ch : 1);
      f.tm = buffer("T per chunk", BT * nv * ch);
      f.pm = buffer("P per chunk", BT * nv * ch);
      f.lgc = buffer("cumulative log gates", 2 * BT * nv);  // hi, lo (shaders/chunked/chunk.glsl)
      f.vscale = buffer("U and state scale exponents", 2 * std::size_t(B) * nv);
      f.eqk = buffer("q, k scale exponents", std::size_t(B) * nk * nseg(T));
      f.ep = buffer("P scale exponents", std::size_t(B) * nv * nseg(T));
    } else if (cfg.variant != Variant::PerHead) {
      f.kv = buffer("kv per step", keep ? BT * nv * kD : 1);
    }
    f.B = B;
    f.T = T;
    f.keep = keep;
  }

  void ensure_backward(int B, int T) {
    if (bwd.B == B && bwd.T == T && bwd.dy) return;
    bwd = BackwardState{};
    const std::size_t BT = std::size_t(B) * T, nv = cfg.nv, cs = interval(T);
    if (cfg.variant == Variant::PerHead) {
      bwd.scr = buffer("replay scratch", std::size_t(B) * nv * cs * kD * kD);
      bwd.kvs = buffer("replay kv", std::size_t(B) * nv * cs * kD);
      bwd.dqk = buffer("dqk per v-head", 2 * BT * nv * kD);
    } else if (cfg.variant == Variant::Subgroup) {
      bwd.do_ = buffer("do (grad of o)", BT * nv * kD);
      bwd.dqk = buffer("dqk partials", BT * nv * kColumnBlocks * kPartialWords);
    } else {
      const std::size_t slots = state_slots(T), chunks = std::size_t(B) * nv * nseg(T);
      bwd.do_ = buffer("do (grad of o)", BT * nv * kD);
      bwd.dqk = buffer("chunk records", BT * nv * kChunkRecordWords);
      bwd.du = buffer(chunked.chunk_dstate_mma ? "Yv = T^T dU per chunk" : "dU per chunk", BT * nv * kD);
      bwd.dsc = buffer("end-state grads per chunk", std::size_t(B) * nv * slots * kD * kD);
      // The matrix units' backward reads T and lg from the tape and hands chunk_dstate_mma's pair dots
      // to chunk_factors, its factors to the pair pass, and its Yv to conv_bwd (dv = beta Yv, made
      // there: dy's v part is not written); the CUDA-core passes make T and lg, and hand W, dW, the
      // pair dots and <dS, S0> from pass to pass.
      if (chunked.chunk_dstate_mma) {
        bwd.pdots = buffer("pair dots per chunk", chunks * 2 * 16 * 16);
        bwd.fac = buffer("pair pass factors per chunk", chunks * kChunkFactors * 2 * 16 * 16 / 2);
        bwd.dscale = buffer("dO, dS and Yv scale exponents", 3 * std::size_t(B) * nv);
        bwd.mdiag = buffer("M's diagonal per chunk", chunks * 16);
      } else {
        bwd.w = buffer("W, dW per chunk", BT * nv * kD);
        bwd.pairs = buffer("pair dots per chunk", chunks * 2 * cs * cs);
        bwd.sdot = buffer("<dS, S0> per chunk", chunks);
        bwd.tm = buffer("T per chunk", BT * nv * cs);
        bwd.lgc = buffer("cumulative log gates per chunk", 2 * BT * nv);  // hi, lo (shaders/chunked/chunk.glsl)
      }
    }
    bwd.dy = buffer("dy (conv output grad)", BT * cfg.channels());
    bwd.B = B;
    bwd.T = T;
  }

  // ---- checks ----

  void check_inputs(const DeviceInputs& in, int& B, int& T) const {
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
  }

  void check_context(const Tensor& t) const {
    if (storage_of(t).ctx.get() != ctx.get())
      throw std::invalid_argument("tensor '" + t.name() + "' lives on another Context than the layer");
  }

  void check_tape(const TapeState* st) const {
    if (!st || !st->fwd.qkn) throw std::invalid_argument("tape: backward from a tape that no forward has recorded");
    if (st->layer_id != id) throw std::invalid_argument("tape: recorded by another layer; a tape belongs to the layer whose forward filled it");
  }

  // ---- recording ----

  template <class Body>
  void run(Body&& body) {
    auto intervals = dev.run([&](gpu::Recorder& r) { body(r); }, profiling);
    timings.clear();
    if (!profiling) return;
    double total = 0;
    for (auto& iv : intervals) {
      total += iv.ms;
      timings.push_back({iv.label, iv.ms});
    }
    timings.push_back({"total", total});
  }

  static gpu::BufferView v(const gpu::Buffer& b) { return {&b}; }
  // The conv output (v) a forward state's passes read: its own, or the matrix path's scratch.
  const gpu::Buffer& y_of(const ForwardState& f) const { return f.y ? *f.y : *y_scratch; }
  static gpu::BufferView v(const Tensor& t) { return {storage_of(t).buffer.get()}; }

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const ForwardState& f, int B, int T);
  // The chunked backward's passes (shaders/chunked/chunk.glsl); the last is marked by the caller.
  void record_chunked_recurrence(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g,
                                 const Push& pc);
  void record_backward(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g);

  // ---- Config::check_finite ----

  // The first NaN or Inf of tensor t, as "NAME element i (index [..]) is NaN", or "".
  static std::string first_nonfinite(const Tensor& t) {
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
      if (auto m = first_nonfinite(*t); !m.empty())
        throw std::invalid_argument(std::string(call) + ": " + m + " (Config::check_finite)");
  }
  void check_outputs_finite(const char* call, std::initializer_list<const Tensor*> ts) const {
    for (const Tensor* t : ts)
      if (auto m = first_nonfinite(*t); !m.empty())
        throw Error(std::string(call) + ": " + m + ", from finite inputs (Config::check_finite)");
  }

  // ---- the calls ----

  void forward(const DeviceInputs& in, Tensor& out, Tape* tape) {
    int B = 0, T = 0;
    check_inputs(in, B, T);
    const std::vector<std::int64_t> out_shape{B, T, cfg.value_dim()};
    if (out.empty()) out = Tensor(ctx, out_shape, "out");
    expect_shape("out", out, out_shape);
    check_context(out);
    ForwardState* f = &scratch_fwd;
    if (tape) {
      auto& st = tape_state(*tape);
      st.layer_id = id;
      st.inputs = in;
      st.owns_inputs = false;
      f = &st.fwd;
    }
    ensure(*f, B, T, tape != nullptr);
    if (cfg.check_finite) check_inputs_finite("forward", {&in.qkv, &in.z, &in.a, &in.b});
    run([&](gpu::Recorder& r) { record_forward(r, in, out, *f, B, T); });
    if (cfg.check_finite) check_outputs_finite("forward", {&out});
  }

  void backward(const Tape& tape, const Tensor& dout, DeviceGrads& g) {
    const TapeState* st = tape_state_ptr(tape);
    check_tape(st);
    const int B = st->fwd.B, T = st->fwd.T;
    expect_shape("dout", dout, {B, T, cfg.value_dim()});
    auto alloc = [&](Tensor& t, const char* name, const std::vector<std::int64_t>& shape) {
      if (t.empty()) t = Tensor(ctx, shape, name);
      expect_shape(name, t, shape);
    };
    alloc(g.dqkv, "dqkv", {B, T, cfg.channels()});
    alloc(g.dz, "dz", {B, T, cfg.value_dim()});
    alloc(g.da, "da", {B, T, cfg.nv});
    alloc(g.db, "db", {B, T, cfg.nv});
    check_context(dout);
    for (const Tensor* t : {&g.dqkv, &g.dz, &g.da, &g.db}) check_context(*t);
    ensure_backward(B, T);
    if (cfg.check_finite) check_inputs_finite("backward", {&dout});
    run([&](gpu::Recorder& r) { record_backward(r, *st, dout, g); });
    if (cfg.check_finite) check_outputs_finite("backward", {&g.dqkv, &g.dz, &g.da, &g.db});
  }

  static TapeState& tape_state(Tape& t);
  static const TapeState* tape_state_ptr(const Tape& t);
};

}  // namespace gdn::detail
