// SPDX-License-Identifier: MIT
// The per-head family (shaders/per_head/): one workgroup per (window, v-head) carries the whole
// 128 x 128 state through the window, storing it every checkpoint interval; the backward replays each
// segment from its checkpoint. Runs wherever 256-invocation workgroups do.
#include "families/family.hpp"
#include "gdn/spirv.hpp"

namespace gdn::detail {
namespace {

class PerHead final : public Family {
 public:
  explicit PerHead(const FamilyArgs& a)
      : cfg_(a.cfg), p_(a.params), common_(build_common(a.dev, std::uint32_t(a.cfg.conv_taps))),
        rec_fwd_(make_pipeline(a.dev, "rec_fwd", spirv::rec_fwd)),
        rec_bwd_(make_pipeline(a.dev, "rec_bwd", spirv::rec_bwd)),
        qk_bwd_(make_pipeline(a.dev, "qk_bwd", spirv::qk_bwd)) {}

  // An interval longer than the window is the window: one segment, and scratch for T states only.
  int interval(int T) const override { return std::min(cfg_.checkpoint_interval, T); }

  enum Fwd { kY, kQkn, kNq, kGates, kO, kInv, kCk };
  std::vector<BufferDecl> forward_buffers(int B, int T, bool keep) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, nk = cfg_.nk;
    const int nseg = (T + interval(T) - 1) / interval(T);
    // the state at the start of segments 1 .. nseg-1 (segment 0 starts at zero)
    const std::size_t ck = keep ? std::size_t(B) * nv * state_slots(nseg) * kD * kD : 1;
    return {{"v (conv output)", BT * nv * kD}, {"qk_hat", 2 * BT * nk * kD}, {"qk_norms", 2 * BT * nk},
            {"gates", 3 * BT * nv},            {"o (pre-norm)", BT * nv * kD},  {"inv_rms", BT * nv},
            {"checkpoints", ck}};
  }
  enum Bwd { kScr, kKvs, kDqk, kDy };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, cs = interval(T);
    return {{"replay scratch", std::size_t(B) * nv * cs * kD * kD},  // [B, nv, cs, D*D] replayed states
            {"replay kv", std::size_t(B) * nv * cs * kD},            // [B, nv, cs, D]
            {"dqk per v-head", 2 * BT * nv * kD},                    // [2][B, T, nv, D] dq^, dk^
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())}};
  }

  NormTape norm_tape(const BufferSet& f) const override { return {f[kO], f[kInv], f[kGates]}; }
  const CommonKernels& common_kernels() const override { return common_; }

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f) override {
    const Push pc = push(cfg_, f.B, f.T, f.keep);
    record_conv_fwd(r, common_, cfg_, p_, in, f[kY], f[kQkn], f[kNq], pc);
    record_gate_prep(r, common_, cfg_, p_, in, f[kGates], pc);
    r.dispatch(*rec_fwd_,
               {view(f[kY]), view(f[kQkn]), view(f[kGates]), view(in.z), view(p_.norm), view(out), view(f[kO]),
                view(f[kInv]), view(f[kCk])},
               pc, std::uint64_t(f.B) * cfg_.nv);
    r.mark("rec_fwd");
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part) override {
    const Push pc = push(cfg_, f.B, f.T, true);
    r.dispatch(*rec_bwd_,
               {view(f[kY]), view(f[kQkn]), view(f[kGates]), view(in.z), view(p_.norm), view(f[kO]), view(f[kInv]),
                view(f[kCk]), view(dout), view(w[kScr]), view(w[kKvs]), view(w[kDqk]), view(w[kDy]), view(g.dz),
                view(g.da), view(g.db), view(p_.a_log)},
               pc, std::uint64_t(f.B) * cfg_.nv);
    r.mark("rec_bwd");
    r.dispatch(*qk_bwd_, {view(f[kQkn]), view(f[kNq]), view(w[kDqk]), view(w[kDy])}, pc,
               std::uint64_t(f.B) * f.T * cfg_.nk);
    r.mark("qk_bwd");
    record_conv_bwd(r, common_, cfg_, p_, in, w[kDy], g, dconv_part, pc);
  }

 private:
  const Config cfg_;
  const LayerParams p_;
  CommonKernels common_;
  std::shared_ptr<gpu::Pipeline> rec_fwd_, rec_bwd_, qk_bwd_;
};

}  // namespace

const FamilyEntry kPerHeadFamily{
    .variant = Variant::PerHead,
    .matrix_units = false,
    .default_interval = kDefaultInterval,
    .why_not = [](const DeviceInfo& info, const Config&, int) { return workgroup_why_not(info); },
    .make = [](const FamilyArgs& a) -> std::unique_ptr<Family> { return std::make_unique<PerHead>(a); },
};

}  // namespace gdn::detail
