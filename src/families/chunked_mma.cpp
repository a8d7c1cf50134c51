// SPDX-License-Identifier: MIT
// The chunked family on the matrix units (shaders/matrix/, GL_NV_cooperative_matrix), chunks of 16:
// forward chunk_prep_fwd (every chunk's operators at once) and chunk_fwd_mma (the serial pass, the
// norm fused in); backward chunk_dstate_mma (the serial pass of the state gradients, the norm's
// backward fused in), chunk_factors (each chunk's 16 x 16 factors) and chunk_pair_bwd_mma (every
// pair of chunks' gradients), then qk_bwd2 and a conv backward that makes dv from Yv. Its numerics
// (fp16 pairs, power-of-two exponents): shaders/matrix/mma.glsl.
#include "families/family.hpp"
#include "gdn/spirv.hpp"

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
    const std::uint32_t ch = kChunk, taps = std::uint32_t(cfg_.conv_taps);
    chunk_prep_fwd_ = make_pipeline(a.dev, "chunk_prep_fwd", spirv::chunk_prep_fwd, {}, 32);
    chunk_fwd_mma_ = make_pipeline(a.dev, "chunk_fwd_mma", spirv::chunk_fwd_mma, {32, ch}, 32);
    chunk_dstate_mma_ = make_pipeline(a.dev, "chunk_dstate_mma", spirv::chunk_dstate_mma, {32, ch}, 32);
    chunk_factors_ = make_pipeline(a.dev, "chunk_factors", spirv::chunk_factors, {32, ch}, 32);
    chunk_pair_bwd_mma_ = make_pipeline(a.dev, "chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma, {32, ch}, 32);
    qk_bwd_ = make_pipeline(a.dev, "qk_bwd2 (chunked)", spirv::qk_bwd2_chunked, {32}, 32);
    conv_bwd_yv_ = make_pipeline(a.dev, "conv_bwd (dv from Yv)", spirv::conv_bwd_yv, {taps});
  }

  int interval(int) const override { return int(kChunk); }
  std::size_t scratch_bytes() const override { return y_ ? y_->bytes : 0; }
  int chunks(int T) const { return (T + int(kChunk) - 1) / int(kChunk); }
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
            // states ([2][B, nv]); per chunk of q^, k^ ([B, nk, chunks]) and of P ([B, nv, chunks])
            {"U and state scale exponents", 2 * std::size_t(B) * nv},
            {"q, k scale exponents", std::size_t(B) * nk * nch},
            {"P scale exponents", std::size_t(B) * nv * nch}};
  }
  enum Bwd { kDo, kDqk, kYv, kDsc, kPdots, kFac, kDscale, kMdiag, kDy };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, n = std::size_t(B) * nv * chunks(T);
    return {{"do (grad of o)", BT * nv * kD},
            {"chunk records", BT * nv * kRecordWords},
            {"Yv = T^T dU per chunk", BT * nv * kD},
            {"end-state grads per chunk", std::size_t(B) * nv * state_slots(pairs(T)) * kD * kD},
            {"pair dots per chunk", n * 2 * 16 * 16},                      // <dO_i, u_j>, <Yv_i, x_j>
            {"pair pass factors per chunk", n * kChunkFactors * 2 * 16 * 16 / 2},  // fp16 pairs
            {"dO, dS and Yv scale exponents", 3 * std::size_t(B) * nv},
            {"M's diagonal per chunk", n * 16},
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())}};
  }

  NormTape norm_tape(const BufferSet& f) const override { return {f[kO], f[kInv], f[kGates]}; }
  const CommonKernels& common_kernels() const override { return common_; }

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f) override {
    const Push pc = push(cfg_, f.B, f.T, f.keep);
    // v: only the forward reads it (the backward reads X in its place), so no tape keeps it
    const std::size_t v_bytes = std::size_t(f.B) * f.T * cfg_.nv * kD * sizeof(float);
    if (!y_ || y_->bytes < v_bytes) y_ = dev_.create_buffer("v (conv output)", v_bytes);
    record_conv_fwd(r, common_, cfg_, p_, in, *y_, f[kQkn], f[kNq], pc);
    // the gates are made by chunk_prep_fwd, which reads them first (no gate_prep pass)
    r.dispatch(*chunk_prep_fwd_,
               {view(f[kQkn]), view(f[kGates]), view(p_.a_log), view(f[kTm]), view(f[kLgc]), view(f[kPm]), view(in.a),
                view(in.b), view(p_.dt_bias), view(f[kGm]), view(f[kEqk]), view(f[kEp])},
               pc, std::uint64_t(f.B) * cfg_.nk * pc.nseg);
    r.mark("chunk_prep_fwd");  // gate_prep fused in
    r.dispatch(*chunk_fwd_mma_,
               {view(f[kQkn]), view(f[kLgc]), view(f[kTm]), view(f[kU]), view(f[kPm]), view(f[kO]), view(f[kCk]),
                view(in.z), view(p_.norm), view(out), view(f[kInv]), view(f[kGates]), view(*y_), view(f[kX]),
                view(f[kVscale]), view(f[kEqk]), view(f[kEp])},
               pc, std::uint64_t(f.B) * cfg_.nv);
    r.mark("chunk_fwd_mma");  // the norm fused in
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part) override {
    const Push pc = push(cfg_, f.B, f.T, true);
    const std::uint64_t heads = std::uint64_t(f.B) * cfg_.nv;
    // The forward left every chunk's T, P and log gates on the tape: no chunk_prep; chunk_dstate_mma
    // makes dO and dz (the norm's backward) itself.
    r.dispatch(*chunk_dstate_mma_,
               {view(f[kQkn]), view(f[kLgc]), view(f[kGates]), view(w[kDo]), view(w[kYv]), view(w[kDsc]), view(f[kPm]),
                view(f[kO]), view(in.z), view(p_.norm), view(f[kInv]), view(dout), view(g.dz), view(f[kTm]),
                view(f[kX]), view(f[kU]), view(w[kPdots]), view(f[kVscale]), view(w[kDscale]), view(f[kEqk]),
                view(f[kEp])},
               pc, heads);
    r.mark("chunk_dstate_mma");
    r.dispatch(*chunk_factors_,
               {view(f[kGates]), view(f[kLgc]), view(f[kTm]), view(f[kGm]), view(w[kPdots]), view(w[kFac]),
                view(w[kDqk]), view(f[kVscale]), view(w[kDscale]), view(w[kMdiag])},
               pc, heads * pc.nseg);
    r.mark("chunk_factors");
    r.dispatch(*chunk_pair_bwd_mma_,
               {view(f[kQkn]), view(f[kGates]), view(f[kLgc]), view(w[kFac]), view(f[kU]), view(w[kDo]), view(w[kYv]),
                view(f[kCk]), view(w[kDsc]), view(w[kDqk]), view(f[kVscale]), view(w[kDscale]), view(f[kEqk]),
                view(w[kMdiag])},
               pc, heads * pairs(f.T));
    r.mark("chunk_pair_bwd_mma");
    // one subgroup per (b, t, key head), 4 per workgroup (binding 0, v, is not read in this build)
    const std::uint64_t rows = std::uint64_t(f.B) * f.T * cfg_.nk;
    r.dispatch(*qk_bwd_,
               {view(f[kQkn]), view(f[kNq]), view(w[kDqk]), view(f[kGates]), view(p_.a_log), view(w[kDy]), view(g.da),
                view(g.db), view(f[kU]), view(f[kQkn])},
               pc, (rows + 3) / 4);
    r.mark("qk_bwd2");
    // dv = beta Yv, made as conv_bwd reads it (the pair pass left Yv, not dv, for the v channels)
    r.dispatch(*conv_bwd_yv_,
               {view(in.qkv), view(p_.conv), view(w[kDy]), view(g.dqkv), view(dconv_part), view(w[kYv]), view(f[kGates])},
               pc, conv_groups(pc.nb, pc.t, std::uint64_t(cfg_.channels()), kConvBwdTokens));
    r.mark("conv_bwd");
  }

 private:
  const Config cfg_;
  const LayerParams p_;
  gpu::Device& dev_;
  CommonKernels common_;
  std::shared_ptr<gpu::Pipeline> chunk_prep_fwd_, chunk_fwd_mma_, chunk_dstate_mma_, chunk_factors_,
      chunk_pair_bwd_mma_, qk_bwd_, conv_bwd_yv_;
  std::unique_ptr<gpu::Buffer> y_;  // the conv output v of the last forward (grows to the largest shape)
};

std::string matrix_why_not(const DeviceInfo& info, const Config& cfg, int cs) {
  if (!cfg.matrix_units) return "Config::matrix_units is off";
  if (auto w = workgroup_why_not(info); !w.empty()) return w;
  if (!info.matrix_f16_16x16x16) return "the device has no 16x16x16 fp16 cooperative matrix (VK_NV_cooperative_matrix)";
  if (std::uint32_t(cs) != kChunk) return "they take chunks of 16 tokens, the checkpoint interval is " + std::to_string(cs);
  const bool sg32 = info.subgroup_size_control ? info.min_subgroup_size <= 32 && 32 <= info.max_subgroup_size
                                               : info.subgroup_size == 32;
  if (!sg32) return "they need subgroups of 32 invocations";
  if (auto s = shared_why_not(info, {{"chunk_prep_fwd", spirv::chunk_prep_fwd}}, {}, ""); !s.empty()) return s;
  return shared_why_not(info,
                        {{"chunk_fwd_mma", spirv::chunk_fwd_mma}, {"chunk_dstate_mma", spirv::chunk_dstate_mma},
                         {"chunk_factors", spirv::chunk_factors}, {"chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma}},
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
