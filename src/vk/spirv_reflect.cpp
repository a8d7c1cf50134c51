// SPDX-License-Identifier: MIT
// A reader of the few SPIR-V instructions that fix a compute shader's interface (SPIR-V 1.6
// specification, section 3 for the enumerants, 3.52 for the instructions): decorations, types,
// constants (specialization constants and their OpSpecConstantOp expressions evaluated) and
// variables. Every instruction is word 0 = (word count << 16) | opcode, then its operands.
#include "vk/spirv_reflect.hpp"

#include <map>
#include <set>
#include <stdexcept>
#include <vector>

namespace gdn::gpu {
namespace {

// Opcodes
constexpr std::uint32_t kOpName = 5, kOpTypeBool = 20, kOpTypeInt = 21, kOpTypeFloat = 22, kOpTypeVector = 23,
                        kOpTypeMatrix = 24, kOpTypeArray = 28, kOpTypeRuntimeArray = 29, kOpTypeStruct = 30,
                        kOpTypePointer = 32, kOpConstantTrue = 41, kOpConstantFalse = 42, kOpConstant = 43,
                        kOpSpecConstantTrue = 48, kOpSpecConstantFalse = 49, kOpSpecConstant = 50,
                        kOpSpecConstantOp = 52, kOpVariable = 59, kOpDecorate = 71, kOpMemberDecorate = 72;
// Decorations
constexpr std::uint32_t kSpecId = 1, kBinding = 33, kDescriptorSet = 34, kOffset = 35;
// Storage classes
constexpr std::uint32_t kUniform = 2, kWorkgroup = 4, kPushConstant = 9, kStorageBuffer = 12;

// A literal string operand: UTF-8 bytes packed little-end first into words, nul-terminated.
std::string literal_string(std::span<const std::uint32_t> words) {
  std::string s;
  for (const std::uint32_t w : words)
    for (int byte = 0; byte < 4; ++byte) {
      const char c = char((w >> (8 * byte)) & 0xFFu);
      if (c == '\0') return s;
      s += c;
    }
  return s;
}

struct Module {
  std::string name;
  using Words = std::span<const std::uint32_t>;  // one instruction, within the module
  std::map<std::uint32_t, Words> defs;  // result id -> its instruction
  std::map<std::uint32_t, std::uint32_t> spec_id, binding, set;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> member_offset;  // (struct, member) -> offset
  std::vector<Words> variables;
  std::map<std::uint32_t, std::string> names;  // OpName: id -> name
  std::span<const std::uint32_t> spec;
  std::map<std::uint32_t, std::uint64_t> values;  // evaluated constants

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("SPIR-V of " + name + ": " + what);
  }
  Words def(std::uint32_t id) const {
    const auto it = defs.find(id);
    if (it == defs.end()) fail("id " + std::to_string(id) + " is used but not defined");
    return it->second;
  }

  // The value of an integer or boolean constant, specialization constants and their expressions
  // included (booleans as 0 or 1).
  std::uint64_t value(std::uint32_t id) {
    if (const auto it = values.find(id); it != values.end()) return it->second;
    const Words w = def(id);
    const std::uint32_t op = w[0] & 0xFFFFu;
    std::uint64_t v = 0;
    auto specialized = [&](std::uint64_t dflt) {
      const auto s = spec_id.find(id);
      return s != spec_id.end() && s->second < spec.size() ? std::uint64_t(spec[s->second]) : dflt;
    };
    switch (op) {
      case kOpConstant: v = w[3]; break;
      case kOpConstantTrue: v = 1; break;
      case kOpConstantFalse: v = 0; break;
      case kOpSpecConstant: v = specialized(w[3]); break;
      case kOpSpecConstantTrue: v = specialized(1); break;
      case kOpSpecConstantFalse: v = specialized(0); break;
      case kOpSpecConstantOp: v = evaluate(w); break;
      default: fail("id " + std::to_string(id) + " is not an integer constant (opcode " + std::to_string(op) + ")");
    }
    return values[id] = v;
  }
  // OpSpecConstantOp: result type, id, the operation's opcode, its operands (32-bit integers here).
  std::uint64_t evaluate(Words w) {
    const std::uint32_t op = w[3];
    auto a = [&](std::size_t i) { return std::uint32_t(value(w[4 + i])); };
    auto s = [&](std::size_t i) { return std::int32_t(value(w[4 + i])); };
    auto nonzero = [&](std::uint32_t d) {
      if (d == 0) fail("a specialization constant divides by zero");
      return d;
    };
    switch (op) {
      case 128: return std::uint32_t(a(0) + a(1));                 // OpIAdd
      case 130: return std::uint32_t(a(0) - a(1));                 // OpISub
      case 132: return std::uint32_t(a(0) * a(1));                 // OpIMul
      case 134: return a(0) / nonzero(a(1));                       // OpUDiv
      case 135: return std::uint32_t(s(0) / std::int32_t(nonzero(a(1))));  // OpSDiv
      case 137: return a(0) % nonzero(a(1));                       // OpUMod
      case 113: case 114: return a(0);                             // OpUConvert, OpSConvert (32-bit)
      case 126: return std::uint32_t(-s(0));                       // OpSNegate
      case 166: return a(0) || a(1);                               // OpLogicalOr
      case 167: return a(0) && a(1);                               // OpLogicalAnd
      case 168: return !a(0);                                      // OpLogicalNot
      case 169: return a(0) ? a(1) : a(2);                         // OpSelect
      case 170: return a(0) == a(1);                               // OpIEqual
      case 171: return a(0) != a(1);                               // OpINotEqual
      case 172: return a(0) > a(1);                                // OpUGreaterThan
      case 173: return s(0) > s(1);                                // OpSGreaterThan
      case 174: return a(0) >= a(1);                               // OpUGreaterThanEqual
      case 175: return s(0) >= s(1);                               // OpSGreaterThanEqual
      case 176: return a(0) < a(1);                                // OpULessThan
      case 177: return s(0) < s(1);                                // OpSLessThan
      case 178: return a(0) <= a(1);                               // OpULessThanEqual
      case 179: return s(0) <= s(1);                               // OpSLessThanEqual
      case 194: return a(0) >> a(1);                               // OpShiftRightLogical
      case 196: return std::uint32_t(a(0) << a(1));                // OpShiftLeftLogical
      case 197: return a(0) | a(1);                                // OpBitwiseOr
      case 198: return a(0) ^ a(1);                                // OpBitwiseXor
      case 199: return a(0) & a(1);                                // OpBitwiseAnd
      default: fail("OpSpecConstantOp with opcode " + std::to_string(op) + " is not evaluated");
    }
  }

  // Bytes of a type as Workgroup or push-constant memory holds it.
  std::uint64_t size_of(std::uint32_t type) {
    const Words w = def(type);
    switch (w[0] & 0xFFFFu) {
      case kOpTypeBool: return 4;
      case kOpTypeInt:
      case kOpTypeFloat: return w[2] / 8;
      case kOpTypeVector:
      case kOpTypeMatrix: return std::uint64_t(w[3]) * size_of(w[2]);
      case kOpTypeArray: return value(w[3]) * size_of(w[2]);
      case kOpTypeStruct: {
        std::uint64_t end = 0, sum = 0;
        for (std::uint32_t m = 0; 2 + std::size_t(m) < w.size(); ++m) {
          const std::uint64_t sz = size_of(w[2 + m]);
          sum += sz;
          if (const auto o = member_offset.find({type, m}); o != member_offset.end()) end = std::max(end, o->second + sz);
        }
        return std::max(end, sum);
      }
      case kOpTypeRuntimeArray: fail("a runtime-sized array in shared or push-constant memory");
      default: fail("type id " + std::to_string(type) + " (opcode " + std::to_string(w[0] & 0xFFFFu) + ") has no size here");
    }
  }
};

}  // namespace

ShaderInterface reflect_shader(const std::string& name, std::span<const std::uint32_t> spirv,
                               std::span<const std::uint32_t> spec) {
  Module m;
  m.name = name;
  m.spec = spec;
  if (spirv.size() < 5 || spirv[0] != 0x07230203u) m.fail("not a SPIR-V module (magic number)");
  for (std::size_t at = 5; at < spirv.size();) {
    const std::uint32_t count = spirv[at] >> 16, op = spirv[at] & 0xFFFFu;
    if (count == 0 || at + count > spirv.size()) m.fail("an instruction runs past the module's end");
    const Module::Words w = spirv.subspan(at, count);
    at += count;
    switch (op) {
      case kOpName:
        if (count >= 3) m.names[w[1]] = literal_string(w.subspan(2));
        break;
      case kOpDecorate:
        if (count >= 4 && w[2] == kSpecId) m.spec_id[w[1]] = w[3];
        if (count >= 4 && w[2] == kBinding) m.binding[w[1]] = w[3];
        if (count >= 4 && w[2] == kDescriptorSet) m.set[w[1]] = w[3];
        break;
      case kOpMemberDecorate:
        if (count >= 5 && w[3] == kOffset) m.member_offset[{w[1], w[2]}] = w[4];
        break;
      case kOpTypeBool: case kOpTypeInt: case kOpTypeFloat: case kOpTypeVector: case kOpTypeMatrix:
      case kOpTypeArray: case kOpTypeRuntimeArray: case kOpTypeStruct: case kOpTypePointer:
        if (count >= 2) m.defs[w[1]] = w;
        break;
      case kOpConstantTrue: case kOpConstantFalse: case kOpConstant: case kOpSpecConstantTrue:
      case kOpSpecConstantFalse: case kOpSpecConstant: case kOpSpecConstantOp:
        if (count >= 3) m.defs[w[2]] = w;
        break;
      case kOpVariable:
        if (count >= 4) m.variables.push_back(w);
        break;
      default: break;
    }
  }

  ShaderInterface out;
  std::set<std::uint32_t> bindings;
  for (const auto& v : m.variables) {
    const std::uint32_t id = v[2], storage = v[3];
    // the variable's type is a pointer: (OpTypePointer, id, storage class, pointee)
    const Module::Words ptr = m.def(v[1]);
    if ((ptr[0] & 0xFFFFu) != kOpTypePointer) m.fail("variable " + std::to_string(id) + " is not of a pointer type");
    const std::uint32_t pointee = ptr[3];
    if (storage == kWorkgroup) {
      out.shared_bytes += m.size_of(pointee);
    } else if (storage == kPushConstant) {
      out.push_constant_bytes = std::uint32_t(std::max<std::uint64_t>(out.push_constant_bytes, m.size_of(pointee)));
    } else if (storage == kStorageBuffer || storage == kUniform) {
      const auto b = m.binding.find(id);
      if (b == m.binding.end()) m.fail("buffer variable " + std::to_string(id) + " has no binding");
      const auto s = m.set.find(id);
      if (s != m.set.end() && s->second != 0)
        m.fail("binding " + std::to_string(b->second) + " is in descriptor set " + std::to_string(s->second) +
               "; the host binds set 0 only");
      bindings.insert(b->second);
      if (b->second < 64) out.used |= std::uint64_t(1) << b->second;
      // a block's name is its struct type's: the pointee, or (an array of buffers) its element
      const Module::Words t = m.def(pointee);
      const std::uint32_t block = (t[0] & 0xFFFFu) == kOpTypeStruct ? pointee : t.size() > 2 ? t[2] : pointee;
      if (const auto n = m.names.find(block); n != m.names.end() && !n->second.empty()) {
        if (out.names.size() <= b->second) out.names.resize(b->second + 1);
        out.names[b->second].push_back(n->second);
      }
    }
  }
  // (an unused binding may be gone: the optimizer drops it, and the layout keeps its slot)
  if (!bindings.empty()) out.bindings = *bindings.rbegin() + 1;
  return out;
}

}  // namespace gdn::gpu
