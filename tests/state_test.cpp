// SPDX-License-Identifier: MIT
// States carried in and out of a call (docs/spec.md, "Carried state"), on every family: the
// recurrent state h0 -> ht and the conv state, their gradients (dht -> dh0, the conv state out's ->
// dconv_state), against the float64 reference; and two windows run back to back with the state
// carried equal to one window of twice the length, forward and backward.
#include <gtest/gtest.h>

#include <cstdio>

#include "test_support.hpp"

namespace gdn::test {
namespace {

constexpr double kTolerance = 2e-4;

struct Shape {
  int B, T;
};

class States : public FamilyTest {
 protected:
  Config config() const {
    return Config{.nv = 4, .nk = 2, .conv_taps = 4, .rms_eps = 1e-6f, .variant = GetParam().variant,
                  .matrix_units = GetParam().matrix_units, .serial_split = GetParam().serial_split};
  }
  static void check(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                    double tolerance = kTolerance) {
    expect_close(what, got, want, tolerance);
  }
  // Random states in and state gradients for a batch of B windows.
  static void add_states(const Config& cfg, Batch& x, int B, std::uint64_t seed) {
    const std::size_t S = std::size_t(B) * cfg.nv * kHeadDim * kHeadDim,
                      CS = std::size_t(B) * (cfg.conv_taps - 1) * cfg.channels();
    x.h0 = uniform(S, seed, -0.3f, 0.3f);
    x.conv_state = uniform(CS, seed + 1, -1, 1);
    x.dht = uniform(S, seed + 2, -0.3f, 0.3f);
    x.dconv_out = uniform(CS, seed + 3, -1, 1);
  }
};

// Every output against the reference, with every state given; T below K-1 (the conv state out
// takes rows of the conv state in), within a chunk, and over several chunks.
TEST_P(States, MatchReference) {
  const Config cfg = config();
  const Params p = random_params(cfg, 7);
  Layer layer(context(), cfg, p);
  for (const Shape sh : {Shape{2, 2}, Shape{2, 13}, Shape{1, 45}}) {
    Batch x = random_batch(cfg, sh.B, sh.T, 17);
    add_states(cfg, x, sh.B, 27);
    const Expected want = reference_batch(cfg, p, x, sh.B, sh.T);
    Tape tape;
    HostCarry carry;
    const auto out = layer.forward(sh.B, sh.T,
                                   {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .h0 = x.h0, .conv_state = x.conv_state},
                                   &tape, &carry);
    const HostCarry dcarry{x.dht, x.dconv_out};
    const auto g = layer.backward(tape, x.dout, &dcarry);
    std::printf("[gdn] B %d, T %d, %s:\n", sh.B, sh.T, GetParam().name);
    check("out", out, want.out);
    check("ht", carry.ht, want.ht);
    check("conv_state out", carry.conv_state, want.conv_state_out, 0);  // copies
    for (const auto& [name, got, expected] : named_grads(g, want)) check(name, got, expected);
    check("dh0", g.dh0, want.dh0);
    check("dconv_state", g.dconv_state, want.dconv_state);
  }
}

// Without states nothing of them is read, and dh0 is not made; states given as zeros give bitwise
// the outputs and gradients of a call without them, and dh0 and dconv_state the true gradients at
// zero.
TEST_P(States, AbsentMeansZero) {
  const Config cfg = config();
  const Params p = random_params(cfg, 8);
  Layer layer(context(), cfg, p);
  const int B = 2, T = 21;
  Batch x = random_batch(cfg, B, T, 18);
  const Expected want = reference_batch(cfg, p, x, B, T);
  Tape tape;
  HostCarry carry;
  const auto out = layer.forward(B, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &tape, &carry);
  const auto g = layer.backward(tape, x.dout);
  EXPECT_TRUE(g.dh0.empty());
  check("dconv_state", g.dconv_state, want.dconv_state);
  check("ht", carry.ht, want.ht);

  const std::vector<float> zs(std::size_t(B) * cfg.nv * kHeadDim * kHeadDim, 0.0f),
      zc(std::size_t(B) * (cfg.conv_taps - 1) * cfg.channels(), 0.0f);
  Tape tape0;
  const auto out0 =
      layer.forward(B, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .h0 = zs, .conv_state = zc}, &tape0);
  const HostCarry dzero{zs, zc};
  const auto g0 = layer.backward(tape0, x.dout, &dzero);
  EXPECT_EQ(out0, out);
  EXPECT_EQ(g0.dqkv, g.dqkv);
  EXPECT_EQ(g0.da, g.da);
  EXPECT_EQ(g0.dconv_state, g.dconv_state);
  check("dh0", g0.dh0, want.dh0);
}

// Window 1 (T1 tokens) then window 2 (T2) with its carry equals one window of T1 + T2: outputs, and
// gradients when window 2's backward hands its dh0 and dconv_state to window 1's as dht and the conv
// state out's gradient.
TEST_P(States, TwoWindowsEqualOne) {
  const Config cfg = config();
  const Params p = random_params(cfg, 9);
  Layer layer(context(), cfg, p);
  const int B = 2, T1 = 19, T2 = 26, T = T1 + T2;
  const Batch x = random_batch(cfg, B, T, 19);
  const Expected want = reference_batch(cfg, p, x, B, T);
  // window w's rows [from, from + n) of a [B, T, cols] stream
  auto part = [&](const std::vector<float>& v, int from, int n, std::int64_t cols) {
    std::vector<float> out;
    for (int b = 0; b < B; ++b)
      out.insert(out.end(), v.begin() + (std::size_t(b) * T + from) * cols, v.begin() + (std::size_t(b) * T + from + n) * cols);
    return out;
  };
  auto inputs = [&](int from, int n) {
    return Batch{part(x.qkv, from, n, cfg.channels()), part(x.z, from, n, cfg.value_dim()), part(x.a, from, n, cfg.nv),
                 part(x.b, from, n, cfg.nv), part(x.dout, from, n, cfg.value_dim())};
  };
  const Batch w1 = inputs(0, T1), w2 = inputs(T1, T2);
  Tape t1, t2;
  HostCarry c1;
  const auto o1 = layer.forward(B, T1, {.qkv = w1.qkv, .z = w1.z, .a = w1.a, .b = w1.b}, &t1, &c1);
  const auto o2 = layer.forward(
      B, T2, {.qkv = w2.qkv, .z = w2.z, .a = w2.a, .b = w2.b, .h0 = c1.ht, .conv_state = c1.conv_state}, &t2);
  const auto g2 = layer.backward(t2, w2.dout);
  const HostCarry d1{g2.dh0, g2.dconv_state};
  const auto g1 = layer.backward(t1, w1.dout, &d1);
  // the two windows' rows interleaved back into [B, T, cols]
  auto join = [&](const std::vector<float>& a, const std::vector<float>& b, std::int64_t cols) {
    std::vector<float> out;
    for (int w = 0; w < B; ++w) {
      out.insert(out.end(), a.begin() + std::size_t(w) * T1 * cols, a.begin() + std::size_t(w + 1) * T1 * cols);
      out.insert(out.end(), b.begin() + std::size_t(w) * T2 * cols, b.begin() + std::size_t(w + 1) * T2 * cols);
    }
    return out;
  };
  std::printf("[gdn] %d + %d tokens, %s:\n", T1, T2, GetParam().name);
  check("out", join(o1, o2, cfg.value_dim()), want.out);
  check("dqkv", join(g1.dqkv, g2.dqkv, cfg.channels()), want.dqkv);
  check("dz", join(g1.dz, g2.dz, cfg.value_dim()), want.dz);
  check("da", join(g1.da, g2.da, cfg.nv), want.da);
  check("db", join(g1.db, g2.db, cfg.nv), want.db);
  std::vector<float> dconv(g1.dconv.size());
  for (std::size_t i = 0; i < dconv.size(); ++i) dconv[i] = g1.dconv[i] + g2.dconv[i];
  check("dconv", dconv, want.dconv);
}

// Frozen parameters (Config::param_grads off): the same input gradients, bitwise, and no parameter
// gradients.
TEST_P(States, FrozenParametersGiveTheSameInputGradients) {
  Config cfg = config();
  const Params p = random_params(cfg, 11);
  Layer trained(context(), cfg, p);
  cfg.param_grads = false;
  Layer frozen(context(), cfg, p);
  const Batch x = random_batch(cfg, 2, 9, 21);
  const HostInputs in{.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b};
  Tape t1, t2;
  trained.forward(2, 9, in, &t1);
  frozen.forward(2, 9, in, &t2);
  const auto g1 = trained.backward(t1, x.dout), g2 = frozen.backward(t2, x.dout);
  EXPECT_EQ(g2.dqkv, g1.dqkv);
  EXPECT_EQ(g2.da, g1.da);
  EXPECT_EQ(g2.dh0, g1.dh0);
  EXPECT_TRUE(g2.dconv.empty() && g2.da_log.empty() && g2.ddt_bias.empty() && g2.dnorm.empty());
  EXPECT_FALSE(g1.dconv.empty());
}

// A state of the wrong shape is refused, naming it and both shapes.
TEST_P(States, WrongShapesAreRefused) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 10));
  const Batch x = random_batch(cfg, 1, 5, 20);
  const std::vector<float> short_state(100);
  try {
    layer.forward(1, 5, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .h0 = short_state});
    ADD_FAILURE() << "a short h0 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("h0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[B, nv, D, D] = [1, 4, 128, 128]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer.forward(1, 5, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .conv_state = short_state}),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Families, States, ::testing::ValuesIn(kFamilies), family_name);
INSTANTIATE_TEST_SUITE_P(Splits, States, ::testing::ValuesIn(kSplits), family_name);

}  // namespace
}  // namespace gdn::test
