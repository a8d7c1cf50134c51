// SPDX-License-Identifier: MIT
// Calls run as parts (docs/spec.md, "Long calls"): where a call's buffers would exceed one storage
// binding's range, it runs as groups of whole windows, else as runs of tokens of one window with the
// recurrent and conv states carried from each run to the next (forward) and their gradients carried
// back (backward): the same arithmetic as one call over the window, parts bound as views of the
// call's tensors.
#include <algorithm>
#include <functional>
#include <numeric>
#include <ranges>

#include "layer_impl.hpp"

namespace gdn::detail {

bool LayerImpl::fits_range(int nb, int nt) const {
  // every buffer the family declares, the workspaces, the boundary streams' rows (as float32, the
  // larger of their types) and the states of nb windows of nt tokens, each within one binding's range
  const std::uint64_t range = dev.info().max_storage_buffer_range;
  auto within = [&](const std::vector<BufferDecl>& ds) {
    return std::ranges::all_of(ds, [&](const BufferDecl& d) { return d.floats * kF <= range; });
  };
  const std::uint64_t rows = std::uint64_t(nb) * std::uint64_t(nt);
  return within(family->forward_buffers(nb, nt, true)) && within(family->backward_buffers(nb, nt)) &&
         within(family->scratch_buffers(nb, nt)) && within(param_buffers(nb, nt)) &&
         rows * std::uint64_t(cfg.channels()) * kF <= range && rows * std::uint64_t(cfg.value_dim()) * kF <= range &&
         std::uint64_t(nb) * cfg.nv * kD * kD * kF <= range;
}

namespace {
// The largest k in 1 .. hi with fits(k) (fits holds up to some k and not beyond), or 0.
template <class Fits>
int largest_fitting(int hi, Fits&& fits) {
  int lo = 0;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// Window or sequence `s` (its rows t = start .. end-1 of window b) in runs of at most nt tokens.
void add_runs(std::vector<Part>& plan, int b, int s, int start, int end, int nt) {
  for (int t0 = start; t0 < end; t0 += nt) plan.push_back({b, 1, t0, std::min(nt, end - t0), s, t0 == start, t0 + nt >= end});
}
}  // namespace

int LayerImpl::run_tokens(int T, int cap) const {
  // the longest multiple of the interval, at most min(T, cap), whose run of one window fits
  const int q = family->interval(T);
  const int runs = largest_fitting(std::max(std::min(T, cap) / q, 1), [&](int k) { return fits_range(1, k * q); });
  if (runs == 0)
    throw Error("layer: one window's run of " + std::to_string(q) +
                " tokens (the checkpoint interval) needs buffers over this device's maxStorageBufferRange of " +
                std::to_string(dev.info().max_storage_buffer_range) + " bytes");
  return runs * q;
}

int LayerImpl::part_cap(int T) const {
  std::int64_t cap = cfg.part_tokens > 0 ? cfg.part_tokens : T;
  if (const std::uint64_t limit = dev.info().max_loop_iterations)
    cap = std::min<std::int64_t>(cap, std::int64_t(limit / std::uint64_t(family->loop_iterations_per_token())));
  return int(std::max<std::int64_t>(cap, 1));
}

std::vector<Part> LayerImpl::plan_parts(int B, int T) const {
  const int cap = part_cap(T);
  if (T <= cap && fits_range(B, T)) return {Part{0, B, 0, T, 0, true, true}};
  std::vector<Part> plan;
  if (T <= cap && fits_range(1, T)) {  // groups of whole windows: the most that fit
    const int nb = largest_fitting(B, [&](int k) { return fits_range(k, T); });
    for (int b0 = 0; b0 < B; b0 += nb) plan.push_back({b0, std::min(nb, B - b0), 0, T, b0, true, true});
    return plan;
  }
  const int nt = run_tokens(T, cap);
  for (int b = 0; b < B; ++b) add_runs(plan, b, b, 0, T, nt);
  return plan;
}

std::vector<Part> LayerImpl::plan_sequences(const std::vector<std::int64_t>& cu) const {
  const int longest = int(std::ranges::max(std::views::iota(std::size_t(1), cu.size()) |
                                           std::views::transform([&](std::size_t i) { return cu[i] - cu[i - 1]; })));
  const int cap = part_cap(longest);
  const int nt = longest <= cap && fits_range(1, longest) ? longest : run_tokens(longest, cap);
  std::vector<Part> plan;
  for (std::size_t n = 0; n + 1 < cu.size();) {
    const int t0 = int(cu[n]), L = int(cu[n + 1] - cu[n]);
    if (L > nt) {
      add_runs(plan, 0, int(n), t0, t0 + L, nt);
      ++n;
      continue;
    }
    // Consecutive sequences of one length are consecutive windows of L rows: one part of as many as
    // fit one binding, run as a call of B of them.
    std::size_t g = 1;
    while (n + g + 1 < cu.size() && cu[n + g + 1] - cu[n + g] == L && fits_range(int(g) + 1, L)) ++g;
    plan.push_back({0, int(g), t0, L, int(n), true, true});
    n += g;
  }
  return plan;
}

namespace {
std::int64_t tokens(const Part& p) { return std::int64_t(p.nb) * p.nt; }
// The part of the most tokens among parts `of` of the plan.
const Part& largest(const std::vector<Part>& plan, const std::vector<std::size_t>& of) {
  return plan[*std::ranges::max_element(of, {}, [&](std::size_t i) { return tokens(plan[i]); })];
}

// Lanes that run side by side (gpu::Recorder::begin_lanes), each with its own workspaces, sized to
// its longest sequence: those are the call's kMaxLanes longest (lanes_of), so all lanes' workspaces
// together stay within one call's over the same tokens. The cap bounds the buffers (and allocations)
// they hold.
constexpr std::size_t kMaxLanes = 32;

// The parts of each lane. A packed call whose sequences each run as one part: up to kMaxLanes lanes,
// the parts taken longest first, each into the lane of the fewest tokens so far. Any other plan (its
// parts carry state from one to the next, or they are groups of windows split for the binding range):
// one lane, in the plan's order.
std::vector<std::vector<std::size_t>> lanes_of(const std::vector<Part>& plan, bool packed) {
  std::vector<std::size_t> order(plan.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  if (!packed || plan.size() < 2 || !std::ranges::all_of(plan, [](const Part& p) { return p.first && p.last; }))
    return {order};
  std::ranges::stable_sort(order, std::greater{}, [&](std::size_t i) { return tokens(plan[i]); });
  std::vector<std::vector<std::size_t>> lanes(std::min(plan.size(), kMaxLanes));
  std::vector<std::int64_t> load(lanes.size(), 0);
  for (std::size_t i : order) {
    const auto l = std::size_t(std::ranges::min_element(load) - load.begin());
    lanes[l].push_back(i);
    load[l] += tokens(plan[i]);
  }
  return lanes;
}

// Records body(r, l) for lanes l = 0 .. n-1: side by side (gpu::Recorder::begin_lanes; their work
// one interval, "sequences side by side") where there are several, else as one sequence of commands.
template <class Body>
void record_lanes(gpu::Recorder& r, std::size_t n, Body&& body) {
  if (n == 1) {
    body(r, std::size_t(0));
    return;
  }
  r.begin_lanes(n);
  for (std::size_t l = 0; l < n; ++l) {
    r.lane(l);
    body(r, l);
  }
  r.end_lanes();
  r.mark("sequences side by side");
}

// Where a lane's parameters' gradients lie in LayerImpl::lane_sums (shaders/common/param_lanes.comp):
// dconv [C*K] at 0, then dnorm [D], ddt_bias [nv], da_log [nv], each from a multiple of 64 floats (256
// bytes: a storage-buffer offset every device aligns to).
struct ParamSumLayout {
  std::int64_t dnorm, ddt_bias, da_log, stride;
  explicit ParamSumLayout(const Config& cfg) {
    auto align = [](std::int64_t n) { return (n + 63) / 64 * 64; };
    dnorm = align(std::int64_t(cfg.channels()) * cfg.conv_taps);
    ddt_bias = dnorm + align(kHeadDim);
    da_log = ddt_bias + align(cfg.nv);
    stride = da_log + align(cfg.nv);
  }
};
// The shape of part p's rows of a [B, T, ...] stream: [nb, nt, ...].
std::vector<std::int64_t> part_shape(const Tensor& t, const Part& p) {
  std::vector<std::int64_t> s = t.shape();
  s[0] = p.nb;
  s[1] = p.nt;
  return s;
}
// n elements of `from` from element `at` into `to` at element `to_at` (one dtype; any offsets),
// without a barrier.
void copy_rows(gpu::Recorder& r, const Tensor& from, std::size_t at, const Tensor& to, std::size_t to_at, std::size_t n) {
  const std::size_t e = dtype_bytes(to.dtype());
  r.copy(*storage_of(from).buffer, at * e, *storage_of(to).buffer, to_at * e, n * e, false);
}
std::int64_t row_elems(const Tensor& t) { return t.numel() / (t.shape()[0] * t.shape()[1]); }
// Part p's rows of a [B, T, ...] stream (windows b0 .. b0+nb-1, tokens t0 .. t0+nt-1), as a view.
Tensor stream_rows(const LayerImpl& m, const Tensor& t, const Part& p, int T) {
  return m.sub_tensor(t, (std::int64_t(p.b0) * T + p.t0) * row_elems(t), part_shape(t, p), t.name());
}
// Part p's rows s0 .. s0+nb-1 of a state [S, ...] (empty stays empty), as a view.
Tensor state_rows(const LayerImpl& m, const Tensor& t, const Part& p, const char* name) {
  if (t.empty()) return Tensor();
  std::vector<std::int64_t> s = t.shape();
  s[0] = p.nb;
  return m.sub_tensor(t, p.s0 * (t.numel() / t.shape()[0]), s, name);
}

// A call's parts' own buffers (copies of a and b, the states between parts, with a tape their forward
// buffers) as ranges of a few allocations, not one each: a packed call of thousands of sequences
// would make thousands (a driver's maxMemoryAllocationCount may be 4096, and each costs time and a
// page or more). Slabs of up to 256 MiB (a larger buffer has one of its own); ranges start at
// multiples of 256 bytes, the largest minStorageBufferOffsetAlignment a device may have.
class PartSlabs {
 public:
  // A range of `bytes` (its id); every range is reserved before allocate().
  std::size_t reserve(std::size_t bytes) {
    const std::size_t n = (std::max<std::size_t>(bytes, 4) + kAlign - 1) / kAlign * kAlign;
    if (used_.empty() || used_.back() + n > kSlab) used_.push_back(0);
    at_.push_back({used_.size() - 1, used_.back()});
    used_.back() += n;
    return at_.size() - 1;
  }
  void allocate(std::shared_ptr<Context> ctx) {
    ctx_ = std::move(ctx);
    for (std::size_t i = 0; i < used_.size(); ++i)
      slabs_.emplace_back(ctx_, std::vector<std::int64_t>{std::int64_t(used_[i] / 4)}, "parts' buffers");
  }
  Tensor tensor(std::size_t id, std::vector<std::int64_t> shape, const std::string& name, DType dtype) const {
    const Tensor& slab = slabs_[at_[id].slab];
    return Tensor::wrap(ctx_, slab.vk_buffer(), slab.vk_offset() + at_[id].offset, std::move(shape), name, dtype);
  }
  std::unique_ptr<gpu::Buffer> buffer(gpu::Device& dev, std::size_t id, const std::string& name, std::size_t bytes) const {
    const Tensor& slab = slabs_[at_[id].slab];
    return dev.borrow_buffer(name, reinterpret_cast<VkBuffer>(slab.vk_buffer()), slab.vk_offset() + at_[id].offset,
                             std::max<std::size_t>(bytes, 4), true);
  }

 private:
  static constexpr std::size_t kAlign = 256, kSlab = std::size_t(256) << 20;
  struct At {
    std::size_t slab, offset;
  };
  std::vector<std::size_t> used_;  // bytes of each slab
  std::vector<At> at_;
  std::shared_ptr<Context> ctx_;
  std::vector<Tensor> slabs_;
};
std::size_t tensor_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  return storage_bytes(checked_numel(shape, "part"), dtype);
}
}  // namespace

// Forward: each part from its inputs (views of the call's rows; a and b copied, their rows need not
// lie at an aligned offset), the state the part before it in its window left (else the call's h0 and
// conv_state windows), writing the call's out rows and the state for the part after it (else the
// call's carry). With a tape, each part keeps its own.
void LayerImpl::forward_parts(const DeviceInputs& in, const Tensor& out, Tape* tape, DeviceCarry* carry,
                              const std::vector<Part>& plan) {
  const int T = int(in.qkv.shape()[1]);
  const auto lanes = lanes_of(plan, !in.cu_seqlens.empty());
  if (work.size() < lanes.size()) work.resize(lanes.size());
  for (std::size_t l = 0; l < lanes.size(); ++l) {  // each lane's workspaces grow to its largest part once
    const Part& big = largest(plan, lanes[l]);
    ensure(work[l].family_scratch, big.nb, big.nt, false, [&] { return family->scratch_buffers(big.nb, big.nt); }, true);
    if (!tape)
      ensure(work[l].scratch_fwd, big.nb, big.nt, false, [&] { return family->forward_buffers(big.nb, big.nt, false); },
             true);
  }
  const Part& big = largest(plan, lanes[0]);
  auto windows = [&](const Tensor& t, const Part& p, const char* name) { return state_rows(*this, t, p, name); };
  auto rows = [&](const Tensor& t, const Part& p) { return stream_rows(*this, t, p, T); };
  // A tape recorded with the same parts keeps their buffers (as one call's tape keeps its own).
  TapeState* old = tape ? &tape_state(*tape) : nullptr;
  const bool reuse = old && old->layer_id == id && old->parts == plan && !old->part_tapes.empty() &&
                     old->part_tapes[0]->inputs.a.dtype() == in.a.dtype() &&
                     old->part_tapes[0]->inputs.b.dtype() == in.b.dtype();
  if (old && old->recorded() && !reuse) refuse_if_outstanding(big.nb, big.nt);  // its buffers go
  // the parts' own buffers: ranges of PartSlabs, reserved for every part, then allocated
  auto slabs = std::make_shared<PartSlabs>();
  struct Ranges {
    std::size_t a = 0, b = 0, h0 = 0, conv = 0;
    std::vector<std::size_t> fwd;
  };
  std::vector<Ranges> ranges(reuse ? 0 : plan.size());
  std::vector<std::vector<BufferDecl>> decls(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const Part& p = plan[i];
    Ranges& g = ranges[i];
    g.a = slabs->reserve(tensor_bytes(part_shape(in.a, p), in.a.dtype()));
    g.b = slabs->reserve(tensor_bytes(part_shape(in.b, p), in.b.dtype()));
    if (!p.first) {
      g.h0 = slabs->reserve(tensor_bytes(state_shape(1), DType::Float32));
      g.conv = slabs->reserve(tensor_bytes(conv_state_shape(1), DType::Float32));
    }
    if (tape) {
      decls[i] = family->forward_buffers(p.nb, p.nt, true);
      for (const BufferDecl& d : decls[i]) g.fwd.push_back(slabs->reserve(d.floats * kF));
    }
  }
  if (!reuse) slabs->allocate(ctx);
  std::vector<std::shared_ptr<TapeState>> parts;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Part& p = plan[i];
    auto pt = reuse ? old->part_tapes[i] : std::make_shared<TapeState>();
    pt->layer_id = id;
    pt->B = p.nb;
    pt->T = p.nt;
    DeviceInputs& pin = pt->inputs;
    pin.qkv = rows(in.qkv, p);
    pin.z = rows(in.z, p);
    if (!reuse) {
      const Ranges& g = ranges[i];
      pt->slabs = slabs;
      pin.a = slabs->tensor(g.a, part_shape(in.a, p), "a (part)", in.a.dtype());
      pin.b = slabs->tensor(g.b, part_shape(in.b, p), "b (part)", in.b.dtype());
      pt->owned = {pin.a, pin.b};
      if (!p.first) {  // the state the part before leaves
        pin.h0 = slabs->tensor(g.h0, state_shape(1), "state between parts", DType::Float32);
        pin.conv_state = slabs->tensor(g.conv, conv_state_shape(1), "conv state between parts", DType::Float32);
        pt->owned.push_back(pin.h0);
        pt->owned.push_back(pin.conv_state);
      }
      if (tape) {
        pt->fwd = BufferSet{};
        pt->fwd.B = p.nb;
        pt->fwd.T = p.nt;
        pt->fwd.keep = pt->fwd.made = true;
        for (std::size_t d = 0; d < decls[i].size(); ++d)
          pt->fwd.buffers.push_back(slabs->buffer(dev, g.fwd[d], decls[i][d].name, decls[i][d].floats * kF));
      }
    }
    if (p.first) {
      pin.h0 = windows(in.h0, p, "h0");
      pin.conv_state = windows(in.conv_state, p, "conv_state");
    }
    parts.push_back(std::move(pt));
  }
  if (!tape)  // the parts live until the work is done
    for (auto& pt : parts) retired.push_back(pt);
  run([&](gpu::Recorder& rec) {
    record_lanes(rec, lanes.size(), [&](gpu::Recorder& r, std::size_t l) {
      Work& w = work[l];
      for (std::size_t i : lanes[l]) {
        const Part& p = plan[i];
        TapeState& pt = *parts[i];
        for (auto [from, to] : {std::pair{&in.a, &pt.inputs.a}, {&in.b, &pt.inputs.b}})
          copy_rows(r, *from, (std::size_t(p.b0) * T + p.t0) * cfg.nv, *to, 0, std::size_t(to->numel()));
        r.barrier();
        States s;
        Tensor conv_out;
        if (!p.last) {
          s.ht = parts[i + 1]->inputs.h0;
          conv_out = parts[i + 1]->inputs.conv_state;
        } else if (carry) {
          s.ht = windows(carry->ht, p, "ht");
          conv_out = windows(carry->conv_state, p, "conv_state out");
        }
        set_flags(s, pt.inputs);
        s.side_by_side = lanes.size() > 1;
        ensure(w.family_scratch, p.nb, p.nt, false, [&] { return family->scratch_buffers(p.nb, p.nt); }, true);
        BufferSet* f = &pt.fwd;
        if (!tape) {
          ensure(w.scratch_fwd, p.nb, p.nt, false, [&] { return family->forward_buffers(p.nb, p.nt, false); }, true);
          f = &w.scratch_fwd;
        }
        record_forward_part(r, w, pt.inputs, rows(out, p), *f, s, conv_out.empty() ? nullptr : &conv_out);
      }
    });
  });
  if (tape) {
    auto& st = tape_state(*tape);
    st = TapeState{};
    st.layer_id = id;
    st.B = int(in.qkv.shape()[0]);
    st.T = T;
    st.S = in.cu_seqlens.empty() ? st.B : int(in.cu_seqlens.size() - 1);
    st.inputs = in;
    st.parts = plan;
    st.part_tapes = std::move(parts);
  }
}

// Backward: the parts in reverse order (within a window, the last first), each from its tape with
// the gradients of the states it left (the part after it's dh0 and conv-state gradient, else the
// call's dcarry), writing the call's gradient rows (da, db through copies) and the parameters'
// gradients added up over the parts in that fixed order.
void LayerImpl::backward_parts(const TapeState& st, const Tensor& dout, const DeviceGrads& g, const DeviceCarry* dcarry) {
  const std::vector<Part>& plan = st.parts;
  const int T = st.T;
  auto lanes = lanes_of(plan, !st.inputs.cu_seqlens.empty());
  if (lanes.size() == 1) std::ranges::reverse(lanes[0]);  // within a window, the last part first
  if (work.size() < lanes.size()) work.resize(lanes.size());
  for (std::size_t l = 0; l < lanes.size(); ++l) {
    const Part& big = largest(plan, lanes[l]);
    ensure(work[l].bwd, big.nb, big.nt, true, [&] { return family->backward_buffers(big.nb, big.nt); }, true);
    ensure(work[l].param_work, big.nb, big.nt, true, [&] { return param_buffers(big.nb, big.nt); }, true);
  }
  // lanes side by side: each sums its sequences' parameters' gradients apart, param_lanes adds them
  const bool lane_params = lanes.size() > 1 && cfg.param_grads;
  const ParamSumLayout at(cfg);
  if (lane_params) {
    grow(lane_sums, {std::int64_t(lanes.size()) * at.stride}, "parameters' gradients per lane", 1, st.T);
    if (!param_lanes) param_lanes = make_pipeline<bindings::param_lanes>(dev);
  }
  auto windows = [&](const Tensor& t, const Part& p, const char* name) { return state_rows(*this, t, p, name); };
  auto rows = [&](const Tensor& t, const Part& p) { return stream_rows(*this, t, p, T); };
  // the gradients of the states between parts: part i's dh0 and dconv_state, for part i-1
  std::vector<Tensor> dh0(plan.size()), dcs(plan.size()), da(plan.size()), db(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].first) {
      dh0[i] = Tensor(ctx, state_shape(1), "state gradient between parts");
      dcs[i] = Tensor(ctx, conv_state_shape(1), "conv state gradient between parts");
    }
    da[i] = Tensor(ctx, part_shape(g.da, plan[i]), "da (part)", g.da.dtype());
    db[i] = Tensor(ctx, part_shape(g.db, plan[i]), "db (part)", g.db.dtype());
  }
  for (auto* v : {&dh0, &dcs, &da, &db})  // they live until the work is done
    for (auto& t : *v)
      if (!t.empty()) retired.push_back(std::make_shared<Tensor>(t));
  run([&](gpu::Recorder& rec) {
    record_lanes(rec, lanes.size(), [&](gpu::Recorder& r, std::size_t l) {
      Work& w = work[l];
      bool first = true;
      for (std::size_t i : lanes[l]) {
        const Part& p = plan[i];
        const TapeState& pt = *st.part_tapes[i];
        States s;
        if (!p.last) {
          s.dht = dh0[i + 1];
          s.dconv_out = dcs[i + 1];
        } else if (dcarry) {
          s.dht = windows(dcarry->ht, p, "dht");
          s.dconv_out = windows(dcarry->conv_state, p, "dconv_state out");
        }
        DeviceGrads gp = g;
        gp.dqkv = rows(g.dqkv, p);
        gp.dz = rows(g.dz, p);
        gp.da = da[i];
        gp.db = db[i];
        gp.dh0 = !p.first ? dh0[i] : windows(g.dh0, p, "dh0");
        gp.dconv_state = !p.first ? dcs[i] : windows(g.dconv_state, p, "dconv_state");
        if (!pt.inputs.h0.empty()) s.dh0 = gp.dh0;
        if (lane_params) {  // lane l's sums
          const std::int64_t o = std::int64_t(l) * at.stride;
          gp.dconv = sub_tensor(lane_sums, o, g.dconv.shape(), "dconv (lane)");
          gp.dnorm = sub_tensor(lane_sums, o + at.dnorm, g.dnorm.shape(), "dnorm (lane)");
          gp.ddt_bias = sub_tensor(lane_sums, o + at.ddt_bias, g.ddt_bias.shape(), "ddt_bias (lane)");
          gp.da_log = sub_tensor(lane_sums, o + at.da_log, g.da_log.shape(), "da_log (lane)");
        }
        set_flags(s, pt.inputs);
        s.side_by_side = lanes.size() > 1;
        ensure(w.bwd, p.nb, p.nt, true, [&] { return family->backward_buffers(p.nb, p.nt); }, true);
        ensure(w.param_work, p.nb, p.nt, true, [&] { return param_buffers(p.nb, p.nt); }, true);
        record_backward_part(r, w, pt, rows(dout, p), gp, s, !first);
        first = false;
        for (auto [from, to] : {std::pair{&da[i], &g.da}, {&db[i], &g.db}})
          copy_rows(r, *from, 0, *to, (std::size_t(p.b0) * T + p.t0) * cfg.nv, std::size_t(from->numel()));
        r.barrier();
      }
    });
    if (lane_params) {
      Push pc;
      pc.nb = std::uint32_t(lanes.size());
      pc.nv = std::uint32_t(cfg.nv);
      pc.c_dim = std::uint32_t(cfg.channels());
      pc.kk = std::uint32_t(cfg.conv_taps);
      const std::uint64_t n = std::uint64_t(cfg.channels()) * cfg.conv_taps + kHeadDim + 2 * std::uint64_t(cfg.nv);
      rec.dispatch(*param_lanes,
                   bindings::param_lanes{.sums = view(lane_sums), .dconv = view(g.dconv), .dnorm = view(g.dnorm),
                                         .ddt_bias = view(g.ddt_bias), .da_log = view(g.da_log)},
                   pc, (n + 255) / 256);
      rec.mark("param_lanes");
    }
  });
}

}  // namespace gdn::detail
