// SPDX-License-Identifier: MIT
// The Vulkan wrapper's command recording (dispatches, barriers, timestamps) and submission.
#include "vk/device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "gdn/error.hpp"
#include "vk/limits.hpp"

namespace gdn::gpu {

// ---- recording and submission ---------------------------------------------------------------------

void Recorder::barrier() {
  if (!lanes_.empty()) {  // the lane's next step
    if (!lanes_[lane_].back().empty()) lanes_[lane_].emplace_back();
    return;
  }
  vk::MemoryBarrier mb{.srcAccessMask = vk::AccessFlagBits::eShaderWrite | vk::AccessFlagBits::eTransferWrite,
                       .dstAccessMask = vk::AccessFlagBits::eShaderRead | vk::AccessFlagBits::eShaderWrite |
                                        vk::AccessFlagBits::eTransferRead | vk::AccessFlagBits::eTransferWrite};
  cmd_.pipelineBarrier(vk::PipelineStageFlagBits::eComputeShader | vk::PipelineStageFlagBits::eTransfer,
                       vk::PipelineStageFlagBits::eComputeShader | vk::PipelineStageFlagBits::eTransfer, {}, mb, {}, {});
}

void Recorder::emit(std::function<void()> command) {
  if (lanes_.empty()) command();
  else lanes_[lane_].back().push_back(std::move(command));
}

void Recorder::begin_lanes(std::size_t n) {
  if (!lanes_.empty()) throw std::logic_error("begin_lanes inside lanes");
  if (n == 0) throw std::logic_error("begin_lanes: no lanes");
  lanes_.assign(n, std::vector<Step>(1));
  lane_ = 0;
}

void Recorder::lane(std::size_t i) {
  if (i >= lanes_.size()) throw std::logic_error("lane " + std::to_string(i) + " of " + std::to_string(lanes_.size()));
  lane_ = i;
}

void Recorder::end_lanes() {
  if (lanes_.empty()) throw std::logic_error("end_lanes outside lanes");
  const auto lanes = std::exchange(lanes_, {});
  std::size_t steps = 0;
  for (const auto& l : lanes) steps = std::max(steps, l.size());
  for (std::size_t k = 0; k < steps; ++k) {
    bool any = false;
    for (const auto& l : lanes)
      if (k < l.size())
        for (const auto& command : l[k]) {
          command();
          any = true;
        }
    if (any) barrier();
  }
}

void Recorder::dispatch_views(const Pipeline& p, const std::uint32_t* spirv, std::span<const char* const> fields,
                              std::span<const BufferView> views, const void* push, std::size_t push_bytes,
                              std::uint64_t groups) {
  // The pipeline's interface (the SPIR-V's), checked against what is passed: the bindings of its own
  // shader, a buffer for every binding it uses. (An unused binding keeps its slot in the layout and
  // is given any of the other buffers: the shader never reads it.)
  if (spirv != p.spirv) throw std::logic_error("dispatch " + p.name + ": the bindings passed are another shader's");
  if (views.size() < p.bindings || fields.size() != views.size())
    throw std::logic_error("dispatch " + p.name + ": " + std::to_string(views.size()) + " buffers for " +
                           std::to_string(p.bindings) + " bindings");
  const BufferView* any = nullptr;
  for (std::uint32_t i = 0; i < p.bindings; ++i) {
    if (views[i].buffer) {
      any = &views[i];
    } else if ((p.used >> i) & 1u) {
      throw std::logic_error("dispatch " + p.name + ": no buffer for binding " + std::to_string(i) + " (" +
                             fields[i] + ")");
    }
  }
  if (!any && p.bindings) throw std::logic_error("dispatch " + p.name + ": no buffers");
  if (push_bytes != p.push_constant_bytes)
    throw std::logic_error("dispatch " + p.name + ": " + std::to_string(push_bytes) + " push-constant bytes for " +
                           std::to_string(p.push_constant_bytes));
  if (groups == 0) return;
  const auto& info = dev_.info_;
  const std::uint64_t gx = std::min<std::uint64_t>(groups, info.max_workgroup_count[0]);
  const std::uint64_t gy = (groups + gx - 1) / gx;
  if (gy > info.max_workgroup_count[1])
    throw Error("dispatch " + p.name + " needs " + std::to_string(groups) + " workgroups, over the device's " +
                std::to_string(info.max_workgroup_count[0]) + " x " + std::to_string(info.max_workgroup_count[1]));

  auto sets = dev_.allocate_set(*p.set_layout);
  std::vector<vk::DescriptorBufferInfo> infos;
  infos.reserve(p.bindings);
  for (std::uint32_t i = 0; i < p.bindings; ++i) {
    const BufferView& given = views[i];
    const BufferView& v = given.buffer ? given : *any;
    const std::size_t range = v.bytes ? v.bytes : v.buffer->bytes - v.offset;
    infos.push_back({.buffer = *v.buffer->buffer, .offset = v.buffer->offset + v.offset, .range = range});
    // the interval's bytes: each range the shader uses once (two bindings of one range, once)
    const bool counted = given.buffer && !given.stand_in && ((p.used >> i) & 1u) &&
                         std::none_of(infos.begin(), infos.end() - 1, [&](const vk::DescriptorBufferInfo& b) {
                           return b == infos.back();
                         });
    if (counted) bytes_ += double(range);
  }
  std::vector<vk::WriteDescriptorSet> writes(infos.size());
  for (std::uint32_t i = 0; i < infos.size(); ++i)
    writes[i] = {.dstSet = *sets.front(), .dstBinding = i, .descriptorCount = 1,
                 .descriptorType = vk::DescriptorType::eStorageBuffer, .pBufferInfo = &infos[i]};
  dev_.device_.updateDescriptorSets(writes, {});
  const vk::Pipeline pipeline = *p.pipeline;
  const vk::PipelineLayout layout = *p.layout;
  const vk::DescriptorSet set = *sets.front();
  std::vector<std::byte> bytes(static_cast<const std::byte*>(push), static_cast<const std::byte*>(push) + push_bytes);
  emit([this, pipeline, layout, set, bytes = std::move(bytes), gx, gy] {
    cmd_.bindPipeline(vk::PipelineBindPoint::eCompute, pipeline);
    cmd_.bindDescriptorSets(vk::PipelineBindPoint::eCompute, layout, 0, set, {});
    if (!bytes.empty()) cmd_.pushConstants<std::byte>(layout, vk::ShaderStageFlagBits::eCompute, 0, std::span(bytes));
    cmd_.dispatch(std::uint32_t(gx), std::uint32_t(gy), 1);
  });
  sets_.push_back(std::move(sets.front()));  // freed once the run has finished
  barrier();
}

void Recorder::fill(const Buffer& b, std::uint32_t word) { fill(b, word, 0, b.bytes); }

void Recorder::fill(const Buffer& b, std::uint32_t word, std::size_t offset, std::size_t bytes, bool then_barrier) {
  if (offset + bytes > b.bytes || offset % 4 || bytes % 4)
    throw std::logic_error("fill of " + b.name + ": " + std::to_string(bytes) + " bytes at " + std::to_string(offset));
  bytes_ += double(bytes);
  if (bytes)
    emit([this, buffer = vk::Buffer(*b.buffer), at = b.offset + offset, bytes, word] {
      cmd_.fillBuffer(buffer, at, bytes, word);
    });
  if (then_barrier) barrier();
}

void Recorder::copy(const Buffer& src, std::size_t src_offset, const Buffer& dst, std::size_t dst_offset,
                    std::size_t bytes, bool then_barrier) {
  if (src_offset + bytes > src.bytes || dst_offset + bytes > dst.bytes)
    throw std::logic_error("copy of " + std::to_string(bytes) + " bytes from " + src.name + " to " + dst.name +
                           " runs past a buffer's end");
  bytes_ += 2.0 * double(bytes);  // read and written
  if (bytes)
    emit([this, from = vk::Buffer(*src.buffer), to = vk::Buffer(*dst.buffer),
          region = vk::BufferCopy{.srcOffset = src.offset + src_offset, .dstOffset = dst.offset + dst_offset, .size = bytes}] {
      cmd_.copyBuffer(from, to, region);
    });
  if (then_barrier) barrier();
}

void Recorder::mark(std::string label) {
  if (!dev_.timing_ || !lanes_.empty()) return;
  if (dev_.timestamps_used_ >= kMaxTimestamps) throw std::logic_error("too many timestamp marks in one run");
  cmd_.writeTimestamp(vk::PipelineStageFlagBits::eBottomOfPipe, *dev_.query_pool_, dev_.timestamps_used_++);
  labels_.push_back(std::move(label));
  label_bytes_.push_back(std::exchange(bytes_, 0.0));
}

std::vector<vk::raii::DescriptorSet> Device::allocate_set(vk::DescriptorSetLayout layout) {
  // from the newest pool; a full one gets a new one beside it (recorded work the caller still holds
  // keeps its sets)
  try {
    return device_.allocateDescriptorSets({.descriptorPool = *descriptor_pools_.back(), .descriptorSetCount = 1,
                                           .pSetLayouts = &layout});
  } catch (const vk::OutOfPoolMemoryError&) {
  } catch (const vk::FragmentedPoolError&) {
  }
  descriptor_pools_.push_back(make_descriptor_pool());
  return device_.allocateDescriptorSets({.descriptorPool = *descriptor_pools_.back(), .descriptorSetCount = 1,
                                         .pSetLayouts = &layout});
}

std::shared_ptr<void> Device::record(VkCommandBuffer cmd, const std::function<void(Recorder&)>& body) {
  const std::lock_guard lock(mutex_);
  if (cmd == VK_NULL_HANDLE) throw std::invalid_argument("record: a null VkCommandBuffer");
  // the caller's command buffer, borrowed for the recording (released, never freed here)
  vk::raii::CommandBuffer borrowed(device_, cmd, VK_NULL_HANDLE);
  struct Held {
    std::vector<vk::raii::DescriptorSet> sets;
  };
  auto held = std::make_shared<Held>();
  try {
    Recorder rec(*this, borrowed);
    rec.barrier();  // the caller's writes before, visible to the dispatches
    body(rec);
    held->sets = std::move(rec.sets_);
  } catch (const vk::SystemError& e) {
    borrowed.release();
    throw Error(std::string("recording failed: ") + e.what());
  } catch (...) {
    borrowed.release();
    throw;
  }
  borrowed.release();
  return held;
}

std::unique_ptr<Device::Submission> Device::submit(const std::function<void(Recorder&)>& body) {
  const std::lock_guard lock(mutex_);
  auto s = std::make_unique<Submission>();
  s->dev_ = this;
  try {
    s->cmd_ = std::move(vk::raii::CommandBuffers(device_, {.commandPool = *command_pool_,
                                                           .level = vk::CommandBufferLevel::ePrimary,
                                                           .commandBufferCount = 1})
                            .front());
    s->fence_ = vk::raii::Fence(device_, vk::FenceCreateInfo{});
    s->cmd_.begin({.flags = vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
    s->held_ = record(*s->cmd_, body);
    s->cmd_.end();
    vk::CommandBuffer raw = *s->cmd_;
    queue_.submit(vk::SubmitInfo{.commandBufferCount = 1, .pCommandBuffers = &raw}, *s->fence_);
  } catch (const vk::SystemError& e) {
    s->waited_ = true;  // nothing was submitted
    throw Error(std::string("GPU submission failed: ") + e.what());
  }
  return s;
}

void Device::Submission::wait() {
  if (waited_) return;
  if (dev_->device_.waitForFences(*fence_, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess)
    throw Error("GPU work did not finish");
  waited_ = true;
}

bool Device::Submission::done() { return waited_ || fence_.getStatus() == vk::Result::eSuccess; }

Device::Submission::~Submission() {
  try {
    wait();
  } catch (...) {
    // a lost device: the handles go all the same
  }
  const std::lock_guard lock(dev_->mutex_);  // the command pool is the device's
  cmd_ = nullptr;
}

std::vector<Interval> Device::run(const std::function<void(Recorder&)>& body, bool timed) {
  return run(body, timed, {}, {});
}

std::vector<Interval> Device::run(const std::function<void(Recorder&)>& body, bool timed,
                                  std::span<const Transfer> uploads, std::span<const Transfer> downloads) {
  const std::lock_guard lock(mutex_);
  // the staging layout: each transfer at a 16-byte aligned offset
  std::size_t total = 0;
  std::vector<std::size_t> at_up, at_down;
  for (const auto& t : uploads) at_up.push_back(std::exchange(total, (total + t.up.size() + 15) / 16 * 16));
  for (const auto& t : downloads) at_down.push_back(std::exchange(total, (total + t.down.size() + 15) / 16 * 16));
  for (const auto& t : uploads)
    if (t.up.size() > t.buffer->bytes) throw std::out_of_range("upload overruns buffer '" + t.buffer->name + "'");
  for (const auto& t : downloads)
    if (t.down.size() > t.buffer->bytes) throw std::out_of_range("download overruns buffer '" + t.buffer->name + "'");
  if (total > kBatchedStaging) {  // staged apart, each on its own
    for (const auto& t : uploads) upload(*t.buffer, t.up);
    auto out = run(body, timed, {}, {});
    for (const auto& t : downloads) download(*t.buffer, t.down);
    return out;
  }
  if (total > 0 && (!batch_staging_ || batch_staging_->bytes < total)) {
    batch_staging_.reset();
    batch_staging_ = make_staging(total);
  }
  for (std::size_t i = 0; i < uploads.size(); ++i)
    std::memcpy(static_cast<std::byte*>(batch_staging_->map) + at_up[i], uploads[i].up.data(), uploads[i].up.size());
  if (timed && !*query_pool_) throw Error("device '" + info_.name + "' has no timestamp queries on its compute queue");
  Recorder rec(*this, cmd_);
  std::vector<Interval> out;
  try {
    cmd_.reset();
    cmd_.begin({.flags = vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
    for (std::size_t i = 0; i < uploads.size(); ++i)
      if (!uploads[i].up.empty())
        cmd_.copyBuffer(*batch_staging_->buffer, *uploads[i].buffer->buffer,
                        vk::BufferCopy{.srcOffset = at_up[i], .dstOffset = uploads[i].buffer->offset,
                                       .size = uploads[i].up.size()});
    timing_ = timed;
    timestamps_used_ = 0;
    if (timed) {
      cmd_.resetQueryPool(*query_pool_, 0, kMaxTimestamps);
      cmd_.writeTimestamp(vk::PipelineStageFlagBits::eTopOfPipe, *query_pool_, timestamps_used_++);
    }
    rec.barrier();  // after work submitted before without waiting (Device::submit)
    body(rec);
    if (!downloads.empty()) rec.barrier();
    for (std::size_t i = 0; i < downloads.size(); ++i)
      if (!downloads[i].down.empty())
        cmd_.copyBuffer(*downloads[i].buffer->buffer, *batch_staging_->buffer,
                        vk::BufferCopy{.srcOffset = downloads[i].buffer->offset, .dstOffset = at_down[i],
                                       .size = downloads[i].down.size()});
    if (!downloads.empty()) {  // the copies, visible to the host's reads of the mapped staging memory
      vk::MemoryBarrier mb{.srcAccessMask = vk::AccessFlagBits::eTransferWrite, .dstAccessMask = vk::AccessFlagBits::eHostRead};
      cmd_.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eHost, {}, mb, {}, {});
    }
    cmd_.end();
    vk::CommandBuffer raw = *cmd_;
    queue_.submit(vk::SubmitInfo{.commandBufferCount = 1, .pCommandBuffers = &raw}, *fence_);
    if (device_.waitForFences(*fence_, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess)
      throw Error("GPU work did not finish");
    device_.resetFences(*fence_);
    for (std::size_t i = 0; i < downloads.size(); ++i)
      std::memcpy(downloads[i].down.data(), static_cast<const std::byte*>(batch_staging_->map) + at_down[i],
                  downloads[i].down.size());
    if (timed && timestamps_used_ > 1) {
      const auto [result, ts] = query_pool_.getResults<std::uint64_t>(
          0, timestamps_used_, std::size_t(timestamps_used_) * 8, 8,
          vk::QueryResultFlagBits::e64 | vk::QueryResultFlagBits::eWait);
      if (result != vk::Result::eSuccess) throw Error("timestamp queries did not return");
      for (std::size_t i = 1; i < ts.size(); ++i)
        out.push_back({rec.labels_[i - 1], double(ts[i] - ts[i - 1]) * info_.timestamp_period_ns * 1e-6,
                       rec.label_bytes_[i - 1]});
    }
  } catch (const vk::SystemError& e) {
    timing_ = false;
    throw Error(std::string("GPU submission failed: ") + e.what());
  } catch (...) {
    timing_ = false;
    throw;
  }
  timing_ = false;
  return out;
}

}  // namespace gdn::gpu
