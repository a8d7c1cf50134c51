// SPDX-License-Identifier: MIT
// Config::precision fast (docs/kernels.md, "Fast precision"): fp16 products on the matrix units
// (single for the state's, all three for the pair pass's with chunk_factors' factors, the right
// operand at 22 bits for the rest), fp32 accumulation, the operands scaled as in the exact mode.
// Where the matrix units run, every output and gradient is within the bound of the float64
// reference at T 512, at unit scale and at the scales training feeds the layer (dout x 2^-27 and
// x 2^16, qkv x 1e-2 and x 1e3), and a 1% parameter error fails that bound. Where they do not run
// (lavapipe in CI), the layer resolves the precision to exact (the kernels that run are fp32) and
// says so.
#include <cstdio>

#include "test_support.hpp"

namespace gdn::test {
namespace {

// Relative L2 error per output, measured on the H100: 2.4e-4 to 9.3e-4 at every scale here (the
// largest db's at qkv x 1e3; da_log and ddt_bias 2.4e-4 to 5.1e-4). The bound is FLA's fp32 layer's
// measured error.
constexpr double kFastTolerance = 1.5e-3;

constexpr int kB = 1, kT = 512;

Config fast_config() {
  return Config{.nv = 4, .nk = 2, .conv_taps = 4, .rms_eps = 1e-6f, .variant = Variant::Chunked,
                .precision = Precision::Fast};
}

// Expects out and every gradient (the reference's scaled by s, dout's scale) within its bound.
void expect_within_bounds(const HostGrads& g, const Expected& want, double s, const std::vector<float>& out) {
  auto expect = [](const std::string& name, double e) {
    std::printf("[gdn]   %-9s rel L2 error %.3e (bound %.1e)\n", name.c_str(), e, kFastTolerance);
    EXPECT_LE(e, kFastTolerance) << name;  // (NaN fails it too)
  };
  expect("out", rel_l2(out, want.out));
  for (const auto& [name, got, expected] : named_grads(g, want)) {
    std::vector<double> scaled(expected);
    for (auto& x : scaled) x *= s;
    expect(name, rel_l2(got, scaled));
  }
}

TEST_F(DeviceTest, FastPrecisionResolvesToWhatRuns) {
  const Config cfg = fast_config();
  Layer layer(context(), cfg, random_params(cfg, 61));
  if (layer.config().matrix_units) {
    EXPECT_EQ(layer.config().precision, Precision::Fast);
  } else {
    EXPECT_EQ(layer.config().precision, Precision::Exact);
    std::printf("[gdn] %s has no matrix units: precision fast resolves to exact (fp32 kernels run)\n",
                context()->device().name.c_str());
  }
  Config cuda = cfg;
  cuda.matrix_units = false;
  EXPECT_EQ(Layer(context(), cuda, random_params(cfg, 61)).config().precision, Precision::Exact);
}

TEST_F(DeviceTest, FastPrecisionWithinItsBoundAtEveryScale) {
  const Config cfg = fast_config();
  const Params p = random_params(cfg, 62);
  Layer layer(context(), cfg, p);
  if (!layer.config().matrix_units)
    GTEST_SKIP() << "no matrix units on " << context()->device().name << ": the exact kernels run (FastPrecisionResolvesToWhatRuns)";
  for (const float qs : {1.0f, 1e-2f, 1e3f}) {
    Batch x = random_batch(cfg, kB, kT, 606);
    for (auto& v : x.qkv) v *= qs;
    const Expected want = reference_batch(cfg, p, x, kB, kT);
    Tape tape;
    const auto out = layer.forward(kB, kT, {x.qkv, x.z, x.a, x.b}, &tape);
    for (const int e : (qs == 1.0f ? std::vector<int>{0, -27, 16} : std::vector<int>{0})) {
      const float s = std::ldexp(1.0f, e);
      std::vector<float> dout(x.dout);
      for (auto& v : dout) v *= s;
      std::printf("[gdn] precision fast, T %d, qkv x %g, dout x 2^%d:\n", kT, double(qs), e);
      expect_within_bounds(layer.backward(tape, dout), want, double(s), out);
    }
  }
}

// The fast mode with every boundary stream bfloat16 (docs/spec.md), against the reference fed the
// same rounded inputs: out and the inputs' gradients (bfloat16) against its outputs rounded once,
// within the bfloat16 streams' bound, kBf16Tolerance (rounded once on each side, an element whose
// error e before the rounding crosses a rounding boundary differs by a bfloat16 ulp, 2^-8 relative,
// so e becomes about sqrt(e 2^-8) relative L2: 1.9e-3 for the fast mode's largest, 9.3e-4); the
// parameters' gradients (float32) within the fast bound.
TEST_F(DeviceTest, FastPrecisionWithBf16Streams) {
  const Config cfg = fast_config();
  const Params p = random_params(cfg, 64);
  Layer layer(context(), cfg, p);
  if (!layer.config().matrix_units)
    GTEST_SKIP() << "no matrix units on " << context()->device().name << ": the exact kernels run (FastPrecisionResolvesToWhatRuns)";
  for (const float qs : {1.0f, 1e-2f, 1e3f}) {
    Batch x = random_batch(cfg, kB, kT, 808);
    for (auto& v : x.qkv) v *= qs;
    const auto [want, out, g] = bf16_step(layer, cfg, p, x, kB, kT);
    std::printf("[gdn] precision fast, bfloat16 streams, T %d, qkv x %g:\n", kT, double(qs));
    expect_streams_close(out, g, want);
    expect_close("dconv", g.dconv.download(), want.dconv, kFastTolerance);
    expect_close("da_log", g.da_log.download(), want.da_log, kFastTolerance);
    expect_close("ddt_bias", g.ddt_bias.download(), want.ddt_bias, kFastTolerance);
    expect_close("dnorm", g.dnorm.download(), want.dnorm, kFastTolerance);
  }
}

// The bound must catch a wrong result: the norm weight off by 1% moves the output by 1%.
TEST_F(DeviceTest, FastPrecisionBoundCatchesAOnePercentError) {
  const Config cfg = fast_config();
  Params p = random_params(cfg, 63);
  const Batch x = random_batch(cfg, kB, kT, 707);
  const Expected want = reference_batch(cfg, p, x, kB, kT);
  for (auto& w : p.norm) w *= 1.01f;
  Layer layer(context(), cfg, p);
  const auto out = layer.forward(kB, kT, {x.qkv, x.z, x.a, x.b});
  EXPECT_GT(rel_l2(out, want.out), kFastTolerance);
}

}  // namespace
}  // namespace gdn::test
