// One step of rec_bwd2.comp's segment replay, for the step index J (a literal in the unrolled GPU
// builds, so that every hist[] index is a constant; the loop variable in the rolled build).
// Included once per step; not a shader on its own.
  if (J < nst) {
    const float g = bg[J];
    const float u = bb[J] * (bv[J * COLS + cw] - bkv[J * COLS + cw]);
    [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
      const vec4 kk = bk[J * (D / 4u) + rg * 4u + q4];
      hist[J + 1u][4u * q4] = fma(kk.x, u, hist[J][4u * q4] * g);
      hist[J + 1u][4u * q4 + 1u] = fma(kk.y, u, hist[J][4u * q4 + 1u] * g);
      hist[J + 1u][4u * q4 + 2u] = fma(kk.z, u, hist[J][4u * q4 + 2u] * g);
      hist[J + 1u][4u * q4 + 3u] = fma(kk.w, u, hist[J][4u * q4 + 3u] * g);
    }
  }
