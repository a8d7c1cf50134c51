// A row of D values, one per invocation tid < D, stored as bfloat16 (a word holds two elements, so
// one invocation must write both): each invocation puts its value in bf16_row, and after a barrier
// BF16_ROW_STORE has invocations tid < D/2 store a word each. The next writes to bf16_row must come
// after another barrier.
shared float bf16_row[D];
// words: the tensor's binding as uint pairs; row_at: the row's first element (even).
#define BF16_ROW_STORE(words, row_at, tid)                                                    \
  if ((tid) < D / 2u)                                                                         \
    words[(row_at) / 2u + (tid)] = round_bf16x2(vec2(bf16_row[2u * (tid)], bf16_row[2u * (tid) + 1u]));
