#version 460
// Device ceiling: a vec4 copy (bytes read + bytes written over time = the copy bandwidth).
layout(local_size_x = 256) in;
layout(push_constant) uniform Push { uint n4; } pc;  // vec4 elements
layout(set = 0, binding = 0) readonly buffer Src { vec4 src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { vec4 dst[]; };

void main() {
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint i = g * 256u + gl_LocalInvocationIndex;
  if (i < pc.n4) dst[i] = src[i];
}
