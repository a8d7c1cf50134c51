// SPDX-License-Identifier: MIT
// The subgroup (column-split) family (shaders/subgroup/): the forward of column_split.hpp, and a
// backward that replays each checkpoint segment with its states in registers (rec_bwd2) and applies
// the l2 norms' backward per key head (qk_bwd2).
#include "families/column_split.hpp"

#include <map>

#include "gdn/spirv.hpp"

namespace gdn::detail {

// ---- the column-split forward (shared with the chunked family on CUDA cores) ----

ColumnSplitFamily::ColumnSplitFamily(const FamilyArgs& a)
    : dev_(a.dev), cfg_(a.cfg), p_(a.params), sg_(a.subgroup_size),
      common_(build_common(a.dev, std::uint32_t(a.cfg.conv_taps))),
      rec_fwd2_(make_pipeline(a.dev, "rec_fwd2", spirv::rec_fwd2, {sg_}, sg_)),
      norm_fwd2_(make_pipeline(a.dev, "norm_fwd2", spirv::norm_fwd2)),
      norm_bwd2_(make_pipeline(a.dev, "norm_bwd2", spirv::norm_bwd2)) {}

std::vector<BufferDecl> ColumnSplitFamily::forward_buffers(int B, int T, bool keep) const {
  const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, nk = cfg_.nk;
  const int nseg = (T + interval(T) - 1) / interval(T);
  // the state at the start of segments (chunks) 1 .. nseg-1 (segment 0 starts at zero)
  const std::size_t ck = keep ? std::size_t(B) * nv * state_slots(nseg) * kD * kD : 1;
  return {{"v (conv output)", BT * nv * kD}, {"qk_hat", 2 * BT * nk * kD}, {"qk_norms", 2 * BT * nk},
          {"gates", 3 * BT * nv},            {"o (pre-norm)", BT * nv * kD},  {"inv_rms", BT * nv},
          {"checkpoints", ck},               {"kv per step", keep ? BT * nv * kD : 1}};
}

void ColumnSplitFamily::record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f) {
  const Push pc = push(cfg_, f.B, f.T, f.keep);
  record_conv_fwd(r, common_, cfg_, p_, in, f[kY], f[kQkn], f[kNq], pc);
  record_gate_prep(r, common_, cfg_, p_, in, f[kGates], pc);
  r.dispatch(*rec_fwd2_, {view(f[kY]), view(f[kQkn]), view(f[kGates]), view(f[kO]), view(f[kKv]), view(f[kCk])}, pc,
             std::uint64_t(f.B) * cfg_.nv * kColumnBlocks);
  r.mark("rec_fwd2");
  r.dispatch(*norm_fwd2_, {view(f[kO]), view(in.z), view(p_.norm), view(out), view(f[kInv])}, pc,
             std::uint64_t(f.B) * f.T * cfg_.nv);
  r.mark("norm_fwd2");
}

void ColumnSplitFamily::record_norm_bwd(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f,
                                        const Tensor& dout, const DeviceGrads& g, const gpu::Buffer& do_,
                                        const Push& pc) const {
  r.dispatch(*norm_bwd2_, {view(f[kO]), view(in.z), view(p_.norm), view(f[kInv]), view(dout), view(g.dz), view(do_)},
             pc, std::uint64_t(f.B) * f.T * cfg_.nv);
  r.mark("norm_bwd2");
}

void ColumnSplitFamily::record_qk_bwd(gpu::Recorder& r, const gpu::Pipeline& qk_bwd, const BufferSet& f,
                                      const gpu::Buffer& dqk, const gpu::Buffer& dy, const DeviceGrads& g,
                                      const Push& pc) const {
  // one subgroup per (b, t, key head), 128 / subgroup_size of them per workgroup
  const std::uint64_t rows_per_group = 128 / sg_;
  r.dispatch(qk_bwd,
             {view(f[kY]), view(f[kNq]), view(dqk), view(f[kGates]), view(p_.a_log), view(dy), view(g.da), view(g.db),
              view(f[kKv]), view(f[kQkn])},
             pc, (std::uint64_t(f.B) * f.T * cfg_.nk + rows_per_group - 1) / rows_per_group);
  r.mark("qk_bwd2");
}

namespace {

/// Words per (token, v-head, column block) record of rec_bwd2's partials: dq^ 128, dk^ 128, dg.
constexpr std::uint32_t kPartialWords = 257;

// Which build of rec_bwd2 runs an interval. GPU builds fix the history's size at compile time (4, 8
// or 16 steps; a shorter interval runs in a larger build). CPU drivers, and intervals over 16, get
// the build with rolled segment loops and the size as a specialization constant: the same math,
// minutes less to compile on lavapipe.
struct BackwardBuild {
  std::span<const std::uint32_t> code;
  std::uint32_t capacity;  // steps of history
};
BackwardBuild backward_build(const DeviceInfo& info, std::uint32_t cs) {
  if (info.type == "cpu" || cs > 16) return {spirv::rec_bwd2_rolled, cs};
  if (cs <= 4) return {spirv::rec_bwd2_cs4, 4};
  if (cs <= 8) return {spirv::rec_bwd2_cs8, 8};
  return {spirv::rec_bwd2_cs16, 16};
}

class Subgroup final : public ColumnSplitFamily {
 public:
  explicit Subgroup(const FamilyArgs& a)
      : ColumnSplitFamily(a), qk_bwd2_(make_pipeline(a.dev, "qk_bwd2", spirv::qk_bwd2, {sg_}, sg_)) {}

  // An interval longer than the window is the window: one segment.
  int interval(int T) const override { return std::min(cfg_.checkpoint_interval, T); }

  enum Bwd { kDo, kDqk, kDy };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv;
    return {{"do (grad of o)", BT * nv * kD},
            {"dqk partials", BT * nv * kColumnBlocks * kPartialWords},  // [B, T, nv][4][257]
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())}};
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part) override {
    const Push pc = push(cfg_, f.B, f.T, true);
    record_norm_bwd(r, in, f, dout, g, w[kDo], pc);
    r.dispatch(backward_for(pc.cs),
               {view(f[kY]), view(f[kQkn]), view(f[kGates]), view(f[kKv]), view(w[kDo]), view(f[kCk]), view(w[kDqk]),
                view(w[kDy])},
               pc, std::uint64_t(f.B) * cfg_.nv * kColumnBlocks);
    r.mark("rec_bwd2");
    record_qk_bwd(r, *qk_bwd2_, f, w[kDqk], w[kDy], g, pc);
    record_conv_bwd(r, common_, cfg_, p_, in, w[kDy], g, dconv_part, pc);
  }

 private:
  // rec_bwd2 holds a segment's states in registers: one pipeline per segment length, built on demand.
  const gpu::Pipeline& backward_for(std::uint32_t cs) {
    auto& p = rec_bwd2_[cs];
    if (!p) {
      const auto build = backward_build(dev_.info(), cs);
      p = make_pipeline(dev_, ("rec_bwd2 (interval " + std::to_string(cs) + ")").c_str(), build.code,
                        {sg_, build.capacity}, sg_);
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
      const auto bytes = shared_bytes_of("rec_bwd2", build.code, {sg.size, build.capacity});
      if (bytes <= info.max_shared_memory) return "";
      return "its backward at a checkpoint interval of " + std::to_string(cs) + " needs " + std::to_string(bytes) +
             " bytes of shared memory and the device has " + std::to_string(info.max_shared_memory) +
             " (a smaller interval needs less)";
    },
    .make = [](const FamilyArgs& a) -> std::unique_ptr<Family> { return std::make_unique<Subgroup>(a); },
};

}  // namespace gdn::detail
