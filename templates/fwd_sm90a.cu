{%- import "common/wgmma_operands.tera" as wg -%}
// attnforge generated kernel: {{ spec }}
// template fwd_sm90a.cu — Hopper forward. One producer warpgroup moves Q (once
// per work tile) and K/V tiles through a {{ stages }}-stage ring with TMA (128-byte swizzle,
// completion on mbarriers); {{ consumers }} consumer warpgroups own 64 query rows each and
// run S = QK^T (wgmma, both operands in shared memory), the online softmax in
// registers, and O += PV (wgmma, P from registers, V read transposed).
// Work tiles in the order of tile_at ({% if head_major %}head-major{% else %}longest causal tiles first{% endif %}). Entries:
//   {{ entry }}: one tile per block{% if is_thd %} (the sequences longest keys first where the launcher asks){% endif %}.{% if persistent %}
//   {{ entry }}_walk: the resident blocks walk the tiles in a snake over
//   rounds of gridDim.x tiles, the next tile's Q loading while this tile's
//   last P V and epilogue run; the launcher takes it for short keys
//   (plan::sm90a_walk_pays).{% endif %}
// Plan: block_m={{ block_m }} block_n={{ block_n }} stages={{ stages }} registers {{ producer_regs }}/{{ consumer_regs }}
// consumer loop: {% if pipelined %}pipelined by one tile (S of the next tile issued before P V of this one){% if pingpong %}, the consumer warpgroups taking turns at the tensor cores (ping-pong){% endif %}{% else %}one tile at a time (the consumer warpgroups overlap each other){% endif %}.
// Do not edit: rendered by attnforge from templates/fwd_sm90a.cu.

constexpr int CONSUMERS = {{ consumers }};           // consumer warpgroups
constexpr int BLOCK_M = 64 * CONSUMERS;             // query rows per block
constexpr int BLOCK_N = {{ block_n }};               // keys per main-loop step
constexpr int STAGES = {{ stages }};                 // K/V ring depth
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int D_QK = {{ d_qk }};
static_assert(D_QK <= 16 * {{ qk_ksteps }} && D_QK <= 64 * {{ qk_chunks }}, "head dim covered by the k-steps and chunks");
constexpr int D_V = {{ d_v }};
constexpr int DV = {{ d_v_pad }};                    // O accumulator columns (wgmma N)
constexpr int QK_CHUNKS = {{ qk_chunks }};           // 64-element (128-byte) column chunks of Q and K
constexpr int V_CHUNKS = {{ v_chunks }};
constexpr int QK_KSTEPS = {{ qk_ksteps }};           // 16-wide k-steps of S = QK^T
constexpr int MASK_KIND = {{ mask_kind }};
// A consumer warpgroup stops at the last key tile its rows see, where a whole
// key tile can lie past the first warpgroup's rows under a mask bounded on the
// right (block_n <= block_m - 64). Not elsewhere: in session 36's A/B (H100)
// the check cost ~1% where it never stops a warpgroup.
constexpr bool WG_STOPS = MASK_KIND != 0 && BLOCK_N <= BLOCK_M - 64;
// Elsewhere with three consumer warpgroups (block_m 192, which divides no
// power-of-two length), a warpgroup whose rows all lie outside the sequence
// skips the tile's GEMMs as above, and the walk without a mask rotates its
// blocks over rounds (walk_slot). Session 42's A/B (H100): +2.0..2.8% at d64 and
// d128, 2k, +1.5% ragged d128; with two consumers (no such warpgroup in the
// dense cells) the same code lost 1.4..2.7% at 512, so not there.
constexpr bool SKIP_EMPTY_WG = !WG_STOPS && CONSUMERS == 3;
constexpr bool IS_THD = {{ is_thd }};
constexpr bool SOFTCAP = {{ softcap }};
// The softmax's lazy reference max and O's skipped rescale (common/softmax.cuh),
// taken with the softmax under the previous P V (plan's softmax_under_pv).
constexpr bool LAZY_MAX = {{ softmax_under_pv }};
// Row sums on the tensor cores (plan's rowsum_mma): P times a block of ones
// beside every P V k-step, in place of the softmax's FADDs.
constexpr bool ROWSUM_MMA = {{ rowsum_mma }};
// Causal query blocks aligned to the sequence's end (plan's tail_first): the
// partial block is the first (and shortest) one.
constexpr bool TAIL_FIRST = {{ tail_first }};
constexpr bool O_TMA = {{ tma_store_o }};
// Q in registers (plan's q_regs): each consumer warpgroup copies its 64 rows
// of Q into the A fragments of every k-step as soon as they land and frees
// the buffer at once; S is then a register-sourced wgmma that reads only K
// from shared memory.
constexpr bool Q_REGS = {{ q_regs }};
// Clusters of two on the one-tile entry (plan's cluster_m; see `pair` below).
constexpr int CLUSTER_M = {{ cluster_m }};
// The one-tile entry's blocks in phases by tile length (common/order.cuh).
constexpr bool PHASED = (MASK_KIND == 1 || MASK_KIND == 2) && !IS_THD;
// Ragged one-tile grids: the sequences longest keys first (common/order.cuh's
// ragged_order, where p.ragged_order is set), up to RAGGED_ORDER_MAX_BATCH
// sequences. Its tile numbers are head-major ones: the query-block-major order
// keeps the grid's (session 22: mapped through it, blocks went missing).
constexpr bool HEAD_MAJOR = {{ head_major }};
// The walk over a ragged batch takes its tiles in the same order (sequences
// longest keys first) where its blocks have at most WALK_ORDER_ROUNDS rounds:
// each block's tile numbers, one per round, in a table in shared memory that
// every warp fills before the role split (ragged_order is warp-collective;
// the producer runs on one thread). 0 on dense plans (no table).
constexpr int WALK_ORDER_ROUNDS = {{ walk_order_rounds }};

// The work-tile loop of both entries (WALK, a template parameter of the
// kernel body): the walk takes rounds of gridDim.x tiles, round r the tiles
// r * gridDim.x + j, and block i takes j = walk_slot(r) of them: under a mask
// j = i, or gridDim.x - 1 - i in odd rounds, a snake that evens out the work
// of blocks over a list of tiles whose lengths fall along each round, as
// causal tiles do longest first; without one j = (i + r) % gridDim.x, a
// rotation, so that the shorter tiles (each head's last query block, where
// block_m does not divide the sequence and a warpgroup's rows lie past its
// end, see `mine`), one in every num_m_blocks tiles of a round, go to every
// block in turn instead of to the same blocks every other round. One tile
// per block (grid (batch x heads, query blocks)) runs it once, a condition
// that folds to no loop at all, on the block's linear index in the grid
// (ragged: on `thd_tile`, which fwd_tiles computes before the role split).
// `continue` skips a tile in both.
__device__ __forceinline__ int walk_slot(int r) {
    const int i = (int)blockIdx.x, n = (int)gridDim.x;
    if constexpr (SKIP_EMPTY_WG && MASK_KIND == 0) return (i + r) % n;
    return r & 1 ? n - 1 - i : i;
}
#define TILE_LOOP_BEGIN for (int round_base = 0, rnd = 0; WALK ? round_base < total_tiles : round_base == 0; \
                             round_base += WALK ? (int)gridDim.x : 1, ++rnd) { \
    const int tile = WALK ? round_base + walk_slot(rnd) \
                          : IS_THD ? thd_tile : (int)(blockIdx.x + blockIdx.y * gridDim.x); \
    if (WALK && tile >= total_tiles) continue;
#define TILE_LOOP_END }

{% include "common/ptx.cuh" %}
{% include "common/hopper.cuh" %}
{% include "common/mask.cuh" %}
{% include "common/softmax.cuh" %}
{% include "common/fwd_params.cuh" %}
{% include "common/order.cuh" %}

// Tracing (gpu_bench --trace90): the producer and lane 0 of each consumer
// warpgroup's first warp stamp their events.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_ROLES = 4;
#endif
{% include "common/trace.cuh" %}
// Events (the tile number, where given, in the bits above 8).
enum : unsigned { EV_TILE = 1, EV_Q_READY, EV_K_READY, EV_TURN, EV_S_DONE, EV_SOFTMAX_DONE, EV_PV_DONE, EV_EPI_DONE,
                  EV_V_READY, EV_P_Q_FREE = 20, EV_P_K_ISSUED, EV_P_V_ISSUED };

// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats
// every 8 rows of 128 bytes). Each tile is stored as column chunks of 64
// elements: chunk c of a tile with R rows starts at c * R * 128 bytes.
constexpr unsigned Q_BYTES = BLOCK_M * 128 * QK_CHUNKS;
constexpr unsigned K_BYTES = BLOCK_N * 128 * QK_CHUNKS;   // one stage
constexpr unsigned V_BYTES = BLOCK_N * 128 * V_CHUNKS;
constexpr unsigned OFF_K = Q_BYTES;
constexpr unsigned OFF_V = OFF_K + STAGES * K_BYTES;
constexpr unsigned OFF_ONES = OFF_V + STAGES * V_BYTES;   // ROWSUM_MMA: one swizzle atom of ones (1024 B)
// O_TMA: each consumer warpgroup stages its 64 rows of O here, as V_CHUNKS
// 64-column chunks of 128-byte swizzled rows (8 KB each, TMA's layout for the
// O tensor map), and one thread stores them with TMA.
constexpr unsigned O_STAGE_BYTES = 64u * 128u * V_CHUNKS;   // per consumer warpgroup
constexpr unsigned OFF_O = OFF_ONES + (ROWSUM_MMA ? 1024u : 0u);
constexpr unsigned OFF_BAR = OFF_O + (O_TMA ? CONSUMERS * O_STAGE_BYTES : 0u);   // q_full, q_empty, k_full[S], v_full[S], k_empty[S], v_empty[S]
static_assert(!O_TMA || !IS_THD, "a TMA box would cross into the next sequence's rows");
constexpr unsigned OFF_ORDER = OFF_BAR + 8u * (2u + 4u * STAGES);   // WALK_ORDER_ROUNDS ints

// The key tiles from n_begin on that rows up to `row` see: through the last
// key of `row` (masks bounded on the right give later rows more keys).
__device__ __forceinline__ int key_tiles_through(const RowWindow& win, int sk, int n_begin, int row) {
    const int n_end = min(sk, win.key_hi(row) + 1);
    return n_end > n_begin ? (n_end - n_begin + BLOCK_N - 1) / BLOCK_N : 0;
}

// One work tile: query rows [m0, m0 + BLOCK_M) of (batch b, head h), and the
// key tiles [n_begin, n_begin + n_tiles * BLOCK_N) that they see. n_tiles is
// -1 when the tile has no query rows (past a ragged sequence's end: skipped)
// and 0 when its rows see no key (O = 0, LSE = -inf are still written).
struct Tile {
    int b, h, hk, m0, sq, sk, q_off, k_off, n_begin, n_tiles;
};

// The K/V ring after a work tile of n key tiles (slots 0, 1, ... from the
// start): the slots filled an odd number of times (their parity flips), and
// the slots filled at all.
__device__ __forceinline__ unsigned ring_flips(int n) {
    unsigned m = 0;
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
        if (n > s && (((n - 1 - s) / STAGES) & 1) == 0) m |= 1u << s;
    return m;
}
__device__ __forceinline__ unsigned ring_touched(int n) {
    return n >= STAGES ? (1u << STAGES) - 1u : (1u << n) - 1u;
}

// Tile t of the walk: by default all (batch, head) pairs of the last query
// block first, so that under a causal mask the longest tiles start first.
// A negative t (a ragged batch's blocks or rounds past its real tiles, see
// ragged_order) is no tile: n_tiles = -1.
// `ordered`: t is a ragged_order tile number (the walk's table), numbered
// head-major as the one-tile entry numbers its tiles.
template <bool WALK>
__device__ __forceinline__ Tile tile_at(const FwdParams& p, int t, bool ordered = false) {
    Tile w;
    if constexpr (IS_THD) {
        if (t < 0) {
            w.b = w.h = w.hk = w.m0 = w.sq = w.sk = w.q_off = w.k_off = w.n_begin = 0;
            w.n_tiles = -1;
            return w;
        }
    }
    const int bh_count = p.batch * p.heads_q;
    const int m = p.num_m_blocks;
    int bh, qb;                                          // (batch, head) pair; query block counted from the last
{% if head_major %}
    if (WALK && !ordered) {
        // Head-major in sections: the tiles of `hps` consecutive (batch, head)
        // pairs, the last query block of each first, so that the blocks in flight
        // share a few heads' K and V in L2. Without a mask every tile is as long
        // as the next and a section is one head. With one, tile lengths fall with
        // the query block, and a static walk over one head at a time would give
        // some blocks the long end of every head (at 16k and d128 one head's 128
        // query blocks are about one round of the grid): a section then spans at
        // least two rounds, so that the snake pairs long tiles with short ones.
        // A grid that covers every tile takes one head a section.
        const bool walk = (int)gridDim.x < bh_count * m;
        const int hps = MASK_KIND == 0 || !walk ? 1 : min(bh_count, max(1, (2 * (int)gridDim.x + m - 1) / m));
        const int sec = t / (hps * m), j = t % (hps * m);
        const int bh0 = sec * hps, n = min(hps, bh_count - bh0);
        bh = bh0 + j % n;
        qb = j / n;
    } else {
        // Head-major: the query blocks of one (batch, head) are consecutive (the
        // last first), so the blocks in flight share that head's K and V in L2;
        // under a causal mask on dense tensors in p.tile_phases phases by
        // length (common/order.cuh).
        if constexpr (PHASED) {
            const PhaseTile pt = phase_tile(t, m, p.tile_phases);
            bh = pt.bh;
            qb = pt.tile;
        } else {
            bh = t / m;
            qb = t % m;
        }
    }
{% else %}
    bh = t % bh_count;
    qb = t / bh_count;
{% endif %}
    w.b = bh / p.heads_q;
    w.h = bh % p.heads_q;
    w.hk = w.h / p.gqa_ratio;
    w.m0 = (m - 1 - qb) * BLOCK_M;
    w.sq = p.seqlen_q;
    w.sk = p.seqlen_k;
    w.q_off = 0;
    w.k_off = 0;
    if constexpr (IS_THD) {
        w.q_off = p.cu_seqlens_q[w.b];
        w.k_off = p.cu_seqlens_k[w.b];
        w.sq = p.cu_seqlens_q[w.b + 1] - w.q_off;
        w.sk = p.cu_seqlens_k[w.b + 1] - w.k_off;
    }
    w.n_begin = 0;
    w.n_tiles = -1;
    if (w.m0 >= w.sq) return w;
    // TAIL_FIRST: every block moves back by the partial block's padding, so
    // the last ends at row sq - 1 and the first starts at or before row 0
    // (its rows before 0, zero fill or the previous sequence's tokens, are
    // masked as any row and never stored).
    if constexpr (TAIL_FIRST) w.m0 -= (w.sq + BLOCK_M - 1) / BLOCK_M * BLOCK_M - w.sq;
    const RowWindow win(w.sq, w.sk, p.window_left, p.window_right);
    const int last_row = min(w.m0 + BLOCK_M, w.sq) - 1;
    w.n_begin = (win.key_lo(max(w.m0, 0)) / BLOCK_N) * BLOCK_N;
    w.n_tiles = key_tiles_through(win, w.sk, w.n_begin, last_row);
    return w;
}

// S (64 x BLOCK_N) = Q (64 x 16) K^T (16 x BLOCK_N), accumulating when `acc`
// is nonzero. Both operands K-major in shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[BLOCK_N / 8][4], unsigned long long qd, unsigned long long kd, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ s_regs + 2 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ block_n }}k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=s_regs) }} },\n"
        "%{{ s_regs }}, %{{ s_regs + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {{ wg::acc_operands(tiles=s_tiles) }}
        : "l"(qd), "l"(kd), "r"(acc));
}

// The same with Q's k-step from registers (Q_REGS): the A fragment of rows
// 16 w .. 16 w + 15 in warp w, as for mma.m16n8k16.
__device__ __forceinline__ void wgmma_qk_rs(float (&d)[BLOCK_N / 8][4], const unsigned (&a)[4], unsigned long long kd,
                                            int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ s_regs + 5 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ block_n }}k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=s_regs) }} },\n"
        "{ %{{ s_regs }}, %{{ s_regs + 1 }}, %{{ s_regs + 2 }}, %{{ s_regs + 3 }} }, %{{ s_regs + 4 }}, p, 1, 1, 0;\n}\n"
        : {{ wg::acc_operands(tiles=s_tiles) }}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(kd), "r"(acc));
}

// O (64 x DV) += P (64 x 16, registers) V (16 x DV); V is stored row-major
// (DV contiguous), i.e. MN-major for this product: transposed B.
__device__ __forceinline__ void wgmma_pv(float (&d)[DV / 8][4], const unsigned (&a)[4], unsigned long long vd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ o_regs + 5 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ d_v_pad }}k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=o_regs) }} },\n"
        "{ %{{ o_regs }}, %{{ o_regs + 1 }}, %{{ o_regs + 2 }}, %{{ o_regs + 3 }} }, %{{ o_regs + 4 }}, p, 1, 1, 1;\n}\n"
        : {{ wg::acc_operands(tiles=o_tiles) }}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(vd), "r"(1));
}

// Row sums (ROWSUM_MMA): d (64 x 8) += P (64 x 16, registers) x ones (16 x 8,
// shared memory). Every column of d is the row's sum of this k-step's P;
// in the accumulator layout this thread's rows g and g + 8 are d[0] and d[2].
// Every element of the ones atom is 1, so the descriptor's layout only has to
// stay inside the atom (K-major, 8 rows of 32 bytes).
__device__ __forceinline__ void wgmma_rowsum(float (&d)[4], const unsigned (&a)[4], unsigned long long bd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1));
}

// The kernel body of both entries; the tensor maps stay the entry's
// __grid_constant__ parameters (TMA takes their parameter-space address).
template <bool WALK>
__device__ __forceinline__ void fwd_tiles(const FwdParams& p, const TmaMap& tq, const TmaMap& tk, const TmaMap& tv,
                                          const TmaMap& to) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base, sK = base + OFF_K, sV = base + OFF_V;
    const unsigned bar_q = base + OFF_BAR, q_empty = base + OFF_BAR + 8u;
    auto k_full = [&](int s) { return bar_q + 8u * (2 + s); };
    auto v_full = [&](int s) { return bar_q + 8u * (2 + STAGES + s); };
    auto k_empty = [&](int s) { return bar_q + 8u * (2 + 2 * STAGES + s); };
    auto v_empty = [&](int s) { return bar_q + 8u * (2 + 3 * STAGES + s); };

    const int tid = threadIdx.x;
    // The launcher keeps tiles + gridDim.x within int range.
    const int total_tiles = p.batch * p.heads_q * p.num_m_blocks;
    // A pair: the one-tile entry launched as clusters of two blocks, which
    // the launcher does only where both blocks of a cluster are adjacent
    // query blocks of one head (no mask, dense: the same key tiles). Each
    // block's producer loads the 64-column chunks of its parity of every K
    // and V tile and multicasts them to both blocks; a slot is refilled once
    // the consumers of both blocks have released it (each consumer warp
    // arrives on its own block's and on the peer's empty barrier). Q and the
    // epilogue stay per block. Launched alone, the same entry runs as usual.
    bool pair = false;
    unsigned rank = 0;
    if constexpr (CLUSTER_M > 1 && !WALK) {
        pair = cluster_nctarank() == 2;
        rank = cluster_ctarank();
    }
    // The one-tile entry's tile on ragged batches (TILE_LOOP_BEGIN): the
    // block's linear index in the grid, or where the launcher asks the
    // sequences longest keys first (-1: no tile), which every warp computes
    // here, with all its lanes, so that both roles take the same tile.
    int thd_tile = 0;
    if constexpr (IS_THD && !WALK) {
        thd_tile = (int)(blockIdx.x + blockIdx.y * gridDim.x);
        if (HEAD_MAJOR && p.ragged_order != 0 && p.batch <= RAGGED_ORDER_MAX_BATCH)
            thd_tile = ragged_order(p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.heads_q, p.num_m_blocks, BLOCK_M,
                                    thd_tile);
    }

    // The walk's tiles on ragged batches, sequences longest keys first, where
    // the launcher asks for that order and the blocks have at most
    // WALK_ORDER_ROUNDS rounds (a condition uniform over the grid): round r's
    // tile number in the block's table (`walk_tile`), written here by warp
    // r % warps; the start barrier below makes it visible to both roles. The
    // rounds' walk indices r * gridDim.x + walk_slot(r) cover every index below
    // total_tiles once over the grid, ragged_order maps them onto the real
    // tiles (-1 past the last), so the walk still takes every tile once.
    bool walk_order = false;
    int* const order_table = reinterpret_cast<int*>(smem_raw + (base - smem_addr(smem_raw)) + OFF_ORDER);
    if constexpr (IS_THD && WALK && WALK_ORDER_ROUNDS > 0) {
        const int rounds = (total_tiles + (int)gridDim.x - 1) / (int)gridDim.x;
        walk_order = HEAD_MAJOR && p.ragged_order != 0 && p.batch <= RAGGED_ORDER_MAX_BATCH &&
                     rounds <= WALK_ORDER_ROUNDS;
        if (walk_order) {
            for (int r = tid / 32; r < rounds; r += (int)blockDim.x / 32) {
                const int t = r * (int)gridDim.x + walk_slot(r);
                const int mapped = t < total_tiles ? ragged_order(p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.heads_q,
                                                                  p.num_m_blocks, BLOCK_M, t)
                                                   : -1;
                if (tid % 32 == 0) order_table[r] = mapped;
            }
        }
    }
    // Round `rnd`'s tile, `tile` its walk index.
    auto walk_tile = [&](int rnd, int tile) { return tile_at<WALK>(p, walk_order ? order_table[rnd] : tile, walk_order); };

    if (tid == 0) {
        mbar_init(bar_q, 1);
        mbar_init(q_empty, 4 * CONSUMERS);               // lane 0 of every consumer warp
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), 4 * CONSUMERS * (pair ? 2 : 1));
            mbar_init(v_empty(s), 4 * CONSUMERS * (pair ? 2 : 1));
        }
        fence_barrier_init();
    }
    if constexpr (ROWSUM_MMA) {
        // The ones of the row sums: 64 threads store 16 bytes each (generic
        // proxy), made visible to wgmma (async proxy) before the start barrier.
        if (tid < 64) {
            const unsigned one2 = pack2(1.f, 1.f);
            asm volatile("st.shared.v4.b32 [%0], {% raw %}{%1, %1, %1, %1}{% endraw %};\n" :: "r"(base + OFF_ONES + 16u * tid), "r"(one2) : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
    }
    // A pair's barriers must be initialized in both blocks before either
    // multicasts or arrives remotely.
    if (pair) cluster_sync(); else __syncthreads();
#ifdef ATTNFORGE_TRACE
    if (tid == 0) trace_block_start();
#endif

    // Both roles walk the same tiles and keep the same ring state. Every work
    // tile starts the K/V ring at slot 0 (key tile `it` in slot it % STAGES),
    // so that slot addresses, and the wgmma descriptors built from them,
    // depend on `it` alone; `ring_par` holds per slot the parity of its fills
    // before this tile (key tile `it` waits for phase parity
    // ring_par[s] ^ (it / STAGES) & 1). `q_loads` counts the Q loads (the
    // parity of bar_q and q_empty).
    const int wg = tid / 128;
    if (wg == 0) {
        // Producer: one thread issues every copy; the others only give their registers back.
        regs_release<{{ producer_regs }}>();
        if (tid == 0) {
#ifdef ATTNFORGE_TRACE
            Tracer tr = tracer_for(0);
#endif
            tma_prefetch_map(&tq);
            tma_prefetch_map(&tk);
            tma_prefetch_map(&tv);
            if constexpr (O_TMA) tma_prefetch_map(&to);
            unsigned ring_par = 0, ring_used = 0;        // per slot: fill parity; filled before
            int q_loads = 0;
            // Q is read once, a head's K and V by each of its query blocks.
            const unsigned long long pol_q = l2_policy_evict_first(), pol_kv = l2_policy_evict_last();
            TILE_LOOP_BEGIN
                const Tile w = walk_tile(rnd, tile);
                if (w.n_tiles <= 0) continue;
                TRACE(EV_TILE | tile << 8);
                // Coordinates (column, row, head, batch); THD rows are token indices.
                const int bq = IS_THD ? 0 : w.b;
                // Q of the previous tile is free once its last S is computed
                // (with Q_REGS, once every warp has its rows in registers).
                if (q_loads > 0) mbar_wait(q_empty, (q_loads - 1) & 1);
                TRACE(EV_P_Q_FREE);
                mbar_arrive_expect_tx(bar_q, Q_BYTES);
#pragma unroll
                for (int c = 0; c < QK_CHUNKS; ++c)
                    tma_load_4d_hint(sQ + c * BLOCK_M * 128, &tq, bar_q, c * 64, w.q_off + w.m0, w.h, bq, pol_q);
                ++q_loads;
                // K runs one tile ahead of V: the consumers need K(it+1) before
                // V(it) (S of the next tile is issued before P V of this one) and
                // free K slots as soon as S is computed.
                // Fill number u of slot s in this tile: wait until the
                // consumers have released the slot's previous fill.
                auto wait_free = [&](unsigned empty, int s, int u) {
                    if (u > 0 || ((ring_used >> s) & 1u)) {
                        const unsigned parity = ((ring_par >> s) ^ (unsigned)u ^ 1u) & 1u;
                        mbar_wait(empty, parity);
                    }
                };
                // Chunk c of a K/V tile: this block's own, or in a pair every
                // other chunk for both blocks.
                auto load_chunk = [&](unsigned dst, const TmaMap* map, unsigned bar, int c, int row) {
                    if (!pair)
                        tma_load_4d_hint(dst, map, bar, c * 64, row, w.hk, bq, pol_kv);
                    else if ((unsigned)(c & 1) == rank)
                        tma_load_4d_multicast(dst, map, bar, c * 64, row, w.hk, bq, (unsigned short)0x3);
                };
                auto load_k = [&](int it) {
                    const int s = it % STAGES;
                    wait_free(k_empty(s), s, it / STAGES);
                    const int row = w.k_off + w.n_begin + it * BLOCK_N;
                    mbar_arrive_expect_tx(k_full(s), K_BYTES);
#pragma unroll
                    for (int c = 0; c < QK_CHUNKS; ++c)
                        load_chunk(sK + s * K_BYTES + c * BLOCK_N * 128, &tk, k_full(s), c, row);
                    TRACE(EV_P_K_ISSUED | it << 8);
                };
                auto load_v = [&](int it) {
                    const int s = it % STAGES;
                    wait_free(v_empty(s), s, it / STAGES);
                    const int row = w.k_off + w.n_begin + it * BLOCK_N;
                    mbar_arrive_expect_tx(v_full(s), V_BYTES);
#pragma unroll
                    for (int c = 0; c < V_CHUNKS; ++c)
                        load_chunk(sV + s * V_BYTES + c * BLOCK_N * 128, &tv, v_full(s), c, row);
                    TRACE(EV_P_V_ISSUED | it << 8);
                };
                load_k(0);
                for (int it = 0; it < w.n_tiles; ++it) {
                    if (it + 1 < w.n_tiles) load_k(it + 1);
                    load_v(it);
                }
                ring_par ^= ring_flips(w.n_tiles);
                ring_used |= ring_touched(w.n_tiles);
            TILE_LOOP_END
        }
        // Neither block of a pair leaves while the other may still arrive
        // on its barriers.
        if (pair) cluster_sync();
        return;
    }

    // Consumers.
    regs_claim<{{ consumer_regs }}>();
    const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;   // warp-uniform (lets ptxas use uniform registers)
    const int warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const unsigned q_rows = sQ + cw * 64 * 128;          // this warpgroup's 64 rows in each chunk
#ifdef ATTNFORGE_TRACE
    Tracer tr = tid % 128 == 0 ? tracer_for(1 + cw) : Tracer{};
#endif
{% if pingpong %}
    // Ping-pong: a warpgroup issues its GEMMs only in its turn (named barrier
    // 1 + cw, 128 arriving + 128 waiting) and then passes the turn to the
    // next one (barrier 1 + (cw + 1) % CONSUMERS), so the tensor cores run
    // one warpgroup's S and P V while the others do their softmax. Per work
    // tile warpgroup 0 starts (the last one arrives on its barrier first);
    // every warpgroup takes n_tiles + 1 turns, and the last one does not pass
    // its last turn (nobody takes it), so the barriers are balanced at every
    // tile boundary. In the walk, where the block's next tile has key tiles,
    // the last warpgroup passes its last turn too, on to warpgroup 0's first
    // turn of that tile (`turn_passed`, the tile start's arrive skipped), so
    // that warpgroup 0 starts the next tile's S while the others still do
    // their last P V and their epilogue.
    auto take_turn = [&]() { named_bar_sync(1 + cw, 256); };
    auto pass_turn = [&](bool last) {
        // (1 + (cw + 1) % CONSUMERS, written 2 - cw for two: the same ids, one instruction)
        const int next = CONSUMERS == 2 ? 2 - cw : 1 + (cw + 1) % CONSUMERS;
        if (!(last && cw == CONSUMERS - 1)) named_bar_arrive(next, 256);
    };
{% else %}
    auto take_turn = [&]() {};
    auto pass_turn = [&](bool) {};
{% endif %}

    float acc_o[DV / 8][4];
    float acc_l[4];                                      // ROWSUM_MMA: row sums (rows g, g + 8 in [0], [2])
    float acc_s[1][BLOCK_N / 8][4];
    unsigned pa[BLOCK_N / 16][4];                        // P, the A operand of P V
    unsigned qa[Q_REGS ? QK_KSTEPS : 1][4];              // Q_REGS: this warp's 16 rows of Q, per k-step
    unsigned ring_par = 0;
    int q_loads = 0;
    // The walk computes the tile this block takes in the next round
    // (TILE_LOOP_BEGIN's order; integer divisions) after the key loop, before
    // the last turn, whose target depends on it, and the epilogue
    // (`find_next`): their latency hides behind the turn's wait and the stores.
    Tile next_w;
    bool have_next = false;
    bool turn_passed = false;                            // the previous tile's last turn went on to this one
    TILE_LOOP_BEGIN
        const Tile w = WALK && have_next ? next_w : walk_tile(rnd, tile);
        have_next = false;
        if (w.n_tiles < 0) continue;
        auto find_next = [&]() {
            if constexpr (WALK) {
                const int nt = round_base + (int)gridDim.x + walk_slot(rnd + 1);
                if (nt < total_tiles) {
                    next_w = walk_tile(rnd + 1, nt);
                    have_next = true;
                }
            }
        };
        TRACE(EV_TILE | tile << 8);
        const int n_tiles = w.n_tiles;
        const RowWindow win(w.sq, w.sk, p.window_left, p.window_right);
        const int last_row = min(w.m0 + BLOCK_M, w.sq) - 1;
        const int row0 = w.m0 + cw * 64 + warp * 16 + g; // this thread's first row (and row0 + 8)

        float row_max[1][2] = {{ "{{" }}NEG_INF, NEG_INF{{ "}}" }}, row_sum[1][2] = {{ "{{" }}0.f, 0.f{{ "}}" }};
#pragma unroll
        for (int j = 0; j < DV / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[j][e] = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_l[e] = 0.f;

        // Ring slot and phase of this tile's key tile `it`.
        auto slot = [&](int it) { return it % STAGES; };
        auto phase = [&](int it) { return ((ring_par >> (it % STAGES)) ^ (unsigned)(it / STAGES)) & 1u; };
        // S = Q K(stage s)^T, committed as one wgmma group.
        auto issue_qk = [&](int s) {
            if constexpr (Q_REGS) {
                const unsigned k_lo = sw128_desc_lo(sK + s * K_BYTES, 16);
#pragma unroll
                for (int ks = 0; ks < QK_KSTEPS; ++ks)
                    wgmma_qk_rs(acc_s[0], qa[ks], sw128_desc_at(k_lo, (ks / 4) * BLOCK_N * 128 + (ks % 4) * 32), ks > 0);
                wgmma_commit();
                return;
            }
            unsigned q_base = q_rows;
            // Q's descriptors are the same every step: in the walk's tile
            // loop the compiler hoists all of them out of both loops into
            // 64-bit register pairs (2 x QK_KSTEPS registers, which made
            // d > 128 spill); this opaque copy of their base makes it build
            // them per step instead.
            if constexpr (WALK && QK_KSTEPS > 8) asm volatile("" : "+r"(q_base));
            // Each step's descriptors: the low words once, plus a constant.
            const unsigned q_lo = sw128_desc_lo(q_base, 16), k_lo = sw128_desc_lo(sK + s * K_BYTES, 16);
#pragma unroll
            for (int ks = 0; ks < QK_KSTEPS; ++ks) {
                const unsigned in_chunk = (ks % 4) * 32;
                wgmma_qk(acc_s[0], sw128_desc_at(q_lo, (ks / 4) * BLOCK_M * 128 + in_chunk),
                         sw128_desc_at(k_lo, (ks / 4) * BLOCK_N * 128 + in_chunk), ks > 0);
            }
            wgmma_commit();
        };
        // O += P V(stage s), and the row sums += P ones, committed as one wgmma group.
        auto issue_pv = [&](int s) {
            const unsigned v_lo = sw128_desc_lo(sV + s * V_BYTES, BLOCK_N * 128);
            const unsigned ones_lo = sw128_desc_lo(base + OFF_ONES, 16);
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                wgmma_pv(acc_o, pa[kk], sw128_desc_at(v_lo, kk * 16 * 128));
                if constexpr (ROWSUM_MMA) wgmma_rowsum(acc_l, pa[kk], sw128_desc_at(ones_lo, 0));
            }
            wgmma_commit();
        };
        // Softcap into the log2 domain (otherwise the softmax scales), mask edge
        // tiles, online softmax; returns the rescale factors of O in `alpha`.
        auto softmax_tile = [&](int n0, float (&alpha)[2]) {
            if constexpr (SOFTCAP) {
#pragma unroll
                for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc_s[0][j][e] = p.softcap_post * fast_tanh(acc_s[0][j][e] * p.softcap_pre);
            }
            const bool edge = (n0 + BLOCK_N > w.sk) || (MASK_KIND != 0 &&
                (win.key_lo(last_row) > n0 || win.key_hi(w.m0) < n0 + BLOCK_N - 1));
            if (edge) apply_mask<1, BLOCK_N>(acc_s, win, row0, n0 + 2 * t);
            auto keep = [&](int, int r, float a) { alpha[r] = a; };
            online_softmax<1, BLOCK_N / 8, decltype(keep), LAZY_MAX, !ROWSUM_MMA>(acc_s, row_max, row_sum,
                                                                                SOFTCAP ? 1.f : p.scale_log2, keep);
        };
        // With the lazy reference max, skipped by the whole warp when none of
        // its rows raised its reference (alpha is then exactly 1): after the
        // first key tiles, almost always.
        auto rescale_o = [&](const float (&alpha)[2]) {
            if (LAZY_MAX && !__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
            for (int j = 0; j < DV / 8; ++j) {
                acc_o[j][0] *= alpha[0];
                acc_o[j][1] *= alpha[0];
                acc_o[j][2] *= alpha[1];
                acc_o[j][3] *= alpha[1];
            }
            if constexpr (ROWSUM_MMA) {
                acc_l[0] *= alpha[0];
                acc_l[2] *= alpha[1];
            }
        };
        // P as bf16/f16 A fragments: the S accumulator of two n-tiles is the A
        // fragment of one k-step. Packed whole before the wgmma fence, so that
        // the P V wgmmas issue back to back.
        auto pack_p = [&]() {
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                pa[kk][0] = pack2(acc_s[0][2 * kk][0], acc_s[0][2 * kk][1]);
                pa[kk][1] = pack2(acc_s[0][2 * kk][2], acc_s[0][2 * kk][3]);
                pa[kk][2] = pack2(acc_s[0][2 * kk + 1][0], acc_s[0][2 * kk + 1][1]);
                pa[kk][3] = pack2(acc_s[0][2 * kk + 1][2], acc_s[0][2 * kk + 1][3]);
            }
        };
        // This warp is done with K (V) of key tile `it`, or with Q.
        auto release_k = [&](int it) {
            __syncwarp();
            if (!pair) {
                if (lane == 0) mbar_arrive(k_empty(slot(it)));
            } else if (lane < 2) {
                mbar_arrive_cluster(k_empty(slot(it)), rank ^ lane);   // lane 0 here, lane 1 on the peer
            }
        };
        auto release_q = [&]() {
            __syncwarp();
            if (lane == 0) mbar_arrive(q_empty);
        };
        // Q_REGS: this warp's rows of Q into registers. ldmatrix.x4's four
        // 8 x 8 matrices are the A fragment's (rows 0-7 and 8-15, columns 0-7,
        // then 8-15): lane l gives the address of row l % 8 of matrix l / 8.
        // Rows are 128 bytes of a 64-column chunk, 16-byte unit u of row r
        // stored at u ^ (r % 8) (128-byte swizzle; r % 8 = l % 8 here).
        auto load_q = [&]() {
            const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const unsigned row = q_rows + (unsigned)r * 128u;
#pragma unroll
            for (int ks = 0; ks < QK_KSTEPS; ++ks) {
                const unsigned unit = (ks % 4) * 2 + (lane >> 4);
                ldmatrix_x4(qa[ks], row + (ks / 4) * BLOCK_M * 128 + ((unit ^ (unsigned)(lane & 7)) << 4));
            }
        };
        auto release_v = [&](int it) {
            __syncwarp();
            if (!pair) {
                if (lane == 0) mbar_arrive(v_empty(slot(it)));
            } else if (lane < 2) {
                mbar_arrive_cluster(v_empty(slot(it)), rank ^ lane);
            }
        };

        // The key tiles this warpgroup's rows see (WG_STOPS): a prefix of the
        // tile's (under a causal mask, or a window bounded on the right, a
        // later warpgroup sees more keys); none where its rows lie outside the
        // sequence. From key tile `mine` on the warpgroup only takes its
        // turns and releases the K/V slots (the tiles would add exact zeros).
        // Elsewhere (neither WG_STOPS nor SKIP_EMPTY_WG) mine = n_tiles, and the
        // branches on it fold away.
        int mine = n_tiles;
        if constexpr (WG_STOPS) {
            const int r_lo = max(w.m0 + cw * 64, 0), r_hi = min(w.m0 + cw * 64 + 63, w.sq - 1);
            mine = r_lo > r_hi ? 0 : key_tiles_through(win, w.sk, w.n_begin, r_hi);
            mine = max(min(mine, n_tiles), 0);
        } else if constexpr (SKIP_EMPTY_WG) {
            // Otherwise only a warpgroup whose rows all lie outside the
            // sequence skips (SKIP_EMPTY_WG): in a sequence's last query block
            // where block_m does not divide its length (at 2048 rows and block_m
            // 192 the last block's third warpgroup), or before its start (TAIL_FIRST).
            if (max(w.m0 + cw * 64, 0) > min(w.m0 + cw * 64 + 63, w.sq - 1)) mine = 0;
        }
        if (n_tiles > 0) mbar_wait(bar_q, q_loads & 1);
        TRACE(EV_Q_READY);
        // Q_REGS: Q into registers (where the warpgroup has key tiles), and
        // its buffer free for the next tile's Q at once.
        if (Q_REGS && n_tiles > 0) {
            if (mine > 0) load_q();
            release_q();
        }
{% if pipelined %}
{% if pingpong %}
        if (n_tiles > 0 && cw == CONSUMERS - 1 && !turn_passed) named_bar_arrive(1, 256);
{% endif %}
        // Software-pipelined by one tile: while the tensor cores run S(it) and
        // P(it-1) V(it-1), the warpgroup waits only for S(it) and does its
        // softmax as the P V product finishes.
        if (mine > 0) {
            mbar_wait(k_full(slot(0)), phase(0));
            TRACE(EV_K_READY);
            take_turn();
            TRACE(EV_TURN);
            wgmma_fence();
            issue_qk(slot(0));
            pass_turn(false);
            wgmma_wait<0>();
            TRACE(EV_S_DONE);
            release_k(0);
            if (!Q_REGS && mine == 1) release_q();       // this warpgroup's last S: Q is free for the next tile
            float alpha[2];
            softmax_tile(w.n_begin, alpha);              // O is still zero: alpha unused
            pack_p();
            TRACE(EV_SOFTMAX_DONE);
{% if softmax_under_pv %}
            mbar_wait(v_full(slot(0)), phase(0));
            TRACE(EV_V_READY);
{% endif %}
        }
        for (int it = 1; it < mine; ++it) {
            mbar_wait(k_full(slot(it)), phase(it));
            TRACE(EV_K_READY | it << 8);
{% if not softmax_under_pv %}
            mbar_wait(v_full(slot(it - 1)), phase(it - 1));
            TRACE(EV_V_READY | it << 8);
{% endif %}
            take_turn();
            TRACE(EV_TURN | it << 8);
            wgmma_fence();
            issue_qk(slot(it));
            issue_pv(slot(it - 1));
            pass_turn(false);
            wgmma_wait<1>();                             // S(it) ready; P V may still run
            TRACE(EV_S_DONE | it << 8);
            release_k(it);
            if (!Q_REGS && it == mine - 1) release_q();
            float alpha[2];
            softmax_tile(w.n_begin + it * BLOCK_N, alpha);
            TRACE(EV_SOFTMAX_DONE | it << 8);
{% if softmax_under_pv %}
            // V(it)'s wait here is also a block boundary: without it ptxas
            // hoists the P V wait below above the softmax (to interleave P's
            // packing into the registers that P V still reads).
            mbar_wait(v_full(slot(it)), phase(it));
            TRACE(EV_V_READY | it << 8);
{% endif %}
            wgmma_wait<0>();                             // P(it-1) V(it-1) done
            TRACE(EV_PV_DONE | it << 8);
            release_v(it - 1);
            rescale_o(alpha);
            pack_p();
        }
        find_next();
        const bool chain_turns = WALK && have_next && next_w.n_tiles > 0;
        // This warpgroup's last P V, in its turn `mine` (the tile's last turn
        // where it sees all key tiles).
        if (mine > 0) {
            if (mine < n_tiles) mbar_wait(k_full(slot(mine)), phase(mine));
{% if not softmax_under_pv %}
            mbar_wait(v_full(slot(mine - 1)), phase(mine - 1));
            TRACE(EV_V_READY | mine << 8);
{% endif %}
            take_turn();
            TRACE(EV_TURN | mine << 8);
            wgmma_fence();
            issue_pv(slot(mine - 1));
            pass_turn(mine == n_tiles && !chain_turns);
            if (mine < n_tiles) {
                release_k(mine);
{% if softmax_under_pv %}
                mbar_wait(v_full(slot(mine)), phase(mine));
{% endif %}
            }
            wgmma_wait<0>();
            TRACE(EV_PV_DONE | mine << 8);
            release_v(mine - 1);
        }
        // The turns past it (none where it sees all key tiles): each passes
        // on at once and releases the K and V slots that the others read.
        if (n_tiles > 0) {
            if (!Q_REGS && mine == 0) release_q();
            for (int it = mine > 0 ? mine + 1 : 0; it <= n_tiles; ++it) {
                if (it < n_tiles) mbar_wait(k_full(slot(it)), phase(it));
{% if not softmax_under_pv %}
                if (it > 0) mbar_wait(v_full(slot(it - 1)), phase(it - 1));
{% endif %}
                take_turn();
                pass_turn(it == n_tiles && !chain_turns);
                if (it < n_tiles) {
                    release_k(it);
{% if softmax_under_pv %}
                    mbar_wait(v_full(slot(it)), phase(it));
{% endif %}
                }
                if (it > 0) release_v(it - 1);
            }
            turn_passed = chain_turns;
        }
{% else %}
        // One tile at a time: S, softmax, P V (the other consumer warpgroup
        // fills the tensor cores meanwhile).
        for (int it = 0; it < mine; ++it) {
            mbar_wait(k_full(slot(it)), phase(it));
            wgmma_fence();
            issue_qk(slot(it));
            wgmma_wait<0>();
            release_k(it);
            float alpha[2];
            softmax_tile(w.n_begin + it * BLOCK_N, alpha);
            rescale_o(alpha);
            pack_p();
            mbar_wait(v_full(slot(it)), phase(it));
            wgmma_fence();
            issue_pv(slot(it));
            wgmma_wait<0>();
            release_v(it);
        }
        // The key tiles past this warpgroup's own: their slots are released unread.
        for (int it = mine; it < n_tiles; ++it) {
            mbar_wait(k_full(slot(it)), phase(it));
            release_k(it);
            mbar_wait(v_full(slot(it)), phase(it));
            release_v(it);
        }
        if (!Q_REGS && n_tiles > 0) release_q();
        find_next();
{% endif %}
        if (n_tiles > 0) ++q_loads;
        ring_par ^= ring_flips(max(n_tiles, 0));

        // Epilogue: normalize, write O (elements) and LSE (f32, natural log;
        // a null p.lse means not wanted). A quad holds 8 columns of a row per
        // accumulator n-tile j, 2 per lane; a transpose within the quad gives
        // each lane 8 consecutive columns of one of four n-tiles, written as
        // one 16-byte store (the launcher checks 16-byte aligned rows): a
        // quarter of the store instructions of pair-wise stores, and whole
        // 32-byte sectors (measured: the pair-wise form took a fifth of a
        // work tile at seqlen 512).
        elem_t* gO = p.o + w.b * p.o_sb + (long long)w.q_off * p.o_ss + w.h * p.o_sh;
        float* gL = p.lse != nullptr ? p.lse + w.b * p.lse_sb + w.h * p.lse_sh + w.q_off : nullptr;
        // Both rows' values are packed and transposed first (independent
        // shuffle chains that interleave), then each row's stores go out
        // from one row pointer under one bounds test.
        constexpr int GROUPS = (DV / 8 + 3) / 4;
        unsigned v[2][GROUPS][4];
        float l[2], inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // ROWSUM_MMA: the whole row's sum is in every column (no quad sum).
            l[r] = ROWSUM_MMA ? acc_l[2 * r] : quad_sum(row_sum[0][r]);
            inv[r] = l[r] > 0.f ? fast_rcp(l[r]) : 0.f;   // O is rounded to 16 bits after it
        }
        pack_rows_for_16b_stores(acc_o, inv, t, v);   // this lane: n-tile 4g + t of each group g
        // LSE (f32, natural log; -inf where a row saw no key) of this thread's row r, i.
        auto store_lse = [&](int r, int i) {
            if (t == 0 && gL != nullptr)
                gL[i] = l[r] > 0.f ? (row_max[0][r] + fast_log2(l[r])) * 0.6931471805599453f : NEG_INF;
        };
        if constexpr (O_TMA) {
            // This warpgroup's 64 rows through shared memory, then one TMA
            // store per 64-column chunk (rows past the sequence's end, or
            // before its start, lie outside the tensor map and are not written).
            // Lane (g, t) holds 16-byte unit 4 (grp % 2) + t of chunk grp / 2
            // of rows g and g + 8; a row's units are swizzled by the row % 8 = g.
            const unsigned s_o = base + OFF_O + (unsigned)cw * O_STAGE_BYTES;
            const bool elected = tid % 128 == 0;
            // The previous tile's stores must have read the staging first.
            if (elected) bulk_wait_read<0>();
            named_bar_sync(1 + CONSUMERS + cw, 128);
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int gr = 0; gr < GROUPS; ++gr)
                    if ((4 * gr + t) * 8 < DV) {
                        const unsigned row = (unsigned)(warp * 16 + g + 8 * r);
                        const unsigned unit = (unsigned)(4 * (gr % 2) + t) ^ (unsigned)g;
                        st_shared_v4(s_o + (unsigned)(gr / 2) * 8192u + row * 128u + unit * 16u, v[r][gr]);
                    }
            fence_proxy_async_shared();                  // the writes, visible to TMA
            named_bar_sync(1 + CONSUMERS + cw, 128);
            if (elected) {
#pragma unroll
                for (int c = 0; c < V_CHUNKS; ++c)
                    tma_store_4d(&to, s_o + (unsigned)c * 8192u, c * 64, w.q_off + w.m0 + cw * 64, w.h, w.b);
                bulk_commit();
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = row0 + 8 * r;
                if (i < w.sq && (!TAIL_FIRST || i >= 0)) store_lse(r, i);
            }
        } else {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = row0 + 8 * r;
                if (i < w.sq && (!TAIL_FIRST || i >= 0)) {
                    elem_t* row = gO + i * p.o_ss + 8 * t;
#pragma unroll
                    for (int g = 0; g < GROUPS; ++g)
                        if ((4 * g + t) * 8 < D_V)
                            *reinterpret_cast<uint4*>(row + 32 * g) = make_uint4(v[r][g][0], v[r][g][1], v[r][g][2], v[r][g][3]);
                    store_lse(r, i);
                }
            }
        }
        TRACE(EV_EPI_DONE);
    TILE_LOOP_END
    // O_TMA: the block's shared memory must outlive the last stores' reads,
    // and their writes complete before the block retires.
    if constexpr (O_TMA) {
        if (tid % 128 == 0) bulk_wait<0>();
    }
    if (pair) cluster_sync();
#ifdef ATTNFORGE_TRACE
    if (tid % 128 == 0) trace_block_end();
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, {{ min_blocks }})
{{ entry }}(const __grid_constant__ FwdParams p, const __grid_constant__ TmaMap tq,
            const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv{% if tma_store_o %},
            const __grid_constant__ TmaMap to{% endif %}) {
    fwd_tiles<false>(p, tq, tk, tv, {% if tma_store_o %}to{% else %}tv{% endif %});
}
{% if persistent %}
extern "C" __global__ void __launch_bounds__(THREADS, {{ min_blocks }})
{{ entry }}_walk(const __grid_constant__ FwdParams p, const __grid_constant__ TmaMap tq,
                 const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv{% if tma_store_o %},
                 const __grid_constant__ TmaMap to{% endif %}) {
    fwd_tiles<true>(p, tq, tk, tv, {% if tma_store_o %}to{% else %}tv{% endif %});
}
{% endif %}
