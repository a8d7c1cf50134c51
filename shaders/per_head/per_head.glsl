// The per-head family's thread layout and reductions (rec_fwd, rec_bwd).
// One workgroup of 256 threads per (window, v-head) holds the D x D state in registers:
// thread tid = ty*16 + tx owns the 8 x 8 block rows ty*8 .. ty*8+7, columns tx*8 .. tx*8+7,
// element e = i*8 + j of its `float s[64]` is S[ty*8 + i][tx*8 + j] (row = key index).
// State snapshots in global memory (checkpoints, replay scratch) are stored [e][tid] per state so
// that each of the 64 stores is one coalesced 1 KiB row: word e*256 + tid.
#define STATE_WORDS (D * D)
// Element e of thread (ty, tx)'s block in a carried state (h0, ht, dht, dh0: [B, nv, D, D], S[k][v])
// of (window, v-head) bh.
uint carried_at(uint bh, uint ty, uint tx, uint e) { return (bh * D + ty * 8u + e / 8u) * D + tx * 8u + e % 8u; }

shared float red[16 * D];  // 16 partial sums per row or column

// Column reduction (over rows): thread (ty, tx) leaves its partial of column tx*8+j in red[ty][col].
void col_partial(uint ty, uint tx, uint j, float v) { red[ty * D + tx * 8u + j] = v; }
// Row reduction (over columns): thread (ty, tx) leaves its partial of row ty*8+i in red[tx][row].
void row_partial(uint ty, uint tx, uint i, float v) { red[tx * D + ty * 8u + i] = v; }
// After a barrier: the full sum for column (or row) `lin`.
float reduce16(uint lin) {
  float s = 0.0;
  [[unroll]] for (uint r = 0u; r < 16u; ++r) s += red[r * D + lin];
  return s;
}
