// SPDX-License-Identifier: MIT
// A caller's own Vulkan device and buffers (Context::adopt, Tensor::wrap): the program below makes
// its instance, device and one buffer with the Vulkan C API, as an engine of its own would, hands
// them to gdn, runs the layer on views of its buffer, and gets bitwise what gdn's own device and
// buffers give; then it destroys its handles itself (gdn must have left them alive).
#include <gtest/gtest.h>
#include <vulkan/vulkan.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace gdn::test {
namespace {

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + std::to_string(int(r)));
}

// The caller's side: an instance, a device with what gdn asks for, and one device-local buffer.
struct CallerVulkan {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  std::uint32_t family = 0;
  bool size_control = false, matrix = false;

  explicit CallerVulkan(std::size_t bytes) {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.apiVersion = VK_API_VERSION_1_3;
    VkInstanceCreateInfo ici{};
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    check(vkCreateInstance(&ici, nullptr, &instance), "vkCreateInstance");
    // the device gdn would pick: GDN_DEVICE's name, else a discrete GPU, else the first
    std::uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    vkEnumeratePhysicalDevices(instance, &n, pds.data());
    const std::string want = context()->device().name;
    for (auto pd : pds) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(pd, &p);
      if (want == p.deviceName) physical = pd;
    }
    if (!physical) throw std::runtime_error("the test's device is not among the instance's");
    std::uint32_t nf = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &nf, nullptr);
    std::vector<VkQueueFamilyProperties> fams(nf);
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &nf, fams.data());
    while (family < nf && !(fams[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;

    // what gdn asks for, enabled where listed
    const DeviceRequirements req = Context::requirements(physical);
    auto listed = [&](const char* f) {
      for (const auto& x : req.features)
        if (x.find(f) != std::string::npos) return true;
      return false;
    };
    size_control = listed("subgroupSizeControl");
    matrix = listed("cooperativeMatrix");
    VkPhysicalDeviceVulkan13Features f13{};
    f13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
    f13.subgroupSizeControl = size_control;
    f13.computeFullSubgroups = size_control;
    VkPhysicalDeviceVulkan12Features f12{};
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    f12.shaderFloat16 = matrix;
    f12.pNext = &f13;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV fm{};
    fm.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    fm.cooperativeMatrix = matrix;
    fm.pNext = &f12;
    std::vector<const char*> exts;
    for (const auto& e : req.extensions) exts.push_back(e.c_str());
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo q{};
    q.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    q.queueFamilyIndex = family;
    q.queueCount = 1;
    q.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.pNext = matrix ? static_cast<void*>(&fm) : static_cast<void*>(&f12);
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &q;
    dci.enabledExtensionCount = std::uint32_t(exts.size());
    dci.ppEnabledExtensionNames = exts.data();
    check(vkCreateDevice(physical, &dci, nullptr, &device), "vkCreateDevice");

    VkBufferCreateInfo bci{};
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = bytes;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    check(vkCreateBuffer(device, &bci, nullptr, &buffer), "vkCreateBuffer");
    VkMemoryRequirements mr;
    vkGetBufferMemoryRequirements(device, buffer, &mr);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(physical, &mp);
    std::uint32_t type = 0;
    while (type < mp.memoryTypeCount && !((mr.memoryTypeBits >> type) & 1u &&
                                          mp.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT))
      ++type;
    VkMemoryAllocateInfo mai{};
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = mr.size;
    mai.memoryTypeIndex = type;
    check(vkAllocateMemory(device, &mai, nullptr, &memory), "vkAllocateMemory");
    check(vkBindBufferMemory(device, buffer, memory, 0), "vkBindBufferMemory");
  }
  ~CallerVulkan() {  // the caller's own handles, destroyed by the caller
    vkDestroyBuffer(device, buffer, nullptr);
    vkFreeMemory(device, memory, nullptr);
    vkDestroyDevice(device, nullptr);
    vkDestroyInstance(instance, nullptr);
  }
};

TEST_F(DeviceTest, RunsOnTheCallersDeviceAndBuffers) {
  const Config cfg{.nv = 4, .nk = 2, .conv_taps = 4};
  const int B = 2, T = 19;
  const Params p = random_params(cfg, 51);
  const Batch x = random_batch(cfg, B, T, 52);
  const std::int64_t C = cfg.channels(), V = cfg.value_dim(), nv = cfg.nv;

  // gdn's own device and buffers: the results to match
  Layer own(context(), cfg, p);
  Tape own_tape;
  const auto want_out = own.forward(B, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &own_tape);
  const HostGrads want = own.backward(own_tape, x.dout);

  // the caller's: one buffer holding every tensor at aligned offsets
  const std::vector<std::pair<const char*, std::vector<std::int64_t>>> parts = {
      {"qkv", {B, T, C}}, {"z", {B, T, V}},     {"a", {B, T, nv}},  {"b", {B, T, nv}},   {"out", {B, T, V}},
      {"dout", {B, T, V}}, {"dqkv", {B, T, C}}, {"dz", {B, T, V}}, {"da", {B, T, nv}}, {"db", {B, T, nv}}};
  const std::size_t align = 256;
  std::vector<std::size_t> offsets;
  std::size_t end = 0;
  for (const auto& [name, shape] : parts) {
    std::size_t n = 4;
    for (auto d : shape) n *= std::size_t(d);
    offsets.push_back(end);
    end += (n + align - 1) / align * align;
  }
  {
    CallerVulkan vk(end);
    std::vector<Tensor> t;
    {
      auto ctx = Context::adopt({.instance = vk.instance, .physical_device = vk.physical, .device = vk.device,
                                 .queue_family = vk.family, .queue_index = 0,
                                 .subgroup_size_control = vk.size_control, .cooperative_matrix = vk.matrix});
      for (std::size_t i = 0; i < parts.size(); ++i)
        t.push_back(Tensor::wrap(ctx, reinterpret_cast<std::uint64_t>(vk.buffer), offsets[i], parts[i].second,
                                 parts[i].first));
      EXPECT_EQ(t[3].vk_offset(), offsets[3]);
      EXPECT_EQ(t[3].vk_buffer(), reinterpret_cast<std::uint64_t>(vk.buffer));
      EXPECT_EQ(ctx->allocated_bytes(), 0u);  // nothing of the caller's is counted as gdn's
      t[0].upload(x.qkv);
      t[1].upload(x.z);
      t[2].upload(x.a);
      t[3].upload(x.b);
      t[5].upload(x.dout);
      Layer layer(ctx, cfg, p);
      Tape tape;
      layer.forward({t[0], t[1], t[2], t[3]}, t[4], &tape);
      DeviceGrads g{t[6], t[7], t[8], t[9]};
      layer.backward(tape, t[5], g);
      EXPECT_EQ(t[4].download(), want_out);
      EXPECT_EQ(t[6].download(), want.dqkv);
      EXPECT_EQ(t[7].download(), want.dz);
      EXPECT_EQ(t[8].download(), want.da);
      EXPECT_EQ(t[9].download(), want.db);
      EXPECT_EQ(g.dconv.download(), want.dconv);
      EXPECT_THROW(Tensor::wrap(ctx, reinterpret_cast<std::uint64_t>(vk.buffer), 2, {4}, "misaligned"),
                   std::invalid_argument);
    }
    t.clear();  // every gdn object is gone before the caller destroys its handles (~CallerVulkan)
  }
}

TEST_F(DeviceTest, AdoptRefusesMissingHandles) {
  EXPECT_THROW(Context::adopt({}), std::invalid_argument);
}

}  // namespace
}  // namespace gdn::test
