// SPDX-License-Identifier: MIT
// Packed sequences (docs/spec.md, "Packed sequences"): one stream of sequences of different lengths
// (cu_seqlens) gives each sequence's outputs and gradients as the same sequence run alone, on every
// family; bad offsets are refused naming the index.
#include <gtest/gtest.h>

#include <cstdio>

#include "test_support.hpp"

namespace gdn::test {
namespace {

// Packed against separate: the same arithmetic per sequence, so fp32 rounding apart (the parameters'
// gradients add the sequences in another order).
constexpr double kTolerance = 1e-5;

void check(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  expect_close(what, got, std::vector<double>(want.begin(), want.end()), kTolerance);
}
std::vector<float> slice(const std::vector<float>& v, std::size_t from, std::size_t n) {
  return {v.begin() + std::ptrdiff_t(from), v.begin() + std::ptrdiff_t(from + n)};
}

class Packed : public DeviceTest, public ::testing::WithParamInterface<Family> {
 protected:
  Config config() const {
    return Config{.nv = 4, .nk = 2, .conv_taps = 4, .rms_eps = 1e-6f, .variant = GetParam().variant,
                  .matrix_units = GetParam().matrix_units};
  }
};

// The sequences of `cu` in one stream, each with its own h0, conv state and state gradients: every
// output and gradient of each sequence equals its run alone, and the parameters' gradients their sums;
// a second backward from the same tape gives them bitwise again (the lanes add in a fixed order).
void packed_equals_alone(Layer& layer, const Config& cfg, const std::vector<std::int64_t>& cu) {
  const int N = int(cu.size()) - 1, T = int(cu.back());
  const std::size_t C = std::size_t(cfg.channels()), V = std::size_t(cfg.value_dim()), nv = std::size_t(cfg.nv),
                    S = nv * kHeadDim * kHeadDim, CS = 3 * C;
  Batch x = random_batch(cfg, 1, T, 91);
  x.h0 = uniform(N * S, 92, -0.3f, 0.3f);
  x.conv_state = uniform(N * CS, 93, -1, 1);
  x.dht = uniform(N * S, 94, -0.3f, 0.3f);
  x.dconv_out = uniform(N * CS, 95, -1, 1);
  Tape tape;
  HostCarry carry;
  const auto out = layer.forward(1, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .h0 = x.h0,
                                        .conv_state = x.conv_state, .cu_seqlens = cu},
                                 &tape, &carry);
  const HostCarry dcarry{x.dht, x.dconv_out};
  const HostGrads g = layer.backward(tape, x.dout, &dcarry);
  ASSERT_EQ(carry.ht.size(), N * S);
  ASSERT_EQ(g.dh0.size(), N * S);
  const HostGrads again = layer.backward(tape, x.dout, &dcarry);
  EXPECT_EQ(again.dconv, g.dconv);
  EXPECT_EQ(again.dnorm, g.dnorm);
  EXPECT_EQ(again.da_log, g.da_log);
  EXPECT_EQ(again.ddt_bias, g.ddt_bias);
  std::vector<float> dconv(g.dconv.size()), dnorm(g.dnorm.size()), da_log(nv), ddt_bias(nv);
  for (int n = 0; n < N; ++n) {
    const std::size_t t0 = std::size_t(cu[n]), L = std::size_t(cu[n + 1] - cu[n]);
    Tape t1;
    HostCarry c1;
    const auto h0 = slice(x.h0, n * S, S), cs = slice(x.conv_state, n * CS, CS);
    const auto o1 = layer.forward(1, int(L), {.qkv = slice(x.qkv, t0 * C, L * C), .z = slice(x.z, t0 * V, L * V),
                                              .a = slice(x.a, t0 * nv, L * nv), .b = slice(x.b, t0 * nv, L * nv),
                                              .h0 = h0, .conv_state = cs},
                                  &t1, &c1);
    const HostCarry d1{slice(x.dht, n * S, S), slice(x.dconv_out, n * CS, CS)};
    const HostGrads g1 = layer.backward(t1, slice(x.dout, t0 * V, L * V), &d1);
    SCOPED_TRACE("sequence " + std::to_string(n) + " of " + std::to_string(L) + " tokens");
    check("out", slice(out, t0 * V, L * V), o1);
    check("ht", slice(carry.ht, n * S, S), c1.ht);
    check("conv_state out", slice(carry.conv_state, n * CS, CS), c1.conv_state);
    check("dqkv", slice(g.dqkv, t0 * C, L * C), g1.dqkv);
    check("dz", slice(g.dz, t0 * V, L * V), g1.dz);
    check("da", slice(g.da, t0 * nv, L * nv), g1.da);
    check("db", slice(g.db, t0 * nv, L * nv), g1.db);
    check("dh0", slice(g.dh0, n * S, S), g1.dh0);
    check("dconv_state", slice(g.dconv_state, n * CS, CS), g1.dconv_state);
    for (std::size_t i = 0; i < dconv.size(); ++i) dconv[i] += g1.dconv[i];
    for (std::size_t i = 0; i < dnorm.size(); ++i) dnorm[i] += g1.dnorm[i];
    for (std::size_t i = 0; i < nv; ++i) da_log[i] += g1.da_log[i], ddt_bias[i] += g1.ddt_bias[i];
  }
  check("dconv (sum)", g.dconv, dconv);
  check("dnorm (sum)", g.dnorm, dnorm);
  check("da_log (sum)", g.da_log, da_log);
  check("ddt_bias (sum)", g.ddt_bias, ddt_bias);
}

// Lengths 1, 15, 16, 17, 100 and 333: each sequence in a lane of its own.
TEST_P(Packed, EqualsEachSequenceAlone) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 2));
  packed_equals_alone(layer, cfg, {0, 1, 16, 32, 49, 149, 482});
  std::printf("[gdn] %s: 6 sequences of 1 .. 333 tokens packed, each as alone\n", GetParam().name);
}

// 40 sequences, more than the lanes (32): a lane runs several one after another, and its parameters'
// gradients add up over them before the lanes' are added.
TEST_P(Packed, MoreSequencesThanLanes) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 3));
  std::vector<std::int64_t> cu{0};
  for (int i = 0; i < 40; ++i) cu.push_back(cu.back() + 1 + (i * 7) % 23 + (i % 9 == 0 ? 40 : 0));
  packed_equals_alone(layer, cfg, cu);
  std::printf("[gdn] %s: 40 sequences of 1 .. 63 tokens packed, each as alone\n", GetParam().name);
}

// Consecutive sequences of one length (3 x 16, 2 x 5, 2 x 33, 1, 2 x 40) run as one part of as many
// windows each: five parts for ten sequences, each sequence as alone.
TEST_P(Packed, RunsOfOneLengthRunAsWindows) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 4));
  std::vector<std::int64_t> cu{0};
  for (int L : {16, 16, 16, 5, 5, 33, 33, 1, 40, 40}) cu.push_back(cu.back() + L);
  packed_equals_alone(layer, cfg, cu);
  const int T = int(cu.back());
  const Batch x = random_batch(cfg, 1, T, 96);
  Tape tape;
  (void)layer.forward(1, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .cu_seqlens = cu}, &tape);
  int parts = 0;
  for (const auto& [name, bytes] : tape.buffers()) parts += name == "a (part)";
  EXPECT_EQ(parts, 5) << "parts of the tape (one per run of one length)";
  std::printf("[gdn] %s: 10 sequences in 5 runs of one length packed, each as alone\n", GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(Families, Packed, ::testing::ValuesIn(kFamilies), family_name);

// Bad offsets, refused before anything runs, naming the index; states of N rows.
TEST_F(DeviceTest, PackedRefusesBadOffsets) {
  const Config cfg{.nv = 4, .nk = 2, .conv_taps = 4, .rms_eps = 1e-6f};
  Layer layer(context(), cfg, random_params(cfg, 1));
  const Batch x = random_batch(cfg, 1, 10, 3);
  auto refused = [&](std::vector<std::int64_t> cu, const std::string& words, int B = 1) {
    const std::size_t T = 10 / std::size_t(B);
    try {
      layer.forward(B, int(T), {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .cu_seqlens = cu});
      ADD_FAILURE() << "taken: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({0, 4, 4, 10}, "cu_seqlens[2] = 4 is not above cu_seqlens[1] = 4");
  refused({0, 6, 3, 10}, "cu_seqlens[2] = 3 is not above");
  refused({0, 4, 9}, "cu_seqlens[2] = 9, expected the total tokens T = 10");
  refused({1, 4, 10}, "cu_seqlens[0] = 1, expected 0");
  refused({0}, "cu_seqlens has 1 offsets");
  refused({0, 5}, "qkv has B = 2", 2);
  const std::vector<float> h0(std::size_t(2) * cfg.nv * kHeadDim * kHeadDim);  // 2 rows for 3 sequences
  const std::vector<std::int64_t> three{0, 3, 7, 10};
  EXPECT_THROW(layer.forward(1, 10, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b, .h0 = h0, .cu_seqlens = three}),
               std::invalid_argument);
}

}  // namespace
}  // namespace gdn::test
