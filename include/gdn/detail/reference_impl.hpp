// SPDX-License-Identifier: MIT
// Inline implementation of gdn/reference.hpp: docs/spec.md's forward and exact backward for one window, in
// float64 with Eigen. Written to be read and checked, not to be fast.
//
// Layouts (row-major, window axis dropped; D = head dim):
//   qkv, y   [T, C]     channel c: q head i at i*D + d, k head i at nk*D + i*D + d, v head h at 2*nk*D + h*D + d
//   z, out   [T, nv*D]  value head h at h*D + d
//   a, b     [T, nv]
//   conv     [C, K]     tap j reads position t-(K-1)+j (before the window: conv_state's rows, or zero)
//   S        D x D      row index = key dim, column index = value dim
//   h0, ht   [nv*D, D]  value head h's S in rows h*D ..
//   conv_state [K-1, C] the raw qkv rows at positions -(K-1) .. -1
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "gdn/reference.hpp"

namespace gdn::reference {
namespace detail {

using Index = Eigen::Index;
using State = Eigen::MatrixXd;  // D x D, S(key, value)

/// The constant inside the q/k l2 norms (fixed by the model, not the layer's rms_eps).
inline constexpr double kQkNormEps = 1e-6;
/// softplus(x) = x above this (the model's convention; the derivative there is exactly 1).
inline constexpr double kSoftplusLinear = 20.0;

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
inline double silu_grad(double x) {
  const double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
inline double softplus(double x) { return x > kSoftplusLinear ? x : std::log1p(std::exp(x)); }
inline double softplus_grad(double x) { return x > kSoftplusLinear ? 1.0 : sigmoid(x); }

inline std::string shape_str(Index rows, Index cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}
inline std::string shape_str(Index n) { return "[" + std::to_string(n) + "]"; }

inline void check_shape(const char* name, const Mat& m, Index rows, Index cols) {
  if (m.rows() != rows || m.cols() != cols)
    throw std::invalid_argument(std::string("reference: ") + name + " is " + shape_str(m.rows(), m.cols()) +
                                ", expected " + shape_str(rows, cols));
}
inline void check_shape(const char* name, const Vec& v, Index n) {
  if (v.size() != n)
    throw std::invalid_argument(std::string("reference: ") + name + " is " + shape_str(v.size()) + ", expected " +
                                shape_str(n));
}

inline void check_positive(const char* name, int v) {
  if (v < 1)
    throw std::invalid_argument(std::string("reference: ") + name + " must be >= 1, got " + std::to_string(v));
}

inline void validate(const Dims& d, const Weights& w, const Window& x) {
  check_positive("T", d.T);
  check_positive("nv", d.nv);
  check_positive("nk", d.nk);
  check_positive("K", d.K);
  check_positive("D", d.D);
  if (d.nv % d.nk != 0)
    throw std::invalid_argument("reference: nv (" + std::to_string(d.nv) + ") is not a multiple of nk (" +
                                std::to_string(d.nk) + ")");
  if (!(d.eps >= 0.0) || !std::isfinite(d.eps))
    throw std::invalid_argument("reference: eps must be finite and >= 0, got " + std::to_string(d.eps));
  const Index C = d.C(), vd = Index(d.nv) * d.D;
  check_shape("conv", w.conv, C, d.K);
  check_shape("a_log", w.a_log, d.nv);
  check_shape("dt_bias", w.dt_bias, d.nv);
  check_shape("norm", w.norm, d.D);
  check_shape("qkv", x.qkv, d.T, C);
  check_shape("z", x.z, d.T, vd);
  check_shape("a", x.a, d.T, d.nv);
  check_shape("b", x.b, d.T, d.nv);
  if (x.h0.size()) check_shape("h0", x.h0, vd, d.D);
  if (x.conv_state.size()) check_shape("conv_state", x.conv_state, d.K - 1, C);
}

/// Raw qkv row at position s of the window (s < 0: the conv state's, zero without one).
inline Eigen::RowVectorXd qkv_at(const Dims& d, const Window& x, int s) {
  if (s >= 0) return x.qkv.row(s);
  if (x.conv_state.size()) return x.conv_state.row(d.K - 1 + s);
  return Eigen::RowVectorXd::Zero(d.C());
}

/// One delta-rule state update, S <- g*S + k̂ ⊗ u. Shared by the forward and the backward's replay so
/// that both see the same states bit for bit.
inline void advance(State& S, double g, const Vec& khat, const Vec& u) {
  S *= g;
  S.noalias() += khat * u.transpose();
}

/// Everything the forward computes, kept for the backward. The per-step states are not kept here:
/// they are O(T*nv*D^2); the backward replays them one value head at a time (O(T*D^2)) from g, k̂, u.
struct Forward {
  Dims dims;
  Mat h0;       // [nv*D, D] the start states (zero without Window::h0)
  Mat pre;      // [T, C]    conv output before SiLU
  Mat y;        // [T, C]    silu(pre): q | k | v
  Mat qhat;     // [T, nk*D] q / (sqrt(Σq² + 1e-6)·sqrt(D))
  Mat khat;     // [T, nk*D] k / sqrt(Σk² + 1e-6)
  Mat nq2;      // [T, nk]   Σq² + 1e-6
  Mat nk2;      // [T, nk]   Σk² + 1e-6
  Mat arg;      // [T, nv]   a + dt_bias, the softplus argument
  Mat g;        // [T, nv]   decay
  Mat beta;     // [T, nv]   write strength
  Mat kv;       // [T, nv*D] (g·S_{t-1})ᵀ k̂
  Mat u;        // [T, nv*D] β(v − kv)
  Mat o;        // [T, nv*D] Sᵀq̂ before the norm
  Mat inv_rms;  // [T, nv]   1/sqrt(mean(o²) + eps)
  Mat out;      // [T, nv*D]
  Mat ht;       // [nv*D, D] the states after the last token

  Index D() const { return dims.D; }
  // Column offsets into y / qkv (see the layout at the top of the file).
  Index q_col(int i) const { return Index(i) * dims.D; }
  Index k_col(int i) const { return Index(dims.nk + i) * dims.D; }
  Index v_col(int h) const { return Index(2 * dims.nk + h) * dims.D; }
  Vec qhat_at(int t, int i) const { return qhat.row(t).segment(Index(i) * D(), D()).transpose(); }
  Vec khat_at(int t, int i) const { return khat.row(t).segment(Index(i) * D(), D()).transpose(); }
  Vec v_at(int t, int h) const { return y.row(t).segment(v_col(h), D()).transpose(); }
  Vec u_at(int t, int h) const { return u.row(t).segment(Index(h) * D(), D()).transpose(); }

  /// States of value head h: result[t + 1] = S after step t, result[0] = h0's (the window's start).
  std::vector<State> head_states(int h) const {
    const int ki = h / dims.rep();
    std::vector<State> S(size_t(dims.T) + 1, State::Zero(D(), D()));
    S[0] = h0.block(Index(h) * D(), 0, D(), D());
    for (int t = 0; t < dims.T; ++t) {
      S[size_t(t) + 1] = S[size_t(t)];
      advance(S[size_t(t) + 1], g(t, h), khat_at(t, ki), u_at(t, h));
    }
    return S;
  }
};

inline Forward run_forward(const Dims& dims, const Weights& w, const Window& x) {
  validate(dims, w, x);
  const int T = dims.T, nv = dims.nv, nk = dims.nk, K = dims.K, rep = dims.rep();
  const Index D = dims.D, C = dims.C(), vd = Index(nv) * D;

  Forward f;
  f.dims = dims;
  f.h0 = x.h0.size() ? x.h0 : Mat::Zero(vd, D);

  // 1. Depthwise causal conv + SiLU: tap j of output t reads input t-(K-1)+j; before t = 0, the conv
  // state's rows (zero without one).
  f.pre = Mat::Zero(T, C);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = t - (K - 1) + j;
      f.pre.row(t).array() += w.conv.col(j).transpose().array() * qkv_at(dims, x, s).array();
    }
  f.y = f.pre.unaryExpr([](double v) { return silu(v); });

  // 2. l2-normalize q and k per key head; q also carries 1/sqrt(D).
  f.qhat.resize(T, Index(nk) * D);
  f.khat.resize(T, Index(nk) * D);
  f.nq2.resize(T, nk);
  f.nk2.resize(T, nk);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < nk; ++i) {
      const auto q = f.y.row(t).segment(f.q_col(i), D);
      const auto k = f.y.row(t).segment(f.k_col(i), D);
      f.nq2(t, i) = q.squaredNorm() + kQkNormEps;
      f.nk2(t, i) = k.squaredNorm() + kQkNormEps;
      f.qhat.row(t).segment(Index(i) * D, D) = q / (std::sqrt(f.nq2(t, i)) * std::sqrt(double(D)));
      f.khat.row(t).segment(Index(i) * D, D) = k / std::sqrt(f.nk2(t, i));
    }

  // 3. Gates per (t, h).
  f.arg.resize(T, nv);
  f.g.resize(T, nv);
  f.beta.resize(T, nv);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nv; ++h) {
      f.arg(t, h) = x.a(t, h) + w.dt_bias(h);
      f.g(t, h) = std::exp(-std::exp(w.a_log(h)) * softplus(f.arg(t, h)));
      f.beta(t, h) = sigmoid(x.b(t, h));
    }

  // 4. Delta rule per value head h on key head h / rep, from h0's state.
  f.kv.resize(T, vd);
  f.u.resize(T, vd);
  f.o.resize(T, vd);
  f.ht.resize(vd, D);
  for (int h = 0; h < nv; ++h) {
    const int ki = h / rep;
    State S = f.h0.block(Index(h) * D, 0, D, D);
    for (int t = 0; t < T; ++t) {
      const Vec qh = f.qhat_at(t, ki), kh = f.khat_at(t, ki), v = f.v_at(t, h);
      const double g = f.g(t, h), beta = f.beta(t, h);
      const Vec kv = g * (S.transpose() * kh);  // (g·S)ᵀk̂ without touching S before advance()
      const Vec u = beta * (v - kv);
      advance(S, g, kh, u);
      f.kv.row(t).segment(Index(h) * D, D) = kv.transpose();
      f.u.row(t).segment(Index(h) * D, D) = u.transpose();
      f.o.row(t).segment(Index(h) * D, D) = (S.transpose() * qh).transpose();
    }
    f.ht.block(Index(h) * D, 0, D, D) = S;
  }

  // 5. Gated RMSNorm per (t, h), norm before the gate.
  f.inv_rms.resize(T, nv);
  f.out.resize(T, vd);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nv; ++h) {
      const auto o = f.o.row(t).segment(Index(h) * D, D);
      const double inv = 1.0 / std::sqrt(o.squaredNorm() / double(D) + dims.eps);
      f.inv_rms(t, h) = inv;
      for (Index d = 0; d < D; ++d)
        f.out(t, Index(h) * D + d) = o(d) * inv * w.norm(d) * silu(x.z(t, Index(h) * D + d));
    }
  return f;
}

}  // namespace detail

inline Mat forward(const Dims& dims, const Weights& w, const Window& x, Carry* carry) {
  detail::Forward f = detail::run_forward(dims, w, x);
  if (carry) {
    carry->ht = f.ht;
    carry->conv_state.resize(dims.K - 1, dims.C());
    for (int r = 0; r < dims.K - 1; ++r) carry->conv_state.row(r) = detail::qkv_at(dims, x, dims.T - (dims.K - 1) + r);
  }
  return std::move(f.out);
}

inline Grads backward(const Dims& dims, const Weights& w, const Window& x, const Mat& dout, const Carry* dcarry) {
  using detail::Index;
  using detail::State;
  detail::validate(dims, w, x);
  detail::check_shape("dout", dout, dims.T, Index(dims.nv) * dims.D);
  const bool dht = dcarry && dcarry->ht.size(), dcs = dcarry && dcarry->conv_state.size();
  if (dht) detail::check_shape("dcarry.ht", dcarry->ht, Index(dims.nv) * dims.D, dims.D);
  if (dcs) detail::check_shape("dcarry.conv_state", dcarry->conv_state, dims.K - 1, dims.C());
  const detail::Forward f = detail::run_forward(dims, w, x);
  const int T = dims.T, nv = dims.nv, nk = dims.nk, K = dims.K, rep = dims.rep();
  const Index D = dims.D, C = dims.C(), vd = Index(nv) * D;

  Grads gr;
  gr.dqkv = Mat::Zero(T, C);
  gr.dz = Mat::Zero(T, vd);
  gr.da = Mat::Zero(T, nv);
  gr.db = Mat::Zero(T, nv);
  gr.dconv = Mat::Zero(C, K);
  gr.da_log = Vec::Zero(nv);
  gr.ddt_bias = Vec::Zero(nv);
  gr.dnorm = Vec::Zero(D);
  gr.dh0 = Mat::Zero(vd, D);
  gr.dconv_state = Mat::Zero(K - 1, C);

  // Gated RMSNorm backward. out_d = o_d·inv·w_d·silu(z_d), inv = (Σo²/D + eps)^(-1/2), so with
  // a_d = dout_d·w_d·silu(z_d):  do_d = inv·a_d − o_d·inv³·<a, o>/D.
  Mat dO(T, vd);  // [T, nv*D]
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nv; ++h) {
      const Index c0 = Index(h) * D;
      const double inv = f.inv_rms(t, h);
      Vec a(D);
      for (Index d = 0; d < D; ++d) {
        const double z = x.z(t, c0 + d), o = f.o(t, c0 + d), dy = dout(t, c0 + d);
        a(d) = dy * w.norm(d) * detail::silu(z);
        gr.dnorm(d) += dy * o * inv * detail::silu(z);
        gr.dz(t, c0 + d) = dy * o * inv * w.norm(d) * detail::silu_grad(z);
      }
      const auto o = f.o.row(t).segment(c0, D).transpose();
      const double coef = a.dot(o) * inv * inv * inv / double(D);
      dO.row(t).segment(c0, D) = (inv * a - coef * o).transpose();
    }

  // Reverse sweep per value head (docs/spec.md, "Backward"); dS = dL/dS_t carried from t+1, zero at T.
  Mat dy = Mat::Zero(T, C);          // [T, C] gradient into y = silu(pre); v columns written here
  Mat dqhat = Mat::Zero(T, Index(nk) * D);  // [T, nk*D] summed over the rep value heads of a key head
  Mat dkhat = Mat::Zero(T, Index(nk) * D);
  for (int h = 0; h < nv; ++h) {
    const int ki = h / rep;
    const double ea = std::exp(w.a_log(h));
    const std::vector<State> S = f.head_states(h);  // S[t + 1] = S_t, S[0] = h0's
    State dS = dht ? State(dcarry->ht.block(Index(h) * D, 0, D, D)) : State::Zero(D, D);
    for (int t = T - 1; t >= 0; --t) {
      const State& St = S[size_t(t) + 1];
      const State& Sprev = S[size_t(t)];
      const Vec qh = f.qhat_at(t, ki), kh = f.khat_at(t, ki), v = f.v_at(t, h), u = f.u_at(t, h);
      const Vec kv = f.kv.row(t).segment(Index(h) * D, D).transpose();
      const Vec dOt = dO.row(t).segment(Index(h) * D, D).transpose();
      const double g = f.g(t, h), beta = f.beta(t, h);

      // o = S_tᵀq̂
      dS.noalias() += qh * dOt.transpose();
      dqhat.row(t).segment(Index(ki) * D, D) += (St * dOt).transpose();
      // S_t = S_pre + k̂ ⊗ u with S_pre = g·S_{t-1}; u = β(v − kv); kv = S_preᵀk̂.
      const Vec du = dS.transpose() * kh;
      dy.row(t).segment(f.v_col(h), D) = (beta * du).transpose();
      const double dbeta = du.dot(v - kv);
      const Vec dkv = -beta * du;
      // dk̂ takes dL/dS_t (through k̂ ⊗ u) and dL/dkv (through S_preᵀk̂), before dS becomes dL/dS_pre.
      dkhat.row(t).segment(Index(ki) * D, D) += (dS * u + g * (Sprev * dkv)).transpose();
      dS.noalias() += kh * dkv.transpose();  // now dL/dS_pre
      const double dg = (dS.array() * Sprev.array()).sum();
      dS *= g;  // dL/dS_{t-1}

      // g = exp(−e^{a_log}·softplus(arg)), arg = a + dt_bias; β = sigmoid(b).
      const double dg_darg = dg * g * (-ea) * detail::softplus_grad(f.arg(t, h));
      gr.da(t, h) = dg_darg;
      gr.ddt_bias(h) += dg_darg;
      gr.da_log(h) += dg * g * (-ea) * detail::softplus(f.arg(t, h));
      gr.db(t, h) = dbeta * beta * (1.0 - beta);
    }
    gr.dh0.block(Index(h) * D, 0, D, D) = dS;  // dL/dS_{-1}
  }

  // l2-norm backward: x̂ = x·s/sqrt(n2), n2 = Σx² + 1e-6 (s = 1/sqrt(D) for q, 1 for k), so
  // dx = s/sqrt(n2)·(dx̂ − x·<dx̂, x>/n2).
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < nk; ++i) {
      const auto q = f.y.row(t).segment(f.q_col(i), D);
      const auto k = f.y.row(t).segment(f.k_col(i), D);
      const auto dq = dqhat.row(t).segment(Index(i) * D, D);
      const auto dk = dkhat.row(t).segment(Index(i) * D, D);
      const double nq2 = f.nq2(t, i), nk2 = f.nk2(t, i);
      const double invq = 1.0 / (std::sqrt(nq2) * std::sqrt(double(D)));
      const double invk = 1.0 / std::sqrt(nk2);
      dy.row(t).segment(f.q_col(i), D) = invq * (dq - q * (dq.dot(q) / nq2));
      dy.row(t).segment(f.k_col(i), D) = invk * (dk - k * (dk.dot(k) / nk2));
    }

  // SiLU + conv backward: pre[t, c] = Σ_j conv[c, j]·qkv[t-(K-1)+j, c], the rows before the window
  // the conv state's.
  const Mat dpre = dy.array() * f.pre.unaryExpr([](double v) { return detail::silu_grad(v); }).array();
  auto dqkv_at = [&](int s) { return s >= 0 ? gr.dqkv.row(s) : gr.dconv_state.row(K - 1 + s); };
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int s = t - (K - 1) + j;
      dqkv_at(s).array() += dpre.row(t).array() * w.conv.col(j).transpose().array();
      gr.dconv.col(j).array() += (dpre.row(t).array() * detail::qkv_at(dims, x, s).array()).transpose();
    }
  // The carried conv state is the raw rows at positions T-(K-1) .. T-1.
  if (dcs)
    for (int r = 0; r < K - 1; ++r) dqkv_at(T - (K - 1) + r) += dcarry->conv_state.row(r);
  return gr;
}

}  // namespace gdn::reference
