#include "cli/npy.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string_view>

namespace gdn::npy {
namespace {

// The payload is copied straight between the file and std::vector<float>: that is only right
// where float is IEEE binary32 stored little-endian, as '<f4' is. A big-endian port would swap.
static_assert(std::endian::native == std::endian::little, "npy: byte swapping not implemented");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

constexpr std::string_view kMagic{"\x93NUMPY", 6};
constexpr std::size_t kAlign = 64;        // NumPy's ARRAY_ALIGN: data starts at a multiple of it
constexpr std::size_t kGrowthDigits = 21; // NumPy's GROWTH_AXIS_MAX_DIGITS (spare header room)

[[noreturn]] void fail(const std::filesystem::path& p, const std::string& what) {
  throw Error(p.string() + ": " + what);
}

// Product of the dimensions as a byte count of float32 data; -1 if it does not fit in int64.
// Negative dimensions are the caller's to refuse.
std::int64_t data_bytes(std::span<const std::int64_t> shape, std::int64_t elem = 4) {
  std::int64_t n = elem;
  for (auto d : shape)
    if (d == 0) return 0;
  for (auto d : shape) {
    if (n > std::numeric_limits<std::int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

// A parser for the header, which is the repr() of a Python dict such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// NumPy reads it with a Python literal parser, so other writers may vary key order, quotes,
// spacing and the trailing comma; we accept those variations and nothing beyond the literal forms.
struct HeaderParser {
  const std::filesystem::path& path;
  std::string_view s;
  std::size_t i = 0;

  [[noreturn]] void bad(const std::string& expected) const {
    std::string text(s.substr(0, s.find_last_not_of(" \n") + 1));  // drop the padding
    if (text.size() > 200) text = text.substr(0, 200) + "...";
    fail(path, "malformed .npy header: expected " + expected + " at offset " + std::to_string(i) +
                   " of header \"" + text + "\"");
  }
  void ws() { while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i; }
  bool eat(char c) { ws(); if (i < s.size() && s[i] == c) { ++i; return true; } return false; }
  void need(char c) { if (!eat(c)) bad(std::string("'") + c + "'"); }

  std::string string() {  // 'abc' or "abc"; our values never need escapes
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) bad("a quoted string");
    char q = s[i++];
    auto end = s.find(q, i);
    if (end == std::string_view::npos || s.substr(i, end - i).find('\\') != std::string_view::npos)
      bad("a closing quote");
    std::string out(s.substr(i, end - i));
    i = end + 1;
    return out;
  }
  bool boolean() {
    ws();
    for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
      if (s.substr(i).starts_with(word)) { i += std::strlen(word); return value; }
    bad("True or False");
  }
  std::vector<std::int64_t> tuple() {  // (), (5,), (2, 3) or (2, 3,); (5) is an int, not a tuple
    std::vector<std::int64_t> dims;
    need('(');
    bool comma = false;
    while (!eat(')')) {
      if (!dims.empty() && !comma) bad("',' or ')'");
      ws();
      std::int64_t d = 0;
      std::size_t start = i;
      for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
        if (d > (std::numeric_limits<std::int64_t>::max() - 9) / 10) bad("a dimension that fits in int64");
        d = d * 10 + (s[i] - '0');
      }
      if (i == start) bad("a non-negative integer dimension");
      dims.push_back(d);
      comma = eat(',');
    }
    if (dims.size() == 1 && !comma) bad("a trailing ',' in a 1-element shape tuple");
    return dims;
  }
};

}  // namespace

std::string shape_str(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
  return out + "]";
}

namespace {
// The file's size, after checking (without opening it) that it is a regular file.
std::uint64_t regular_file_size(const std::filesystem::path& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) fail(path, "no such file, expected a .npy file");
  if (!std::filesystem::is_regular_file(st))
    fail(path, std::string("not a regular file (") +
                   (std::filesystem::is_directory(st) ? "a directory" :
                    std::filesystem::is_fifo(st) ? "a FIFO" :
                    std::filesystem::is_character_file(st) || std::filesystem::is_block_file(st) ? "a device" :
                    std::filesystem::is_socket(st) ? "a socket" : "not a plain file") +
                   "), expected a .npy file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot read: " + ec.message());
  return size;
}
}  // namespace

Header read_header(const std::filesystem::path& path) { return read_header(path, false); }

Header read_header(const std::filesystem::path& path, bool integers) {
  const std::uint64_t file_size = regular_file_size(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));

  // Preamble: magic, major and minor version, header length (uint16 in 1.0, uint32 in 2.0/3.0).
  char pre[12] = {};
  if (!in.read(pre, 8) || std::string_view(pre, 6) != kMagic)
    fail(path, "not a .npy file: expected the magic string \"\\x93NUMPY\" at the start");
  const int major = static_cast<unsigned char>(pre[6]), minor = static_cast<unsigned char>(pre[7]);
  if (minor != 0 || major < 1 || major > 3)
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + ", expected 1.0, 2.0 or 3.0");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (!in.read(pre + 8, len_bytes)) fail(path, "truncated: the file ends inside the .npy preamble");
  std::uint64_t header_len = 0;
  for (std::size_t k = 0; k < len_bytes; ++k)
    header_len |= std::uint64_t(static_cast<unsigned char>(pre[8 + k])) << (8 * k);
  const std::uint64_t data_start = 8 + len_bytes + header_len;
  if (data_start > file_size)
    fail(path, "truncated: the header length says " + std::to_string(header_len) +
                   " bytes but the file ends after " + std::to_string(file_size - 8 - len_bytes));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    fail(path, "read error while reading the " + std::to_string(header_len) + "-byte header");

  // The dict: exactly the keys 'descr', 'fortran_order' and 'shape', in any order.
  HeaderParser p{path, header};
  std::string descr;
  bool fortran = false, seen[3] = {};
  Header a;
  p.need('{');
  while (!p.eat('}')) {
    const std::size_t key_at = p.i;
    const std::string key = p.string();
    p.need(':');
    int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
    if (k < 0 || seen[k]) { p.i = key_at; p.bad("the key 'descr', 'fortran_order' or 'shape' once"); }
    seen[k] = true;
    p.ws();
    if (k == 0 && p.i < header.size() && header[p.i] == '[')  // a structured dtype's list
      fail(path, "dtype is a structured dtype, expected '<f4' (little-endian float32)");
    if (k == 0) descr = p.string(); else if (k == 1) fortran = p.boolean(); else a.shape = p.tuple();
    if (!p.eat(',')) { p.need('}'); break; }
  }
  p.ws();
  if (p.i != header.size()) p.bad("only padding after the closing '}'");
  if (!(seen[0] && seen[1] && seen[2])) p.bad("all of the keys 'descr', 'fortran_order', 'shape'");

  if (integers) {
    if (descr != "<i4" && descr != "<i8")
      fail(path, "dtype is '" + descr + "', expected '<i4' or '<i8' (little-endian int32 or int64)");
  } else if (descr != "<f4") {
    fail(path, "dtype is '" + descr + "', expected '<f4' (little-endian float32)");
  }
  a.elem_bytes = descr == "<i8" ? 8 : 4;
  if (fortran) fail(path, "fortran_order is True, expected False (C order)");
  const std::int64_t want = data_bytes(a.shape, a.elem_bytes);
  if (want < 0) fail(path, "shape " + shape_str(a.shape) + " is too large");
  const std::uint64_t have = file_size - data_start;
  if (have != static_cast<std::uint64_t>(want))
    fail(path, std::string(have < std::uint64_t(want) ? "truncated" : "trailing data") +
                   ": header says shape " + shape_str(a.shape) + " = " + std::to_string(want) +
                   " bytes of data, file has " + std::to_string(have));
  a.data_offset = data_start;
  return a;
}

namespace {
// The payload read_header described, into dst (its bytes; the file is checked again: it must not have
// changed size in between).
void read_bytes(const std::filesystem::path& path, const Header& header, void* dst) {
  const std::int64_t want = data_bytes(header.shape, header.elem_bytes);
  if (want < 0 || regular_file_size(path) != header.data_offset + std::uint64_t(want))
    fail(path, "changed since its header was read");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(header.data_offset));
  if (want > 0 && !in.read(static_cast<char*>(dst), want))
    fail(path, "read error while reading " + std::to_string(want) + " bytes of data");
}
}  // namespace

Array read_payload(const std::filesystem::path& path, const Header& header) {
  Array a;
  a.shape = header.shape;
  a.data.resize(static_cast<std::size_t>(std::max<std::int64_t>(data_bytes(header.shape), 0) / 4));
  read_bytes(path, header, a.data.data());
  return a;
}

Array read_f32(const std::filesystem::path& path) { return read_payload(path, read_header(path)); }

std::vector<std::int64_t> read_ints(const std::filesystem::path& path, std::vector<std::int64_t>& shape) {
  const Header h = read_header(path, true);
  std::vector<char> raw(static_cast<std::size_t>(data_bytes(h.shape, h.elem_bytes)));
  read_bytes(path, h, raw.data());
  std::vector<std::int64_t> v(raw.size() / std::size_t(h.elem_bytes));
  for (std::size_t i = 0; i < v.size(); ++i) {  // little-endian, as the descr says
    if (h.elem_bytes == 8) {
      std::memcpy(&v[i], raw.data() + 8 * i, 8);
    } else {
      std::int32_t x;
      std::memcpy(&x, raw.data() + 4 * i, 4);
      v[i] = x;
    }
  }
  shape = h.shape;
  return v;
}

std::int64_t first_nonfinite(std::span<const float> data) {
  for (std::size_t i = 0; i < data.size(); ++i)
    if (!std::isfinite(data[i])) return std::int64_t(i);
  return -1;
}

void write_f32(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const float> data) {
  for (auto d : shape)
    if (d < 0) fail(path, "cannot write: shape " + shape_str(shape) + " has a negative dimension");
  const std::int64_t bytes = data_bytes(shape);
  if (bytes < 0 || static_cast<std::uint64_t>(bytes) != data.size_bytes())
    fail(path, "cannot write: shape " + shape_str(shape) + " needs " +
                   (bytes < 0 ? std::string("too many") : std::to_string(bytes / 4)) +
                   " elements, got " + std::to_string(data.size()));

  // Exactly NumPy's np.save layout (numpy/lib/format.py, _write_array_header): sorted keys,
  // repr() of the shape tuple, 21 - len(str(shape[0])) spaces reserved so the first axis can grow,
  // then spaces and '\n' so the data begins at a multiple of 64 (a full 64 if already aligned).
  std::string dims;
  for (std::size_t k = 0; k < shape.size(); ++k) dims += (k ? ", " : "") + std::to_string(shape[k]);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  if (!shape.empty()) header.append(kGrowthDigits - std::to_string(shape[0]).size(), ' ');
  auto padding = [&](std::size_t pre) { return kAlign - (pre + header.size() + 1) % kAlign; };
  // Version 1.0 stores the header length in 16 bits; NumPy moves to 2.0 when it does not fit.
  const std::size_t pre = header.size() + 1 + padding(10) > 65535 ? 12 : 10;
  header.append(padding(pre), ' ');
  header += '\n';
  std::string preamble(kMagic);
  preamble += {char(pre == 10 ? 1 : 2), 0};
  for (std::size_t k = 0; k < pre - 8; ++k) preamble += char((header.size() >> (8 * k)) & 0xff);

  // A random suffix keeps concurrent writers of the same name from sharing a temporary file.
  std::filesystem::path tmp = path;
  tmp += ".tmp" + std::to_string(std::random_device{}()) + "~";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  out.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), bytes);
  out.close();
  std::error_code ec;
  if (!out) {
    const std::string why = std::strerror(errno);
    std::filesystem::remove(tmp, ec);
    fail(path, "write error: " + why);
  }
  std::filesystem::rename(tmp, path, ec);  // atomic replace on POSIX
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    fail(path, "cannot rename the temporary file into place: " + why);
  }
}

}  // namespace gdn::npy
