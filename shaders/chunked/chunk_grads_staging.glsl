// The CUDA-core builds of chunk_values and chunk_grads: the row split of a workgroup and the staged
// operands. Needs chunk_grads.glsl, a 256-invocation workgroup and the specialization constant SG.
#define TILE 8u   // columns (value or key dims) staged per round of the D-long products
// Rows i of the chunk padded to CHP (a multiple of 8): invocation (r, half) owns rows
// half*HR .. half*HR + HR-1 of column r (HR a multiple of 4: vec4 reads of the [m][i] matrices), and
// invocation (pi, pj) = (tid / 16, tid % 16) the 2 x 2 block of (i, j) pairs (2 pi .. 2 pi + 1, 2 pj ..).
const uint CHP = (CH + 7u) / 8u * 8u;
const uint HR = CHP / 2u;
const uint HR4 = HR / 4u;
const uint NSR = D / SG;  // subgroups per row half

float u_at(Chunk k, uint i, uint col) {  // u = beta (v - kv), as the forward made it
  const uint bt = k.b * pc.t + k.t0 + i;
  return bet[i] * (y[y_at(bt, k.h) + col] - kv_in[(bt * pc.nv + k.h) * D + col]);
}
float v_at(Chunk k, uint i, uint col) { return y[y_at(k.b * pc.t + k.t0 + i, k.h) + col]; }

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
