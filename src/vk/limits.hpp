// SPDX-License-Identifier: MIT
// The sizes the Vulkan wrapper fixes for itself (device.cpp, pipeline.cpp, recorder.cpp share them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gdn::gpu {

inline constexpr std::size_t kStagingChunk = std::size_t{64} << 20;  // bounds host-visible memory per transfer
// Host transfers batched into a run's submission at most this much together (more: staged apart)
inline constexpr std::size_t kBatchedStaging = std::size_t{512} << 20;
inline constexpr std::uint32_t kMaxSetsPerRun = 512;
inline constexpr std::uint32_t kMaxBindingsPerSet = 32;
inline constexpr std::uint32_t kMaxTimestamps = 256;

}  // namespace gdn::gpu
