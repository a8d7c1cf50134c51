// SPDX-License-Identifier: MIT
// The `gdn` tool run in-process: `gdn run`'s outputs swapped into --out whole or not at all, and
// `gdn`, `gdn info`, `gdn bench`.
#include "cli_support.hpp"

namespace gdn::test {
namespace {

// ---- gdn run: outputs, atomically ----------------------------------------------------------------

// Every file and directory under `root`, with each file's contents: a snapshot to compare.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    if (e.is_directory()) {
      m[rel + "/"] = "";
    } else {
      std::ifstream f(e.path(), std::ios::binary);
      m[rel] = std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    }
  }
  return m;
}

std::vector<cli::Output> five_outputs() {
  std::vector<cli::Output> o;
  for (const char* n : {"out", "dqkv", "dz", "da", "db"}) o.push_back({n, {2}, {1.0f, 2.0f}});
  return o;
}

// A failure at any output's swap leaves --out exactly as it was: an earlier complete set (da.npy
// missing, a file of the user's beside them), no staging directory left. Then the same call, not
// failing, replaces the set.
TEST_F(Cli, OutputsStayAsTheyWereOnAFailureAtEachOutput) {
  fs::create_directories(out);
  for (const char* n : {"out", "dqkv", "dz", "db"}) std::ofstream(out / (std::string(n) + ".npy")) << "old " << n;
  std::ofstream(out / "notes.txt") << "mine";
  const auto before = snapshot(out);
  const auto outputs = five_outputs();
  for (const auto& fail_at : outputs) {
    EXPECT_THROW(cli::write_outputs(out, outputs,
                                    [&](const std::string& n) {
                                      if (n == fail_at.name) throw std::runtime_error("injected at " + n);
                                    }),
                 std::runtime_error)
        << fail_at.name;
    EXPECT_EQ(snapshot(out), before) << "failure at " << fail_at.name;
  }
  cli::write_outputs(out, outputs);
  const auto after = snapshot(out);
  EXPECT_EQ(after.size(), 6u);  // five outputs and notes.txt: no staging directory
  EXPECT_EQ(after.at("notes.txt"), "mine");
  EXPECT_EQ(npy::read_f32(out / "da.npy").data, (std::vector<float>{1.0f, 2.0f}));
}

// An output name held by a directory is refused before anything is written (it was moved away and
// lost by an earlier rollback).
TEST_F(Cli, RefusesAnOutputNameThatIsADirectory) {
  put_all();
  fs::create_directories(out / "dz.npy");
  std::ofstream(out / "dz.npy" / "keep") << "x";
  std::ofstream(out / "out.npy") << "old";
  const auto before = snapshot(out);
  const Result r = gdn_cli(run_args({"--backward"}));
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("dz.npy"), HasSubstr("not a regular file")));
  EXPECT_EQ(snapshot(out), before);
}

// A staging directory that a killed run left (its process gone, mid-swap: out.npy already new,
// dqkv.npy new where there was none) is rolled back and removed by the next run into --out.
TEST_F(Cli, RollsBackAStagingDirectoryOfAKilledRun) {
  fs::create_directories(out);
  std::ofstream(out / "out.npy") << "old out";
  const auto before = snapshot(out);
  const fs::path stale = out / ".gdn-run-2147483646-7.partial";  // a pid above any pid_max
  fs::create_directories(stale);
  std::ofstream(stale / "manifest") << "out 1\ndqkv 0\n";
  fs::rename(out / "out.npy", stale / "out.npy.old");
  std::ofstream(out / "out.npy") << "new out";
  std::ofstream(out / "dqkv.npy") << "new dqkv";
  // The next run fails at its first swap: what is left is the state before the killed run.
  EXPECT_THROW(cli::write_outputs(out, five_outputs(), [](const std::string&) { throw std::runtime_error("stop"); }),
               std::runtime_error);
  EXPECT_EQ(snapshot(out), before);
}

TEST_F(Cli, RunHelp) {
  const Result r = gdn_cli({"run", "--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("--backward"), HasSubstr("--ckpt"), HasSubstr("--variant")));
}

// ---- gdn, gdn info ---------------------------------------------------------------------------------

TEST_F(Cli, Info) {
  const Result r = gdn_cli({"info"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(context()->device().name));
  EXPECT_THAT(r.out, AllOf(HasSubstr("subgroup size"), HasSubstr("max storage buffer range"),
                           HasSubstr("max shared memory"), HasSubstr("device-local heaps"),
                           HasSubstr("timestamps")));
  EXPECT_THAT(r.out, ::testing::AnyOf(HasSubstr("auto runs                  per-head"),
                                      HasSubstr("auto runs                  subgroup"),
                                      HasSubstr("auto runs                  chunked")));
  EXPECT_EQ(gdn_cli({"info", "--bogus"}).rc, 2);
}

TEST_F(Cli, Help) {
  for (const char* h : {"--help", "-h", "help"}) {
    const Result r = gdn_cli({h});
    EXPECT_EQ(r.rc, 0) << h;
    EXPECT_THAT(r.out, AllOf(HasSubstr("info"), HasSubstr("run"), HasSubstr("bench"), HasSubstr("--in DIR"),
                             HasSubstr("--backward"), HasSubstr("--eps"), HasSubstr("--ckpt"), HasSubstr("--variant")))
        << h;
  }
  const Result none = gdn_cli({});
  EXPECT_EQ(none.rc, 2);
  EXPECT_THAT(none.err, HasSubstr("usage: gdn"));
}

// `gdn bench` at a tiny shape, every variant: the table, the per-kernel rows, the tape report and the
// JSON file. (Its times on lavapipe mean nothing; that it runs end to end and reports does.)
TEST_F(Cli, BenchRunsAndWritesJson) {
  for (const char* variant : {"per-head", "subgroup", "chunked"}) {
    const fs::path json = dir / (std::string(variant) + ".json");
    const Result r = gdn_cli({"bench", "--batch", "1", "--tokens", "9", "--nv", "2", "--nk", "1", "--ckpt", "4",
                              "--repeats", "2", "--warmup", "1", "--variant", variant, "--json", json.string()});
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::string v = variant;
    const std::string rec = v == "subgroup" ? "rec_bwd2" : (v == "chunked" ? "chunk_grads" : "rec_bwd");
    EXPECT_THAT(r.out, AllOf(HasSubstr("forward (no tape)"), HasSubstr("forward (tape)"), HasSubstr("backward"),
                             HasSubstr(rec), HasSubstr("conv_fwd"), HasSubstr("ceilings measured in this run"),
                             HasSubstr("after the timed work"),
                             HasSubstr("tape:"), HasSubstr("checkpoints"), HasSubstr(std::string("variant ") + variant)));
    EXPECT_THAT(r.err, HasSubstr("repeat 2/2"));  // progress
    if (v == "chunked")  // on the matrix units, or why not
      for (const auto& f : family_support(*Context::create(), Config{.nv = 2, .nk = 1}))
        if (f.variant == Variant::Chunked)
          EXPECT_THAT(r.out, HasSubstr(f.matrix_units ? "variant chunked (matrix units)"
                                                      : "(fp32 kernels, not the matrix units: " + f.matrix_units_why_not + ")"));
    std::ifstream f(json);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_THAT(text, AllOf(HasSubstr("\"passes\""), HasSubstr("\"tape_bytes\""), HasSubstr("\"copy_gb_per_s\""),
                            HasSubstr("\"slowed\": false"),
                            HasSubstr("\"" + rec + "\"")));
  }
  const Result bad = gdn_cli({"bench", "--tokens", "0"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_THAT(bad.err, HasSubstr("--tokens"));
  // Heads past the bound: refused by the config check before any input is allocated.
  const Result heads = gdn_cli({"bench", "--nv", "2147483647", "--nk", "1"});
  EXPECT_EQ(heads.rc, 2);
  EXPECT_THAT(heads.err, HasSubstr("nv = 2147483647"));
}

// A GPU run during which either ceiling fell by over 15%, that began or ended with one under 95% of
// the best of the bench run, or whose conv_fwd fell far under the copy ceiling, counts as slowed
// (and is timed again); a CPU driver's never does.
TEST(Bench, SlowedWhenACeilingFalls) {
  const DevicePeaks before{.copy_gb_per_s = 4000, .fma_gflop_per_s = 60000};
  EXPECT_FALSE(bench::slowed(before, before, false));
  EXPECT_FALSE(bench::slowed(before, {.copy_gb_per_s = 3500, .fma_gflop_per_s = 52000}, false));
  EXPECT_TRUE(bench::slowed(before, {.copy_gb_per_s = 3300, .fma_gflop_per_s = 60000}, false));
  EXPECT_TRUE(bench::slowed(before, {.copy_gb_per_s = 4000, .fma_gflop_per_s = 50000}, false));
  EXPECT_FALSE(bench::slowed(before, {.copy_gb_per_s = 1000, .fma_gflop_per_s = 1000}, true));
  // against the best ceilings of the bench run: an attempt whose FMA ceiling was 86% of the best
  // throughout (an H100's, after a discarded attempt: 52155 against 60376 GFLOP/s) is slowed
  const DevicePeaks best{.copy_gb_per_s = 3029, .fma_gflop_per_s = 60376};
  EXPECT_TRUE(bench::below_best(best, {.copy_gb_per_s = 3022, .fma_gflop_per_s = 52155}, false));
  EXPECT_FALSE(bench::below_best(best, {.copy_gb_per_s = 3022, .fma_gflop_per_s = 58000}, false));
  // and one that began at 92% of it (55810 against 60375 GFLOP/s; 57643 at its end), the serial
  // passes 6% slower than in the next attempt
  EXPECT_TRUE(bench::below_best({.copy_gb_per_s = 3012, .fma_gflop_per_s = 60375},
                                {.copy_gb_per_s = 3006, .fma_gflop_per_s = 55810}, false));
  EXPECT_TRUE(bench::below_best(best, {.copy_gb_per_s = 2700, .fma_gflop_per_s = 60376}, false));
  EXPECT_FALSE(bench::below_best(best, {.copy_gb_per_s = 10, .fma_gflop_per_s = 10}, true));
  // conv_fwd at the 27B shape, float32 qkv: 335 MB in 0.110 ms on an H200 (72% of 4268 GB/s) and in
  // 0.133 ms on an H100 (84% of 3011) are fine; in 0.273 ms on the H100 (41%, a run slowed as a whole)
  // and 0.194 ms (58%) slowed
  const double f32 = bench::conv_slowed_share(false), bf16 = bench::conv_slowed_share(true);
  EXPECT_FALSE(bench::kernel_slowed(335e6, 0.110, 4268, f32, false));
  EXPECT_FALSE(bench::kernel_slowed(335e6, 0.133, 3011, f32, false));
  EXPECT_TRUE(bench::kernel_slowed(335e6, 0.273, 3011, f32, false));
  EXPECT_TRUE(bench::kernel_slowed(335e6, 0.194, 3011, f32, false));
  EXPECT_FALSE(bench::kernel_slowed(335e6, 0.37, 4268, f32, true));  // never on a CPU driver
  EXPECT_FALSE(bench::kernel_slowed(0.2e6, 0.05, 4268, f32, false));  // a tiny shape: latency-bound
  // bfloat16 qkv: 252 MB in 0.112 ms on the H200 (53%) and 0.119 ms on the H100 (70%) are fine; at half
  // that bandwidth slowed
  EXPECT_FALSE(bench::kernel_slowed(252e6, 0.112, 4268, bf16, false));
  EXPECT_FALSE(bench::kernel_slowed(252e6, 0.119, 3011, bf16, false));
  EXPECT_TRUE(bench::kernel_slowed(252e6, 0.224, 4268, bf16, false));
}

TEST_F(Cli, UnknownCommand) {
  const Result r = gdn_cli({"frobnicate", "--in", "x"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("unknown command 'frobnicate'"), HasSubstr("info, run or bench")));
  EXPECT_THAT(r.out, Not(HasSubstr("usage")));
}

}  // namespace
}  // namespace gdn::test
