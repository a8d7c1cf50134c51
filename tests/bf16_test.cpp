// SPDX-License-Identifier: MIT
// bfloat16 boundary tensors (docs/spec.md, "bfloat16 boundary tensors"): rounding on the host and the
// device, every family with bfloat16 streams against the float64 reference fed the same rounded
// inputs, each stream bfloat16 on its own, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "test_support.hpp"

namespace gdn::test {
namespace {

// float32 results from bfloat16 inputs: the suite's bound (the arithmetic is float32 throughout).
constexpr double kTolerance = 2e-4;

TEST(Bf16, HostRoundingIsToNearestEven) {
  EXPECT_EQ(to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(to_bfloat16(-2.0f), 0xC000);
  EXPECT_EQ(to_bfloat16(1.0f + 0x1p-8f), 0x3F80);             // halfway, to the even 1.0
  EXPECT_EQ(to_bfloat16(1.0f + 3 * 0x1p-8f), 0x3F82);         // halfway, to the even 1 + 2^-6
  EXPECT_EQ(to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above halfway
  EXPECT_EQ(to_bfloat16(3.4e38f), 0x7F80);                    // above the largest finite: Inf
  EXPECT_EQ(to_bfloat16(-INFINITY), 0xFF80);
  EXPECT_TRUE(std::isnan(from_bfloat16(to_bfloat16(NAN))));
  EXPECT_EQ(to_bfloat16(0x1p-130f), 0x0008);  // subnormals are kept (bfloat16 has them down to 2^-133)
  EXPECT_EQ(to_bfloat16(0x1p-134f + 0x1p-140f), 0x0001);
  EXPECT_EQ(from_bfloat16(0x3F81), 1.0f + 0x1p-7f);
}

TEST_F(DeviceTest, Bf16TensorsRoundOnUploadAndWidenOnDownload) {
  auto ctx = context();
  Tensor t(ctx, {3}, "t", DType::BFloat16);
  EXPECT_EQ(t.dtype(), DType::BFloat16);
  EXPECT_EQ(t.bytes(), 8u);  // 6 bytes rounded up to whole words
  t.upload(std::vector<float>{1.0f + 0x1p-8f, 1.0f + 0x1p-6f + 0x1p-9f, -3.0f});
  EXPECT_EQ(t.download(), (std::vector<float>{1.0f, 1.0f + 0x1p-6f, -3.0f}));
  EXPECT_EQ(t.download_bf16(), (std::vector<std::uint16_t>{0x3F80, 0x3F82, 0xC040}));
  t.fill(0.5f);
  EXPECT_EQ(t.download(), (std::vector<float>{0.5f, 0.5f, 0.5f}));
  t.upload_bf16(std::vector<std::uint16_t>{0x4000, 0x7F80, 0x0001});
  EXPECT_EQ(t.download(), (std::vector<float>{2.0f, INFINITY, 0x1p-133f}));
  Tensor f(ctx, {3}, "f");
  try {
    f.upload_bf16(std::vector<std::uint16_t>{1, 2, 3});
    ADD_FAILURE() << "a float32 tensor took bfloat16 bits";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'f' is float32, expected bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)f.download_bf16(), std::invalid_argument);
  EXPECT_THROW(t.upload_bf16(std::vector<std::uint16_t>{1, 2}), std::invalid_argument);
}

class Bf16 : public FamilyTest {
 protected:
  Config config(int nv = 4, int nk = 2) const {
    return Config{.nv = nv, .nk = nk, .conv_taps = 4, .rms_eps = 1e-6f, .variant = GetParam().variant,
                  .matrix_units = GetParam().matrix_units, .serial_split = GetParam().serial_split};
  }
};

// Every boundary stream bfloat16: out and the input gradients (allocated by the calls, so bfloat16
// too) against the reference's rounded once; the parameters' and states' gradients (float32) at the
// suite's bound. Then the same call with float32 outputs: the bfloat16 ones are exactly their
// rounding (the device's stores round as to_bfloat16 does).
TEST_P(Bf16, AllStreamsMatchTheReferenceOnRoundedInputs) {
  const Config cfg = config();
  const Params p = random_params(cfg, 5);
  Layer layer(context(), cfg, p);
  const int B = 2, T = 37;
  Batch x = random_batch(cfg, B, T, 41);
  for (auto* v : {&x.qkv, &x.z, &x.a, &x.b, &x.dout}) *v = bf16_rounded(*v);
  const Expected want = reference_batch(cfg, p, x, B, T);
  const auto bf = DType::BFloat16;
  const DeviceInputs in = device_inputs(cfg, x, B, T, bf);
  const Tensor dout = device_tensor(x.dout, {B, T, cfg.value_dim()}, "dout", bf);
  Tensor out;
  Tape tape;
  DeviceCarry carry;
  layer.forward(in, out, &tape, &carry);
  DeviceGrads g;
  layer.backward(tape, dout, g);
  for (const Tensor* t : {&out, &g.dqkv, &g.dz, &g.da, &g.db}) EXPECT_EQ(t->dtype(), bf) << t->name();
  EXPECT_EQ(carry.conv_state.dtype(), DType::Float32);
  for (const Tensor* t : {&g.dconv, &g.da_log, &g.ddt_bias, &g.dnorm, &g.dconv_state})
    EXPECT_EQ(t->dtype(), DType::Float32) << t->name();
  std::printf("[gdn] %s, B %d, T %d, bfloat16 streams:\n", GetParam().name, B, T);
  expect_streams_close(out, g, want);
  expect_close("ht", carry.ht.download(), want.ht, kTolerance);
  expect_close("conv_state out", carry.conv_state.download(), want.conv_state_out, 0);  // qkv's rows, widened
  expect_close("dconv", g.dconv.download(), want.dconv, kTolerance);
  expect_close("da_log", g.da_log.download(), want.da_log, kTolerance);
  expect_close("ddt_bias", g.ddt_bias.download(), want.ddt_bias, kTolerance);
  expect_close("dnorm", g.dnorm.download(), want.dnorm, kTolerance);
  expect_close("dconv_state", g.dconv_state.download(), want.dconv_state, kTolerance);

  // float32 outputs of the same inputs: the rounding of each is the bfloat16 output, bit for bit
  Tensor out32(context(), {B, T, cfg.value_dim()}, "out32");
  layer.forward(in, out32, &tape);
  DeviceGrads g32{.dqkv = Tensor(context(), {B, T, cfg.channels()}, "dqkv32"),
                  .dz = Tensor(context(), {B, T, cfg.value_dim()}, "dz32"),
                  .da = Tensor(context(), {B, T, cfg.nv}, "da32"),
                  .db = Tensor(context(), {B, T, cfg.nv}, "db32")};
  layer.backward(tape, dout, g32);
  for (auto [b16, f32] : {std::pair{&out, &out32}, {&g.dqkv, &g32.dqkv}, {&g.dz, &g32.dz}, {&g.da, &g32.da},
                          {&g.db, &g32.db}}) {
    const auto bits = b16->download_bf16();
    const auto wide = f32->download();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < bits.size(); ++i) differ += bits[i] != to_bfloat16(wide[i]);
    EXPECT_EQ(differ, 0u) << b16->name() << ": elements whose device rounding differs from to_bfloat16";
  }
}

// One stream bfloat16 at a time, the rest float32: the float32 outputs match the reference fed that
// stream rounded, at the suite's bound.
TEST_P(Bf16, EachStreamOnItsOwn) {
  const Config cfg = config();
  const Params p = random_params(cfg, 6);
  Layer layer(context(), cfg, p);
  const int B = 1, T = 21;
  const Batch x0 = random_batch(cfg, B, T, 43);
  const char* names[] = {"qkv", "z", "a", "b", "dout"};
  for (int which = 0; which < 5; ++which) {
    Batch x = x0;
    std::vector<float>* streams[] = {&x.qkv, &x.z, &x.a, &x.b, &x.dout};
    *streams[which] = bf16_rounded(*streams[which]);
    const Expected want = reference_batch(cfg, p, x, B, T);
    auto d = [&](int i) { return i == which ? DType::BFloat16 : DType::Float32; };
    const DeviceInputs in{device_tensor(x.qkv, {B, T, cfg.channels()}, "qkv", d(0)),
                          device_tensor(x.z, {B, T, cfg.value_dim()}, "z", d(1)),
                          device_tensor(x.a, {B, T, cfg.nv}, "a", d(2)), device_tensor(x.b, {B, T, cfg.nv}, "b", d(3))};
    const Tensor dout = device_tensor(x.dout, {B, T, cfg.value_dim()}, "dout", d(4));
    Tensor out(context(), {B, T, cfg.value_dim()}, "out");
    Tape tape;
    layer.forward(in, out, &tape);
    DeviceGrads g{.dqkv = Tensor(context(), {B, T, cfg.channels()}, "dqkv"),
                  .dz = Tensor(context(), {B, T, cfg.value_dim()}, "dz"), .da = Tensor(context(), {B, T, cfg.nv}, "da"),
                  .db = Tensor(context(), {B, T, cfg.nv}, "db")};
    layer.backward(tape, dout, g);
    std::printf("[gdn] %s, %s bfloat16:\n", GetParam().name, names[which]);
    expect_close("out", out.download(), want.out, kTolerance);
    expect_close("dqkv", g.dqkv.download(), want.dqkv, kTolerance);
    expect_close("dz", g.dz.download(), want.dz, kTolerance);
    expect_close("da", g.da.download(), want.da, kTolerance);
    expect_close("db", g.db.download(), want.db, kTolerance);
    expect_close("dnorm", g.dnorm.download(), want.dnorm, kTolerance);
  }
}

// Every stream bfloat16 at the magnitudes training feeds the layer: dout x 2^-27 (a loss averaged
// over millions of tokens) and x 2^16 (a loss scale), qkv x 1e-4 and x 1e3 (rounded after scaling).
// bfloat16 has float32's exponent range, so the bounds hold at every scale; the matrix units' passes
// read and write these streams as bfloat16 themselves.
TEST_P(Bf16, AtTrainingScales) {
  const Config cfg = config();
  const Params p = random_params(cfg, 11);
  Layer layer(context(), cfg, p);
  const int B = 1, T = 40;
  const Batch x0 = random_batch(cfg, B, T, 49);
  struct Case {
    const char* what;
    double qkv, dout;
  };
  for (const Case c : {Case{"dout x 2^-27", 1, 0x1p-27}, Case{"dout x 2^16", 1, 0x1p16}, Case{"qkv x 1e-4", 1e-4, 1},
                       Case{"qkv x 1e3", 1e3, 1}}) {
    Batch x = x0;
    for (auto& v : x.qkv) v = float(v * c.qkv);
    for (auto& v : x.dout) v = float(v * c.dout);
    const auto [want, out, g] = bf16_step(layer, cfg, p, x, B, T);
    std::printf("[gdn] %s, bfloat16 streams, %s:\n", GetParam().name, c.what);
    expect_streams_close(out, g, want);
    expect_close("dconv", g.dconv.download(), want.dconv, kTolerance);
    expect_close("dnorm", g.dnorm.download(), want.dnorm, kTolerance);
    expect_close("da_log", g.da_log.download(), want.da_log, kTolerance);
  }
}

// Packed sequences with every stream bfloat16: each sequence's bfloat16 outputs and gradients as the
// same sequence run alone with bfloat16 streams (the same arithmetic, so bit for bit where the
// float32 results agree; bound: the packed suite's 1e-5).
TEST_P(Bf16, PackedSequencesEachAsAlone) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 12));
  const std::vector<std::int64_t> cu{0, 1, 17, 50};
  const int T = int(cu.back());
  const std::size_t C = std::size_t(cfg.channels()), V = std::size_t(cfg.value_dim()), nv = std::size_t(cfg.nv);
  const Batch x = random_batch(cfg, 1, T, 51);
  const auto bf = DType::BFloat16;
  auto part = [](const std::vector<float>& v, std::size_t from, std::size_t n) {
    return std::vector<float>(v.begin() + std::ptrdiff_t(from), v.begin() + std::ptrdiff_t(from + n));
  };
  auto run = [&](std::size_t t0, std::size_t L, std::vector<std::int64_t> seqlens) {
    const int l = int(L);
    DeviceInputs in{device_tensor(part(x.qkv, t0 * C, L * C), {1, l, cfg.channels()}, "qkv", bf),
                    device_tensor(part(x.z, t0 * V, L * V), {1, l, cfg.value_dim()}, "z", bf),
                    device_tensor(part(x.a, t0 * nv, L * nv), {1, l, cfg.nv}, "a", bf),
                    device_tensor(part(x.b, t0 * nv, L * nv), {1, l, cfg.nv}, "b", bf)};
    in.cu_seqlens = std::move(seqlens);
    Tensor out;
    Tape tape;
    layer.forward(in, out, &tape);
    DeviceGrads g;
    layer.backward(tape, device_tensor(part(x.dout, t0 * V, L * V), {1, l, cfg.value_dim()}, "dout", bf), g);
    return std::vector<std::vector<float>>{out.download(), g.dqkv.download(), g.dz.download(), g.da.download(),
                                           g.db.download()};
  };
  const auto packed = run(0, std::size_t(T), cu);
  const char* names[] = {"out", "dqkv", "dz", "da", "db"};
  const std::size_t width[] = {V, C, V, nv, nv};
  for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
    const std::size_t t0 = std::size_t(cu[n]), L = std::size_t(cu[n + 1] - cu[n]);
    const auto alone = run(t0, L, {});
    SCOPED_TRACE("sequence " + std::to_string(n) + " of " + std::to_string(L) + " tokens");
    for (std::size_t i = 0; i < alone.size(); ++i) {
      const auto got = part(packed[i], t0 * width[i], L * width[i]);
      expect_close(names[i], got, std::vector<double>(alone[i].begin(), alone[i].end()), 1e-5);
    }
  }
  std::printf("[gdn] %s: 3 sequences of 1, 16, 33 tokens packed with bfloat16 streams, each as alone\n",
              GetParam().name);
}

// An odd number of elements: the last word's upper half is not the tensor's and keeps its bits.
TEST_P(Bf16, OddCountKeepsTheBytesAfterTheTensor) {
  const Config cfg = config(3, 1);
  const Params p = random_params(cfg, 8);
  Layer layer(context(), cfg, p);
  const int B = 1, T = 5;  // a, b, da, db: 15 elements
  const Batch x = random_batch(cfg, B, T, 45);
  const auto bf = DType::BFloat16;
  const DeviceInputs in = device_inputs(cfg, x, B, T, bf);
  Tensor host(context(), {16}, "da and a sentinel", bf);
  host.fill(7.0f);
  DeviceGrads g{.da = Tensor::wrap(context(), host.vk_buffer(), host.vk_offset(), {B, T, cfg.nv}, "da", bf)};
  Tape tape;
  Tensor out;
  layer.forward(in, out, &tape);
  layer.backward(tape, device_tensor(x.dout, {B, T, cfg.value_dim()}, "dout", bf), g);
  const auto all = host.download();
  EXPECT_EQ(all[15], 7.0f) << "the element after da";
  const Expected want = reference_batch(cfg, p, [&] {
    Batch r = x;
    for (auto* v : {&r.qkv, &r.z, &r.a, &r.b, &r.dout}) *v = bf16_rounded(*v);
    return r;
  }(), B, T);
  expect_close("da", g.da.download(), bf16_rounded(want.da), kBf16Tolerance);
}

// bfloat16 where float32 is required: states, their gradients and the parameters' gradients.
TEST_P(Bf16, StatesAndParameterGradientsMustBeFloat32) {
  const Config cfg = config();
  Layer layer(context(), cfg, random_params(cfg, 9));
  const int B = 1, T = 4;
  const Batch x = random_batch(cfg, B, T, 47);
  const auto bf = DType::BFloat16;
  DeviceInputs in = device_inputs(cfg, x, B, T, bf);
  auto refused = [](const char* what, auto&& call) {
    try {
      call();
      ADD_FAILURE() << what << ": a bfloat16 tensor was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(what) + " ('"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("is bfloat16, expected float32"), std::string::npos) << e.what();
    }
  };
  Tensor out;
  in.h0 = Tensor(context(), {B, cfg.nv, kHeadDim, kHeadDim}, "h0", bf);
  refused("h0", [&] { layer.forward(in, out); });
  in.h0 = Tensor();
  DeviceCarry carry{.ht = Tensor(context(), {B, cfg.nv, kHeadDim, kHeadDim}, "ht", bf)};
  refused("ht", [&] { layer.forward(in, out, nullptr, &carry); });
  EXPECT_TRUE(out.empty()) << "nothing is allocated before a refusal";
  Tape tape;
  layer.forward(in, out, &tape);
  const Tensor dout = device_tensor(x.dout, {B, T, cfg.value_dim()}, "dout", bf);
  DeviceGrads g{.dconv = Tensor(context(), {cfg.channels(), cfg.conv_taps}, "dconv", bf)};
  refused("dconv", [&] { layer.backward(tape, dout, g); });
  EXPECT_TRUE(g.dqkv.empty()) << "nothing is allocated before a refusal";
  DeviceCarry dcarry{.ht = Tensor(context(), {B, cfg.nv, kHeadDim, kHeadDim}, "dht", bf)};
  DeviceGrads g2;
  refused("dht", [&] { layer.backward(tape, dout, g2, &dcarry); });
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16, ::testing::ValuesIn(kFamilies), family_name);
INSTANTIATE_TEST_SUITE_P(Splits, Bf16, ::testing::ValuesIn(kSplits), family_name);

}  // namespace
}  // namespace gdn::test
