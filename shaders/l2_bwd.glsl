// The l2-norm backward of one (b, t, key head), shared by qk_bwd and qk_bwd2: D invocations, thread
// `tid` holds element tid of the summed dq^, dk^; `red` is 2*D shared floats.
// Needs bindings qkn ([2][B, T, nk, D]: q^, k^) and nq ([2][B, T, nk]: sum q^2 + 1e-6, sum k^2 + 1e-6).
//
//   x^ = x / n,  n = sqrt(sum x^2 + 1e-6) (times sqrt(D) for q)  =>  dx = (dx^ - x^ <dx^, x^> s) / n
// with s = 1 for k and D for q (x = n x^, so <dx^, x> = n <dx^, x^>): from q^ and k^ alone, which
// is all the conv keeps of q and k.
void l2_backward(uint tid, uint idx, float dq, float dk, out float dq_raw, out float dk_raw) {
  const uint n = pc.nb * pc.t * pc.nk;
  const float qh = qkn[idx * D + tid], kh = qkn[(n + idx) * D + tid];
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
  dq_raw = (dq - float(D) * qh * red[0]) / (sqrt(nq[idx]) * sqrt(float(D)));
  dk_raw = (dk - kh * red[D]) / sqrt(nq[n + idx]);
}
