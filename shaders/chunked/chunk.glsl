// The chunked backward's conventions (chunk_prep, chunk_dstate, chunk_values, chunk_grads).
//
// A window's T tokens are cut into chunks of CH tokens (the checkpoint interval, a specialization
// constant): chunk c covers tokens t0 = c*CH .. t0+L-1, L = min(CH, T - t0). Rows i >= L of a chunk
// are padding: beta = 0, log g = 0 and every operand row zero, so they contribute nothing.
// Within a chunk lg[i] = sum_{m <= i} log g_m (gamma_i = exp(lg[i])), and lg[CH-1] is the log of
// Gamma, the whole chunk's decay. lg is kept as a pair of floats, hi + lo (lg[], lgl[]; lgc holds
// [2][B, T, nv]): a strong decay (log g down to -2e7 at A = 1e6) makes lg large, and the decays
// between later rows, exp(lg_i - lg_j), need its difference to fp32's accuracy (lg_diff). With S0 the state at the chunk's start (a checkpoint):
//   A[i][j] = beta_i exp(lg_i - lg_j) <k_i, k_j>  (j < i),   T = (I + A)^-1
//   W = T diag(beta gamma) K,   U = T diag(beta) V - W S0        (the chunk's u rows, [CH x D])
//   P[i][j] = exp(lg_i - lg_j) <q_i, k_j>  (j <= i)
//   O = diag(gamma) Q S0 + P U,   S_end = Gamma S0 + K~^T U,   K~ = diag(Gamma / gamma) K
// Per-token tensors of the chunked backward are [B, T, nv, X]: row (b*T + t)*nv + h. Its gradient
// passes leave one record per row for qk_bwd2: RW words, dq^ 0..127, dk^ 128..255, d(log g) 256,
// dbeta 257.
layout(constant_id = 1) const uint CH = 32;  // chunk length, 1 .. 32
#define RW 258u

#ifndef CHUNK_NO_SHARED_GATES  // (defined by the passes that keep their gates elsewhere)
shared float lg[CH], lgl[CH], bet[CH];
// lg_i - lg_j and lg_i of the chunk in lg[], lgl[]
float lgd(uint i, uint j) { return lg_diff(lg[i], lgl[i], lg[j], lgl[j]); }
float lg_of(uint i) { return lg[i] + lgl[i]; }
#endif

struct Chunk {
  uint b, h, ko;  // window, value head, its key head
  uint c, t0, L;  // chunk index, first token, tokens in the chunk
};

Chunk chunk_of(uint b, uint h, uint c) {
  Chunk k;
  k.b = b;
  k.h = h;
  k.ko = h / (pc.nv / pc.nk);
  k.c = c;
  k.t0 = c * CH;
  k.L = min(CH, pc.t - k.t0);
  return k;
}

// Row of token i of the chunk in a [B, T, nv, X] tensor (times X), and in [B, T, nv*D] tensors (times D).
uint head_row(Chunk k, uint i) { return (k.b * pc.t + k.t0 + i) * pc.nv + k.h; }
#ifndef CHUNK_NO_QKN  // (defined by the passes with no q^, k^ binding)
// q^ and k^ of token i of the chunk ([2][B, T, nk, D]), element r.
float q_at(Chunk k, uint i, uint r) { return qkn[qk_at(QK_Q, k.b * pc.t + k.t0 + i, k.ko) + r]; }
float k_at(Chunk k, uint i, uint r) { return qkn[qk_at(QK_K, k.b * pc.t + k.t0 + i, k.ko) + r]; }
#endif

#ifdef CHUNK_GATES_FROM_SCAN
// Fills bet[] and lg[] (the inclusive scan of log g) for the chunk from the gates; padding rows get
// 0 (chunk_prep, which stores lg for the other passes). Every invocation must call it (barriers);
// ends with a barrier. Needs bindings `gates` ([3][B, T, nv]: g, beta, a + dt_bias) and `a_log`.
void load_chunk_gates(Chunk k, uint tid) {
  const uint n = pc.nb * pc.t * pc.nv;  // gates is [3][B, T, nv]
  if (tid < CH) {
    float l = 0.0, be = 0.0;
    if (tid < k.L) {
      const uint at = (k.b * pc.t + k.t0 + tid) * pc.nv + k.h;
      be = gates[n + at];
      l = log_gate(a_log[k.h], gates[2u * n + at]);
    }
    lg[tid] = l;
    bet[tid] = be;
  }
  barrier();
  if (tid == 0u) {  // the scan, serially: CH adds cost less than a barrier per step of a parallel one
    float hi = 0.0, lo = 0.0;
    for (uint i = 0u; i < CH; ++i) {
      add_two(hi, lo, lg[i]);
      lg[i] = hi;
      lgl[i] = lo;
    }
  }
  barrier();
}
#else
// lg of row i of the chunk as chunk_prep stored it ([2][B, T, nv]: hi, lo), (hi, lo); padding rows
// repeat the last. Needs a binding `lgc`.
vec2 chunk_lg(Chunk k, uint i) {
  const uint at = (k.b * pc.t + k.t0 + min(i, k.L - 1u)) * pc.nv + k.h;
  return vec2(lgc[at], lgc[pc.nb * pc.t * pc.nv + at]);
}
#ifndef CHUNK_NO_GATES  // (defined by the passes with no gates binding)
// beta of row i of the chunk from gates ([3][B, T, nv]: g, beta, a + dt_bias); padding rows 0.
float chunk_beta(Chunk k, uint i) { return i < k.L ? gates[pc.nb * pc.t * pc.nv + head_row(k, i)] : 0.0; }
#endif
#endif
