// The CUDA-core chunked backward's last two passes (chunk_values, chunk_grads): their bindings (one
// list for both) and the chunk's rows (the record layout, RW: chunk.glsl). Needs common.glsl.
// (On the matrix units chunk_pair_bwd_mma does their work, with bindings of its own.)
layout(set = 0, binding = 0) readonly buffer Qkn { float qkn[]; };     // [2][B, T, nk, D] q^, k^
layout(set = 0, binding = 1) readonly buffer Gates { float gates[]; };  // [3][B, T, nv]
layout(set = 0, binding = 2) readonly buffer Lgc { float lgc[]; };      // [2][B, T, nv] lg hi, lo (chunk_prep, or the forward's)
layout(set = 0, binding = 3) readonly buffer Y { float y[]; };          // [B, T, nv*D] v (y_at)
layout(set = 0, binding = 4) readonly buffer Kv { float kv_in[]; };     // [B, T, nv*D] kv per step (tape);
                                                                        // the matrix units' passes: u (chunk_fwd_mma's tape)
layout(set = 0, binding = 5) readonly buffer Do { float do_in[]; };     // [B, T, nv*D] grad of o
layout(set = 0, binding = 6) readonly buffer Du { float du_in[]; };     // [B, T, nv*D] dU (chunk_dstate)
layout(set = 0, binding = 7) buffer Wm { float dw[]; };                 // [B, T, nv, D]: dW (chunk_values)
layout(set = 0, binding = 8) readonly buffer Tm { float t_in[]; };      // [B, T, nv, CH] T (chunk_prep, or the forward's)
layout(set = 0, binding = 9) readonly buffer Ck4 { vec4 ck4[]; };       // [B, nv, slots, D cols, D rows / 4] S0
layout(set = 0, binding = 10) readonly buffer Dsc4 { vec4 dsc4[]; };    // [B, nv, slots, D cols, D rows / 4] dS
layout(set = 0, binding = 11) buffer Rec { float rec[]; };              // [B, T, nv][RW] chunk_grads' records
layout(set = 0, binding = 12) writeonly buffer Dy { float dy[]; };      // [B, T, C]: writes the v part
layout(set = 0, binding = 13) buffer Pairs { float pairs[]; };          // [B, nv, nch][4][CH][CH] <dO_i, u_j>, <dU_i, v_j>,
                                                                        // <k_i, k_j>, <dW_i, k_j>
layout(set = 0, binding = 14) buffer Sdot { float sdot[]; };            // [B, nv, nch] Gamma <dS, S0>
layout(set = 0, binding = 15) readonly buffer H0 { float h0[]; };       // [B, nv, D, D] S[k][v]: chunk 0's S0 (STATE_H0)
layout(set = 0, binding = 16) readonly buffer Dht { float dht[]; };     // [B, nv, D, D]: the last chunk's dS (STATE_CARRY)

#include "chunk.glsl"

// Row tid of the chunk (tid < CH): its lg (hi, lo) and beta (padding rows: beta 0), for put_chunk_rows.
vec3 fetch_chunk_row(Chunk k, uint tid) {
  if (tid >= CH) return vec3(0.0);
  return vec3(chunk_lg(k, tid), chunk_beta(k, tid));
}
// The rows fetch_chunk_row loaded into lg[], lgl[], bet[]. Ends with a barrier.
void put_chunk_rows(vec3 row, uint tid) {
  if (tid < CH) {
    lg[tid] = row.x;
    lgl[tid] = row.y;
    bet[tid] = row.z;
  }
  barrier();
}
// The chunk's lg and beta into lg[], bet[]. Ends with a barrier.
void load_chunk_rows(Chunk k, uint tid) { put_chunk_rows(fetch_chunk_row(k, tid), tid); }
