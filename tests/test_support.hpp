// SPDX-License-Identifier: MIT
// Shared by the device tests: the one Context (with the validation layer where installed), random
// inputs, the float64 reference on a window of a batch, and the error measure.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gdn/gdn.hpp"
#include "gdn/reference.hpp"

namespace gdn::test {

/// A kernel family as the config asks for it. The chunked family runs its matrix-unit kernels (chunk
/// length 16) where the device has them; chunked_cuda_cores keeps it on the CUDA-core kernels there
/// (elsewhere the two are the same kernels).
struct Family {
  const char* name;
  Variant variant;
  bool matrix_units;
  int serial_split = 0;  // Config::serial_split (the matrix units')
};
inline void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }
inline constexpr Family kPerHead{"per_head", Variant::PerHead, true}, kSubgroup{"subgroup", Variant::Subgroup, true},
    kChunked{"chunked", Variant::Chunked, true}, kChunkedCudaCores{"chunked_cuda_cores", Variant::Chunked, false};
inline constexpr Family kFamilies[] = {kPerHead, kSubgroup, kChunked, kChunkedCudaCores};
/// The matrix units' serial passes as 1 and 2 workgroups per head (Config::serial_split): the tests'
/// small shapes leave the layer's choice at 4 on a large GPU, so the suites that check every output
/// (Scales, States, Bf16) run the other two too; where no matrix units run they skip (FamilyTest).
inline constexpr Family kChunkedSplit1{"chunked_split1", Variant::Chunked, true, 1},
    kChunkedSplit2{"chunked_split2", Variant::Chunked, true, 2};
inline constexpr Family kSplits[] = {kChunkedSplit1, kChunkedSplit2};
/// gtest's name of a test parameterised by family.
inline std::string family_name(const ::testing::TestParamInfo<Family>& i) { return i.param.name; }

/// The Context every device test shares; validation errors are collected, not printed.
std::shared_ptr<Context> context();
/// Validation-layer errors since the last call (and clears them).
std::vector<std::string> take_validation_errors();

/// Fails the test on any validation-layer error raised during it.
class DeviceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& e : take_validation_errors()) ADD_FAILURE() << "Vulkan validation error: " << e;
  }
};

/// A device test parameterised by family; a kSplits family skips where the device has no matrix units.
class FamilyTest : public DeviceTest, public ::testing::WithParamInterface<Family> {
 protected:
  void SetUp() override {
    if (GetParam().serial_split && !context()->device().matrix_f16_16x16x16)
      GTEST_SKIP() << "Config::serial_split splits the matrix units' passes, and " << context()->device().name
                   << " has none";
  }
};

inline std::vector<float> uniform(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Parameters like a trained layer's: conv taps ~U(-0.5, 0.5), a_log spread over heads, norm ~1.
inline Params random_params(const Config& cfg, std::uint64_t seed) {
  Params p;
  p.conv = uniform(std::size_t(cfg.channels()) * cfg.conv_taps, seed, -0.5f, 0.5f);
  p.a_log = uniform(cfg.nv, seed + 1, -1.0f, 0.5f);
  p.dt_bias = uniform(cfg.nv, seed + 2, -0.5f, 0.5f);
  p.norm = uniform(kHeadDim, seed + 3, 0.7f, 1.3f);
  return p;
}

struct Batch {
  std::vector<float> qkv, z, a, b, dout;
  // optional states (empty: zero): h0 [B, nv, D, D], conv_state [B, K-1, C], and the gradients of
  // the states a window leaves, dht and dconv_out (the conv state out's)
  std::vector<float> h0, conv_state, dht, dconv_out;
};

inline Batch random_batch(const Config& cfg, int B, int T, std::uint64_t seed) {
  const std::size_t BT = std::size_t(B) * T;
  return {uniform(BT * cfg.channels(), seed, -1, 1), uniform(BT * cfg.value_dim(), seed + 1, -1, 1),
          uniform(BT * cfg.nv, seed + 2, -1, 1), uniform(BT * cfg.nv, seed + 3, -1, 1),
          uniform(BT * cfg.value_dim(), seed + 4, -1, 1)};
}

/// Reference outputs and gradients of a whole batch, float64, laid out like the device's.
struct Expected {
  std::vector<double> out, dqkv, dz, da, db;
  std::vector<double> dconv, da_log, ddt_bias, dnorm;  // summed over the windows
  std::vector<double> ht, conv_state_out, dh0, dconv_state;
};

/// A backward's gradients beside the reference's, by name (the states' gradients apart: only the
/// tests that carry states have them).
struct NamedGrad {
  const char* name;
  const std::vector<float>& got;
  const std::vector<double>& want;
};
inline std::array<NamedGrad, 8> named_grads(const HostGrads& g, const Expected& want) {
  return {{{"dqkv", g.dqkv, want.dqkv},
           {"dz", g.dz, want.dz},
           {"da", g.da, want.da},
           {"db", g.db, want.db},
           {"dconv", g.dconv, want.dconv},
           {"da_log", g.da_log, want.da_log},
           {"ddt_bias", g.ddt_bias, want.ddt_bias},
           {"dnorm", g.dnorm, want.dnorm}}};
}

inline reference::Mat window(const std::vector<float>& v, int b, int T, int cols) {
  reference::Mat m(T, cols);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < cols; ++c) m(t, c) = v[(std::size_t(b) * T + t) * cols + c];
  return m;
}

inline void append(std::vector<double>& dst, const reference::Mat& m) {
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) dst.push_back(m(r, c));
}

inline Expected reference_batch(const Config& cfg, const Params& p, const Batch& x, int B, int T) {
  reference::Dims d{.T = T, .nv = cfg.nv, .nk = cfg.nk, .K = cfg.conv_taps, .D = kHeadDim, .eps = cfg.rms_eps};
  reference::Weights w;
  w.conv = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(p.conv.data(), cfg.channels(), cfg.conv_taps).cast<double>();
  w.a_log = Eigen::Map<const Eigen::VectorXf>(p.a_log.data(), cfg.nv).cast<double>();
  w.dt_bias = Eigen::Map<const Eigen::VectorXf>(p.dt_bias.data(), cfg.nv).cast<double>();
  w.norm = Eigen::Map<const Eigen::VectorXf>(p.norm.data(), kHeadDim).cast<double>();
  Expected e;
  const int K1 = cfg.conv_taps - 1;
  const std::size_t S = std::size_t(cfg.nv) * kHeadDim;  // rows of one window's state [nv*D, D]
  auto state = [&](const std::vector<float>& v, int b) {  // window b's [nv*D, D], or empty
    return v.empty() ? reference::Mat() : window(v, b, int(S), kHeadDim);
  };
  auto conv_rows = [&](const std::vector<float>& v, int b) {  // window b's [K-1, C], or empty
    return v.empty() ? reference::Mat() : window(v, b, K1, int(cfg.channels()));
  };
  reference::Mat dconv = reference::Mat::Zero(cfg.channels(), cfg.conv_taps);
  reference::Vec da_log = reference::Vec::Zero(cfg.nv), ddt_bias = reference::Vec::Zero(cfg.nv),
                 dnorm = reference::Vec::Zero(kHeadDim);
  for (int b = 0; b < B; ++b) {
    reference::Window win{window(x.qkv, b, T, cfg.channels()), window(x.z, b, T, cfg.value_dim()),
                          window(x.a, b, T, cfg.nv), window(x.b, b, T, cfg.nv), state(x.h0, b),
                          conv_rows(x.conv_state, b)};
    reference::Carry carry;
    append(e.out, reference::forward(d, w, win, &carry));
    append(e.ht, carry.ht);
    append(e.conv_state_out, carry.conv_state);
    const reference::Carry dcarry{state(x.dht, b), conv_rows(x.dconv_out, b)};
    const auto g = reference::backward(d, w, win, window(x.dout, b, T, cfg.value_dim()), &dcarry);
    append(e.dh0, g.dh0);
    append(e.dconv_state, g.dconv_state);
    append(e.dqkv, g.dqkv);
    append(e.dz, g.dz);
    append(e.da, g.da);
    append(e.db, g.db);
    dconv += g.dconv;
    da_log += g.da_log;
    ddt_bias += g.ddt_bias;
    dnorm += g.dnorm;
  }
  append(e.dconv, dconv);
  e.da_log.assign(da_log.data(), da_log.data() + da_log.size());
  e.ddt_bias.assign(ddt_bias.data(), ddt_bias.data() + ddt_bias.size());
  e.dnorm.assign(dnorm.data(), dnorm.data() + dnorm.size());
  return e;
}

/// A device tensor of `shape` and dtype d holding v (rounded to bfloat16 where d is), on context().
inline Tensor device_tensor(const std::vector<float>& v, std::vector<std::int64_t> shape, const char* name, DType d) {
  Tensor t(context(), std::move(shape), name, d);
  t.upload(v);
  return t;
}

/// The batch's input streams (qkv, z, a, b of B windows of T tokens) as device tensors of dtype d.
inline DeviceInputs device_inputs(const Config& cfg, const Batch& x, int B, int T, DType d) {
  return {device_tensor(x.qkv, {B, T, cfg.channels()}, "qkv", d), device_tensor(x.z, {B, T, cfg.value_dim()}, "z", d),
          device_tensor(x.a, {B, T, cfg.nv}, "a", d), device_tensor(x.b, {B, T, cfg.nv}, "b", d)};
}

/// v rounded to bfloat16 (to nearest even, as gdn::to_bfloat16) and widened back.
inline std::vector<float> bf16_rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = from_bfloat16(to_bfloat16(v[i]));
  return r;
}
inline std::vector<double> bf16_rounded(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = from_bfloat16(to_bfloat16(float(v[i])));
  return r;
}

/// ||got - want|| / ||want||; NaN when got holds a NaN or Inf (an unwritten or poisoned element).
inline double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline std::size_t count_nonfinite(const std::vector<float>& v) {
  std::size_t n = 0;
  for (float x : v) n += !std::isfinite(x);
  return n;
}

/// Expects got within `tolerance` (relative L2) of want and every element finite (outputs are
/// poisoned with NaN first: a NaN is an unwritten element); prints the error reached.
inline void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                         double tolerance) {
  const double err = rel_l2(got, want);
  std::printf("[gdn]   %-15s rel L2 error %.3e\n", what, err);
  EXPECT_EQ(count_nonfinite(got), 0u) << what << ": NaN or Inf (unwritten element?)";
  EXPECT_LE(err, tolerance) << what;
}

// Outputs stored as bfloat16, against the reference's rounded once: each element is off by at most
// half a bfloat16 ulp (2^-9 relative) of its own rounding and the fp32 error before it; the relative
// L2 error is about 2^-9 / sqrt(3) = 1.1e-3 over many elements.
inline constexpr double kBf16Tolerance = 4e-3;

/// The bfloat16 output streams (out, dqkv, dz, da, db) against the reference's, rounded once.
inline void expect_streams_close(const Tensor& out, const DeviceGrads& g, const Expected& want) {
  expect_close("out", out.download(), bf16_rounded(want.out), kBf16Tolerance);
  expect_close("dqkv", g.dqkv.download(), bf16_rounded(want.dqkv), kBf16Tolerance);
  expect_close("dz", g.dz.download(), bf16_rounded(want.dz), kBf16Tolerance);
  expect_close("da", g.da.download(), bf16_rounded(want.da), kBf16Tolerance);
  expect_close("db", g.db.download(), bf16_rounded(want.db), kBf16Tolerance);
}

/// A forward (tape) and backward of B windows of T tokens with every stream bfloat16: x's streams
/// (qkv, z, a, b, dout) are rounded to bfloat16 in place, and the reference is fed them.
struct Bf16Step {
  Expected want;
  Tensor out;
  DeviceGrads g;
};
inline Bf16Step bf16_step(Layer& layer, const Config& cfg, const Params& p, Batch& x, int B, int T) {
  const auto bf = DType::BFloat16;
  for (auto* v : {&x.qkv, &x.z, &x.a, &x.b, &x.dout}) *v = bf16_rounded(*v);
  Bf16Step r{reference_batch(cfg, p, x, B, T), {}, {}};
  const DeviceInputs in = device_inputs(cfg, x, B, T, bf);
  Tape tape;
  layer.forward(in, r.out, &tape);
  layer.backward(tape, device_tensor(x.dout, {B, T, cfg.value_dim()}, "dout", bf), r.g);
  return r;
}

}  // namespace gdn::test
