// The matrix units' serial passes over a window's chunks (chunk_fwd_mma, chunk_dstate_mma): their
// shared layout and the staging of a chunk's operators, which both read alike.
//
// Chunks of CH = 16 tokens (one tile of rows). SPLIT workgroups (mma.glsl) of NSG = 8 / SPLIT
// subgroups of 32 per (window, v-head); subgroup s of workgroup part p owns state columns col0 ..
// col0 + 15, col0 = 16 (NSG p + s), and keeps them transposed ([its 16 columns][row r]) as eight fp32
// 16 x 16 tiles in registers (rows 16 rt .. 16 rt + 15). With SPLIT > 1 (few windows, whose heads
// would leave multiprocessors idle) a workgroup holds a share of a row's columns only, while the gated
// RMSNorm's row sums need whole rows: the forward's norm is a pass of its own (norm_fwd2 after
// chunk_fwd_mma), and chunk_dstate_mma's helper subgroups load whole rows for the backward's.
// Columns are independent, so the subgroups never exchange results: the workgroup shares only the
// staged operators K~ = diag(Gamma / gamma) K, Q~ = diag(gamma) Q, P and a third [16][128] one, as
// fp16 pairs (mma.glsl):
// - chunk_fwd_mma: -K^ = -diag(gamma) K and T diag(beta). W = T diag(beta gamma) K = T diag(beta) K^
//   is not made: the forward takes W S0 as T diag(beta) (K^ S0), which costs a 16 x 16 product on
//   its serial chain and saves the forward W's stores.
// - chunk_dstate_mma (defines DSTATE_STAGE): -diag(beta gamma) K and T itself: its state update
//   takes W^T dU as K^T diag(beta gamma) Yv with Yv = T^T dU (W = T diag(beta gamma) K), one 16 x 16
//   product on its chain, so that no pass makes W.
// 8 subgroups per workgroup measured faster than 4 (two workgroups per head) where the heads fill
// the device. A split workgroup has 8 subgroups too: the NSG that hold state columns and 8 - NSG
// helpers that stage each chunk's operators with them (the staging is on the serial chain, and the
// split workgroups are few: the registers are there) and, in chunk_dstate_mma, make the norm's
// backward.
// The staged K~, Q~ and third operator are 2^eqk times theirs and P 2^ep times (chunk_prep_fwd's
// exponents, mma.glsl): the passes scale back each product they take from them.
// Needs bindings qkn4 ([2][B, T, nk, D/4]), lgc, p4 and t4 ([B, T, nv, CH/4]), gates ([3][B, T, nv]),
// eqkb ([B, nk, nch]) and epb ([B, nv, nch]).
const uint NSG = 8u / SPLIT;  // the subgroups that hold state columns: 0 .. NSG - 1
// The invocations that fetch and stage a chunk's operators (a pass may define fewer: 128), and the
// rows each takes: rows f / 32 + (OPERATOR_FETCHERS / 32) e, e < RPI, of fetcher f.
#ifndef OPERATOR_FETCHERS
#define OPERATOR_FETCHERS 256u
#endif
const uint RPI = 512u / OPERATOR_FETCHERS;  // the staged operators' rows per fetcher (16 rows)
const uint ROW_STEP = OPERATOR_FETCHERS / 32u;
layout(local_size_x = 256) in;  // 8 subgroups of 32 (the host requires exactly 32)
// The workgroup's (window, v-head) b nv + h, and its part of the head's columns.
uint split_head() { return linear_group() / SPLIT; }
// Whether subgroup sg holds state columns (else it only stages operators).
bool holds_columns(uint sg) { return SPLIT == 1u || sg < NSG; }
// Subgroup sg's first state column (a helper's: the last column subgroup's, so that what it loads
// stays in range; it stores nothing).
uint split_col0(uint sg) { return 16u * (NSG * (linear_group() % SPLIT) + min(sg, NSG - 1u)); }

// Staged [row i][element r] operators, as arrays of uvec2 (4 halves: one 64-bit store per invocation
// and array; the matrix loads index them in uvec2s), rows DP uvec2s apart (272 bytes: the 8 rows of
// one 128-bit matrix load phase fall in distinct banks); P [i][j] rows PP apart (48 bytes, likewise).
#define DP 34u
#define PP 6u
shared uvec2 kh[16u * DP], kl[16u * DP];  // K~ hi, lo
shared uvec2 qh[16u * DP], ql[16u * DP];  // Q~ hi, lo
shared uvec2 xh[16u * DP], xl[16u * DP];  // -diag(beta gamma) K (DSTATE_STAGE) or -K^ = -diag(gamma) K, hi, lo
shared uvec2 ph[16u * PP], pl[16u * PP];  // P hi, lo
shared uvec2 th[16u * PP], tl[16u * PP];  // T diag(beta), or T with DSTATE_STAGE, [i][j] hi, lo (rows as P's)
// Per subgroup, two fp32 16 x 16 tiles [row i][column] (each pass says what they hold).
shared float tiles[NSG * 2u * 256u];

// vec4 index, in a [B, T, nv*D] tensor, of the lane's 4 columns (of the subgroup's 16 from col0) in
// the row of chunk row i (clamped into the chunk).
uint tile_at(Chunk k, uint i, uint col0, uint lane) { return (head_row(k, min(i, k.L - 1u)) * D + col0 + 4u * (lane % 4u)) / 4u; }
// Loads into x[2] the lane's elements of a chunk's rows of a [B, T, nv*D] tensor (vec4 array buf4) at
// the subgroup's 16 columns from col0; rows past the chunk are zero.
#define FETCH_TILE(buf4, k, lane, col0, x)                                                          \
  {                                                                                                 \
    [[unroll]] for (uint e_ = 0u; e_ < 2u; ++e_)                                                    \
      x[e_] = tile_row(lane, e_) < (k).L ? buf4[tile_at(k, tile_row(lane, e_), col0, lane)] : vec4(0.0); \
  }
// The same for a boundary stream that may be bfloat16 (BF16 bit `stream`; buf4 and buf2 its binding as
// vec4 and as uvec2, 4 bfloat16), as loaded: a bfloat16 quad's bits in .xy, widened by stream_value
// where it is used, so that no conversion waits for the load before then.
#define FETCH_STREAM(stream, buf4, buf2, k, lane, col0, x)                                          \
  {                                                                                                 \
    [[unroll]] for (uint e_ = 0u; e_ < 2u; ++e_) {                                                  \
      const uint at_ = tile_at(k, tile_row(lane, e_), col0, lane);                                  \
      x[e_] = tile_row(lane, e_) >= (k).L ? vec4(0.0)                                               \
            : bf16(stream) ? vec4(uintBitsToFloat(buf2[at_]), 0.0, 0.0) : buf4[at_];                \
    }                                                                                               \
  }
vec4 stream_value(uint stream, vec4 raw) { return bf16(stream) ? widen_bf16x4(floatBitsToUint(raw.xy)) : raw; }
// Its inverse for a subgroup tile [i][16 columns] at t_at of the shader's shared float array `tiles`:
// stores the lane's elements (t_lane = tile_lane(lane)) to the chunk's rows of buf4.
#define STORE_TILE_ROWS(buf4, k, lane, col0, t_at, t_lane)                                                 \
  {                                                                                                         \
    [[unroll]] for (uint e = 0u; e < 2u; ++e)                                                               \
      if (tile_row(lane, e) < (k).L) buf4[tile_at(k, tile_row(lane, e), col0, lane)] = TILE4_AT((t_at) + (t_lane) + 128u * e); \
  }

// The gated RMSNorm's row sums over D columns (chunk_fwd_mma, chunk_dstate_mma): each subgroup's
// share of row i (its 16 columns) waits in row_part[subgroup][i] for a barrier, then row_total(i)
// adds the 8 shares. Needs GL_KHR_shader_subgroup_shuffle.
// A pass that defines ROW_PART_SETS 2 keeps two sets of shares (a chunk's, by its parity), so that
// one chunk's are read while the next chunk's are written.
#ifndef ROW_PART_SETS
#define ROW_PART_SETS 1u
#endif
shared float row_part[ROW_PART_SETS * NSG * 16u];
// Sums x over the 4 lanes that hold row tile_row(lane, e), and stores it as the subgroup's share.
void put_row_part(float x, uint sg, uint lane, uint e, uint set) {
  x += subgroupShuffleXor(x, 1u);
  x += subgroupShuffleXor(x, 2u);
  if (lane % 4u == 0u) row_part[(set * NSG + sg) * 16u + tile_row(lane, e)] = x;
}
float row_total(uint i, uint set) {
  float x = 0.0;
  [[unroll]] for (uint g = 0u; g < NSG; ++g) x += row_part[(set * NSG + g) * 16u + i];
  return x;
}

// The largest x over the subgroup (of 32).
float subgroup_max32(float x) {
  [[unroll]] for (uint m = 1u; m < 32u; m *= 2u) x = max(x, subgroupShuffleXor(x, m));
  return x;
}
// The largest |x| over the subgroup of the lanes' two vec4s x[0], x[1].
#define SUBGROUP_ABSMAX8(x) subgroup_max32(max(max4(abs((x)[0])), max4(abs((x)[1]))))
// The largest |x| of the lane's elements of a 16 x 16 tile.
float tile_absmax(F32M x) {
  float m = 0.0;
  for (int e = 0; e < x.length(); ++e) m = max(m, abs(x[e]));
  return m;
}
// The serial passes' states: each update is scaled, in its last multiply, to the exponent that puts
// a bound on the new state's largest magnitude (true units) in [2^13, 2^14), the bound made from
// values at hand when the update starts: Gamma times the exact largest |S| at the chunk's start
// (a reduction off the chain: the one chunk's update to the next chunk's products holds none) plus
// a bound on the update's products. Held so high, the state keeps 22 bits in its largest elements
// however loose the bound (up to 2^26 over the largest value), lo stays under fp16's 2^15, and an
// element under 2^-14, whose hi the matrix units flush, is under 2^-27 of the bound: the states are
// split without hi's flush (split_state). The exponent for a bound > 0 (else 0), within +-60.
int state_exponent(float bound) {
  if (!(bound > 0.0)) return 0;
  return clamp(140 - max(int(floatBitsToUint(bound) >> 23u) & 0xFF, 1), -60, 60);  // 127 - biased + 13
}
// split() without hi's flush below fp16's smallest normal, for the states (state_exponent).
void split_state(F32M x, out F16M hi, out F16M lo) {
  F32M h = x;
  for (int e = 0; e < h.length(); ++e) h[e] = uintBitsToFloat((floatBitsToUint(x[e]) + 0x1000u) & 0xFFFFE000u);
  hi = F16M(h);
  lo = FAST ? F16M(0.0) : F16M((x - h) * LO);
}
// The smallest x over the workgroup, through row_part, after the passes' loops. Every invocation
// must call it: it has barriers.
float workgroup_min_after(float x, uint sg, uint lane) {
  barrier();  // the loops' readers of row_part are done
  if (lane == 0u && sg < NSG) row_part[sg] = x;
  barrier();
  [[unroll]] for (uint g = 0u; g < NSG; ++g) x = min(x, row_part[g]);
  return x;
}

// One fetcher's share of a chunk's operators.
struct Operators {
  vec4 k[RPI], q[RPI];  // rows i = f / 32 + ROW_STEP e, elements 4 (f % 32) .. of k^, q^
  vec2 lgi[RPI], lgam;  // lg (hi, lo) of those rows, and of the chunk's last row (log Gamma)
  int eqk, ep;         // the chunk's exponents (chunk_prep_fwd)
#ifdef DSTATE_STAGE
  float bei[RPI];      // beta of those rows
#endif
  vec4 p;              // P: row f / 4, columns 4 (f % 4) .. (fetchers 0 .. 63)
  vec4 t;              // T, likewise
#ifndef DSTATE_STAGE
  vec4 be;             // beta of T's columns 4 (f % 4) .. (T diag(beta) is made as it is staged: made
                       // in the fetch, the two fetching subgroups waited there for the loads mid-step)
#endif
};

// A chunk's scalars of its operators (for the subgroups that take no share of them).
struct OperatorScalars {
  vec2 lgam;  // lg (hi, lo) of the chunk's last row (log Gamma)
  int eqk, ep;
};
OperatorScalars scalars_of(Operators f) { return OperatorScalars(f.lgam, f.eqk, f.ep); }

// Operators of zeros (what an invocation that fetches none holds).
Operators no_operators() {
  Operators f;
  [[unroll]] for (uint e = 0u; e < RPI; ++e) {
    f.k[e] = vec4(0.0); f.q[e] = vec4(0.0); f.lgi[e] = vec2(0.0);
#ifdef DSTATE_STAGE
    f.bei[e] = 0.0;
#endif
  }
  f.lgam = vec2(0.0); f.eqk = 0; f.ep = 0; f.p = vec4(0.0); f.t = vec4(0.0);
#ifndef DSTATE_STAGE
  f.be = vec4(0.0);
#endif
  return f;
}

// Fetcher `tid`'s share (tid < OPERATOR_FETCHERS).
Operators fetch_operators(Chunk k, uint tid) {
  Operators f;
  [[unroll]] for (uint e = 0u; e < RPI; ++e) {
    const uint i = tid / 32u + ROW_STEP * e, r4 = tid % 32u;
    f.k[e] = vec4(0.0); f.q[e] = vec4(0.0);
    f.lgi[e] = chunk_lg(k, i);
#ifdef DSTATE_STAGE
    f.bei[e] = chunk_beta(k, i);
#endif
    if (i < k.L) {
      const uint bt = k.b * pc.t + k.t0 + i;
      f.k[e] = qkn4[qk_at(QK_K, bt, k.ko) / 4u + r4];
      f.q[e] = qkn4[qk_at(QK_Q, bt, k.ko) / 4u + r4];
    }
  }
  f.lgam = chunk_lg(k, CH - 1u);
  const uint nch = (pc.t + CH - 1u) / CH;
  f.eqk = int(eqkb[(k.b * pc.nk + k.ko) * nch + k.c]);
  f.ep = int(epb[(k.b * pc.nv + k.h) * nch + k.c]);
  f.p = vec4(0.0);
  f.t = vec4(0.0);
#ifndef DSTATE_STAGE
  f.be = vec4(0.0);
#endif
  if (tid < 64u && tid / 4u < k.L) {
    f.p = p4[head_row(k, tid / 4u) * (CH / 4u) + tid % 4u];
    f.t = t4[head_row(k, tid / 4u) * (CH / 4u) + tid % 4u];
#ifndef DSTATE_STAGE
    [[unroll]] for (uint l = 0u; l < 4u; ++l) f.be[l] = chunk_beta(k, 4u * (tid % 4u) + l);
#endif
  }
  return f;
}

// Staging in two parts, for a fetcher that holds its share in registers a step: split into fp16
// pairs as soon as its loads are in (prepare_operators), stored between the barriers
// (store_operators).
struct SplitOperators {
  uvec2 kh[RPI], kl[RPI], qh[RPI], ql[RPI], xh[RPI], xl[RPI];  // rows as Operators' k, q
  uvec2 ph, pl, th, tl;
};
SplitOperators no_split_operators() {
  SplitOperators s;
  [[unroll]] for (uint e = 0u; e < RPI; ++e) {
    s.kh[e] = uvec2(0u); s.kl[e] = uvec2(0u); s.qh[e] = uvec2(0u);
    s.ql[e] = uvec2(0u); s.xh[e] = uvec2(0u); s.xl[e] = uvec2(0u);
  }
  s.ph = uvec2(0u); s.pl = uvec2(0u); s.th = uvec2(0u); s.tl = uvec2(0u);
  return s;
}
SplitOperators prepare_operators(Operators f) {
  SplitOperators s = no_split_operators();
  const float sq = pow2(f.eqk);
  [[unroll]] for (uint e = 0u; e < RPI; ++e) {
    const float g_i = sq * exp(f.lgi[e].x + f.lgi[e].y);
    PUT_SPLIT4_TO(s.kh[e], s.kl[e], (sq * exp(lg_diff(f.lgam.x, f.lgam.y, f.lgi[e].x, f.lgi[e].y))) * f.k[e])
    PUT_SPLIT4_TO(s.qh[e], s.ql[e], g_i * f.q[e])
#ifdef DSTATE_STAGE
    PUT_SPLIT4_TO(s.xh[e], s.xl[e], (-f.bei[e] * g_i) * f.k[e])
#else
    PUT_SPLIT4_TO(s.xh[e], s.xl[e], -g_i * f.k[e])
#endif
  }
  PUT_SPLIT4_RIGHT_TO(s.ph, s.pl, f.p * pow2(f.ep))
#ifdef DSTATE_STAGE
  PUT_SPLIT4_RIGHT_TO(s.th, s.tl, f.t)
#else
  PUT_SPLIT4_RIGHT_TO(s.th, s.tl, f.t * f.be)
#endif
  return s;
}
void store_operators(SplitOperators s, uint tid) {
  [[unroll]] for (uint e = 0u; e < RPI; ++e) {
    const uint at = (tid / 32u + ROW_STEP * e) * DP + tid % 32u;
    kh[at] = s.kh[e]; qh[at] = s.qh[e]; xh[at] = s.xh[e];
    if (!FAST) { kl[at] = s.kl[e]; ql[at] = s.ql[e]; xl[at] = s.xl[e]; }
  }
  if (tid < 64u) {
    const uint at = (tid / 4u) * PP + tid % 4u;
    ph[at] = s.ph; th[at] = s.th;
    pl[at] = s.pl; tl[at] = s.tl;
  }
}

// Stages K~, Q~, -diag(beta gamma) K or -K^, P and T or T diag(beta), split into fp16 pairs: fetcher
// tid's share. Between two workgroup barriers.
void stage_operators(Operators f, uint tid) { store_operators(prepare_operators(f), tid); }
