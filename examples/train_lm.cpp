// SPDX-License-Identifier: MIT
// A small byte-level language model trained with gdn, over the public API only.
//
// The model: an embedding of the 256 byte values into d features; blocks of (projections of the
// hidden state to the layer's qkv, z, a and b -> gdn::Layer -> a projection back to d, added to the
// hidden state); a head to 256 logits; cross-entropy on the next byte. Adam on every weight, the
// layers' own parameters included (updated in place with Layer::set_params). Truncated BPTT: the
// text is read as B streams, T bytes a step, and each block's layer starts every window from the
// state its last window left (HostCarry: ht and the conv state), with no gradient across windows.
//
// The dense parts (embedding, projections, head, Adam) are plain loops on the host here, to keep
// the example short and dependency-free; a real engine runs them on the GPU, in its own command
// buffers, around gdn's recorded work (Layer::record_forward, record_backward).
//
//   gdn_train_lm --text FILE [--steps N] [--blocks L] [--lr X] [--csv FILE] [--check]
// Prints a line per step (loss, tokens/s, the share of the step in gdn's calls); --csv writes the
// loss curve; --check: exit 1 unless the mean loss of the last 5 steps is under 0.8 times that of
// the first 5.
#include <gdn/gdn.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kB = 4, kT = 64;    // streams, bytes per window
constexpr int kDm = 64;           // the model's width
constexpr int kNv = 2, kNk = 1;   // the layer's value and key heads (head dim 128)
constexpr int kVocab = 256;

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// y [rows, cols] = x [rows, k] w [k, cols]
Vec matmul(const Vec& x, const Vec& w, int rows, int k, int cols) {
  Vec y(std::size_t(rows) * cols, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < k; ++i) {
      const float xi = x[std::size_t(r) * k + i];
      const float* wi = &w[std::size_t(i) * cols];
      float* yr = &y[std::size_t(r) * cols];
      for (int c = 0; c < cols; ++c) yr[c] += xi * wi[c];
    }
  return y;
}
// dx [rows, k] += dy [rows, cols] w^T, and dw [k, cols] += x^T dy: the backward of y = x w
void matmul_bwd(const Vec& x, const Vec& w, const Vec& dy, int rows, int k, int cols, Vec* dx, Vec& dw) {
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < k; ++i) {
      const float* wi = &w[std::size_t(i) * cols];
      const float* dyr = &dy[std::size_t(r) * cols];
      float* dwi = &dw[std::size_t(i) * cols];
      const float xi = x[std::size_t(r) * k + i];
      float acc = 0.0f;
      for (int c = 0; c < cols; ++c) {
        acc += dyr[c] * wi[c];
        dwi[c] += xi * dyr[c];
      }
      if (dx) (*dx)[std::size_t(r) * k + i] += acc;
    }
}

// Adam on one tensor.
struct Adam {
  Vec m, v;
  void step(Vec& w, const Vec& g, float lr, int t) {
    if (m.empty()) m.assign(w.size(), 0.0f), v.assign(w.size(), 0.0f);
    const float b1 = 0.9f, b2 = 0.999f, c1 = 1.0f - std::pow(b1, float(t)), c2 = 1.0f - std::pow(b2, float(t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
    }
  }
};

struct Block {
  Vec w_qkv, w_z, w_a, w_b, w_o;  // [d, C], [d, V], [d, nv], [d, nv], [V, d]
  gdn::Params params;
  std::unique_ptr<gdn::Layer> layer;
  gdn::HostCarry carry;           // what the last window left
  Adam o_qkv, o_z, o_a, o_b, o_o, o_conv, o_alog, o_dt, o_norm;
};

struct Options {
  std::string text, csv;
  int steps = 200, blocks = 2;
  float lr = 3e-3f;
  bool check = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--text") o.text = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--blocks") o.blocks = std::stoi(value());
    else if (a == "--lr") o.lr = std::stof(value());
    else if (a == "--check") o.check = true;
    else throw std::invalid_argument("unknown flag " + a);
  }
  if (o.text.empty()) throw std::invalid_argument("usage: gdn_train_lm --text FILE [--steps N] [--blocks L] [--lr X] [--csv FILE] [--check]");
  if (o.steps < 1 || o.blocks < 1) throw std::invalid_argument("--steps and --blocks must be >= 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  std::ifstream in(o.text, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < std::size_t(kB) * (kT + 1)) throw std::invalid_argument(o.text + ": too short a text");

  auto ctx = gdn::Context::create();
  const gdn::Config cfg{.nv = kNv, .nk = kNk, .conv_taps = 4, .rms_eps = 1e-6f};
  const int C = int(cfg.channels()), V = int(cfg.value_dim()), N = kB * kT;
  std::mt19937 rng(1);
  Vec emb = random_vec(std::size_t(kVocab) * kDm, rng, 0.5f), head = random_vec(std::size_t(kDm) * kVocab, rng, 0.05f);
  Adam o_emb, o_head;
  std::vector<Block> blocks(o.blocks);
  for (auto& b : blocks) {
    const float s = 1.0f / std::sqrt(float(kDm));
    b.w_qkv = random_vec(std::size_t(kDm) * C, rng, s);
    b.w_z = random_vec(std::size_t(kDm) * V, rng, s);
    b.w_a = random_vec(std::size_t(kDm) * kNv, rng, s);
    b.w_b = random_vec(std::size_t(kDm) * kNv, rng, s);
    b.w_o = random_vec(std::size_t(V) * kDm, rng, 0.02f);
    b.params.conv = random_vec(std::size_t(C) * cfg.conv_taps, rng, 0.3f);
    b.params.a_log.assign(kNv, 0.0f);
    b.params.dt_bias.assign(kNv, 0.5f);
    b.params.norm.assign(128, 1.0f);
    b.layer = std::make_unique<gdn::Layer>(ctx, cfg, b.params);
  }
  std::printf("gdn_train_lm: %s (%zu bytes), %d blocks of d %d, %s on %s\n", o.text.c_str(), text.size(), o.blocks,
              kDm, std::string(gdn::to_string(blocks[0].layer->variant())).c_str(), ctx->device().name.c_str());

  std::FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  if (!o.csv.empty() && !csv) throw std::runtime_error("cannot write " + o.csv);
  if (csv) std::fprintf(csv, "step,loss,tokens_per_s,gdn_share\n");
  const std::size_t stream = text.size() / kB;  // stream s reads bytes [s * stream, (s + 1) * stream)
  std::size_t pos = 0;                          // within each stream
  std::vector<double> losses;
  using clock = std::chrono::steady_clock;
  for (int step = 1; step <= o.steps; ++step) {
    const auto t0 = clock::now();
    double gdn_s = 0;
    if (pos + kT + 1 > stream) {  // back to the streams' start: fresh states
      pos = 0;
      for (auto& b : blocks) b.carry = {};
    }
    std::vector<int> x(N), y(N);
    for (int s = 0; s < kB; ++s)
      for (int t = 0; t < kT; ++t) {
        x[s * kT + t] = static_cast<unsigned char>(text[s * stream + pos + t]);
        y[s * kT + t] = static_cast<unsigned char>(text[s * stream + pos + t + 1]);
      }
    pos += kT;

    // ---- forward ----
    std::vector<Vec> h(o.blocks + 1), qkv(o.blocks), z(o.blocks), a(o.blocks), bb(o.blocks), out(o.blocks);
    std::vector<gdn::Tape> tapes(o.blocks);
    h[0].resize(std::size_t(N) * kDm);
    for (int r = 0; r < N; ++r) std::copy_n(&emb[std::size_t(x[r]) * kDm], kDm, &h[0][std::size_t(r) * kDm]);
    for (int l = 0; l < o.blocks; ++l) {
      auto& b = blocks[l];
      qkv[l] = matmul(h[l], b.w_qkv, N, kDm, C);
      z[l] = matmul(h[l], b.w_z, N, kDm, V);
      a[l] = matmul(h[l], b.w_a, N, kDm, kNv);
      bb[l] = matmul(h[l], b.w_b, N, kDm, kNv);
      const auto g0 = clock::now();
      gdn::HostCarry next;
      out[l] = b.layer->forward(kB, kT,
                                {.qkv = qkv[l], .z = z[l], .a = a[l], .b = bb[l], .h0 = b.carry.ht,
                                 .conv_state = b.carry.conv_state},
                                &tapes[l], &next);
      gdn_s += std::chrono::duration<double>(clock::now() - g0).count();
      b.carry = std::move(next);
      h[l + 1] = matmul(out[l], b.w_o, N, V, kDm);
      for (std::size_t i = 0; i < h[l + 1].size(); ++i) h[l + 1][i] += h[l][i];
    }
    Vec logits = matmul(h[o.blocks], head, N, kDm, kVocab);
    double loss = 0;
    Vec dlogits(logits.size());
    for (int r = 0; r < N; ++r) {
      float* lr = &logits[std::size_t(r) * kVocab];
      const float mx = *std::max_element(lr, lr + kVocab);
      double sum = 0;
      for (int c = 0; c < kVocab; ++c) sum += std::exp(double(lr[c] - mx));
      loss += std::log(sum) + mx - lr[y[r]];
      for (int c = 0; c < kVocab; ++c)
        dlogits[std::size_t(r) * kVocab + c] = float(std::exp(double(lr[c] - mx)) / sum - (c == y[r])) / float(N);
    }
    loss /= N;
    losses.push_back(loss);

    // ---- backward ----
    Vec dhead(head.size(), 0.0f), dh(std::size_t(N) * kDm, 0.0f);
    matmul_bwd(h[o.blocks], head, dlogits, N, kDm, kVocab, &dh, dhead);
    for (int l = o.blocks - 1; l >= 0; --l) {
      auto& b = blocks[l];
      Vec dw_o(b.w_o.size(), 0.0f), dout(std::size_t(N) * V, 0.0f);
      matmul_bwd(out[l], b.w_o, dh, N, V, kDm, &dout, dw_o);  // dh also flows on through the residual
      const auto g0 = clock::now();
      const gdn::HostGrads g = b.layer->backward(tapes[l], dout);
      gdn_s += std::chrono::duration<double>(clock::now() - g0).count();
      Vec dw_qkv(b.w_qkv.size(), 0.0f), dw_z(b.w_z.size(), 0.0f), dw_a(b.w_a.size(), 0.0f), dw_b(b.w_b.size(), 0.0f);
      matmul_bwd(h[l], b.w_qkv, g.dqkv, N, kDm, C, &dh, dw_qkv);
      matmul_bwd(h[l], b.w_z, g.dz, N, kDm, V, &dh, dw_z);
      matmul_bwd(h[l], b.w_a, g.da, N, kDm, kNv, &dh, dw_a);
      matmul_bwd(h[l], b.w_b, g.db, N, kDm, kNv, &dh, dw_b);
      b.o_qkv.step(b.w_qkv, dw_qkv, o.lr, step);
      b.o_z.step(b.w_z, dw_z, o.lr, step);
      b.o_a.step(b.w_a, dw_a, o.lr, step);
      b.o_b.step(b.w_b, dw_b, o.lr, step);
      b.o_o.step(b.w_o, dw_o, o.lr, step);
      b.o_conv.step(b.params.conv, g.dconv, o.lr, step);
      b.o_alog.step(b.params.a_log, g.da_log, o.lr, step);
      b.o_dt.step(b.params.dt_bias, g.ddt_bias, o.lr, step);
      b.o_norm.step(b.params.norm, g.dnorm, o.lr, step);
      b.layer->set_params(b.params);  // in place: no Layer rebuilt
    }
    Vec demb(emb.size(), 0.0f);
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < kDm; ++c) demb[std::size_t(x[r]) * kDm + c] += dh[std::size_t(r) * kDm + c];
    o_emb.step(emb, demb, o.lr, step);
    o_head.step(head, dhead, o.lr, step);

    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    std::printf("step %4d  loss %.4f  %8.0f tokens/s  gdn %4.1f%% of the step\n", step, loss, N / s, 100 * gdn_s / s);
    if (csv) std::fprintf(csv, "%d,%.6f,%.1f,%.4f\n", step, loss, N / s, gdn_s / s);
  }
  if (csv) std::fclose(csv);
  if (o.check) {
    const int k = std::min(5, o.steps / 2);
    double first = 0, last = 0;
    for (int i = 0; i < k; ++i) first += losses[i] / k, last += losses[losses.size() - 1 - i] / k;
    std::printf("gdn_train_lm: mean loss of the first %d steps %.4f, of the last %d %.4f\n", k, first, k, last);
    if (!(last < 0.8 * first)) {
      std::printf("gdn_train_lm: the loss did not fall to 0.8 of its start\n");
      return 1;
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gdn_train_lm: %s\n", e.what());
  return 2;
}
