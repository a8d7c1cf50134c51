// SPDX-License-Identifier: MIT
// The CLI tests' fixture (tests/cli_test.cpp, cli_outputs_test.cpp): the `gdn` tool run in-process
// (gdn::cli::main with string streams), each test in a fresh temporary directory, with a small
// problem's inputs written as .npy files.
#pragma once
#include <gmock/gmock.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "bench.hpp"
#include "cli/npy.hpp"
#include "test_support.hpp"

namespace gdn::test {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Shape = std::vector<std::int64_t>;

struct Result {
  int rc = -1;
  std::string out, err;
};

inline Result gdn_cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  Result r;
  r.rc = cli::main(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A problem small enough for lavapipe: B=2, T=5, nv=2, nk=1 (C=512), K=4.
struct Problem {
  int B = 2, T = 5;
  Config cfg{.nv = 2, .nk = 1, .conv_taps = 4};
  Params p;
  Batch x;
};

inline Problem make_problem(std::uint64_t seed = 7) {
  Problem pr;
  pr.p = random_params(pr.cfg, seed);
  pr.x = random_batch(pr.cfg, pr.B, pr.T, seed + 10);
  return pr;
}

// A version-1.0 .npy file with the given header dict (padded like NumPy's) and raw payload.
inline void write_raw_npy(const fs::path& path, std::string dict, const std::string& payload) {
  while ((10 + dict.size() + 1) % 64) dict += ' ';
  dict += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += char(dict.size() & 0xff);
  bytes += char(dict.size() >> 8);
  std::ofstream(path, std::ios::binary) << bytes << dict << payload;
}

class Cli : public DeviceTest {
 protected:
  fs::path dir, in, out;
  Problem pr = make_problem();

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "gdn_cli_test_" + std::to_string(std::random_device{}()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir = fs::temp_directory_path() / name;
    in = dir / "in";
    out = dir / "out";
    fs::create_directories(in);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir, ec);
    DeviceTest::TearDown();
  }

  void put(const std::string& name, const Shape& shape, const std::vector<float>& data) const {
    npy::write_f32(in / (name + ".npy"), shape, data);
  }
  // Writes a tensor of `shape` filled with small values (for shape misfits the values never matter).
  void put_shape(const std::string& name, const Shape& shape) const {
    std::size_t n = 1;
    for (auto d : shape) n *= std::size_t(d);
    put(name, shape, uniform(n, 99, -1, 1));
  }
  // All inputs of `pr` (and dout).
  void put_all(bool with_dout = true) const {
    const std::int64_t B = pr.B, T = pr.T, C = pr.cfg.channels(), V = pr.cfg.value_dim(), nv = pr.cfg.nv;
    put("qkv", {B, T, C}, pr.x.qkv);
    put("z", {B, T, V}, pr.x.z);
    put("a", {B, T, nv}, pr.x.a);
    put("b", {B, T, nv}, pr.x.b);
    put("conv", {C, pr.cfg.conv_taps}, pr.p.conv);
    put("a_log", {nv}, pr.p.a_log);
    put("dt_bias", {nv}, pr.p.dt_bias);
    put("norm", {kHeadDim}, pr.p.norm);
    if (with_dout) put("dout", {B, T, V}, pr.x.dout);
  }

  std::vector<std::string> run_args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"run", "--in", in.string(), "--out", out.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  bool out_is_empty() const { return !fs::exists(out) || fs::is_empty(out); }

  // Exit 2, every one of `words` in the message, nothing in --out.
  void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& words) const {
    const Result r = gdn_cli(args);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("gdn: "));
    for (const auto& w : words) EXPECT_THAT(r.err, HasSubstr(w));
    EXPECT_TRUE(out_is_empty()) << "the refused run wrote into " << out;
    EXPECT_EQ(r.out, "");
  }

  npy::Array read_out(const std::string& name) const { return npy::read_f32(out / (name + ".npy")); }
};

inline void expect_bitwise(const std::string& name, const npy::Array& got, const Shape& shape,
                    const std::vector<float>& want) {
  EXPECT_EQ(got.shape, shape) << name;
  ASSERT_EQ(got.data.size(), want.size()) << name;
  EXPECT_EQ(std::memcmp(got.data.data(), want.data(), want.size() * sizeof(float)), 0)
      << name << " differs from the host API's result";
  EXPECT_EQ(count_nonfinite(got.data), 0u) << name;
}

}  // namespace gdn::test
