// SPDX-License-Identifier: MIT
// The device against the float64 reference: out, dqkv, dz, da, db for the three kernel families at
// shapes that exercise rep = nv/nk of 1 and 3, several windows, T = 1, T not a multiple of the
// checkpoint interval, many segments, intervals of 1, 2, 4, 8, 16 and one larger than T, and (the
// chunked family) chunks of 31 and 32 over several chunks. Where the device has matrix units
// (cooperative matrices), the chunked family runs them at chunks of 16, and the CudaCores cases
// run those chunks on the CUDA-core kernels as well; elsewhere both are the CUDA-core kernels.
//
// Tolerance: relative L2 error <= 2e-4 per output. float32 arithmetic lands near 1e-6 (each test
// prints what it reached); the bound leaves room for longer windows, not for wrong math: a single
// wrong element of a few hundred, or an unwritten (NaN-poisoned) one, fails it.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "test_support.hpp"

namespace gdn::test {
namespace {

constexpr double kTolerance = 2e-4;

struct Case {
  const char* name;
  int B, T, nv, nk, K, cs;
};

const Case kCases[] = {
    {"rep1_T13_cs4", 2, 13, 2, 2, 4, 4},     // T % cs != 0, four segments
    {"rep3_T10_cs2", 2, 10, 3, 1, 4, 2},     // five segments of two
    {"rep3_T37_cs8", 2, 37, 6, 2, 4, 8},     // five segments, the last of five steps
    {"T1", 3, 1, 3, 1, 4, 8},                // a single token
    {"cs_over_T", 2, 7, 2, 1, 3, 16},        // one segment, K = 3
    {"cs1", 2, 5, 2, 1, 2, 1},               // every step its own segment, K = 2
    {"rep3_T70_cs16", 1, 70, 3, 1, 4, 16},   // five segments, the last of six steps
    {"rep3_B3_T40_cs16", 3, 40, 6, 2, 4, 16},  // three windows of two whole chunks and a short one
};


// What a test's parameters print as (ctest's and gtest's names), in place of their bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (B " << c.B << ", T " << c.T << ", nv " << c.nv << ", nk " << c.nk << ", K " << c.K
      << ", interval " << c.cs << ")";
}

using Param = std::tuple<Case, Family>;

class Parity : public DeviceTest, public ::testing::WithParamInterface<Param> {
 protected:
  Config config() const {
    const auto& [c, family] = GetParam();
    return Config{.nv = c.nv, .nk = c.nk, .conv_taps = c.K, .rms_eps = 1e-6f, .checkpoint_interval = c.cs,
                  .variant = family.variant, .matrix_units = family.matrix_units};
  }
  static std::string ran(const Layer& layer) {
    return std::string(to_string(layer.variant())) + (layer.config().matrix_units ? " (matrix units)" : "");
  }
  static void check(const char* what, const std::vector<float>& got, const std::vector<double>& want) {
    expect_close(what, got, want, kTolerance);
  }
};

TEST_P(Parity, DeviceApiMatchesReference) {
  const auto& c = std::get<0>(GetParam());
  const Config cfg = config();
  auto ctx = context();
  const Params p = random_params(cfg, 11);
  Layer layer(ctx, cfg, p);
  const Batch x = random_batch(cfg, c.B, c.T, 101);
  const Expected want = reference_batch(cfg, p, x, c.B, c.T);

  auto tensor = [&](std::vector<std::int64_t> shape, const std::vector<float>& data, const char* name) {
    Tensor t(ctx, std::move(shape), name);
    t.upload(data);
    return t;
  };
  const std::int64_t B = c.B, T = c.T;
  DeviceInputs in{tensor({B, T, cfg.channels()}, x.qkv, "qkv"), tensor({B, T, cfg.value_dim()}, x.z, "z"),
                  tensor({B, T, cfg.nv}, x.a, "a"), tensor({B, T, cfg.nv}, x.b, "b")};
  // Every output poisoned with NaN first: an element the kernels never write fails the check.
  Tensor out(ctx, {B, T, cfg.value_dim()}, "out");
  out.fill(NAN);
  Tape tape;
  layer.forward(in, out, &tape);
  const Tensor dout = tensor({B, T, cfg.value_dim()}, x.dout, "dout");
  DeviceGrads g{Tensor(ctx, {B, T, cfg.channels()}, "dqkv"), Tensor(ctx, {B, T, cfg.value_dim()}, "dz"),
                Tensor(ctx, {B, T, cfg.nv}, "da"),            Tensor(ctx, {B, T, cfg.nv}, "db"),
                Tensor(ctx, {cfg.channels(), cfg.conv_taps}, "dconv"), Tensor(ctx, {cfg.nv}, "da_log"),
                Tensor(ctx, {cfg.nv}, "ddt_bias"),            Tensor(ctx, {kHeadDim}, "dnorm")};
  for (Tensor* t : {&g.dqkv, &g.dz, &g.da, &g.db, &g.dconv, &g.da_log, &g.ddt_bias, &g.dnorm}) t->fill(NAN);
  layer.backward(tape, dout, g);

  std::printf("[gdn] %s, %s:\n", c.name, ran(layer).c_str());
  check("out", out.download(), want.out);
  check("dqkv", g.dqkv.download(), want.dqkv);
  check("dz", g.dz.download(), want.dz);
  check("da", g.da.download(), want.da);
  check("db", g.db.download(), want.db);
  check("dconv", g.dconv.download(), want.dconv);
  check("da_log", g.da_log.download(), want.da_log);
  check("ddt_bias", g.ddt_bias.download(), want.ddt_bias);
  check("dnorm", g.dnorm.download(), want.dnorm);

  // A forward without a tape computes the same output; a second backward from the same tape the
  // same gradients (the backward must not consume its tape), also after a forward of other inputs
  // (the backward reads nothing the layer keeps for its forwards: on the matrix units v, say).
  Tensor out2(ctx, {B, T, cfg.value_dim()}, "out2");
  out2.fill(NAN);
  layer.forward(in, out2, nullptr);
  EXPECT_EQ(out2.download(), out.download());
  const Batch other = random_batch(cfg, c.B, c.T, 303);
  const DeviceInputs in_other{tensor({B, T, cfg.channels()}, other.qkv, "qkv"), tensor({B, T, cfg.value_dim()}, other.z, "z"),
                              tensor({B, T, cfg.nv}, other.a, "a"), tensor({B, T, cfg.nv}, other.b, "b")};
  layer.forward(in_other, out2, nullptr);
  DeviceGrads g2;
  layer.backward(tape, dout, g2);
  EXPECT_EQ(g2.dqkv.download(), g.dqkv.download());
  EXPECT_EQ(g2.da.download(), g.da.download());
  // the parameters' gradients are summed in a fixed order: bitwise the same
  EXPECT_EQ(g2.dconv.download(), g.dconv.download());
  EXPECT_EQ(g2.da_log.download(), g.da_log.download());
  EXPECT_EQ(g2.ddt_bias.download(), g.ddt_bias.download());
  EXPECT_EQ(g2.dnorm.download(), g.dnorm.download());
}

TEST_P(Parity, HostApiMatchesReference) {
  const auto& c = std::get<0>(GetParam());
  const Config cfg = config();
  const Params p = random_params(cfg, 21);
  Layer layer(context(), cfg, p);
  const Batch x = random_batch(cfg, c.B, c.T, 202);
  const Expected want = reference_batch(cfg, p, x, c.B, c.T);
  Tape tape;
  const auto out = layer.forward(c.B, c.T, {x.qkv, x.z, x.a, x.b}, &tape);
  const auto g = layer.backward(tape, x.dout);
  std::printf("[gdn] %s (host API), %s:\n", c.name, ran(layer).c_str());
  check("out", out, want.out);
  for (const auto& [name, got, expected] : named_grads(g, want)) check(name, got, expected);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [c, family] = info.param;
  return std::string(c.name) + "_" + family.name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Parity,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(kPerHead, kSubgroup, kChunked)),
                         param_name);

// Chunks of the chunked family's longest length (32) and an odd one, over several chunks.
const Case kLongChunks[] = {
    {"T70_cs32", 1, 70, 2, 1, 4, 32},  // three chunks, the last of six tokens
    {"T64_cs31", 1, 64, 3, 1, 4, 31},  // odd rows split over the two row halves of chunk_grads
    {"T50_cs20", 1, 50, 2, 1, 4, 20},  // rows padded to 24: chunk_prep's pair dots in one group of 144
    {"rep3_T64_cs16", 2, 64, 6, 2, 4, 16},  // four full chunks of the matrix units' length
    {"rep3_T20_cs16", 2, 20, 3, 1, 4, 16},  // one pair of chunks, the second of four tokens (no stored state)
    {"rep5_T40_cs16", 1, 40, 10, 2, 4, 16},  // five v-heads per key head: two batches of heads in
                                             // chunk_prep_fwd; a pair and a lone last chunk
};
INSTANTIATE_TEST_SUITE_P(LongChunks, Parity,
                         ::testing::Combine(::testing::ValuesIn(kLongChunks), ::testing::Values(kChunked)),
                         param_name);

// Chunks of 16 on the CUDA-core kernels too, where the chunked family would take the matrix units
// (elsewhere these repeat the chunked cases: cheap, and the same source).
const Case kChunks16[] = {
    {"cs_over_T", 2, 7, 2, 1, 3, 16},
    {"rep3_T70_cs16", 1, 70, 3, 1, 4, 16},
    {"rep3_T64_cs16", 2, 64, 6, 2, 4, 16},
};
INSTANTIATE_TEST_SUITE_P(CudaCores, Parity,
                         ::testing::Combine(::testing::ValuesIn(kChunks16), ::testing::Values(kChunkedCudaCores)),
                         param_name);

// The checks above must be able to fail: a wrong parameter on the device side (norm off by 1%)
// must push the output error far over the tolerance.
TEST_F(DeviceTest, ParityCheckDetectsAWrongResult) {
  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .checkpoint_interval = 4, .variant = Variant::PerHead};
  Params p = random_params(cfg, 31);
  const Batch x = random_batch(cfg, 1, 6, 303);
  const Expected want = reference_batch(cfg, p, x, 1, 6);
  p.norm[5] *= 1.01f;
  Layer layer(context(), cfg, p);
  const auto out = layer.forward(1, 6, {x.qkv, x.z, x.a, x.b});
  EXPECT_GT(rel_l2(out, want.out), kTolerance);
}

// Context::allocated_bytes counts the buffers that are alive: a thousand tensors made and dropped,
// and a training loop of 300 steps that makes a fresh tape every step, leave it where they found it
// (it used to only grow, and its heap check refused such a loop after a few dozen steps).
TEST_F(DeviceTest, AllocatedBytesCountsOnlyLiveBuffers) {
  auto ctx = context();
  const std::size_t base = ctx->allocated_bytes();
  for (int i = 0; i < 1000; ++i) {
    Tensor t(ctx, {256, 1024}, "t");
    ASSERT_GE(ctx->allocated_bytes(), base + (1u << 20));
  }
  EXPECT_EQ(ctx->allocated_bytes(), base);

  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4};
  std::size_t after_first = 0;
  {
    Layer layer(ctx, cfg, random_params(cfg, 3));
    const Batch x = random_batch(cfg, 1, 16, 4);
    for (int step = 0; step < 300; ++step) {
      Tape tape;
      layer.forward(1, 16, {x.qkv, x.z, x.a, x.b}, &tape);
      layer.backward(tape, x.dout);
      if (step == 0) after_first = ctx->allocated_bytes();
      ASSERT_EQ(ctx->allocated_bytes(), after_first) << "step " << step;
    }
  }
  EXPECT_EQ(ctx->allocated_bytes(), base);  // the layer gone too
}

// KernelTime::bytes is what a kernel's dispatches bind: conv_fwd reads qkv and the conv taps and
// writes v, q^ and k^ and their norms (its conv_state slot, no state given, not counted); per-head's
// rec_fwd reads v, q^ k^, the gates, z and the norm weight and writes out, o, 1/rms and (no tape) a
// one-float checkpoint buffer, and its h0 and ht slots hold stand-ins.
TEST_F(DeviceTest, KernelBytesAreTheRangesTheKernelsBind) {
  const Config cfg{.nv = 4, .nk = 2, .conv_taps = 4, .variant = Variant::PerHead};
  Layer layer(context(), cfg, random_params(cfg, 5));
  const int B = 2, T = 24;
  const Batch x = random_batch(cfg, B, T, 6);
  layer.set_profiling(true);
  layer.forward(B, T, {x.qkv, x.z, x.a, x.b});
  const auto& t = layer.last_timings();
  const auto conv = std::ranges::find(t, std::string("conv_fwd"), &KernelTime::name);
  ASSERT_NE(conv, t.end()) << "no conv_fwd among the timings";
  const double BT = double(B) * T, C = double(cfg.channels());
  const double want = 4 * (BT * C + C * cfg.conv_taps + BT * double(cfg.value_dim()) + 2 * BT * cfg.nk * kHeadDim +
                           2 * BT * cfg.nk);
  EXPECT_EQ(conv->bytes, want);
  const auto rec = std::ranges::find(t, std::string("rec_fwd"), &KernelTime::name);
  ASSERT_NE(rec, t.end()) << "no rec_fwd among the timings";
  const double V = BT * double(cfg.value_dim());
  EXPECT_EQ(rec->bytes, 4 * (4 * V + 2 * BT * cfg.nk * kHeadDim + 3 * BT * cfg.nv + kHeadDim + BT * cfg.nv + 1));
  for (const auto& k : t)
    if (k.name != "total") EXPECT_GT(k.bytes, 0.0) << k.name;
}

// The Context keeps the pipelines, one per shader and specialization: a second Layer of a config
// builds none (each Layer used to build its own), and a config needing other specializations builds
// only those.
TEST_F(DeviceTest, PipelinesAreBuiltOncePerContext) {
  auto ctx = context();
  for (const Family& f : {kPerHead, kSubgroup, kChunked}) {
    const Config cfg{.nv = 2, .nk = 1, .conv_taps = 3, .checkpoint_interval = 5, .variant = f.variant};
    const Params p = random_params(cfg, 7);
    { Layer first(ctx, cfg, p); }
    const std::size_t built = ctx->pipelines_built();
    Layer second(ctx, cfg, p);
    EXPECT_EQ(ctx->pipelines_built(), built) << f.name;
    const Batch x = random_batch(cfg, 1, 7, 8);
    Tape tape;
    second.forward(1, 7, {x.qkv, x.z, x.a, x.b}, &tape);
    second.backward(tape, x.dout);
    Layer third(ctx, cfg, p);  // (the backward built its lazily made pipelines once too)
    third.forward(1, 7, {x.qkv, x.z, x.a, x.b}, &tape);
    const std::size_t after = ctx->pipelines_built();
    third.backward(tape, x.dout);
    EXPECT_EQ(ctx->pipelines_built(), after) << f.name;
  }
}

// The parameters live on the device and are updated in place: 30 steps of SGD on every parameter
// (conv, a_log, dt_bias, norm) lower a regression loss towards another layer's output, in every
// family, with no Layer rebuilt and no pipeline built after the first step.
TEST_F(DeviceTest, TrainsEveryParameterInPlace) {
  auto ctx = context();
  for (const Family& f : {kPerHead, kSubgroup, kChunked}) {
    const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .rms_eps = 1e-6f, .variant = f.variant};
    const int B = 2, T = 12;
    const Batch x = random_batch(cfg, B, T, 62);
    std::vector<float> target;
    {
      Layer teacher(ctx, cfg, random_params(cfg, 63));
      target = teacher.forward(B, T, {x.qkv, x.z, x.a, x.b});
    }
    Params p = random_params(cfg, 61);
    Layer layer(ctx, cfg, p);
    double first = 0, last = 0;
    std::size_t built = 0;
    for (int step = 0; step < 30; ++step) {
      Tape tape;
      const std::vector<float> out = layer.forward(B, T, {x.qkv, x.z, x.a, x.b}, &tape);
      std::vector<float> dout(out.size());
      double loss = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        dout[i] = out[i] - target[i];
        loss += 0.5 * double(dout[i]) * dout[i];
      }
      (step == 0 ? first : last) = loss;
      const HostGrads g = layer.backward(tape, dout);
      const float lr = 0.02f;
      auto sgd = [&](std::vector<float>& w, const std::vector<float>& dw) {
        ASSERT_EQ(w.size(), dw.size());
        for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * dw[i];
      };
      sgd(p.conv, g.dconv);
      sgd(p.a_log, g.da_log);
      sgd(p.dt_bias, g.ddt_bias);
      sgd(p.norm, g.dnorm);
      layer.set_params(p);
      if (step == 0) built = ctx->pipelines_built();
    }
    std::printf("[gdn] %s: loss %.4g -> %.4g over 30 steps\n", f.name, first, last);
    EXPECT_LT(last, 0.5 * first) << f.name;
    EXPECT_EQ(ctx->pipelines_built(), built) << f.name;
  }
}

// Layer::params() are the layer's own buffers: writing one changes what the layer computes, exactly
// as a layer made with those parameters; set_params refuses a wrong size before writing anything.
TEST_F(DeviceTest, ParamsAreTheLayersBuffers) {
  auto ctx = context();
  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 3};
  Params p = random_params(cfg, 71);
  Layer layer(ctx, cfg, p);
  const Batch x = random_batch(cfg, 1, 9, 72);
  const auto before = layer.forward(1, 9, {x.qkv, x.z, x.a, x.b});
  Params q = p;
  for (auto& w : q.norm) w *= 1.5f;
  q.a_log[1] += 0.25f;
  layer.params().norm.upload(q.norm);
  layer.params().a_log.upload(q.a_log);
  EXPECT_EQ(layer.params().norm.download(), q.norm);
  Layer fresh(ctx, cfg, q);
  const auto after = layer.forward(1, 9, {x.qkv, x.z, x.a, x.b});
  EXPECT_EQ(after, fresh.forward(1, 9, {x.qkv, x.z, x.a, x.b}));
  EXPECT_NE(after, before);

  Params bad = p;
  bad.dt_bias.pop_back();
  EXPECT_THROW(layer.set_params(bad), std::invalid_argument);
  EXPECT_EQ(layer.forward(1, 9, {x.qkv, x.z, x.a, x.b}), after) << "a refused set_params wrote something";
  layer.set_params(p);
  EXPECT_EQ(layer.forward(1, 9, {x.qkv, x.z, x.a, x.b}), before);
}

// Threads sharing a Context (each its own Layer) and sharing one Layer take turns: every thread gets
// exactly what one thread alone gets, with no hang and no crash.
TEST_F(DeviceTest, ThreadsShareAContextAndALayer) {
  auto ctx = context();
  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4};
  const Params p = random_params(cfg, 81);
  const Batch x = random_batch(cfg, 1, 10, 82);
  Layer shared(ctx, cfg, p);
  std::vector<float> want_out;
  HostGrads want;
  {
    Tape tape;
    want_out = shared.forward(1, 10, {x.qkv, x.z, x.a, x.b}, &tape);
    want = shared.backward(tape, x.dout);
  }
  std::atomic<int> wrong{0};
  auto work = [&](Layer* layer) {
    std::unique_ptr<Layer> own;
    if (!layer) {
      own = std::make_unique<Layer>(ctx, cfg, p);
      layer = own.get();
    }
    for (int i = 0; i < 8; ++i) {
      Tape tape;
      const auto out = layer->forward(1, 10, {x.qkv, x.z, x.a, x.b}, &tape);
      const HostGrads g = layer->backward(tape, x.dout);
      wrong += out != want_out || g.dqkv != want.dqkv || g.dnorm != want.dnorm;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t % 2 ? &shared : nullptr);
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Data-parallel training drives one Context per GPU, each from its own thread: two Contexts (here on
// the same device) in two threads, each its own layer, give the results of one.
TEST_F(DeviceTest, TwoContextsInTwoThreads) {
  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4};
  const Params p = random_params(cfg, 83);
  const Batch x = random_batch(cfg, 2, 12, 84);
  std::vector<float> want_out;
  HostGrads want;
  {
    Layer layer(context(), cfg, p);
    Tape tape;
    want_out = layer.forward(2, 12, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &tape);
    want = layer.backward(tape, x.dout);
  }
  std::atomic<int> wrong{0};
  auto work = [&] {
    auto ctx = Context::create();
    Layer layer(ctx, cfg, p);
    for (int i = 0; i < 6; ++i) {
      Tape tape;
      const auto out = layer.forward(2, 12, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &tape);
      const HostGrads g = layer.backward(tape, x.dout);
      wrong += out != want_out || g.dqkv != want.dqkv || g.dconv != want.dconv;
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0);
}

// The pipeline cache outlives the process in a file (GDN_PIPELINE_CACHE here): a Context that built
// pipelines leaves one with this device's header, and a corrupt file is skipped, then replaced.
TEST_F(DeviceTest, PipelineCacheIsSavedAndAForeignOneSkipped) {
  const std::string path = ::testing::TempDir() + "gdn-pipeline-cache-test.bin";
  std::remove(path.c_str());
  ::setenv("GDN_PIPELINE_CACHE", path.c_str(), 1);
  const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .variant = Variant::PerHead};
  const Params p = random_params(cfg, 3);
  auto header_ok = [&] {
    std::ifstream f(path, std::ios::binary);
    std::uint32_t h[4] = {};
    f.read(reinterpret_cast<char*>(h), sizeof h);
    return bool(f) && h[0] >= 32 && h[1] == 1;  // length, VK_PIPELINE_CACHE_HEADER_VERSION_ONE
  };
  {
    auto ctx = Context::create();
    Layer layer(ctx, cfg, p);
  }
  EXPECT_TRUE(header_ok()) << "no cache file with a Vulkan header at " << path;
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << std::string(64, '\x5a');
  }
  {
    auto ctx = Context::create();
    Layer layer(ctx, cfg, p);
    const Batch x = random_batch(cfg, 1, 5, 4);
    const Expected want = reference_batch(cfg, p, x, 1, 5);
    EXPECT_LE(rel_l2(layer.forward(1, 5, {x.qkv, x.z, x.a, x.b}), want.out), 2e-4);
  }
  EXPECT_TRUE(header_ok()) << "the corrupt cache file was not replaced";
  ::unsetenv("GDN_PIPELINE_CACHE");
  std::remove(path.c_str());
}

// Tape::recorded() says whether a forward filled the tape, in every family (it tested a buffer the
// matrix units' path never makes).
TEST_F(DeviceTest, TapeIsRecordedAfterAForwardInEveryFamily) {
  for (const Family& f : {kPerHead, kSubgroup, kChunked, kChunkedCudaCores}) {
    const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .variant = f.variant, .matrix_units = f.matrix_units};
    Layer layer(context(), cfg, random_params(cfg, 5));
    const Batch x = random_batch(cfg, 1, 18, 6);
    Tape tape;
    EXPECT_FALSE(tape.recorded()) << f.name;
    layer.forward(1, 18, {x.qkv, x.z, x.a, x.b}, &tape);
    EXPECT_TRUE(tape.recorded()) << f.name;
  }
}

}  // namespace
}  // namespace gdn::test
