// Sum of one float (or two at once) over a workgroup of at most D invocations: subgroup sums, then
// the subgroups' partials through shared memory. Every invocation gets the total, and may call it
// again at once. (norm_fwd2, norm_bwd2, qk_bwd2 and its l2 backward)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared vec2 partial[D];  // one per subgroup (at most D subgroups)

vec2 workgroup_sum(vec2 v) {
  v = subgroupAdd(v);
  if (subgroupElect()) partial[gl_SubgroupID] = v;
  barrier();
  vec2 s = vec2(0.0);
  for (uint i = 0u; i < gl_NumSubgroups; ++i) s += partial[i];
  barrier();  // every invocation has read the partials before the next call writes them
  return s;
}
float workgroup_sum(float v) { return workgroup_sum(vec2(v, 0.0)).x; }
