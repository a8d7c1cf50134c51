// SPDX-License-Identifier: MIT
// gdn::Layer: the GatedDeltaNet layer (docs/spec.md) forward and backward on a Vulkan device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/context.hpp"
#include "gdn/error.hpp"
#include "gdn/tensor.hpp"

namespace gdn {

/// dk = dv = 128 for every linear-attention head this library serves.
inline constexpr int kHeadDim = 128;

/// Which kernel family runs the recurrence.
enum class Variant {
  Auto,      // the first that the device can run: chunked, subgroup, per-head
  Subgroup,  // column-split: four workgroups per head, 32 state columns each, subgroup reductions
  PerHead,   // one workgroup per (window, head), reductions through shared memory
  Chunked,   // a chunked backward (chunks of checkpoint_interval <= 32 tokens); a chunked forward on
             // matrix units (Config::matrix_units), else the subgroup forward
};
std::string_view to_string(Variant v);
/// "auto", "subgroup", "per-head", "chunked"; throws std::invalid_argument otherwise.
Variant parse_variant(std::string_view s);

/// How the matrix units multiply (the chunked family's matrix-unit kernels; the other kernels are fp32
/// either way).
enum class Precision {
  Exact,  // fp32 operands as fp16 pairs, three products each: float32 accuracy (docs/kernels.md)
  Fast,   // the state's products one fp16 product per operand pair (11 significant bits), the
          // others' right operand at 22 bits (the gate gradients' factor products as in Exact), fp32
          // accumulation, the operands scaled as in Exact: at most 1.5e-3 relative (docs/kernels.md);
          // opt-in
};
std::string_view to_string(Precision p);

/// The bounds Config::check enforces. Heads: models of this kind have tens to a few hundred, and
/// with these every size derived from a config fits 32-bit shader indexing per buffer. Conv taps: the
/// models use 4, and the conv kernels unroll the taps (their pipeline builds grow with K). Intervals:
/// the chunked family's chunk is at most 32 tokens (its shared-memory tiles); the other families'
/// replay segment at most 4096 steps.
inline constexpr int kMaxHeads = 4096;
inline constexpr int kMaxConvTaps = 16;
inline constexpr int kMaxChunk = 32;
inline constexpr int kMaxCheckpointInterval = 4096;

/// Shape and hyper-parameters of one layer.
struct Config {
  int nv = 48;                   // value heads
  int nk = 16;                   // key heads; nv % nk == 0
  int conv_taps = 4;             // K
  float rms_eps = 1e-6f;         // eps of the gated RMSNorm
  int checkpoint_interval = 0;   // tokens between state checkpoints: the subgroup and per-head
                                 // backward's replay segment; the chunked family's chunk length
                                 // (1 .. 32). 0: the family's default (8; chunked: 16)
  Variant variant = Variant::Auto;
  bool matrix_units = true;      // the chunked family's matrix-unit kernels (cooperative matrices,
                                 // fp32 operands split into fp16 pairs) where the device runs them;
                                 // resolved to whether they run. false: CUDA-core kernels only
  Precision precision = Precision::Exact;  // the matrix units' products; resolved to Exact where they
                                           // do not run (the kernels that run are fp32)
  bool param_grads = true;       // the backward makes the parameters' gradients (dconv, da_log, ddt_bias,
                                 // dnorm); false: it skips their passes and leaves them empty (frozen
                                 // parameters)
  bool check_finite = false;     // debugging a training run: every call reads back its inputs and
                                 // outputs and names the first NaN or Inf (an input's:
                                 // std::invalid_argument; an output's: gdn::Error). Slow. Also on
                                 // where the environment sets GDN_CHECK_FINITE=1
  int serial_split = 0;          // the matrix units' serial passes: workgroups per (window, value
                                 // head), each a share of the state's columns: 1, 2 or 4 (more keeps
                                 // more multiprocessors busy where the call has few windows, at the
                                 // cost of the forward's norm in a pass of its own). 0: the
                                 // layer's choice: the most of 4 and 2 whose workgroups the
                                 // device's multiprocessors hold at once, else 1
  int part_tokens = 0;           // a call whose buffers would exceed one storage binding's range runs
                                 // as parts (groups of whole windows, else runs of tokens of one
                                 // window with the state carried between them: docs/spec.md, "Long
                                 // calls"); > 0: also windows longer than this many tokens (rounded
                                 // down to a multiple of the checkpoint interval). 0: only where needed
                                 // (and on a driver that limits loop iterations, docs/spec.md)

  // C: q heads | k heads | v heads; nv * D. In 64 bits: exact for any int nv, nk.
  std::int64_t channels() const { return (2 * std::int64_t(nk) + nv) * kHeadDim; }
  std::int64_t value_dim() const { return std::int64_t(nv) * kHeadDim; }

  /// Throws std::invalid_argument naming the first field out of its bounds (above) or inconsistent
  /// with another (nv % nk, the chunked family's chunk length). Layer's constructor calls it.
  void check() const;
};

/// Whether a kernel family runs on a device at a config, and why not; no pipeline is built to tell.
struct FamilySupport {
  Variant variant = Variant::PerHead;
  bool runs = false;
  bool matrix_units = false;  // the chunked family: on the matrix units (Config::matrix_units permitting)
  int checkpoint_interval = 0;  // the interval it would take (the config's, or the family's default)
  std::string why_not;          // empty where it runs
  std::string matrix_units_why_not;  // the chunked family: why not on the matrix units (empty where it
                                     // runs there, and for the other families)
};
/// The families in the order Variant::Auto tries them (chunked, subgroup, per-head): Auto runs the
/// first that runs. Throws std::invalid_argument for a config out of bounds (Config::check).
std::vector<FamilySupport> family_support(const Context& ctx, const Config& cfg);

/// The layer's parameters, float32 (on the device: Layer::params()).
struct Params {
  std::vector<float> conv;     // [C, K], tap j reads position t-(K-1)+j
  std::vector<float> a_log;    // [nv]
  std::vector<float> dt_bias;  // [nv]
  std::vector<float> norm;     // [D]
};

/// Host inputs of one call; B windows of T tokens, row-major float32. The states a window starts
/// from are optional (empty: zero), e.g. the HostCarry of the window before.
struct HostInputs {
  std::span<const float> qkv;  // [B, T, C]
  std::span<const float> z;    // [B, T, nv*D]
  std::span<const float> a;    // [B, T, nv]
  std::span<const float> b;    // [B, T, nv]
  std::span<const float> h0 = {};          // [B, nv, D, D] recurrent state S[k][v] (FLA's [N, HV, K, V]: kv = Sᵀk̂)
  std::span<const float> conv_state = {};  // [B, K-1, C] the raw qkv rows before each window, oldest first
  /// Packed sequences (docs/spec.md, "Packed sequences"): N+1 offsets into one stream of B = 1 window
  /// (0 first, T last, increasing). Each sequence starts from its own state (row n of h0 and
  /// conv_state, which are then [N, ...], as are the carry and the states' gradients), else zero.
  std::span<const std::int64_t> cu_seqlens = {};
};
/// What a window leaves for the next (the next call's h0 and conv_state); in a backward, the
/// gradients of the loss with respect to them (empty: zero).
struct HostCarry {
  std::vector<float> ht;          // [B, nv, D, D] the state after the window's last token
  std::vector<float> conv_state;  // [B, K-1, C] the last K-1 raw qkv rows (of conv_state too, if T < K-1)
};

/// Gradients into the four input streams, and the parameters' (summed over the windows and tokens
/// of the call in a fixed order: two runs give bitwise the same sums).
struct HostGrads {
  std::vector<float> dqkv;  // [B, T, C]
  std::vector<float> dz;    // [B, T, nv*D]
  std::vector<float> da;    // [B, T, nv]
  std::vector<float> db;    // [B, T, nv]
  std::vector<float> dconv;     // [C, K]
  std::vector<float> da_log;    // [nv]
  std::vector<float> ddt_bias;  // [nv]
  std::vector<float> dnorm;     // [D]
  std::vector<float> dh0;          // [B, nv, D, D] where the forward was given h0 (else empty)
  std::vector<float> dconv_state;  // [B, K-1, C]
};

/// Device-resident inputs; B and T come from qkv's shape [B, T, C]; h0 and conv_state as
/// HostInputs' (empty tensors: zero).
struct DeviceInputs {
  Tensor qkv, z, a, b;
  Tensor h0 = {}, conv_state = {};
  std::vector<std::int64_t> cu_seqlens = {};  // packed sequences, as HostInputs'
};
/// Device-resident HostCarry: empty tensors are allocated by forward().
struct DeviceCarry {
  Tensor ht, conv_state;
};
/// Device-resident gradients (as HostGrads'); empty tensors are allocated by backward() (dh0 where
/// the forward had h0; the parameters' where Config::param_grads is on).
struct DeviceGrads {
  Tensor dqkv, dz, da, db;
  Tensor dconv, da_log, ddt_bias, dnorm;
  Tensor dh0 = {}, dconv_state = {};
};
/// The layer's parameters on the device: handles to the buffers its kernels read, which the caller
/// may read and overwrite between calls (an optimizer step of its own), at no pipeline cost.
struct ParamTensors {
  Tensor conv;     // [C, K]
  Tensor a_log;    // [nv]
  Tensor dt_bias;  // [nv]
  Tensor norm;     // [D]
};

/// GPU time of one kernel of the last call (with profiling on).
struct KernelTime {
  std::string name;
  double ms = 0;
  /// The bytes of the buffer ranges its dispatches bound (each once; absent tensors' slots and
  /// bindings the shader does not use left out) and its copies and fills moved: the memory its work
  /// touches, so what it moves at least where each byte is touched. 0 for "total".
  double bytes = 0;
};

namespace detail {
struct TapeState;
struct LayerImpl;
}  // namespace detail

/// What a forward records for its backward: the inputs (shared, not copied, in the device API: do
/// not overwrite them before the backward), the intermediates, and the state checkpoints.
/// Reusable: a forward into a tape of the same shape reuses its memory.
class Tape {
 public:
  Tape();
  ~Tape();
  Tape(Tape&&) noexcept;
  Tape& operator=(Tape&&) noexcept;

  bool recorded() const;
  int batch() const;
  int tokens() const;
  /// Device memory the tape holds, in all and per buffer.
  std::size_t device_bytes() const;
  std::vector<std::pair<std::string, std::size_t>> buffers() const;

 private:
  friend struct detail::LayerImpl;
  std::unique_ptr<detail::TapeState> state_;
};

/// Work of a Layer recorded into a caller's command buffer (Layer::record_forward, record_backward).
/// It holds what that work reads when it executes (descriptor sets, the device): destroy it only
/// once the caller's submission of the command buffer has completed.
class Recorded {
 public:
  Recorded();
  ~Recorded();
  Recorded(Recorded&&) noexcept;
  Recorded& operator=(Recorded&&) noexcept;

 private:
  friend class Layer;
  std::shared_ptr<void> held_;
};

namespace detail {
struct PendingState;
}
/// Work of a Layer submitted without waiting (Layer::submit_forward, submit_backward). Its outputs
/// are readable once wait() has returned; destroying it waits.
class Pending {
 public:
  Pending();
  ~Pending();
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  /// Until the work has completed. Throws gdn::Error if the device failed.
  void wait();
  /// Whether it has completed (no waiting).
  bool done();

 private:
  friend class Layer;
  std::shared_ptr<detail::PendingState> state_;
};

class Layer {
 public:
  /// Builds the pipelines of the chosen variant. Throws std::invalid_argument on an inconsistent
  /// config or parameter sizes, gdn::Error when the device cannot run the variant.
  Layer(std::shared_ptr<Context> ctx, const Config& config, const Params& params);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  /// The config, with Auto and a default checkpoint interval resolved to what runs.
  const Config& config() const;
  /// The variant that runs (Auto resolved).
  Variant variant() const;
  Context& context() const;

  // ---- host API: spans in, vectors out (one upload and one download per call) ----
  /// out [B, T, nv*D]. With a tape, records what backward() needs; with `carry`, writes the states
  /// the window leaves (ht, conv_state) into it.
  std::vector<float> forward(int batch, int tokens, const HostInputs& in, Tape* tape = nullptr,
                             HostCarry* carry = nullptr);
  /// Gradients for the output gradient dout [B, T, nv*D] of the forward recorded in `tape`, and, where
  /// `dcarry` is given, of the states it left (dcarry->ht: dht; dcarry->conv_state: the conv state
  /// out's; either empty: zero).
  HostGrads backward(const Tape& tape, std::span<const float> dout, const HostCarry* dcarry = nullptr);

  // ---- device API: tensors stay on the device between calls ----
  /// Writes out [B, T, nv*D] (allocated if empty). With a tape, records what backward() needs; with
  /// `carry`, writes the states the window leaves.
  void forward(const DeviceInputs& in, Tensor& out, Tape* tape = nullptr, DeviceCarry* carry = nullptr);
  void backward(const Tape& tape, const Tensor& dout, DeviceGrads& grads, const DeviceCarry* dcarry = nullptr);

  // ---- recorded into a caller's command buffer ----
  /// As forward() and backward() of the device API, recorded into `vk_command_buffer` (a
  /// VkCommandBuffer of the Context's device, in the recording state, for a queue of the Context's
  /// queue family) instead of run: nothing is submitted or waited for. The recorded work begins with
  /// a barrier that makes compute-shader and transfer writes recorded before it visible to its
  /// reads, and ends with one that makes its writes visible to compute shaders and transfers after
  /// it (other stages are the caller's to synchronize). Tensors, the tape and the carry are used
  /// when the command buffer executes: keep them, unwritten by others, until it has; a backward
  /// recorded after its forward in the same command buffer reads what the forward wrote. Outputs,
  /// tape and workspace buffers are allocated at recording. Not with Config::check_finite (it reads
  /// results back); profiling makes no timings of recorded work.
  Recorded record_forward(void* vk_command_buffer, const DeviceInputs& in, Tensor& out, Tape* tape = nullptr,
                          DeviceCarry* carry = nullptr);
  Recorded record_backward(void* vk_command_buffer, const Tape& tape, const Tensor& dout, DeviceGrads& grads,
                           const DeviceCarry* dcarry = nullptr);

  /// As forward() and backward() of the device API, submitted to the device's queue without waiting:
  /// the host goes on while the GPU works; the same rules as record_forward for what the work uses.
  /// Calls of the layer that follow are queued after it (the queue runs submissions in order).
  Pending submit_forward(const DeviceInputs& in, Tensor& out, Tape* tape = nullptr, DeviceCarry* carry = nullptr);
  Pending submit_backward(const Tape& tape, const Tensor& dout, DeviceGrads& grads, const DeviceCarry* dcarry = nullptr);

  /// The parameters as device tensors (shared, not copied: writes to them change the layer's).
  ParamTensors params() const;
  /// Uploads new parameters (sizes as the constructor's); no pipeline is rebuilt.
  void set_params(const Params& params);

  /// With profiling on, every call times each kernel with GPU timestamp queries.
  void set_profiling(bool on);
  /// Per-kernel GPU times of the last call; the last entry is named "total".
  const std::vector<KernelTime>& last_timings() const;
  /// Device memory the layer holds besides tapes (parameters, forward and backward workspaces).
  std::size_t workspace_bytes() const;

 private:
  std::unique_ptr<detail::LayerImpl> impl_;
};

}  // namespace gdn
