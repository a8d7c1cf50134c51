// The right factors [m][i] of chunk_pair_bwd_mma's phase 2 products, which chunk_factors makes per
// chunk (its header has their forms), as mma.glsl's fp16 pairs: per chunk [factor][hi, lo][16 m][16 i],
// rows of 16 halves (4 uvec2), so that the matrix units load them straight from memory.
#define NCF 5u    // factors per chunk
#define CF_BG 0u  // diag(beta gamma)
#define CF_MT 1u  // M^T, its diagonal 0 (mdiag holds it)
#define CF_M 2u   // M, its diagonal 0
#define CF_E1 3u  // [beta_i F_im]
#define CF_E2 4u  // [beta_m F_mi]
#define FP 4u     // row stride (uvec2s)
// uvec2 index of row m of factor c's hi half, for chunk n = (b*nv + h)*nch + c; the lo half is 64
// further.
uint factor_at(uint n, uint c, uint m) { return (n * NCF + c) * 128u + m * FP; }
