#version 460
// Chunked backward on the matrix units, pass 4 of 4: chunk_grads.comp's gradients of a chunk's
// inputs (the forms are written there), with every product over the chunk's rows on the matrix
// units (mma.glsl). One workgroup of 8 subgroups per (window b, v-head h, chunk c), CH = 16;
// subgroup s owns the key dims and the value dims 16 s .. 16 s + 15, the columns of its tiles.
//
// The chunk's 16 x 16 matrices are made once per workgroup on the CUDA cores: G = K K^T and dW K^T
// (each subgroup's share over its 16 key dims on the matrix units, added in shared memory), M, dT,
// dA = -T^T dT T^T and F = dA * decay. They are then staged as the right factors [m][i] of the
// products, fp16 pairs:
//   T,  T diag(beta),  T diag(gamma),  T diag(beta gamma),  M^T,  M,  E1 = [beta_i F_im],  E2 = [beta_m F_mi]
// and each subgroup makes its columns of every [CH x D] result, transposed ([column][i]) so that its
// operands (loaded [i][column] and read column-major) stay on the left:
//   Yv^T  = dU^T T                      dv^T = dU^T T diag(beta)      (dv leaves in dy's v part)
//   dQ^T  = X1g^T + K^T M^T              (M with its diagonal)
//   dM^T  = X2g^T + Q^T M + K^T E2       dK^T = dM^T + dW^T T diag(beta gamma) + K^T E1
// where X1g = gamma X1 and X2g = (Gamma / gamma) X2 are what chunk_values_mma left in the record.
// The row sums of d(log g) and dbeta come from element-wise products of tiles of one layout:
//   dlg_i  = sum_c [q o dQ + k o (dK - 2 dM)]_ic   (+ Gamma <dS, S0> + <K, X2g> at i = CH-1)
//   dbeta_i = sum_c [v o Yv + k o (dW^T T diag(gamma))^T]_ic + sum_j F_ij G_ij
// (dK - 2 dM = dK+ - dK- of chunk_grads.comp: the diagonal of M cancels in it). The record's dq^ and
// dk^ are written once, whole.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "mma.glsl"
layout(local_size_x = 256) in;  // 8 subgroups of 32 (the host requires exactly 32)
layout(constant_id = 0) const uint SG = 32;

#include "chunk_grads.glsl"

// vec4 (and vec2) views of chunk_grads.glsl's bindings.
layout(set = 0, binding = 0) readonly buffer Qkn4 { vec4 qkn4[]; };  // [2][B, T, nk, D/4] q^, k^
layout(set = 0, binding = 3) readonly buffer Y4 { vec4 y4[]; };      // [B, T, C/4]
layout(set = 0, binding = 6) readonly buffer Du4 { vec4 du4[]; };    // [B, T, nv*D/4]
layout(set = 0, binding = 7) readonly buffer Wm4 { vec4 dw4[]; };    // [B, T, nv, D/4]
layout(set = 0, binding = 11) buffer Rec2 { vec2 rec2[]; };          // [B, T, nv][RW / 2]

// The right factors, [coefficient][m][i] as fp16 pairs in uvec2s (4 halves), rows PP uvec2s apart
// (48 bytes: the rows of one matrix load phase fall in distinct banks).
#define PP 6u
#define CF_T 0u
#define CF_TB 1u
#define CF_TG 2u
#define CF_TBG 3u
#define CF_MT 4u
#define CF_M 5u
#define CF_E1 6u
#define CF_E2 7u
shared uvec2 cf_hi[8u * 16u * PP], cf_lo[8u * 16u * PP];
// The chunk's fp32 16 x 16 matrices [row][column], 256 floats each.
#define MX_T 0u   // T [m][i]
#define MX_G 1u   // G = K K^T
#define MX_M 2u   // M [i][j] (j <= i)
#define MX_DT 3u  // dT; then F
#define MX_Z 4u   // dT T^T
shared float mats[5u * 256u];
shared float tiles[8u * 512u];   // per subgroup two fp32 16 x 16 tiles (first: the key-dim partials of G, dW K^T)
shared float rowp[8u * 2u * 16u];  // per subgroup: its share of row i's dlg and dbeta sums, [sg][2][i]
shared float extra_p[8u];          // per subgroup: its share of <K, X2g>
shared float dbeta_a[16u], dlg_s[16u];

#define MAT(w, a, b) mats[(w) * 256u + (a) * 16u + (b)]
vec4 mat_row4(uint w, uint a, uint q) { return vec4(MAT(w, a, 4u * q), MAT(w, a, 4u * q + 1u), MAT(w, a, 4u * q + 2u), MAT(w, a, 4u * q + 3u)); }
vec4 mat_col4(uint w, uint b, uint q) { return vec4(MAT(w, 4u * q, b), MAT(w, 4u * q + 1u, b), MAT(w, 4u * q + 2u, b), MAT(w, 4u * q + 3u, b)); }

// Item n of the staging of the right factors: factor n / 64 (CF_*), row m = (n / 4) % 16,
// columns i = 4 q .. 4 q + 3 with q = n % 4.
void stage_coefficient(uint n) {
  const uint c = n / 64u, m = (n / 4u) % 16u, q = n % 4u;
  vec4 x;
  if (c <= CF_TBG) {
    const vec4 be = vec4(bet[4u * q], bet[4u * q + 1u], bet[4u * q + 2u], bet[4u * q + 3u]);
    const vec4 ga = exp(vec4(lg[4u * q], lg[4u * q + 1u], lg[4u * q + 2u], lg[4u * q + 3u]));
    x = mat_row4(MX_T, m, q);
    if (c == CF_TB) x *= be;
    else if (c == CF_TG) x *= ga;
    else if (c == CF_TBG) x *= be * ga;
  } else if (c == CF_MT) {
    x = mat_col4(MX_M, m, q);  // [m][i] = M[i][m]
  } else if (c == CF_M) {
    x = mat_row4(MX_M, m, q);
  } else if (c == CF_E1) {
    const vec4 be = vec4(bet[4u * q], bet[4u * q + 1u], bet[4u * q + 2u], bet[4u * q + 3u]);
    x = be * mat_col4(MX_DT, m, q);  // beta_i F[i][m]
  } else {
    x = bet[m] * mat_row4(MX_DT, m, q);  // beta_m F[m][i]
  }
  PUT_SPLIT4(cf_hi, cf_lo, (c * 16u + m) * PP + q, x)
}

// acc += a C for coefficient c (a: a split operand [column][m]).
void mma_coef(inout F32M acc, F16M ah, F16M al, uint c) {
  F16M bh, bl;
  coopMatLoadNV(bh, cf_hi, c * 16u * PP, PP, false);
  coopMatLoadNV(bl, cf_lo, c * 16u * PP, PP, false);
  mma_split_into(acc, ah, al, bh, bl);
}

// The subgroup's tile at t_at: the lane's two vec4 of a [i][column] tile in, a matrix out (read
// row-major: [i][column], or column-major: its transpose [column][i]).
void put_tile2(uint t_at, uint lane, vec4 x[2]) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint at = t_at + tile_lane(lane) + 128u * e;
    tiles[at] = x[e].x; tiles[at + 1u] = x[e].y; tiles[at + 2u] = x[e].z; tiles[at + 3u] = x[e].w;
  }
}
// The subgroup's share of row sums of x^T [column][i] over its 16 columns into rowp[sg][w][i].
void row_share(F32M x, uint t_at, uint lane, uint sg, uint w) {
  coopMatStoreNV(x, tiles, t_at, 16u, false);  // [column][i]
  TILE_SYNC()
  if (lane < 16u) {
    float s = 0.0;
    [[unroll]] for (uint c = 0u; c < 16u; ++c) s += tiles[t_at + c * 16u + lane];
    rowp[(sg * 2u + w) * 16u + lane] = s;
  }
  subgroupBarrier();
}

// The lane's share (tile_row, tile_lane) of a subgroup's operand tile [i][column] at its 16 columns
// from col0; rows past the chunk are zero.
#define OP_K 0u   // k^
#define OP_Q 1u   // q^
#define OP_W 2u   // dW
#define OP_U 3u   // dU
#define OP_V 4u   // v
#define OP_X1 5u  // the record's dq^ so far, X1g
#define OP_X2 6u  // the record's dk^ so far, X2g
void fetch_operand(Chunk k, uint lane, uint col0, uint which, out vec4 x[2]) {
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint i = tile_row(lane, e), c4 = (col0 + 4u * (lane % 4u)) / 4u;
    const uint bt = k.b * pc.t + k.t0 + i, row = head_row(k, i), r2 = (row * RW + 4u * c4) / 2u;  // RW even
    x[e] = vec4(0.0);
    if (i < k.L) {
      if (which == OP_K) x[e] = qkn4[((pc.nb * pc.t + bt) * pc.nk + k.ko) * (D / 4u) + c4];
      else if (which == OP_Q) x[e] = qkn4[(bt * pc.nk + k.ko) * (D / 4u) + c4];
      else if (which == OP_W) x[e] = dw4[row * (D / 4u) + c4];
      else if (which == OP_U) x[e] = du4[row * (D / 4u) + c4];
      else if (which == OP_V) x[e] = y4[(bt * pc.c_dim + 2u * pc.nk * D + k.h * D) / 4u + c4];
      else if (which == OP_X1) x[e] = vec4(rec2[r2], rec2[r2 + 1u]);
      else x[e] = vec4(rec2[r2 + D / 2u], rec2[r2 + D / 2u + 1u]);
    }
  }
}

float dot_tiles(F32M x, F32M y) {  // this lane's share of sum x o y
  float s = 0.0;
  for (int e = 0; e < x.length(); ++e) s = fma(x[e], y[e], s);
  return s;
}
F32M times(F32M x, F32M y) {  // element-wise (one layout: F32M's)
  F32M z = x;
  for (int e = 0; e < z.length(); ++e) z[e] = x[e] * y[e];
  return z;
}

void main() {
  const uint nch = (pc.t + CH - 1u) / CH;
  const uint wg = linear_group();  // (b*nv + h)*nch + c
  if (wg >= pc.nb * pc.nv * nch) return;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
  const uint bh = wg / nch;
  const Chunk k = chunk_of(bh / pc.nv, bh % pc.nv, wg % nch);
  const uint col0 = 16u * sg, t0 = sg * 512u, t1 = t0 + 256u;  // the subgroup's columns and tiles

  // The lane's share (tile_row, tile_lane) of the subgroup's operand tiles, all loaded at once: one
  // workgroup per SM either way (above 128 registers), so registers are free and latency is not.
  vec4 xk[2], xw[2], xq[2], xu[2], xv[2], xr[2], xt[2];
  fetch_operand(k, lane, col0, OP_K, xk);
  fetch_operand(k, lane, col0, OP_W, xw);
  fetch_operand(k, lane, col0, OP_U, xu);
  fetch_operand(k, lane, col0, OP_V, xv);
  fetch_operand(k, lane, col0, OP_Q, xq);
  fetch_operand(k, lane, col0, OP_X2, xt);
  fetch_operand(k, lane, col0, OP_X1, xr);
  // Invocation (pi, pj) = (tid / 16, tid % 16): T[pi][pj] and the pair dots <dO_pi, u_pj>, <dU_pi, v_pj>.
  const uint pi = tid / 16u, pj = tid % 16u;
  const float t_ij = pi < k.L ? t_in[head_row(k, pi) * CH + pj] : 0.0;
  const float dou = pairs[(wg * 2u) * 256u + tid], duv = pairs[(wg * 2u + 1u) * 256u + tid];
  const vec2 row = fetch_chunk_row(k, tid);  // lg, beta of row tid (staged after the key-dim products)

  // ---- the key-dim pair dots, the subgroup's share: K_c K_c^T and dW_c K_c^T [i][j] ----
  F32M kt;                  // K^T [column][i], for the element-wise products
  F16M kth, ktl, wth, wtl;  // K^T, dW^T, split: left operands of the products below
  {
    put_tile2(t0, lane, xk);
    put_tile2(t1, lane, xw);
    TILE_SYNC()
    F32M x;
    F16M ah, al;
    coopMatLoadNV(kt, tiles, t0, 16u, true);
    split(kt, kth, ktl);
    coopMatLoadNV(x, tiles, t1, 16u, true);
    split(x, wth, wtl);
    F32M g = F32M(0.0), dwk = F32M(0.0);
    coopMatLoadNV(x, tiles, t0, 16u, false);
    split(x, ah, al);
    mma_split_into(g, ah, al, kth, ktl);
    coopMatLoadNV(x, tiles, t1, 16u, false);
    split(x, ah, al);
    mma_split_into(dwk, ah, al, kth, ktl);
    subgroupBarrier();  // every lane's loads of the tiles are done
    coopMatStoreNV(g, tiles, t0, 16u, false);
    coopMatStoreNV(dwk, tiles, t1, 16u, false);
  }
  put_chunk_rows(row, tid);  // lg, bet; its barrier also publishes the partials

  // ---- the chunk's 16 x 16 matrices: T, G, M, dT ----
  {
    float g = 0.0, dwk = 0.0;
    [[unroll]] for (uint s = 0u; s < 8u; ++s) {
      g += tiles[s * 512u + tid];
      dwk += tiles[s * 512u + 256u + tid];
    }
    float m = 0.0, dt = 0.0;
    const bool live = pi < k.L && pj < k.L;
    if (live) {
      dt = bet[pj] * (duv + exp(lg[pj]) * dwk);
      if (pj <= pi) m = exp(lg[pi] - lg[pj]) * dou;
    }
    MAT(MX_T, pi, pj) = t_ij;
    MAT(MX_G, pi, pj) = live ? g : 0.0;
    MAT(MX_M, pi, pj) = m;
    MAT(MX_DT, pi, pj) = dt;
  }
  barrier();
  // ---- Z = dT T^T; T's and M's coefficients ----
  {
    float z = 0.0;
    [[unroll]] for (uint m = 0u; m < 16u; ++m) z = fma(MAT(MX_DT, pi, m), MAT(MX_T, pj, m), z);
    MAT(MX_Z, pi, pj) = z;
    stage_coefficient(tid);                           // T, T diag(beta), T diag(gamma), T diag(beta gamma)
    if (tid < 128u) stage_coefficient(256u + tid);    // M^T, M
  }
  barrier();
  // ---- F = -(T^T Z) * exp(lg_i - lg_j), strictly lower (dA's decay), into dT's place ----
  {
    float f = 0.0;
    if (pj < pi && pi < k.L) {
      [[unroll]] for (uint m = 0u; m < 16u; ++m) f = fma(MAT(MX_T, m, pi), MAT(MX_Z, m, pj), f);
      f = -f * exp(lg[pi] - lg[pj]);
    }
    MAT(MX_DT, pi, pj) = f;
  }
  barrier();
  if (tid < 128u) stage_coefficient(384u + tid);  // E1, E2
  if (tid < 16u) {
    float x = 0.0;
    for (uint j = 0u; j < tid; ++j) x = fma(MAT(MX_DT, tid, j), MAT(MX_G, tid, j), x);
    dbeta_a[tid] = x;
  }
  barrier();

  // ---- the subgroup's columns of the [CH x D] results, transposed ----
  const uint rows = k.L;
  F32M bsum, asum;  // the element-wise terms of dbeta and dlg
  {  // Yv^T = dU^T T, dv^T = dU^T T diag(beta)
    put_tile2(t0, lane, xu);
    put_tile2(t1, lane, xv);
    TILE_SYNC()
    F32M x, vt;
    F16M uh, ul;
    coopMatLoadNV(x, tiles, t0, 16u, true);
    split(x, uh, ul);
    coopMatLoadNV(vt, tiles, t1, 16u, true);
    subgroupBarrier();
    F32M y = F32M(0.0);
    mma_coef(y, uh, ul, CF_T);
    bsum = times(vt, y);
    y = F32M(0.0);
    mma_coef(y, uh, ul, CF_TB);
    STORE_TILE_T(y, t0, lane, rows, dy, (k.b * pc.t + k.t0 + i_) * pc.c_dim + 2u * pc.nk * D + k.h * D + col0, 1.0)
  }
  {  // (dW^T T diag(gamma)) for dbeta
    F32M y = F32M(0.0);
    mma_coef(y, wth, wtl, CF_TG);
    bsum = bsum + times(kt, y);
    row_share(bsum, t0, lane, sg, 1u);
  }
  float extra = tid == 0u ? sdot[wg] : 0.0;  // this invocation's share of dlg at CH-1
  {  // dM^T = X2g^T + Q^T M + K^T E2,  dK^T = dM^T + dW^T T diag(beta gamma) + K^T E1
    put_tile2(t0, lane, xq);
    put_tile2(t1, lane, xt);
    TILE_SYNC()
    F32M qt, dm;
    F16M qh, ql;
    coopMatLoadNV(qt, tiles, t0, 16u, true);
    split(qt, qh, ql);
    coopMatLoadNV(dm, tiles, t1, 16u, true);  // X2g^T
    subgroupBarrier();
    extra += dot_tiles(kt, dm);
    mma_coef(dm, qh, ql, CF_M);
    mma_coef(dm, kth, ktl, CF_E2);
    F32M dk = dm;
    mma_coef(dk, wth, wtl, CF_TBG);
    mma_coef(dk, kth, ktl, CF_E1);
    STORE_TILE_T(dk, t0, lane, rows, rec, head_row(k, i_) * RW + D + col0, 1.0)
    asum = times(kt, dk - dm * 2.0);
    // dQ^T = X1g^T + K^T M^T
    put_tile2(t1, lane, xr);
    TILE_SYNC()
    F32M dq;
    coopMatLoadNV(dq, tiles, t1, 16u, true);
    subgroupBarrier();
    mma_coef(dq, kth, ktl, CF_MT);
    STORE_TILE_T(dq, t0, lane, rows, rec, head_row(k, i_) * RW + col0, 1.0)
    asum = asum + times(qt, dq);
    row_share(asum, t0, lane, sg, 0u);
  }
  extra = subgroupAdd(extra);
  if (subgroupElect()) extra_p[sg] = extra;
  barrier();

  // ---- the rows: d(log g_m) = sum_{i >= m} dlg_i, dbeta ----
  if (tid < 16u) {
    float a = 0.0;
    if (tid < k.L)
      [[unroll]] for (uint s = 0u; s < 8u; ++s) a += rowp[s * 32u + tid];
    if (tid == CH - 1u)
      [[unroll]] for (uint s = 0u; s < 8u; ++s) a += extra_p[s];
    dlg_s[tid] = a;
  }
  barrier();
  if (tid < k.L) {
    float dlogg = 0.0, db = dbeta_a[tid];
    for (uint m = tid; m < CH; ++m) dlogg += dlg_s[m];
    [[unroll]] for (uint s = 0u; s < 8u; ++s) db += rowp[s * 32u + 16u + tid];
    const uint row = head_row(k, tid);
    rec[row * RW + 2u * D] = dlogg;
    rec[row * RW + 2u * D + 1u] = db;
  }
}
