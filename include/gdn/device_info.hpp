// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gdn {

/// What the library reads off a Vulkan physical device: the limits that decide which kernels run.
struct DeviceInfo {
  std::uint32_t index = 0;           // position in the loader's enumeration (GDN_DEVICE=<index>)
  std::string name;
  std::string type;                  // "discrete", "integrated", "virtual", "cpu", "other"
  std::string api_version;           // e.g. "1.3.230"
  std::string driver;                // driver name and info
  std::uint32_t subgroup_size = 0;   // default subgroup size
  std::uint32_t min_subgroup_size = 0;
  std::uint32_t max_subgroup_size = 0;
  bool subgroup_shuffle = false;     // shuffle + arithmetic in compute shaders
  bool subgroup_size_control = false;  // required subgroup size and full subgroups in compute
  /// VK_NV_cooperative_matrix with a subgroup-scope 16x16x16 product of fp16 inputs into fp32,
  /// and fp16 arithmetic in shaders: the matrix units' kernels can run.
  bool matrix_f16_16x16x16 = false;
  std::uint64_t max_storage_buffer_range = 0;
  std::uint64_t min_storage_buffer_offset_alignment = 1;
  std::uint32_t max_shared_memory = 0;     // maxComputeSharedMemorySize, bytes
  std::uint32_t max_workgroup_count[3] = {0, 0, 0};
  std::uint32_t max_workgroup_invocations = 0;  // maxComputeWorkGroupInvocations
  std::uint32_t max_workgroup_size_x = 0;       // maxComputeWorkGroupSize[0] (gdn's workgroups are 1-D)
  std::uint32_t max_storage_buffers_per_stage = 0;  // maxPerStageDescriptorStorageBuffers
  double timestamp_period_ns = 0;    // 0: no timestamps on the compute queue
  /// The loop iterations one shader invocation may make in all, where the driver stops its loops
  /// beyond them (llvmpipe: 65535, its loop limiter), else 0 (no such limit).
  std::uint64_t max_loop_iterations = 0;
  /// Multiprocessors (SMs) where the driver says (VK_NV_shader_sm_builtins), else 0.
  std::uint32_t multiprocessors = 0;
  std::vector<std::uint64_t> device_local_heaps;  // bytes per device-local heap
  /// An adopted device (Context::adopt): the features gdn uses that the device has but was created
  /// without (ExternalDevice), as they are then off: "subgroupSizeControl", "cooperativeMatrix".
  std::vector<std::string> not_enabled = {};
};

}  // namespace gdn
