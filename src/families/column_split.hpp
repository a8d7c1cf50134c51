// SPDX-License-Identifier: MIT
// The column-split forward (shaders/subgroup/rec_fwd2.comp, shaders/common/norm_fwd2.comp) and the norm's backward
// (shaders/common/norm_bwd2.comp), which the subgroup family and the chunked family on CUDA cores both run: each
// (window, v-head) state's 128 columns are split over kColumnBlocks workgroups, 8 lanes a column.
// Defined in subgroup.cpp.
#pragma once

#include "families/family.hpp"

namespace gdn::detail {

/// Column blocks (workgroups) per (window, v-head) of the column-split kernels.
inline constexpr std::uint32_t kColumnBlocks = 4;

class ColumnSplitFamily : public Family {
 public:
  ColumnSplitFamily(const FamilyArgs& a);

  enum Fwd { kY, kQkn, kNq, kGates, kO, kInv, kCk, kKv };
  std::vector<BufferDecl> forward_buffers(int B, int T, bool keep) const override;
  void record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const BufferSet& f,
                      const BufferSet& scratch, const States& s) override;
  NormTape norm_tape(const BufferSet& f) const override { return {f[kO], f[kInv], f[kGates]}; }
  const CommonKernels& common_kernels() const override { return common_; }

 protected:
  /// The norm's backward: dz and dO (into do_) from dout, and dnorm's share of each group of
  /// kParamRows rows (into dnorm_part, [groups, D]: the layer runs no param_part).
  void record_norm_bwd(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const gpu::Buffer& do_, const gpu::Buffer& dnorm_part,
                       const Push& pc) const;
  /// The backward workspace's buffer for dnorm's shares: groups of kParamRows rows, D each.
  static BufferDecl dnorm_part_decl(int B, int T, int nv) {
    return {"dnorm per group of rows", dnorm_groups(B, T, nv) * kD};
  }
  static std::uint64_t dnorm_groups(int B, int T, int nv) {
    return param_groups(std::uint64_t(B) * T * nv);
  }
  bool leaves_dnorm_parts() const override { return true; }

  /// qk_bwd2 (either build: QkBwd is its gdn::bindings struct): the records' dq^, dk^ through the
  /// l2 norms into dy, da and db.
  template <class QkBwd>
  void record_qk_bwd(gpu::Recorder& r, const gpu::Pipeline& qk_bwd, const BufferSet& f, const gpu::Buffer& dqk,
                     const gpu::Buffer& dy, const DeviceGrads& g, const Push& pc) const {
    // one subgroup per (b, t, key head), 128 / subgroup_size of them per workgroup
    const std::uint64_t rows_per_group = 128 / sg_;
    r.dispatch(qk_bwd,
               QkBwd{.y = view(f[kY]), .nq = view(f[kNq]), .dqk = view(dqk), .gates = view(f[kGates]),
                     .a_log = view(p_.a_log), .dy = view(dy), .da = view(g.da), .db = view(g.db), .kv = view(f[kKv]),
                     .qkn = view(f[kQkn])},
               pc, (std::uint64_t(f.B) * f.T * cfg_.nk + rows_per_group - 1) / rows_per_group);
    r.mark("qk_bwd2");
  }

  gpu::Device& dev_;
  const Config cfg_;
  const LayerParams p_;
  const std::uint32_t sg_;  // subgroup size
  CommonKernels common_;
  std::shared_ptr<gpu::Pipeline> rec_fwd2_, norm_fwd2_, norm_bwd2_;
};

}  // namespace gdn::detail
