// SPDX-License-Identifier: MIT
// The float64 host reference of the GatedDeltaNet layer (forward and exact backward) for one window.
// It knows nothing of Vulkan; every device result of the library is validated against it, and it is
// validated against central finite differences of its own forward (tests/reference_test.cpp).
//
// The math is docs/spec.md's, with the head dim D a parameter (the device fixes D = 128; the
// finite-difference tests use small D to stay fast).
#pragma once

#include <Eigen/Core>

namespace gdn::reference {

/// Row-major float64 matrix: tensors below are [rows, cols] as in docs/spec.md with the window axis dropped.
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXd;

/// Shape of one window of the layer.
struct Dims {
  int T = 1;         // tokens in the window
  int nv = 1;        // value heads
  int nk = 1;        // key heads (nv % nk == 0; value head h reads key head h / (nv / nk))
  int K = 4;         // conv taps
  int D = 128;       // head dim (dk = dv)
  double eps = 1e-6; // rms_eps of the output norm
  int C() const { return 2 * nk * D + nv * D; }  // raw projection channels: q | k | v
  int rep() const { return nv / nk; }
};

/// Frozen parameters.
struct Weights {
  Mat conv;     // [C, K], tap j reads position t-(K-1)+j
  Vec a_log;    // [nv]
  Vec dt_bias;  // [nv]
  Vec norm;     // [D], shared by all heads
};

/// One window of the four input streams.
struct Window {
  Mat qkv;  // [T, C]
  Mat z;    // [T, nv*D]
  Mat a;    // [T, nv]
  Mat b;    // [T, nv]
};

/// Gradients of <dout, out> with respect to the inputs and the (frozen) parameters.
struct Grads {
  Mat dqkv;      // [T, C]
  Mat dz;        // [T, nv*D]
  Mat da;        // [T, nv]
  Mat db;        // [T, nv]
  Mat dconv;     // [C, K]
  Vec da_log;    // [nv]
  Vec ddt_bias;  // [nv]
  Vec dnorm;     // [D]
};

/// out [T, nv*D]. Throws std::invalid_argument on inconsistent shapes.
Mat forward(const Dims& dims, const Weights& w, const Window& x);

/// The exact reverse sweep of docs/spec.md ("Backward") for the output gradient dout [T, nv*D].
Grads backward(const Dims& dims, const Weights& w, const Window& x, const Mat& dout);

}  // namespace gdn::reference

#include "gdn/detail/reference_impl.hpp"
