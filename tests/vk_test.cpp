// SPDX-License-Identifier: MIT
// The Vulkan wrapper's dispatch checks (src/vk/recorder.cpp): a dispatch names a buffer per binding
// through gdn_bindgen's struct of the pipeline's own shader, and is refused before anything is
// recorded when the struct is another shader's or a binding the shader uses has no buffer.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "gdn/bindings.hpp"
#include "vk/device.hpp"

namespace gdn::gpu {
namespace {

struct Push {
  std::uint32_t words[16] = {};  // shaders/common/common.glsl's block: 64 bytes
};

class Dispatch : public testing::Test {
 protected:
  Device dev{DeviceOptions{}};
  std::unique_ptr<Buffer> buf = dev.create_buffer("test buffer", 1 << 16);
  std::shared_ptr<Pipeline> gate_prep = dev.pipeline(
      {.name = bindings::gate_prep::kName, .spirv = bindings::gate_prep::spirv(), .push_constant_bytes = sizeof(Push)});
  std::string error_of(const std::function<void(Recorder&)>& body) {
    try {
      dev.run(body);
    } catch (const std::logic_error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(Dispatch, RunsWithEveryBindingGiven) {
  const BufferView v{buf.get()};
  EXPECT_EQ(error_of([&](Recorder& r) {
              r.dispatch(*gate_prep, bindings::gate_prep{.a = v, .bw = v, .a_log = v, .dt_bias = v, .gates = v},
                         Push{}, 0);
            }),
            "");
}

TEST_F(Dispatch, RefusesAnotherShadersBindings) {
  const BufferView v{buf.get()};
  EXPECT_EQ(error_of([&](Recorder& r) {
              r.dispatch(*gate_prep, bindings::norm_fwd2{.o = v, .z = v, .norm = v, .out = v, .inv = v}, Push{}, 1);
            }),
            "dispatch gate_prep: the bindings passed are another shader's");
}

TEST_F(Dispatch, RefusesAMissingBufferByName) {
  const BufferView v{buf.get()};
  EXPECT_EQ(error_of([&](Recorder& r) {
              r.dispatch(*gate_prep, bindings::gate_prep{.a = v, .bw = v, .a_log = v, .dt_bias = {}, .gates = v},
                         Push{}, 1);
            }),
            "dispatch gate_prep: no buffer for binding 3 (dt_bias)");
}

}  // namespace
}  // namespace gdn::gpu
