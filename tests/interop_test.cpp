// SPDX-License-Identifier: MIT
// A caller's own Vulkan device and buffers (Context::adopt, Tensor::wrap): the program below makes
// its instance, device and one buffer with the Vulkan C API, as an engine of its own would, hands
// them to gdn, runs the layer on views of its buffer, and gets bitwise what gdn's own device and
// buffers give; then it destroys its handles itself (gdn must have left them alive).
#include <gtest/gtest.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_copy.hpp"  // the test's own compute shader (tests/shaders/copy.comp)
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

// Inputs and an output of B windows of T tokens (zeros).
DeviceInputs in_of(const std::shared_ptr<Context>& ctx, const Config& cfg, std::int64_t B, std::int64_t T) {
  auto zeros = [&](std::vector<std::int64_t> shape, const char* name) {
    Tensor t(ctx, std::move(shape), name);
    t.fill(0.0f);
    return t;
  };
  return {zeros({B, T, cfg.channels()}, "qkv"), zeros({B, T, cfg.value_dim()}, "z"), zeros({B, T, cfg.nv}, "a"),
          zeros({B, T, cfg.nv}, "b")};
}
Tensor out_of(const std::shared_ptr<Context>& ctx, const Config& cfg, std::int64_t B, std::int64_t T) {
  return Tensor(ctx, {B, T, cfg.value_dim()}, "out");
}

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
      EXPECT_TRUE(ctx->device().not_enabled.empty());  // it enabled all that gdn listed
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

// The caller's own compute pipeline: tests/shaders/copy.comp over its whole buffer (binding 0).
struct CallerCopy {
  VkDevice device;
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  VkDescriptorSet set = VK_NULL_HANDLE;
  struct Push {
    std::uint32_t src, dst, n;
  };

  CallerCopy(VkDevice d, VkBuffer buffer) : device(d) {
    VkShaderModuleCreateInfo smci{};
    smci.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    smci.codeSize = spirv::test_copy.size() * 4;
    smci.pCode = spirv::test_copy.data();
    check(vkCreateShaderModule(device, &smci, nullptr, &module), "vkCreateShaderModule");
    VkDescriptorSetLayoutBinding binding{};
    binding.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    binding.descriptorCount = 1;
    binding.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    VkDescriptorSetLayoutCreateInfo dslci{};
    dslci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    dslci.bindingCount = 1;
    dslci.pBindings = &binding;
    check(vkCreateDescriptorSetLayout(device, &dslci, nullptr, &set_layout), "vkCreateDescriptorSetLayout");
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push)};
    VkPipelineLayoutCreateInfo plci{};
    plci.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    plci.setLayoutCount = 1;
    plci.pSetLayouts = &set_layout;
    plci.pushConstantRangeCount = 1;
    plci.pPushConstantRanges = &range;
    check(vkCreatePipelineLayout(device, &plci, nullptr, &layout), "vkCreatePipelineLayout");
    VkComputePipelineCreateInfo cpci{};
    cpci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    cpci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpci.stage.module = module;
    cpci.stage.pName = "main";
    cpci.layout = layout;
    check(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &cpci, nullptr, &pipeline), "vkCreateComputePipelines");
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    VkDescriptorPoolCreateInfo dpci{};
    dpci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dpci.maxSets = 1;
    dpci.poolSizeCount = 1;
    dpci.pPoolSizes = &size;
    check(vkCreateDescriptorPool(device, &dpci, nullptr, &pool), "vkCreateDescriptorPool");
    VkDescriptorSetAllocateInfo dsai{};
    dsai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    dsai.descriptorPool = pool;
    dsai.descriptorSetCount = 1;
    dsai.pSetLayouts = &set_layout;
    check(vkAllocateDescriptorSets(device, &dsai, &set), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo info{buffer, 0, VK_WHOLE_SIZE};
    VkWriteDescriptorSet w{};
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = set;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &info;
    vkUpdateDescriptorSets(device, 1, &w, 0, nullptr);
  }
  // Records floats [src, src + n) copied to [dst, dst + n), after a barrier ordering it behind the
  // command buffer's earlier compute and transfer writes.
  void record(VkCommandBuffer cmd, std::size_t src_byte, std::size_t dst_byte, std::size_t bytes) const {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, nullptr);
    const Push p{std::uint32_t(src_byte / 4), std::uint32_t(dst_byte / 4), std::uint32_t(bytes / 4)};
    vkCmdPushConstants(cmd, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(p), &p);
    vkCmdDispatch(cmd, (p.n + 63) / 64, 1, 1);
  }
  ~CallerCopy() {
    vkDestroyDescriptorPool(device, pool, nullptr);
    vkDestroyPipeline(device, pipeline, nullptr);
    vkDestroyPipelineLayout(device, layout, nullptr);
    vkDestroyDescriptorSetLayout(device, set_layout, nullptr);
    vkDestroyShaderModule(device, module, nullptr);
  }
};

// The layer recorded into the caller's command buffer between two compute dispatches of the caller's
// own (a copy of qkv into place before, a copy of out elsewhere after), submitted once by the
// caller: the blocking API's results, bitwise.
TEST_F(DeviceTest, RecordsIntoTheCallersCommandBuffer) {
  const Config cfg{.nv = 4, .nk = 2, .conv_taps = 4};
  const int B = 2, T = 19;
  const Params p = random_params(cfg, 61);
  const Batch x = random_batch(cfg, B, T, 62);
  const std::int64_t C = cfg.channels(), V = cfg.value_dim();
  Layer own(context(), cfg, p);
  Tape own_tape;
  const auto want_out = own.forward(B, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &own_tape);
  const HostGrads want = own.backward(own_tape, x.dout);

  const std::size_t qkv_bytes = std::size_t(B) * T * C * 4, out_bytes = std::size_t(B) * T * V * 4;
  const std::size_t at_staged = 0, at_qkv = (qkv_bytes + 255) / 256 * 256, at_out = 2 * at_qkv,
                    at_copy = at_out + (out_bytes + 255) / 256 * 256;
  CallerVulkan vk(at_copy + out_bytes);
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  {
    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.queueFamilyIndex = vk.family;
    check(vkCreateCommandPool(vk.device, &pci, nullptr, &pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(vk.device, &cai, &cmd), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check(vkCreateFence(vk.device, &fci, nullptr, &fence), "vkCreateFence");
  }
  {
    auto ctx = Context::adopt({.instance = vk.instance, .physical_device = vk.physical, .device = vk.device,
                               .queue_family = vk.family, .queue_index = 0,
                               .subgroup_size_control = vk.size_control, .cooperative_matrix = vk.matrix});
    const auto buf = reinterpret_cast<std::uint64_t>(vk.buffer);
    Tensor staged = Tensor::wrap(ctx, buf, at_staged, {B, T, C}, "staged qkv");
    Tensor qkv = Tensor::wrap(ctx, buf, at_qkv, {B, T, C}, "qkv");
    Tensor out = Tensor::wrap(ctx, buf, at_out, {B, T, V}, "out");
    Tensor copied = Tensor::wrap(ctx, buf, at_copy, {B, T, V}, "out, copied");
    staged.upload(x.qkv);
    qkv.fill(0.0f);  // the forward must read the caller's copy, not this
    auto tensor = [&](std::vector<std::int64_t> shape, const std::vector<float>& v, const char* name) {
      Tensor t(ctx, std::move(shape), name);
      t.upload(v);
      return t;
    };
    const DeviceInputs in{qkv, tensor({B, T, V}, x.z, "z"), tensor({B, T, cfg.nv}, x.a, "a"),
                          tensor({B, T, cfg.nv}, x.b, "b")};
    const Tensor dout = tensor({B, T, V}, x.dout, "dout");
    Layer layer(ctx, cfg, p);
    Tape tape;
    DeviceGrads g;

    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    check(vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    const CallerCopy copy(vk.device, vk.buffer);
    copy.record(cmd, at_staged, at_qkv, qkv_bytes);  // the caller's work before
    Recorded f = layer.record_forward(cmd, in, out, &tape);
    Recorded b = layer.record_backward(cmd, tape, dout, g);
    copy.record(cmd, at_out, at_copy, out_bytes);  // and after
    check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    // nothing ran yet: the outputs gdn allocated hold no results
    EXPECT_NE(out.download(), want_out);
    // a call that would free buffers the recorded work uses (the layer's workspaces for another
    // shape: the backward's; on the matrix units already the forward's scratch) is refused while
    // that work is outstanding
    Tensor small_out = out_of(ctx, cfg, 1, 3);
    Tape small_tape;
    DeviceGrads small_g;
    EXPECT_THROW(
        {
          layer.forward(in_of(ctx, cfg, 1, 3), small_out, &small_tape);
          layer.backward(small_tape, small_out, small_g);
        },
        Error);

    VkQueue queue;
    vkGetDeviceQueue(vk.device, vk.family, 0, &queue);
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    check(vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
    check(vkWaitForFences(vk.device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    f = Recorded();  // the work is done: what it held may go
    b = Recorded();
    EXPECT_EQ(out.download(), want_out);
    EXPECT_EQ(copied.download(), want_out);
    EXPECT_EQ(g.dqkv.download(), want.dqkv);
    EXPECT_EQ(g.da.download(), want.da);
    EXPECT_EQ(g.dconv.download(), want.dconv);
  }
  vkDestroyFence(vk.device, fence, nullptr);
  vkDestroyCommandPool(vk.device, pool, nullptr);
}

// Submitted without waiting: the host goes on, wait() makes the outputs readable, and the results
// are the blocking calls', bitwise; a blocking call queued behind reads what the pending one wrote.
TEST_F(DeviceTest, SubmitsWithoutWaiting) {
  auto ctx = context();
  const Config cfg{.nv = 4, .nk = 2, .conv_taps = 4};
  const int B = 2, T = 21;
  const Params p = random_params(cfg, 71);
  const Batch x = random_batch(cfg, B, T, 72);
  Layer layer(ctx, cfg, p);
  Tape own_tape;
  const auto want_out = layer.forward(B, T, {.qkv = x.qkv, .z = x.z, .a = x.a, .b = x.b}, &own_tape);
  const HostGrads want = layer.backward(own_tape, x.dout);

  auto tensor = [&](std::vector<std::int64_t> shape, const std::vector<float>& v, const char* name) {
    Tensor t(ctx, std::move(shape), name);
    t.upload(v);
    return t;
  };
  const DeviceInputs in{tensor({B, T, cfg.channels()}, x.qkv, "qkv"), tensor({B, T, cfg.value_dim()}, x.z, "z"),
                        tensor({B, T, cfg.nv}, x.a, "a"), tensor({B, T, cfg.nv}, x.b, "b")};
  const Tensor dout = tensor({B, T, cfg.value_dim()}, x.dout, "dout");
  Tensor out;
  Tape tape;
  DeviceGrads g;
  Pending f = layer.submit_forward(in, out, &tape);
  Pending b = layer.submit_backward(tape, dout, g);
  b.wait();
  EXPECT_TRUE(b.done());
  EXPECT_TRUE(f.done());  // the queue ran it first
  EXPECT_EQ(out.download(), want_out);
  EXPECT_EQ(g.dqkv.download(), want.dqkv);
  EXPECT_EQ(g.dnorm.download(), want.dnorm);

  // a blocking backward right behind a submitted forward reads the forward's tape
  Tape tape2;
  Tensor out2;
  Pending f2 = layer.submit_forward(in, out2, &tape2);
  DeviceGrads g2;
  layer.backward(tape2, dout, g2);
  EXPECT_EQ(g2.dqkv.download(), want.dqkv);
}

// A feature the device has but the caller did not enable is off, and said to be: a family needing
// it names it.
TEST_F(DeviceTest, AdoptedDeviceWithoutAFeatureSaysWhich) {
  CallerVulkan vk(256);
  if (!vk.size_control && !vk.matrix) GTEST_SKIP() << "the device lists no optional feature";
  {
    auto ctx = Context::adopt({.instance = vk.instance, .physical_device = vk.physical, .device = vk.device,
                               .queue_family = vk.family, .queue_index = 0});
    const auto& off = ctx->device().not_enabled;
    if (vk.size_control) EXPECT_NE(std::find(off.begin(), off.end(), "subgroupSizeControl"), off.end());
    if (vk.matrix) {
      EXPECT_NE(std::find(off.begin(), off.end(), "cooperativeMatrix"), off.end());
      const Config cfg{.nv = 2, .nk = 1, .conv_taps = 4, .variant = Variant::Chunked};
      bool said = false;
      for (const auto& f : family_support(*ctx, cfg))
        said |= f.matrix_units_why_not.find("cooperativeMatrix") != std::string::npos;
      EXPECT_TRUE(said);
    }
  }
}

TEST_F(DeviceTest, AdoptRefusesMissingHandles) {
  EXPECT_THROW(Context::adopt({}), std::invalid_argument);
}

}  // namespace
}  // namespace gdn::test
