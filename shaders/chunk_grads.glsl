// The chunked backward's last two passes (chunk_values.comp, chunk_grads.comp): their bindings (one
// list for both), the record layout, the row split of a workgroup and the staged operands.
// Needs common.glsl, a 256-invocation workgroup and the specialization constant SG.
layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer Lgc { float lgc[]; };      // [B, T, nv] lg (chunk_prep, or the forward's)
layout(set = 0, binding = 3) readonly buffer Y { float y[]; };          // [B, T, C]: v at 2*nk*D + h*D
layout(set = 0, binding = 4) readonly buffer Kv { float kv_in[]; };     // [B, T, nv*D] kv per step (tape);
                                                                        // the matrix units' passes: u (chunk_fwd_mma's tape)
layout(set = 0, binding = 5) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 6) readonly buffer Du { float du_in[]; };     // [B, T, nv*D] dU (chunk_dstate)
layout(set = 0, binding = 7) buffer Wm { float dw[]; };                 // [B, T, nv, D]: dW (chunk_values)
layout(set = 0, binding = 8) readonly buffer Tm { float t_in[]; };      // [B, T, nv, CH] T (chunk_prep, or the forward's)
layout(set = 0, binding = 9) readonly buffer Ck { float ck[]; };        // [B, nv, slots, D cols, D rows] S0
layout(set = 0, binding = 10) readonly buffer Dsc { float dsc[]; };     // [B, nv, slots, D cols, D rows] dS
layout(set = 0, binding = 11) buffer Rec { float rec[]; };              // [B, T, nv][RW] chunk_grads' records
layout(set = 0, binding = 12) writeonly buffer Dy { float dy[]; };      // [B, T, C]: writes the v part
layout(set = 0, binding = 13) buffer Pairs { float pairs[]; };          // [B, nv, nch][2][CH][CH] <dO_i, u_j>, <dU_i, v_j>
layout(set = 0, binding = 14) buffer Sdot { float sdot[]; };            // [B, nv, nch] Gamma <dS, S0>

#include "chunk.glsl"

#define RW 258u   // record words: dq^ 0..127, dk^ 128..255, d(log g) 256, dbeta 257
#define TILE 8u   // columns (value or key dims) staged per round of the D-long products
// Rows i of the chunk padded to CHP (a multiple of 8): invocation (r, half) owns rows
// half*HR .. half*HR + HR-1 of column r (HR a multiple of 4: vec4 reads of the [m][i] matrices), and
// invocation (pi, pj) = (tid / 16, tid % 16) the 2 x 2 block of (i, j) pairs (2 pi .. 2 pi + 1, 2 pj ..).
const uint CHP = (CH + 7u) / 8u * 8u;
const uint HR = CHP / 2u;
const uint HR4 = HR / 4u;
const uint NSR = D / SG;  // subgroups per row half

// The chunk's lg and beta into lg[], bet[] (padding rows: beta 0). Ends with a barrier.
void load_chunk_rows(Chunk k, uint tid) {
  if (tid < CH) {
    lg[tid] = chunk_lg(k, tid);
    bet[tid] = tid < k.L ? gates[pc.nb * pc.t * pc.nv + head_row(k, tid)] : 0.0;  // gates: [3][B, T, nv]
  }
  barrier();
}

float u_at(Chunk k, uint i, uint col) {  // u = beta (v - kv), as the forward made it
  const uint bt = k.b * pc.t + k.t0 + i;
  return bet[i] * (y[bt * pc.c_dim + 2u * pc.nk * D + k.h * D + col] - kv_in[(bt * pc.nv + k.h) * D + col]);
}
float v_at(Chunk k, uint i, uint col) { return y[(k.b * pc.t + k.t0 + i) * pc.c_dim + 2u * pc.nk * D + k.h * D + col]; }

// The staged operands: element e of a round is (operand, row i, column c0 + e % TILE), read along
// rows (coalesced) and stored [operand][column][row] (rows contiguous: vec4 reads of 4 rows).
// Each invocation holds PRE of a round's elements, loaded one round ahead (software pipelining).
#define PRE 4u  // 4 * TILE * CHP / 256 at CH = 32
uint staged_at(uint e) { return (e / (TILE * CHP) * TILE + e % TILE) * CHP + (e / TILE) % CHP; }

// Round c0 of the value-dim products: dO, dU, U, V.
float value_operand(Chunk k, uint c0, uint e) {
  const uint which = e / (TILE * CHP), i = (e / TILE) % CHP, col = c0 + e % TILE;
  if (i >= k.L) return 0.0;
  if (which == 0u) return do_in[head_row(k, i) * D + col];
  if (which == 1u) return du_in[head_row(k, i) * D + col];
  if (which == 2u) return u_at(k, i, col);
  return v_at(k, i, col);
}
// Round r0 of the key-dim products: k^, dW.
float key_operand(Chunk k, uint r0, uint e) {
  const uint which = e / (TILE * CHP), i = (e / TILE) % CHP, rr = r0 + e % TILE;
  if (i >= k.L) return 0.0;
  return which == 0u ? k_at(k, i, rr) : dw[head_row(k, i) * D + rr];
}
