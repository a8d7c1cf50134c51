// The gated RMSNorm passes' layout (norm_fwd2, norm_bwd2): a workgroup works on NORM_ROWS rows of D
// columns at a time, D/4 invocations per row, each 4 neighbouring columns as a vec4 (whole-row vec4
// loads and stores, and a row's sum without a barrier where a subgroup holds whole rows).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#define NORM_ROWS 4u         // rows at a time (norm_fwd2's rows per workgroup: the host's kNormRows)
#define NORM_LANES (D / 4u)  // invocations per row
layout(local_size_x = 128) in;  // NORM_ROWS * NORM_LANES

shared float row_part[NORM_ROWS * NORM_LANES];

// Subgroups hold whole rows where they are NORM_LANES or more invocations (sizes are powers of two).
bool rows_in_subgroups() { return gl_SubgroupSize >= NORM_LANES; }

// The invocation's place in the workgroup, 0 .. 127: place / NORM_LANES its row, place % NORM_LANES
// its columns' quad. Where subgroups hold whole rows, a row is NORM_LANES lanes of one subgroup.
uint norm_place() {
  return rows_in_subgroups() ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : gl_LocalInvocationIndex;
}

// The sum of v over the invocations of row place / NORM_LANES, the same in each of them (each
// butterfly step adds the same two values in every lane of a pair). Every invocation of the
// workgroup calls it (it may meet at a barrier); a second call must follow a barrier where
// !rows_in_subgroups() (row_part is written again).
float row_sum(float v, uint place) {
  if (rows_in_subgroups()) {
    [[unroll]] for (uint m = 1u; m < NORM_LANES; m *= 2u) v += subgroupShuffleXor(v, m);
    return v;
  }
  row_part[place] = v;
  barrier();
  const uint r0 = place / NORM_LANES * NORM_LANES;
  float s = 0.0;
  for (uint i = 0u; i < NORM_LANES; ++i) s += row_part[r0 + i];
  return s;
}
