#version 460
// Device ceiling: fp32 FMA throughput. Eight independent chains per thread hide the FMA latency;
// the result is stored so that the compiler keeps the work.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(push_constant) uniform Push { uint iters; } pc;  // 8 * 2 * iters flop per thread
layout(set = 0, binding = 0) writeonly buffer Sink { float sink[]; };

void main() {
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint i = g * 256u + gl_LocalInvocationIndex;
  const float a = 0.999 + 1e-7 * float(i & 7u), b = 1e-4;
  float x[8];
  [[unroll]] for (uint k = 0u; k < 8u; ++k) x[k] = float(i + k) * 1e-3;
  for (uint it = 0u; it < pc.iters; ++it) {
    [[unroll]] for (uint k = 0u; k < 8u; ++k) x[k] = fma(x[k], a, b);
  }
  sink[i] = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}
