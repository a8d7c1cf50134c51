// SPDX-License-Identifier: MIT
// The chunked family on CUDA cores (shaders/chunked/): the column-split forward (column_split.hpp)
// with a checkpoint per chunk, and a backward over chunks of CH = the checkpoint interval tokens in
// four passes: chunk_prep (each chunk's T, W and cumulative log decays), chunk_dstate (the serial
// pass of the state gradients), chunk_values and chunk_grads (every chunk's gradients at once).
#include "families/column_split.hpp"

namespace gdn::detail {
namespace {

/// Words per (token, v-head) record of chunk_grads: dq^ 128, dk^ 128, d(log g), dbeta.
constexpr std::uint32_t kChunkRecordWords = 258;

/// chunk_dstate's workgroups per (window, v-head): 32 state columns each (shaders/chunked/chunk_dstate.comp).
constexpr std::uint32_t kDstateBlocks = 4;

class Chunked final : public ColumnSplitFamily {
 public:
  explicit Chunked(const FamilyArgs& a) : ColumnSplitFamily(a) {
    const std::uint32_t ch = std::uint32_t(cfg_.checkpoint_interval);
    chunk_prep_ = make_pipeline<bindings::chunk_prep>(a.dev, {sg_, ch});
    chunk_dstate_ = make_pipeline<bindings::chunk_dstate>(a.dev, {sg_, ch}, sg_);
    chunk_values_ = make_pipeline<bindings::chunk_values>(a.dev, {sg_, ch}, sg_);
    chunk_grads_ = make_pipeline<bindings::chunk_grads>(a.dev, {sg_, ch}, sg_);
    qk_bwd_ = make_pipeline<bindings::qk_bwd2_chunked>(a.dev, {sg_}, sg_);
  }

  // The chunk length is a pipeline constant: a window shorter than it is one partial chunk.
  int interval(int) const override { return cfg_.checkpoint_interval; }
  // llvmpipe: the forward's passes end after 21845 tokens of a window (3 a token) at intervals 16 and
  // 32, the backward's stay within 20000 at intervals 1 to 16
  int loop_iterations_per_token() const override { return 5; }

  enum Bwd { kDo, kDqk, kDu, kDsc, kW, kPairs, kSdot, kTm, kLgc, kDy, kDnorm };
  std::vector<BufferDecl> backward_buffers(int B, int T) const override {
    const std::size_t BT = std::size_t(B) * T, nv = cfg_.nv, cs = interval(T);
    const int nseg = (T + interval(T) - 1) / interval(T);
    const std::size_t chunks = std::size_t(B) * nv * nseg;
    return {{"do (grad of o)", BT * nv * kD},
            {"chunk records", BT * nv * kChunkRecordWords},  // [B, T, nv][258]
            {"dU per chunk", BT * nv * kD},
            {"end-state grads per chunk", std::size_t(B) * nv * state_slots(nseg) * kD * kD},
            {"W, dW per chunk", BT * nv * kD},
            {"pair dots per chunk", chunks * 4 * cs * cs},  // [4][CH][CH] (shaders/chunked/chunk_grads.glsl)
            {"<dS, S0> per chunk", chunks},
            {"T per chunk", BT * nv * cs},
            {"cumulative log gates per chunk", 2 * BT * nv},  // hi, lo (shaders/chunked/chunk.glsl)
            {"dy (conv output grad)", BT * std::size_t(cfg_.channels())},
            dnorm_part_decl(B, T, int(nv))};
  }
  DnormParts dnorm_parts(const BufferSet& w) const override {
    return {&w[kDnorm], dnorm_groups(w.B, w.T, int(cfg_.nv))};
  }

  void record_backward(gpu::Recorder& r, const DeviceInputs& in, const BufferSet& f, const Tensor& dout,
                       const DeviceGrads& g, const BufferSet& w, const gpu::Buffer& dconv_part, const States& s) override {
    const Push pc = push(cfg_, f.B, f.T, true, s);
    const std::uint64_t heads = std::uint64_t(f.B) * cfg_.nv, chunks = heads * pc.nseg;
    record_norm_bwd(r, in, f, dout, g, w[kDo], w[kDnorm], pc);
    r.dispatch(*chunk_prep_,
               bindings::chunk_prep{.qkn = view(f[kQkn]), .gates = view(f[kGates]), .a_log = view(p_.a_log),
                                    .wm = view(w[kW]), .tm = view(w[kTm]), .do_ = view(w[kDo]), .du = view(w[kDu]),
                                    .lgc = view(w[kLgc]), .pairs = view(w[kPairs])},
               pc, std::uint64_t(f.B) * cfg_.nk * pc.nseg);  // a workgroup per (window, k-head, chunk)
    r.mark("chunk_prep");
    r.dispatch(*chunk_dstate_,
               bindings::chunk_dstate{.qkn = view(f[kQkn]), .lgc = view(w[kLgc]), .wm = view(w[kW]), .do_ = view(w[kDo]),
                                      .du = view(w[kDu]), .dsc = view(w[kDsc]), .dht = view_or(s.dht, in.qkv),
                                      .dh0 = view_or(s.dh0, in.qkv)},
               pc, heads * kDstateBlocks);
    r.mark("chunk_dstate");
    // chunk_values and chunk_grads share one binding list (shaders/chunked/chunk_grads.glsl)
    auto values_and_grads = [&]<class B>(B) {
      return B{.qkn = view(f[kQkn]), .gates = view(f[kGates]), .lgc = view(w[kLgc]), .y = view(f[kY]),
               .kv = view(f[kKv]), .do_ = view(w[kDo]), .du = view(w[kDu]), .wm = view(w[kW]), .tm = view(w[kTm]),
               .ck = view(f[kCk]), .dsc = view(w[kDsc]), .rec = view(w[kDqk]), .dy = view(w[kDy]),
               .pairs = view(w[kPairs]), .sdot = view(w[kSdot]), .h0 = view_or(in.h0, in.qkv),
               .dht = view_or(s.dht, in.qkv)};
    };
    r.dispatch(*chunk_values_, values_and_grads(bindings::chunk_values{}), pc, chunks);
    r.mark("chunk_values");
    r.dispatch(*chunk_grads_, values_and_grads(bindings::chunk_grads{}), pc, chunks);
    r.mark("chunk_grads");
    record_qk_bwd<bindings::qk_bwd2_chunked>(r, *qk_bwd_, f, w[kDqk], w[kDy], g, pc);
    record_conv_bwd(r, common_, cfg_, p_, in, w[kDy], g, dconv_part, s.dconv_out, pc);
  }

 private:
  std::shared_ptr<gpu::Pipeline> chunk_prep_, chunk_dstate_, chunk_values_, chunk_grads_, qk_bwd_;
};

// Why the CUDA-core kernels cannot run chunks of `cs` tokens here ("" where they can).
std::string chunked_why_not(const DeviceInfo& info, const Config&, int cs) {
  if (auto w = workgroup_why_not(info); !w.empty()) return w;
  const auto sg = choose_subgroup_size(info);
  if (!sg.size) return sg.why_not;
  if (cs < 1 || std::uint32_t(cs) > kMaxChunk)
    return "its chunk length is the checkpoint interval, " + std::to_string(cs) + " here, and must be 1 to " +
           std::to_string(kMaxChunk);
  return shared_why_not(info,
                        {shader<bindings::chunk_prep>(), shader<bindings::chunk_dstate>(),
                         shader<bindings::chunk_values>(), shader<bindings::chunk_grads>()},
                        {sg.size, std::uint32_t(cs)}, " (a shorter checkpoint interval needs less)");
}

}  // namespace

const FamilyEntry kChunkedFamily{
    .variant = Variant::Chunked,
    .matrix_units = false,
    .default_interval = kDefaultChunk,
    .why_not = chunked_why_not,
    .make = [](const FamilyArgs& a) -> std::unique_ptr<Family> { return std::make_unique<Chunked>(a); },
};

}  // namespace gdn::detail
