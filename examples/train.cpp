// SPDX-License-Identifier: MIT
// A training loop around one GatedDeltaNet layer, written against the public API only.
//
// The model: input projections on the host (x [B, T, d] to the layer's qkv, z, a and b), the layer on
// the device, and a squared error against a teacher, the same model with other weights. Every step
// runs the layer's forward (with a tape) and backward, backpropagates the layer's input gradients
// through the projections, and takes an SGD step on the projections and on the layer's own
// parameters, which are updated in place (Layer::set_params: no Layer is rebuilt, no pipeline built).
//
//   gdn_train_example [--steps N] [--lr X] [--check]
// --check: exit 1 unless the loss has fallen to half its first value.
#include <gdn/gdn.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kB = 2, kT = 32, kIn = 16;  // windows, tokens, input features
constexpr int kD = 128;                   // the layer's head dim

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// y [rows, cols] = x [rows, k] w [k, cols]
std::vector<float> matmul(const std::vector<float>& x, const std::vector<float>& w, int rows, int k, int cols) {
  std::vector<float> y(std::size_t(rows) * cols, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < k; ++i) {
      const float xi = x[std::size_t(r) * k + i];
      for (int c = 0; c < cols; ++c) y[std::size_t(r) * cols + c] += xi * w[std::size_t(i) * cols + c];
    }
  return y;
}
// w [k, cols] -= lr * x^T dy  (x [rows, k], dy [rows, cols])
void sgd_matmul(std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& dy, int rows, int k,
                int cols, float lr) {
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < k; ++i) {
      const float xi = lr * x[std::size_t(r) * k + i];
      for (int c = 0; c < cols; ++c) w[std::size_t(i) * cols + c] -= xi * dy[std::size_t(r) * cols + c];
    }
}
void sgd(std::vector<float>& w, const std::vector<float>& dw, float lr) {
  for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * dw[i];
}

// The model's weights: four input projections and the layer's parameters.
struct Model {
  std::vector<float> w_qkv, w_z, w_a, w_b;  // [kIn, C], [kIn, nv*D], [kIn, nv], [kIn, nv]
  gdn::Params layer;
};

Model random_model(const gdn::Config& cfg, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const int C = int(cfg.channels()), V = int(cfg.value_dim()), nv = cfg.nv;
  const float s = 1.0f / std::sqrt(float(kIn));
  Model m{random_vector(std::size_t(kIn) * C, rng, s), random_vector(std::size_t(kIn) * V, rng, s),
          random_vector(std::size_t(kIn) * nv, rng, s), random_vector(std::size_t(kIn) * nv, rng, s), {}};
  m.layer.conv = random_vector(std::size_t(C) * cfg.conv_taps, rng, 0.5f);
  m.layer.a_log = random_vector(nv, rng, 0.5f);
  m.layer.dt_bias = random_vector(nv, rng, 0.5f);
  m.layer.norm = std::vector<float>(kD, 1.0f);
  return m;
}

struct Projected {
  std::vector<float> qkv, z, a, b;
};
Projected project(const Model& m, const gdn::Config& cfg, const std::vector<float>& x) {
  const int rows = kB * kT, C = int(cfg.channels()), V = int(cfg.value_dim()), nv = cfg.nv;
  return {matmul(x, m.w_qkv, rows, kIn, C), matmul(x, m.w_z, rows, kIn, V), matmul(x, m.w_a, rows, kIn, nv),
          matmul(x, m.w_b, rows, kIn, nv)};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200;
  float lr = 0.05f;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--lr" && i + 1 < argc) lr = std::stof(argv[++i]);
    else if (a == "--check") check = true;
    else {
      std::fprintf(stderr, "usage: gdn_train_example [--steps N] [--lr X] [--check]\n");
      return 2;
    }
  }
  try {
    auto ctx = gdn::Context::create();
    const gdn::Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .rms_eps = 1e-6f};
    const int rows = kB * kT, C = int(cfg.channels()), V = int(cfg.value_dim()), nv = cfg.nv;

    // the data: fixed inputs, and the teacher's outputs for them
    std::mt19937 rng(7);
    const std::vector<float> x = random_vector(std::size_t(rows) * kIn, rng, 1.0f);
    std::vector<float> target;
    {
      const Model teacher = random_model(cfg, 1);
      gdn::Layer t(ctx, cfg, teacher.layer);
      const Projected p = project(teacher, cfg, x);
      target = t.forward(kB, kT, {.qkv = p.qkv, .z = p.z, .a = p.a, .b = p.b});
    }

    Model m = random_model(cfg, 2);
    gdn::Layer layer(ctx, cfg, m.layer);
    std::printf("gdn_train_example: %s, %s kernels, B %d T %d\n", ctx->device().name.c_str(),
                std::string(gdn::to_string(layer.variant())).c_str(), kB, kT);
    double first = 0, last = 0;
    gdn::Tape tape;  // reused: a forward into a tape of the same shape reuses its memory
    for (int step = 0; step < steps; ++step) {
      const Projected p = project(m, cfg, x);
      const std::vector<float> out = layer.forward(kB, kT, {.qkv = p.qkv, .z = p.z, .a = p.a, .b = p.b}, &tape);
      std::vector<float> dout(out.size());
      double loss = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        dout[i] = (out[i] - target[i]) / float(rows);
        loss += 0.5 * double(out[i] - target[i]) * (out[i] - target[i]) / rows;
      }
      if (step == 0) first = loss;
      last = loss;
      if (step % 10 == 0 || step + 1 == steps) std::printf("step %4d  loss %.6f\n", step, loss);

      const gdn::HostGrads g = layer.backward(tape, dout);
      sgd_matmul(m.w_qkv, x, g.dqkv, rows, kIn, C, lr);
      sgd_matmul(m.w_z, x, g.dz, rows, kIn, V, lr);
      sgd_matmul(m.w_a, x, g.da, rows, kIn, nv, lr);
      sgd_matmul(m.w_b, x, g.db, rows, kIn, nv, lr);
      sgd(m.layer.conv, g.dconv, lr);
      sgd(m.layer.a_log, g.da_log, lr);
      sgd(m.layer.dt_bias, g.ddt_bias, lr);
      sgd(m.layer.norm, g.dnorm, lr);
      layer.set_params(m.layer);  // in place: the same device buffers, no pipeline built
    }
    std::printf("loss %.6f -> %.6f over %d steps\n", first, last, steps);
    if (check && !(last < 0.5 * first)) {
      std::fprintf(stderr, "gdn_train_example: the loss did not fall to half its first value\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn_train_example: %s\n", e.what());
    return 1;
  }
}
