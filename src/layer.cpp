// SPDX-License-Identifier: MIT
// gdn::Layer and gdn::Tape: the public handles over detail::LayerImpl (layer_impl.hpp), and the host
// API's staging of spans to and from device tensors.
#include "gdn/layer.hpp"

#include "layer_impl.hpp"

namespace gdn {

// ---- Tape ------------------------------------------------------------------------------------------

Tape::Tape() = default;
Tape::~Tape() = default;
Tape::Tape(Tape&&) noexcept = default;
Tape& Tape::operator=(Tape&&) noexcept = default;
bool Tape::recorded() const { return state_ && state_->recorded(); }
int Tape::batch() const { return state_ ? state_->B : 0; }
int Tape::tokens() const { return state_ ? state_->T : 0; }

namespace {
// A tape's buffers, and its parts' (a call run as parts: their own tapes, copies and states).
void list_buffers(const detail::TapeState& st, std::vector<std::pair<std::string, std::size_t>>& out) {
  for (const auto& b : st.fwd.buffers) out.emplace_back(b->name, b->bytes);
  if (st.owns_inputs)
    for (const Tensor* t : {&st.inputs.qkv, &st.inputs.z, &st.inputs.a, &st.inputs.b, &st.inputs.h0, &st.inputs.conv_state})
      if (!t->empty()) out.emplace_back(t->name(), t->bytes());
  for (const Tensor& t : st.owned) out.emplace_back(t.name(), t.bytes());
  for (const auto& p : st.part_tapes) list_buffers(*p, out);
}
}  // namespace

std::vector<std::pair<std::string, std::size_t>> Tape::buffers() const {
  std::vector<std::pair<std::string, std::size_t>> out;
  if (state_) list_buffers(*state_, out);
  return out;
}

std::size_t Tape::device_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, bytes] : buffers()) n += bytes;
  return n;
}

detail::TapeState& detail::LayerImpl::tape_state(Tape& t) {
  if (!t.state_) t.state_ = std::make_unique<TapeState>();
  return *t.state_;
}
const detail::TapeState* detail::LayerImpl::tape_state_ptr(const Tape& t) { return t.state_.get(); }

// ---- Layer -----------------------------------------------------------------------------------------

Layer::Layer(std::shared_ptr<Context> ctx, const Config& config, const Params& params) {
  if (!ctx) throw std::invalid_argument("Layer: no context");
  impl_ = std::make_unique<detail::LayerImpl>(std::move(ctx), config, params);
}
Layer::~Layer() = default;

const Config& Layer::config() const { return impl_->cfg; }
Variant Layer::variant() const { return impl_->cfg.variant; }
Context& Layer::context() const { return *impl_->ctx; }
void Layer::set_profiling(bool on) { impl_->profiling = on; }
ParamTensors Layer::params() const { return {impl_->conv, impl_->a_log, impl_->dt_bias, impl_->norm}; }
void Layer::set_params(const Params& p) {
  const std::lock_guard lock(impl_->calls);
  impl_->validate_config(p);  // every size checked before anything is written
  impl_->conv.upload(p.conv);
  impl_->a_log.upload(p.a_log);
  impl_->dt_bias.upload(p.dt_bias);
  impl_->norm.upload(p.norm);
}
const std::vector<KernelTime>& Layer::last_timings() const { return impl_->timings; }

std::size_t Layer::workspace_bytes() const {
  const auto& m = *impl_;
  std::size_t n = 0;
  for (const auto& w : m.work) {
    n += w.scratch_fwd.bytes() + w.bwd.bytes() + w.param_work.bytes() + w.family_scratch.bytes();
    n += w.da32.bytes() + w.db32.bytes();
  }
  for (const Tensor* t : {&m.lane_sums, &m.conv, &m.a_log, &m.dt_bias, &m.norm, &m.host_in.qkv, &m.host_in.z, &m.host_in.a,
                          &m.host_in.b, &m.host_out, &m.host_dout, &m.host_grads.dqkv, &m.host_grads.dz,
                          &m.host_grads.da, &m.host_grads.db, &m.host_in.h0, &m.host_in.conv_state,
                          &m.host_carry.ht, &m.host_carry.conv_state, &m.host_dcarry.ht, &m.host_dcarry.conv_state,
                          &m.host_grads.dh0, &m.host_grads.dconv_state})
    n += t->bytes();
  return n;
}

Recorded::Recorded() = default;
Recorded::~Recorded() = default;
Recorded::Recorded(Recorded&&) noexcept = default;
Recorded& Recorded::operator=(Recorded&&) noexcept = default;

namespace {
// What recorded work holds: the device (through its Context) and the work's descriptor sets, which
// go first.
struct Holding {
  std::shared_ptr<Context> ctx;
  std::vector<std::shared_ptr<void>> work;
};

// Leaves the layer's recording or submitting mode, and drops what a call that threw collected,
// however the call ends.
struct ModeGuard {
  detail::LayerImpl& m;
  ~ModeGuard() {
    m.record_into = VK_NULL_HANDLE;
    m.submit_only = false;
    m.held.clear();
    m.submitted.clear();
  }
};
// h, registered as work of the layer not yet released (calls that would free what it uses are refused).
template <class Held>
std::shared_ptr<Held> outstanding(detail::LayerImpl& m, std::shared_ptr<Held> h) {
  std::erase_if(m.outstanding, [](const auto& w) { return w.expired(); });
  m.outstanding.push_back(h);
  return h;
}
}  // namespace

template <class Call>
std::shared_ptr<void> record(detail::LayerImpl& m, void* cmd, Call&& call) {
  if (!cmd) throw std::invalid_argument("record: a null VkCommandBuffer");
  if (m.cfg.check_finite) throw std::invalid_argument("record: Config::check_finite reads results back; not with recording");
  const ModeGuard guard{m};
  m.record_into = static_cast<VkCommandBuffer>(cmd);
  call();
  return outstanding(m, std::make_shared<Holding>(Holding{m.ctx, std::move(m.held)}));
}

Recorded Layer::record_forward(void* cmd, const DeviceInputs& in, Tensor& out, Tape* tape, DeviceCarry* carry) {
  const std::lock_guard lock(impl_->calls);
  Recorded r;
  r.held_ = record(*impl_, cmd, [&] { impl_->forward(in, out, tape, carry); });
  return r;
}

Recorded Layer::record_backward(void* cmd, const Tape& tape, const Tensor& dout, DeviceGrads& grads,
                                const DeviceCarry* dcarry) {
  const std::lock_guard lock(impl_->calls);
  Recorded r;
  r.held_ = record(*impl_, cmd, [&] { impl_->backward(tape, dout, grads, dcarry); });
  return r;
}

}  // namespace gdn

namespace gdn::detail {
// What submitted work holds: the device (through its Context) and the submission, which goes first
// (its destructor waits for the GPU).
struct PendingState {
  std::shared_ptr<Context> ctx;
  std::vector<std::shared_ptr<void>> held;  // what the work uses that the call made or replaced
  std::unique_ptr<gpu::Device::Submission> submission;  // destroyed first: waits for the work
};
}  // namespace gdn::detail

namespace gdn {

Pending::Pending() = default;
Pending::~Pending() = default;
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;
void Pending::wait() {
  if (state_) state_->submission->wait();
}
bool Pending::done() { return !state_ || state_->submission->done(); }

template <class Call>
std::shared_ptr<detail::PendingState> submit(detail::LayerImpl& m, Call&& call) {
  if (m.cfg.check_finite) throw std::invalid_argument("submit: Config::check_finite reads results back; not with submission");
  const ModeGuard guard{m};
  m.submit_only = true;
  call();
  if (m.submitted.empty()) return nullptr;
  return outstanding(m, std::make_shared<detail::PendingState>(
                            detail::PendingState{m.ctx, std::move(m.held), std::move(m.submitted.front())}));
}

Pending Layer::submit_forward(const DeviceInputs& in, Tensor& out, Tape* tape, DeviceCarry* carry) {
  const std::lock_guard lock(impl_->calls);
  Pending p;
  p.state_ = submit(*impl_, [&] { impl_->forward(in, out, tape, carry); });
  return p;
}

Pending Layer::submit_backward(const Tape& tape, const Tensor& dout, DeviceGrads& grads, const DeviceCarry* dcarry) {
  const std::lock_guard lock(impl_->calls);
  Pending p;
  p.state_ = submit(*impl_, [&] { impl_->backward(tape, dout, grads, dcarry); });
  return p;
}

void Layer::forward(const DeviceInputs& in, Tensor& out, Tape* tape, DeviceCarry* carry) {
  const std::lock_guard lock(impl_->calls);
  impl_->forward(in, out, tape, carry);
}

void Layer::backward(const Tape& tape, const Tensor& dout, DeviceGrads& grads, const DeviceCarry* dcarry) {
  const std::lock_guard lock(impl_->calls);
  impl_->backward(tape, dout, grads, dcarry);
}

namespace {
/// Reuses `t` when it already has `shape`, else allocates.
void reuse(Tensor& t, const std::shared_ptr<Context>& ctx, std::vector<std::int64_t> shape, const char* name) {
  if (t.empty() || t.shape() != shape) t = Tensor(ctx, std::move(shape), name);
}
// The host API's transfers: into the call's own submission (LayerImpl::host_up, host_down), or made
// at once where Config::check_finite reads the inputs before the call's work.
void upload(detail::LayerImpl& m, Tensor& t, std::span<const float> v) {
  if (m.cfg.check_finite) {
    t.upload(v);
    return;
  }
  detail::expect_size(t.name().c_str(), v.size(), std::size_t(t.numel()), shape_str(t.shape()));
  m.host_up.push_back({.buffer = detail::storage_of(t).buffer.get(), .up = std::as_bytes(v), .down = {}});
}
// v, filled with t's elements when the call's work is done (in its submission).
void download_into(detail::LayerImpl& m, const Tensor& t, std::vector<float>& v) {
  v.resize(std::size_t(t.numel()));
  m.host_down.push_back({.buffer = detail::storage_of(t).buffer.get(), .up = {}, .down = std::as_writable_bytes(std::span(v))});
}
// Clears the host transfers of a call that threw before its work ran.
struct ClearTransfers {
  detail::LayerImpl& m;
  ~ClearTransfers() {
    m.host_up.clear();
    m.host_down.clear();
  }
};
/// An optional state: uploaded into t (reused when it has `shape`) where given, else t emptied.
void upload_optional(detail::LayerImpl& m, Tensor& t, const std::shared_ptr<Context>& ctx, std::span<const float> v,
                     std::vector<std::int64_t> shape, const char* name) {
  if (v.empty()) {
    t = Tensor();
    return;
  }
  reuse(t, ctx, std::move(shape), name);
  upload(m, t, v);
}
}  // namespace

std::vector<float> Layer::forward(int batch, int tokens, const HostInputs& in, Tape* tape, HostCarry* carry) {
  auto& m = *impl_;
  const std::lock_guard lock(m.calls);
  if (batch < 1 || tokens < 1)
    throw std::invalid_argument("forward: batch = " + std::to_string(batch) + " and tokens = " + std::to_string(tokens) +
                                " must both be >= 1");
  const std::size_t BT = std::size_t(batch) * tokens;
  const std::string bt = std::to_string(batch) + ", " + std::to_string(tokens) + ", ";
  detail::expect_size("qkv", in.qkv.size(), BT * m.cfg.channels(), "[B, T, C] = [" + bt + std::to_string(m.cfg.channels()) + "]");
  detail::expect_size("z", in.z.size(), BT * m.cfg.value_dim(), "[B, T, nv*D] = [" + bt + std::to_string(m.cfg.value_dim()) + "]");
  detail::expect_size("a", in.a.size(), BT * m.cfg.nv, "[B, T, nv] = [" + bt + std::to_string(m.cfg.nv) + "]");
  detail::expect_size("b", in.b.size(), BT * m.cfg.nv, "[B, T, nv] = [" + bt + std::to_string(m.cfg.nv) + "]");
  // the states' rows: B, or the packed sequences (cu_seqlens itself is checked with the tensors)
  const int S = in.cu_seqlens.empty() ? batch : int(std::max<std::size_t>(in.cu_seqlens.size(), 2) - 1);
  const std::string b_ = std::to_string(S) + ", ";
  const std::size_t state = std::size_t(S) * m.cfg.nv * kHeadDim * kHeadDim,
                    conv_state = std::size_t(S) * (m.cfg.conv_taps - 1) * m.cfg.channels();
  if (!in.h0.empty())
    detail::expect_size("h0", in.h0.size(), state, "[B, nv, D, D] = [" + b_ + std::to_string(m.cfg.nv) + ", 128, 128]");
  if (!in.conv_state.empty())
    detail::expect_size("conv_state", in.conv_state.size(), conv_state,
                        "[B, K-1, C] = [" + b_ + std::to_string(m.cfg.conv_taps - 1) + ", " + std::to_string(m.cfg.channels()) + "]");
  // A tape of the host API owns device copies of the inputs (its backward reads them).
  DeviceInputs* dst = &m.host_in;
  if (tape) {
    auto& st = detail::LayerImpl::tape_state(*tape);
    if (!st.owns_inputs) st.inputs = DeviceInputs{};
    st.owns_inputs = true;
    dst = &st.inputs;
  }
  const std::int64_t B = batch, T = tokens;
  reuse(dst->qkv, m.ctx, {B, T, m.cfg.channels()}, "qkv");
  reuse(dst->z, m.ctx, {B, T, m.cfg.value_dim()}, "z");
  reuse(dst->a, m.ctx, {B, T, m.cfg.nv}, "a");
  reuse(dst->b, m.ctx, {B, T, m.cfg.nv}, "b");
  const ClearTransfers clear{m};
  upload(m, dst->qkv, in.qkv);
  upload(m, dst->z, in.z);
  upload(m, dst->a, in.a);
  upload(m, dst->b, in.b);
  upload_optional(m, dst->h0, m.ctx, in.h0, m.state_shape(S), "h0");
  upload_optional(m, dst->conv_state, m.ctx, in.conv_state, m.conv_state_shape(S), "conv_state");
  dst->cu_seqlens.assign(in.cu_seqlens.begin(), in.cu_seqlens.end());
  reuse(m.host_out, m.ctx, {B, T, m.cfg.value_dim()}, "out");
  std::vector<float> out;
  download_into(m, m.host_out, out);
  DeviceCarry* dcarry = nullptr;
  HostCarry got;
  if (carry) {
    reuse(m.host_carry.ht, m.ctx, m.state_shape(S), "ht");
    reuse(m.host_carry.conv_state, m.ctx, m.conv_state_shape(S), "conv_state out");
    download_into(m, m.host_carry.ht, got.ht);
    download_into(m, m.host_carry.conv_state, got.conv_state);
    dcarry = &m.host_carry;
  }
  if (tape) {
    auto& st = detail::LayerImpl::tape_state(*tape);
    const DeviceInputs owned = st.inputs;  // forward() stores the inputs into the tape again
    m.forward(owned, m.host_out, tape, dcarry);
    st.owns_inputs = true;
  } else {
    m.forward(*dst, m.host_out, nullptr, dcarry);
  }
  if (carry) *carry = std::move(got);
  return out;
}

HostGrads Layer::backward(const Tape& tape, std::span<const float> dout, const HostCarry* dcarry) {
  auto& m = *impl_;
  const std::lock_guard lock(m.calls);
  const auto* st = detail::LayerImpl::tape_state_ptr(tape);
  m.check_tape(st);
  const std::int64_t B = st->B, T = st->T, S = st->S;
  detail::expect_size("dout", dout.size(), std::size_t(B * T) * m.cfg.value_dim(),
                      "[B, T, nv*D] = [" + std::to_string(B) + ", " + std::to_string(T) + ", " +
                          std::to_string(m.cfg.value_dim()) + "]");
  const std::string b_ = std::to_string(S) + ", ";
  if (dcarry && !dcarry->ht.empty()) {
    detail::expect_size("dht", dcarry->ht.size(), std::size_t(S) * m.cfg.nv * kHeadDim * kHeadDim,
                        "[B, nv, D, D] = [" + b_ + std::to_string(m.cfg.nv) + ", 128, 128]");
  }
  if (dcarry && !dcarry->conv_state.empty())
    detail::expect_size("dconv_state out", dcarry->conv_state.size(),
                        std::size_t(S) * (m.cfg.conv_taps - 1) * m.cfg.channels(),
                        "[B, K-1, C] = [" + b_ + std::to_string(m.cfg.conv_taps - 1) + ", " + std::to_string(m.cfg.channels()) + "]");
  const ClearTransfers clear{m};
  reuse(m.host_dout, m.ctx, {B, T, m.cfg.value_dim()}, "dout");
  upload(m, m.host_dout, dout);
  upload_optional(m, m.host_dcarry.ht, m.ctx, dcarry ? std::span<const float>(dcarry->ht) : std::span<const float>(),
                  m.state_shape(int(S)), "dht");
  upload_optional(m, m.host_dcarry.conv_state, m.ctx,
                  dcarry ? std::span<const float>(dcarry->conv_state) : std::span<const float>(),
                  m.conv_state_shape(int(S)), "dconv_state out");
  auto& g = m.host_grads;
  reuse(g.dqkv, m.ctx, {B, T, m.cfg.channels()}, "dqkv");
  reuse(g.dz, m.ctx, {B, T, m.cfg.value_dim()}, "dz");
  reuse(g.da, m.ctx, {B, T, m.cfg.nv}, "da");
  reuse(g.db, m.ctx, {B, T, m.cfg.nv}, "db");
  reuse(g.dconv_state, m.ctx, m.conv_state_shape(int(S)), "dconv_state");
  if (st->inputs.h0.empty()) g.dh0 = Tensor();
  else reuse(g.dh0, m.ctx, m.state_shape(int(S)), "dh0");
  if (m.cfg.param_grads) {
    reuse(g.dconv, m.ctx, {m.cfg.channels(), m.cfg.conv_taps}, "dconv");
    reuse(g.da_log, m.ctx, {m.cfg.nv}, "da_log");
    reuse(g.ddt_bias, m.ctx, {m.cfg.nv}, "ddt_bias");
    reuse(g.dnorm, m.ctx, {kHeadDim}, "dnorm");
  }
  HostGrads out;
  for (auto [t, v] : {std::pair{&g.dqkv, &out.dqkv}, {&g.dz, &out.dz}, {&g.da, &out.da}, {&g.db, &out.db},
                      {&g.dconv, &out.dconv}, {&g.da_log, &out.da_log}, {&g.ddt_bias, &out.ddt_bias},
                      {&g.dnorm, &out.dnorm}, {&g.dh0, &out.dh0}, {&g.dconv_state, &out.dconv_state}})
    if (!t->empty()) download_into(m, *t, *v);
  m.backward(tape, m.host_dout, g, &m.host_dcarry);
  return out;
}

}  // namespace gdn
