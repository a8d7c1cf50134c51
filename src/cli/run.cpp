// SPDX-License-Identifier: MIT
#include "cli/run.hpp"

#include <tuple>

namespace gdn::cli {
namespace {
constexpr std::int64_t kD = kHeadDim;
}  // namespace

// The outputs of `gdn run` through the host API (float32 throughout).
std::vector<Output> run_f32(Layer& layer, Problem& p, const RunOptions& o, const Shape& conv_shape,
                            const Shape& a_log_shape, const Shape& dt_bias_shape, const Shape& norm_shape) {
  const HostInputs in{.qkv = p.qkv.data, .z = p.z.data, .a = p.a.data, .b = p.b.data, .h0 = p.h0.data,
                      .conv_state = p.conv_state.data, .cu_seqlens = p.cu};
  Tape tape;
  HostCarry carry;
  std::vector<Output> outputs;
  outputs.push_back({"out", {p.B, p.T, p.nv * kD}, layer.forward(p.B, p.T, in, o.backward ? &tape : nullptr, &carry)});
  outputs.push_back({"ht", {p.S, p.nv, kD, kD}, std::move(carry.ht)});
  outputs.push_back({"conv_state_out", {p.S, p.K - 1, p.C}, std::move(carry.conv_state)});
  if (o.backward) {
    const HostCarry dcarry{std::move(p.dht.data), std::move(p.dconv_state_out.data)};
    HostGrads g = layer.backward(tape, p.dout.data, &dcarry);
    outputs.push_back({"dqkv", p.qkv.shape, std::move(g.dqkv)});
    outputs.push_back({"dz", p.z.shape, std::move(g.dz)});
    outputs.push_back({"da", p.a.shape, std::move(g.da)});
    outputs.push_back({"db", p.b.shape, std::move(g.db)});
    outputs.push_back({"dconv", conv_shape, std::move(g.dconv)});
    outputs.push_back({"da_log", a_log_shape, std::move(g.da_log)});
    outputs.push_back({"ddt_bias", dt_bias_shape, std::move(g.ddt_bias)});
    outputs.push_back({"dnorm", norm_shape, std::move(g.dnorm)});
    if (!g.dh0.empty()) outputs.push_back({"dh0", {p.S, p.nv, kD, kD}, std::move(g.dh0)});
    outputs.push_back({"dconv_state", {p.S, p.K - 1, p.C}, std::move(g.dconv_state)});
  }
  return outputs;
}

// The same through the device API with bfloat16 boundary tensors (--bf16): the streams are rounded
// on upload, the outputs allocated by the calls take their inputs' dtype and are widened on download.
std::vector<Output> run_bf16(const std::shared_ptr<Context>& ctx, Layer& layer, Problem& p, const RunOptions& o,
                             const Shape& conv_shape, const Shape& a_log_shape, const Shape& dt_bias_shape,
                             const Shape& norm_shape) {
  auto tensor = [&](npy::Array& a, const char* name, DType d) {
    if (a.shape.empty()) return Tensor();
    Tensor t(ctx, a.shape, name, d);
    t.upload(a.data);
    return t;
  };
  const DType bf = DType::BFloat16, f32 = DType::Float32;
  const DeviceInputs in{tensor(p.qkv, "qkv", bf), tensor(p.z, "z", bf), tensor(p.a, "a", bf), tensor(p.b, "b", bf),
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
    layer.backward(tape, tensor(p.dout, "dout", bf), g, &dcarry);
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
