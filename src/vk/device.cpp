// SPDX-License-Identifier: MIT
#include "vk/device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <unistd.h>
#include <sstream>

#include "gdn/error.hpp"
#include "vk/limits.hpp"

namespace gdn::gpu {
namespace {

std::string bytes_str(std::uint64_t b) {
  char buf[64];
  if (b >= (std::uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1u << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1u << 20));
  return buf;
}

std::string version_str(std::uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

std::string type_str(vk::PhysicalDeviceType t) {
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu: return "discrete";
    case vk::PhysicalDeviceType::eIntegratedGpu: return "integrated";
    case vk::PhysicalDeviceType::eVirtualGpu: return "virtual";
    case vk::PhysicalDeviceType::eCpu: return "cpu";
    default: return "other";
  }
}

int type_rank(vk::PhysicalDeviceType t) {  // lower is preferred
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu: return 0;
    case vk::PhysicalDeviceType::eIntegratedGpu: return 1;
    case vk::PhysicalDeviceType::eVirtualGpu: return 2;
    case vk::PhysicalDeviceType::eCpu: return 3;
    default: return 4;
  }
}

std::optional<std::uint32_t> compute_family(const vk::raii::PhysicalDevice& pd) {
  auto families = pd.getQueueFamilyProperties();
  std::optional<std::uint32_t> any;
  for (std::uint32_t i = 0; i < families.size(); ++i) {
    if (!(families[i].queueFlags & vk::QueueFlagBits::eCompute)) continue;
    if (families[i].timestampValidBits > 0) return i;  // prefer a family that can time itself
    if (!any) any = i;
  }
  return any;
}

bool has_extension(const vk::raii::PhysicalDevice& pd, const char* name) {
  for (const auto& ext : pd.enumerateDeviceExtensionProperties())
    if (std::strcmp(ext.extensionName.data(), name) == 0) return true;
  return false;
}

// VK_NV_cooperative_matrix with a subgroup-scope 16x16x16 fp16 x fp16 + fp32 -> fp32 product, and
// shaderFloat16 (the kernels split fp32 operands into fp16 pairs in registers).
bool has_f16_matrix(const vk::raii::PhysicalDevice& pd) {
  if (pd.getProperties().apiVersion < VK_API_VERSION_1_2 || !has_extension(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) ||
      !pd.getDispatcher()->vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
    return false;
  const auto feats = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceVulkan12Features,
                                     vk::PhysicalDeviceCooperativeMatrixFeaturesNV>();
  if (!feats.get<vk::PhysicalDeviceVulkan12Features>().shaderFloat16 ||
      !feats.get<vk::PhysicalDeviceCooperativeMatrixFeaturesNV>().cooperativeMatrix)
    return false;
  for (const auto& m : pd.getCooperativeMatrixPropertiesNV())
    if (m.MSize == 16 && m.NSize == 16 && m.KSize == 16 && m.AType == vk::ComponentTypeNV::eFloat16 &&
        m.BType == vk::ComponentTypeNV::eFloat16 && m.CType == vk::ComponentTypeNV::eFloat32 &&
        m.DType == vk::ComponentTypeNV::eFloat32 && m.scope == vk::ScopeNV::eSubgroup)
      return true;
  return false;
}

DeviceInfo read_info(const vk::raii::PhysicalDevice& pd, std::uint32_t index) {
  DeviceInfo info;
  info.index = index;
  const auto props = pd.getProperties();
  const bool v13 = props.apiVersion >= VK_API_VERSION_1_3;
  info.name = props.deviceName.data();
  info.type = type_str(props.deviceType);
  info.api_version = version_str(props.apiVersion);
  info.max_storage_buffer_range = props.limits.maxStorageBufferRange;
  info.min_storage_buffer_offset_alignment = props.limits.minStorageBufferOffsetAlignment;
  info.max_shared_memory = props.limits.maxComputeSharedMemorySize;
  for (int i = 0; i < 3; ++i) info.max_workgroup_count[i] = props.limits.maxComputeWorkGroupCount[i];
  info.max_workgroup_invocations = props.limits.maxComputeWorkGroupInvocations;
  info.max_workgroup_size_x = props.limits.maxComputeWorkGroupSize[0];
  info.max_storage_buffers_per_stage = props.limits.maxPerStageDescriptorStorageBuffers;

  vk::PhysicalDeviceSubgroupProperties sg{};
  vk::PhysicalDeviceSubgroupSizeControlProperties sgc{};
  vk::PhysicalDeviceDriverProperties drv{};
  vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV sm{};
  vk::PhysicalDeviceProperties2 p2{.pNext = &sg};
  sg.pNext = &drv;
  if (v13) drv.pNext = &sgc;  // core in 1.3; older devices are asked nothing they may not know
  const bool sm_count = has_extension(pd, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
  if (sm_count) sm.pNext = std::exchange(p2.pNext, &sm);
  pd.getDispatcher()->vkGetPhysicalDeviceProperties2(static_cast<VkPhysicalDevice>(*pd),
                                                     reinterpret_cast<VkPhysicalDeviceProperties2*>(&p2));
  info.driver = std::string(drv.driverName.data()) + " " + drv.driverInfo.data();
  // llvmpipe ends every loop of an invocation once it has made 65535 iterations in all (gallivm's
  // LP_MAX_TGSI_LOOP_ITERATIONS), silently: the rest of the invocation's work is not done.
  if (drv.driverID == vk::DriverId::eMesaLlvmpipe) info.max_loop_iterations = 65535;
  if (sm_count) info.multiprocessors = sm.shaderSMCount;
  info.subgroup_size = sg.subgroupSize;
  info.min_subgroup_size = v13 ? sgc.minSubgroupSize : sg.subgroupSize;
  info.max_subgroup_size = v13 ? sgc.maxSubgroupSize : sg.subgroupSize;
  const auto need_ops = vk::SubgroupFeatureFlagBits::eBasic | vk::SubgroupFeatureFlagBits::eShuffle |
                        vk::SubgroupFeatureFlagBits::eArithmetic;
  info.subgroup_shuffle = (sg.supportedStages & vk::ShaderStageFlagBits::eCompute) &&
                          (sg.supportedOperations & need_ops) == need_ops;
  if (v13) {
    auto feats = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceVulkan13Features>();
    const auto& f13 = feats.get<vk::PhysicalDeviceVulkan13Features>();
    info.subgroup_size_control = f13.subgroupSizeControl && f13.computeFullSubgroups &&
                                 (sgc.requiredSubgroupSizeStages & vk::ShaderStageFlagBits::eCompute);
  }
  info.matrix_f16_16x16x16 = has_f16_matrix(pd);
  if (auto fam = compute_family(pd)) {
    if (pd.getQueueFamilyProperties()[*fam].timestampValidBits > 0 && props.limits.timestampComputeAndGraphics)
      info.timestamp_period_ns = props.limits.timestampPeriod;
  }
  const auto mem = pd.getMemoryProperties();
  for (std::uint32_t h = 0; h < mem.memoryHeapCount; ++h)
    if (mem.memoryHeaps[h].flags & vk::MemoryHeapFlagBits::eDeviceLocal)
      info.device_local_heaps.push_back(mem.memoryHeaps[h].size);
  return info;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT,
                                                const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    auto* sink = static_cast<std::function<void(std::string_view)>*>(user);
    const char* msg = data && data->pMessage ? data->pMessage : "(no message)";
    if (sink && *sink)
      (*sink)(msg);
    else
      std::fprintf(stderr, "gdn: Vulkan validation error: %s\n", msg);
  }
  return VK_FALSE;
}

bool has_layer(const vk::raii::Context& ctx, const char* name) {
  for (const auto& l : ctx.enumerateInstanceLayerProperties())
    if (std::strcmp(l.layerName.data(), name) == 0) return true;
  return false;
}

}  // namespace

// ---- enumeration and choice ----------------------------------------------------------------------

std::vector<DeviceInfo> Device::enumerate() {
  vk::raii::Context ctx;
  vk::ApplicationInfo app{.pApplicationName = "gdn", .apiVersion = VK_API_VERSION_1_3};
  vk::raii::Instance inst(ctx, vk::InstanceCreateInfo{.pApplicationInfo = &app});
  std::vector<DeviceInfo> out;
  std::uint32_t i = 0;
  for (const auto& pd : inst.enumeratePhysicalDevices()) out.push_back(read_info(pd, i++));
  return out;
}

namespace {

// The pipeline cache's file between processes: GDN_PIPELINE_CACHE (a path; empty or "0": none), else
// $XDG_CACHE_HOME/gdn or ~/.cache/gdn, one file per device and driver version.
std::string cache_path(const vk::PhysicalDeviceProperties& p) {
  if (const char* e = std::getenv("GDN_PIPELINE_CACHE")) return std::strcmp(e, "0") == 0 ? "" : e;
  std::filesystem::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = x;
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::filesystem::path(h) / ".cache";
  else return "";
  char name[96];
  std::snprintf(name, sizeof name, "pipelines-%04x-%04x-%08x.bin", p.vendorID, p.deviceID, p.driverVersion);
  return (dir / "gdn" / name).string();
}

// The file's bytes where its header is a cache of this device (VkPipelineCacheHeaderVersionOne:
// length, version, vendor, device, pipelineCacheUUID), else none: a stale or foreign file is skipped.
std::vector<std::uint8_t> read_cache(const std::string& path, const vk::PhysicalDeviceProperties& p) {
  if (path.empty()) return {};
  std::ifstream f(path, std::ios::binary);
  std::vector<std::uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (data.size() < 32) return {};
  std::uint32_t h[4];
  std::memcpy(h, data.data(), sizeof h);
  if (h[0] < 32 || h[1] != std::uint32_t(VK_PIPELINE_CACHE_HEADER_VERSION_ONE) || h[2] != p.vendorID ||
      h[3] != p.deviceID || std::memcmp(data.data() + 16, p.pipelineCacheUUID.data(), VK_UUID_SIZE) != 0)
    return {};
  return data;
}

// Writes the cache whole or not at all (a sibling file renamed over it); failures are ignored: the
// cache only saves build time.
void write_cache(const std::string& path, const std::vector<std::uint8_t>& data) {
  if (path.empty() || data.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());  // (one writer per process)
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    if (!f) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

Device::Device(const DeviceOptions& opts) : on_validation_error_(opts.on_validation_error) {
  if (opts.external) {
    adopt(*opts.external);
    return;
  }
  try {
    vk::ApplicationInfo app{.pApplicationName = "gdn", .apiVersion = VK_API_VERSION_1_3};
    std::vector<const char*> layers, extensions;
    const char* kValidation = "VK_LAYER_KHRONOS_validation";
    const bool validate = opts.validate && has_layer(context_, kValidation);
    if (opts.validate && !validate)
      std::fprintf(stderr, "gdn: validation asked for, but %s is not installed\n", kValidation);
    if (validate) {
      layers.push_back(kValidation);
      extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    }
    instance_ = vk::raii::Instance(context_, vk::InstanceCreateInfo{
                                                 .pApplicationInfo = &app,
                                                 .enabledLayerCount = std::uint32_t(layers.size()),
                                                 .ppEnabledLayerNames = layers.data(),
                                                 .enabledExtensionCount = std::uint32_t(extensions.size()),
                                                 .ppEnabledExtensionNames = extensions.data()});
    if (validate) {
      using S = vk::DebugUtilsMessageSeverityFlagBitsEXT;
      using T = vk::DebugUtilsMessageTypeFlagBitsEXT;
      messenger_ = vk::raii::DebugUtilsMessengerEXT(
          instance_, vk::DebugUtilsMessengerCreateInfoEXT{
                         .messageSeverity = S::eError | S::eWarning,
                         .messageType = T::eValidation | T::eGeneral | T::ePerformance,
                         .pfnUserCallback = &on_debug_message,
                         .pUserData = &on_validation_error_});
    }

    // Device choice: GDN_DEVICE-style selector (index or name substring), else the best type.
    auto pds = instance_.enumeratePhysicalDevices();
    if (pds.empty()) throw Error("no Vulkan device found (install a driver, e.g. mesa-vulkan-drivers)");
    std::vector<DeviceInfo> infos;
    for (std::uint32_t i = 0; i < pds.size(); ++i) infos.push_back(read_info(pds[i], i));
    std::optional<std::size_t> pick;
    if (!opts.select.empty()) {
      const bool numeric = std::all_of(opts.select.begin(), opts.select.end(), ::isdigit);
      for (std::size_t i = 0; i < infos.size() && !pick; ++i)
        if (numeric ? std::to_string(i) == opts.select : infos[i].name.find(opts.select) != std::string::npos)
          pick = i;
      if (!pick) {
        std::string names;
        for (const auto& d : infos) names += "\n  " + std::to_string(d.index) + ": " + d.name;
        throw Error("no Vulkan device matches '" + opts.select + "'; devices:" + names);
      }
    } else {
      for (std::size_t i = 0; i < infos.size(); ++i) {
        if (!compute_family(pds[i])) continue;
        if (!pick || type_rank(pds[i].getProperties().deviceType) < type_rank(pds[*pick].getProperties().deviceType))
          pick = i;
      }
      if (!pick) throw Error("no Vulkan device has a compute queue");
    }
    physical_ = std::move(pds[*pick]);
    info_ = infos[*pick];
    if (physical_.getProperties().apiVersion < VK_API_VERSION_1_2)
      throw Error("device '" + info_.name + "' speaks Vulkan " + info_.api_version + "; gdn needs 1.2 or newer");
    auto fam = compute_family(physical_);
    if (!fam) throw Error("device '" + info_.name + "' has no compute queue");
    queue_family_ = *fam;
    memory_props_ = physical_.getMemoryProperties();

    // Features: subgroup size control where the device has it (the column-split kernels pin their
    // subgroup size with it); the NV cooperative matrix and fp16 arithmetic where the device has
    // them (the matrix units' kernels); nothing else beyond core 1.2.
    const float priority = 1.0f;
    vk::DeviceQueueCreateInfo qci{.queueFamilyIndex = queue_family_, .queueCount = 1, .pQueuePriorities = &priority};
    vk::PhysicalDeviceVulkan13Features f13{.subgroupSizeControl = info_.subgroup_size_control,
                                           .computeFullSubgroups = info_.subgroup_size_control};
    vk::PhysicalDeviceFeatures2 f2{};
    if (physical_.getProperties().apiVersion >= VK_API_VERSION_1_3) f2.pNext = &f13;
    std::vector<const char*> device_extensions;
    vk::PhysicalDeviceVulkan12Features f12{.shaderFloat16 = VK_TRUE};
    vk::PhysicalDeviceCooperativeMatrixFeaturesNV matrix_feature{.cooperativeMatrix = VK_TRUE};
    if (info_.matrix_f16_16x16x16) {
      device_extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
      matrix_feature.pNext = &f12;
      f12.pNext = f2.pNext;
      f2.pNext = &matrix_feature;
    }
    // GDN_PIPELINE_STATS=1: the driver's statistics of every pipeline (registers, spills) on stderr.
    vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR exec_feature{.pipelineExecutableInfo = VK_TRUE};
    if (const char* e = std::getenv("GDN_PIPELINE_STATS"); e && *e && std::strcmp(e, "0") != 0) {
      pipeline_stats_ = has_extension(physical_, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
      if (pipeline_stats_) {
        device_extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
        exec_feature.pNext = f2.pNext;
        f2.pNext = &exec_feature;
      } else {
        std::fprintf(stderr, "gdn: GDN_PIPELINE_STATS: the device lacks %s\n",
                     VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
      }
    }
    device_ = vk::raii::Device(physical_, vk::DeviceCreateInfo{.pNext = &f2, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
                                                               .enabledExtensionCount = std::uint32_t(device_extensions.size()),
                                                               .ppEnabledExtensionNames = device_extensions.data()});
    queue_ = device_.getQueue(queue_family_, 0);
    make_device_objects();
  } catch (const vk::SystemError& e) {
    throw Error(std::string("Vulkan initialisation failed: ") + e.what());
  }
}

void Device::adopt(const DeviceOptions::External& x) {
  if (!x.instance || !x.physical || !x.device)
    throw std::invalid_argument("ExternalDevice: instance, physical_device and device must all be given");
  try {
    instance_ = vk::raii::Instance(context_, x.instance);
    instance_release_.f = [this] { instance_.release(); };
    physical_ = vk::raii::PhysicalDevice(instance_, x.physical);
    info_ = read_info(physical_, 0);
    if (physical_.getProperties().apiVersion < VK_API_VERSION_1_2)
      throw Error("device '" + info_.name + "' speaks Vulkan " + info_.api_version + "; gdn needs 1.2 or newer");
    const auto families = physical_.getQueueFamilyProperties();
    if (x.queue_family >= families.size() || !(families[x.queue_family].queueFlags & vk::QueueFlagBits::eCompute) ||
        x.queue_index >= families[x.queue_family].queueCount)
      throw std::invalid_argument("ExternalDevice: queue " + std::to_string(x.queue_index) + " of family " +
                                  std::to_string(x.queue_family) + " is not a compute queue of device '" + info_.name + "'");
    // What the caller enabled decides what runs: a feature it left off is as if the device lacked it.
    if (info_.subgroup_size_control && !x.subgroup_size_control) info_.not_enabled.push_back("subgroupSizeControl");
    if (info_.matrix_f16_16x16x16 && !x.cooperative_matrix) info_.not_enabled.push_back("cooperativeMatrix");
    info_.subgroup_size_control = info_.subgroup_size_control && x.subgroup_size_control;
    info_.matrix_f16_16x16x16 = info_.matrix_f16_16x16x16 && x.cooperative_matrix;
    queue_family_ = x.queue_family;
    memory_props_ = physical_.getMemoryProperties();
    device_ = vk::raii::Device(physical_, x.device);
    device_release_.f = [this] { device_.release(); };
    queue_ = device_.getQueue(queue_family_, x.queue_index);
    make_device_objects();
  } catch (const vk::SystemError& e) {
    throw Error(std::string("Vulkan initialisation on the adopted device failed: ") + e.what());
  }
}

vk::raii::DescriptorPool Device::make_descriptor_pool() const {
  vk::DescriptorPoolSize ps{.type = vk::DescriptorType::eStorageBuffer, .descriptorCount = kMaxSetsPerRun * kMaxBindingsPerSet};
  return vk::raii::DescriptorPool(device_, {.flags = vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet,
                                            .maxSets = kMaxSetsPerRun, .poolSizeCount = 1, .pPoolSizes = &ps});
}

void Device::make_device_objects() {
  {
    command_pool_ = vk::raii::CommandPool(
        device_, {.flags = vk::CommandPoolCreateFlagBits::eResetCommandBuffer, .queueFamilyIndex = queue_family_});
    cmd_ = std::move(vk::raii::CommandBuffers(device_, {.commandPool = *command_pool_,
                                                        .level = vk::CommandBufferLevel::ePrimary,
                                                        .commandBufferCount = 1})
                         .front());
    fence_ = vk::raii::Fence(device_, vk::FenceCreateInfo{});
    descriptor_pools_.push_back(make_descriptor_pool());
    cache_path_ = cache_path(physical_.getProperties());
    const auto initial = read_cache(cache_path_, physical_.getProperties());
    pipeline_cache_ = vk::raii::PipelineCache(
        device_, vk::PipelineCacheCreateInfo{.initialDataSize = initial.size(), .pInitialData = initial.data()});
    if (info_.timestamp_period_ns > 0)
      query_pool_ = vk::raii::QueryPool(device_, {.queryType = vk::QueryType::eTimestamp, .queryCount = kMaxTimestamps});
  }
}

Device::~Device() {
  try {
    if (*device_) device_.waitIdle();  // nothing may be in flight when the handles go
  } catch (...) {
    // a lost device cannot be waited for; the handles are destroyed all the same
  }
  try {
    if (pipelines_built_ > 0 && *pipeline_cache_) write_cache(cache_path_, pipeline_cache_data());
  } catch (...) {
    // the cache only saves build time
  }
}

// ---- buffers ---------------------------------------------------------------------------------------

std::uint32_t Device::memory_type(std::uint32_t type_bits, vk::MemoryPropertyFlags want) const {
  for (std::uint32_t i = 0; i < memory_props_.memoryTypeCount; ++i)
    if ((type_bits & (1u << i)) && (memory_props_.memoryTypes[i].propertyFlags & want) == want) return i;
  return UINT32_MAX;
}

std::unique_ptr<Buffer> Device::create_buffer(std::string name, std::size_t bytes, bool bound_whole) {
  const std::lock_guard lock(mutex_);
  bytes = std::max<std::size_t>(bytes, 4);
  if (bound_whole && bytes > info_.max_storage_buffer_range)
    throw Error("buffer '" + name + "' needs " + bytes_str(bytes) + " (" + std::to_string(bytes) +
                " bytes), over this device's maxStorageBufferRange of " + bytes_str(info_.max_storage_buffer_range) +
                "; use fewer windows (B) or tokens (T) per call");
  auto b = std::make_unique<Buffer>();
  b->name = std::move(name);
  b->bytes = bytes;
  try {
    b->buffer = vk::raii::Buffer(device_, {.size = bytes,
                                           .usage = vk::BufferUsageFlagBits::eStorageBuffer |
                                                    vk::BufferUsageFlagBits::eTransferSrc |
                                                    vk::BufferUsageFlagBits::eTransferDst});
    const auto req = b->buffer.getMemoryRequirements();
    std::uint32_t type = memory_type(req.memoryTypeBits, vk::MemoryPropertyFlagBits::eDeviceLocal);
    if (type == UINT32_MAX) type = memory_type(req.memoryTypeBits, {});
    const auto heap = memory_props_.memoryTypes[type].heapIndex;
    const auto heap_size = memory_props_.memoryHeaps[heap].size;
    if (req.size + *allocated_ > heap_size)
      throw Error("buffer '" + b->name + "' needs " + bytes_str(req.size) + " but memory heap " +
                  std::to_string(heap) + " holds " + bytes_str(heap_size) + " and gdn already uses " +
                  bytes_str(*allocated_) + "; use fewer windows (B) or tokens (T), or a larger checkpoint interval");
    b->memory = vk::raii::DeviceMemory(device_, {.allocationSize = req.size, .memoryTypeIndex = type});
    b->buffer.bindMemory(*b->memory, 0);
    *allocated_ += req.size;
    b->held = allocated_;
    b->held_bytes = req.size;
  } catch (const vk::SystemError& e) {
    throw Error("cannot allocate buffer '" + b->name + "' (" + bytes_str(bytes) + "): " + e.what() +
                " (gdn holds " + bytes_str(*allocated_) + " on this device)");
  }
  return b;
}

std::unique_ptr<Buffer> Device::borrow_buffer(std::string name, VkBuffer buffer, std::size_t offset, std::size_t bytes,
                                              bool bound_whole) {
  if (buffer == VK_NULL_HANDLE) throw std::invalid_argument("tensor '" + name + "': a null VkBuffer");
  if (offset % 4 != 0)
    throw std::invalid_argument("tensor '" + name + "': offset " + std::to_string(offset) + " is not a multiple of 4");
  if (offset % info_.min_storage_buffer_offset_alignment != 0)
    throw std::invalid_argument("tensor '" + name + "': offset " + std::to_string(offset) +
                                " is not a multiple of the device's minStorageBufferOffsetAlignment (" +
                                std::to_string(info_.min_storage_buffer_offset_alignment) + ")");
  if (bound_whole && bytes > info_.max_storage_buffer_range)
    throw Error("tensor '" + name + "' spans " + bytes_str(bytes) + ", over this device's maxStorageBufferRange of " +
                bytes_str(info_.max_storage_buffer_range));
  auto b = std::make_unique<Buffer>();
  b->name = std::move(name);
  b->bytes = bytes;
  b->offset = offset;
  b->borrowed = true;
  b->buffer = vk::raii::Buffer(device_, buffer);
  return b;
}


Device::Staging& Device::staging(std::size_t bytes) {
  bytes = std::min(bytes, kStagingChunk);
  if (staging_ && staging_->bytes >= bytes) return *staging_;
  staging_.reset();  // the old one goes before a larger one is allocated
  staging_ = make_staging(bytes);
  return *staging_;
}

std::unique_ptr<Device::Staging> Device::make_staging(std::size_t bytes) {
  auto st = std::make_unique<Staging>();
  st->buffer = vk::raii::Buffer(device_, {.size = bytes,
                                          .usage = vk::BufferUsageFlagBits::eTransferSrc |
                                                   vk::BufferUsageFlagBits::eTransferDst});
  const auto req = st->buffer.getMemoryRequirements();
  const std::uint32_t type = memory_type(req.memoryTypeBits, vk::MemoryPropertyFlagBits::eHostVisible |
                                                                 vk::MemoryPropertyFlagBits::eHostCoherent);
  if (type == UINT32_MAX) throw Error("device '" + info_.name + "' has no host-visible memory for transfers");
  st->memory = vk::raii::DeviceMemory(device_, {.allocationSize = req.size, .memoryTypeIndex = type});
  st->buffer.bindMemory(*st->memory, 0);
  st->map = st->memory.mapMemory(0, bytes);
  st->bytes = bytes;
  return st;
}

void Device::copy(const vk::Buffer& src, const vk::Buffer& dst, std::size_t src_off, std::size_t dst_off,
                  std::size_t bytes) {
  cmd_.reset();
  cmd_.begin({.flags = vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  cmd_.copyBuffer(src, dst, vk::BufferCopy{.srcOffset = src_off, .dstOffset = dst_off, .size = bytes});
  cmd_.end();
  vk::CommandBuffer raw = *cmd_;
  queue_.submit(vk::SubmitInfo{.commandBufferCount = 1, .pCommandBuffers = &raw}, *fence_);
  if (device_.waitForFences(*fence_, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess) throw Error("transfer did not finish");
  device_.resetFences(*fence_);
}

void Device::upload(const Buffer& dst, std::span<const std::byte> src, std::size_t offset) {
  const std::lock_guard lock(mutex_);
  if (offset + src.size() > dst.bytes)
    throw std::out_of_range("upload of " + std::to_string(src.size()) + " bytes at " + std::to_string(offset) +
                            " overruns buffer '" + dst.name + "' of " + std::to_string(dst.bytes));
  try {
    // Through a host-visible staging buffer, at most kStagingChunk at a time.
    for (std::size_t at = 0; at < src.size();) {
      auto& st = staging(src.size() - at);
      const std::size_t n = std::min(st.bytes, src.size() - at);
      std::memcpy(st.map, src.data() + at, n);
      copy(*st.buffer, *dst.buffer, 0, dst.offset + offset + at, n);
      at += n;
    }
  } catch (const vk::SystemError& e) {
    throw Error("upload to '" + dst.name + "' failed: " + e.what());
  }
}

void Device::download(const Buffer& src, std::span<std::byte> dst, std::size_t offset) {
  const std::lock_guard lock(mutex_);
  if (offset + dst.size() > src.bytes)
    throw std::out_of_range("download of " + std::to_string(dst.size()) + " bytes at " + std::to_string(offset) +
                            " overruns buffer '" + src.name + "' of " + std::to_string(src.bytes));
  try {
    for (std::size_t at = 0; at < dst.size();) {
      auto& st = staging(dst.size() - at);
      const std::size_t n = std::min(st.bytes, dst.size() - at);
      copy(*src.buffer, *st.buffer, src.offset + offset + at, 0, n);
      std::memcpy(dst.data() + at, st.map, n);
      at += n;
    }
  } catch (const vk::SystemError& e) {
    throw Error("download from '" + src.name + "' failed: " + e.what());
  }
}

}  // namespace gdn::gpu
