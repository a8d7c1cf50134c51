// The column-split backward's layout (rec_bwd2; rec_fwd2 gives each lane 4 columns, see its header).
// Contract: the host builds these pipelines
// with a required subgroup size SG (a power of two, 8 <= SG <= 64) and full subgroups, so a workgroup
// of 256 invocations is 256/SG whole subgroups.
//
// A workgroup owns COLS = 32 consecutive state columns of one (window, head); NWG = 4 workgroups per
// head. Eight consecutive lanes of a subgroup share a column, each holding RPL = 16 consecutive rows
// in registers: lane bits 0-2 = row group rg (rows rg*16 .. rg*16+15), the higher lane bits = the
// column within the subgroup. Columns evolve independently in the forward (kv_j and u_j depend on
// column j only), so the recurrence needs no shared memory; sums over the rows of a column are three
// shuffles. Sums over columns (dq^, dk^ in the backward) leave as per-workgroup partials.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(constant_id = 0) const uint SG = 32;  // subgroup size

#define LPC 8u    // lanes per column
#define RPL 16u   // rows per lane
#define COLS 32u  // columns per workgroup
#define NWG 4u    // workgroups per (window, head)
#define WG_SIZE 256u

uint column_in_workgroup() { return gl_SubgroupID * (SG / LPC) + (gl_SubgroupInvocationID >> 3u); }
uint row_group() { return gl_SubgroupInvocationID & 7u; }

// Sum over the eight lanes of a column; every lane of the column gets it.
float column_sum(float v) {
  v += subgroupShuffleXor(v, 1u);
  v += subgroupShuffleXor(v, 2u);
  return v + subgroupShuffleXor(v, 4u);
}
