// ---- common/order.cuh: causal one-tile grids in phases by tile length -------------
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
