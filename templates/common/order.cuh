// ---- common/order.cuh: one-tile grids' block orders (causal phases, ragged) -------
// Causal one-tile grids in phases by tile length.
// A one-tile grid numbers its blocks head-major: (batch, head) pair after pair,
// each pair's `tiles` work tiles in order, tile 0 the longest under a causal
// mask (the forward's last query block, the backward's first key block). The
// hardware starts blocks in that linear order, so the last heads' long tiles
// start at the end of the grid and run alone. In `phases` phases, phase k
// holds tiles [k * tiles / phases, (k + 1) * tiles / phases) of every pair,
// head-major inside the phase: every head's long tiles start before any short
// one, while the blocks in flight still span few heads (their K and V stay in
// L2). `phases` <= 1 keeps the plain order. Host mirror (tested for being a
// bijection): attnforge::plan::phase_tile.

struct PhaseTile {
    int bh, tile;
};

__device__ __forceinline__ PhaseTile phase_tile(long long lin, int tiles, int phases) {
    if (phases <= 1) return PhaseTile{(int)(lin / tiles), (int)(lin % tiles)};
    // The grid holds pairs * tiles blocks; phase k - 1 holds pairs * span of them.
    const long long pairs = (long long)gridDim.x * gridDim.y * gridDim.z / tiles;
    int lo = 0;
    for (int k = 1; k < phases; ++k) {
        const int hi = k * tiles / phases;
        const long long blocks = pairs * (hi - lo);
        if (lin < blocks) return PhaseTile{(int)(lin / (hi - lo)), lo + (int)(lin % (hi - lo))};
        lin -= blocks;
        lo = hi;
    }
    return PhaseTile{(int)(lin / (tiles - lo)), lo + (int)(lin % (tiles - lo))};
}

// ---- ragged one-tile grids: the sequences longest keys first ----------------------
// A ragged (THD) one-tile grid holds batch * heads * m blocks (m query blocks of
// the longest sequence); in tile_at's order the sequences run in batch order,
// and a long sequence late in the batch leaves its tiles running alone at the
// end, with the short sequences' empty blocks among the real ones. ragged_order
// maps block `lin` to tile_at's tile number in another order: the sequences by
// key length, longest first (ties: the lower batch index first), each
// head-major as in tile_at (head h's real query blocks, the last one first),
// and -1 (no tile) for the blocks past the last real tile (found first, from
// the warp's sum of the real tiles, before the pass). Sequence b has
// nqb = min(ceil(sq_b / block_m), m) real query blocks; its tile (h, ql),
// ql < nqb, is tile_at's (b * heads + h) * m + (m - nqb + ql).
// Warp-collective (all 32 lanes, batch <= 64): lane i holds sequences i and
// i + 32; one pass over the sequences (shuffled from their lanes) sums, for
// each held sequence, the tiles of the sequences ahead of it; a ballot finds
// the sequence whose tiles hold `lin`. Every warp computes it before the role
// split, so the producer's single thread needs no collective and no block-wide
// barrier. Host mirror (tested for being a bijection onto the real tiles):
// attnforge::plan::ragged_order.
// `block_m`: query rows per tile (a constant at the call).
constexpr int RAGGED_ORDER_MAX_BATCH = 64;               // two sequences a lane
__device__ __forceinline__ int ragged_order(const int* cu_q, const int* cu_k, int batch, int heads, int m, int block_m,
                                            int lin) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x % 32;
    // Per held sequence: key length (-1 for none), real tiles, real query blocks.
    int sk[2], nqb[2], tiles[2], ahead[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int b = lane + 32 * i;
        sk[i] = -1;
        nqb[i] = 0;
        if (b < batch) {
            const int sq = cu_q[b + 1] - cu_q[b];
            sk[i] = cu_k[b + 1] - cu_k[b];
            nqb[i] = min((sq + block_m - 1) / block_m, m);
        }
        tiles[i] = nqb[i] * heads;
        ahead[i] = 0;
    }
    // Blocks past the last real tile (a one-tile grid over many short
    // sequences has many) leave before the pass over the sequences.
    // (__reduce_add_sync's sum is warp-uniform to the compiler, so the exit
    // keeps the warp converged; a shuffle-tree sum made the compiler wrap every
    // later shuffle of the kernel for a divergent warp: -10% at d128.)
    if (lin >= __reduce_add_sync(all, tiles[0] + tiles[1])) return -1;
    // Sequence j goes ahead of sequence b (j != b) when its keys are longer,
    // or as long with j < b.
#pragma unroll 4
    for (int j = 0; j < batch; ++j) {
        const bool hi = j >= 32;
        const int skj = __shfl_sync(all, hi ? sk[1] : sk[0], j % 32);
        const int tj = __shfl_sync(all, hi ? tiles[1] : tiles[0], j % 32);
#pragma unroll
        for (int k = 0; k < 2; ++k)
            if (skj > sk[k] || (skj == sk[k] && j < lane + 32 * k)) ahead[k] += tj;
    }
    const unsigned in0 = __ballot_sync(all, lin >= ahead[0] && lin < ahead[0] + tiles[0]);
    const unsigned in1 = __ballot_sync(all, lin >= ahead[1] && lin < ahead[1] + tiles[1]);
    if ((in0 | in1) == 0u) return -1;
    const int hi = in0 == 0u;                            // the sequence is lane + 32 * hi of lane `src`
    const int src = __ffs(hi ? in1 : in0) - 1;
    const int before = __shfl_sync(all, hi ? ahead[1] : ahead[0], src);
    const int q = __shfl_sync(all, hi ? nqb[1] : nqb[0], src);
    const int r = lin - before;
    return ((src + 32 * hi) * heads + r / q) * m + (m - q + r % q);
}
