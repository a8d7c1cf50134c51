// SPDX-License-Identifier: MIT
// The configuration side of the public API: variant names, Config::check's bounds, and which kernel
// families run on a device (family_support), decided without building anything.
#include <cmath>
#include <stdexcept>
#include <string>

#include "gdn/layer.hpp"
#include "kernels.hpp"

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
}

std::vector<FamilySupport> family_support(const Context& ctx, const Config& cfg) {
  cfg.check();
  const DeviceInfo& info = ctx.device();
  const auto choice = detail::choose_subgroup_size(info);
  std::vector<FamilySupport> out;
  for (Variant f : {Variant::Chunked, Variant::Subgroup, Variant::PerHead}) {
    FamilySupport s;
    s.variant = f;
    s.checkpoint_interval = cfg.checkpoint_interval
                                ? cfg.checkpoint_interval
                                : (f == Variant::Chunked ? detail::kDefaultChunk : detail::kDefaultInterval);
    const auto cs = std::uint32_t(s.checkpoint_interval);
    if (info.max_workgroup_invocations < 256)  // every recurrence kernel runs 256 invocations a workgroup
      s.why_not = "the device allows " + std::to_string(info.max_workgroup_invocations) +
                  " invocations per workgroup; gdn's kernels need 256 (maxComputeWorkGroupInvocations)";
    else if (f != Variant::PerHead && !choice.size)
      s.why_not = choice.why_not;
    else if (f == Variant::Chunked)
      s.why_not = detail::chunked_why_not(info, choice.size, cs);
    else if (f == Variant::Subgroup)
      s.why_not = detail::subgroup_backward_why_not(info, choice.size, cs);
    s.runs = s.why_not.empty();
    s.matrix_units = s.runs && f == Variant::Chunked && cfg.matrix_units && detail::chunked_matrix_why_not(info, cs).empty();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace gdn
