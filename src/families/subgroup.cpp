// SPDX-License-Identifier: MIT
// The subgroup (column-split) family (shaders/subgroup/): the forward of column_split.hpp, and a
// backward that replays each checkpoint segment with its states in registers (rec_bwd2) and applies
// the l2 norms' backward per key head (qk_bwd2).
#include "families/column_split.hpp"

#include <map>


namespace gdn::detail {

// ---- the column-split forward (shared with the chunked family on CUDA cores) ----

ColumnSplitFamily::ColumnSplitFamily(const FamilyArgs& a)
    : dev_(a.dev), cfg_(a.cfg), p_(a.params), sg_(a.subgroup_size),
      common_(build_common(a.dev, std::uint32_t(a.cfg.conv_taps))),
      rec_fwd2_(make_pipeline<bindings::rec_fwd2>(a.dev, {sg_}, sg_)),
      norm_fwd2_(make_pipeline<bindings::norm_fwd2>(a.dev)),
      norm_bwd2_(make_pipeline<bindings::norm_bwd2>(a.dev)) {}

std::vector<BufferDecl> ColumnSplitFamily::forward_buffers(int B, int T, bool keep) const {
  const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, nk = cfg_.nk;
  const int nseg = (T + interval(T) - 1) / interval(T);
  // the state at the start of segments (chunks) 1 .. nseg-1 (segment 0 starts at zero)
  const std::size_t ck = keep ? std::size_t(B) * nv * state_slots(nseg) * kD * kD : 1;
  return {{"v (conv output)", BT * nv * kD}, {"qk_hat", 2 * BT * nk * kD}, {"qk_norms", 2 * BT * nk},
          {"gates", 3 * BT * nv},            {"o (pre-norm)", BT * nv * kD},  {"inv_rms", BT * nv},
          {"checkpoints", ck},               {"kv per step", keep ? BT * nv * kD : 1}};
}

void ColumnSplitFamily::record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                                       const BufferSet&, const States& s) {
  const Push pc = push(cfg_, f.B, f.T, f.keep, s);
  record_conv_fwd(r, common_, cfg_, p_, in, f[kY], f[kQkn], f[kNq], pc);
  record_gate_prep(r, common_, cfg_, p_, in, f[kGates], pc);
  r.dispatch(*rec_fwd2_,
             bindings::rec_fwd2{.y = view(f[kY]), .qkn = view(f[kQkn]), .gates = view(f[kGates]), .o = view(f[kO]),
                                .kv = view(f[kKv]), .ck = view(f[kCk]), .h0 = view_or(in.h0, in.qkv),
                                .ht = view_or(s.ht, in.qkv)},
             pc,
             std::uint64_t(f.B) * cfg_.nv * kColumnBlocks);
  r.mark("rec_fwd2");
  r.dispatch(*norm_fwd2_,
             bindings::norm_fwd2{.o = view(f[kO]), .z = view(in.z), .norm = view(p_.norm), .out = view(out),
                                 .inv = view(f[kInv])},
             pc, norm_groups(std::uint64_t(f.B) * f.T * cfg_.nv));
  r.mark("norm_fwd2");
}

void ColumnSplitFamily::record_norm_bwd(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f,
                                        const Tensor& dout, const DeviceGrads& g, const gpu::Buffer& do_,
                                        const gpu::Buffer& dnorm_part, const Push& pc) const {
  r.dispatch(*norm_bwd2_,
             bindings::norm_bwd2{.o = view(f[kO]), .z = view(in.z), .norm = view(p_.norm), .inv = view(f[kInv]),
                                 .dout = view(dout), .dz = view(g.dz), .do_ = view(do_),
                                 .dnorm_part = view(dnorm_part)},
             pc, dnorm_groups(f.B, f.T, int(cfg_.nv)));
  r.mark("norm_bwd2");
}

namespace {

/// Words per (token, v-head, column block) record of rec_bwd2's partials: dq^ 128, dk^ 128, dg.
constexpr std::uint32_t kPartialWords = 257;

// Which build of rec_bwd2 runs an interval. GPU builds fix the history's size at compile time (4, 8
// or 16 steps; a shorter interval runs in a larger build). CPU drivers, and intervals over 16, get
// the build with rolled segment loops and the size as a specialization constant: the same math,
// minutes less to compile on lavapipe.
struct BackwardBuild {
  std::uint32_t capacity;  // steps of history (16 and under: the build of that size; else rolled)
  bool rolled;
  // Calls f with a default gdn::bindings struct of the build (they differ in type, not in fields).
  template <class F>
  decltype(auto) with_bindings(F&& f) const {
    if (rolled) return f(bindings::rec_bwd2_rolled{});
    if (capacity == 4) return f(bindings::rec_bwd2_cs4{});
    if (capacity == 8) return f(bindings::rec_bwd2_cs8{});
    return f(bindings::rec_bwd2_cs16{});
  }
};
BackwardBuild backward_build(const DeviceInfo& info, std::uint32_t cs) {
  if (info.type == "cpu" || cs > 16) return {cs, true};
  return {cs <= 4 ? 4u : cs <= 8 ? 8u : 16u, false};
}

class Subgroup final : public ColumnSplitFamily {
 public:
  explicit Subgroup(const FamilyArgs& a)
      : ColumnSplitFamily(a), qk_bwd2_(make_pipeline<bindings::qk_bwd2>(a.dev, {sg_}, sg_)) {}

  // An interval longer than the window is the window: one segment.
  int interval(int T) const override { return std::min(cfg_.checkpoint_interval, T); }
  // llvmpipe: the forward's passes end after 21845 tokens of a window at interval 16 (3 a token);
  // the backward's after 16713 at interval 8 and 14171 at 16 (3.9, 4.6 a token)
  int loop_iterations_per_token() const override { return 7; }

  enum Bwd { kDo, kDqk, kDy, kDnorm };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv;
    return {{"do (grad of o)", BT * nv * kD},
            {"dqk partials", BT * nv * kColumnBlocks * kPartialWords},  // [B, T, nv][4][257]
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())},
            dnorm_part_decl(B, T, int(nv))};
  }
  DnormParts dnorm_parts(const BufferSet& w) const override {
    return {&w[kDnorm], dnorm_groups(w.B, w.T, int(cfg_.nv))};
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, true, s);
    record_norm_bwd(r, in, f, dout, g, w[kDo], w[kDnorm], pc);
    const gpu::Pipeline& rec_bwd2 = backward_for(pc.cs);
    backward_build(dev_.info(), pc.cs).with_bindings([&]<class B>(B) {
      r.dispatch(rec_bwd2,
                 B{.y = view(f[kY]), .qkn = view(f[kQkn]), .gates = view(f[kGates]), .kv = view(f[kKv]),
                   .do_ = view(w[kDo]), .ck = view(f[kCk]), .dqk = view(w[kDqk]), .dy = view(w[kDy]),
                   .h0 = view_or(in.h0, in.qkv), .dht = view_or(s.dht, in.qkv), .dh0 = view_or(s.dh0, in.qkv)},
                 pc, std::uint64_t(f.B) * cfg_.nv * kColumnBlocks);
    });
    r.mark("rec_bwd2");
    record_qk_bwd<bindings::qk_bwd2>(r, *qk_bwd2_, f, w[kDqk], w[kDy], g, pc);
    record_conv_bwd(r, common_, cfg_, p_, in, w[kDy], g, dconv_part, s.dconv_out, pc);
  }

 private:
  // rec_bwd2 holds a segment's states in registers: one pipeline per segment length, built on demand.
  const gpu::Pipeline& backward_for(std::uint32_t cs) {
    auto& p = rec_bwd2_[cs];
    if (!p) {
      const auto build = backward_build(dev_.info(), cs);
      p = build.with_bindings([&]<class B>(B) { return make_pipeline<B>(dev_, {sg_, build.capacity}, sg_); });
    }
    return *p;
  }

  std::shared_ptr<gpu::Pipeline> qk_bwd2_;
  std::map<std::uint32_t, std::shared_ptr<gpu::Pipeline>> rec_bwd2_;
};

}  // namespace

const FamilyEntry kSubgroupFamily{
    .variant = Variant::Subgroup,
    .matrix_units = false,
    .default_interval = kDefaultInterval,
    .why_not = [](const DeviceInfo& info, const Config&, int cs) -> std::string {
      if (auto w = workgroup_why_not(info); !w.empty()) return w;
      const auto sg = choose_subgroup_size(info);
      if (!sg.size) return sg.why_not;
      const auto build = backward_build(info, std::uint32_t(cs));
      const auto bytes = build.with_bindings(
          [&]<class B>(B) { return shared_bytes_of(B::kName, B::spirv(), {sg.size, build.capacity}); });
      if (bytes <= info.max_shared_memory) return "";
      return "its backward at a checkpoint interval of " + std::to_string(cs) + " needs " + std::to_string(bytes) +
             " bytes of shared memory and the device has " + std::to_string(info.max_shared_memory) +
             " (a smaller interval needs less)";
    },
    .make = [](const FamilyArgs& a) -> std::unique_ptr<Family> { return std::make_unique<Subgroup>(a); },
};

}  // namespace gdn::detail
