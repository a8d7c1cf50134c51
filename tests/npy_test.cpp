// Tests for gdn::npy: round trips, byte-for-byte agreement with NumPy's np.save, and every
// refusal naming the file and what was expected. Reference bytes come from NumPy 1.24 (Debian 12's
// python3-numpy), generated once and embedded below; the test itself never runs Python.
#include "cli/npy.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using gdn::npy::Error;
using Shape = std::vector<std::int64_t>;

namespace {

class Npy : public ::testing::Test {
 protected:
  fs::path dir;

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "gdn_npy_test_" + std::to_string(std::random_device{}()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised test names contain '/'
    dir = fs::temp_directory_path() / name;
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  fs::path put(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  }
  // A version-1.0 file with the given header dict, padded like NumPy, followed by `payload`.
  fs::path put_npy(const std::string& name, std::string dict, const std::string& payload,
                   char major = 1) const {
    const std::size_t pre = major == 1 ? 10 : 12;
    while ((pre + dict.size() + 1) % 64) dict += ' ';
    dict += '\n';
    std::string bytes = std::string("\x93NUMPY", 6) + major + '\0';
    for (std::size_t k = 0; k < pre - 8; ++k) bytes += char((dict.size() >> (8 * k)) & 0xff);
    return put(name, bytes + dict + payload);
  }
  static std::string floats(std::size_t n) { return std::string(4 * n, '\0'); }

  // Runs `f`, expects an Error whose message contains the file name and every one of `words`.
  template <class F>
  static void expect_refusal(F f, const fs::path& file, std::vector<std::string> words) {
    try {
      f();
      ADD_FAILURE() << "no error for " << file;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file.filename().string()), std::string::npos) << msg;
      for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    }
  }
  void expect_read_refusal(const fs::path& file, std::vector<std::string> words) const {
    expect_refusal([&] { gdn::npy::read_f32(file); }, file, std::move(words));
  }
};

std::int64_t count(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// ---- round trips -------------------------------------------------------------------------------

TEST_F(Npy, RoundTripsManyShapesBitExactly) {
  const std::vector<Shape> shapes = {{}, {1}, {5}, {2, 3}, {2, 3, 4}, {0}, {3, 0, 2}, {1, 1, 1, 1}, {2, 7, 64}};
  for (const auto& shape : shapes) {
    std::vector<float> data(static_cast<std::size_t>(count(shape)));
    for (std::size_t k = 0; k < data.size(); ++k) data[k] = std::ldexp(float(k) - 3.5f, int(k % 7) - 3);
    if (data.size() >= 5) {  // special values must survive untouched
      data[0] = -0.0f;
      data[1] = std::numeric_limits<float>::infinity();
      data[2] = std::numeric_limits<float>::quiet_NaN();
      data[3] = std::numeric_limits<float>::denorm_min();
      data[4] = std::numeric_limits<float>::max();
    }
    const auto file = dir / "a.npy";
    gdn::npy::write_f32(file, shape, data);
    const auto back = gdn::npy::read_f32(file);
    EXPECT_EQ(back.shape, shape) << gdn::npy::shape_str(shape);
    ASSERT_EQ(back.data.size(), data.size());
    if (!data.empty())  // (memcmp takes no null pointers, even for 0 bytes)
      EXPECT_EQ(std::memcmp(back.data.data(), data.data(), data.size() * 4), 0) << gdn::npy::shape_str(shape);
  }
}

TEST_F(Npy, HeaderIsAlignedTo64AndEndsInNewline) {
  for (const Shape& shape : std::vector<Shape>{{}, {3}, {2, 3}, {4, 5, 6, 7}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}) {
    const auto file = dir / "h.npy";
    gdn::npy::write_f32(file, shape, std::vector<float>(static_cast<std::size_t>(count(shape)), 1.0f));
    const std::string bytes = slurp(file);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t start = 10 + std::size_t((unsigned char)bytes[8]) + 256 * std::size_t((unsigned char)bytes[9]);
    EXPECT_EQ(start % 64, 0u) << gdn::npy::shape_str(shape);
    EXPECT_EQ(bytes[start - 1], '\n');
    EXPECT_EQ(bytes.size(), start + 4 * std::size_t(count(shape)));
  }
}

// ---- agreement with NumPy ----------------------------------------------------------------------

// np.save(f, np.array([[1.0, -2.5, 3.25], [-0.0, np.inf, 1e-3]], dtype='<f4')) with NumPy 1.24.2.
const unsigned char kNumpy2x3[152] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32, 0x2c, 0x20,
    0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0, 0x00, 0x00, 0x50, 0x40, 0x00, 0x00, 0x00, 0x80,
    0x00, 0x00, 0x80, 0x7f, 0x6f, 0x12, 0x83, 0x3a};
const std::vector<float> k2x3 = {1.0f, -2.5f, 3.25f, -0.0f, std::numeric_limits<float>::infinity(), 1e-3f};

TEST_F(Npy, WritesExactlyTheBytesNumPyWrites) {
  gdn::npy::write_f32(dir / "n.npy", Shape{2, 3}, k2x3);
  EXPECT_EQ(slurp(dir / "n.npy"), std::string(reinterpret_cast<const char*>(kNumpy2x3), sizeof kNumpy2x3));
}

TEST_F(Npy, ReadsTheBytesNumPyWrites) {
  const auto a = gdn::npy::read_f32(put("n.npy", std::string(reinterpret_cast<const char*>(kNumpy2x3), sizeof kNumpy2x3)));
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  ASSERT_EQ(a.data.size(), 6u);
  EXPECT_EQ(std::memcmp(a.data.data(), k2x3.data(), 24), 0);
}

// NumPy's header for other shapes: the dict text (then spaces and '\n') and where the data starts.
// These cover the tuple formatting ('(5,)', '()') and the padding rule, including the 21-digit
// room NumPy reserves for the first axis and the full 64 extra bytes when already aligned.
TEST_F(Npy, HeadersMatchNumPyForOtherShapes) {
  struct Case { Shape shape; std::string dict; std::size_t data_start; };
  const std::vector<Case> cases = {
      {{5}, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 128},
      {{}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 128},
      {{0, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 128},
      {{1000000000000, 0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 0), }", 128},
      {Shape(20, 1), "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }", 192},
      {{0, 10, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 10, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), }", 192},
      {{0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), }", 128},
  };
  for (const auto& c : cases) {
    const auto n = static_cast<std::size_t>(count(c.shape));
    gdn::npy::write_f32(dir / "s.npy", c.shape, std::vector<float>(n, 0.0f));
    std::string want = std::string("\x93NUMPY\x01\x00", 8) + char((c.data_start - 10) & 0xff) +
                       char((c.data_start - 10) >> 8) + c.dict;
    want += std::string(c.data_start - 1 - want.size(), ' ') + '\n' + floats(n);
    EXPECT_EQ(slurp(dir / "s.npy"), want) << gdn::npy::shape_str(c.shape);
  }
}

TEST_F(Npy, ReadsHeaderVariantsOtherWritersProduce) {
  // Any key order, double quotes, no trailing comma, odd spacing, a trailing comma in the tuple.
  auto a = gdn::npy::read_f32(put_npy("v1.npy", "{ \"shape\" :(2 ,3,),'fortran_order':False,'descr' : '<f4'}", floats(6)));
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(a.data.size(), 6u);
  // Versions 2.0 and 3.0 differ only in a 4-byte header length.
  for (char major : {2, 3}) {
    a = gdn::npy::read_f32(put_npy("v2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", floats(4), major));
    EXPECT_EQ(a.shape, (Shape{4}));
  }
  // No padding at all, no final newline.
  const std::string dict = "{'descr':'<f4','fortran_order':False,'shape':()}";
  a = gdn::npy::read_f32(put("bare.npy", std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + '\0' + dict + floats(1)));
  EXPECT_EQ(a.shape, Shape{});
  EXPECT_EQ(a.data.size(), 1u);
}

TEST(NpyShapeStr, FormatsLikeAList) {
  EXPECT_EQ(gdn::npy::shape_str(Shape{2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(gdn::npy::shape_str(Shape{5}), "[5]");
  EXPECT_EQ(gdn::npy::shape_str(Shape{}), "[]");
}

// ---- refusals when reading ---------------------------------------------------------------------

TEST_F(Npy, RefusesMissingFile) { expect_read_refusal(dir / "qkv.npy", {"no such file"}); }

TEST_F(Npy, RefusesDirectory) {
  fs::create_directory(dir / "d.npy");
  expect_read_refusal(dir / "d.npy", {"not a regular file (a directory)"});
}

// Special files are refused by what they are, before they are opened (a FIFO would block the open).
TEST_F(Npy, RefusesSpecialFiles) {
  ASSERT_EQ(::mkfifo((dir / "fifo.npy").c_str(), 0600), 0);
  expect_read_refusal(dir / "fifo.npy", {"not a regular file (a FIFO)"});
  expect_refusal([] { gdn::npy::read_header("/dev/zero"); }, "/dev/zero", {"not a regular file (a device)"});
}

// The reader against every prefix of a valid file and a thousand random corruptions of one (header
// bytes flipped, lengths and dimensions lied about, sizes changed): each is read or refused with an
// Error, never a crash, a hang or an allocation the file does not back (run under ASan and UBSan by
// .ci/run's sanitizer job).
TEST_F(Npy, FuzzedFilesAreReadOrRefused) {
  const Shape shape{2, 3, 4};
  std::vector<float> data(24);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i) - 7.5f;
  gdn::npy::write_f32(dir / "good.npy", shape, data);
  const std::string good = slurp(dir / "good.npy");
  auto attempt = [&](const std::string& bytes) {
    const fs::path p = put("f.npy", bytes);
    try {
      const auto a = gdn::npy::read_f32(p);
      std::int64_t n = 1;
      for (auto d : a.shape) n *= d;
      EXPECT_EQ(std::int64_t(a.data.size()), n);
      EXPECT_EQ(n * 4, std::int64_t(bytes.size()) - std::int64_t(gdn::npy::read_header(p).data_offset));
    } catch (const Error&) {
    }
  };
  for (std::size_t len = 0; len < good.size(); ++len) {  // every truncation is refused
    const fs::path p = put("t.npy", good.substr(0, len));
    EXPECT_THROW(gdn::npy::read_f32(p), Error) << "prefix of " << len << " bytes";
  }
  std::mt19937 rng(1234);
  const std::string lies[] = {"(99999999999, 99999999999, 99999999999)", "(9223372036854775807,)",
                              "(-1, 4)", "(2, 3, 4", "()", "(0, 5)", "(4294967296, 4294967296)"};
  for (int n = 0; n < 1000; ++n) {
    std::string bytes = good;
    switch (n % 4) {
      case 0:  // flip a few header bytes
        for (int k = 0; k < 3; ++k) bytes[rng() % 128] = char(rng());
        break;
      case 1:  // lie about the header length
        bytes[8] = char(rng());
        bytes[9] = char(rng() % 4 == 0 ? rng() : 0);
        break;
      case 2: {  // lie about the shape
        const auto at = bytes.find('(');
        bytes = bytes.substr(0, at) + lies[rng() % std::size(lies)] + bytes.substr(bytes.find(')') + 1);
        break;
      }
      default:  // drop or append payload bytes
        if (rng() % 2) bytes.resize(bytes.size() - 1 - rng() % 8);
        else bytes.append(1 + rng() % 8, '\0');
    }
    attempt(bytes);
  }
}

TEST_F(Npy, RefusesBadMagic) {
  expect_read_refusal(put("m.npy", "PK\x03\x04 this is a zip, not an npy file"), {"not a .npy file", "magic"});
  expect_read_refusal(put("empty.npy", ""), {"not a .npy file", "magic"});
}

TEST_F(Npy, RefusesUnsupportedVersion) {
  expect_read_refusal(put_npy("v.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats(1), 4),
                      {"version 4.0", "expected 1.0, 2.0 or 3.0"});
}

TEST_F(Npy, RefusesFloat64) {
  expect_read_refusal(put_npy("qkv.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", floats(4)),
                      {"dtype is '<f8'", "expected '<f4'", "float32"});
}

TEST_F(Npy, RefusesBigEndianFloat32) {
  expect_read_refusal(put_npy("b.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", floats(2)),
                      {"dtype is '>f4'", "expected '<f4'", "little-endian"});
}

TEST_F(Npy, RefusesStructuredDtype) {
  expect_read_refusal(put_npy("r.npy", "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2,), }", floats(2)),
                      {"structured", "expected '<f4'"});
}

TEST_F(Npy, RefusesFortranOrder) {
  expect_read_refusal(put_npy("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", floats(6)),
                      {"fortran_order is True", "expected False", "C order"});
}

TEST_F(Npy, RefusesTruncatedData) {
  expect_read_refusal(put_npy("z.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 6144), }", std::string(1000, 'x')),
                      {"truncated", "[2, 3, 6144]", "147456 bytes", "file has 1000"});
}

TEST_F(Npy, RefusesTruncatedHeader) {
  std::string bytes = slurp(put_npy("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats(2)));
  expect_read_refusal(put("t.npy", bytes.substr(0, 40)), {"truncated", "header"});
  expect_read_refusal(put("t.npy", bytes.substr(0, 9)), {"truncated"});
}

TEST_F(Npy, RefusesTrailingData) {
  expect_read_refusal(put_npy("x.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats(3)),
                      {"trailing data", "[2]", "8 bytes", "file has 12"});
}

class NpyMalformed : public Npy, public ::testing::WithParamInterface<const char*> {};

TEST_P(NpyMalformed, RefusesMalformedHeader) {
  expect_read_refusal(put_npy("bad.npy", GetParam(), floats(2)), {"malformed .npy header", "expected"});
}

INSTANTIATE_TEST_SUITE_P(
    Headers, NpyMalformed,
    ::testing::Values("", "[1, 2]", "{'descr': '<f4', 'shape': (2,), }",  // not a dict; a key missing
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
                      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (2)}",  // an int, not a tuple
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                      "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
                      "{'descr': <f4, 'fortran_order': False, 'shape': (2,)}",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",  // unterminated
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk"));

// ---- refusals when writing ---------------------------------------------------------------------

TEST_F(Npy, WriteRefusesSizeMismatchAndLeavesNothing) {
  expect_refusal([&] { gdn::npy::write_f32(dir / "out.npy", Shape{2, 3}, std::vector<float>(5)); },
                 dir / "out.npy", {"[2, 3]", "6 elements", "got 5"});
  expect_refusal([&] { gdn::npy::write_f32(dir / "out.npy", Shape{-1, 3}, std::vector<float>(3)); },
                 dir / "out.npy", {"negative"});
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST_F(Npy, WriteIntoMissingDirectoryFailsCleanly) {
  const auto file = dir / "nope" / "out.npy";
  expect_refusal([&] { gdn::npy::write_f32(file, Shape{1}, std::vector<float>(1)); }, file, {"cannot open for writing"});
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST_F(Npy, WriteReplacesAnExistingFileAndLeavesNoTemporaries) {
  gdn::npy::write_f32(dir / "out.npy", Shape{4}, std::vector<float>(4, 1.0f));
  gdn::npy::write_f32(dir / "out.npy", Shape{2}, std::vector<float>{7.0f, 8.0f});
  const auto a = gdn::npy::read_f32(dir / "out.npy");
  EXPECT_EQ(a.shape, Shape{2});
  EXPECT_EQ(a.data, (std::vector<float>{7.0f, 8.0f}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

}  // namespace
