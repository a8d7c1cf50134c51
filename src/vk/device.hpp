// SPDX-License-Identifier: MIT
// A small Vulkan compute wrapper (vulkan-hpp RAII handles). It knows nothing of GatedDeltaNet:
// it picks a device, owns device-local buffers with staged transfers, builds compute pipelines
// (specialization constants, subgroup size control, one pipeline cache), and records dispatches
// with barriers and timestamp queries. Internal to the library: users never include vulkan.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <atomic>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <vulkan/vulkan_raii.hpp>

#include "gdn/device_info.hpp"

namespace gdn::gpu {

struct DeviceOptions {
  /// Index or name substring (GDN_DEVICE); empty: discrete GPU, then integrated, then CPU.
  std::string select;
  /// Enable VK_LAYER_KHRONOS_validation and route its errors to on_validation_error.
  bool validate = false;
  std::function<void(std::string_view)> on_validation_error;
  /// A device the caller made (select and validate are then ignored): used, never destroyed.
  struct External {
    VkInstance instance = VK_NULL_HANDLE;
    VkPhysicalDevice physical = VK_NULL_HANDLE;
    VkDevice device = VK_NULL_HANDLE;
    std::uint32_t queue_family = 0, queue_index = 0;
    bool subgroup_size_control = false;  // enabled at its creation: subgroupSizeControl, computeFullSubgroups
    bool cooperative_matrix = false;     // VK_NV_cooperative_matrix, cooperativeMatrix and shaderFloat16
  };
  std::optional<External> external = {};
};

/// A device-local storage buffer. Owned by the Device that made it; keep the Device alive. Or a
/// range of a caller's buffer (borrowed: never destroyed here).
struct Buffer {
  std::string name;
  std::size_t bytes = 0;
  std::size_t offset = 0;  // where its bytes start in `buffer` (a caller's buffer: its offset)
  bool borrowed = false;
  vk::raii::Buffer buffer = nullptr;
  vk::raii::DeviceMemory memory = nullptr;
  // The device's count of the bytes its buffers hold, which this one's memory is part of until it goes.
  std::shared_ptr<std::atomic<std::size_t>> held;
  std::size_t held_bytes = 0;

  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (held) *held -= held_bytes;
    if (borrowed) buffer.release();
  }
};

/// A view of a buffer bound to one storage binding.
struct BufferView {
  const Buffer* buffer = nullptr;
  std::size_t offset = 0;
  std::size_t bytes = 0;  // 0: to the end of the buffer
  bool stand_in = false;  // bound where the shader reads and writes nothing (an absent tensor's slot)
};

struct PipelineDesc {
  std::string name;
  std::span<const std::uint32_t> spirv;
  std::uint32_t push_constant_bytes = 0;  // the host's block: must be the shader's (bindings and shared
                                          // memory are read from the SPIR-V: spirv_reflect.hpp)
  std::vector<std::uint32_t> spec;        // specialization constants, constant_id = index
  std::uint32_t required_subgroup_size = 0;  // 0: the driver's choice
  bool full_subgroups = false;            // every subgroup of a workgroup full (needs local_size_x % size == 0)
};

/// A compute pipeline and what a dispatch must match.
struct Pipeline {
  std::string name;
  const std::uint32_t* spirv = nullptr;   // the module it was built from (a dispatch's bindings must be its)
  std::uint32_t bindings = 0;             // storage buffers at set 0, bindings 0 .. n-1 (the SPIR-V's)
  std::uint64_t used = 0;                 // bit i: the shader uses binding i (the optimizer drops the others)
  std::uint32_t push_constant_bytes = 0;
  std::uint64_t shared_bytes = 0;         // the SPIR-V's shared memory under the pipeline's constants
  vk::raii::DescriptorSetLayout set_layout = nullptr;
  vk::raii::PipelineLayout layout = nullptr;
  vk::raii::Pipeline pipeline = nullptr;
};

class Device;

/// Records one submission: dispatches with a barrier after each, and named timestamps.
class Recorder {
 public:
  /// Dispatches `groups` workgroups, folded into (x, y) under maxComputeWorkGroupCount[0]; the kernel
  /// reconstructs its linear id as gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x and
  /// returns for ids >= groups. `b` names a buffer per binding: gdn_bindgen's struct
  /// gdn::bindings::<shader> of the pipeline's shader (src/vk/bindgen.cpp). A binding the shader does
  /// not use may be left empty.
  template <class Bindings, class Push>
  void dispatch(const Pipeline& p, const Bindings& b, const Push& push, std::uint64_t groups) {
    const auto views = b.list();
    dispatch_views(p, Bindings::spirv().data(), Bindings::kFields, views, &push, sizeof(Push), groups);
  }
  /// Fills a buffer with a 32-bit pattern (e.g. NaN poison in tests, zero accumulators).
  void fill(const Buffer& b, std::uint32_t word);
  /// Fills bytes [offset, offset + bytes) of b (multiples of 4). `then_barrier` false: no barrier
  /// after it (several writes to disjoint ranges, then barrier()).
  void fill(const Buffer& b, std::uint32_t word, std::size_t offset, std::size_t bytes, bool then_barrier = true);
  /// Copies `bytes` from src at src_offset to dst at dst_offset (then_barrier as fill's).
  void copy(const Buffer& src, std::size_t src_offset, const Buffer& dst, std::size_t dst_offset, std::size_t bytes,
            bool then_barrier = true);
  /// Compute and transfer writes before it made visible to compute and transfer after it.
  void barrier();
  /// A timestamp after all work recorded so far; the interval to the previous mark gets `label`, and
  /// the bytes its dispatches bound (Interval::bytes). Inside lanes it is dropped (the lanes' work is
  /// one interval: mark after end_lanes()).
  void mark(std::string label);

  /// Lanes: `n` command sequences that touch disjoint memory, recorded one after another (lane(i)
  /// directs what follows to lane i) and emitted interleaved by end_lanes(): every lane's commands up
  /// to its first barrier, one barrier, every lane's up to its second, and so on, then a barrier. The
  /// GPU may run the lanes' dispatches side by side; within a lane the order and barriers hold.
  void begin_lanes(std::size_t n);
  void lane(std::size_t i);
  void end_lanes();

 private:
  void dispatch_views(const Pipeline& p, const std::uint32_t* spirv, std::span<const char* const> fields,
                      std::span<const BufferView> views, const void* push, std::size_t push_bytes,
                      std::uint64_t groups);
  friend class Device;
  Recorder(Device& d, vk::raii::CommandBuffer& cmd) : dev_(d), cmd_(cmd) {}
  void emit(std::function<void()> command);  // at once, or into the current lane's step
  Device& dev_;
  vk::raii::CommandBuffer& cmd_;
  std::vector<std::string> labels_;
  std::vector<double> label_bytes_;  // each interval's bytes (Interval::bytes)
  double bytes_ = 0;                 // bound since the last mark
  std::vector<vk::raii::DescriptorSet> sets_;  // live until the submission has finished
  using Step = std::vector<std::function<void()>>;  // a lane's commands between two barriers
  std::vector<std::vector<Step>> lanes_;            // empty: not inside lanes
  std::size_t lane_ = 0;
};

struct Interval {
  std::string label;
  double ms = 0;
  /// The bytes of the buffer ranges its dispatches bound, each range once per dispatch (stand-ins and
  /// bindings the shader does not use left out), and its fills and copies wrote and read: what its
  /// work touches, so a floor on what it moves where each byte is touched.
  double bytes = 0;
};

/// A Vulkan device and its queue. Safe to share between threads: calls take turns.
class Device {
 public:
  explicit Device(const DeviceOptions& opts);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// Every physical device the loader sees, in enumeration order.
  static std::vector<DeviceInfo> enumerate();

  const DeviceInfo& info() const { return info_; }

  /// A device-local storage buffer; refuses sizes over the heap, and where it is `bound_whole` (bound
  /// to one storage binding as a whole) over maxStorageBufferRange, with a gdn::Error naming the
  /// buffer, its size and the limit.
  std::unique_ptr<Buffer> create_buffer(std::string name, std::size_t bytes, bool bound_whole = true);
  /// Bytes [offset, offset + bytes) of a caller's VkBuffer (created on this device with storage and
  /// transfer usage), borrowed: used, never destroyed.
  std::unique_ptr<Buffer> borrow_buffer(std::string name, VkBuffer buffer, std::size_t offset, std::size_t bytes,
                                        bool bound_whole = true);
  void upload(const Buffer& dst, std::span<const std::byte> src, std::size_t offset = 0);
  void download(const Buffer& src, std::span<std::byte> dst, std::size_t offset = 0);

  std::unique_ptr<Pipeline> create_pipeline(const PipelineDesc& desc);
  /// The pipeline of `desc`, built on first use and kept for the device's life: one per shader and
  /// specialization, shared by every caller (a pipeline holds no per-dispatch state).
  std::shared_ptr<Pipeline> pipeline(const PipelineDesc& desc);
  /// Pipelines built on this device so far.
  std::size_t pipelines_built() const { return pipelines_built_; }

  /// Records with `body`, submits, waits. With `timed`, returns the intervals between marks measured
  /// with GPU timestamp queries (the first interval starts at the beginning of the submission).
  std::vector<Interval> run(const std::function<void(Recorder&)>& body, bool timed = false);
  /// A host transfer: `up` into `buffer` from its start, or its start into `down`.
  struct Transfer {
    const Buffer* buffer = nullptr;
    std::span<const std::byte> up;
    std::span<std::byte> down;
  };
  /// run() with host uploads before the work and downloads after it in the same submission (through
  /// one staging buffer, up to kBatchedStaging in all; beyond, each staged on its own).
  std::vector<Interval> run(const std::function<void(Recorder&)>& body, bool timed, std::span<const Transfer> uploads,
                            std::span<const Transfer> downloads);
  /// Records with `body` into a caller's command buffer (in the recording state), between barriers
  /// that make compute and transfer writes before it visible to its dispatches and its writes to
  /// compute and transfer after it. Returns what the work reads at execution (its descriptor sets):
  /// keep it until the caller's submission has completed. No timestamps.
  std::shared_ptr<void> record(VkCommandBuffer cmd, const std::function<void(Recorder&)>& body);
  /// Work in flight: submitted by submit(), done when its fence has signalled.
  class Submission {
   public:
    ~Submission();  // waits: nothing it holds may go while the GPU works
    void wait();
    bool done();

   private:
    friend class Device;
    Device* dev_ = nullptr;
    vk::raii::CommandBuffer cmd_ = nullptr;
    vk::raii::Fence fence_ = nullptr;
    std::shared_ptr<void> held_;  // the recorded work's descriptor sets
    bool waited_ = false;
  };
  /// Records with `body` into a command buffer of its own and submits it, without waiting.
  std::unique_ptr<Submission> submit(const std::function<void(Recorder&)>& body);

  /// Bytes held by buffers of this device.
  std::size_t allocated_bytes() const { return *allocated_; }

  /// The pipeline cache's contents (to save across runs).
  std::vector<std::uint8_t> pipeline_cache_data() const;

 private:
  friend class Recorder;
  void adopt(const DeviceOptions::External& x);
  void make_device_objects();  // the queue's pool, fence, descriptor pool, pipeline cache, queries
  vk::raii::DescriptorPool make_descriptor_pool() const;
  std::vector<vk::raii::DescriptorSet> allocate_set(vk::DescriptorSetLayout layout);
  struct Staging;
  Staging& staging(std::size_t bytes);  // the transfer buffer, grown to min(bytes, 64 MiB) on demand
  std::unique_ptr<Staging> make_staging(std::size_t bytes);
  void copy(const vk::Buffer& src, const vk::Buffer& dst, std::size_t src_off, std::size_t dst_off,
            std::size_t bytes);
  std::uint32_t memory_type(std::uint32_t type_bits, vk::MemoryPropertyFlags want) const;
  void print_statistics(const Pipeline& p) const;

  vk::raii::Context context_;
  // An adopted instance and device are released, not destroyed: each by a guard declared after it,
  // so destroyed before it (and after everything made on the device).
  struct Release {
    std::function<void()> f;
    ~Release() {
      if (f) f();
    }
  };
  vk::raii::Instance instance_ = nullptr;
  Release instance_release_;
  vk::raii::DebugUtilsMessengerEXT messenger_ = nullptr;
  vk::raii::PhysicalDevice physical_ = nullptr;
  vk::raii::Device device_ = nullptr;
  Release device_release_;
  std::unique_ptr<Staging> staging_;  // after device_: destroyed before it
  std::unique_ptr<Staging> batch_staging_;  // run()'s batched transfers (grown on demand), likewise
  vk::raii::Queue queue_ = nullptr;
  vk::raii::CommandPool command_pool_ = nullptr;
  vk::raii::CommandBuffer cmd_ = nullptr;
  vk::raii::Fence fence_ = nullptr;
  std::vector<vk::raii::DescriptorPool> descriptor_pools_;  // one, and more as they fill
  vk::raii::PipelineCache pipeline_cache_ = nullptr;
  std::string cache_path_;  // where the cache is loaded from and saved to ("" : nowhere)
  vk::raii::QueryPool query_pool_ = nullptr;
  std::uint32_t queue_family_ = 0;
  std::uint32_t descriptor_sets_used_ = 0;
  std::map<std::string, std::shared_ptr<Pipeline>> pipelines_;  // after device_: destroyed before it
  std::size_t pipelines_built_ = 0;
  std::uint32_t timestamps_used_ = 0;
  bool timing_ = false;
  bool pipeline_stats_ = false;
  DeviceInfo info_;
  vk::PhysicalDeviceMemoryProperties memory_props_{};
  std::shared_ptr<std::atomic<std::size_t>> allocated_ = std::make_shared<std::atomic<std::size_t>>(0);  // bytes the live buffers hold
  // Every entry point that touches the device's queue, command buffer, pools or caches holds it, so
  // that threads sharing a Context take turns (a buffer's destruction needs none: its count is atomic).
  std::recursive_mutex mutex_;
  std::function<void(std::string_view)> on_validation_error_;
};

struct Device::Staging {
  vk::raii::Buffer buffer = nullptr;
  vk::raii::DeviceMemory memory = nullptr;
  void* map = nullptr;  // persistently mapped, host-coherent
  std::size_t bytes = 0;
};

}  // namespace gdn::gpu
