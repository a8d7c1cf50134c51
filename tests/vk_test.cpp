// SPDX-License-Identifier: MIT
// The Vulkan wrapper's dispatch checks (src/vk/recorder.cpp): a dispatch names a buffer per binding
// through gdn_bindgen's struct of the pipeline's own shader, and is refused before anything is
// recorded when the struct is another shader's or a binding the shader uses has no buffer. Lanes:
// command sequences emitted interleaved keep each lane's order and barriers.
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

// Three lanes of chains of different lengths (fill, then copies, each after a barrier): every chain's
// last buffer holds its first value, so each step ran after the one before it in its lane.
TEST_F(Dispatch, LanesKeepEachLanesOrder) {
  constexpr std::size_t kBytes = 4096;
  std::vector<std::unique_ptr<Buffer>> b;
  for (int i = 0; i < 9; ++i) b.push_back(dev.create_buffer("lane buffer " + std::to_string(i), kBytes));
  dev.run([&](Recorder& r) {
    for (int i = 0; i < 9; ++i) r.fill(*b[i], 0xFFFFFFFFu);
    r.begin_lanes(3);
    for (std::uint32_t l = 0; l < 3; ++l) {
      r.lane(l);
      r.fill(*b[3 * l], 100 + l);
      for (std::uint32_t k = 0; k < 2 - l; ++k) r.copy(*b[3 * l + k], 0, *b[3 * l + k + 1], 0, kBytes);
      r.mark("dropped inside lanes");
    }
    r.end_lanes();
  });
  for (std::uint32_t l = 0; l < 3; ++l) {
    std::vector<std::uint32_t> got(kBytes / 4);
    dev.download(*b[3 * l + 2 - l], std::as_writable_bytes(std::span(got)));
    for (auto w : got) ASSERT_EQ(w, 100 + l) << "lane " << l;
  }
  EXPECT_THROW(dev.run([](Recorder& r) { r.end_lanes(); }), std::logic_error);
  EXPECT_THROW(dev.run([](Recorder& r) {
                 r.begin_lanes(2);
                 r.lane(2);
               }),
               std::logic_error);
}

}  // namespace
}  // namespace gdn::gpu
