#version 450
// The interop test's own compute work: dst[i] = src[i] for n floats, both in one buffer.
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Buf { float data[]; };
layout(push_constant) uniform Push {
  uint src;  // first element of the source
  uint dst;  // first element of the destination
  uint n;
} pc;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i < pc.n) data[pc.dst + i] = data[pc.src + i];
}
