// Reading and writing NumPy .npy files, restricted to what `gdn run` exchanges:
// little-endian float32 in C order ('<f4', fortran_order False), and read_ints' integers ('<i4',
// '<i8'). Anything else is refused
// with a gdn::npy::Error whose message names the file and says what was expected and found.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gdn::npy {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Array {
  std::vector<std::int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<float> data;          // C order, product(shape) elements
};

// What a .npy file's header says: its shape, and where its payload starts.
struct Header {
  std::vector<std::int64_t> shape;
  std::uint64_t data_offset = 0;
  std::int64_t elem_bytes = 4;
};

// Reads and checks the header of a .npy file of format version 1.0, 2.0 or 3.0 holding '<f4' data
// in C order, and that the file's size is the header's plus its payload's; reads no payload. The
// path must name a regular file (checked before it is opened: a FIFO or a device is refused).
Header read_header(const std::filesystem::path& path);
// The same for integer data ('<i4' or '<i8') where `integers`.
Header read_header(const std::filesystem::path& path, bool integers);

// Reads the payload that read_header described (the file is checked again: it must not have changed
// size in between).
Array read_payload(const std::filesystem::path& path, const Header& header);

// read_header, then read_payload.
Array read_f32(const std::filesystem::path& path);

// The elements of an '<i4' or '<i8' .npy file (C order), widened to int64; its shape into `shape`.
std::vector<std::int64_t> read_ints(const std::filesystem::path& path, std::vector<std::int64_t>& shape);

// The index of the first NaN or Inf of data, or -1.
std::int64_t first_nonfinite(std::span<const float> data);

// Writes a version 1.0 .npy file byte-identical to NumPy's np.save of the same '<f4' array.
// Throws Error if data.size() != product(shape). The file is written under a temporary name
// in the same directory and renamed into place, so a failure leaves no half-written file.
void write_f32(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const float> data);

// "[2, 3, 4]" (and "[]" for 0-d), for messages.
std::string shape_str(std::span<const std::int64_t> shape);

}  // namespace gdn::npy
