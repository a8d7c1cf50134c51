// The l2-norm backward of one (b, t, key head), shared by qk_bwd and qk_bwd2: D invocations, thread
// `tid` holds element tid of the summed dq^, dk^.
// Needs bindings qkn ([2][B, T, nk, D]: q^, k^) and nq ([2][B, T, nk]: sum q^2 + 1e-6, sum k^2 + 1e-6).
//
//   x^ = x / n,  n = sqrt(sum x^2 + 1e-6) (times sqrt(D) for q)  =>  dx = (dx^ - x^ <dx^, x^> s) / n
// with s = 1 for k and D for q (x = n x^, so <dx^, x> = n <dx^, x^>): from q^ and k^ alone, which
// is all the conv keeps of q and k.
// With L2_SUBGROUP_SUMS (qk_bwd2: its families need subgroup arithmetic anyway) the two sums are
// workgroup_sum.glsl's (included before); else a tree in `red`, 2*D shared floats (qk_bwd, the
// per-head fallback, asks nothing of subgroups).
void l2_backward(uint tid, uint idx, float dq, float dk, out float dq_raw, out float dk_raw) {
  const uint n = pc.nb * pc.t * pc.nk;
  const float qh = qkn[idx * D + tid], kh = qkn[(n + idx) * D + tid];
#ifdef L2_SUBGROUP_SUMS
  const vec2 dots = workgroup_sum(vec2(dq * qh, dk * kh));  // <dq^, q^>, <dk^, k^>
#else
  red[tid] = dq * qh;
  red[D + tid] = dk * kh;
  barrier();
  for (uint s = D / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      red[tid] += red[tid + s];
      red[D + tid] += red[D + tid + s];
    }
    barrier();
  }
  const vec2 dots = vec2(red[0], red[D]);
#endif
  dq_raw = (dq - float(D) * qh * dots.x) / (sqrt(nq[idx]) * sqrt(float(D)));
  dk_raw = (dk - kh * dots.y) / sqrt(nq[n + idx]);
}
