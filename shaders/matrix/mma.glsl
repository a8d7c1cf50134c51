// The matrix units (GL_NV_cooperative_matrix): 16 x 16 x 16 products of fp16 matrices into fp32,
// one subgroup of 32 each, at fp32 accuracy.
//
// Every fp32 operand x is split into an fp16 pair: hi = x rounded to 11 significant bits and
// lo = fp16((x - hi) LO), scaled so that fp16 subnormals (which a device may flush) stay out of
// the way. A product is a_hi b_hi + (a_hi b_lo + a_lo b_hi) / LO with the two sums in separate fp32
// accumulators; the dropped a_lo b_lo is 2^-22 relative. The pair holds 22 bits of elements from
// 2^-13 to 2^15 (lo overflows above), 11 bits from 2^-26 to 2^-14, and none below 2^-26.
//
// So the passes never split a tensor at its own magnitude: each operand is brought near 1 by a power
// of two (scale_exponent) and each product scaled back, exactly in fp32. The recurrence is linear in
// v (given k, beta and g) and the backward in dO, and a subgroup's 16 state columns evolve apart from
// the others', so the serial passes keep exponents per subgroup, chosen again each chunk, one per
// quantity whose magnitude goes its own way: V and U; the state S (|k^| |V|, and k^ is small where
// qkv is); dO; dS (|q^| |dO|); dU and Yv (|q^| |k^| |dO|). q^, k^ and P are staged with per-chunk
// exponents (chunk_prep_fwd); the pair pass and chunk_factors take each head's smallest exponent of
// each quantity (vscale, dscale). A product whose operands carry different exponents goes into an
// accumulator rescaled to its scale first. The decays, T and beta are at most 1 or near it.
// Range: every scaled quantity from 2^-60 to 2^60 (scale_exponent's clamp), and within a tile 22 bits
// down to 2^-13 of its largest element (the serial passes' states: held with a bound on their largest
// value near 2^13, state_exponent in chunk_mma.glsl, down to 2^-27 of the bound).
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require

// Config::precision fast: the state products (MMA_SPLIT, and the pair pass's remade states:
// mma_hi_into) single fp16 products (hi alone: 11 significant bits), the other single-accumulator
// ones (mma_split_into) a_hi b_hi + a_hi b_lo (the right operand at 22 bits: its rounding made the
// gate gradient's error at large activations), the pair pass's products with chunk_factors' factors
// (mma_exact_into) all three products, fp32 accumulation. So the lo halves are made of
// mma_split_into's right operands and mma_exact_into's operands (split(), the staged P and T,
// chunk_factors' factors; the pair pass's stages always), not of the staged K~, Q~, -K^ or the
// states. The operand scaling stays (fp32's exponent range).
layout(constant_id = 7) const bool FAST = false;
// Workgroups per (window, v-head) of the serial passes, each a share of the state's columns
// (chunk_mma.glsl; Config::serial_split): each leaves its exponents (vscale, dscale) and its share of
// the pair dots (pdots) in a slot of its own, and the later passes take the head's from them. The
// serial passes are built once per split (SERIAL_SPLIT: their arrays are sized by it), the later
// passes take it as specialization constant 8.
#ifdef SERIAL_SPLIT
const uint SPLIT = SERIAL_SPLIT;
#else
layout(constant_id = 8) const uint SPLIT = 1;
#endif
// A slot holds the smallest exponent over the workgroup's chunks with nonzero values, NO_EXPONENT
// where there were none. A head's exponent of one quantity is the smallest of its workgroups' slots
// buf[at SPLIT + s], where at = q B nv + bh for quantity q (SPLIT <= 4), and 0 where none has one.
#define NO_EXPONENT 999.0
float head_exponent_of(float m) { return m < NO_EXPONENT ? m : 0.0; }
#define HEAD_EXPONENT(buf, at)                                                                                    \
  head_exponent_of(min(min(buf[(at) * SPLIT], buf[(at) * SPLIT + min(1u, SPLIT - 1u)]),                           \
                       min(buf[(at) * SPLIT + min(2u, SPLIT - 1u)], buf[(at) * SPLIT + min(3u, SPLIT - 1u)])))
// The boundary streams the pass reads and writes as bfloat16 itself (common.glsl's BF16_* bits); the
// others are float32.
layout(constant_id = 6) const uint BF16 = 0u;
bool bf16(uint stream) { return (BF16 & stream) != 0u; }

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

#define LO 4096.0  // the scale of the lo halves, 2^12
// fp32 x rounded to fp16's 11 significant bits, as fp32 (exact in fp16 within its range), and 0 below
// fp16's smallest normal 2^-14: the matrix units flush fp16 subnormals, so lo = (x - hi) LO carries
// such an x whole (to 11 bits from 2^-26 up). Integer arithmetic, so that no compiler folds
// fp16(fp32(fp16(x))) - x to 0 (one did: the lo halves vanished).
#define HI_MIN 6.103515625e-05  // 2^-14
vec4 hi_part(vec4 x) {
  const vec4 h = uintBitsToFloat((floatBitsToUint(x) + 0x1000u) & 0xFFFFE000u);
  return mix(h, vec4(0.0), lessThan(abs(x), vec4(HI_MIN)));
}
float hi_part(float x) {
  return abs(x) < HI_MIN ? 0.0 : uintBitsToFloat((floatBitsToUint(x) + 0x1000u) & 0xFFFFE000u);
}
// Stores x (4 consecutive elements) split into its pair, as two uvec2 (4 halves each: one 64-bit
// store per half) at the lvalues hi_at and lo_at. Matrix loads index such arrays in uvec2s.
uvec2 pack_half4(vec4 x) { return uvec2(packFloat2x16(f16vec2(x.xy)), packFloat2x16(f16vec2(x.zw))); }
// WHEN wraps the lo half's store: LO_EXACT, in the exact mode alone, or LO_ALWAYS (macros: a branch
// on a constant would stay in the unoptimized SPIR-V).
#define PUT_SPLIT4_WHEN(hi_at, lo_at, x, WHEN) \
  {                                            \
    const vec4 x_ = (x), h_ = hi_part(x_);     \
    hi_at = pack_half4(h_);                    \
    WHEN(lo_at = pack_half4((x_ - h_) * LO);)  \
  }
#define LO_EXACT(statement) if (!FAST) statement
#define LO_ALWAYS(statement) statement
#define PUT_SPLIT4_TO(hi_at, lo_at, x) PUT_SPLIT4_WHEN(hi_at, lo_at, x, LO_EXACT)
// PUT_SPLIT4_TO whose lo half is made in FAST too (a right operand of mma_split_into).
#define PUT_SPLIT4_RIGHT_TO(hi_at, lo_at, x) PUT_SPLIT4_WHEN(hi_at, lo_at, x, LO_ALWAYS)
// The same split of a register-held fp32 matrix (element by element: one layout, F32M's).
void split(F32M x, out F16M hi, out F16M lo) {
  F32M h = x;
  for (int e = 0; e < h.length(); ++e) h[e] = hi_part(x[e]);
  hi = F16M(h);
  lo = F16M((x - h) * LO);  // (in FAST too: mma_split_into's right operands take it)
}

// acc += a b for split operands, all three products, their lo products added at once: one
// accumulator per result where registers are short (the lo sum of each call rounds once more than
// MMA_SPLIT's running one).
#define MMA_EXACT_INTO(acc, ah, al, bh, bl)               \
  F32M lo = F32M(0.0);                                    \
  lo = coopMatMulAddNV(al, bh, lo);                       \
  lo = coopMatMulAddNV(ah, bl, lo);                       \
  acc = coopMatMulAddNV(ah, bh, acc) + lo * (1.0 / LO);
// The same in the exact mode, a_hi b_hi + a_hi b_lo in FAST.
void mma_split_into(inout F32M acc, F16M ah, F16M al, F16M bh, F16M bl) {
  if (FAST) {
    acc = coopMatMulAddNV(ah, bh, acc) + coopMatMulAddNV(ah, bl, F32M(0.0)) * (1.0 / LO);
    return;
  }
  MMA_EXACT_INTO(acc, ah, al, bh, bl)
}
// The same in both modes: the pair pass's products with chunk_factors' factors, whose results meet
// in dlg's nearly cancelling sums (the gate gradients).
void mma_exact_into(inout F32M acc, F16M ah, F16M al, F16M bh, F16M bl) { MMA_EXACT_INTO(acc, ah, al, bh, bl) }
// mma_split_into in the exact mode, a_hi b_hi alone in FAST: the pair pass's remade states (dSm, Sm),
// single products in FAST as the serial passes' states are.
void mma_hi_into(inout F32M acc, F16M ah, F16M al, F16M bh, F16M bl) {
  if (FAST) { acc = coopMatMulAddNV(ah, bh, acc); return; }
  mma_split_into(acc, ah, al, bh, bl);
}
// acc + lo / LO, the two accumulators of a split product.
F32M unsplit(F32M acc, F32M lo) { return acc + lo * (1.0 / LO); }
// acc += a b and lo += a_hi b_lo + a_lo b_hi, for split operands.
#define MMA_SPLIT(acc, lo, ah, al, bh, bl)   \
  {                                          \
    if (!FAST) {                             \
      lo = coopMatMulAddNV(al, bh, lo);      \
      lo = coopMatMulAddNV(ah, bl, lo);      \
    }                                        \
    acc = coopMatMulAddNV(ah, bh, acc);      \
  }

// Makes the subgroup's shared-memory writes visible to the whole subgroup, which waits for them:
// between writing a tile of shared memory and reading it back in another layout.
#define TILE_SYNC() { subgroupMemoryBarrierShared(); subgroupBarrier(); }

// The 8 elements of a subgroup's 16 x 16 tile [i][column] that lane `lane` moves, as two vec4: rows
// tile_row(lane, e) = lane / 4 + 8 e (e = 0, 1), columns 4 (lane % 4) .. 4 (lane % 4) + 3, so that a
// vec4 load or store instruction of the subgroup covers 8 whole 64-byte rows. tile_lane is the
// first's offset in the tile (the second is 128 further).
uint tile_row(uint lane, uint e) { return lane / 4u + 8u * e; }
uint tile_lane(uint lane) { return (lane / 4u) * 16u + 4u * (lane % 4u); }
// The subgroup tile hand-offs through a shared float array (`tiles`, the shader's, unless named):
// 4 consecutive elements from float `at` in and out, and a lane's share (tile_row, tile_lane) of the
// 16 x 16 tile at t_at in, from vals[2]. (No parameter is named x, y, z or w: they would replace the
// swizzles.)
#define PUT_FLOAT4(arr, at, val)                                                             \
  {                                                                                          \
    const vec4 x4_ = (val);                                                                  \
    const uint a4_ = (at);                                                                   \
    arr[a4_] = x4_.x; arr[a4_ + 1u] = x4_.y; arr[a4_ + 2u] = x4_.z; arr[a4_ + 3u] = x4_.w; \
  }
#define PUT_TILE4(at, val) PUT_FLOAT4(tiles, at, val)
#define TILE4_AT(at) vec4(tiles[(at)], tiles[(at) + 1u], tiles[(at) + 2u], tiles[(at) + 3u])
#define PUT_LANE_TILE(t_at, lane, vals)                                                                        \
  {                                                                                                           \
    [[unroll]] for (uint e_ = 0u; e_ < 2u; ++e_) PUT_TILE4((t_at) + tile_lane(lane) + 128u * e_, (vals)[e_]) \
  }

// Writes a subgroup's fp32 16 x 16 result held transposed, x = X^T [col][i], through its tile of the
// shader's shared float array `tiles` ([i][16] from t_at), to rows i < rows of a tensor: element
// (i, col) of X becomes buf[ROW_AT + col] = SCALE * X, where ROW_AT and SCALE may use i_. Lane l moves
// column l % 16 of rows 2 q + l / 16, so that each store instruction writes two whole 64-byte rows
// (two lanes per row, 8 columns each, wrote 32 partial sectors per instruction).
#define STORE_TILE_T(x, t_at, lane, rows, buf, ROW_AT, SCALE)             \
  {                                                                       \
    coopMatStoreNV(x, tiles, t_at, 16u, true);                            \
    TILE_SYNC()                                                           \
    [[unroll]] for (uint q_ = 0u; q_ < 8u; ++q_) {                        \
      const uint i_ = 2u * q_ + (lane) / 16u, c_ = (lane) % 16u;          \
      if (i_ < (rows)) buf[(ROW_AT) + c_] = (SCALE) * tiles[(t_at) + i_ * 16u + c_]; \
    }                                                                     \
    subgroupBarrier();                                                    \
  }

// The exponent e with m 2^e in [1, 2) for the largest magnitude m of a tensor (0 for m = 0, Inf or
// NaN), within +-60 so that the products of two or three scales and their inverses stay normal fp32.
// From the bits (frexp and ldexp compile to long sequences, on the serial passes' chain).
int scale_exponent(float m) {
  const int eb = int(floatBitsToUint(m) >> 23u) & 0xFF;  // biased exponent (m >= 0)
  if (!(m > 0.0) || eb == 0xFF) return 0;
  return clamp(127 - max(eb, 1), -60, 60);
}
// 2^e as a normal fp32 (e clamped to its range).
float pow2(int e) { return uintBitsToFloat(uint(clamp(e, -126, 127) + 127) << 23u); }
float max4(vec4 x) { return max(max(x.x, x.y), max(x.z, x.w)); }
