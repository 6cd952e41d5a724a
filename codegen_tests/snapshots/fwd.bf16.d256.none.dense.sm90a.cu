// attnforge generated kernel: fwd.bf16.d256.none.dense.sm90a
// template fwd_sm90a.cu — Hopper forward. One producer warpgroup moves Q (once
// per work tile) and K/V tiles through a 2-stage ring with TMA (128-byte swizzle,
// completion on mbarriers); 2 consumer warpgroups own 64 query rows each and
// run S = QK^T (wgmma, both operands in shared memory), the online softmax in
// registers, and O += PV (wgmma, P from registers, V read transposed).
// Work tiles in the order of tile_at (head-major). Entries:
//   attnforge_fwd_bf16_d256_none_dense_sm90a: one tile per block.
//   attnforge_fwd_bf16_d256_none_dense_sm90a_walk: the resident blocks walk the tiles in a snake over
//   rounds of gridDim.x tiles, the next tile's Q loading while this tile's
//   last P V and epilogue run; the launcher takes it for short keys
//   (plan::sm90a_walk_pays).
// Plan: block_m=128 block_n=80 stages=2 registers 24/240
// consumer loop: pipelined by one tile (S of the next tile issued before P V of this one), the consumer warpgroups taking turns at the tensor cores (ping-pong).
// Do not edit: rendered by attnforge from templates/fwd_sm90a.cu.

constexpr int CONSUMERS = 2;           // consumer warpgroups
constexpr int BLOCK_M = 64 * CONSUMERS;             // query rows per block
constexpr int BLOCK_N = 80;               // keys per main-loop step
constexpr int STAGES = 2;                 // K/V ring depth
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int D_QK = 256;
static_assert(D_QK <= 16 * 16 && D_QK <= 64 * 4, "head dim covered by the k-steps and chunks");
constexpr int D_V = 256;
constexpr int DV = 256;                    // O accumulator columns (wgmma N)
constexpr int QK_CHUNKS = 4;           // 64-element (128-byte) column chunks of Q and K
constexpr int V_CHUNKS = 4;
constexpr int QK_KSTEPS = 16;           // 16-wide k-steps of S = QK^T
constexpr int MASK_KIND = 0;
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
constexpr bool IS_THD = false;
constexpr bool SOFTCAP = false;
// The softmax's lazy reference max and O's skipped rescale (common/softmax.cuh),
// taken with the softmax under the previous P V (plan's softmax_under_pv).
constexpr bool LAZY_MAX = true;
// Row sums on the tensor cores (plan's rowsum_mma): P times a block of ones
// beside every P V k-step, in place of the softmax's FADDs.
constexpr bool ROWSUM_MMA = false;
// Causal query blocks aligned to the sequence's end (plan's tail_first): the
// partial block is the first (and shortest) one.
constexpr bool TAIL_FIRST = false;
constexpr bool O_TMA = false;
// Q in registers (plan's q_regs): each consumer warpgroup copies its 64 rows
// of Q into the A fragments of every k-step as soon as they land and frees
// the buffer at once; S is then a register-sourced wgmma that reads only K
// from shared memory.
constexpr bool Q_REGS = false;
// Clusters of two on the one-tile entry (plan's cluster_m; see `pair` below).
constexpr int CLUSTER_M = 1;
// The one-tile entry's blocks in phases by tile length (common/order.cuh).
constexpr bool PHASED = (MASK_KIND == 1 || MASK_KIND == 2) && !IS_THD;
// Ragged one-tile grids: the sequences longest keys first (common/order.cuh's
// ragged_order, where p.ragged_order is set), up to RAGGED_ORDER_MAX_BATCH
// sequences. Its tile numbers are head-major ones: the query-block-major order
// keeps the grid's (session 22: mapped through it, blocks went missing).
constexpr bool HEAD_MAJOR = true;
// The walk over a ragged batch takes its tiles in the same order (sequences
// longest keys first) where its blocks have at most WALK_ORDER_ROUNDS rounds:
// each block's tile numbers, one per round, in a table in shared memory that
// every warp fills before the role split (ragged_order is warp-collective;
// the producer runs on one thread). 0 on dense plans (no table).
constexpr int WALK_ORDER_ROUNDS = 0;

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

// ---- common/ptx.cuh: header-free device helpers (inline PTX) -----------------
// Kernels are compiled by NVRTC with no include path: no cuda_fp16.h or
// cuda_bf16.h. Elements travel as raw 16-bit patterns; conversions and
// tensor-core operations go through the PTX below.

typedef unsigned short elem_t;      // one f16/bf16 element, raw bits
typedef unsigned int elem2_t;       // two packed elements, low half = lower index

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination
// without reading global memory.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
// 4-byte async copy global -> shared (.ca: sizes below 16 bytes have no .cg).
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, f32 accumulation.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16, row) * B(16x8, col), f32: the first k-step of a product, with no
// accumulator to clear first (C is a zero operand: ptxas reads RZ).
__device__ __forceinline__ void mma_16816_first(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const float z = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %10, %10, %10, %10 };\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

// Round two floats to the element type (nearest even) and pack them.
__device__ __forceinline__ elem2_t pack2(float lo, float hi) {
    elem2_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float fast_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// Transpose a 4 x 4 matrix of 32-bit values held one row per lane by the
// four lanes of a quad (lane t of the quad holds row t in v[0..3]): after
// it, lane t holds column t, v[k] = the old v[t] of lane k. Two butterfly
// rounds of two shuffles each: first the off-diagonal 2 x 2 blocks change
// places (lanes t and t ^ 2), then each 2 x 2 block is transposed (lanes t
// and t ^ 1). Every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(unsigned (&v)[4], int t) {
    const bool hi2 = t & 2, hi1 = t & 1;
    unsigned a = hi2 ? v[0] : v[2], b = hi2 ? v[1] : v[3];
    a = __shfl_xor_sync(0xffffffffu, a, 2);
    b = __shfl_xor_sync(0xffffffffu, b, 2);
    if (hi2) { v[0] = a; v[1] = b; } else { v[2] = a; v[3] = b; }
    a = hi1 ? v[0] : v[1];
    b = hi1 ? v[2] : v[3];
    a = __shfl_xor_sync(0xffffffffu, a, 1);
    b = __shfl_xor_sync(0xffffffffu, b, 1);
    if (hi1) { v[0] = a; v[2] = b; } else { v[1] = a; v[3] = b; }
}

// The epilogue's 16-byte rows: rows g and g + 8 of one m16 accumulator tile
// of NT 8-column n-tiles (row r in acc[j][2r], acc[j][2r + 1]), scaled by
// inv[r] and packed to 16-bit pairs, then transposed within each quad, so
// that v[r][gr] holds 8 consecutive columns (n-tile 4 gr + t) of row r for
// lane t. Both rows are packed before any shuffle (independent chains).
template <int NT>
__device__ __forceinline__ void pack_rows_for_16b_stores(const float (&acc)[NT][4], const float (&inv)[2], int t,
                                                         unsigned (&v)[2][(NT + 3) / 4][4]) {
    constexpr int GROUPS = (NT + 3) / 4;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int gr = 0; gr < GROUPS; ++gr)
#pragma unroll
            for (int k = 0; k < 4; ++k)
                v[r][gr][k] = 4 * gr + k < NT ? pack2(acc[4 * gr + k][2 * r] * inv[r], acc[4 * gr + k][2 * r + 1] * inv[r])
                                              : 0u;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int gr = 0; gr < GROUPS; ++gr) quad_transpose(v[r][gr], t);
}

#define NEG_INF (__int_as_float(0xff800000))

// ---- common/hopper.cuh: sm90a device helpers (inline PTX) ---------------------
// mbarriers, the tensor memory accelerator (TMA), warpgroup MMA (wgmma)
// fences and shared-memory matrix descriptors, register reallocation.

// A CUtensorMap as the driver encodes it (cuTensorMapEncodeTiled): 128 opaque
// bytes, 64-byte aligned, passed by value as a __grid_constant__ parameter.
struct __align__(64) TmaMap {
    unsigned long long opaque[16];
};

// ---- mbarriers (shared::cta, 8 bytes each) ----
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// Arrive once and announce `bytes` more of asynchronous transactions.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Block until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n"
            " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// Make barrier initialisation (generic proxy) visible to the async proxy (TMA).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- TMA: a 4-D tile (d, row, head, batch) into shared memory, completing on `bar` ----
__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, unsigned bar,
                                            int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// tma_load_4d with an L2 eviction priority for the lines it reads (`policy`
// from l2_policy_evict_first / l2_policy_evict_last).
__device__ __forceinline__ void tma_load_4d_hint(unsigned dst, const TmaMap* map, unsigned bar,
                                                 int c0, int c1, int c2, int c3, unsigned long long policy) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
           "l"(policy)
        : "memory");
}
// L2 cache policies: lines read once go first, lines that other blocks will
// read again (a head's K and V) stay longest.
__device__ __forceinline__ unsigned long long l2_policy_evict_first() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ unsigned long long l2_policy_evict_last() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

// ---- clusters: the block's rank, the cluster's size, a cluster-wide barrier ----
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_nctarank() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return n;
}
// Every thread of every block in the cluster arrives, then waits for all.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrive on the mbarrier at shared-memory offset `bar` of block `rank` of
// the cluster (the executing block's own rank arrives locally).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
    asm volatile(
        "{\n .reg .b32 ra;\n"
        " mapa.shared::cluster.u32 ra, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
        :: "r"(bar), "r"(rank) : "memory");
}
// tma_load_4d into the same shared-memory offset of every block in
// `cta_mask`, completing on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_4d_multicast(unsigned dst, const TmaMap* map, unsigned bar,
                                                      int c0, int c1, int c2, int c3, unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
           "h"(cta_mask)
        : "memory");
}

// ---- wgmma ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }

// Shared-memory matrix descriptor for a 128-byte-swizzled tile whose rows are
// 128 bytes (64 elements) wide, as TMA writes it with SWIZZLE_128B: 8-row
// groups 1024 bytes apart (stride byte offset); `lbo` is the byte distance
// between 64-element column chunks (used by MN-major operands only). In two
// halves: the low word (start address >> 4 in bits 0-13, lbo >> 4 in bits
// 16-29) and a constant high word (base offset 1024 >> 4 in bits 32-45,
// swizzle mode 1, 128 B, in bits 62-63).
constexpr unsigned SW128_DESC_HI = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ unsigned sw128_desc_lo(unsigned addr, unsigned lbo) {
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16);
}
// A loop of descriptors at constant offsets from one base takes the low word
// once and forms each descriptor with one 32-bit add (ptxas otherwise redoes
// the mask, shift and OR per descriptor, as the mask does not distribute over
// the add): sw128_desc_at(sw128_desc_lo(addr, lbo), off) == sw128_desc(addr +
// off, lbo) for every 16-byte multiple `off` with addr + off in the block's
// shared memory, since shared::cta addresses stay below 228 KB, so (addr +
// off) >> 4 < 2^14 fits the 14-bit field and the add never carries into bits
// 14-15 or the lbo field.
__device__ __forceinline__ unsigned long long sw128_desc_at(unsigned lo, unsigned off) {
    return ((unsigned long long)SW128_DESC_HI << 32) | (lo + (off >> 4));
}
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo) {
    return sw128_desc_at(sw128_desc_lo(addr, lbo), 0);
}

// ---- register reallocation between warpgroups ----
template <int N>
__device__ __forceinline__ void regs_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N)); }
template <int N>
__device__ __forceinline__ void regs_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N)); }

// ---- named barriers: `threads` (a multiple of 32) arrive, the syncing ones wait ----
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// TMA store of a 4-D box from shared memory (the layout of `map`'s box and
// swizzle); completion tracked per thread in bulk groups. Elements outside
// the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const TmaMap* map, unsigned src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n"
        :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups have not finished reading their source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory"); }
// Until at most N of this thread's bulk groups are not complete.
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory"); }
// Generic-proxy writes to shared memory, ordered before later async-proxy reads of it.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void st_shared_v4(unsigned addr, const unsigned (&v)[4]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" :: "r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}

// ---- common/mask.cuh: which keys a query row sees ------------------------------
// MASK_KIND: 0 none, 1 causal top-left, 2 causal bottom-right, 3 sliding window
// (left, right around the bottom-right diagonal; -1 = unbounded).
// Row i sees keys j with key_lo(i) <= j <= key_hi(i), clipped to [0, seqlen_k).

struct RowWindow {
    int diag;        // seqlen_k - seqlen_q: row i's bottom-right diagonal key is i + diag
    int last_key;    // seqlen_k - 1
    int left, right;

    __device__ __forceinline__ RowWindow(int seqlen_q, int seqlen_k, int left_, int right_)
        : diag(seqlen_k - seqlen_q), last_key(seqlen_k - 1), left(left_), right(right_) {}

    __device__ __forceinline__ int key_lo(int i) const {
        if (MASK_KIND == 3 && left >= 0) return max(0, i + diag - left);
        return 0;
    }
    __device__ __forceinline__ int key_hi(int i) const {
        if (MASK_KIND == 1) return min(last_key, i);
        if (MASK_KIND == 2) return min(last_key, i + diag);
        if (MASK_KIND == 3 && right >= 0) return min(last_key, i + diag + right);
        return last_key;
    }
};

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

// ---- common/fwd_params.cuh: the forward kernels' parameter block ------------------
// Launch parameters; the layout matches `attnforge::launch::FwdParams` (repr C).
struct FwdParams {
    const elem_t* q; const elem_t* k; const elem_t* v; elem_t* o; float* lse;  // lse: null = not written
    const int* cu_seqlens_q; const int* cu_seqlens_k;    // THD only
    long long q_sb, q_ss, q_sh;                          // strides in elements
    long long k_sb, k_ss, k_sh;
    long long v_sb, v_ss, v_sh;
    long long o_sb, o_ss, o_sh;
    long long lse_sb, lse_sh;                            // lse[b*sb + h*sh + row]
    int batch, heads_q, heads_kv, gqa_ratio;
    int seqlen_q, seqlen_k;                              // dense: lengths; THD: maxima
    int window_left, window_right;
    float scale_log2;                                    // softmax scale * log2(e)
    float softcap_pre;                                   // scale / cap
    float softcap_post;                                  // cap * log2(e)
    int num_m_blocks;
    int tile_phases;                                     // causal one-tile order (common/order.cuh)
    int ragged_order;                                    // ragged one-tile order: longest keys first (order.cuh)
};

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


// Tracing (gpu_bench --trace90): the producer and lane 0 of each consumer
// warpgroup's first warp stamp their events.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_ROLES = 4;
#endif
// ---- common/trace.cuh: SM clock stamps of a tracing build ---------------------
// Compiled in only where ATTNFORGE_TRACE is defined (gpu_bench --trace90 and
// --trace80b prepend it to a rendered plan); the planner's kernels have none
// of this. The including template defines TRACE_ROLES, the threads per
// block that stamp. In the first TRACE_BLOCKS blocks each role records up to
// TRACE_EVENTS stamps, (event << 40) | SM clock bits 0..39, into
// attnforge_trace; every block records its SM, start and end
// (%globaltimer, ns) into attnforge_trace_grid. The host zeroes both before
// a traced launch and reads them through the module's globals.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_BLOCKS = 4, TRACE_EVENTS = 2048, TRACE_GRID = 1 << 16;
__device__ unsigned long long attnforge_trace[TRACE_BLOCKS * TRACE_ROLES * TRACE_EVENTS];
__device__ unsigned long long attnforge_trace_grid[TRACE_GRID * 3];
struct Tracer {
    unsigned long long* out = nullptr;
    int n = 0;
    __device__ __forceinline__ void operator()(unsigned event) {
        if (out != nullptr && n < TRACE_EVENTS)
            out[n++] = ((unsigned long long)event << 40) | (clock64() & ((1ull << 40) - 1));
    }
};
__device__ __forceinline__ unsigned block_linear() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ Tracer tracer_for(int role) {
    Tracer t;
    if (block_linear() < TRACE_BLOCKS) t.out = attnforge_trace + (block_linear() * TRACE_ROLES + role) * TRACE_EVENTS;
    return t;
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}
// One thread per block, at its start.
__device__ __forceinline__ void trace_block_start() {
    if (block_linear() < TRACE_GRID) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        attnforge_trace_grid[3 * block_linear()] = sm;
        attnforge_trace_grid[3 * block_linear() + 1] = global_ns();
    }
}
// Any threads of the block, at their end (the latest counts).
__device__ __forceinline__ void trace_block_end() {
    if (block_linear() < TRACE_GRID) atomicMax(&attnforge_trace_grid[3 * block_linear() + 2], global_ns());
}
#define TRACE(event) tr(event)
#else
#define TRACE(event)
#endif

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
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39 },\n"
        "%40, %41, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
        : "l"(qd), "l"(kd), "r"(acc));
}

// The same with Q's k-step from registers (Q_REGS): the A fragment of rows
// 16 w .. 16 w + 15 in warp w, as for mma.m16n8k16.
__device__ __forceinline__ void wgmma_qk_rs(float (&d)[BLOCK_N / 8][4], const unsigned (&a)[4], unsigned long long kd,
                                            int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39 },\n"
        "{ %40, %41, %42, %43 }, %44, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(kd), "r"(acc));
}

// O (64 x DV) += P (64 x 16, registers) V (16 x DV); V is stored row-major
// (DV contiguous), i.e. MN-major for this product: transposed B.
__device__ __forceinline__ void wgmma_pv(float (&d)[DV / 8][4], const unsigned (&a)[4], unsigned long long vd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 },\n"
        "{ %128, %129, %130, %131 }, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
          "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
          "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
          "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
          "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
          "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
          "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
          "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
          "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
          "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
          "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
          "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
          "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
          "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
          "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
          "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
          "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
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
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16\n"
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
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" :: "r"(base + OFF_ONES + 16u * tid), "r"(one2) : "memory");
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
        regs_release<24>();
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
    regs_claim<240>();
    const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;   // warp-uniform (lets ptxas use uniform registers)
    const int warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const unsigned q_rows = sQ + cw * 64 * 128;          // this warpgroup's 64 rows in each chunk
#ifdef ATTNFORGE_TRACE
    Tracer tr = tid % 128 == 0 ? tracer_for(1 + cw) : Tracer{};
#endif

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

        float row_max[1][2] = {{NEG_INF, NEG_INF}}, row_sum[1][2] = {{0.f, 0.f}};
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


        if (n_tiles > 0 && cw == CONSUMERS - 1 && !turn_passed) named_bar_arrive(1, 256);

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

            mbar_wait(v_full(slot(0)), phase(0));
            TRACE(EV_V_READY);

        }
        for (int it = 1; it < mine; ++it) {
            mbar_wait(k_full(slot(it)), phase(it));
            TRACE(EV_K_READY | it << 8);

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

            // V(it)'s wait here is also a block boundary: without it ptxas
            // hoists the P V wait below above the softmax (to interleave P's
            // packing into the registers that P V still reads).
            mbar_wait(v_full(slot(it)), phase(it));
            TRACE(EV_V_READY | it << 8);

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

            take_turn();
            TRACE(EV_TURN | mine << 8);
            wgmma_fence();
            issue_pv(slot(mine - 1));
            pass_turn(mine == n_tiles && !chain_turns);
            if (mine < n_tiles) {
                release_k(mine);

                mbar_wait(v_full(slot(mine)), phase(mine));

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

                take_turn();
                pass_turn(it == n_tiles && !chain_turns);
                if (it < n_tiles) {
                    release_k(it);

                    mbar_wait(v_full(slot(it)), phase(it));

                }
                if (it > 0) release_v(it - 1);
            }
            turn_passed = chain_turns;
        }

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

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attnforge_fwd_bf16_d256_none_dense_sm90a(const __grid_constant__ FwdParams p, const __grid_constant__ TmaMap tq,
            const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv) {
    fwd_tiles<false>(p, tq, tk, tv, tv);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attnforge_fwd_bf16_d256_none_dense_sm90a_walk(const __grid_constant__ FwdParams p, const __grid_constant__ TmaMap tq,
                 const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv) {
    fwd_tiles<true>(p, tq, tk, tv, tv);
}

