// SPDX-License-Identifier: MIT
// The order of each kernel family's passes, and the buffers each pass binds (in its shader's binding
// order): what one forward and one backward record.
#include "layer_impl.hpp"

namespace gdn::detail {

void LayerImpl::record_forward(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out, const ForwardState& f, int B, int T) {
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
void LayerImpl::record_chunked_recurrence(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g,
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

void LayerImpl::record_backward(gpu::Recorder& r, const TapeState& st, const Tensor& dout, const DeviceGrads& g) {
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

}  // namespace gdn::detail
