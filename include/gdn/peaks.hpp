// SPDX-License-Identifier: MIT
#pragma once

#include <cstddef>

#include "gdn/context.hpp"

namespace gdn {

/// The device's two ceilings, measured with GPU timestamps (median of repeats after warm-up):
/// the floors of a kernel are its bytes over copy bandwidth and its flops over the FMA rate.
struct DevicePeaks {
  double copy_gb_per_s = 0;   // vec4 copy, bytes read + bytes written, 1e9 B/s
  double fma_gflop_per_s = 0; // fp32 FMA chains, 2 flop per FMA, 1e9 flop/s
  std::size_t copy_bytes = 0; // size of the buffer copied
};

/// Runs the two calibration kernels. Throws gdn::Error when the device has no timestamps.
DevicePeaks measure_peaks(Context& ctx, int repeats = 10);

}  // namespace gdn
