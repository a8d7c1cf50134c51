// Sum of one float over a workgroup of at most D invocations: subgroup sums, then the subgroups'
// partials through shared memory. Every invocation gets the total. (norm_fwd2, norm_bwd2)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared float partial[D];  // one per subgroup (at most D subgroups)

float workgroup_sum(float v) {
  v = subgroupAdd(v);
  if (subgroupElect()) partial[gl_SubgroupID] = v;
  barrier();
  float s = 0.0;
  for (uint i = 0u; i < gl_NumSubgroups; ++i) s += partial[i];
  return s;
}
