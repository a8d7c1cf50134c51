// SPDX-License-Identifier: MIT
// The per-head family (shaders/per_head/): one workgroup per (window, v-head) carries the whole
// 128 x 128 state through the window, storing it every checkpoint interval; the backward replays each
// segment from its checkpoint. Runs wherever 256-invocation workgroups do.
#include "families/family.hpp"

namespace gdn::detail {
namespace {

class PerHead final : public Family {
 public:
  explicit PerHead(const FamilyArgs& a)
      : cfg_(a.cfg), p_(a.params), common_(build_common(a.dev, std::uint32_t(a.cfg.conv_taps))),
        rec_fwd_(make_pipeline<bindings::rec_fwd>(a.dev)),
        rec_bwd_(make_pipeline<bindings::rec_bwd>(a.dev)),
        qk_bwd_(make_pipeline<bindings::qk_bwd>(a.dev)) {}

  // An interval longer than the window is the window: one segment, and scratch for T states only.
  int interval(int T) const override { return std::min(cfg_.checkpoint_interval, T); }
  // llvmpipe: the forward's rec_fwd ends after 7282 tokens of a window (9 a token), the backward's
  // rec_bwd after 2300 to 2419 (27 to 28.5 a token) at intervals 4 to 64
  int loop_iterations_per_token() const override { return 40; }

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

  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                      const BufferSet&, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, f.keep, s);
    record_conv_fwd(r, common_, cfg_, p_, in, f[kY], f[kQkn], f[kNq], pc);
    record_gate_prep(r, common_, cfg_, p_, in, f[kGates], pc);
    r.dispatch(*rec_fwd_,
               bindings::rec_fwd{.y = view(f[kY]), .qkn = view(f[kQkn]), .gates = view(f[kGates]), .z = view(in.z),
                                 .norm = view(p_.norm), .out = view(out), .o = view(f[kO]), .inv = view(f[kInv]),
                                 .ck = view(f[kCk]), .h0 = view_or(in.h0, in.qkv), .ht = view_or(s.ht, in.qkv)},
               pc, std::uint64_t(f.B) * cfg_.nv);
    r.mark("rec_fwd");
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, true, s);
    r.dispatch(*rec_bwd_,
               bindings::rec_bwd{.y = view(f[kY]), .qkn = view(f[kQkn]), .gates = view(f[kGates]), .z = view(in.z),
                                 .norm = view(p_.norm), .o = view(f[kO]), .inv = view(f[kInv]), .ck = view(f[kCk]),
                                 .dout = view(dout), .scr = view(w[kScr]), .kvs = view(w[kKvs]), .dqk = view(w[kDqk]),
                                 .dy = view(w[kDy]), .dz = view(g.dz), .da = view(g.da), .db = view(g.db),
                                 .a_log = view(p_.a_log), .h0 = view_or(in.h0, in.qkv),
                                 .dht = view_or(s.dht, in.qkv), .dh0 = view_or(s.dh0, in.qkv)},
               pc, std::uint64_t(f.B) * cfg_.nv);
    r.mark("rec_bwd");
    r.dispatch(*qk_bwd_,
               bindings::qk_bwd{.qkn = view(f[kQkn]), .nq = view(f[kNq]), .dqk = view(w[kDqk]), .dy = view(w[kDy])}, pc,
               std::uint64_t(f.B) * f.T * cfg_.nk);
    r.mark("qk_bwd");
    record_conv_bwd(r, common_, cfg_, p_, in, w[kDy], g, dconv_part, s.dconv_out, pc);
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
