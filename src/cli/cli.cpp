// SPDX-License-Identifier: MIT
// The `gdn` command-line tool. Uses the public API only (include/gdn), as a caller would.
//
// Exit codes: 0 done; 2 the caller's mistake (flags, input files whose shapes do not fit, see
// docs/spec.md, "The command-line contract"); 1 the device, the library or the file system failed.
// `gdn run` reads and checks every input before it computes, and computes everything before it
// writes: a refusal or a failure leaves --out as it was.
#include "cli/cli.hpp"
#include "cli/run.hpp"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>


#include "bench.hpp"
#include "cli/npy.hpp"
#include "gdn/gdn.hpp"

namespace gdn::cli {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

constexpr std::int64_t kD = kHeadDim;

const char* const kRunUsage =
    "usage: gdn run --in DIR --out DIR [--backward] [--bf16] [--fast] [--eps E] [--ckpt N]\n"
    "               [--variant auto|subgroup|per-head|chunked] [--allow-nonfinite]\n"
    "\n"
    "Runs the GatedDeltaNet layer on float32 C-order .npy files (docs/spec.md):\n"
    "  reads   DIR/qkv.npy [B,T,C]  z.npy [B,T,nv*128]  a.npy, b.npy [B,T,nv]  conv.npy [C,K]\n"
    "          a_log.npy, dt_bias.npy [nv]  norm.npy [128]   (+ dout.npy [B,T,nv*128] with --backward)\n"
    "          where C = (2*nk + nv)*128 and nv is a multiple of nk; B, T, nv, nk, K come from the shapes\n"
    "  reads, where present (absent: zero)  h0.npy [B,nv,128,128] (S[k][v])  conv_state.npy [B,K-1,C]\n"
    "          cu_seqlens.npy [N+1] (int32 or int64: N sequences packed in qkv [1,total,C]; the states\n"
    "          and their files then have N rows)\n"
    "          (the states the windows start from), and with --backward dht.npy [B,nv,128,128] and\n"
    "          dconv_state_out.npy [B,K-1,C] (the gradients of the states they leave)\n"
    "  writes  out.npy [B,T,nv*128]  ht.npy [B,nv,128,128]  conv_state_out.npy [B,K-1,C]\n"
    "          (+ dqkv.npy dz.npy da.npy db.npy, shaped like the inputs, dconv.npy da_log.npy\n"
    "          ddt_bias.npy dnorm.npy, shaped like the parameters, dconv_state.npy [B,K-1,C], and\n"
    "          dh0.npy [B,nv,128,128] where h0.npy was given, with --backward)\n"
    "\n"
    "  --in DIR          directory holding the input files\n"
    "  --out DIR         directory for the outputs (created if missing; written only on success)\n"
    "  --backward        also compute the gradients for dout.npy\n"
    "  --bf16            bfloat16 boundary tensors: qkv, z, a, b and dout rounded to bfloat16 (to\n"
    "                    nearest even), out and dqkv dz da db stored as bfloat16 and written widened\n"
    "                    to float32; parameters, states and their gradients stay float32\n"
    "  --fast            single fp16 products on the matrix units (Config::precision fast, about 1e-3\n"
    "                    relative); where none run, the exact kernels run and the summary says so\n"
    "  --eps E           epsilon of the gated RMSNorm (default 1e-6, >= 0)\n"
    "  --ckpt N          tokens between state checkpoints (>= 1; the chunked variant's chunk\n"
    "                    length, <= 32); default: the variant's (8; chunked 16)\n"
    "  --variant V       kernel family: auto (default), subgroup, per-head or chunked\n"
    "  --allow-nonfinite run on inputs that hold NaN or Inf (refused by default, naming the first)\n"
    "Every input's header is checked (a regular file, float32, shapes that fit together, the sizes\n"
    "within the library's bounds) before any payload is read.\n"
    "Exit status: 0 done, 2 bad flags or inputs (nothing written), 1 device or I/O failure.\n";

const char* const kInfoUsage =
    "usage: gdn info\n"
    "\n"
    "Lists the Vulkan devices, the one `gdn run` would use (GDN_DEVICE=<index or name substring>\n"
    "picks one; default: a discrete GPU, then integrated, then CPU), the limits that decide which\n"
    "kernels run, and the kernel variant that would run.\n";

bool is_help(std::string_view a) { return a == "-h" || a == "--help" || a == "help"; }

// "gdn: " once, however the message came (gdn::Error already carries the prefix).
std::string message_of(const std::exception& e) {
  std::string_view m = e.what();
  if (m.starts_with("gdn: ")) m.remove_prefix(5);
  return "gdn: " + std::string(m);
}

std::string bytes_str(std::uint64_t n) {
  std::ostringstream s;
  s << n << " bytes";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = -1;
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  if (u >= 0) s << " (" << std::fixed << std::setprecision(2) << v << ' ' << units[u] << ')';
  return s.str();
}

// ---- gdn info ------------------------------------------------------------------------------------

void print_device_line(std::ostream& out, const DeviceInfo& d, bool chosen) {
  out << (chosen ? "  * " : "    ") << d.index << ": " << d.name << "  [" << d.type << ", Vulkan "
      << d.api_version << ", " << d.driver << "]\n";
}

int run_info(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  for (const auto& a : args) {
    if (is_help(a)) {
      out << kInfoUsage;
      return kExitOk;
    }
    throw std::invalid_argument("info: unexpected argument '" + a + "' (gdn info takes no arguments)");
  }
  const auto devices = Context::devices();
  if (devices.empty()) {
    err << "gdn: no Vulkan device found (is a Vulkan driver installed? lavapipe works on any CPU)\n";
    return kExitRuntime;
  }
  const auto opts = Context::Options::from_env();
  std::shared_ptr<Context> ctx;
  std::string create_error;
  try {
    ctx = Context::create(opts);
  } catch (const std::exception& e) {  // still list what the loader sees
    create_error = message_of(e);
  }

  out << "Vulkan devices (* = chosen; GDN_DEVICE=<index or name substring> picks one):\n";
  for (const auto& d : devices) print_device_line(out, d, ctx && d.index == ctx->device().index);
  if (!ctx) {
    err << create_error << '\n';
    return kExitRuntime;
  }

  const DeviceInfo& d = ctx->device();
  out << "chosen device: " << d.index << ": " << d.name << "  ("
      << (opts.device.empty() ? "GDN_DEVICE unset: discrete, then integrated, then CPU"
                              : "GDN_DEVICE=" + opts.device)
      << ")\n";
  auto row = [&](std::string_view key) -> std::ostream& {
    return out << "  " << std::left << std::setw(27) << key << std::right;
  };
  row("subgroup size") << d.subgroup_size << " (min " << d.min_subgroup_size << ", max " << d.max_subgroup_size
                       << ")\n";
  row("subgroup shuffle") << (d.subgroup_shuffle ? "yes" : "no") << '\n';
  row("subgroup size control") << (d.subgroup_size_control ? "yes" : "no") << '\n';
  row("matrix units (fp16 16x16)") << (d.matrix_f16_16x16x16 ? "yes (VK_NV_cooperative_matrix)" : "no") << '\n';
  row("max storage buffer range") << bytes_str(d.max_storage_buffer_range) << '\n';
  row("max shared memory") << bytes_str(d.max_shared_memory) << '\n';
  row("max workgroup count") << d.max_workgroup_count[0] << " x " << d.max_workgroup_count[1] << " x "
                             << d.max_workgroup_count[2] << '\n';
  row("max workgroup invocations") << d.max_workgroup_invocations << '\n';
  row("max workgroup size x") << d.max_workgroup_size_x << '\n';
  row("storage buffers / stage") << d.max_storage_buffers_per_stage << '\n';
  {
    auto& o = row("device-local heaps");
    if (d.device_local_heaps.empty()) o << "none";
    for (std::size_t k = 0; k < d.device_local_heaps.size(); ++k)
      o << (k ? ", " : "") << bytes_str(d.device_local_heaps[k]);
    o << '\n';
  }
  if (d.multiprocessors > 0) row("multiprocessors") << d.multiprocessors << '\n';
  if (d.max_loop_iterations > 0)
    row("loop iterations") << "at most " << d.max_loop_iterations
                           << " per invocation (the driver's limit: longer windows run as parts)\n";
  if (d.timestamp_period_ns > 0)
    row("timestamps") << "yes (period " << d.timestamp_period_ns << " ns)\n";
  else
    row("timestamps") << "no (gdn bench cannot time kernels)\n";

  // Which kernel family would run, at the default config (no pipeline is built to tell).
  out << "kernel variants:\n";
  const auto families = family_support(*ctx, Config{});
  for (const auto& f : families)
    row(std::string(to_string(f.variant)))
        << (f.runs ? std::string("available") +
                         (f.matrix_units              ? " (matrix units)"
                          : f.matrix_units_why_not.empty() ? ""
                                                           : " on CUDA cores (not on the matrix units: " +
                                                                 f.matrix_units_why_not + ")")
                   : "unavailable: " + f.why_not)
        << '\n';
  for (const auto& f : families)
    if (f.runs) {
      row("auto runs") << to_string(f.variant) << (f.matrix_units ? " (matrix units)" : "") << '\n';
      return kExitOk;
    }
  row("auto runs") << "nothing: no kernel family runs on this device\n";
  return kExitRuntime;
}

// ---- gdn run: flags ------------------------------------------------------------------------------


float parse_eps(const std::string& s) {
  const std::string want = "expected a finite number >= 0, such as 1e-6";
  errno = 0;
  char* end = nullptr;
  const double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])))
    throw std::invalid_argument("--eps: '" + s + "' is not a number, " + want);
  if (errno == ERANGE || !std::isfinite(v) || !std::isfinite(float(v)))
    throw std::invalid_argument("--eps: '" + s + "' is not finite in float32, " + want);
  if (v < 0) throw std::invalid_argument("--eps: " + s + " is negative, " + want);
  return float(v);
}

int parse_ckpt(const std::string& s) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec == std::errc::invalid_argument || ptr != s.data() + s.size())
    throw std::invalid_argument("--ckpt: '" + s + "' is not an integer, expected an integer >= 1, such as 8");
  if (ec == std::errc::result_out_of_range || v < 1)
    throw std::invalid_argument("--ckpt: " + s + " is out of range, expected an integer >= 1 (and < 2^31), such as 8");
  return v;
}

Variant parse_variant_flag(const std::string& s) {
  try {
    return parse_variant(s);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("--variant: '" + s + "' is not a variant, expected auto, subgroup, per-head or chunked");
  }
}

// Accepts `--flag value` and `--flag=value`; each flag at most once. Returns false for --help.
bool parse_run(const std::vector<std::string>& args, RunOptions& o) {
  bool seen_in = false, seen_out = false, seen_eps = false, seen_ckpt = false, seen_variant = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool inline_value = false;
    if (is_help(flag)) return false;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      inline_value = true;
    }
    auto once = [&](bool& seen) {
      if (seen) throw std::invalid_argument("run: " + flag + " given more than once");
      seen = true;
    };
    auto take = [&](const char* what) {
      if (inline_value) return;
      if (i + 1 >= args.size() || args[i + 1].starts_with("--"))
        throw std::invalid_argument("run: " + flag + " needs a value (" + what + ")");
      value = args[++i];
    };
    if (flag == "--backward" || flag == "--allow-nonfinite" || flag == "--bf16" || flag == "--fast") {
      bool& on = flag == "--backward" ? o.backward
                 : flag == "--bf16"   ? o.bf16
                 : flag == "--fast"   ? o.fast
                                      : o.allow_nonfinite;
      if (inline_value) throw std::invalid_argument("run: " + flag + " takes no value, got '" + args[i] + "'");
      if (on) throw std::invalid_argument("run: " + flag + " given more than once");
      on = true;
    } else if (flag == "--in" || flag == "--out") {
      once(flag == "--in" ? seen_in : seen_out);
      take("a directory");
      if (value.empty()) throw std::invalid_argument("run: " + flag + " needs a non-empty directory path");
      (flag == "--in" ? o.in : o.out) = value;
    } else if (flag == "--eps") {
      once(seen_eps);
      take("a number >= 0, such as 1e-6");
      o.eps = parse_eps(value);
    } else if (flag == "--ckpt") {
      once(seen_ckpt);
      take("an integer >= 1, such as 8");
      o.ckpt = parse_ckpt(value);
    } else if (flag == "--variant") {
      once(seen_variant);
      take("auto, subgroup, per-head or chunked");
      o.variant = parse_variant_flag(value);
    } else {
      throw std::invalid_argument("run: unknown " + std::string(flag.starts_with("-") ? "flag '" : "argument '") +
                                  args[i] + "' (see gdn run --help)");
    }
  }
  if (!seen_in) throw std::invalid_argument("run: --in DIR is required (the directory holding qkv.npy ...)");
  if (!seen_out) throw std::invalid_argument("run: --out DIR is required (the directory for out.npy ...)");
  return true;
}

// ---- gdn run: inputs -----------------------------------------------------------------------------


std::string s(std::int64_t v) { return std::to_string(v); }

// "NAME.npy: shape [..], expected WANT (WHY)".
[[noreturn]] void refuse(const std::string& name, const Shape& got, const std::string& want,
                         const std::string& why) {
  throw std::invalid_argument(name + ".npy: shape " + npy::shape_str(got) + ", expected " + want +
                              (why.empty() ? "" : " (" + why + ")"));
}

void expect_shape(const std::string& name, const npy::Array& a, const Shape& want, const std::string& why) {
  if (a.shape != want) refuse(name, a.shape, npy::shape_str(want), why);
}

// The layer's config for the problem's shapes and the flags.
Config config_of(const Problem& p, const RunOptions& o) {
  Config cfg;
  cfg.nv = p.nv;
  cfg.nk = p.nk;
  cfg.conv_taps = p.K;
  cfg.rms_eps = o.eps;
  cfg.checkpoint_interval = o.ckpt;
  cfg.variant = o.variant;
  cfg.precision = o.fast ? Precision::Fast : Precision::Exact;
  return cfg;
}

// "[b, t, c]" of flat index i in a C-order array of `shape`.
std::string index_str(std::int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return npy::shape_str(idx);
}

// Reads every input (all of them present, each a float32 C-order .npy) and checks that the shapes
// fit together, the first misfit reported against what the earlier files fixed, and that the
// config they make is within the library's bounds: all from the headers, before any payload is read
// (a misfit is refused at the cost of its header, whatever the payloads' sizes). Then the payloads,
// and, unless --allow-nonfinite, that they hold no NaN or Inf.
Problem read_inputs(const RunOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.in, ec)) throw std::invalid_argument("--in " + o.in.string() + ": no such directory");
  if (!fs::is_directory(o.in, ec)) throw std::invalid_argument("--in " + o.in.string() + ": not a directory");

  std::vector<std::string> names = {"qkv", "z", "a", "b", "conv", "a_log", "dt_bias", "norm"};
  if (o.backward) names.push_back("dout");
  std::string missing;
  for (const auto& n : names)
    if (!fs::exists(o.in / (n + ".npy"), ec)) missing += (missing.empty() ? "" : ", ") + n + ".npy";
  if (!missing.empty())
    throw std::invalid_argument("--in " + o.in.string() + ": missing " + missing +
                                " (gdn run reads qkv z a b conv a_log dt_bias norm" +
                                (o.backward ? " dout" : "") + " as <name>.npy)");

  Problem p;
  std::vector<std::pair<const char*, npy::Array*>> files = {
      {"qkv", &p.qkv},   {"z", &p.z},         {"a", &p.a},         {"b", &p.b},
      {"conv", &p.conv}, {"a_log", &p.a_log}, {"dt_bias", &p.dt_bias}, {"norm", &p.norm}};
  if (o.backward) files.push_back({"dout", &p.dout});
  // the carried states, where present
  std::vector<std::pair<const char*, npy::Array*>> optional = {{"h0", &p.h0}, {"conv_state", &p.conv_state}};
  if (o.backward) {
    optional.push_back({"dht", &p.dht});
    optional.push_back({"dconv_state_out", &p.dconv_state_out});
  }
  for (const auto& f : optional)
    if (fs::exists(o.in / (std::string(f.first) + ".npy"), ec)) files.push_back(f);
  std::vector<npy::Header> headers;
  for (const auto& [n, dst] : files) {
    try {
      headers.push_back(npy::read_header(o.in / (std::string(n) + ".npy")));
    } catch (const npy::Error& e) {  // a bad input file is the caller's to fix
      throw std::invalid_argument(e.what());
    }
    dst->shape = headers.back().shape;
  }

  constexpr std::int64_t kMax = INT_MAX;
  // qkv fixes B, T and C.
  const Shape& q = p.qkv.shape;
  if (q.size() != 3 || q[0] < 1 || q[1] < 1 || q[2] < 1 || q[0] > kMax || q[1] > kMax || q[2] > kMax)
    refuse("qkv", q, "[B, T, C]", "rank 3, every dimension >= 1");
  p.B = int(q[0]);
  p.T = int(q[1]);
  p.C = int(q[2]);
  const std::string bt = s(p.B) + ", " + s(p.T) + ", ";
  const std::string from_qkv = "B=" + s(p.B) + ", T=" + s(p.T) + " from qkv.npy";

  // z fixes nv.
  const Shape& z = p.z.shape;
  if (z.size() != 3 || z[0] != p.B || z[1] != p.T || z[2] < kD || z[2] % kD != 0 || z[2] > kMax)
    refuse("z", z, "[" + bt + "nv*128]", "[B, T, nv*D] with " + from_qkv + ", nv >= 1 value heads of D=128");
  p.nv = int(z[2] / kD);
  const std::string from_z = "nv=" + s(p.nv) + " from z.npy";

  // C = 2*nk*D + nv*D fixes nk.
  const std::int64_t rest = std::int64_t(p.C) - std::int64_t(p.nv) * kD;
  if (rest < 2 * kD || rest % (2 * kD) != 0)
    refuse("qkv", q, "[" + bt + "256*nk + " + s(p.nv * kD) + "] for an integer nk >= 1",
           "[B, T, C] with C = (2*nk + nv)*128 and " + from_z);
  p.nk = int(rest / (2 * kD));
  if (p.nv % p.nk != 0)
    throw std::invalid_argument(
        "z.npy: shape " + npy::shape_str(z) + " gives nv=" + s(p.nv) + " value heads, expected a multiple of nk=" +
        s(p.nk) + " key heads (nk from qkv.npy shape " + npy::shape_str(q) + ": C = (2*nk + nv)*128 = " + s(p.C) +
        "); each key head serves nv/nk value heads");

  const std::string bt_nv = "[B, T, nv] with " + from_qkv + " and " + from_z;
  expect_shape("a", p.a, {p.B, p.T, p.nv}, bt_nv);
  expect_shape("b", p.b, {p.B, p.T, p.nv}, bt_nv);

  const Shape& c = p.conv.shape;
  if (c.size() != 2 || c[0] != p.C || c[1] < 1 || c[1] > kMax)
    refuse("conv", c, "[" + s(p.C) + ", K] with K >= 1 taps", "[C, K] with C=" + s(p.C) + " from qkv.npy");
  p.K = int(c[1]);

  expect_shape("a_log", p.a_log, {p.nv}, "[nv] with " + from_z);
  expect_shape("dt_bias", p.dt_bias, {p.nv}, "[nv] with " + from_z);
  expect_shape("norm", p.norm, {kD}, "[D], the head dimension D=128");
  if (o.backward)
    expect_shape("dout", p.dout, {p.B, p.T, p.nv * kD},
                 "[B, T, nv*D], the shape of out, with " + from_qkv + " and " + from_z);
  p.S = p.B;
  std::string from_b = "B=" + s(p.B) + " from qkv.npy";
  if (const fs::path cu = o.in / "cu_seqlens.npy"; fs::exists(cu, ec)) {
    Shape shape;
    try {
      p.cu = npy::read_ints(cu, shape);
    } catch (const npy::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (shape.size() != 1 || shape[0] < 2)
      refuse("cu_seqlens", shape, "[N+1]", "N >= 1 packed sequences: 0, then each one's end");
    p.S = int(shape[0] - 1);
    from_b = "N=" + s(p.S) + " sequences from cu_seqlens.npy";
  }
  for (auto [name, a] : {std::pair{"h0", &p.h0}, std::pair{"dht", &p.dht}})
    if (!a->shape.empty())
      expect_shape(name, *a, {p.S, p.nv, kD, kD}, "[B, nv, D, D] (S[k][v]) with " + from_b + " and " + from_z);
  for (auto [name, a] : {std::pair{"conv_state", &p.conv_state}, std::pair{"dconv_state_out", &p.dconv_state_out}})
    if (!a->shape.empty())
      expect_shape(name, *a, {p.S, p.K - 1, p.C}, "[B, K-1, C] with " + from_b + ", K from conv.npy");
  config_of(p, o).check();

  for (std::size_t k = 0; k < headers.size(); ++k) {
    const auto& [n, dst] = files[k];
    const fs::path path = o.in / (std::string(n) + ".npy");
    try {
      *dst = npy::read_payload(path, headers[k]);
    } catch (const npy::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (const std::int64_t i = npy::first_nonfinite(dst->data); i >= 0 && !o.allow_nonfinite)
      throw std::invalid_argument(path.string() + ": element " + std::to_string(i) + " (index " +
                                  index_str(i, dst->shape) + ") is " + (std::isnan(dst->data[std::size_t(i)]) ? "NaN" : "Inf") +
                                  ", expected finite values (--allow-nonfinite runs anyway)");
  }
  return p;
}

}  // namespace

namespace {

int run_run(const std::vector<std::string>& args, std::ostream& out, std::ostream&) {
  RunOptions o;
  if (!parse_run(args, o)) {
    out << kRunUsage;
    return kExitOk;
  }
  std::error_code ec;
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec))
    throw std::invalid_argument("--out " + o.out.string() + ": exists and is not a directory");

  Problem p = read_inputs(o);

  auto ctx = Context::create();
  const Config cfg = config_of(p, o);
  const Shape conv_shape = p.conv.shape, a_log_shape = p.a_log.shape, dt_bias_shape = p.dt_bias.shape,
              norm_shape = p.norm.shape;
  Params params{std::move(p.conv.data), std::move(p.a_log.data), std::move(p.dt_bias.data),
                std::move(p.norm.data)};
  Layer layer(ctx, cfg, params);
  params = {};

  const std::vector<Output> outputs = run_layer(ctx, layer, p, o, conv_shape, a_log_shape, dt_bias_shape, norm_shape);
  write_outputs(o.out, outputs);

  out << "gdn run: B=" << p.B << " T=" << p.T << " nv=" << p.nv << " nk=" << p.nk << " K=" << p.K
      << " (C=" << p.C << ")" << (o.bf16 ? ", bfloat16 boundary tensors" : "") << ", "
      << to_string(layer.variant()) << " kernels on " << ctx->device().name
      << (layer.config().precision == Precision::Fast ? ", precision fast"
          : o.fast ? ", precision exact (--fast: no matrix units run here)" : "")
      << "; wrote";
  for (const auto& x : outputs) out << ' ' << x.name << ".npy";
  out << " to " << o.out.string() << '\n';
  return kExitOk;
}

}  // namespace

std::string usage() {
  return std::string(
             "usage: gdn <command> [flags]\n"
             "\n"
             "GatedDeltaNet forward and backward on Vulkan compute.\n"
             "\n"
             "commands:\n"
             "  info     the Vulkan devices, the chosen one, its limits and the kernel variant that runs\n"
             "  run      the layer on .npy files (forward; --backward for the gradients)\n"
             "  bench    time the layer (default: a 27B model's shape, B 8 x T 512)\n"
             "  help     this text (also -h, --help; `gdn <command> --help` for one command)\n"
             "\n"
             "environment: GDN_DEVICE=<index or name substring> picks the device, GDN_VALIDATE=1 turns on\n"
             "the Vulkan validation layer.\n"
             "\n") +
         kInfoUsage + "\n" + kRunUsage + "\n" + gdn::bench::usage();
}

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    if (args.empty()) {
      err << usage();
      return kExitUsage;
    }
    const std::string& cmd = args[0];
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (is_help(cmd)) {
      out << usage();
      return kExitOk;
    }
    if (cmd == "info") return run_info(rest, out, err);
    if (cmd == "run") return run_run(rest, out, err);
    if (cmd == "bench") return gdn::bench::main(rest, out, err);
    err << "gdn: unknown command '" << cmd << "', expected info, run or bench (see gdn --help)\n";
    return kExitUsage;
  } catch (const std::invalid_argument& e) {
    err << message_of(e) << '\n';
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    err << "gdn: out of host memory\n";
    return kExitRuntime;
  } catch (const std::exception& e) {  // gdn::Error, I/O
    err << message_of(e) << '\n';
    return kExitRuntime;
  }
}

}  // namespace gdn::cli
