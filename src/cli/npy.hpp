// Reading and writing NumPy .npy files, restricted to what `gdn run` exchanges:
// little-endian float32 in C order ('<f4', fortran_order False). Anything else is refused
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

// Reads a .npy file of format version 1.0, 2.0 or 3.0 holding '<f4' data in C order.
Array read_f32(const std::filesystem::path& path);

// Writes a version 1.0 .npy file byte-identical to NumPy's np.save of the same '<f4' array.
// Throws Error if data.size() != product(shape). The file is written under a temporary name
// in the same directory and renamed into place, so a failure leaves no half-written file.
void write_f32(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const float> data);

// "[2, 3, 4]" (and "[]" for 0-d), for messages.
std::string shape_str(std::span<const std::int64_t> shape);

}  // namespace gdn::npy
