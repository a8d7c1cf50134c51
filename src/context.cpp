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

std::int64_t detail::checked_numel(const std::vector<std::int64_t>& shape, const std::string& name) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d <= 0) throw std::invalid_argument("tensor '" + name + "': shape " + shape_str(shape) + " has a dimension < 1");
    if (n > std::numeric_limits<std::int64_t>::max() / 4 / d)
      throw std::invalid_argument("tensor '" + name + "': shape " + shape_str(shape) + " is too large");
    n *= d;
  }
  return n;
}

const char* to_string(DType d) { return d == DType::BFloat16 ? "bfloat16" : "float32"; }

std::size_t detail::storage_bytes(std::int64_t n, DType d) {
  return d == DType::BFloat16 ? (std::size_t(n) * 2 + 3) / 4 * 4 : std::size_t(n) * 4;
}

namespace {
// A tensor's storage with its buffer from make(bytes) (allocated or borrowed).
template <class Make>
std::shared_ptr<detail::TensorStorage> make_storage(std::shared_ptr<Context> ctx, std::vector<std::int64_t> shape,
                                                    const std::string& name, DType dtype, Make&& make) {
  if (!ctx) throw std::invalid_argument("tensor '" + name + "': no context");
  const std::int64_t n = detail::checked_numel(shape, name);
  auto st = std::make_shared<detail::TensorStorage>();
  st->ctx = std::move(ctx);
  st->shape = std::move(shape);
  st->dtype = dtype;
  st->buffer = make(detail::device_of(*st->ctx), detail::storage_bytes(n, dtype));
  return st;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Context> ctx, std::vector<std::int64_t> shape, std::string name, DType dtype)
    : storage_(make_storage(std::move(ctx), std::move(shape), name, dtype, [&](gpu::Device& d, std::size_t bytes) {
        return d.create_buffer(name, bytes, false);
      })) {}

Tensor Tensor::wrap(std::shared_ptr<Context> ctx, std::uint64_t vk_buffer, std::size_t offset,
                    std::vector<std::int64_t> shape, std::string name, DType dtype) {
  Tensor t;
  t.storage_ = make_storage(std::move(ctx), std::move(shape), name, dtype, [&](gpu::Device& d, std::size_t bytes) {
    return d.borrow_buffer(name, reinterpret_cast<VkBuffer>(vk_buffer), offset, bytes, false);
  });
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

DType Tensor::dtype() const { return storage_ ? storage_->dtype : DType::Float32; }
std::size_t Tensor::bytes() const { return storage_ ? storage_->buffer->bytes : 0; }

namespace {
void expect_count(const Tensor& t, std::size_t got, const char* what) {
  if (std::int64_t(got) != t.numel())
    throw std::invalid_argument("tensor '" + t.name() + "' " + shape_str(t.shape()) + " holds " +
                                std::to_string(t.numel()) + " elements; " + what + " has " + std::to_string(got));
}
void expect_dtype(const Tensor& t, DType want, const char* call) {
  if (t.dtype() != want)
    throw std::invalid_argument(std::string(call) + ": tensor '" + t.name() + "' is " + to_string(t.dtype()) +
                                ", expected " + to_string(want));
}
}  // namespace

void Tensor::upload(std::span<const float> data) {
  if (!storage_) throw std::invalid_argument("upload into an empty tensor");
  expect_count(*this, data.size(), "upload");
  auto& dev = detail::device_of(*storage_->ctx);
  if (dtype() == DType::Float32) {
    dev.upload(*storage_->buffer, std::as_bytes(data));
    return;
  }
  std::vector<std::uint16_t> bits(data.size());
  for (std::size_t i = 0; i < data.size(); ++i) bits[i] = to_bfloat16(data[i]);
  dev.upload(*storage_->buffer, std::as_bytes(std::span(bits)));
}

void Tensor::upload_bf16(std::span<const std::uint16_t> bits) {
  if (!storage_) throw std::invalid_argument("upload_bf16 into an empty tensor");
  expect_dtype(*this, DType::BFloat16, "upload_bf16");
  expect_count(*this, bits.size(), "upload_bf16");
  detail::device_of(*storage_->ctx).upload(*storage_->buffer, std::as_bytes(bits));
}

std::vector<float> Tensor::download() const {
  if (!storage_) throw std::invalid_argument("download from an empty tensor");
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (dtype() == DType::Float32) {
    detail::device_of(*storage_->ctx).download(*storage_->buffer, std::as_writable_bytes(std::span(out)));
    return out;
  }
  const std::vector<std::uint16_t> bits = download_bf16();
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = from_bfloat16(bits[i]);
  return out;
}

std::vector<std::uint16_t> Tensor::download_bf16() const {
  if (!storage_) throw std::invalid_argument("download_bf16 from an empty tensor");
  expect_dtype(*this, DType::BFloat16, "download_bf16");
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(numel()));
  detail::device_of(*storage_->ctx).download(*storage_->buffer, std::as_writable_bytes(std::span(bits)));
  return bits;
}

void Tensor::fill(float value) {
  if (!storage_) throw std::invalid_argument("fill of an empty tensor");
  std::uint32_t word;
  std::memcpy(&word, &value, 4);
  if (dtype() == DType::BFloat16) word = std::uint32_t(to_bfloat16(value)) * 0x10001u;  // both halves
  const auto& buf = *storage_->buffer;
  detail::device_of(*storage_->ctx).run([&](gpu::Recorder& r) { r.fill(buf, word); });
}

std::size_t Tensor::vk_offset() const { return storage_ ? storage_->buffer->offset : 0; }

std::uint64_t Tensor::vk_buffer() const {
  if (!storage_) return 0;
  return reinterpret_cast<std::uint64_t>(static_cast<VkBuffer>(*storage_->buffer->buffer));
}

}  // namespace gdn
