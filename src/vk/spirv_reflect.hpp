// SPDX-License-Identifier: MIT
// What a compute shader's SPIR-V declares of its interface, read from the module itself: its
// storage-buffer bindings, its push-constant block and its shared (Workgroup) memory under given
// specialization constants. The host takes these sizes from here, so none is mirrored by hand.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gdn::gpu {

struct ShaderInterface {
  std::uint32_t bindings = 0;             // storage buffers at descriptor set 0: the last binding + 1 (an unused
                                          // one the optimizer dropped leaves a hole)
  std::uint32_t push_constant_bytes = 0;  // the push-constant block's size (0: none)
  std::uint64_t shared_bytes = 0;         // the Workgroup variables' sizes, summed
  std::uint64_t used = 0;                 // bit i: binding i is declared (for i < 64)
  // per binding, the names (OpName) of the buffer blocks declared there, in the module's order; empty
  // where the module carries no names (an optimized build strips them)
  std::vector<std::vector<std::string>> names;
};

/// Reflects `spirv` (a whole module of one compute entry point) with specialization constant i
/// (constant_id i) set to spec[i] where given, its default elsewhere. Throws std::runtime_error
/// naming `name` for a module it cannot read or a buffer outside descriptor set 0.
ShaderInterface reflect_shader(const std::string& name, std::span<const std::uint32_t> spirv,
                               std::span<const std::uint32_t> spec = {});

}  // namespace gdn::gpu
