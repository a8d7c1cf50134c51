# cmake -DIN=x.spv -DOUT=x.hpp -DNAME=x -P EmbedSpirv.cmake
# Writes the SPIR-V words of IN as `inline constexpr std::array<uint32_t, N> NAME` (namespace gdn::spirv):
# an array of words keeps pCode aligned, which a byte array plus a cast does not.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR rem "${nhex} % 8")
if(nhex EQUAL 0 OR NOT rem EQUAL 0)
  message(FATAL_ERROR "${IN}: not a whole number of SPIR-V words")
endif()
# SPIR-V is little-endian words: bytes b0 b1 b2 b3 -> 0xb3b2b1b0.
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," words "${hex}")
string(REGEX REPLACE "(([^,]+,){8})" "\\1\n    " words "${words}")
math(EXPR n "${nhex} / 8")
file(WRITE ${OUT} "// Generated from ${NAME}.comp by cmake/EmbedSpirv.cmake. Do not edit.
#pragma once
#include <array>
#include <cstdint>
namespace gdn::spirv {
inline constexpr std::array<std::uint32_t, ${n}> ${NAME} = {
    ${words}};
}  // namespace gdn::spirv
")
