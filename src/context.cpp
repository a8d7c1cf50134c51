// SPDX-License-Identifier: MIT
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "detail.hpp"
#include "gdn/error.hpp"

namespace gdn {

// ---- Context ---------------------------------------------------------------------------------------

Context::Options Context::Options::from_env() {
  Options o;
  if (const char* d = std::getenv("GDN_DEVICE")) o.device = d;
  if (const char* v = std::getenv("GDN_VALIDATE")) o.validate = std::strcmp(v, "0") != 0 && *v != '\0';
  return o;
}

std::shared_ptr<Context> Context::create(const Options& options) {
  gpu::DeviceOptions o{.select = options.device, .validate = options.validate,
                       .on_validation_error = options.on_validation_error};
  return std::shared_ptr<Context>(new Context(std::make_unique<detail::ContextImpl>(o)));
}

std::shared_ptr<Context> Context::adopt(const ExternalDevice& d) {
  gpu::DeviceOptions o;
  o.external = gpu::DeviceOptions::External{.instance = static_cast<VkInstance>(d.instance),
                                            .physical = static_cast<VkPhysicalDevice>(d.physical_device),
                                            .device = static_cast<VkDevice>(d.device),
                                            .queue_family = d.queue_family,
                                            .queue_index = d.queue_index,
                                            .subgroup_size_control = d.subgroup_size_control,
                                            .cooperative_matrix = d.cooperative_matrix};
  return std::shared_ptr<Context>(new Context(std::make_unique<detail::ContextImpl>(o)));
}

DeviceRequirements Context::requirements(void* physical_device) {
  if (!physical_device) throw std::invalid_argument("requirements: a null VkPhysicalDevice");
  const auto pd = static_cast<VkPhysicalDevice>(physical_device);
  DeviceRequirements r;
  r.api_version = VK_API_VERSION_1_2;
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(pd, &props);
  if (props.apiVersion >= VK_API_VERSION_1_3) {
    VkPhysicalDeviceVulkan13Features f13{};
    f13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
    VkPhysicalDeviceFeatures2 f2{};
    f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    f2.pNext = &f13;
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (f13.subgroupSizeControl && f13.computeFullSubgroups) {
      r.features.push_back("VkPhysicalDeviceVulkan13Features::subgroupSizeControl");
      r.features.push_back("VkPhysicalDeviceVulkan13Features::computeFullSubgroups");
    }
  }
  std::uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0) {
      r.extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
      r.features.push_back("VkPhysicalDeviceCooperativeMatrixFeaturesNV::cooperativeMatrix");
      r.features.push_back("VkPhysicalDeviceVulkan12Features::shaderFloat16");
    }
  return r;
}

std::vector<DeviceInfo> Context::devices() { return gpu::Device::enumerate(); }

Context::Context(std::unique_ptr<detail::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

const DeviceInfo& Context::device() const { return impl_->device.info(); }
std::size_t Context::allocated_bytes() const { return impl_->device.allocated_bytes(); }
std::size_t Context::pipelines_built() const { return impl_->device.pipelines_built(); }

// ---- Tensor ----------------------------------------------------------------------------------------

std::string shape_str(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// The elements of `shape`, refusing a dimension < 1 or a size whose bytes overflow.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, const std::string& name) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d <= 0) throw std::invalid_argument("tensor '" + name + "': shape " + shape_str(shape) + " has a dimension < 1");
    if (n > std::numeric_limits<std::int64_t>::max() / 4 / d)
      throw std::invalid_argument("tensor '" + name + "': shape " + shape_str(shape) + " is too large");
    n *= d;
  }
  return n;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Context> ctx, std::vector<std::int64_t> shape, std::string name) {
  if (!ctx) throw std::invalid_argument("tensor '" + name + "': no context");
  const std::int64_t n = checked_numel(shape, name);
  auto st = std::make_shared<detail::TensorStorage>();
  st->ctx = std::move(ctx);
  st->shape = std::move(shape);
  st->buffer = detail::device_of(*st->ctx).create_buffer(std::move(name), std::size_t(n) * sizeof(float));
  storage_ = std::move(st);
}

Tensor Tensor::wrap(std::shared_ptr<Context> ctx, std::uint64_t vk_buffer, std::size_t offset,
                    std::vector<std::int64_t> shape, std::string name) {
  if (!ctx) throw std::invalid_argument("tensor '" + name + "': no context");
  const std::int64_t n = checked_numel(shape, name);
  auto st = std::make_shared<detail::TensorStorage>();
  st->ctx = std::move(ctx);
  st->shape = std::move(shape);
  st->buffer = detail::device_of(*st->ctx).borrow_buffer(std::move(name), reinterpret_cast<VkBuffer>(vk_buffer), offset,
                                                          std::size_t(n) * sizeof(float));
  Tensor t;
  t.storage_ = std::move(st);
  return t;
}

const std::vector<std::int64_t>& Tensor::shape() const {
  static const std::vector<std::int64_t> none;
  return storage_ ? storage_->shape : none;
}

std::int64_t Tensor::numel() const {
  if (!storage_) return 0;
  return std::accumulate(storage_->shape.begin(), storage_->shape.end(), std::int64_t{1}, std::multiplies<>());
}

const std::string& Tensor::name() const {
  static const std::string none = "(empty)";
  return storage_ ? storage_->buffer->name : none;
}

void Tensor::upload(std::span<const float> data) {
  if (!storage_) throw std::invalid_argument("upload into an empty tensor");
  if (std::int64_t(data.size()) != numel())
    throw std::invalid_argument("tensor '" + name() + "' " + shape_str(shape()) + " holds " + std::to_string(numel()) +
                                " floats; upload has " + std::to_string(data.size()));
  detail::device_of(*storage_->ctx).upload(*storage_->buffer, std::as_bytes(data));
}

std::vector<float> Tensor::download() const {
  if (!storage_) throw std::invalid_argument("download from an empty tensor");
  std::vector<float> out(static_cast<std::size_t>(numel()));
  detail::device_of(*storage_->ctx).download(*storage_->buffer, std::as_writable_bytes(std::span(out)));
  return out;
}

void Tensor::fill(float value) {
  if (!storage_) throw std::invalid_argument("fill of an empty tensor");
  std::uint32_t word;
  std::memcpy(&word, &value, 4);
  const auto& buf = *storage_->buffer;
  detail::device_of(*storage_->ctx).run([&](gpu::Recorder& r) { r.fill(buf, word); });
}

std::size_t Tensor::vk_offset() const { return storage_ ? storage_->buffer->offset : 0; }

std::uint64_t Tensor::vk_buffer() const {
  if (!storage_) return 0;
  return reinterpret_cast<std::uint64_t>(static_cast<VkBuffer>(*storage_->buffer->buffer));
}

}  // namespace gdn
