// SPDX-License-Identifier: MIT
// The `gdn` tool run in-process: `gdn run` agrees bit for bit with the host API it wraps, and every
// input that does not fit docs/spec.md's contract is refused with exit 2, a message naming the file
// (or flag) with the expected and the actual shape, and nothing written.
#include "cli_support.hpp"

namespace gdn::test {
namespace {

// ---- gdn run: results ----------------------------------------------------------------------------

TEST_F(Cli, RunForwardMatchesHostApi) {
  put_all(false);
  const Result r = gdn_cli(run_args());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("B=2 T=5 nv=2 nk=1 K=4"), HasSubstr("out.npy")));

  Layer layer(context(), pr.cfg, pr.p);
  HostCarry carry;
  const auto want = layer.forward(pr.B, pr.T, {.qkv = pr.x.qkv, .z = pr.x.z, .a = pr.x.a, .b = pr.x.b}, nullptr, &carry);
  expect_bitwise("out", read_out("out"), {2, 5, 256}, want);
  expect_bitwise("ht", read_out("ht"), {2, 2, 128, 128}, carry.ht);
  expect_bitwise("conv_state_out", read_out("conv_state_out"), {2, 3, 512}, carry.conv_state);
  // Only the output and the states the windows leave: no gradients, no staging leftovers.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(out)) files.push_back(e.path().filename().string());
  EXPECT_THAT(files, ::testing::UnorderedElementsAre("out.npy", "ht.npy", "conv_state_out.npy"));
}

TEST_F(Cli, RunBackwardMatchesHostApiWithFlags) {
  // The flags reach the layer: a non-default eps and checkpoint interval, an explicit variant.
  pr.cfg.rms_eps = 1e-3f;
  pr.cfg.checkpoint_interval = 3;
  pr.cfg.variant = Variant::PerHead;
  put_all();
  const Result r = gdn_cli(run_args({"--backward", "--eps", "1e-3", "--ckpt=3", "--variant", "per-head"}));
  ASSERT_EQ(r.rc, 0) << r.err;

  Layer layer(context(), pr.cfg, pr.p);
  Tape tape;
  const auto want = layer.forward(pr.B, pr.T, {pr.x.qkv, pr.x.z, pr.x.a, pr.x.b}, &tape);
  const HostGrads g = layer.backward(tape, pr.x.dout);
  expect_bitwise("out", read_out("out"), {2, 5, 256}, want);
  expect_bitwise("dqkv", read_out("dqkv"), {2, 5, 512}, g.dqkv);
  expect_bitwise("dz", read_out("dz"), {2, 5, 256}, g.dz);
  expect_bitwise("da", read_out("da"), {2, 5, 2}, g.da);
  expect_bitwise("db", read_out("db"), {2, 5, 2}, g.db);
  expect_bitwise("dconv", read_out("dconv"), {512, pr.cfg.conv_taps}, g.dconv);
  expect_bitwise("da_log", read_out("da_log"), {2}, g.da_log);
  expect_bitwise("ddt_bias", read_out("ddt_bias"), {2}, g.ddt_bias);
  expect_bitwise("dnorm", read_out("dnorm"), {128}, g.dnorm);
  expect_bitwise("dconv_state", read_out("dconv_state"), {2, 3, 512}, g.dconv_state);
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(out)) ++n;
  EXPECT_EQ(n, 12u);  // and ht, conv_state_out; no dh0 without h0.npy
  EXPECT_FALSE(fs::exists(out / "dh0.npy"));
}

// --fast reaches the layer (Config::precision fast), and the summary says which precision ran: fast
// on the matrix units, else exact with why.
TEST_F(Cli, RunFastSaysWhichPrecisionRan) {
  put_all();
  const Result r = gdn_cli(run_args({"--fast"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  Config cfg = pr.cfg;
  cfg.precision = Precision::Fast;
  Layer layer(context(), cfg, pr.p);
  expect_bitwise("out", read_out("out"), {2, 5, 256}, layer.forward(pr.B, pr.T, {pr.x.qkv, pr.x.z, pr.x.a, pr.x.b}));
  EXPECT_THAT(r.out, HasSubstr(layer.config().precision == Precision::Fast
                                   ? "precision fast"
                                   : "precision exact (--fast: no matrix units run here)"));
}

// --bf16: the streams rounded to bfloat16, the device API with bfloat16 tensors; the outputs are the
// float32 values of its bfloat16 results, bit for bit.
TEST_F(Cli, RunBf16MatchesTheDeviceApiWithBf16Tensors) {
  put_all();
  const Result r = gdn_cli(run_args({"--backward", "--bf16"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("bfloat16 boundary tensors"), std::string::npos) << r.out;

  Layer layer(context(), pr.cfg, pr.p);
  auto tensor = [&](const std::vector<float>& v, Shape shape, const char* name) {
    Tensor t(context(), std::move(shape), name, DType::BFloat16);
    t.upload(v);
    return t;
  };
  const std::int64_t B = pr.B, T = pr.T;
  const DeviceInputs in{tensor(pr.x.qkv, {B, T, 512}, "qkv"), tensor(pr.x.z, {B, T, 256}, "z"),
                        tensor(pr.x.a, {B, T, 2}, "a"), tensor(pr.x.b, {B, T, 2}, "b")};
  Tape tape;
  Tensor out;
  layer.forward(in, out, &tape);
  DeviceGrads g;
  layer.backward(tape, tensor(pr.x.dout, {B, T, 256}, "dout"), g);
  expect_bitwise("out", read_out("out"), {2, 5, 256}, out.download());
  expect_bitwise("dqkv", read_out("dqkv"), {2, 5, 512}, g.dqkv.download());
  expect_bitwise("dz", read_out("dz"), {2, 5, 256}, g.dz.download());
  expect_bitwise("da", read_out("da"), {2, 5, 2}, g.da.download());
  expect_bitwise("db", read_out("db"), {2, 5, 2}, g.db.download());
  expect_bitwise("dnorm", read_out("dnorm"), {128}, g.dnorm.download());
  for (float v : read_out("dqkv").data) ASSERT_EQ(from_bfloat16(to_bfloat16(v)), v) << "a bfloat16 value";
}

// cu_seqlens.npy (int32 or int64): B = 1 stream of packed sequences, as the host API gives it; bad
// offsets refused with the index, nothing written.
TEST_F(Cli, RunPackedSequencesFromCuSeqlens) {
  pr.B = 1;
  pr.T = 10;
  pr.x = random_batch(pr.cfg, pr.B, pr.T, 33);
  put_all();
  const std::vector<std::int64_t> cu{0, 3, 4, 10};
  std::string i64, i32;
  for (auto v : cu) {
    i64.append(reinterpret_cast<const char*>(&v), 8);
    const auto w = std::int32_t(v);
    i32.append(reinterpret_cast<const char*>(&w), 4);
  }
  write_raw_npy(in / "cu_seqlens.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", i64);
  Result r = gdn_cli(run_args({"--backward"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  Layer layer(context(), pr.cfg, pr.p);
  Tape tape;
  HostCarry carry;
  const auto want = layer.forward(1, 10, {.qkv = pr.x.qkv, .z = pr.x.z, .a = pr.x.a, .b = pr.x.b, .cu_seqlens = cu},
                                  &tape, &carry);
  const HostGrads g = layer.backward(tape, pr.x.dout);
  expect_bitwise("out", read_out("out"), {1, 10, 256}, want);
  expect_bitwise("ht", read_out("ht"), {3, 2, 128, 128}, carry.ht);
  expect_bitwise("dqkv", read_out("dqkv"), {1, 10, 512}, g.dqkv);
  expect_bitwise("dconv_state", read_out("dconv_state"), {3, 3, 512}, g.dconv_state);

  write_raw_npy(in / "cu_seqlens.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", i32);
  fs::remove_all(out);
  r = gdn_cli(run_args());
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_bitwise("out", read_out("out"), {1, 10, 256}, want);

  fs::remove_all(out);
  const std::int64_t bad[] = {0, 4, 3, 10};
  write_raw_npy(in / "cu_seqlens.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }",
                std::string(reinterpret_cast<const char*>(bad), sizeof bad));
  expect_refused(run_args(), {"cu_seqlens[2] = 3 is not above cu_seqlens[1] = 4"});
  write_raw_npy(in / "cu_seqlens.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "abcd");
  expect_refused(run_args(), {"cu_seqlens.npy", "expected '<i4' or '<i8'"});
}

// The carried states as files: h0.npy and conv_state.npy in, dht.npy and dconv_state_out.npy into
// the backward, dh0.npy and dconv_state.npy out; as the host API gives them.
TEST_F(Cli, RunCarriesStateFiles) {
  put_all();
  const std::size_t S = std::size_t(pr.B) * pr.cfg.nv * kHeadDim * kHeadDim,
                    CS = std::size_t(pr.B) * (pr.cfg.conv_taps - 1) * pr.cfg.channels();
  const auto h0 = uniform(S, 41, -0.3f, 0.3f), cs = uniform(CS, 42, -1, 1), dht = uniform(S, 43, -0.3f, 0.3f),
             dcs = uniform(CS, 44, -1, 1);
  put("h0", {pr.B, pr.cfg.nv, kHeadDim, kHeadDim}, h0);
  put("conv_state", {pr.B, pr.cfg.conv_taps - 1, pr.cfg.channels()}, cs);
  put("dht", {pr.B, pr.cfg.nv, kHeadDim, kHeadDim}, dht);
  put("dconv_state_out", {pr.B, pr.cfg.conv_taps - 1, pr.cfg.channels()}, dcs);
  const Result r = gdn_cli(run_args({"--backward"}));
  ASSERT_EQ(r.rc, 0) << r.err;

  Layer layer(context(), pr.cfg, pr.p);
  Tape tape;
  HostCarry carry;
  const auto want = layer.forward(
      pr.B, pr.T, {.qkv = pr.x.qkv, .z = pr.x.z, .a = pr.x.a, .b = pr.x.b, .h0 = h0, .conv_state = cs}, &tape, &carry);
  const HostCarry dcarry{dht, dcs};
  const HostGrads g = layer.backward(tape, pr.x.dout, &dcarry);
  expect_bitwise("out", read_out("out"), {2, 5, 256}, want);
  expect_bitwise("ht", read_out("ht"), {2, 2, 128, 128}, carry.ht);
  expect_bitwise("conv_state_out", read_out("conv_state_out"), {2, 3, 512}, carry.conv_state);
  expect_bitwise("dqkv", read_out("dqkv"), {2, 5, 512}, g.dqkv);
  expect_bitwise("dh0", read_out("dh0"), {2, 2, 128, 128}, g.dh0);
  expect_bitwise("dconv_state", read_out("dconv_state"), {2, 3, 512}, g.dconv_state);
}

TEST_F(Cli, RunRefusesAStateOfTheWrongShape) {
  put_all(false);
  put("h0", {pr.B, pr.cfg.nv, kHeadDim, 64}, std::vector<float>(std::size_t(pr.B) * pr.cfg.nv * kHeadDim * 64));
  expect_refused(run_args(), {"h0.npy", "[2, 2, 128, 64]", "[2, 2, 128, 128]"});
}

TEST_F(Cli, RunEpsChangesTheResult) {
  put_all(false);
  ASSERT_EQ(gdn_cli(run_args()).rc, 0);
  const auto def = read_out("out");
  ASSERT_EQ(gdn_cli(run_args({"--eps", "0.5"})).rc, 0);
  EXPECT_NE(read_out("out").data, def.data) << "--eps did not reach the layer";
}

TEST_F(Cli, RunCreatesNestedOutDirAndOverwrites) {
  put_all(false);
  out = dir / "a" / "b" / "out";
  ASSERT_EQ(gdn_cli(run_args()).rc, 0);
  ASSERT_TRUE(fs::exists(out / "out.npy"));
  ASSERT_EQ(gdn_cli(run_args()).rc, 0);  // an existing out.npy is replaced
  EXPECT_EQ(read_out("out").shape, (Shape{2, 5, 256}));
}

TEST_F(Cli, RunSubgroupVariantsRunOrFailCleanly) {
  // Either the device builds the kernels and the run succeeds, or the run fails with exit 1 (a
  // device limit, not the caller's input) and writes nothing.
  for (const char* variant : {"subgroup", "chunked"}) {
    put_all(true);
    const Result r = gdn_cli(run_args({"--backward", "--variant", variant}));
    if (r.rc == 0) {
      EXPECT_EQ(read_out("out").shape, (Shape{2, 5, 256}));
      EXPECT_EQ(read_out("da").shape, (Shape{2, 5, 2}));
    } else {
      EXPECT_EQ(r.rc, 1) << r.err;
      EXPECT_THAT(r.err, HasSubstr(variant));
      EXPECT_TRUE(out_is_empty());
    }
  }
}

// ---- gdn run: refused input files ----------------------------------------------------------------

TEST_F(Cli, RefusesMissingFile) {
  put_all(false);
  fs::remove(in / "z.npy");
  expect_refused(run_args(), {"z.npy", "missing", in.string()});
  fs::remove(in / "norm.npy");
  expect_refused(run_args(), {"z.npy, norm.npy", "missing"});
}

TEST_F(Cli, RefusesMissingDoutWithBackward) {
  put_all(false);
  expect_refused(run_args({"--backward"}), {"dout.npy", "missing"});
}

TEST_F(Cli, RefusesMissingInputDir) {
  in = dir / "nope";
  expect_refused(run_args(), {"--in", "nope", "no such directory"});
}

TEST_F(Cli, RefusesWrongDtype) {
  put_all(false);
  write_raw_npy(in / "a.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 5, 2), }",
                std::string(8 * 20, '\0'));
  expect_refused(run_args(), {"a.npy", "'<f8'", "expected '<f4'"});
}

TEST_F(Cli, RefusesFortranOrder) {
  put_all(false);
  write_raw_npy(in / "b.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 5, 2), }",
                std::string(4 * 20, '\0'));
  expect_refused(run_args(), {"b.npy", "fortran_order", "C order"});
}

TEST_F(Cli, RefusesTruncatedFile) {
  put_all(false);
  const auto path = in / "qkv.npy";
  fs::resize_file(path, fs::file_size(path) - 4);
  expect_refused(run_args(), {"qkv.npy", "truncated", "[2, 5, 512]"});
}

TEST_F(Cli, RefusesNotNpy) {
  put_all(false);
  std::ofstream(in / "conv.npy") << "conv,taps\n1,2\n";
  expect_refused(run_args(), {"conv.npy", "not a .npy file"});
}

struct Misfit {
  const char* label;
  const char* file;       // the file rewritten with `shape`
  Shape shape;
  std::vector<std::string> words;  // expected in the message (file, actual, expected)
};

void PrintTo(const Misfit& m, std::ostream* os) { *os << m.label; }

class CliMisfit : public Cli, public ::testing::WithParamInterface<Misfit> {};

TEST_P(CliMisfit, IsRefused) {
  const Misfit& m = GetParam();
  put_all();
  put_shape(m.file, m.shape);
  auto words = m.words;
  words.push_back(std::string(m.file) + ".npy: shape " + npy::shape_str(m.shape));
  expect_refused(run_args({"--backward"}), words);
  // The same with an existing --out directory: still empty afterwards.
  fs::create_directories(out);
  expect_refused(run_args({"--backward"}), words);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CliMisfit,
    ::testing::Values(
        Misfit{"QkvRank", "qkv", {10, 512}, {"expected [B, T, C]"}},
        Misfit{"QkvEmptyBatch", "qkv", {0, 5, 512}, {"expected [B, T, C]", ">= 1"}},
        Misfit{"ZWrongBatch", "z", {3, 5, 256}, {"expected [2, 5, nv*128]", "B=2, T=5 from qkv.npy"}},
        Misfit{"ZNotMultipleOf128", "z", {2, 5, 200}, {"expected [2, 5, nv*128]"}},
        Misfit{"CInconsistentWithNk", "qkv", {2, 5, 600},
               {"expected [2, 5, 256*nk + 256]", "nv=2 from z.npy", "C = (2*nk + nv)*128"}},
        Misfit{"CTooSmallForAKeyHead", "qkv", {2, 5, 256}, {"expected [2, 5, 256*nk + 256]"}},
        Misfit{"AWrongT", "a", {2, 4, 2},
               {"expected [2, 5, 2]", "[B, T, nv] with B=2, T=5 from qkv.npy and nv=2 from z.npy"}},
        Misfit{"BWrongNv", "b", {2, 5, 3}, {"expected [2, 5, 2]"}},
        Misfit{"ARank2", "a", {10, 2}, {"expected [2, 5, 2]"}},
        Misfit{"ConvWrongC", "conv", {500, 4}, {"expected [512, K]", "C=512 from qkv.npy"}},
        Misfit{"ConvRank1", "conv", {2048}, {"expected [512, K]"}},
        Misfit{"ConvNoTaps", "conv", {512, 0}, {"expected [512, K] with K >= 1"}},
        Misfit{"ALogWrongNv", "a_log", {3}, {"expected [2]", "nv=2 from z.npy"}},
        Misfit{"DtBiasScalarShape", "dt_bias", {1, 2}, {"expected [2]"}},
        Misfit{"NormNot128", "norm", {64}, {"expected [128]", "D=128"}},
        Misfit{"DoutWrongShape", "dout", {2, 5, 512}, {"expected [2, 5, 256]", "shape of out"}}),
    [](const ::testing::TestParamInfo<Misfit>& i) { return std::string(i.param.label); });

TEST_F(Cli, RefusesNvNotMultipleOfNk) {
  // nv = 3 value heads (z [2, 5, 384]) and nk = 2 key heads (C = (2*2 + 3)*128 = 896).
  put_all(false);
  put_shape("qkv", {2, 5, 896});
  put_shape("z", {2, 5, 384});
  put_shape("a", {2, 5, 3});
  put_shape("b", {2, 5, 3});
  put_shape("conv", {896, 4});
  put_shape("a_log", {3});
  put_shape("dt_bias", {3});
  expect_refused(run_args(), {"z.npy: shape [2, 5, 384]", "nv=3", "multiple of nk=2", "qkv.npy shape [2, 5, 896]"});
}

TEST_F(Cli, AcceptsOtherShapes) {
  // nv = 4, nk = 2 (rep 2), K = 2, B = 1, T = 3: everything inferred from the files.
  Problem& p = pr;
  p.B = 1;
  p.T = 3;
  p.cfg = Config{.nv = 4, .nk = 2, .conv_taps = 2};
  p.p = random_params(p.cfg, 3);
  p.x = random_batch(p.cfg, p.B, p.T, 4);
  put_all();
  const Result r = gdn_cli(run_args({"--backward"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("B=1 T=3 nv=4 nk=2 K=2"));
  EXPECT_EQ(read_out("out").shape, (Shape{1, 3, 512}));
  EXPECT_EQ(read_out("dqkv").shape, (Shape{1, 3, 1024}));
  EXPECT_EQ(read_out("da").shape, (Shape{1, 3, 4}));
}

// ---- gdn run: refused flags ----------------------------------------------------------------------

struct BadFlags {
  const char* label;
  std::vector<std::string> extra;  // appended to `run --in IN --out OUT`
  std::vector<std::string> words;
};

void PrintTo(const BadFlags& f, std::ostream* os) { *os << f.label; }

class CliBadFlags : public Cli, public ::testing::WithParamInterface<BadFlags> {};

TEST_P(CliBadFlags, IsRefused) {
  put_all();
  expect_refused(run_args(GetParam().extra), GetParam().words);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliBadFlags,
    ::testing::Values(BadFlags{"EpsNotANumber", {"--eps", "abc"}, {"--eps", "'abc'", "expected a finite number >= 0"}},
                      BadFlags{"EpsTrailingJunk", {"--eps", "1e-6x"}, {"--eps", "'1e-6x'"}},
                      BadFlags{"EpsNegative", {"--eps", "-1"}, {"--eps", "-1", "negative", ">= 0"}},
                      BadFlags{"EpsNan", {"--eps=nan"}, {"--eps", "finite"}},
                      BadFlags{"EpsMissingValue", {"--eps"}, {"--eps", "needs a value"}},
                      BadFlags{"CkptZero", {"--ckpt", "0"}, {"--ckpt", "0", ">= 1"}},
                      BadFlags{"CkptNotInteger", {"--ckpt", "1.5"}, {"--ckpt", "'1.5'", "integer >= 1"}},
                      BadFlags{"CkptHuge", {"--ckpt", "99999999999"}, {"--ckpt", "99999999999", ">= 1"}},
                      BadFlags{"VariantUnknown", {"--variant", "fast"}, {"--variant", "'fast'", "auto, subgroup, per-head or chunked"}},
                      BadFlags{"UnknownFlag", {"--bogus"}, {"unknown flag '--bogus'"}},
                      BadFlags{"StrayArgument", {"extra"}, {"unknown argument 'extra'"}},
                      BadFlags{"BackwardWithValue", {"--backward=yes"}, {"--backward takes no value"}},
                      BadFlags{"FastWithValue", {"--fast=1"}, {"--fast takes no value"}},
                      BadFlags{"RepeatedFlag", {"--ckpt", "2", "--ckpt", "3"}, {"--ckpt given more than once"}},
                      BadFlags{"ValueIsAFlag", {"--variant", "--backward"}, {"--variant needs a value"}},
                      BadFlags{"CkptOverChunked", {"--ckpt", "33", "--variant", "chunked"}, {"checkpoint_interval", "33", "0 to 32"}}),
    [](const ::testing::TestParamInfo<BadFlags>& i) { return std::string(i.param.label); });

TEST_F(Cli, RefusesMissingInOrOut) {
  put_all();
  expect_refused({"run", "--out", out.string()}, {"--in DIR is required"});
  expect_refused({"run", "--in", in.string()}, {"--out DIR is required"});
  expect_refused({"run"}, {"--in DIR is required"});
  expect_refused({"run", "--in", "--out", out.string()}, {"--in needs a value"});
}

// An input that is not a regular file is refused by what it is, without being opened: a FIFO would
// block the open for ever.
TEST_F(Cli, RefusesAFifoOrADirectoryAsAnInput) {
  put_all();
  fs::remove(in / "qkv.npy");
  ASSERT_EQ(::mkfifo((in / "qkv.npy").c_str(), 0600), 0);
  expect_refused(run_args(), {"qkv.npy", "not a regular file (a FIFO)"});
  fs::remove(in / "qkv.npy");
  fs::create_directories(in / "qkv.npy");
  expect_refused(run_args(), {"qkv.npy", "not a regular file (a directory)"});
}

// Every header is read and checked against the others before any payload: an 8 GiB qkv.npy (sparse)
// whose z.npy does not fit is refused at the cost of the headers, not read.
TEST_F(Cli, RefusesMisfitsBeforeReadingPayloads) {
  put_all();
  const fs::path qkv = in / "qkv.npy";
  write_raw_npy(qkv, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2097152, 1024), }", "");
  fs::resize_file(qkv, fs::file_size(qkv) + std::uintmax_t(8) * 1024 * 1024 * 1024);
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(run_args(), {"z.npy", "expected [1, 2097152, "});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "the payload was read";
}

// Sizes past the library's bounds are refused from the headers: 17 conv taps.
TEST_F(Cli, RefusesConvTapsOverTheBound) {
  put_all();
  put_shape("conv", {pr.cfg.channels(), 17});
  expect_refused(run_args(), {"conv_taps = 17", "1 to 16"});
}

// A NaN or Inf in an input is refused, naming the file, the element and its index; --allow-nonfinite
// runs anyway.
TEST_F(Cli, RefusesNonFiniteInputs) {
  put_all();
  std::vector<float> qkv = pr.x.qkv;
  qkv[700] = NAN;  // [0, 1, 188] of [2, 5, 512]
  put("qkv", {pr.B, pr.T, pr.cfg.channels()}, qkv);
  expect_refused(run_args(), {"qkv.npy", "element 700", "[0, 1, 188]", "NaN", "--allow-nonfinite"});
  std::vector<float> b = pr.x.b;
  b.back() = -INFINITY;
  put("qkv", {pr.B, pr.T, pr.cfg.channels()}, pr.x.qkv);
  put("b", {pr.B, pr.T, pr.cfg.nv}, b);
  expect_refused(run_args(), {"b.npy", "element 19", "Inf"});
  EXPECT_EQ(gdn_cli(run_args({"--allow-nonfinite"})).rc, 0);
}

TEST_F(Cli, RefusesOutThatIsAFile) {
  put_all();
  std::ofstream(out) << "x";
  const Result r = gdn_cli(run_args());
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--out"), HasSubstr("not a directory")));
  EXPECT_EQ(fs::file_size(out), 1u);
}

}  // namespace
}  // namespace gdn::test
