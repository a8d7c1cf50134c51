// SPDX-License-Identifier: MIT
// gdn::Layer: input checks, buffers (workspaces and tapes), and the order of the kernels of each
// family. The kernels' math lives in shaders/; the Vulkan plumbing in vk/.
#include "gdn/layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <array>
#include <atomic>
#include <stdexcept>

#include "detail.hpp"
#include "kernels.hpp"

namespace gdn {

std::string_view to_string(Variant v) {
  switch (v) {
    case Variant::Auto: return "auto";
    case Variant::Subgroup: return "subgroup";
    case Variant::PerHead: return "per-head";
    case Variant::Chunked: return "chunked";
  }
  return "?";
}

Variant parse_variant(std::string_view s) {
  if (s == "auto") return Variant::Auto;
  if (s == "subgroup") return Variant::Subgroup;
  if (s == "per-head") return Variant::PerHead;
  if (s == "chunked") return Variant::Chunked;
  throw std::invalid_argument("variant '" + std::string(s) + "': expected auto, subgroup, per-head or chunked");
}

void Config::check() const {
  auto bound = [](const char* name, std::int64_t v, std::int64_t lo, std::int64_t hi, const char* why) {
    if (v < lo || v > hi)
      throw std::invalid_argument("config: " + std::string(name) + " = " + std::to_string(v) + ", expected " +
                                  std::to_string(lo) + " to " + std::to_string(hi) + why);
  };
  bound("nv", nv, 1, kMaxHeads, " (value heads)");
  bound("nk", nk, 1, kMaxHeads, " (key heads)");
  if (nv % nk != 0)
    throw std::invalid_argument("config: nv = " + std::to_string(nv) + " is not a multiple of nk = " +
                                std::to_string(nk) + " (each key head serves nv/nk value heads)");
  bound("conv_taps", conv_taps, 1, kMaxConvTaps, " (the conv kernels unroll the taps)");
  if (variant == Variant::Chunked)
    bound("checkpoint_interval", checkpoint_interval, 0, kMaxChunk,
          " for the chunked family (its chunk length; 0: the default, 16)");
  else
    bound("checkpoint_interval", checkpoint_interval, 0, kMaxCheckpointInterval, " (0: the family's default)");
  if (!(rms_eps >= 0) || !std::isfinite(rms_eps)) throw std::invalid_argument("config: rms_eps must be finite and >= 0");
}

std::vector<FamilySupport> family_support(const Context& ctx, const Config& cfg) {
  cfg.check();
  const DeviceInfo& info = ctx.device();
  const auto choice = detail::choose_subgroup_size(info);
  std::vector<FamilySupport> out;
  for (Variant f : {Variant::Chunked, Variant::Subgroup, Variant::PerHead}) {
    FamilySupport s;
    s.variant = f;
    s.checkpoint_interval = cfg.checkpoint_interval
                                ? cfg.checkpoint_interval
                                : (f == Variant::Chunked ? detail::kDefaultChunk : detail::kDefaultInterval);
    const auto cs = std::uint32_t(s.checkpoint_interval);
    if (info.max_workgroup_invocations < 256)  // every recurrence kernel runs 256 invocations a workgroup
      s.why_not = "the device allows " + std::to_string(info.max_workgroup_invocations) +
                  " invocations per workgroup; gdn's kernels need 256 (maxComputeWorkGroupInvocations)";
    else if (f != Variant::PerHead && !choice.size)
      s.why_not = choice.why_not;
    else if (f == Variant::Chunked)
      s.why_not = detail::chunked_why_not(info, choice.size, cs);
    else if (f == Variant::Subgroup)
      s.why_not = detail::subgroup_backward_why_not(info, choice.size, cs);
    s.runs = s.why_not.empty();
    s.matrix_units = s.runs && f == Variant::Chunked && cfg.matrix_units && detail::chunked_matrix_why_not(info, cs).empty();
    out.push_back(std::move(s));
  }
  return out;
}

namespace detail {
namespace {

constexpr std::size_t kD = kHeadDim;
constexpr std::size_t kF = sizeof(float);

std::uint64_t next_layer_id() {
  static std::atomic<std::uint64_t> id{1};
  return id++;
}

void expect_size(const char* tensor, std::size_t got, std::size_t want, const std::string& shape) {
  if (got != want)
    throw std::invalid_argument(std::string(tensor) + " has " + std::to_string(got) + " elements, expected " +
                                std::to_string(want) + " (" + shape + ")");
}

void expect_shape(const char* tensor, const Tensor& t, std::vector<std::int64_t> want) {
  if (t.empty()) throw std::invalid_argument(std::string(tensor) + " is an empty tensor, expected " + shape_str(want));
  if (t.shape() != want)
    throw std::invalid_argument(std::string(tensor) + " is " + shape_str(t.shape()) + ", expected " + shape_str(want));
}

}  // namespace

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
  // The matrix units' power-of-two exponents (shaders/matrix/mma.glsl): each head's bound on U, X and the
  // states ([B, nv]), and per chunk the q^, k^ one ([B, nk, chunks]) and the P one ([B, nv, chunks]).
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
  std::unique_ptr<gpu::Buffer> dscale; // matrix units: [B, nv] the exponent of each head's dO scale (mma.glsl)
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
      f.vscale = buffer("v scale exponents", std::size_t(B) * nv);
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
        bwd.dscale = buffer("dO scale exponents", std::size_t(B) * nv);
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

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const ForwardState& f, int B, int T) {
    const Push pc = push(B, T, f.keep);
    const std::uint64_t BT = std::uint64_t(B) * T;
    r.dispatch(*common.conv_fwd, {v(in.qkv), v(conv), v(y_of(f)), v(*f.qkn), v(*f.nq)}, pc,
               conv_groups(f.B, f.T, cfg.channels(), kConvFwdTokens));
    r.mark("conv_fwd");  // the q/k l2 norms fused in
    if (chunked.chunk_fwd_mma) {
      // The gates are made by chunk_prep_fwd, which reads them first (no gate_prep pass)
      r.dispatch(*chunked.chunk_prep_fwd,
                 {v(*f.qkn), v(*f.gates), v(a_log), v(*f.tm), v(*f.lgc), v(*f.pm), v(in.a), v(in.b), v(dt_bias), v(*f.gm),
                  v(*f.eqk), v(*f.ep)},
                 pc,
                 std::uint64_t(B) * cfg.nk * pc.nseg);
      r.mark("chunk_prep_fwd");  // gate_prep fused in
      r.dispatch(*chunked.chunk_fwd_mma,
                 {v(*f.qkn), v(*f.lgc), v(*f.tm), v(*f.kv), v(*f.pm), v(*f.o), v(*f.ck), v(in.z), v(norm), v(out), v(*f.inv),
                  v(*f.gates), v(y_of(f)), v(*f.x), v(*f.vscale), v(*f.eqk), v(*f.ep)},
                 pc, std::uint64_t(B) * cfg.nv);
      r.mark("chunk_fwd_mma");  // the norm fused in
      return;
    }
    r.dispatch(*common.gate_prep, {v(in.a), v(in.b), v(a_log), v(dt_bias), v(*f.gates)}, pc, (BT * cfg.nv + 255) / 256);
    r.mark("gate_prep");
    if (cfg.variant == Variant::PerHead) {
      r.dispatch(*per_head.rec_fwd,
                 {v(y_of(f)), v(*f.qkn), v(*f.gates), v(in.z), v(norm), v(out), v(*f.o), v(*f.inv), v(*f.ck)}, pc,
                 std::uint64_t(B) * cfg.nv);
      r.mark("rec_fwd");
      return;
    }
    r.dispatch(*subgroup.rec_fwd2, {v(y_of(f)), v(*f.qkn), v(*f.gates), v(*f.o), v(*f.kv), v(*f.ck)}, pc,
               std::uint64_t(B) * cfg.nv * kColumnBlocks);
    r.mark("rec_fwd2");
    r.dispatch(*subgroup.norm_fwd2, {v(*f.o), v(in.z), v(norm), v(out), v(*f.inv)}, pc, BT * cfg.nv);
    r.mark("norm_fwd2");
  }

  // The chunked backward's passes (shaders/chunked/chunk.glsl); the last is marked by the caller.
  void record_chunked_recurrence(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g,
                                 const Push& pc) {
    const auto& f = st.fwd;
    const std::uint64_t heads = std::uint64_t(f.B) * cfg.nv, chunks = heads * pc.nseg;
    // The matrix units' forward left every chunk's W, T, P and log gates on the tape: no chunk_prep,
    // and chunk_dstate_mma makes P^T dO itself, and dO and dz (the norm's backward) before it.
    const bool matrix = chunked.chunk_dstate_mma != nullptr;
    const gpu::Buffer& tm = matrix ? *f.tm : *bwd.tm;
    const gpu::Buffer& lgc = matrix ? *f.lgc : *bwd.lgc;
    if (matrix) {
      r.dispatch(*chunked.chunk_dstate_mma,
                 {v(*f.qkn), v(lgc), v(*f.gates), v(*bwd.do_), v(*bwd.du), v(*bwd.dsc), v(*f.pm), v(*f.o), v(st.inputs.z),
                  v(norm), v(*f.inv), v(dout), v(g.dz), v(tm), v(*f.x), v(*f.kv), v(*bwd.pdots), v(*f.vscale),
                  v(*bwd.dscale), v(*f.eqk), v(*f.ep)},
                 pc, heads * kMatrixDstateBlocks);
      r.mark("chunk_dstate_mma");
      r.dispatch(*chunked.chunk_factors,
                 {v(*f.gates), v(lgc), v(tm), v(*f.gm), v(*bwd.pdots), v(*bwd.fac), v(*bwd.dqk), v(*f.vscale),
                  v(*bwd.dscale), v(*bwd.mdiag)},
                 pc, chunks);
      r.mark("chunk_factors");
    } else {
      r.dispatch(*chunked.chunk_prep,
                 {v(*f.qkn), v(*f.gates), v(a_log), v(*bwd.w), v(tm), v(*bwd.do_), v(*bwd.du), v(lgc)}, pc, chunks);
      r.mark("chunk_prep");
      r.dispatch(*chunked.chunk_dstate, {v(*f.qkn), v(lgc), v(*bwd.w), v(*bwd.do_), v(*bwd.du), v(*bwd.dsc)}, pc,
                 heads * kColumnBlocks);
      r.mark("chunk_dstate");
    }
    // On the matrix units one pass does chunk_values' and chunk_grads' work for a pair of chunks per
    // workgroup (its bindings: shaders/matrix/chunk_pair_bwd_mma.comp). On CUDA cores the two passes share
    // one binding list (shaders/chunked/chunk_grads.glsl).
    if (matrix) {
      r.dispatch(*chunked.chunk_pair_bwd_mma,
                 {v(*f.qkn), v(*f.gates), v(lgc), v(*bwd.fac), v(*f.kv), v(*bwd.do_), v(*bwd.du), v(*f.ck), v(*bwd.dsc),
                  v(*bwd.dqk), v(*f.vscale), v(*bwd.dscale), v(*f.eqk), v(*bwd.mdiag)},
                 pc, heads * state_groups(f.T));
      r.mark("chunk_pair_bwd_mma");
    } else {
      const std::vector<gpu::BufferView> views{v(*f.qkn),   v(*f.gates), v(lgc),      v(y_of(f)),    v(*f.kv),
                                               v(*bwd.do_), v(*bwd.du),  v(*bwd.w),   v(tm),         v(*f.ck),
                                               v(*bwd.dsc), v(*bwd.dqk), v(*bwd.dy),  v(*bwd.pairs), v(*bwd.sdot)};
      r.dispatch(*chunked.chunk_values, views, pc, chunks);
      r.mark("chunk_values");
      r.dispatch(*chunked.chunk_grads, views, pc, chunks);
      r.mark("chunk_grads");
    }
  }

  void record_backward(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g) {
    const auto& f = st.fwd;
    const int B = f.B, T = f.T;
    const Push pc = push(B, T, true);
    const std::uint64_t BT = std::uint64_t(B) * T;
    const auto& in = st.inputs;
    if (cfg.variant == Variant::PerHead) {
      r.dispatch(*per_head.rec_bwd,
                 {v(y_of(f)), v(*f.qkn), v(*f.gates), v(in.z), v(norm), v(*f.o), v(*f.inv), v(*f.ck), v(dout),
                  v(*bwd.scr), v(*bwd.kvs), v(*bwd.dqk), v(*bwd.dy), v(g.dz), v(g.da), v(g.db), v(a_log)},
                 pc, std::uint64_t(B) * cfg.nv);
      r.mark("rec_bwd");
      r.dispatch(*per_head.qk_bwd, {v(*f.qkn), v(*f.nq), v(*bwd.dqk), v(*bwd.dy)}, pc, BT * cfg.nk);
      r.mark("qk_bwd");
    } else {
      if (!chunked.chunk_dstate_mma) {  // the matrix units' chunk_dstate_mma does the norm's backward itself
        r.dispatch(*subgroup.norm_bwd2, {v(*f.o), v(in.z), v(norm), v(*f.inv), v(dout), v(g.dz), v(*bwd.do_)}, pc,
                   BT * cfg.nv);
        r.mark("norm_bwd2");
      }
      if (cfg.variant == Variant::Chunked) {
        record_chunked_recurrence(r, st, dout, g, pc);
      } else {
        r.dispatch(subgroup.backward_for(dev, pc.cs),
                   {v(y_of(f)), v(*f.qkn), v(*f.gates), v(*f.kv), v(*bwd.do_), v(*f.ck), v(*bwd.dqk), v(*bwd.dy)}, pc,
                   std::uint64_t(B) * cfg.nv * kColumnBlocks);
        r.mark("rec_bwd2");
      }
      // qk_bwd2: one subgroup per (b, t, key head), 128 / subgroup_size of them per workgroup
      const auto& qk_bwd = cfg.variant == Variant::Chunked ? *chunked.qk_bwd : *subgroup.qk_bwd2;
      const std::uint64_t rows_per_group = 128 / subgroup_size;
      r.dispatch(qk_bwd,
                 {v(y_of(f)), v(*f.nq), v(*bwd.dqk), v(*f.gates), v(a_log), v(*bwd.dy), v(g.da), v(g.db), v(*f.kv), v(*f.qkn)},
                 pc, (BT * cfg.nk + rows_per_group - 1) / rows_per_group);
      r.mark("qk_bwd2");
    }
    if (chunked.conv_bwd_yv)  // the matrix units' backward left Yv, not dv, for the v channels
      r.dispatch(*chunked.conv_bwd_yv, {v(in.qkv), v(conv), v(*bwd.dy), v(g.dqkv), v(*bwd.du), v(*f.gates)}, pc,
                 conv_groups(B, T, cfg.channels(), kConvBwdTokens));
    else
      r.dispatch(*common.conv_bwd, {v(in.qkv), v(conv), v(*bwd.dy), v(g.dqkv)}, pc, conv_groups(B, T, cfg.channels(), kConvBwdTokens));
    r.mark("conv_bwd");
  }

  // ---- Config::check_finite ----

  // The first NaN or Inf of tensor t, as "NAME element i (index [..]) is NaN", or "".
  static std::string first_nonfinite(const Tensor& t) {
    const std::vector<float> v = t.download();
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::isfinite(v[i])) continue;
      std::string idx;
      std::size_t rest = i;
      for (std::size_t k = t.shape().size(); k-- > 0;) {
        idx = std::to_string(rest % std::size_t(t.shape()[k])) + (idx.empty() ? "" : ", ") + idx;
        rest /= std::size_t(t.shape()[k]);
      }
      return t.name() + " element " + std::to_string(i) + " (index [" + idx + "]) is " + (std::isnan(v[i]) ? "NaN" : "Inf");
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

}  // namespace detail

// ---- Tape ------------------------------------------------------------------------------------------

Tape::Tape() = default;
Tape::~Tape() = default;
Tape::Tape(Tape&&) noexcept = default;
Tape& Tape::operator=(Tape&&) noexcept = default;
bool Tape::recorded() const { return state_ && state_->fwd.qkn; }
int Tape::batch() const { return state_ ? state_->fwd.B : 0; }
int Tape::tokens() const { return state_ ? state_->fwd.T : 0; }

std::vector<std::pair<std::string, std::size_t>> Tape::buffers() const {
  std::vector<std::pair<std::string, std::size_t>> out;
  if (!state_) return out;
  const auto& f = state_->fwd;
  for (const auto* b : f.slots())
    if (*b) out.emplace_back((*b)->name, (*b)->bytes);
  if (state_->owns_inputs)
    for (const Tensor* t : {&state_->inputs.qkv, &state_->inputs.z, &state_->inputs.a, &state_->inputs.b})
      if (!t->empty()) out.emplace_back(t->name(), std::size_t(t->numel()) * sizeof(float));
  return out;
}

std::size_t Tape::device_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, bytes] : buffers()) n += bytes;
  return n;
}

detail::TapeState& detail::LayerImpl::tape_state(Tape& t) {
  if (!t.state_) t.state_ = std::make_unique<TapeState>();
  return *t.state_;
}
const detail::TapeState* detail::LayerImpl::tape_state_ptr(const Tape& t) { return t.state_.get(); }

// ---- Layer -----------------------------------------------------------------------------------------

Layer::Layer(std::shared_ptr<Context> ctx, const Config& config, const Params& params) {
  if (!ctx) throw std::invalid_argument("Layer: no context");
  impl_ = std::make_unique<detail::LayerImpl>(std::move(ctx), config, params);
}
Layer::~Layer() = default;

const Config& Layer::config() const { return impl_->cfg; }
Variant Layer::variant() const { return impl_->cfg.variant; }
Context& Layer::context() const { return *impl_->ctx; }
void Layer::set_profiling(bool on) { impl_->profiling = on; }
const std::vector<KernelTime>& Layer::last_timings() const { return impl_->timings; }

std::size_t Layer::workspace_bytes() const {
  const auto& m = *impl_;
  std::size_t n = m.scratch_fwd.bytes() + m.bwd.bytes() + (m.y_scratch ? m.y_scratch->bytes : 0);
  for (const Tensor* t : {&m.conv, &m.a_log, &m.dt_bias, &m.norm, &m.host_in.qkv, &m.host_in.z, &m.host_in.a,
                          &m.host_in.b, &m.host_out, &m.host_dout, &m.host_grads.dqkv, &m.host_grads.dz,
                          &m.host_grads.da, &m.host_grads.db})
    n += std::size_t(t->numel()) * sizeof(float);
  return n;
}

void Layer::forward(const DeviceInputs& in, Tensor& out, Tape* tape) { impl_->forward(in, out, tape); }

void Layer::backward(const Tape& tape, const Tensor& dout, DeviceGrads& grads) { impl_->backward(tape, dout, grads); }

namespace {
/// Reuses `t` when it already has `shape`, else allocates.
void reuse(Tensor& t, const std::shared_ptr<Context>& ctx, std::vector<std::int64_t> shape, const char* name) {
  if (t.empty() || t.shape() != shape) t = Tensor(ctx, std::move(shape), name);
}
}  // namespace

std::vector<float> Layer::forward(int batch, int tokens, const HostInputs& in, Tape* tape) {
  auto& m = *impl_;
  if (batch < 1 || tokens < 1)
    throw std::invalid_argument("forward: batch = " + std::to_string(batch) + " and tokens = " + std::to_string(tokens) +
                                " must both be >= 1");
  const std::size_t BT = std::size_t(batch) * tokens;
  const std::string bt = std::to_string(batch) + ", " + std::to_string(tokens) + ", ";
  detail::expect_size("qkv", in.qkv.size(), BT * m.cfg.channels(), "[B, T, C] = [" + bt + std::to_string(m.cfg.channels()) + "]");
  detail::expect_size("z", in.z.size(), BT * m.cfg.value_dim(), "[B, T, nv*D] = [" + bt + std::to_string(m.cfg.value_dim()) + "]");
  detail::expect_size("a", in.a.size(), BT * m.cfg.nv, "[B, T, nv] = [" + bt + std::to_string(m.cfg.nv) + "]");
  detail::expect_size("b", in.b.size(), BT * m.cfg.nv, "[B, T, nv] = [" + bt + std::to_string(m.cfg.nv) + "]");
  // A tape of the host API owns device copies of the inputs (its backward reads them).
  DeviceInputs* dst = &m.host_in;
  if (tape) {
    auto& st = detail::LayerImpl::tape_state(*tape);
    if (!st.owns_inputs) st.inputs = DeviceInputs{};
    st.owns_inputs = true;
    dst = &st.inputs;
  }
  const std::int64_t B = batch, T = tokens;
  reuse(dst->qkv, m.ctx, {B, T, m.cfg.channels()}, "qkv");
  reuse(dst->z, m.ctx, {B, T, m.cfg.value_dim()}, "z");
  reuse(dst->a, m.ctx, {B, T, m.cfg.nv}, "a");
  reuse(dst->b, m.ctx, {B, T, m.cfg.nv}, "b");
  dst->qkv.upload(in.qkv);
  dst->z.upload(in.z);
  dst->a.upload(in.a);
  dst->b.upload(in.b);
  reuse(m.host_out, m.ctx, {B, T, m.cfg.value_dim()}, "out");
  if (tape) {
    auto& st = detail::LayerImpl::tape_state(*tape);
    const DeviceInputs owned = st.inputs;  // forward() stores the inputs into the tape again
    m.forward(owned, m.host_out, tape);
    st.owns_inputs = true;
  } else {
    m.forward(*dst, m.host_out, nullptr);
  }
  return m.host_out.download();
}

HostGrads Layer::backward(const Tape& tape, std::span<const float> dout) {
  auto& m = *impl_;
  const auto* st = detail::LayerImpl::tape_state_ptr(tape);
  m.check_tape(st);
  const std::int64_t B = st->fwd.B, T = st->fwd.T;
  detail::expect_size("dout", dout.size(), std::size_t(B * T) * m.cfg.value_dim(),
                      "[B, T, nv*D] = [" + std::to_string(B) + ", " + std::to_string(T) + ", " +
                          std::to_string(m.cfg.value_dim()) + "]");
  reuse(m.host_dout, m.ctx, {B, T, m.cfg.value_dim()}, "dout");
  m.host_dout.upload(dout);
  auto& g = m.host_grads;
  reuse(g.dqkv, m.ctx, {B, T, m.cfg.channels()}, "dqkv");
  reuse(g.dz, m.ctx, {B, T, m.cfg.value_dim()}, "dz");
  reuse(g.da, m.ctx, {B, T, m.cfg.nv}, "da");
  reuse(g.db, m.ctx, {B, T, m.cfg.nv}, "db");
  m.backward(tape, m.host_dout, g);
  return HostGrads{g.dqkv.download(), g.dz.download(), g.da.download(), g.db.download()};
}

}  // namespace gdn
