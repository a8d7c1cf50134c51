// SPDX-License-Identifier: MIT
// The configuration side of the public API: variant names, Config::check's bounds, and which kernel
// families run on a device (family_support), decided without building anything.
#include <cmath>
#include <stdexcept>
#include <string>

#include "gdn/layer.hpp"
#include "families/family.hpp"

namespace gdn {

std::string_view to_string(Variant v) {
  switch (v) {
    case Variant::Auto: return "auto";
    case Variant::Subgroup: return "subgroup";
    case Variant::PerHead: return "per-head";
    case Variant::Chunked: return "chunked";
  }
  return "?";
}

std::string_view to_string(Precision p) { return p == Precision::Fast ? "fast" : "exact"; }

Variant parse_variant(std::string_view s) {
  if (s == "auto") return Variant::Auto;
  if (s == "subgroup") return Variant::Subgroup;
  if (s == "per-head") return Variant::PerHead;
  if (s == "chunked") return Variant::Chunked;
  throw std::invalid_argument("variant '" + std::string(s) + "': expected auto, subgroup, per-head or chunked");
}

void Config::check() const {
  auto bound = [](const char* name, std::int64_t v, std::int64_t lo, std::int64_t hi, const char* why) {
    if (v < lo || v > hi)
      throw std::invalid_argument("config: " + std::string(name) + " = " + std::to_string(v) + ", expected " +
                                  std::to_string(lo) + " to " + std::to_string(hi) + why);
  };
  bound("nv", nv, 1, kMaxHeads, " (value heads)");
  bound("nk", nk, 1, kMaxHeads, " (key heads)");
  if (nv % nk != 0)
    throw std::invalid_argument("config: nv = " + std::to_string(nv) + " is not a multiple of nk = " +
                                std::to_string(nk) + " (each key head serves nv/nk value heads)");
  bound("conv_taps", conv_taps, 1, kMaxConvTaps, " (the conv kernels unroll the taps)");
  if (variant == Variant::Chunked)
    bound("checkpoint_interval", checkpoint_interval, 0, kMaxChunk,
          " for the chunked family (its chunk length; 0: the default, 16)");
  else
    bound("checkpoint_interval", checkpoint_interval, 0, kMaxCheckpointInterval, " (0: the family's default)");
  if (!(rms_eps >= 0) || !std::isfinite(rms_eps)) throw std::invalid_argument("config: rms_eps must be finite and >= 0");
  if (serial_split != 0 && serial_split != 1 && serial_split != 2 && serial_split != 4)
    throw std::invalid_argument("config: serial_split = " + std::to_string(serial_split) +
                                ", expected 0 (the layer's choice), 1, 2 or 4");
  if (part_tokens < 0)
    throw std::invalid_argument("config: part_tokens = " + std::to_string(part_tokens) + ", expected >= 0 (0: parts only where needed)");
}

std::vector<FamilySupport> family_support(const Context& ctx, const Config& cfg) {
  cfg.check();
  const DeviceInfo& info = ctx.device();
  std::vector<FamilySupport> out;
  // One entry per Variant; the chunked one runs on the matrix units where its matrix-unit module
  // runs (and Config::matrix_units asks for it), else on CUDA cores.
  for (Variant f : {Variant::Chunked, Variant::Subgroup, Variant::PerHead}) {
    FamilySupport s;
    s.variant = f;
    for (const auto& e : detail::registry()) {
      if (e.variant != f) continue;
      const int cs = cfg.checkpoint_interval ? cfg.checkpoint_interval : e.default_interval;
      const std::string why = e.why_not(info, cfg, cs);
      if (e.matrix_units) {
        s.matrix_units = why.empty();
        s.matrix_units_why_not = why;
        continue;
      }
      s.checkpoint_interval = cs;
      s.why_not = why;
      s.runs = why.empty();
    }
    s.matrix_units = s.matrix_units && s.runs;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace gdn
