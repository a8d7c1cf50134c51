// The l2-norm backward of one (b, t, key head), shared by qk_bwd and qk_bwd2: D invocations, thread
// `tid` holds element tid of q, k (conv output) and of the summed dq^, dk^; `red` is 2*D shared floats.
// Needs bindings qkn ([2][B, T, nk, D]) and nq ([2][B, T, nk]).

// Element tid of q and k of (b, t, key head) idx, made back from q^, k^ and their norms (the conv
// stores no more of them).
void l2_inputs(uint tid, uint idx, out float q, out float k) {
  const uint n = pc.nb * pc.t * pc.nk;
  q = qkn[idx * D + tid] * (sqrt(nq[idx]) * sqrt(float(D)));
  k = qkn[(n + idx) * D + tid] * sqrt(nq[n + idx]);
}
//   x^ = x / n  with n = sqrt(sum x^2 + 1e-6) (times sqrt(D) for q)  =>  dx = dx^/n - x <dx^, x> / (n (sum x^2 + 1e-6))
void l2_backward(uint tid, uint idx, float q, float k, float dq, float dk, out float dq_raw, out float dk_raw) {
  red[tid] = dq * q;
  red[D + tid] = dk * k;
  barrier();
  for (uint s = D / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      red[tid] += red[tid + s];
      red[D + tid] += red[D + tid + s];
    }
    barrier();
  }
  const uint n = pc.nb * pc.t * pc.nk;
  const float nq2 = nq[idx];
  const float nk2 = nq[n + idx];
  const float invq = 1.0 / (sqrt(nq2) * sqrt(float(D)));
  const float invk = 1.0 / sqrt(nk2);
  dq_raw = invq * dq - q * red[0] * invq / nq2;
  dk_raw = invk * dk - k * red[D] * invk / nk2;
}
