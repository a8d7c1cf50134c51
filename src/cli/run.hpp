// SPDX-License-Identifier: MIT
// `gdn run`'s flags, its inputs as read, and its calls of the layer.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "cli/cli.hpp"
#include "cli/npy.hpp"
#include "gdn/gdn.hpp"

namespace gdn::cli {

struct RunOptions {
  std::filesystem::path in, out;
  bool backward = false;
  bool bf16 = false;
  bool fast = false;  // Config::precision fast
  float eps = 1e-6f;
  int ckpt = 0;  // 0: the variant's default
  Variant variant = Variant::Auto;
  bool allow_nonfinite = false;
};

struct Problem {
  int B = 0, T = 0, nv = 0, nk = 0, K = 0, C = 0;
  npy::Array qkv, z, a, b, conv, a_log, dt_bias, norm, dout;
  // optional (empty where the file is absent: zero)
  npy::Array h0, conv_state, dht, dconv_state_out;
  std::vector<std::int64_t> cu;  // cu_seqlens.npy: packed sequences
  int S = 0;                     // rows of the states: B, or the packed sequences
};

using Shape = std::vector<std::int64_t>;
// The outputs of the call, in the order they are written, through the device API: the streams
// float32, or with --bf16 bfloat16 (rounded on upload; the outputs the calls allocate take their
// inputs' dtype and are widened on download).
std::vector<Output> run_layer(const std::shared_ptr<Context>& ctx, Layer& layer, Problem& p, const RunOptions& o,
                              const Shape& conv_shape, const Shape& a_log_shape, const Shape& dt_bias_shape,
                              const Shape& norm_shape);

}  // namespace gdn::cli
