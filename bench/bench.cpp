// SPDX-License-Identifier: MIT
// `gdn bench`: times the forward without tape, the forward with tape and the backward, and each
// kernel within them, with GPU timestamp queries (warm-up, then the median of repeats). Beside the
// times it measures the device's two ceilings in the same run (copy bandwidth, fp32 FMA rate), before
// and after the timed work (a run during which the device slowed is timed again), and reports each
// pass against the floors they give for the shape:
//   bytes: every input read once, every output written once;
//   flops: the serial recurrence, 7 D^2 per (token, v-head) forward (decay 1, kv 2, update 2, o 2)
//          and 21 D^2 backward (a replay of 5 D^2, the reverse sweep 16 D^2).
#include "bench.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <map>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "gdn/gdn.hpp"

namespace gdn::bench {
namespace {

struct Options {
  int B = 0, T = 0, nv = 0, nk = 0, K = 4;  // 0: the device's default shape
  int ckpt = 0;  // 0: the variant's default
  Variant variant = Variant::Auto;
  bool matrix_units = true;
  Precision precision = Precision::Exact;
  bool states = false;       // --states
  bool param_grads = true;   // --no-param-grads: false
  bool bf16 = false;         // --bf16
  int serial_split = 0;      // --serial-split
  int part_tokens = 0;       // --part-tokens
  std::vector<std::int64_t> seqlens;  // --seqlens: packed sequences of these lengths
  int repeats = 0;  // 0: 20 on a GPU, 5 on a CPU driver
  int warmup = 3;
  std::string json;
};

int parse_int(const std::string& flag, const std::string& v, int lo) {
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < lo)
    throw std::invalid_argument(flag + " '" + v + "': expected an integer >= " + std::to_string(lo));
  return x;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "--batch" || a == "-B") o.B = parse_int(a, value(), 1);
    else if (a == "--tokens" || a == "-T") o.T = parse_int(a, value(), 1);
    else if (a == "--nv") o.nv = parse_int(a, value(), 1);
    else if (a == "--nk") o.nk = parse_int(a, value(), 1);
    else if (a == "--taps" || a == "-K") o.K = parse_int(a, value(), 1);
    else if (a == "--ckpt") o.ckpt = parse_int(a, value(), 1);
    else if (a == "--variant") o.variant = parse_variant(value());
    else if (a == "--no-matrix") o.matrix_units = false;
    else if (a == "--fast") o.precision = Precision::Fast;
    else if (a == "--states") o.states = true;
    else if (a == "--no-param-grads") o.param_grads = false;
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--serial-split") o.serial_split = parse_int(a, value(), 0);
    else if (a == "--part-tokens") o.part_tokens = parse_int(a, value(), 0);
    else if (a == "--seqlens") {
      std::string v = value(), item;
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        o.seqlens.push_back(parse_int(a, v.substr(at, comma - at), 1));
        at = comma + 1;
      }
    }
    else if (a == "--repeats") o.repeats = parse_int(a, value(), 1);
    else if (a == "--warmup") o.warmup = parse_int(a, value(), 0);
    else if (a == "--json") o.json = value();
    else throw std::invalid_argument("unknown flag '" + a + "'\n" + usage());
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<float> uniform(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor random_tensor(const std::shared_ptr<Context>& ctx, std::vector<std::int64_t> shape, const char* name,
                     std::uint64_t seed, float scale = 1.0f, float shift = 0.0f, DType dtype = DType::Float32) {
  Tensor t(ctx, std::move(shape), name, dtype);
  auto v = uniform(std::size_t(t.numel()), seed);
  for (auto& x : v) x = shift + scale * x;
  t.upload(v);
  return t;
}

/// One timed pass: per-kernel medians in the order the kernels ran, and the total.
struct Pass {
  std::string name;
  double bytes = 0, flops = 0;
  std::vector<std::string> order;
  std::map<std::string, std::vector<double>> samples;
  std::map<std::string, double> kernel_bytes;  // KernelTime::bytes (the same each repeat)

  void add(const std::vector<KernelTime>& t) {
    for (const auto& k : t) {
      if (!samples.count(k.name)) order.push_back(k.name);
      samples[k.name].push_back(k.ms);
      kernel_bytes[k.name] = k.bytes;
    }
  }
  double ms(const std::string& k) const { return median(samples.at(k)); }
};

std::string fmt(double x, int prec = 3) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << x;
  return s.str();
}

std::string gib(std::size_t b) {
  return b >= (std::size_t(1) << 30) ? fmt(double(b) / double(1u << 30), 3) + " GiB"
                                     : fmt(double(b) / double(1u << 20), 2) + " MiB";
}

}  // namespace

bool slowed(const DevicePeaks& before, const DevicePeaks& after, bool cpu) {
  constexpr double kSlowed = 0.85;
  return !cpu && (after.copy_gb_per_s < kSlowed * before.copy_gb_per_s ||
                  after.fma_gflop_per_s < kSlowed * before.fma_gflop_per_s);
}

bool below_best(const DevicePeaks& best, const DevicePeaks& now, bool cpu) {
  constexpr double kBelow = 0.95;
  return !cpu && (now.copy_gb_per_s < kBelow * best.copy_gb_per_s || now.fma_gflop_per_s < kBelow * best.fma_gflop_per_s);
}

bool kernel_slowed(double bytes, double ms, double copy_gb_per_s, double share, bool cpu) {
  constexpr double kMinBytes = 128e6;  // smaller: launch latency, not bandwidth, bounds it
  return !cpu && ms > 0 && bytes >= kMinBytes && bytes / (ms * 1e-3) * 1e-9 < share * copy_gb_per_s;
}

double conv_slowed_share(bool bf16_qkv) { return bf16_qkv ? 0.35 : 0.6; }

// Where the layer runs the chunked family's fp32 kernels though the config allows its matrix-unit ones:
// why (empty otherwise), so that a run that fell back says so.
std::string matrix_units_why_not(const Context& ctx, const Config& cfg, const Layer& layer) {
  if (layer.variant() != Variant::Chunked || layer.config().matrix_units || !cfg.matrix_units) return "";
  for (const auto& f : family_support(ctx, cfg))
    if (f.variant == Variant::Chunked) return f.matrix_units_why_not;
  return "";
}

std::string usage() {
  return "gdn bench [--batch B] [--tokens T] [--nv N] [--nk N] [--taps K] [--ckpt N]\n"
         "          [--variant auto|subgroup|per-head|chunked] [--no-matrix] [--fast] [--repeats N]\n"
         "          [--warmup N] [--states] [--no-param-grads] [--bf16] [--serial-split N] [--json FILE]\n"
         "  Defaults: B 8 windows of T 512 tokens, nv 48 value heads, nk 16 key heads, K 4 conv taps (a\n"
         "  27B model's layer) on a GPU;\n"
         "  B 1, T 64, nv 4, nk 2 on a CPU driver (lavapipe), whose times are not performance figures.\n"
         "  --ckpt: the variant's default checkpoint interval when not given (8; chunked 16).\n"
         "  --no-matrix: the chunked variant without its matrix-unit kernels (where the device has them).\n"
         "  --fast: Config::precision fast, single fp16 products on the matrix units (where none run, the\n"
         "    exact kernels run, and the table says so).\n"
         "  --states: every call carries state: h0 and conv_state in, ht and the conv state out, and their\n"
         "    gradients through the backward.\n"
         "  --no-param-grads: the backward without the parameters' gradients (Config::param_grads off).\n"
         "  --bf16: bfloat16 boundary tensors (qkv, z, a, b, dout in; out and their gradients out).\n"
         "  --seqlens L1,L2,...: one stream of packed sequences of these lengths (B 1, T their sum).\n"
         "  --serial-split N: Config::serial_split, the matrix units' serial passes as N workgroups per\n"
         "    head (1, 2 or 4; 0, the default: the layer's choice).\n"
         "  --part-tokens N: Config::part_tokens, windows longer than N tokens run as parts (0, the\n"
         "    default: only where a buffer would exceed one storage binding's range).\n"
         "  The ceilings are measured before and after the timed work; a GPU run during which they fell\n"
         "  by over 15%, that began or ended with either under 95% of the best measured in this bench,\n"
         "  or whose conv_fwd (the slower of the two forwards') moved its bytes (128 MB or more) at\n"
         "  under 60% of the copy ceiling (35% with --bf16), is discarded and timed again (3 attempts),\n"
         "  and one still slowed is marked SLOWED and exits with status 3.\n";
}

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    out << usage();
    return 0;
  }
  Options o;
  try {
    o = parse(args);
  } catch (const std::invalid_argument& e) {
    err << "gdn bench: " << e.what() << "\n";
    return 2;
  }
  try {
    auto ctx = Context::create();
    const auto& dev = ctx->device();
    const bool cpu = dev.type == "cpu";
    // Shape: a 27B model's layer on a GPU; something that finishes in seconds on a CPU driver.
    if (!o.seqlens.empty()) {
      o.B = 1;
      o.T = 0;
      for (auto L : o.seqlens) o.T += int(L);
    }
    const bool default_shape = o.B == 0 && o.T == 0 && o.nv == 0 && o.nk == 0;
    if (o.B == 0) o.B = cpu ? 1 : 8;
    if (o.T == 0) o.T = cpu ? 64 : 512;
    if (o.nv == 0) o.nv = cpu ? 4 : 48;
    if (o.nk == 0) o.nk = cpu ? 2 : 16;
    if (o.repeats == 0) o.repeats = cpu ? 5 : 20;
    if (cpu && default_shape)
      err << "gdn bench: " << dev.name << " is a CPU driver: running a small shape; its times are not "
          << "performance figures (pass --batch/--tokens/--nv/--nk for another)\n";

    const Config cfg{.nv = o.nv, .nk = o.nk, .conv_taps = o.K, .rms_eps = 1e-6f, .checkpoint_interval = o.ckpt,
                     .variant = o.variant, .matrix_units = o.matrix_units,
                     .precision = o.precision, .param_grads = o.param_grads, .serial_split = o.serial_split,
                     .part_tokens = o.part_tokens};
    cfg.check();  // before any size made from it is allocated
    Params p;
    p.conv = uniform(std::size_t(cfg.channels()) * o.K, 1);
    for (auto& x : p.conv) x *= 0.5f;
    p.a_log = uniform(o.nv, 2);
    p.dt_bias = uniform(o.nv, 3);
    p.norm = uniform(kHeadDim, 4);
    for (auto& x : p.norm) x = 1.0f + 0.3f * x;
    Layer layer(ctx, cfg, p);

    err << "gdn bench: measuring the device's copy bandwidth and fp32 FMA rate...\n";
    DevicePeaks peaks = measure_peaks(*ctx), after;

    const std::int64_t B = o.B, T = o.T;
    const DType bd = o.bf16 ? DType::BFloat16 : DType::Float32;  // the boundary streams'
    DeviceInputs in{random_tensor(ctx, {B, T, cfg.channels()}, "qkv", 10, 1, 0, bd),
                    random_tensor(ctx, {B, T, cfg.value_dim()}, "z", 11, 1, 0, bd),
                    random_tensor(ctx, {B, T, cfg.nv}, "a", 12, 1, 0, bd),
                    random_tensor(ctx, {B, T, cfg.nv}, "b", 13, 1, 0, bd)};
    const Tensor dout = random_tensor(ctx, {B, T, cfg.value_dim()}, "dout", 14, 1, 0, bd);
    Tensor y;
    Tape tape;
    DeviceGrads grads;
    DeviceCarry carry, dcarry;
    std::int64_t S = B;  // the states' rows
    if (!o.seqlens.empty()) {
      in.cu_seqlens = {0};
      for (auto L : o.seqlens) in.cu_seqlens.push_back(in.cu_seqlens.back() + L);
      S = std::int64_t(o.seqlens.size());
    }
    if (o.states) {
      in.h0 = random_tensor(ctx, {S, cfg.nv, kHeadDim, kHeadDim}, "h0", 15);
      in.conv_state = random_tensor(ctx, {S, cfg.conv_taps - 1, cfg.channels()}, "conv_state", 16);
      dcarry = {random_tensor(ctx, {S, cfg.nv, kHeadDim, kHeadDim}, "dht", 17),
                random_tensor(ctx, {S, cfg.conv_taps - 1, cfg.channels()}, "dconv_state out", 18)};
    }

    const double BT = double(B) * double(T), F = o.bf16 ? 2.0 : 4.0, D2 = double(kHeadDim) * kHeadDim;
    const double in_bytes = F * BT * (cfg.channels() + cfg.value_dim() + 2.0 * cfg.nv);
    std::vector<Pass> passes(3);
    passes[0] = {.name = "forward (no tape)", .bytes = in_bytes + F * BT * cfg.value_dim(), .flops = 7 * D2 * BT * cfg.nv};
    passes[1] = {.name = "forward (tape)", .bytes = passes[0].bytes, .flops = passes[0].flops};
    passes[2] = {.name = "backward",
                 .bytes = 2 * in_bytes + F * BT * cfg.value_dim(),  // read inputs + dout, write their grads
                 .flops = 21 * D2 * BT * cfg.nv};
    auto step = [&](bool timed) {
      layer.forward(in, y, nullptr, o.states ? &carry : nullptr);
      if (timed) passes[0].add(layer.last_timings());
      layer.forward(in, y, &tape, o.states ? &carry : nullptr);
      if (timed) passes[1].add(layer.last_timings());
      layer.backward(tape, dout, grads, o.states ? &dcarry : nullptr);
      if (timed) passes[2].add(layer.last_timings());
    };
    err << "gdn bench: " << dev.name << ", B " << B << " T " << T << " nv " << cfg.nv << " nk " << cfg.nk << " K "
        << cfg.conv_taps << ", variant " << to_string(layer.variant()) << ": warm-up (" << o.warmup << " steps)...\n";
    const std::string why_fp32 = matrix_units_why_not(*ctx, cfg, layer);
    if (!why_fp32.empty())
      err << "gdn bench: the chunked family runs its fp32 kernels, not the matrix units: " << why_fp32 << '\n';
    layer.set_profiling(false);
    for (int i = 0; i < o.warmup; ++i) step(false);
    layer.set_profiling(true);
    // A GPU sometimes runs everything several times slower for a while (seen after a machine start,
    // and once for one whole run between two fine ceilings). The ceilings are measured again after the
    // timed work, and conv_fwd's bandwidth is held against the copy ceiling; where the ceilings fell
    // (slowed()), fell below the best of this run (below_best()), or conv_fwd fell far below the copy
    // (kernel_slowed()) the run is discarded and made again (at most kAttempts in all), and a run
    // still slowed is reported as such and exits with status 3. (Measuring the ceilings between the
    // repeats slowed the device itself.)
    constexpr int kAttempts = 3;
    bool slowed = false;
    DevicePeaks best = peaks;  // the highest of each ceiling measured so far
    auto keep_best = [&](const DevicePeaks& p) {
      best.copy_gb_per_s = std::max(best.copy_gb_per_s, p.copy_gb_per_s);
      best.fma_gflop_per_s = std::max(best.fma_gflop_per_s, p.fma_gflop_per_s);
    };
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      for (auto& ps : passes) ps.samples.clear(), ps.order.clear(), ps.kernel_bytes.clear();
      for (int r = 0; r < o.repeats; ++r) {
        step(true);
        if ((r + 1) % std::max(1, o.repeats / 4) == 0 || r + 1 == o.repeats)
          err << "gdn bench: repeat " << r + 1 << "/" << o.repeats << "\n";
      }
      after = measure_peaks(*ctx);
      // conv_fwd, memory-bound (qkv read, y and q^ k^ written): the slower of the two forwards' medians
      // where it is timed (not in lanes), so that a slowdown that holds either forward's repeats counts
      double conv_ms = 0.0;
      for (const Pass* p : {&passes[0], &passes[1]})
        if (p->samples.count("conv_fwd")) conv_ms = std::max(conv_ms, p->ms("conv_fwd"));
      const double conv_bytes = BT * double(cfg.channels()) * (F + 4.0);
      const bool conv_slow = kernel_slowed(conv_bytes, conv_ms, peaks.copy_gb_per_s, conv_slowed_share(o.bf16), cpu);
      keep_best(after);
      slowed = bench::slowed(peaks, after, cpu) || conv_slow || below_best(best, peaks, cpu) || below_best(best, after, cpu);
      if (!slowed) break;
      err << "gdn bench: the device slowed during the timed work (copy " << fmt(peaks.copy_gb_per_s, 0) << " -> "
          << fmt(after.copy_gb_per_s, 0) << " GB/s, fp32 FMA " << fmt(peaks.fma_gflop_per_s, 0) << " -> "
          << fmt(after.fma_gflop_per_s, 0) << " GFLOP/s; conv_fwd "
          << fmt(conv_bytes / (std::max(conv_ms, 1e-9) * 1e-3) * 1e-9, 0) << " GB/s; the best of this run: copy "
          << fmt(best.copy_gb_per_s, 0) << " GB/s, fp32 FMA " << fmt(best.fma_gflop_per_s, 0) << " GFLOP/s)"
          << (attempt < kAttempts ? ": discarding the run and timing again\n" : ": giving up\n");
      if (attempt < kAttempts) {
        peaks = measure_peaks(*ctx);
        keep_best(peaks);
      }
    }

    // ---- the table ----
    const double bw = peaks.copy_gb_per_s * 1e9, fl = peaks.fma_gflop_per_s * 1e9;
    out << "gdn bench: " << dev.name << " (" << dev.type << ", Vulkan " << dev.api_version << ", " << dev.driver
        << ")\n"
        << "shape: B " << B << ", T " << T << ", nv " << cfg.nv << ", nk " << cfg.nk << ", K " << cfg.conv_taps
        << ", D " << kHeadDim << "; checkpoint interval " << layer.config().checkpoint_interval << "; variant "
        << to_string(layer.variant()) << (layer.config().matrix_units ? " (matrix units)" : "")
        << (why_fp32.empty() ? "" : " (fp32 kernels, not the matrix units: " + why_fp32 + ")")
        << (layer.config().precision == Precision::Fast ? "; precision fast"
            : o.precision == Precision::Fast          ? "; precision exact (--fast: no matrix units run here)"
                                                      : "")
        << (o.states ? "; states carried in and out" : "") << (o.param_grads ? "" : "; no parameter gradients")
        << (o.bf16 ? "; bfloat16 boundary tensors" : "")
        << (o.seqlens.empty() ? "" : "; " + std::to_string(o.seqlens.size()) + " packed sequences")
        << "; median of " << o.repeats << " after " << o.warmup << " warm-up steps\n"
        << "ceilings measured in this run: copy " << fmt(peaks.copy_gb_per_s, 0) << " GB/s (read + write, "
        << gib(peaks.copy_bytes) << " buffers), fp32 FMA " << fmt(peaks.fma_gflop_per_s, 0)
        << " GFLOP/s; after the timed work " << fmt(after.copy_gb_per_s, 0) << " GB/s, "
        << fmt(after.fma_gflop_per_s, 0) << " GFLOP/s\n";
    if (slowed)
      out << "SLOWED: the device's ceilings fell during the timed work in every attempt; these times are not "
             "performance figures\n";
    if (cpu) out << "(a CPU driver: these times are not performance figures)\n";
    out << "\n"
        << std::left << std::setw(24) << "pass / kernel" << std::right << std::setw(10) << "ms" << std::setw(10)
        << "GB/s" << std::setw(10) << "GFLOP/s" << std::setw(12) << "bytes floor" << std::setw(12) << "fp32 floor"
        << std::setw(9) << "of bw" << std::setw(9) << "of fp32" << "\n";
    std::ostringstream js;
    js << "{\n  \"device\": \"" << dev.name << "\", \"driver\": \"" << dev.driver << "\", \"vulkan\": \""
       << dev.api_version << "\",\n  \"shape\": {\"B\": " << B << ", \"T\": " << T << ", \"nv\": " << cfg.nv
       << ", \"nk\": " << cfg.nk << ", \"K\": " << cfg.conv_taps << ", \"D\": " << kHeadDim
       << "}, \"checkpoint_interval\": " << layer.config().checkpoint_interval << ", \"variant\": \"" << to_string(layer.variant())
       << "\", \"matrix_units\": " << (layer.config().matrix_units ? "true" : "false") << ", \"repeats\": " << o.repeats << ",\n  \"copy_gb_per_s\": " << peaks.copy_gb_per_s
       << ", \"fma_gflop_per_s\": " << peaks.fma_gflop_per_s << ", \"copy_gb_per_s_after\": " << after.copy_gb_per_s
       << ", \"fma_gflop_per_s_after\": " << after.fma_gflop_per_s << ", \"slowed\": " << (slowed ? "true" : "false")
       << ",\n  \"passes\": [\n";
    double step_ms = 0, step_floor_bw = 0, step_floor_fl = 0;
    for (std::size_t pi = 0; pi < passes.size(); ++pi) {
      const auto& ps = passes[pi];
      const double ms = ps.ms("total"), fb = ps.bytes / bw * 1e3, ff = ps.flops / fl * 1e3;
      step_ms += ms;
      step_floor_bw += fb;
      step_floor_fl += ff;
      out << std::left << std::setw(24) << ps.name << std::right << std::setw(10) << fmt(ms) << std::setw(10)
          << fmt(ps.bytes / (ms * 1e-3) * 1e-9, 0) << std::setw(10) << fmt(ps.flops / (ms * 1e-3) * 1e-9, 0)
          << std::setw(12) << fmt(fb) << std::setw(12) << fmt(ff) << std::setw(8) << fmt(100 * fb / ms, 0) << "%"
          << std::setw(8) << fmt(100 * ff / ms, 0) << "%\n";
      js << "    {\"name\": \"" << ps.name << "\", \"ms\": " << ms << ", \"bytes\": " << ps.bytes
         << ", \"flops\": " << ps.flops << ", \"bytes_floor_ms\": " << fb << ", \"fp32_floor_ms\": " << ff
         << ", \"kernels\": {";
      std::ostringstream kjs;  // the kernels' bytes, as the JSON's "kernel_bytes"
      bool first = true;
      for (const auto& k : ps.order) {
        if (k == "total") continue;
        const double kms = ps.ms(k), kb = ps.kernel_bytes.at(k), kfb = kb / bw * 1e3;
        out << "  " << std::left << std::setw(22) << k << std::right << std::setw(10) << fmt(kms);
        if (kb > 0)
          out << std::setw(10) << fmt(kb / (kms * 1e-3) * 1e-9, 0) << std::setw(10) << "" << std::setw(12) << fmt(kfb)
              << std::setw(12) << "" << std::setw(8) << fmt(100 * kfb / kms, 0) << "%";
        out << "\n";
        js << (first ? "" : ", ") << "\"" << k << "\": " << kms;
        kjs << (first ? "" : ", ") << "\"" << k << "\": " << kb;
        first = false;
      }
      js << "}, \"kernel_bytes\": {" << kjs.str() << "}}" << (pi + 1 < passes.size() ? "," : "") << "\n";
    }
    out << std::left << std::setw(24) << "step (all three)" << std::right << std::setw(10) << fmt(step_ms)
        << std::setw(20) << "" << std::setw(12) << fmt(step_floor_bw) << std::setw(12) << fmt(step_floor_fl)
        << std::setw(8) << fmt(100 * step_floor_bw / step_ms, 0) << "%" << std::setw(8)
        << fmt(100 * step_floor_fl / step_ms, 0) << "%\n";
    out << "forward + backward: " << fmt(passes[1].ms("total") + passes[2].ms("total")) << " ms\n";
    out << "\n"
        << "ms: the GPU's time (timestamp queries), median of the repeats; the indented rows are the pass's\n"
        << "  kernels. GB/s, GFLOP/s: the bytes the pass must move at least (its inputs read, its outputs\n"
        << "  written once) and the flops of its recurrence, over that time. bytes floor, fp32 floor: the\n"
        << "  time those bytes take at the copy rate measured above, and those flops at the fp32 FMA rate\n"
        << "  measured above (no pass can beat either); of bw, of fp32: the floor's share of the time.\n"
        << "  A kernel's bytes are those of the buffer ranges it binds (KernelTime::bytes: what its work\n"
        << "  touches), its bytes floor their time at the copy rate.\n";

    out << "\ntape: " << gib(tape.device_bytes()) << " on the device for B " << B << ", T " << T << ":\n";
    js << "  ],\n  \"forward_backward_ms\": " << passes[1].ms("total") + passes[2].ms("total")
       << ",\n  \"tape_bytes\": " << tape.device_bytes() << ", \"tape\": {";
    bool first = true;
    for (const auto& [name, bytes] : tape.buffers()) {
      out << "  " << std::left << std::setw(22) << name << std::right << std::setw(14) << gib(bytes) << "\n";
      js << (first ? "" : ", ") << "\"" << name << "\": " << bytes;
      first = false;
    }
    out << "layer workspace (parameters, scratch): " << gib(layer.workspace_bytes()) << "\n";
    js << "},\n  \"workspace_bytes\": " << layer.workspace_bytes() << "\n}\n";
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      if (!(f << js.str())) throw std::runtime_error("cannot write " + o.json);
      err << "gdn bench: wrote " << o.json << "\n";
    }
    return slowed ? 3 : 0;
  } catch (const std::invalid_argument& e) {
    err << "gdn bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "gdn bench: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gdn::bench
