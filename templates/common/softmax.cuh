// ---- common/softmax.cuh: masking and the online softmax on MMA accumulators -------
// Both forward templates hold scores in the m16n8 accumulator layout (mma.sync
// tiles, and each warp's 16 rows of a wgmma m64nN accumulator): thread
// (g = lane/4, t = lane%4) owns rows g and g+8 and columns 2t, 2t+1 of each
// 8-wide n-tile.

// Set scores outside each row's visible key range to -inf. `row0` is this
// thread's first row (g of its warp's first tile), `col0` its first key
// column (n0 + 2t); element (mt, j, e) is row row0 + 16 mt + 8 (e / 2),
// key col0 + 8 j + (e % 2).
template <int MT, int BN>
__device__ __forceinline__ void apply_mask(float (&s)[MT][BN / 8][4], const RowWindow& win, int row0, int col0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = row0 + mt * 16 + 8 * r;
            const int lo = win.key_lo(i) - col0, hi = win.key_hi(i) - col0;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = j * 8 + e;
                    if (c < lo || c > hi) s[mt][j][2 * r + e] = NEG_INF;
                }
        }
}

// One tile of the online softmax on masked scores that become log2-domain
// logits when multiplied by `scale` (> 0: the softmax scale times log2(e),
// or 1 when the caller already transformed them, as softcap does). The max
// is taken before scaling (a positive scale keeps the order), so each
// probability costs one FFMA and one ex2. Per row: raise the running max
// (kept scaled, in the log2 domain), turn the scores into
// probabilities in place, add them to the running sum, and hand
// `rescale(mt, r, alpha)` the factor that rescales what O has accumulated so
// far in that row (called row by row, so O can be rescaled right there).
//
// LAZY: the running max is only a reference, raised when a tile's maximum
// exceeds it by more than MAX_SLACK (log2 domain); otherwise the tile's
// probabilities are taken against the old reference (each at most
// 2^MAX_SLACK, far inside f32 and the 16-bit types) and alpha is exactly 1,
// so that the caller can skip rescaling O. O / l and the LSE (reference +
// log2 l) do not depend on which reference was used.
//
// SUM = false: the caller sums the probabilities elsewhere (the sm90a
// forward's row sums on the tensor cores) and row_sum is left as it is.
constexpr float MAX_SLACK = 8.f;
template <int MT, int NT, typename Rescale, bool LAZY = false, bool SUM = true>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NT][4], float (&row_max)[MT][2],
                                               float (&row_sum)[MT][2], float scale, Rescale rescale) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float tile_max = NEG_INF;
#pragma unroll
            for (int j = 0; j < NT; ++j) tile_max = fmaxf(tile_max, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
            tile_max = quad_max(tile_max);
            const float m_old = row_max[mt][r], m_tile = tile_max * scale;
            // Lazy: a reference of -inf is always raised by a finite tile max;
            // a NaN tile max raises neither form.
            const float m_new = LAZY ? (m_tile > m_old + MAX_SLACK ? m_tile : m_old) : fmaxf(m_old, m_tile);
            const float m_use = m_new == NEG_INF ? 0.f : m_new;   // fully masked so far: all p = 0
            const float alpha = LAZY && m_new == m_old ? 1.f : fast_exp2(m_old - m_use);
            row_max[mt][r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pv = fast_exp2(fmaf(s[mt][j][2 * r + e], scale, -m_use));
                    s[mt][j][2 * r + e] = pv;
                    if constexpr (SUM) sum += pv;
                }
            if constexpr (SUM) row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
            rescale(mt, r, alpha);
        }
}
