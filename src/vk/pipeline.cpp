// SPDX-License-Identifier: MIT
// The Vulkan wrapper's compute pipelines: built from SPIR-V, kept per device, their statistics.
#include "vk/device.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "gdn/error.hpp"
#include "vk/limits.hpp"
#include "vk/spirv_reflect.hpp"

namespace gdn::gpu {

// ---- pipelines -------------------------------------------------------------------------------------

std::shared_ptr<Pipeline> Device::pipeline(const PipelineDesc& d) {
  const std::lock_guard lock(mutex_);
  std::string key = d.name + '|' + std::to_string(reinterpret_cast<std::uintptr_t>(d.spirv.data())) + '|' +
                    std::to_string(d.spirv.size()) + '|' + std::to_string(d.push_constant_bytes) + '|' +
                    std::to_string(d.required_subgroup_size) + '|' + std::to_string(d.full_subgroups);
  for (auto s : d.spec) key += '|' + std::to_string(s);
  auto& p = pipelines_[key];
  if (!p) p = create_pipeline(d);
  return p;
}

std::unique_ptr<Pipeline> Device::create_pipeline(const PipelineDesc& d) {
  const std::lock_guard lock(mutex_);
  ++pipelines_built_;
  // The interface as the SPIR-V declares it under these constants: nothing is mirrored by hand.
  ShaderInterface iface;
  try {
    iface = reflect_shader(d.name, d.spirv, d.spec);
  } catch (const std::runtime_error& e) {
    throw std::logic_error(e.what());  // a shader gdn embeds that it cannot read: a build defect
  }
  if (iface.push_constant_bytes != d.push_constant_bytes)
    throw std::logic_error("pipeline " + d.name + ": the shader's push constants are " +
                           std::to_string(iface.push_constant_bytes) + " bytes, the host's " +
                           std::to_string(d.push_constant_bytes));
  if (iface.bindings > kMaxBindingsPerSet) throw std::logic_error("pipeline " + d.name + ": too many bindings");
  if (iface.bindings > info_.max_storage_buffers_per_stage)
    throw Error("pipeline " + d.name + " binds " + std::to_string(iface.bindings) + " storage buffers; device '" +
                info_.name + "' allows " + std::to_string(info_.max_storage_buffers_per_stage) +
                " per shader stage (maxPerStageDescriptorStorageBuffers)");
  if (iface.shared_bytes > info_.max_shared_memory)
    throw Error("pipeline " + d.name + " needs " + std::to_string(iface.shared_bytes) + " bytes of shared memory; device '" +
                info_.name + "' has " + std::to_string(info_.max_shared_memory) +
                " (maxComputeSharedMemorySize); a smaller checkpoint interval needs less");
  auto p = std::make_unique<Pipeline>();
  p->name = d.name;
  p->spirv = d.spirv.data();
  p->bindings = iface.bindings;
  p->used = iface.used;
  p->push_constant_bytes = d.push_constant_bytes;
  p->shared_bytes = iface.shared_bytes;
  try {
    vk::raii::ShaderModule module(device_, {.codeSize = d.spirv.size_bytes(), .pCode = d.spirv.data()});
    std::vector<vk::DescriptorSetLayoutBinding> binds(p->bindings);
    for (std::uint32_t i = 0; i < p->bindings; ++i)
      binds[i] = {.binding = i, .descriptorType = vk::DescriptorType::eStorageBuffer, .descriptorCount = 1,
                  .stageFlags = vk::ShaderStageFlagBits::eCompute};
    p->set_layout = vk::raii::DescriptorSetLayout(device_, {.bindingCount = p->bindings, .pBindings = binds.data()});
    vk::PushConstantRange range{.stageFlags = vk::ShaderStageFlagBits::eCompute, .offset = 0, .size = d.push_constant_bytes};
    vk::DescriptorSetLayout set = *p->set_layout;
    p->layout = vk::raii::PipelineLayout(device_, {.setLayoutCount = 1, .pSetLayouts = &set,
                                                   .pushConstantRangeCount = d.push_constant_bytes ? 1u : 0u,
                                                   .pPushConstantRanges = &range});
    std::vector<vk::SpecializationMapEntry> entries(d.spec.size());
    for (std::uint32_t i = 0; i < d.spec.size(); ++i)
      entries[i] = vk::SpecializationMapEntry{.constantID = i, .offset = 4 * i, .size = 4};
    vk::SpecializationInfo spec{.mapEntryCount = std::uint32_t(entries.size()), .pMapEntries = entries.data(),
                                .dataSize = d.spec.size() * 4, .pData = d.spec.data()};
    vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo req{.requiredSubgroupSize = d.required_subgroup_size};
    vk::PipelineShaderStageCreateInfo stage{.stage = vk::ShaderStageFlagBits::eCompute, .module = *module,
                                            .pName = "main", .pSpecializationInfo = &spec};
    if (d.required_subgroup_size || d.full_subgroups) {
      if (info_.subgroup_size_control) {
        if (d.required_subgroup_size) stage.pNext = &req;
        if (d.full_subgroups) stage.flags |= vk::PipelineShaderStageCreateFlagBits::eRequireFullSubgroups;
      } else if (d.required_subgroup_size &&
                 !(info_.min_subgroup_size == d.required_subgroup_size && info_.max_subgroup_size == d.required_subgroup_size)) {
        throw Error("pipeline " + d.name + " needs subgroups of " + std::to_string(d.required_subgroup_size) +
                    " and device '" + info_.name + "' cannot fix the subgroup size");
      }
    }
    vk::ComputePipelineCreateInfo pci{.stage = stage, .layout = *p->layout};
    if (pipeline_stats_) pci.flags |= vk::PipelineCreateFlagBits::eCaptureStatisticsKHR;
    p->pipeline = vk::raii::Pipeline(device_, pipeline_cache_, pci);
    if (pipeline_stats_) print_statistics(*p);
  } catch (const vk::SystemError& e) {
    throw Error("cannot build pipeline " + d.name + ": " + e.what());
  }
  return p;
}

void Device::print_statistics(const Pipeline& p) const {
  for (const auto& exe : device_.getPipelineExecutablePropertiesKHR({.pipeline = *p.pipeline})) {
    std::string line = "gdn: pipeline " + p.name + " [" + exe.name.data() + ", subgroup " + std::to_string(exe.subgroupSize) + "]";
    const auto stats = device_.getPipelineExecutableStatisticsKHR({.pipeline = *p.pipeline, .executableIndex = 0});
    for (const auto& st : stats) {
      line += std::string(", ") + st.name.data() + " ";
      switch (st.format) {
        case vk::PipelineExecutableStatisticFormatKHR::eBool32: line += st.value.b32 ? "yes" : "no"; break;
        case vk::PipelineExecutableStatisticFormatKHR::eInt64: line += std::to_string(st.value.i64); break;
        case vk::PipelineExecutableStatisticFormatKHR::eUint64: line += std::to_string(st.value.u64); break;
        case vk::PipelineExecutableStatisticFormatKHR::eFloat64: line += std::to_string(st.value.f64); break;
      }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::vector<std::uint8_t> Device::pipeline_cache_data() const { return pipeline_cache_.getData(); }

}  // namespace gdn::gpu
