// SPDX-License-Identifier: MIT
// The SPIR-V reader that gives the host each shader's bindings, push-constant size and shared memory
// (src/vk/spirv_reflect.cpp), against sizes known from elsewhere: the NVIDIA driver's own report of
// the shaders' shared memory (VK_KHR_pipeline_executable_properties on an H200) and the GLSL
// declarations' arithmetic at two specializations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <stdexcept>
#include <vector>

#include "gdn/spirv.hpp"
#include "vk/limits.hpp"
#include "vk/spirv_reflect.hpp"

namespace gdn::gpu {
namespace {

TEST(SpirvReflect, MatchesTheDriversReportOfSharedMemory) {
  struct Known {
    const char* name;
    std::span<const std::uint32_t> code;
    std::vector<std::uint32_t> spec;
    std::uint32_t bindings;
    std::uint64_t shared;
  };
  const Known known[] = {
      {"conv_fwd", spirv::conv_fwd, {4}, 6, 2368},
      {"chunk_factors", spirv::chunk_factors, {32, 16}, 10, 4288},
      {"chunk_prep_fwd", spirv::chunk_prep_fwd, {}, 12, 23424},
      // (the driver reports 46592: it drops chunk.glsl's lg, lgl and bet, 3 x 16 floats these two
      // passes declare and never use; the declared size is what a device must hold. Unsplit, both
      // keep two sets of row_part, 2 x 8 x 16 floats.)
      {"chunk_fwd_mma", spirv::chunk_fwd_mma, {32, 16}, 19, 46080 + 192 + 512},
      {"chunk_dstate_mma", spirv::chunk_dstate_mma, {32, 16}, 24, 46080 + 192 + 512},
      // the builds split over 2 and 4 workgroups per head: NSG = 4 and 2 subgroups, whose tiles
      // (NSG x 2 x 256 floats) and row_part (NSG x 16) shrink with them; chunk_dstate_mma's helpers'
      // hdo (2 x NSG x 256 floats) and hom (2 x NSG) grow with them, and its row helpers' rsb (2 x 16)
      // (chunk_fwd_mma's helpers' vmax_stage and scalar_stage, 8 floats each)
      {"chunk_fwd_mma_split2", spirv::chunk_fwd_mma_split2, {32, 16}, 19, 46080 - 8192 - 256 + 192 + 256 + 32 + 32},
      {"chunk_dstate_mma_split4", spirv::chunk_dstate_mma_split4, {32, 16}, 24,
       46080 - 12288 - 384 + 192 + 4096 + 16 + 128},
      {"chunk_pair_bwd_mma", spirv::chunk_pair_bwd_mma, {32, 16}, 16, 49024},
  };
  for (const auto& k : known) {
    const ShaderInterface s = reflect_shader(k.name, k.code, k.spec);
    EXPECT_EQ(s.bindings, k.bindings) << k.name;
    EXPECT_LE(s.bindings, kMaxBindingsPerSet) << k.name << ": more bindings than a pipeline's set layout holds";
    EXPECT_EQ(s.shared_bytes, k.shared) << k.name;
    EXPECT_EQ(s.push_constant_bytes, 64u) << k.name;
  }
}

// chunk_prep's shared arrays are sized by its chunk length, a specialization constant (constant_id 1):
// (3 CH + CH^2 + 2 CH CHP + 32 CHP) floats, CHP = CH rounded up to 8.
TEST(SpirvReflect, EvaluatesSpecializationConstants) {
  auto expect = [](std::uint64_t ch) {
    const std::uint64_t chp = (ch + 7) / 8 * 8;
    return (3 * ch + ch * ch + 2 * ch * chp + 32 * chp) * 4;
  };
  for (const std::uint32_t ch : {5u, 16u, 32u})
    EXPECT_EQ(reflect_shader("chunk_prep", spirv::chunk_prep, std::vector<std::uint32_t>{32, ch}).shared_bytes, expect(ch))
        << "chunks of " << ch;
}

// Block names (OpName) per binding where the module keeps them (the unoptimized builds), none where
// glslc -O stripped them; `used` marks the bindings the module still declares.
TEST(SpirvReflect, ReadsBlockNamesAndTheBindingsInUse) {
  const ShaderInterface fwd = reflect_shader("chunk_fwd_mma", spirv::chunk_fwd_mma, std::vector<std::uint32_t>{32, 16});
  ASSERT_EQ(fwd.names.size(), 19u);
  EXPECT_THAT(fwd.names[0], testing::UnorderedElementsAre("Qkn", "Qkn4"));
  EXPECT_THAT(fwd.names[13], testing::UnorderedElementsAre("Xp", "Xp4"));
  EXPECT_THAT(fwd.names[16], testing::ElementsAre("Ep"));
  EXPECT_EQ(fwd.used, (std::uint64_t(1) << 19) - 1);
  // qk_bwd2's chunked build reads neither v (binding 0) nor kv (8): -O drops them, and every name
  const ShaderInterface qk = reflect_shader("qk_bwd2_chunked", spirv::qk_bwd2_chunked, std::vector<std::uint32_t>{32});
  EXPECT_TRUE(qk.names.empty());
  EXPECT_EQ(qk.bindings, 10u);
  EXPECT_EQ(qk.used, ((std::uint64_t(1) << 10) - 1) & ~std::uint64_t(1) & ~(std::uint64_t(1) << 8));
}

TEST(SpirvReflect, RefusesWhatIsNotAModule) {
  const std::vector<std::uint32_t> garbage{1, 2, 3, 4, 5, 6};
  EXPECT_THROW(reflect_shader("garbage", garbage), std::runtime_error);
  std::vector<std::uint32_t> cut(spirv::conv_fwd.begin(), spirv::conv_fwd.begin() + 40);
  std::size_t at = 5;  // the instruction that reaches the cut's end (after the 5-word header)
  while (at + std::max(cut[at] >> 16, 1u) < cut.size()) at += std::max(cut[at] >> 16, 1u);
  cut[at] = 0xFFFF0000u | (cut[at] & 0xFFFFu);  // an instruction longer than the module
  EXPECT_THROW(reflect_shader("cut", cut), std::runtime_error);
}

}  // namespace
}  // namespace gdn::gpu
