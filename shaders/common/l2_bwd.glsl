// The l2-norm backward of one (b, t, key head), shared by qk_bwd and qk_bwd2:
//   x^ = x / n,  n = sqrt(sum x^2 + 1e-6) (times sqrt(D) for q)  =>  dx = (dx^ - x^ <dx^, x^> s) / n
// with s = 1 for k and D for q (x = n x^, so <dx^, x> = n <dx^, x^>): from q^ and k^ alone, which
// is all the conv keeps of q and k.
// One element's (dq, dk) from its dq^, dk^, q^, k^, the row's dots (<dq^, q^>, <dk^, k^>) and
// norms (nq's sum q^2 + 1e-6 and sum k^2 + 1e-6).
vec2 l2_backward(float dq, float dk, float qh, float kh, vec2 dots, vec2 norms) {
  return vec2((dq - float(D) * qh * dots.x) / (sqrt(norms.x) * sqrt(float(D))), (dk - kh * dots.y) / sqrt(norms.y));
}
