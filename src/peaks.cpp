// SPDX-License-Identifier: MIT
#include "gdn/peaks.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "gdn/bindings.hpp"

namespace gdn {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

DevicePeaks measure_peaks(Context& ctx, int repeats) {
  auto& dev = detail::device_of(ctx);
  const auto& info = dev.info();
  const bool cpu = info.type == "cpu";
  // Copy: 1 GiB per buffer on a GPU (several times any cache), less where the device allows less.
  std::size_t bytes = std::size_t(1) << (cpu ? 26 : 30);
  bytes = std::min<std::size_t>(bytes, info.max_storage_buffer_range / 16 * 16);
  const auto src = dev.create_buffer("peak copy source", bytes);
  const auto dst = dev.create_buffer("peak copy destination", bytes);
  struct CopyPush { std::uint32_t n4; } cp{std::uint32_t(bytes / 16)};
  const auto copy = dev.create_pipeline({.name = bindings::peak_copy::kName, .spirv = bindings::peak_copy::spirv(),
                                         .push_constant_bytes = sizeof(CopyPush), .spec = {}});
  // FMA: enough threads to fill any GPU many times over; fewer iterations on a CPU driver.
  const std::uint64_t groups = cpu ? 256 : 16384;
  struct FmaPush { std::uint32_t iters; } fp{cpu ? 256u : 2048u};
  const auto sink = dev.create_buffer("peak fma sink", groups * 256 * sizeof(float));
  const auto fma = dev.create_pipeline({.name = bindings::peak_fma::kName, .spirv = bindings::peak_fma::spirv(),
                                        .push_constant_bytes = sizeof(FmaPush), .spec = {}});
  dev.run([&](gpu::Recorder& r) { r.fill(*src, 0x3f800000u); });  // real numbers, not garbage

  std::vector<double> copy_ms, fma_ms;
  for (int i = 0; i < repeats + 2; ++i) {
    const auto t = dev.run(
        [&](gpu::Recorder& r) {
          r.dispatch(*copy, bindings::peak_copy{.src = {src.get()}, .dst = {dst.get()}}, cp, (bytes / 16 + 255) / 256);
          r.mark("copy");
          r.dispatch(*fma, bindings::peak_fma{.sink = {sink.get()}}, fp, groups);
          r.mark("fma");
        },
        true);
    if (i < 2) continue;  // warm-up
    copy_ms.push_back(t[0].ms);
    fma_ms.push_back(t[1].ms);
  }
  const double flop = double(groups) * 256 * fp.iters * 8 * 2;
  return {.copy_gb_per_s = 2.0 * double(bytes) / (median(copy_ms) * 1e-3) * 1e-9,
          .fma_gflop_per_s = flop / (median(fma_ms) * 1e-3) * 1e-9,
          .copy_bytes = bytes};
}

}  // namespace gdn
