// SPDX-License-Identifier: MIT
// main() of the device tests: one Context for all of them, with the Khronos validation layer
// whenever it is installed; its errors fail the test that raised them (DeviceTest::TearDown).
#include <cstdio>
#include <mutex>

#include "test_support.hpp"

namespace gdn::test {
namespace {
std::mutex g_mutex;
std::vector<std::string> g_errors;
}  // namespace

std::shared_ptr<Context> context() {
  static std::shared_ptr<Context> ctx = [] {
    auto opts = Context::Options::from_env();
    opts.validate = true;  // where the layer is installed; otherwise the device says so once
    opts.on_validation_error = [](std::string_view msg) {
      std::lock_guard lock(g_mutex);
      g_errors.emplace_back(msg);
    };
    auto c = Context::create(opts);
    const auto& d = c->device();
    std::printf("[gdn] device: %s (%s, %s), subgroup %u, storage range %llu, shared %u\n", d.name.c_str(),
                d.type.c_str(), d.api_version.c_str(), d.subgroup_size,
                static_cast<unsigned long long>(d.max_storage_buffer_range), d.max_shared_memory);
    return c;
  }();
  return ctx;
}

std::vector<std::string> take_validation_errors() {
  std::lock_guard lock(g_mutex);
  return std::exchange(g_errors, {});
}

}  // namespace gdn::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
