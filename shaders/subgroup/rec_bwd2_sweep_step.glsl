// One step of rec_bwd2.comp's segment reverse sweep, for the step index J (a literal in the unrolled GPU
// builds, so that every hist[] index is a constant; the loop variable in the rolled build).
// Included once per step; not a shader on its own.
  if (J < nst) {
    const uint bt = b * pc.t + t0 + J;
    const float g = bg[J], beta = bb[J];
    const float vc = bv[J * COLS + cw] - bkv[J * COLS + cw];  // v - kv
    const float u = beta * vc;
    const float dd = bdo[J * COLS + cw];
    float q[RPL], k[RPL];
    [[unroll]] for (uint q4 = 0u; q4 < 4u; ++q4) {
      const vec4 qq = bq[J * (D / 4u) + rg * 4u + q4];
      const vec4 kk = bk[J * (D / 4u) + rg * 4u + q4];
      q[4u * q4] = qq.x; q[4u * q4 + 1u] = qq.y; q[4u * q4 + 2u] = qq.z; q[4u * q4 + 3u] = qq.w;
      k[4u * q4] = kk.x; k[4u * q4 + 1u] = kk.y; k[4u * q4 + 2u] = kk.z; k[4u * q4 + 3u] = kk.w;
    }
    float dq_part[RPL], dk_part[RPL];
    float d0 = 0.0, d1 = 0.0;
    [[unroll]] for (uint r = 0u; r < RPL; ++r) {
      ds[r] = fma(q[r], dd, ds[r]);
      dq_part[r] = hist[J + 1u][r] * dd;
    }
    [[unroll]] for (uint r = 0u; r < RPL; r += 2u) {
      d0 = fma(ds[r], k[r], d0);
      d1 = fma(ds[r + 1u], k[r + 1u], d1);
    }
    const float du = column_sum(d0 + d1);
    const float dkv = -beta * du;
    const float gdkv = g * dkv;
    float dg0 = 0.0, dg1 = 0.0;
    [[unroll]] for (uint r = 0u; r < RPL; ++r) {
      dk_part[r] = fma(ds[r], u, hist[J][r] * gdkv);
      const float e = fma(k[r], dkv, ds[r]);
      if ((r & 1u) == 0u) dg0 = fma(e, hist[J][r], dg0); else dg1 = fma(e, hist[J][r], dg1);
      ds[r] = g * e;
    }
    if (rg == 0u) dy[bt * pc.c_dim + 2u * pc.nk * D + h * D + col] = du;  // qk_bwd2: dv = beta du
    // ---- sums over columns: subgroup butterflies, then the subgroups' records in shared memory ----
    butterfly(dq_part);
    butterfly(dk_part);
    const float dg_sub = subgroupAdd(dg0 + dg1);
    const uint n = nst - 1u - J;  // sweep steps done in this segment
    const uint ring = n % RB;
    const uint base = ring * SLOTS * PW;
    for (uint rd = 0u; rd < ROUNDS; ++rd) {
      if (sub / SLOTS == rd) {
        const uint rec = base + (sub % SLOTS) * PW;
        [[unroll]] for (uint i = 0u; i < RPL; ++i) {  // constant bound: register indices stay constant
          if (i < VALS) {
            wpart[rec + row0 + i] = (rd == 0u ? 0.0 : wpart[rec + row0 + i]) + dq_part[i];
            wpart[rec + D + row0 + i] = (rd == 0u ? 0.0 : wpart[rec + D + row0 + i]) + dk_part[i];
          }
        }
        if (subgroupElect()) {
          wpart[rec + 256u] = (rd == 0u ? 0.0 : wpart[rec + 256u]) + dg_sub;
        }
      }
      if (ROUNDS > 1u) barrier();
    }
    if (ring == RB - 1u || J == 0u) {  // flush the buffered steps: n-ring .. n
      barrier();
      for (uint r = 0u; r <= ring; ++r) {
        const uint bt_r = b * pc.t + t0 + (nst - 1u - (n - ring + r));
        const uint out_at = ((bt_r * pc.nv + h) * NWG + blk) * PW;
        const uint at = r * SLOTS * PW;
        float acc = 0.0;
        for (uint sl = 0u; sl < SLOTS; ++sl) acc += wpart[at + sl * PW + lid];
        dqk[out_at + lid] = acc;
        if (lid == 0u) {
          float acc2 = 0.0;
          for (uint sl = 0u; sl < SLOTS; ++sl) acc2 += wpart[at + sl * PW + 256u];
          dqk[out_at + 256u] = acc2;
        }
      }
      barrier();
    }
  }
