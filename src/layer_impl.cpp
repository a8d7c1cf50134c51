// SPDX-License-Identifier: MIT
// The layer's own passes beside a family's (layer_impl.hpp): the conv state out, the parameters'
// gradients from the family's tape, and the checks of packed sequences' offsets.
#include "layer_impl.hpp"

namespace gdn::detail {

int LayerImpl::check_seqlens(const std::vector<std::int64_t>& cu, int B, int T) {
  const std::string n = std::to_string(cu.size());
  if (B != 1)
    throw std::invalid_argument("cu_seqlens: packed sequences take qkv as [1, total, C]; qkv has B = " + std::to_string(B));
  if (cu.size() < 2) throw std::invalid_argument("cu_seqlens has " + n + " offsets, expected N+1 >= 2 (0, then each sequence's end)");
  if (cu.front() != 0)
    throw std::invalid_argument("cu_seqlens[0] = " + std::to_string(cu.front()) + ", expected 0");
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] <= cu[i - 1])
      throw std::invalid_argument("cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(cu[i]) + " is not above cu_seqlens[" +
                                  std::to_string(i - 1) + "] = " + std::to_string(cu[i - 1]) +
                                  " (offsets increase; empty sequences are not taken)");
  if (cu.back() != T)
    throw std::invalid_argument("cu_seqlens[" + std::to_string(cu.size() - 1) + "] = " + std::to_string(cu.back()) +
                                ", expected the total tokens T = " + std::to_string(T) + " of qkv [1, T, C]");
  if (cu.size() - 1 > std::size_t(std::numeric_limits<int>::max())) throw std::invalid_argument("cu_seqlens: too many sequences");
  return int(cu.size() - 1);
}

void LayerImpl::record_conv_state_out(gpu::Recorder& r, const DeviceInputs& in, const Tensor& out_state, int B, int T) {
  Push pc = family->push(cfg, B, T, false, States{});
  if (!in.conv_state.empty()) pc.flags |= kStateConv;
  pc.flags |= bf16_bits({{in.qkv, kBf16Qkv}});
  const std::uint64_t n = std::uint64_t(B) * (cfg.conv_taps - 1) * std::uint64_t(cfg.channels());
  r.dispatch(*family->common_kernels().conv_state_out,
             bindings::conv_state_out{.qkv = view(in.qkv), .conv_state = view_or(in.conv_state, in.qkv),
                                      .state_out = view(out_state)},
             pc, (n + 255) / 256);
}

void LayerImpl::record_forward_part(gpu::Recorder& r, Work& w, const DeviceInputs& in, const Tensor& out,
                                    const BufferSet& f, const States& s, const Tensor* conv_state_out) {
  States sb = s;
  sb.flags |= bf16_bits({{in.qkv, kBf16Qkv}, {in.z, kBf16Z}, {in.a, kBf16A}, {in.b, kBf16B}, {out, kBf16Out}});
  family->record_forward(r, in, out, f, w.family_scratch, sb);
  if (conv_state_out) {
    record_conv_state_out(r, in, *conv_state_out, f.B, f.T);
    r.mark("conv_state_out");
  }
}

void LayerImpl::record_backward_part(gpu::Recorder& r, Work& w, const TapeState& st, const Tensor& dout,
                                     const DeviceGrads& g, const States& s, bool accumulate) {
  const DeviceInputs& in = st.inputs;
  DeviceGrads g32 = g;  // da and db through float32 stand-ins: param_sum reads da as float32
  g32.da = f32_of(g.da, w.da32);
  g32.db = f32_of(g.db, w.db32);
  States sb = s;
  sb.flags |= bf16_bits({{in.qkv, kBf16Qkv}, {in.z, kBf16Z}, {dout, kBf16Dout}, {g.dqkv, kBf16Dqkv}, {g.dz, kBf16Dz}});
  family->record_backward(r, in, st.fwd, dout, g32, w.bwd, w.param_work[0], sb);
  if (cfg.param_grads) record_param_grads(r, w, st, in.z, dout, g32, accumulate);
  record_cast(r, g32.da, g.da, "da");
  record_cast(r, g32.db, g.db, "db");
}

void LayerImpl::record_param_grads(gpu::Recorder& r, const Work& w, const TapeState& st, const Tensor& z,
                                   const Tensor& dout, const DeviceGrads& g, bool accumulate) {
  const auto& k = family->common_kernels();
  const auto t = family->norm_tape(st.fwd);
  const BufferSet& param_work = w.param_work;
  Push pc = family->push(cfg, st.fwd.B, st.fwd.T, true, States{});
  if (accumulate) pc.flags |= kParamAccumulate;
  pc.flags |= bf16_bits({{z, kBf16Z}, {dout, kBf16Dout}});
  // dnorm's groups of rows: the family's backward's, else param_part's
  Family::DnormParts dn = family->dnorm_parts(w.bwd);
  if (!dn.buffer) {
    const std::uint64_t rows = std::uint64_t(st.fwd.B) * st.fwd.T * cfg.nv;
    dn = {&param_work[1], param_groups(rows)};
    r.dispatch(*k.param_part,
               bindings::param_part{.dout = view(dout), .o = view(t.o), .inv = view(t.inv), .z = view(z),
                                    .part = view(param_work[1])},
               pc, dn.groups);
    r.mark("param_part");
  }
  pc.n = std::uint32_t(dn.groups);
  // workgroups of 256: dconv's outputs 256 a group, then one per dnorm[d] and one per head
  const std::uint64_t groups =
      (std::uint64_t(cfg.channels()) * cfg.conv_taps + 255) / 256 + kHeadDim + std::uint64_t(cfg.nv);
  r.dispatch(*k.param_sum,
             bindings::param_sum{.dconv_part = view(param_work[0]), .part = view(*dn.buffer), .da = view(g.da),
                                 .gates = view(t.gates), .dconv = view(g.dconv), .dnorm = view(g.dnorm),
                                 .ddt_bias = view(g.ddt_bias), .da_log = view(g.da_log)},
             pc, groups);
  r.mark("param_sum");
}

}  // namespace gdn::detail
