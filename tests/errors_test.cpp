// SPDX-License-Identifier: MIT
// Bad input is refused with std::invalid_argument naming the tensor, the expected and the actual
// size; device limits with gdn::Error naming the buffer and the limit.
#include <climits>
#include <cmath>
#include <gmock/gmock.h>

#include "test_support.hpp"

namespace gdn::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

template <class E, class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

const Config kCfg{.nv = 2, .nk = 1, .conv_taps = 4, .checkpoint_interval = 2, .variant = Variant::PerHead};

class Errors : public DeviceTest {};

TEST_F(Errors, ConfigNvNotMultipleOfNk) {
  Config cfg = kCfg;
  cfg.nv = 3;
  cfg.nk = 2;
  const auto msg = message_of<std::invalid_argument>([&] { Layer(context(), cfg, random_params(kCfg, 1)); });
  EXPECT_THAT(msg, AllOf(HasSubstr("nv = 3"), HasSubstr("nk = 2")));
}

TEST_F(Errors, ConfigZeroSizes) {
  for (auto mutate : {+[](Config& c) { c.nv = 0; }, +[](Config& c) { c.nk = 0; }, +[](Config& c) { c.conv_taps = 0; },
                      +[](Config& c) { c.checkpoint_interval = -1; }}) {
    Config cfg = kCfg;
    mutate(cfg);
    EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), cfg, random_params(kCfg, 1)); }),
                HasSubstr("config"));
  }
}

// Every size a config holds is bounded (Config::check) and computed in 64 bits: heads, taps and
// intervals out of range are refused by name before anything is built, with no integer overflow on
// the way (channels() of INT_MAX heads), and an interval whose shared memory would once wrap a
// 32-bit size makes the subgroup family give way to per-head, not fail at pipeline creation.
TEST_F(Errors, ConfigBounds) {
  struct Bad {
    void (*mutate)(Config&);
    const char* field;
  };
  const Bad bad[] = {{+[](Config& c) { c.nv = 16777216; }, "nv = 16777216"},
                     {+[](Config& c) { c.nk = INT_MAX; }, "nk = 2147483647"},
                     {+[](Config& c) { c.nv = c.nk = kMaxHeads + 1; }, "nv = 4097"},
                     {+[](Config& c) { c.conv_taps = kMaxConvTaps + 1; }, "conv_taps = 17"},
                     {+[](Config& c) { c.checkpoint_interval = 3033164; }, "checkpoint_interval = 3033164"},
                     {+[](Config& c) { c.rms_eps = NAN; }, "rms_eps"},
                     {+[](Config& c) { c.serial_split = 3; }, "serial_split = 3"}};
  for (const auto& b : bad) {
    Config cfg = kCfg;
    b.mutate(cfg);
    EXPECT_THAT(message_of<std::invalid_argument>([&] { cfg.check(); }), HasSubstr(b.field));
    EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), cfg, random_params(kCfg, 1)); }),
                HasSubstr(b.field));
  }
  Config big = kCfg;
  big.nv = big.nk = INT_MAX;
  EXPECT_EQ(big.channels(), 3 * std::int64_t(INT_MAX) * kHeadDim);
  Config cfg = kCfg;
  cfg.conv_taps = kMaxConvTaps;
  EXPECT_NO_THROW(cfg.check());
  cfg = kCfg;
  cfg.checkpoint_interval = kMaxCheckpointInterval;  // megabytes of shared memory: no device has them
  EXPECT_EQ(Layer(context(), cfg, random_params(cfg, 1)).variant(), Variant::PerHead);
}

// Config::check_finite names the first NaN or Inf of an input (std::invalid_argument) and of an
// output made from finite inputs (gdn::Error: here gradients overflowing fp32 from dout = 3e38).
TEST_F(Errors, CheckFiniteNamesTheFirstNonFiniteElement) {
  Config cfg = kCfg;
  cfg.check_finite = true;
  const Params p = random_params(cfg, 1);
  Layer layer(context(), cfg, p);
  Batch x = random_batch(cfg, 1, 3, 2);
  x.z[3] = NAN;
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(1, 3, {x.qkv, x.z, x.a, x.b}); }),
              AllOf(HasSubstr("forward: z element 3 (index [0, 0, 3]) is NaN"), HasSubstr("check_finite")));
  x.z[3] = 0.5f;
  Tape tape;
  layer.forward(1, 3, {x.qkv, x.z, x.a, x.b}, &tape);
  std::vector<float> dout(x.dout.size(), 3e38f);
  EXPECT_THAT(message_of<Error>([&] { layer.backward(tape, dout); }),
              AllOf(HasSubstr("backward: dqkv element 0"), HasSubstr("from finite inputs")));
  dout[1] = INFINITY;
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.backward(tape, dout); }),
              HasSubstr("backward: dout element 1 (index [0, 0, 1]) is Inf"));
}

// family_support says which families run and why not, without building a pipeline, and agrees with
// what a Layer resolves Variant::Auto to (gdn info uses it).
TEST_F(Errors, FamilySupportAgreesWithTheLayer) {
  for (const int interval : {0, 4, 64}) {
    Config cfg = kCfg;
    cfg.variant = Variant::Auto;
    cfg.checkpoint_interval = interval;
    const auto families = family_support(*context(), cfg);
    ASSERT_EQ(families.size(), 3u);
    EXPECT_EQ(families[0].variant, Variant::Chunked);
    EXPECT_EQ(families[1].variant, Variant::Subgroup);
    EXPECT_EQ(families[2].variant, Variant::PerHead);
    const FamilySupport* first = nullptr;
    for (const auto& f : families) {
      EXPECT_EQ(f.runs, f.why_not.empty());
      if (f.runs && !first) first = &f;
    }
    ASSERT_NE(first, nullptr);
    Layer layer(context(), cfg, random_params(cfg, 1));
    EXPECT_EQ(layer.variant(), first->variant) << "interval " << interval;
    EXPECT_EQ(layer.config().matrix_units, first->matrix_units);
    EXPECT_EQ(layer.config().checkpoint_interval, first->checkpoint_interval);
  }
  Config cfg = kCfg;
  cfg.variant = Variant::Auto;
  cfg.checkpoint_interval = 64;  // over any chunk, and the subgroup backward's shared memory here
  const auto families = family_support(*context(), cfg);
  EXPECT_THAT(families[0].why_not, HasSubstr("1 to 32"));
  EXPECT_THAT(families[1].why_not, HasSubstr("shared memory"));
  EXPECT_TRUE(families[2].runs);
}

TEST_F(Errors, ParamSizes) {
  Params p = random_params(kCfg, 1);
  p.conv.pop_back();
  EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), kCfg, p); }),
              AllOf(HasSubstr("conv"), HasSubstr("2047"), HasSubstr("2048")));
  p = random_params(kCfg, 1);
  p.norm.resize(64);
  EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), kCfg, p); }),
              AllOf(HasSubstr("norm"), HasSubstr("64"), HasSubstr("128")));
  p = random_params(kCfg, 1);
  p.a_log.resize(3);
  EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), kCfg, p); }), HasSubstr("a_log"));
}

TEST_F(Errors, HostInputLengths) {
  Layer layer(context(), kCfg, random_params(kCfg, 1));
  const Batch x = random_batch(kCfg, 2, 3, 5);
  auto bad = x;
  bad.qkv.resize(bad.qkv.size() - 1);
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(2, 3, {bad.qkv, x.z, x.a, x.b}); }),
              AllOf(HasSubstr("qkv"), HasSubstr(std::to_string(x.qkv.size())), HasSubstr("[2, 3, 512]")));
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(2, 3, {x.qkv, x.a, x.a, x.b}); }),
              AllOf(HasSubstr("z"), HasSubstr("[2, 3, 256]")));
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(2, 3, {x.qkv, x.z, x.a, x.z}); }),
              AllOf(HasSubstr("b has"), HasSubstr("[2, 3, 2]")));
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(0, 3, {x.qkv, x.z, x.a, x.b}); }),
              HasSubstr("batch = 0"));
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(2, 0, {x.qkv, x.z, x.a, x.b}); }),
              HasSubstr("tokens = 0"));
  Tape tape;
  layer.forward(2, 3, {x.qkv, x.z, x.a, x.b}, &tape);
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.backward(tape, std::span(x.dout).first(10)); }),
              AllOf(HasSubstr("dout"), HasSubstr("10")));
}

TEST_F(Errors, DeviceInputShapes) {
  auto ctx = context();
  Layer layer(ctx, kCfg, random_params(kCfg, 1));
  DeviceInputs in{Tensor(ctx, {2, 3, 512}, "qkv"), Tensor(ctx, {2, 3, 256}, "z"), Tensor(ctx, {2, 3, 2}, "a"),
                  Tensor(ctx, {2, 4, 2}, "b")};
  Tensor out;
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(in, out); }),
              AllOf(HasSubstr("b is [2, 4, 2]"), HasSubstr("expected [2, 3, 2]")));
  in.b = Tensor(ctx, {2, 3, 2}, "b");
  in.qkv = Tensor(ctx, {2, 3, 500}, "qkv");
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(in, out); }),
              AllOf(HasSubstr("qkv is [2, 3, 500]"), HasSubstr("512")));
  in.qkv = Tensor(ctx, {2, 3, 512}, "qkv");
  Tensor wrong_out(ctx, {2, 3, 255}, "out");
  EXPECT_THAT(message_of<std::invalid_argument>([&] { layer.forward(in, wrong_out); }),
              AllOf(HasSubstr("out is [2, 3, 255]"), HasSubstr("[2, 3, 256]")));
  EXPECT_THAT(message_of<std::invalid_argument>([&] { Tensor(ctx, {2, 0, 3}, "zero"); }), HasSubstr("zero"));
}

TEST_F(Errors, TapeFromAnotherLayerOrNeverRecorded) {
  Layer first(context(), kCfg, random_params(kCfg, 1));
  Layer second(context(), kCfg, random_params(kCfg, 1));
  const Batch x = random_batch(kCfg, 1, 3, 5);
  Tape empty;
  EXPECT_THAT(message_of<std::invalid_argument>([&] { first.backward(empty, x.dout); }), HasSubstr("no forward"));
  Tape tape;
  first.forward(1, 3, {x.qkv, x.z, x.a, x.b}, &tape);
  EXPECT_THAT(message_of<std::invalid_argument>([&] { second.backward(tape, x.dout); }), HasSubstr("another layer"));
  EXPECT_NO_THROW(first.backward(tape, x.dout));
}

// A tape another layer (another family: another layout) recorded is remade by the next forward.
TEST_F(Errors, TapeRecordedAgainByAnotherFamily) {
  Config per_head = kCfg, chunked = kCfg;
  per_head.variant = Variant::PerHead;
  chunked.variant = Variant::Chunked;
  const Params p = random_params(kCfg, 1);
  Layer first(context(), per_head, p), second(context(), chunked, p);
  const Batch x = random_batch(kCfg, 1, 20, 5);
  Tape tape, own;
  first.forward(1, 20, {x.qkv, x.z, x.a, x.b}, &tape);
  second.forward(1, 20, {x.qkv, x.z, x.a, x.b}, &tape);
  second.forward(1, 20, {x.qkv, x.z, x.a, x.b}, &own);
  EXPECT_EQ(second.backward(tape, x.dout).dqkv, second.backward(own, x.dout).dqkv);
}

// A tensor may exceed one binding's range (calls bind it in parts), not the device's memory.
TEST_F(Errors, TensorOverTheDevicesMemoryNamesIt) {
  auto ctx = context();
  const std::int64_t floats = std::int64_t(ctx->device().max_storage_buffer_range / 4) + 1;
  EXPECT_NO_THROW(Tensor(ctx, {floats}, "over one binding"));
  EXPECT_THAT(message_of<Error>([&] { Tensor(ctx, {std::int64_t(1) << 38}, "huge_tensor"); }), HasSubstr("huge_tensor"));
}

// An interval whose backward segment does not fit the device's shared memory: the subgroup family
// is refused at construction with the reason, and Auto falls back to the per-head family.
TEST_F(Errors, SubgroupRefusesAnIntervalOverSharedMemory) {
  Config cfg = kCfg;
  cfg.checkpoint_interval = 64;  // 64 staged steps: about 90 KiB, over any device's limit here
  cfg.variant = Variant::Subgroup;
  EXPECT_THAT(message_of<Error>([&] { Layer(context(), cfg, random_params(cfg, 1)); }),
              AllOf(HasSubstr("subgroup kernels cannot run"), HasSubstr("per-head")));
  cfg.variant = Variant::Auto;
  EXPECT_EQ(Layer(context(), cfg, random_params(cfg, 1)).variant(), Variant::PerHead);
}

// The chunked family takes chunks of 1 to 32 tokens (the checkpoint interval): 33 is a bad config
// (std::invalid_argument, with the range), refused at construction whatever the device, and 32 is built.
TEST_F(Errors, ChunkedRefusesAChunkOver32) {
  Config cfg = kCfg;
  cfg.variant = Variant::Chunked;
  cfg.checkpoint_interval = 33;
  EXPECT_THAT(message_of<std::invalid_argument>([&] { Layer(context(), cfg, random_params(kCfg, 1)); }),
              AllOf(HasSubstr("checkpoint_interval"), HasSubstr("33"), HasSubstr("0 to 32")));
  cfg.checkpoint_interval = 32;
  EXPECT_EQ(Layer(context(), cfg, random_params(cfg, 1)).variant(), Variant::Chunked);
}

// An interval of 0 takes the family's default, which config() reports with the family that runs.
TEST_F(Errors, DefaultIntervalResolves) {
  Config cfg = kCfg;
  cfg.checkpoint_interval = 0;
  for (Variant v : {Variant::PerHead, Variant::Auto}) {
    cfg.variant = v;
    const Layer layer(context(), cfg, random_params(cfg, 1));
    EXPECT_NE(layer.config().variant, Variant::Auto);
    EXPECT_EQ(layer.config().variant, layer.variant());
    EXPECT_EQ(layer.config().checkpoint_interval, layer.variant() == Variant::Chunked ? 16 : 8);
  }
}

// matrix_units resolves to whether the matrix-unit kernels run: only the chunked family at chunks
// of 16, only where the device has them, never when the config turns them off.
TEST_F(Errors, MatrixUnitsResolveToWhatRuns) {
  const bool device_has = context()->device().matrix_f16_16x16x16;
  Config cfg = kCfg;
  for (const auto& [variant, interval, asked, want] :
       {std::tuple{Variant::Chunked, 16, true, device_has}, std::tuple{Variant::Chunked, 16, false, false},
        std::tuple{Variant::Chunked, 8, true, false}, std::tuple{Variant::Subgroup, 16, true, false},
        std::tuple{Variant::PerHead, 16, true, false}}) {
    cfg.variant = variant;
    cfg.checkpoint_interval = interval;
    cfg.matrix_units = asked;
    const Layer layer(context(), cfg, random_params(cfg, 1));
    EXPECT_EQ(layer.config().matrix_units, want) << to_string(variant) << ", interval " << interval;
  }
}

TEST_F(Errors, VariantNames) {
  EXPECT_EQ(parse_variant("chunked"), Variant::Chunked);
  EXPECT_EQ(to_string(Variant::Chunked), "chunked");
  EXPECT_EQ(parse_variant("per-head"), Variant::PerHead);
  EXPECT_EQ(parse_variant("subgroup"), Variant::Subgroup);
  EXPECT_EQ(parse_variant("auto"), Variant::Auto);
  EXPECT_THAT(message_of<std::invalid_argument>([] { parse_variant("fast"); }), HasSubstr("fast"));
}

}  // namespace
}  // namespace gdn::test
