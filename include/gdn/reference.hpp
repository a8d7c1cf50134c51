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

/// The parameters.
struct Weights {
  Mat conv;     // [C, K], tap j reads position t-(K-1)+j
  Vec a_log;    // [nv]
  Vec dt_bias;  // [nv]
  Vec norm;     // [D], shared by all heads
};

/// One window of the four input streams, and the states it starts from (empty: zero, a fresh
/// sequence).
struct Window {
  Mat qkv;  // [T, C]
  Mat z;    // [T, nv*D]
  Mat a;    // [T, nv]
  Mat b;    // [T, nv]
  Mat h0;          // [nv*D, D] or empty: value head h's recurrent state S[k][v] (FLA's [K, V]: kv = Sᵀk̂)
                   // in rows h*D .. h*D + D-1
  Mat conv_state;  // [K-1, C] or empty: the last K-1 raw qkv rows before the window, oldest first
};

/// What a window leaves for the next, as the next Window's h0 and conv_state take it.
struct Carry {
  Mat ht;          // [nv*D, D] the recurrent state after the window's last token
  Mat conv_state;  // [K-1, C] the last K-1 raw qkv rows of the window (and of conv_state before it, if T < K-1)
};

/// Gradients of L = <dout, out> + <dht, ht> + <dconv_state_out, conv_state_out> (the last two from
/// backward()'s `dcarry`, zero where absent) with respect to the inputs, the states and the parameters.
struct Grads {
  Mat dqkv;      // [T, C]
  Mat dz;        // [T, nv*D]
  Mat da;        // [T, nv]
  Mat db;        // [T, nv]
  Mat dconv;     // [C, K]
  Vec da_log;    // [nv]
  Vec ddt_bias;  // [nv]
  Vec dnorm;     // [D]
  Mat dh0;          // [nv*D, D]
  Mat dconv_state;  // [K-1, C]
};

/// out [T, nv*D]; with `carry`, also the states the window leaves. Throws std::invalid_argument on
/// inconsistent shapes.
Mat forward(const Dims& dims, const Weights& w, const Window& x, Carry* carry = nullptr);

/// The exact reverse sweep of docs/spec.md ("Backward") for the output gradient dout [T, nv*D] and,
/// where given, the gradients of the carried states (`dcarry`: its ht and conv_state; either may be
/// empty, meaning zero).
Grads backward(const Dims& dims, const Weights& w, const Window& x, const Mat& dout, const Carry* dcarry = nullptr);

}  // namespace gdn::reference

#include "gdn/detail/reference_impl.hpp"
