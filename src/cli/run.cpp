// SPDX-License-Identifier: MIT
#include "cli/run.hpp"

#include <tuple>

namespace gdn::cli {
namespace {
constexpr std::int64_t kD = kHeadDim;
}  // namespace

std::vector<Output> run_layer(const std::shared_ptr<Context>& ctx, Layer& layer, Problem& p, const RunOptions& o,
                              const Shape& conv_shape, const Shape& a_log_shape, const Shape& dt_bias_shape,
                              const Shape& norm_shape) {
  auto tensor = [&](npy::Array& a, const char* name, DType d) {
    if (a.shape.empty()) return Tensor();
    Tensor t(ctx, a.shape, name, d);
    t.upload(a.data);
    return t;
  };
  const DType f32 = DType::Float32, stream = o.bf16 ? DType::BFloat16 : f32;
  const DeviceInputs in{tensor(p.qkv, "qkv", stream), tensor(p.z, "z", stream), tensor(p.a, "a", stream), tensor(p.b, "b", stream),
                        tensor(p.h0, "h0", f32), tensor(p.conv_state, "conv_state", f32), p.cu};
  Tape tape;
  DeviceCarry carry;
  Tensor out;
  layer.forward(in, out, o.backward ? &tape : nullptr, &carry);
  std::vector<Output> outputs;
  outputs.push_back({"out", out.shape(), out.download()});
  outputs.push_back({"ht", carry.ht.shape(), carry.ht.download()});
  outputs.push_back({"conv_state_out", carry.conv_state.shape(), carry.conv_state.download()});
  if (o.backward) {
    const DeviceCarry dcarry{tensor(p.dht, "dht", f32), tensor(p.dconv_state_out, "dconv_state out", f32)};
    DeviceGrads g;
    layer.backward(tape, tensor(p.dout, "dout", stream), g, &dcarry);
    for (auto [name, t, shape] : {std::tuple{"dqkv", &g.dqkv, p.qkv.shape}, {"dz", &g.dz, p.z.shape},
                                  {"da", &g.da, p.a.shape}, {"db", &g.db, p.b.shape}, {"dconv", &g.dconv, conv_shape},
                                  {"da_log", &g.da_log, a_log_shape}, {"ddt_bias", &g.ddt_bias, dt_bias_shape},
                                  {"dnorm", &g.dnorm, norm_shape}, {"dh0", &g.dh0, Shape{p.S, p.nv, kD, kD}},
                                  {"dconv_state", &g.dconv_state, Shape{p.S, p.K - 1, p.C}}})
      if (!t->empty()) outputs.push_back({name, shape, t->download()});
  }
  return outputs;
}

}  // namespace gdn::cli
