// SPDX-License-Identifier: MIT
// The float64 reference against itself: central finite differences of forward() against backward()
// for every input stream, parameter and carried state, windows with carried state against one long
// window, closed forms, and its shape errors.
#include <gdn/reference.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using gdn::reference::Carry;
using gdn::reference::Dims;
using gdn::reference::Grads;
using gdn::reference::Mat;
using gdn::reference::Vec;
using gdn::reference::Weights;
using gdn::reference::Window;

struct Problem {
  Dims dims;
  Weights w;
  Window x;  // with_state: nonzero h0 and conv_state
  Mat dout;
  Carry dcarry;  // with_state: gradients of the carried states (the loss's <dht, ht> + <dcs, conv_state_out>)
};

Mat uniform(std::mt19937_64& rng, Eigen::Index rows, Eigen::Index cols, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  Mat m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}
Vec uniform_vec(std::mt19937_64& rng, Eigen::Index n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (Eigen::Index i = 0; i < n; ++i) v(i) = u(rng);
  return v;
}

Problem make_problem(const Dims& d, std::uint64_t seed, bool with_state = false) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.dims = d;
  const Eigen::Index C = d.C(), vd = Eigen::Index(d.nv) * d.D;
  p.w.conv = uniform(rng, C, d.K, -0.5, 0.5);
  p.w.a_log = uniform_vec(rng, d.nv, -0.5, 0.5);
  p.w.dt_bias = uniform_vec(rng, d.nv, -0.5, 0.5);
  p.w.norm = uniform_vec(rng, d.D, 0.7, 1.3);
  p.x.qkv = uniform(rng, d.T, C, -1, 1);
  p.x.z = uniform(rng, d.T, vd, -1, 1);
  p.x.a = uniform(rng, d.T, d.nv, -1, 1);
  p.x.b = uniform(rng, d.T, d.nv, -1, 1);
  p.dout = uniform(rng, d.T, vd, -1, 1);
  if (with_state) {
    p.x.h0 = uniform(rng, vd, d.D, -0.5, 0.5);
    p.x.conv_state = uniform(rng, d.K - 1, C, -1, 1);
    p.dcarry.ht = uniform(rng, vd, d.D, -1, 1);
    p.dcarry.conv_state = uniform(rng, d.K - 1, C, -1, 1);
  }
  return p;
}

double loss(const Problem& p) {
  Carry c;
  const Mat out = gdn::reference::forward(p.dims, p.w, p.x, &c);
  double l = (p.dout.array() * out.array()).sum();
  if (p.dcarry.ht.size()) l += (p.dcarry.ht.array() * c.ht.array()).sum();
  if (p.dcarry.conv_state.size()) l += (p.dcarry.conv_state.array() * c.conv_state.array()).sum();
  return l;
}

// Every tensor the gradient covers, as flat float64 storage (row-major matrices are contiguous).
enum class Which { qkv, z, a, b, conv, a_log, dt_bias, norm, h0, conv_state };
const Which kAll[] = {Which::qkv, Which::z,     Which::a,       Which::b,    Which::conv,
                      Which::a_log, Which::dt_bias, Which::norm, Which::h0, Which::conv_state};

const char* name(Which t) {
  switch (t) {
    case Which::qkv: return "qkv";
    case Which::z: return "z";
    case Which::a: return "a";
    case Which::b: return "b";
    case Which::conv: return "conv";
    case Which::a_log: return "a_log";
    case Which::dt_bias: return "dt_bias";
    case Which::norm: return "norm";
    case Which::h0: return "h0";
    case Which::conv_state: return "conv_state";
  }
  return "?";
}

Eigen::Map<Eigen::VectorXd> param(Problem& p, Which t) {
  auto m = [](auto& x) { return Eigen::Map<Eigen::VectorXd>(x.data(), x.size()); };
  switch (t) {
    case Which::qkv: return m(p.x.qkv);
    case Which::z: return m(p.x.z);
    case Which::a: return m(p.x.a);
    case Which::b: return m(p.x.b);
    case Which::conv: return m(p.w.conv);
    case Which::a_log: return m(p.w.a_log);
    case Which::dt_bias: return m(p.w.dt_bias);
    case Which::norm: return m(p.w.norm);
    case Which::h0: return m(p.x.h0);
    case Which::conv_state: return m(p.x.conv_state);
  }
  throw std::logic_error("param");
}

Eigen::VectorXd grad(const Grads& g, Which t) {
  auto m = [](const auto& x) { return Eigen::VectorXd(Eigen::Map<const Eigen::VectorXd>(x.data(), x.size())); };
  switch (t) {
    case Which::qkv: return m(g.dqkv);
    case Which::z: return m(g.dz);
    case Which::a: return m(g.da);
    case Which::b: return m(g.db);
    case Which::conv: return m(g.dconv);
    case Which::a_log: return m(g.da_log);
    case Which::dt_bias: return m(g.ddt_bias);
    case Which::norm: return m(g.dnorm);
    case Which::h0: return m(g.dh0);
    case Which::conv_state: return m(g.dconv_state);
  }
  throw std::logic_error("grad");
}

// Central difference of L = <dout, out> (+ the carried states' terms) along direction dir of tensor t, step h.
double fd_directional(const Problem& p0, Which t, const Eigen::VectorXd& dir, double h) {
  Problem p = p0;
  param(p, t) += h * dir;
  const double lp = loss(p);
  param(p, t) -= 2 * h * dir;
  const double lm = loss(p);
  return (lp - lm) / (2 * h);
}

constexpr double kStep = 1e-5;
// Error of an FD estimate: |fd − analytic| / max(|analytic|, 1e-2·scale, 1e-12), scale = the largest
// |entry| of that tensor's gradient. Entries (or projections on a direction) at least 1% of the scale
// are judged purely relatively; smaller ones (e.g. an accidental cancellation in <g, dir>, or da at
// t = 0, which is exactly 0 because the decay multiplies the zero state) are judged against 1% of the
// scale, since the FD roundoff (~1e-16·|L|/h) is absolute, not relative to the entry.
double rel_err(double fd, double an, double scale) {
  return std::abs(fd - an) / std::max({std::abs(an), 1e-2 * scale, 1e-12});
}
// Measured with h = 1e-5: the cases below reach 6e-8 (set GDN_REF_VERBOSE=1 to print them); the same
// shapes over 200 further seeds reach 4.2e-7 (dt_bias, a, b, a_log: roundoff-limited, their error grows
// as 1/h; qkv and conv are truncation-limited, growing as h^2, so h = 1e-5 balances the two). The bound
// is 2.4x that worst case; a gradient scaled by 1 + 1e-5 already fails it 10x over (CanFail tests).
constexpr double kTol = 1e-6;

struct Report {
  double max_dir = 0;   // worst relative error over random directions
  double max_elem = 0;  // worst relative error over single elements
};

// Checks `n_dir` random unit directions and `n_elem` random single elements of tensor t.
Report check_tensor(const Problem& p, const Grads& g, Which t, int n_dir, int n_elem, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Eigen::VectorXd gt = grad(g, t);
  const Eigen::Index n = gt.size();
  const double scale = gt.cwiseAbs().maxCoeff();
  Report r;
  for (int i = 0; i < n_dir; ++i) {
    Eigen::VectorXd dir = uniform_vec(rng, n, -1, 1);
    dir.normalize();
    r.max_dir = std::max(r.max_dir, rel_err(fd_directional(p, t, dir, kStep), gt.dot(dir), scale));
  }
  std::uniform_int_distribution<Eigen::Index> pick(0, n - 1);
  for (int i = 0; i < n_elem; ++i) {
    const Eigen::Index e = pick(rng);
    Eigen::VectorXd dir = Eigen::VectorXd::Zero(n);
    dir(e) = 1;
    r.max_elem = std::max(r.max_elem, rel_err(fd_directional(p, t, dir, kStep), gt(e), scale));
  }
  return r;
}

// Every tensor (the states where the problem has them); every failure names the tensor and both errors.
void check_all(Problem p, int n_dir, int n_elem, std::uint64_t seed) {
  const Grads g = gdn::reference::backward(p.dims, p.w, p.x, p.dout, &p.dcarry);
  for (Which t : kAll) {
    if (param(p, t).size() == 0) continue;  // no state (or K = 1: no conv state)
    const Report r = check_tensor(p, g, t, n_dir, n_elem, seed + std::uint64_t(t));
    EXPECT_LT(r.max_dir, kTol) << name(t) << ": directional rel err " << r.max_dir;
    EXPECT_LT(r.max_elem, kTol) << name(t) << ": element rel err " << r.max_elem;
    if (std::getenv("GDN_REF_VERBOSE"))
      std::printf("  %-8s dir %.2e  elem %.2e\n", name(t), r.max_dir, r.max_elem);
  }
}

Dims dims(int T, int nv, int nk, int K, int D) {
  Dims d;
  d.T = T;
  d.nv = nv;
  d.nk = nk;
  d.K = K;
  d.D = D;
  d.eps = 1e-6;
  return d;
}

// ---------------------------------------------------------------- finite differences

TEST(ReferenceFd, Rep2K4) { check_all(make_problem(dims(6, 4, 2, 4, 8), 1), 4, 6, 100); }
TEST(ReferenceFd, Rep1K2) { check_all(make_problem(dims(7, 3, 3, 2, 8), 2), 4, 6, 200); }
TEST(ReferenceFd, Rep2K4D16) { check_all(make_problem(dims(5, 4, 2, 4, 16), 3), 4, 6, 300); }
TEST(ReferenceFd, Rep4K1) { check_all(make_problem(dims(5, 4, 1, 1, 8), 4), 3, 4, 400); }
// Fewer tokens than taps: every output reads the zero padding before the window.
TEST(ReferenceFd, TLessThanK) { check_all(make_problem(dims(2, 2, 1, 4, 8), 5), 3, 4, 500); }
TEST(ReferenceFd, T1) { check_all(make_problem(dims(1, 4, 2, 4, 8), 6), 3, 4, 600); }
// With a carried recurrent state and conv state in, and gradients of the carried states out.
TEST(ReferenceFd, WithStateRep2K4) { check_all(make_problem(dims(6, 4, 2, 4, 8), 21, true), 4, 6, 2100); }
TEST(ReferenceFd, WithStateRep1K2) { check_all(make_problem(dims(5, 3, 3, 2, 8), 22, true), 4, 6, 2200); }
// Fewer tokens than taps: the carried conv state is partly the one carried in.
TEST(ReferenceFd, WithStateTLessThanK) { check_all(make_problem(dims(2, 2, 1, 4, 8), 23, true), 3, 4, 2300); }
TEST(ReferenceFd, WithStateT1K1) { check_all(make_problem(dims(1, 2, 1, 1, 8), 24, true), 3, 4, 2400); }

// a + dt_bias > 20 on two heads (softplus' linear branch, derivative exactly 1). a_log = -3 there keeps
// g = exp(-e^-3·x) ≈ 0.3 away from 0 so the decay still matters; x stays in (20.5, 22.5) under the
// FD step, well clear of the branch point.
TEST(ReferenceFd, SoftplusLinearBranch) {
  Problem p = make_problem(dims(6, 4, 2, 4, 8), 7);
  for (int h : {1, 2}) {
    p.w.dt_bias(h) = 21.5;
    p.w.a_log(h) = -3.0;
  }
  ASSERT_GT((p.x.a.col(1).array() + p.w.dt_bias(1)).minCoeff(), 20.0);
  check_all(p, 4, 6, 700);
}

// The device's head dim, a few directions only.
TEST(ReferenceFd, D128) {
  const Problem p = make_problem(dims(3, 2, 1, 4, 128), 8, true);
  const Grads g = gdn::reference::backward(p.dims, p.w, p.x, p.dout, &p.dcarry);
  for (Which t : kAll) {
    const Report r = check_tensor(p, g, t, 2, 0, 800 + std::uint64_t(t));
    EXPECT_LT(r.max_dir, kTol) << name(t) << ": directional rel err " << r.max_dir;
  }
}

// ---------------------------------------------------------------- the checks can fail

// A gradient off by 1e-5 (relative) in one tensor, or computed for another dout, must fail the check.
TEST(ReferenceFdCanFail, PerturbedGradientIsCaught) {
  const Problem p = make_problem(dims(5, 4, 2, 4, 8), 9, true);
  const Grads g = gdn::reference::backward(p.dims, p.w, p.x, p.dout, &p.dcarry);
  for (Which t : kAll) {
    Grads bad = g;
    switch (t) {
      case Which::qkv: bad.dqkv *= 1 + 1e-5; break;
      case Which::z: bad.dz *= 1 + 1e-5; break;
      case Which::a: bad.da *= 1 + 1e-5; break;
      case Which::b: bad.db *= 1 + 1e-5; break;
      case Which::conv: bad.dconv *= 1 + 1e-5; break;
      case Which::a_log: bad.da_log *= 1 + 1e-5; break;
      case Which::dt_bias: bad.ddt_bias *= 1 + 1e-5; break;
      case Which::norm: bad.dnorm *= 1 + 1e-5; break;
      case Which::h0: bad.dh0 *= 1 + 1e-5; break;
      case Which::conv_state: bad.dconv_state *= 1 + 1e-5; break;
    }
    const Report r = check_tensor(p, bad, t, 2, 0, 900 + std::uint64_t(t));
    EXPECT_GT(r.max_dir, 5 * kTol) << name(t);
  }
}

TEST(ReferenceFdCanFail, WrongDoutIsCaught) {
  const Problem p = make_problem(dims(5, 4, 2, 4, 8), 10, true);
  Problem q = p;
  q.dout(2, 3) += 1e-3;  // one element of dout off
  const Grads wrong = gdn::reference::backward(q.dims, q.w, q.x, q.dout, &q.dcarry);
  for (Which t : kAll) {
    const Report r = check_tensor(p, wrong, t, 2, 0, 1000 + std::uint64_t(t));
    EXPECT_GT(r.max_dir, 10 * kTol) << name(t);
    if (std::getenv("GDN_REF_VERBOSE")) std::printf("  %-8s dir %.2e\n", name(t), r.max_dir);
  }
}

// The carried states' gradients matter: dropping dcarry (a backward as if the window were the last)
// fails the check of the states and of the inputs they reach.
TEST(ReferenceFdCanFail, MissingCarryGradientIsCaught) {
  const Problem p = make_problem(dims(5, 4, 2, 4, 8), 25, true);
  const Grads without = gdn::reference::backward(p.dims, p.w, p.x, p.dout);
  for (Which t : {Which::qkv, Which::h0, Which::conv_state, Which::a}) {
    const Report r = check_tensor(p, without, t, 2, 0, 2500 + std::uint64_t(t));
    EXPECT_GT(r.max_dir, 10 * kTol) << name(t);
  }
}

// ---------------------------------------------------------------- carried state

// Rows [r0, r0 + n) of a window's per-token tensors; the states as given.
Window slice(const Window& x, int r0, int n) {
  Window w;
  w.qkv = x.qkv.middleRows(r0, n);
  w.z = x.z.middleRows(r0, n);
  w.a = x.a.middleRows(r0, n);
  w.b = x.b.middleRows(r0, n);
  return w;
}

// Two windows run back to back, the second from the states the first leaves, give the output, the
// final states and every gradient of one window of both lengths (to float64 rounding), whatever the
// split (before, at and after the conv's reach, and a window shorter than it).
TEST(ReferenceCarry, TwoWindowsEqualOne) {
  for (const int split : {1, 2, 3, 5, 8}) {
    const Dims whole = dims(9, 4, 2, 4, 8);
    const Problem p = make_problem(whole, 26, true);
    Dims d1 = whole, d2 = whole;
    d1.T = split;
    d2.T = whole.T - split;
    Window x1 = slice(p.x, 0, split), x2 = slice(p.x, split, d2.T);
    x1.h0 = p.x.h0;
    x1.conv_state = p.x.conv_state;
    Carry c1, c2, c;
    const Mat out1 = gdn::reference::forward(d1, p.w, x1, &c1);
    x2.h0 = c1.ht;
    x2.conv_state = c1.conv_state;
    const Mat out2 = gdn::reference::forward(d2, p.w, x2, &c2);
    const Mat out = gdn::reference::forward(whole, p.w, p.x, &c);
    auto close = [](const auto& got, const auto& want, const char* what, int at) {
      const double err = (got - want).cwiseAbs().maxCoeff(), scale = std::max(1.0, want.cwiseAbs().maxCoeff());
      EXPECT_LE(err, 1e-13 * scale) << what << " at split " << at;
    };
    close(out1, out.topRows(split), "out (first window)", split);
    close(out2, out.bottomRows(d2.T), "out (second window)", split);
    close(c2.ht, c.ht, "ht", split);
    close(c2.conv_state, c.conv_state, "conv_state out", split);

    // backward: the second window first, its state gradients into the first's
    const Grads g = gdn::reference::backward(whole, p.w, p.x, p.dout, &p.dcarry);
    const Grads g2 = gdn::reference::backward(d2, p.w, x2, p.dout.bottomRows(d2.T), &p.dcarry);
    const Carry d1c{g2.dh0, g2.dconv_state};
    const Grads g1 = gdn::reference::backward(d1, p.w, x1, p.dout.topRows(split), &d1c);
    close(g1.dqkv, g.dqkv.topRows(split), "dqkv (first)", split);
    close(g2.dqkv, g.dqkv.bottomRows(d2.T), "dqkv (second)", split);
    for (const auto& [a1, a2, a, what] :
         {std::tuple{&g1.dz, &g2.dz, &g.dz, "dz"}, std::tuple{&g1.da, &g2.da, &g.da, "da"},
          std::tuple{&g1.db, &g2.db, &g.db, "db"}}) {
      close(*a1, a->topRows(split), what, split);
      close(*a2, a->bottomRows(d2.T), what, split);
    }
    close(g1.dh0, g.dh0, "dh0", split);
    close(g1.dconv_state, g.dconv_state, "dconv_state", split);
    close(Mat(g1.dconv + g2.dconv), g.dconv, "dconv", split);
    close(Vec(g1.da_log + g2.da_log), g.da_log, "da_log", split);
    close(Vec(g1.ddt_bias + g2.ddt_bias), g.ddt_bias, "ddt_bias", split);
    close(Vec(g1.dnorm + g2.dnorm), g.dnorm, "dnorm", split);
  }
}

// No state is a zero state: the same output and gradients bit for bit.
TEST(ReferenceCarry, AbsentStateIsZero) {
  const Problem p = make_problem(dims(6, 4, 2, 4, 8), 27);
  Problem q = p;
  q.x.h0 = Mat::Zero(4 * 8, 8);
  q.x.conv_state = Mat::Zero(3, p.dims.C());
  EXPECT_EQ(gdn::reference::forward(p.dims, p.w, p.x), gdn::reference::forward(q.dims, q.w, q.x));
  const Grads a = gdn::reference::backward(p.dims, p.w, p.x, p.dout);
  const Grads b = gdn::reference::backward(q.dims, q.w, q.x, q.dout);
  EXPECT_EQ(a.dqkv, b.dqkv);
  EXPECT_EQ(a.da, b.da);
  EXPECT_EQ(a.dh0, b.dh0);
}

// ---------------------------------------------------------------- closed forms

double sig(double x) { return 1 / (1 + std::exp(-x)); }

// T = 1: S_0 = k̂ ⊗ β·v (the decay multiplies a zero state), so o = β·<k̂, q̂>·v. Only the last conv tap
// reads inside the window. Computed here with scalar loops, independently of the reference.
TEST(ReferenceClosedForm, SingleToken) {
  const Dims d = dims(1, 4, 2, 3, 8);
  const Problem p = make_problem(d, 11);
  const int D = d.D, nk = d.nk, rep = d.rep();
  auto y = [&](int c) {
    const double pre = p.w.conv(c, d.K - 1) * p.x.qkv(0, c);
    return pre * sig(pre);
  };
  const Mat out = gdn::reference::forward(d, p.w, p.x);
  for (int h = 0; h < d.nv; ++h) {
    const int ki = h / rep;
    double qq = 0, kk = 0, qk = 0;
    for (int i = 0; i < D; ++i) {
      const double q = y(ki * D + i), k = y(nk * D + ki * D + i);
      qq += q * q;
      kk += k * k;
      qk += q * k;
    }
    const double qhat_khat = qk / (std::sqrt(qq + 1e-6) * std::sqrt(double(D)) * std::sqrt(kk + 1e-6));
    const double beta = sig(p.x.b(0, h));
    std::vector<double> o(D);
    double ss = 0;
    for (int i = 0; i < D; ++i) {
      o[i] = beta * qhat_khat * y(2 * nk * D + h * D + i);
      ss += o[i] * o[i];
    }
    const double inv = 1 / std::sqrt(ss / D + d.eps);
    for (int i = 0; i < D; ++i) {
      const double z = p.x.z(0, h * D + i);
      const double want = o[i] * inv * p.w.norm(i) * z * sig(z);
      EXPECT_NEAR(out(0, h * D + i), want, 1e-14 * std::max(1.0, std::abs(want))) << "h " << h << " i " << i;
    }
  }
  // The decay never matters at T = 1: da and da_log, ddt_bias are exactly zero.
  const Grads g = gdn::reference::backward(d, p.w, p.x, p.dout);
  EXPECT_EQ(g.da.cwiseAbs().maxCoeff(), 0.0);
  EXPECT_EQ(g.da_log.cwiseAbs().maxCoeff(), 0.0);
  EXPECT_EQ(g.ddt_bias.cwiseAbs().maxCoeff(), 0.0);
}

// T = 2, D = 1, one head: everything scalar. k̂ = k/sqrt(k²+1e-6) ≈ sign(k), q̂ likewise.
// S_0 = β0·k̂0·v0;  S_1 = g1·S_0 + k̂1·β1·(v1 − g1·S_0·k̂1);  o_t = S_t·q̂_t.
TEST(ReferenceClosedForm, ScalarTwoSteps) {
  const Dims d = dims(2, 1, 1, 1, 1);
  Problem p = make_problem(d, 12);
  p.w.conv.setConstant(1.0);  // K = 1, tap 1: y = silu(qkv)
  auto silu = [](double x) { return x * sig(x); };
  const double sp1 = std::log1p(std::exp(p.x.a(1, 0) + p.w.dt_bias(0)));
  const double g1 = std::exp(-std::exp(p.w.a_log(0)) * sp1);
  double o[2];
  double S = 0;
  for (int t = 0; t < 2; ++t) {
    const double q = silu(p.x.qkv(t, 0)), k = silu(p.x.qkv(t, 1)), v = silu(p.x.qkv(t, 2));
    const double qh = q / std::sqrt(q * q + 1e-6), kh = k / std::sqrt(k * k + 1e-6);
    const double beta = sig(p.x.b(t, 0));
    if (t == 1) S *= g1;
    S += kh * beta * (v - S * kh);
    o[t] = S * qh;
  }
  const Mat out = gdn::reference::forward(d, p.w, p.x);
  for (int t = 0; t < 2; ++t) {
    // D = 1: the RMSNorm makes |o·inv| ≈ 1, so out = o/sqrt(o² + eps)·norm·silu(z).
    const double want = o[t] / std::sqrt(o[t] * o[t] + d.eps) * p.w.norm(0) * silu(p.x.z(t, 0));
    EXPECT_NEAR(out(t, 0), want, 1e-14) << "t " << t;
  }
}

// Causality: changing the input at t = 3 leaves outputs before t = 3 bit-identical.
TEST(ReferenceClosedForm, Causal) {
  const Problem p = make_problem(dims(6, 4, 2, 4, 8), 13);
  Problem q = p;
  q.x.qkv.row(3).array() += 0.5;
  q.x.z.row(3).array() += 0.5;
  q.x.a.row(3).array() += 0.5;
  q.x.b.row(3).array() += 0.5;
  const Mat o1 = gdn::reference::forward(p.dims, p.w, p.x), o2 = gdn::reference::forward(q.dims, q.w, q.x);
  EXPECT_EQ(o1.topRows(3), o2.topRows(3));
  EXPECT_GT((o1.row(3) - o2.row(3)).cwiseAbs().maxCoeff(), 1e-3);
}

// ---------------------------------------------------------------- shape errors

// Expects std::invalid_argument whose message contains every string in `needles`.
template <class F>
void expect_invalid(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming " << needles.front();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "; wanted: " << n;
  }
}

TEST(ReferenceShapes, WrongTensorShapes) {
  const Dims d = dims(4, 4, 2, 4, 8);  // C = 64, nv*D = 32
  const Problem p = make_problem(d, 14);
  auto both = [](const Problem& q) {
    (void)gdn::reference::forward(q.dims, q.w, q.x);
  };
  auto bwd = [](const Problem& q) { (void)gdn::reference::backward(q.dims, q.w, q.x, q.dout); };
  {
    Problem q = p;
    q.x.qkv.resize(3, 64);
    expect_invalid([&] { both(q); }, {"qkv", "[3, 64]", "expected [4, 64]"});
    expect_invalid([&] { bwd(q); }, {"qkv", "[3, 64]", "expected [4, 64]"});
  }
  {
    Problem q = p;
    q.x.qkv.resize(4, 63);
    expect_invalid([&] { both(q); }, {"qkv", "[4, 63]", "[4, 64]"});
  }
  {
    Problem q = p;
    q.x.z.resize(4, 31);
    expect_invalid([&] { both(q); }, {"z is [4, 31]", "expected [4, 32]"});
  }
  {
    Problem q = p;
    q.x.a.resize(4, 3);
    expect_invalid([&] { both(q); }, {"a is [4, 3]", "expected [4, 4]"});
  }
  {
    Problem q = p;
    q.x.b.resize(5, 4);
    expect_invalid([&] { both(q); }, {"b is [5, 4]", "expected [4, 4]"});
  }
  {
    Problem q = p;
    q.dout.resize(4, 33);
    expect_invalid([&] { bwd(q); }, {"dout is [4, 33]", "expected [4, 32]"});
  }
  {
    Problem q = p;
    q.w.conv.resize(64, 3);
    expect_invalid([&] { both(q); }, {"conv is [64, 3]", "expected [64, 4]"});
  }
  {
    Problem q = p;
    q.w.a_log.resize(3);
    expect_invalid([&] { both(q); }, {"a_log is [3]", "expected [4]"});
  }
  {
    Problem q = p;
    q.w.dt_bias.resize(5);
    expect_invalid([&] { both(q); }, {"dt_bias is [5]", "expected [4]"});
  }
  {
    Problem q = p;
    q.w.norm.resize(7);
    expect_invalid([&] { both(q); }, {"norm is [7]", "expected [8]"});
  }
  {
    Problem q = p;
    q.x.h0 = Mat::Zero(32, 7);
    expect_invalid([&] { both(q); }, {"h0 is [32, 7]", "expected [32, 8]"});
  }
  {
    Problem q = p;
    q.x.conv_state = Mat::Zero(4, 64);
    expect_invalid([&] { both(q); }, {"conv_state is [4, 64]", "expected [3, 64]"});
  }
  {
    const Carry bad{Mat::Zero(31, 8), Mat()};
    expect_invalid([&] { (void)gdn::reference::backward(p.dims, p.w, p.x, p.dout, &bad); }, {"dcarry.ht is [31, 8]"});
  }
}

TEST(ReferenceShapes, BadDims) {
  const Problem p = make_problem(dims(4, 4, 2, 4, 8), 15);
  {
    Problem q = p;
    q.dims.nk = 3;  // 4 % 3 != 0
    expect_invalid([&] { (void)gdn::reference::forward(q.dims, q.w, q.x); }, {"nv (4)", "nk (3)"});
    expect_invalid([&] { (void)gdn::reference::backward(q.dims, q.w, q.x, q.dout); }, {"nv", "nk"});
  }
  {
    Problem q = p;
    q.dims.T = 0;
    q.x.qkv.resize(0, 64);
    expect_invalid([&] { (void)gdn::reference::forward(q.dims, q.w, q.x); }, {"T", "got 0"});
  }
  for (int Dims::*field : {&Dims::nv, &Dims::nk, &Dims::K, &Dims::D}) {
    Problem q = p;
    q.dims.*field = 0;
    EXPECT_THROW((void)gdn::reference::forward(q.dims, q.w, q.x), std::invalid_argument);
  }
  {
    Problem q = p;
    q.dims.eps = -1;
    expect_invalid([&] { (void)gdn::reference::forward(q.dims, q.w, q.x); }, {"eps"});
  }
}

}  // namespace
