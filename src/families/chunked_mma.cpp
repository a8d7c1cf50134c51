// SPDX-License-Identifier: MIT
// The chunked family on the matrix units (shaders/matrix/, GL_NV_cooperative_matrix), chunks of 16:
// forward chunk_prep_fwd (every chunk's operators at once) and chunk_fwd_mma (the serial pass, the
// norm fused in); backward chunk_dstate_mma (the serial pass of the state gradients, the norm's
// backward fused in), chunk_factors (each chunk's 16 x 16 factors) and chunk_pair_bwd_mma (every
// pair of chunks' gradients), then qk_bwd2 and a conv backward that makes dv from Yv. Its numerics
// (fp16 pairs, power-of-two exponents): shaders/matrix/mma.glsl. The serial passes run as 1, 2 or 4
// workgroups per head (split(), chunk_mma.glsl's SPLIT); split, the forward's norm is a pass of its
// own (norm_fwd2), and chunk_dstate_mma's helper subgroups make the backward's row sums.
#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>

#include "families/family.hpp"

namespace gdn::detail {
namespace {

constexpr std::uint32_t kChunk = 16;
/// Words per (token, v-head) record of the pair pass: dq^ 128, dk^ 128, d(log g), dbeta.
constexpr std::uint32_t kRecordWords = 258;
/// 16 x 16 factors per chunk that chunk_factors makes for the pair pass (NCF in shaders/matrix/chunk_factors.glsl).
constexpr std::uint32_t kChunkFactors = 5;

class ChunkedMatrix final : public Family {
 public:
  explicit ChunkedMatrix(const FamilyArgs& a)
      : cfg_(a.cfg), p_(a.params), dev_(a.dev), common_(build_common(a.dev, std::uint32_t(a.cfg.conv_taps))) {
    const std::uint32_t taps = std::uint32_t(cfg_.conv_taps);
    pipe<bindings::chunk_prep_fwd>(false, 0, 1);
    pipe<bindings::chunk_fwd_mma>(false, 0, 1);
    pipe<bindings::chunk_dstate_mma>(false, 0, 1);
    pipe<bindings::chunk_factors>(false, 0, 1);
    pipe<bindings::chunk_pair_bwd_mma>(false, 0, 1);
    qk_bwd_ = make_pipeline<bindings::qk_bwd2_chunked>(a.dev, {32}, 32);
    make_pipeline<bindings::conv_bwd_yv>(a.dev, conv_spec(taps, 0));  // the float32 build (the device keeps it)
  }

  int interval(int) const override { return int(kChunk); }
  // (no driver that limits loops has the matrix units) the CUDA-core chunked family's bound
  int loop_iterations_per_token() const override { return 5; }
  // v: only the forward reads it (the backward reads X in its place), so no tape keeps it
  std::vector<BufferDecl> scratch_buffers(int B, int T) const override {
    return {{"v (conv output)", std::size_t(B) * T * cfg_.nv * kD}};
  }
  int chunks(int T) const { return (T + int(kChunk) - 1) / int(kChunk); }
  // Workgroups per (window, v-head) of the serial passes for B windows (chunk_mma.glsl's SPLIT): the
  // config's, else the most of 4 and 2 whose workgroups the device's multiprocessors hold at once
  // (one each: the serial passes' registers allow no more), else 1, and 1 where the passes run
  // beside other windows' (States::side_by_side; the buffers are sized for the split without them).
  std::uint32_t split(int B, bool side_by_side = false) const {
    if (cfg_.serial_split > 0) return std::uint32_t(cfg_.serial_split);
    if (side_by_side) return 1;
    const std::uint64_t heads = std::uint64_t(B) * cfg_.nv, mp = dev_.info().multiprocessors;
    return heads * 4 <= mp ? 4 : heads * 2 <= mp ? 2 : 1;
  }
  // Stored states at the edges of pairs of chunks: chunk_pair_bwd_mma takes a pair per workgroup and
  // makes the state between its chunks again.
  int pairs(int T) const { return (chunks(T) + 1) / 2; }

  enum Fwd { kQkn, kNq, kGates, kO, kInv, kCk, kU, kX, kGm, kTm, kPm, kLgc, kVscale, kEqk, kEp };
  std::vector<BufferDecl> forward_buffers(int B, int T, bool keep) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, nk = cfg_.nk, nch = chunks(T), ch = kChunk;
    const std::size_t ck = keep ? std::size_t(B) * nv * state_slots(pairs(T)) * kD * kD : 1;
    return {{"qk_hat", 2 * BT * nk * kD},
            {"qk_norms", 2 * BT * nk},
            {"gates", 3 * BT * nv},
            {"o (pre-norm)", BT * nv * kD},
            {"inv_rms", BT * nv},
            {"checkpoints", ck},  // the state at the start of pairs 1 ..
            {"u per step", keep ? BT * nv * kD : 1},
            // for the backward only: X = V - diag(gamma) K S0 and G = K K^T
            {"X per chunk", keep ? BT * nv * kD : 1},
            {"G per chunk", keep ? std::size_t(B) * nk * nch * ch * ch : 1},
            {"T per chunk", BT * nv * ch},
            {"P per chunk", BT * nv * ch},
            {"cumulative log gates", 2 * BT * nv},  // hi, lo (shaders/chunked/chunk.glsl)
            // the power-of-two exponents (shaders/matrix/mma.glsl): each head's of U, X and of the
            // states ([2][B, nv][split]: a slot per workgroup); per chunk of q^, k^ ([B, nk, chunks])
            // and of P ([B, nv, chunks])
            {"U and state scale exponents", 2 * std::size_t(B) * nv * split(B)},
            {"q, k scale exponents", std::size_t(B) * nk * nch},
            {"P scale exponents", std::size_t(B) * nv * nch}};
  }
  enum Bwd { kDo, kDqk, kYv, kDsc, kPdots, kFac, kDscale, kMdiag, kDy, kDnorm };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, n = std::size_t(B) * nv * chunks(T), s = split(B);
    return {{"do (grad of o)", BT * nv * kD},
            {"chunk records", BT * nv * kRecordWords},
            {"Yv = T^T dU per chunk", BT * nv * kD},
            {"end-state grads per chunk", std::size_t(B) * nv * state_slots(pairs(T)) * kD * kD},
            {"pair dots per chunk", n * s * 2 * 16 * 16},  // <dO_i, u_j>, <Yv_i, x_j>: each workgroup's share
            {"pair pass factors per chunk", n * kChunkFactors * 2 * 16 * 16 / 2},  // fp16 pairs
            {"dO, dS and Yv scale exponents", 3 * std::size_t(B) * nv * s},
            {"M's diagonal per chunk", n * 16},
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())},
            {"dnorm per chunk", n * kD}};
  }
  // chunk_dstate_mma leaves each chunk's share of dnorm (the norm's inputs are at hand there)
  DnormParts dnorm_parts(const BufferSet& w) const override {
    return {&w[kDnorm], std::uint64_t(w.B) * cfg_.nv * chunks(w.T)};
  }
  bool leaves_dnorm_parts() const override { return true; }

  NormTape norm_tape(const BufferSet& f) const override { return {f[kO], f[kInv], f[kGates]}; }
  const CommonKernels& common_kernels() const override { return common_; }

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                      const BufferSet& scratch, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, f.keep, s);
    const gpu::Buffer& y = scratch[0];
    record_conv_fwd(r, common_, cfg_, p_, in, y, f[kQkn], f[kNq], pc);
    // the gates are made by chunk_prep_fwd, which reads them first (no gate_prep pass)
    const bool states = s.flags & (kStateH0 | kStateCarry);
    const std::uint32_t sp = split(f.B, s.side_by_side);
    r.dispatch(pipe<bindings::chunk_prep_fwd>(false, bf16_bits({{in.a, kBf16A}, {in.b, kBf16B}}), 1),
               bindings::chunk_prep_fwd{.qkn = view(f[kQkn]), .gates = view(f[kGates]), .a_log = view(p_.a_log),
                                        .tm = view(f[kTm]), .lgc = view(f[kLgc]), .pm = view(f[kPm]), .a = view(in.a),
                                        .bw = view(in.b), .dt_bias = view(p_.dt_bias), .gm = view(f[kGm]),
                                        .eqk = view(f[kEqk]), .ep = view(f[kEp])},
               pc, std::uint64_t(f.B) * cfg_.nk * pc.nseg);
    r.mark("chunk_prep_fwd");  // gate_prep fused in
    const std::uint32_t bits = bf16_bits({{in.z, kBf16Z}, {out, kBf16Out}});
    with_split<bindings::chunk_fwd_mma, bindings::chunk_fwd_mma_split2, bindings::chunk_fwd_mma_split4>(
        sp, [&]<class Pass>(Pass) {
          r.dispatch(pipe<Pass>(states, bits, sp),
                     Pass{.qkn = view(f[kQkn]), .lgc = view(f[kLgc]), .tm = view(f[kTm]), .up = view(f[kU]),
                          .pm = view(f[kPm]), .o = view(f[kO]), .ck = view(f[kCk]), .z = view(in.z),
                          .norm = view(p_.norm), .out = view(out), .inv = view(f[kInv]), .gates = view(f[kGates]),
                          .y = view(y), .xp = view(f[kX]), .vscale = view(f[kVscale]), .eqk = view(f[kEqk]),
                          .ep = view(f[kEp]), .h0 = view_or(in.h0, in.qkv), .ht = view_or(s.ht, in.qkv)},
                     pc, std::uint64_t(f.B) * cfg_.nv * sp);
        });
    r.mark("chunk_fwd_mma");  // the norm fused in where not split
    if (sp > 1) {  // the norm from O (norm_fwd2: kNormRows rows a workgroup)
      r.dispatch(norm_fwd(),
                 bindings::norm_fwd2{.o = view(f[kO]), .z = view(in.z), .norm = view(p_.norm), .out = view(out),
                                     .inv = view(f[kInv])},
                 pc, norm_groups(std::uint64_t(f.B) * f.T * cfg_.nv));
      r.mark("norm_fwd2");
    }
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, true, s);
    const std::uint64_t heads = std::uint64_t(f.B) * cfg_.nv;
    // The forward left every chunk's T, P and log gates on the tape: no chunk_prep; chunk_dstate_mma
    // makes dO and dz (the norm's backward) itself.
    const bool states = s.flags & (kStateH0 | kStateCarry);
    const std::uint32_t sp = split(f.B, s.side_by_side);
    const std::uint32_t bits = bf16_bits({{in.z, kBf16Z}, {dout, kBf16Dout}, {g.dz, kBf16Dz}});
    with_split<bindings::chunk_dstate_mma, bindings::chunk_dstate_mma_split2, bindings::chunk_dstate_mma_split4>(
        sp, [&]<class Pass>(Pass) {
          r.dispatch(pipe<Pass>(states, bits, sp),
                     Pass{.qkn = view(f[kQkn]), .lgc = view(f[kLgc]), .gates = view(f[kGates]), .do_ = view(w[kDo]),
                          .yv = view(w[kYv]), .dsc = view(w[kDsc]), .pm = view(f[kPm]), .o = view(f[kO]),
                          .z = view(in.z), .norm = view(p_.norm), .inv = view(f[kInv]), .dout = view(dout),
                          .dz = view(g.dz), .tm = view(f[kTm]), .x = view(f[kX]), .u = view(f[kU]),
                          .pdots = view(w[kPdots]), .vscale = view(f[kVscale]), .dscale = view(w[kDscale]),
                          .eqk = view(f[kEqk]), .ep = view(f[kEp]), .dht = view_or(s.dht, in.qkv),
                          .dh0 = view_or(s.dh0, in.qkv), .dnorm_part = view(w[kDnorm])},
                     pc, heads * sp);
        });
    r.mark("chunk_dstate_mma");
    r.dispatch(pipe<bindings::chunk_factors>(false, 0, sp),
               bindings::chunk_factors{.gates = view(f[kGates]), .lgc = view(f[kLgc]), .tm = view(f[kTm]),
                                       .gm = view(f[kGm]), .pdots = view(w[kPdots]), .fac = view(w[kFac]),
                                       .rec = view(w[kDqk]), .vscale = view(f[kVscale]), .dscale = view(w[kDscale]),
                                       .mdiag = view(w[kMdiag])},
               pc, heads * pc.nseg);
    r.mark("chunk_factors");
    r.dispatch(pipe<bindings::chunk_pair_bwd_mma>(states, 0, sp),
               bindings::chunk_pair_bwd_mma{.qkn = view(f[kQkn]), .gates = view(f[kGates]), .lgc = view(f[kLgc]),
                                            .fac = view(w[kFac]), .u = view(f[kU]), .do_ = view(w[kDo]),
                                            .yv = view(w[kYv]), .ck = view(f[kCk]), .dsc = view(w[kDsc]),
                                            .rec = view(w[kDqk]), .vscale = view(f[kVscale]),
                                            .dscale = view(w[kDscale]), .eqk = view(f[kEqk]), .mdiag = view(w[kMdiag]),
                                            .h0 = view_or(in.h0, in.qkv), .dht = view_or(s.dht, in.qkv)},
               pc, heads * pairs(f.T));
    r.mark("chunk_pair_bwd_mma");
    // one subgroup per (b, t, key head), 4 per workgroup
    const std::uint64_t rows = std::uint64_t(f.B) * f.T * cfg_.nk;
    r.dispatch(*qk_bwd_,
               bindings::qk_bwd2_chunked{.y = {} /* not read in this build, nor kv */, .nq = view(f[kNq]), .dqk = view(w[kDqk]), .gates = view(f[kGates]),
                                         .a_log = view(p_.a_log), .dy = view(w[kDy]), .da = view(g.da),
                                         .db = view(g.db), .kv = {}, .qkn = view(f[kQkn])},
               pc, (rows + 3) / 4);
    r.mark("qk_bwd2");
    // dv = beta Yv, made as conv_bwd reads it (the pair pass left Yv, not dv, for the v channels)
    r.dispatch(*make_pipeline<bindings::conv_bwd_yv>(dev_, conv_spec(std::uint32_t(cfg_.conv_taps), pc.flags)),
               bindings::conv_bwd_yv{.qkv = view(in.qkv), .conv = view(p_.conv), .dy = view(w[kDy]),
                                     .dqkv = view(g.dqkv), .dconv_part = view(dconv_part),
                                     .conv_state = view_or(in.conv_state, in.qkv),
                                     .dconv_state = view(g.dconv_state), .dconv_out = view_or(s.dconv_out, in.qkv),
                                     .yv = view(w[kYv]), .gates = view(f[kGates])},
               pc, conv_groups(pc.nb, pc.t, std::uint64_t(cfg_.channels()), kConvBwdTokens));
    r.mark("conv_bwd");
  }

 private:
  const Config cfg_;
  const LayerParams p_;
  gpu::Device& dev_;
  CommonKernels common_;
  // The pipeline of a matrix-unit pass for the carried state (specialization constant 2: a build of
  // its own, so that the plain build spends no registers on it), bfloat16 streams (constant 6), the
  // precision (FAST, constant 7, shaders/matrix/mma.glsl) and the serial passes' workgroups per head
  // (constant 8; the serial passes have a build per split), built at its first use (the plain builds
  // with the family).
  template <class Bindings>
  const gpu::Pipeline& pipe(bool states, std::uint32_t bf16, std::uint32_t split) {
    auto& p = pipes_[{Bindings::kName, states, bf16, split}];
    if (!p) {
      const std::uint32_t fast = cfg_.precision == Precision::Fast ? 1u : 0u;
      // constants 0 .. 8: subgroup size, chunk, STATES, (3 .. 5 unused here), BF16, FAST, SPLIT
      std::vector<std::uint32_t> spec{32, kChunk, states ? 1u : 0u, 0, 0, 0, bf16, fast, split};
      p = make_pipeline<Bindings>(dev_, std::move(spec), 32);
    }
    return *p;
  }
  std::map<std::tuple<std::string_view, bool, std::uint32_t, std::uint32_t>, std::shared_ptr<gpu::Pipeline>> pipes_;
  // Calls f with a default gdn::bindings struct of the serial pass's build for `split` workgroups per
  // head (One, Two, Four: its builds, which differ in type, not in fields).
  template <class One, class Two, class Four, class F>
  static void with_split(std::uint32_t split, F&& f) {
    if (split == 4) f(Four{});
    else if (split == 2) f(Two{});
    else f(One{});
  }
  // the split forward's norm pass, built at its first use
  const gpu::Pipeline& norm_fwd() {
    if (!norm_fwd_) norm_fwd_ = make_pipeline<bindings::norm_fwd2>(dev_);
    return *norm_fwd_;
  }
  std::shared_ptr<gpu::Pipeline> qk_bwd_, norm_fwd_;
};

std::string matrix_why_not(const DeviceInfo& info, const Config& cfg, int cs) {
  if (!cfg.matrix_units) return "Config::matrix_units is off";
  if (auto w = workgroup_why_not(info); !w.empty()) return w;
  if (!info.matrix_f16_16x16x16)
    return std::ranges::count(info.not_enabled, "cooperativeMatrix")
               ? "the adopted device was created without VK_NV_cooperative_matrix's cooperativeMatrix and shaderFloat16 "
                 "(Context::requirements lists them)"
               : "the device has no 16x16x16 fp16 cooperative matrix (VK_NV_cooperative_matrix)";
  if (std::uint32_t(cs) != kChunk) return "they take chunks of 16 tokens, the checkpoint interval is " + std::to_string(cs);
  const bool sg32 = info.subgroup_size_control ? info.min_subgroup_size <= 32 && 32 <= info.max_subgroup_size
                                               : info.subgroup_size == 32;
  if (!sg32) return "they need subgroups of 32 invocations";
  if (auto s = shared_why_not(info, {shader<bindings::chunk_prep_fwd>()}, {}, ""); !s.empty()) return s;
  return shared_why_not(info,
                        {shader<bindings::chunk_fwd_mma>(), shader<bindings::chunk_dstate_mma>(),
                         shader<bindings::chunk_factors>(), shader<bindings::chunk_pair_bwd_mma>()},
                        {32, kChunk}, "");
}

}  // namespace

const FamilyEntry kChunkedMatrixFamily{
    .variant = Variant::Chunked,
    .matrix_units = true,
    .default_interval = kDefaultChunk,
    .why_not = matrix_why_not,
    .make = [](const FamilyArgs& a) -> std::unique_ptr<Family> { return std::make_unique<ChunkedMatrix>(a); },
};

}  // namespace gdn::detail
