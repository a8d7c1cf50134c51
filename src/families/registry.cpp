// SPDX-License-Identifier: MIT
// The kernel families in the order Variant::Auto tries them: the fastest first, per-head (which runs
// wherever 256-invocation workgroups do) last.
#include "families/family.hpp"

namespace gdn::detail {

std::span<const FamilyEntry> registry() {
  // (copied at the first call, after every module's entry is initialized)
  static const std::vector<FamilyEntry> entries{kChunkedMatrixFamily, kChunkedFamily, kSubgroupFamily, kPerHeadFamily};
  return entries;
}

std::string workgroup_why_not(const DeviceInfo& info) {
  if (info.max_workgroup_invocations >= 256 && info.max_workgroup_size_x >= 256) return "";
  return "the device allows " + std::to_string(std::min(info.max_workgroup_invocations, info.max_workgroup_size_x)) +
         " invocations per workgroup; gdn's kernels need 256 (maxComputeWorkGroupInvocations, "
         "maxComputeWorkGroupSize[0])";
}

}  // namespace gdn::detail
