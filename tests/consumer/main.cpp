// SPDX-License-Identifier: MIT
// One forward and backward through an installed (or add_subdirectory'd) gdn: it links and runs.
#include <gdn/gdn.hpp>

#include <cstdio>
#include <vector>

int main() {
  auto ctx = gdn::Context::create();
  const gdn::Config cfg{.nv = 2, .nk = 1, .conv_taps = 4};
  const std::size_t C = std::size_t(cfg.channels()), V = std::size_t(cfg.value_dim()), B = 1, T = 5;
  gdn::Layer layer(ctx, cfg, gdn::Params{std::vector<float>(C * 4, 0.25f), std::vector<float>(2, 0.0f),
                                         std::vector<float>(2, 0.0f), std::vector<float>(128, 1.0f)});
  const std::vector<float> qkv(B * T * C, 0.5f), z(B * T * V, 1.0f), ab(B * T * 2, 0.1f), dout(B * T * V, 1.0f);
  gdn::Tape tape;
  const auto out = layer.forward(int(B), int(T), {qkv, z, ab, ab}, &tape);
  const auto g = layer.backward(tape, dout);
  std::printf("consumer: %s, out[0] %g, dnorm[0] %g\n", ctx->device().name.c_str(), out[0], g.dnorm[0]);
  return out.size() == B * T * V && g.dconv.size() == C * 4 ? 0 : 1;
}
