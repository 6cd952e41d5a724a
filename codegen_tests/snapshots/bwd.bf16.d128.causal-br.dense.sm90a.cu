// attnforge generated kernel: bwd.bf16.d128.causal-br.dense.sm90a
// template bwd_sm90a.cu — Hopper backward (fast mode): every product on wgmma.
// One block per (kv tile of 128 rows, batch, kv head), two warpgroups of
// 64 kv rows each; all 256 threads stage the query tiles (64 rows of Q,
// dO, LSE, Dsum; next tile prefetched) with cp.async into 128-byte-swizzled
// shared memory, the layout wgmma's descriptors read.
// Do not edit: rendered by attnforge from templates/bwd_sm90a.cu.
//
// Entry points (the BwdParams of common/bwd_common.cuh), launched in this order:
//   attnforge_bwd_bf16_d128_causal_br_dense_sm90a_pre          Dsum = rowsum(dO * O) in f32 (LSE layout); zero dq_accum
//   attnforge_bwd_bf16_d128_causal_br_dense_sm90a              main: dK, dV; dQ added to the f32 dq_accum (red.global.add.v4.f32)
//   attnforge_bwd_bf16_d128_causal_br_dense_sm90a_dq_convert   dQ = scale * dq_accum, in the element type
//
// Per query tile, warpgroup w (kv rows n0 + 64w ..):
//   S^T  = K_w Q^T,  dP^T = V_w dO^T        wgmma, both operands K-major in shared memory
//   P^T in registers (common/bwd_common.cuh: score_prob), kept as bf16/f16 fragments; then dP^T and dS^T
//   dV_w += P^T dO,  dK_w += dS^T Q          wgmma, A = P^T / dS^T fragments from
//                                            registers, B = dO / Q read MN-major
//   dS^T -> shared memory; dQ (64 x 64 per warpgroup) = dS K over all 128 kv rows,
//   the warpgroups splitting dQ's columns; A = dS^T read MN-major, B = K read MN-major.
// Notation as in bwd_sm80.cu: dS here is dZ / scale; dK and dQ take `scale` at the end.

constexpr int BLOCK_M = 64;               // query rows per step
constexpr int BLOCK_N = 128;               // kv rows per block (64 per warpgroup)
constexpr int THREADS = 256;
constexpr int D_QK = 128;                     // real head dims
constexpr int D_V = 128;
constexpr int DQK = 128;                  // padded: 64-column (128-byte) chunks
constexpr int DV = 128;
constexpr int QK_CHUNKS = DQK / 64, V_CHUNKS = DV / 64;
constexpr int M_TILES = BLOCK_M / 8;                // 8-column tiles of S^T (query columns)
constexpr int M_KSTEPS = BLOCK_M / 16;              // k-steps of the products over query rows
constexpr int DQ_N = 64;                     // dQ columns per warpgroup
// How the warpgroups share dQ = dS K (64 x DQ_N each): 0 = each over its own
// 64 kv rows (both add the same dQ tile), 1 = split dQ's columns, 2 = split
// dQ's rows (128-row query tiles).
constexpr int DQ_SPLIT = 1;
constexpr int MASK_KIND = 2;
constexpr bool IS_THD = false;
constexpr bool SOFTCAP = false;
constexpr bool DETERMINISTIC = false;
constexpr int ROW_WARPS = 4;           // _pre / _dq_convert: one (token, head) row per warp
constexpr int DQ_G = 16;             // dq_accum: tiles of DQ_G tokens x 8 columns
// Each block's walk over its query tiles starts at its own kv tile (the
// plan's walk_rotation).
constexpr bool WALK_ROT = false;
static_assert((BLOCK_M == 64 || BLOCK_M == 128) && BLOCK_N == 128, "two warpgroups of 64 kv rows");
static_assert(DQ_SPLIT != 2 || (BLOCK_M == 128 && DQK == 64), "row split: 128-row query tiles at d64");
static_assert(DQK % 64 == 0 && DV % 64 == 0 && DQ_N == 64, "whole 128-byte chunks");

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

// ---- common/bwd_common.cuh: what both backward templates share ---------------
// Launch parameters (BwdParams), small helpers, the visibility of key ranges,
// the per-score gradient, sequence geometry, accumulator stores, and the row
// kernels _pre (Dsum = rowsum(dO * O), zero dq_accum) and, in fast mode,
// _dq_convert. The including template defines D_QK, D_V, DQK, ROW_WARPS,
// DQ_G, MASK_KIND, IS_THD, SOFTCAP and DETERMINISTIC first.

#define POS_INF (__int_as_float(0x7f800000))
constexpr float LOG2E = 1.4426950408889634f;

// Launch parameters; the layout matches `attnforge::launch_bwd::BwdParams` (repr C).
struct BwdParams {
    const elem_t* q; const elem_t* k; const elem_t* v; const elem_t* o; const elem_t* dout;
    elem_t* dq; elem_t* dk; elem_t* dv;
    const float* lse; float* dsum; float* dq_accum;       // dq_accum: fast mode only
    const int* cu_seqlens_q; const int* cu_seqlens_k;      // THD only
    long long q_sb, q_ss, q_sh;                            // strides in elements
    long long k_sb, k_ss, k_sh;
    long long v_sb, v_ss, v_sh;
    long long o_sb, o_ss, o_sh;
    long long do_sb, do_ss, do_sh;
    long long dq_sb, dq_ss, dq_sh;
    long long dk_sb, dk_ss, dk_sh;
    long long dv_sb, dv_ss, dv_sh;
    long long lse_sb, lse_sh;                              // lse/dsum[b*sb + h*sh + row]
    int batch, heads_q, heads_kv, gqa_ratio;
    int seqlen_q, seqlen_k;                                // dense: lengths; THD: maxima
    int window_left, window_right;
    int rows;                                              // dense: batch*seqlen_q; THD: total_q
    float scale;                                           // softmax scale
    float scale_log2;                                      // scale * log2(e)
    float softcap_pre;                                     // scale / cap
    float softcap_post;                                    // cap * log2(e)
    int tile_phases;                                       // causal block order (common/order.cuh)
};

// ---- element conversion and small PTX helpers --------------------------------

__device__ __forceinline__ float elem_to_f32(elem_t x) {
    return __uint_as_float((unsigned)x << 16);
}

struct __align__(16) u32x4 { unsigned x, y, z, w; };
struct __align__(16) f32x4 { float x, y, z, w; };

// Fire-and-forget f32 add to global memory (atomicAdd without a result).
__device__ __forceinline__ void red_add_f32(float* addr, float v) {
    asm volatile("red.global.add.f32 [%0], %1;\n" :: "l"(addr), "f"(v) : "memory");
}

// Four consecutive f32 adds (addr 16-byte aligned). sm_90 has a vector
// reduction (one request for a whole 16-byte chunk); older archs issue four.
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], { %1, %2, %3, %4 };\n"
                 :: "l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
    red_add_f32(addr, a);
    red_add_f32(addr + 1, b);
    red_add_f32(addr + 2, c);
    red_add_f32(addr + 3, d);
#endif
}

#if __CUDA_ARCH__ >= 900
// Two consecutive f32 adds (addr 8-byte aligned) in one vector request: the
// pair of columns an mma accumulator row holds per lane, so no lane shuffle is
// needed to form it.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], { %1, %2 };\n" :: "l"(addr), "f"(a), "f"(b) : "memory");
}
#endif

// ---- the fast-mode f32 dQ accumulator (layout: BwdPlan::dq_tile_rows) ---------
// Tokens in groups of DQ_G; per group, per query head, the columns in blocks
// of 8: [token / DQ_G][h][c / 8][token % DQ_G][c % 8]. The host mirror is
// `launch_bwd::dq_acc_index`. dq_acc_at(p, token, h) + dq_acc_col(c) is an
// element's place; 8-column blocks are DQ_COL_STEP floats apart, and the 8
// columns of one block are contiguous. Tokens are below 2^31 (the launcher
// checks), so the token arithmetic is unsigned 32-bit. DQ_G is 0 in
// deterministic mode (no accumulator).
constexpr unsigned DQ_T = DQ_G > 0 ? DQ_G : 1;
constexpr int DQ_COL_STEP = DQ_T * 8;

__device__ __forceinline__ float* dq_acc_at(const BwdParams& p, long long token, int h) {
    const unsigned tk = (unsigned)token;
    return p.dq_accum + ((long long)(tk / DQ_T) * p.heads_q + h) * ((long long)DQ_T * DQK) + (tk % DQ_T) * 8;
}

__device__ __forceinline__ int dq_acc_col(int c) {
    return (c / 8) * DQ_COL_STEP + c % 8;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ---- visibility of whole key ranges ----------------------------------------------
// key_lo(i) and key_hi(i) of RowWindow (common/mask.cuh) are non-decreasing in i,
// so the query rows that see at least one key of [key_a, key_b] form one interval;
// these give its ends in closed form (same rules, solved for i).

// Smallest row i with key_hi(i) >= key (seqlen_q when none), for 0 <= key < seqlen_k.
__device__ __forceinline__ int first_row_seeing(int sq, int sk, int right, int key) {
    const long long diag = (long long)sk - sq;           // row i's bottom-right diagonal key: i + diag
    long long i = 0;
    if (MASK_KIND == 1) i = key;
    if (MASK_KIND == 2) i = key - diag;
    if (MASK_KIND == 3 && right >= 0) i = key - diag - right;
    i = i < 0 ? 0 : i;
    return (int)(i > sq ? sq : i);
}

// Largest row i with key_lo(i) <= key (-1 when none), for 0 <= key < seqlen_k.
__device__ __forceinline__ int last_row_seeing(int sq, int sk, int left, int key) {
    const long long diag = (long long)sk - sq;
    long long i = sq - 1;
    if (MASK_KIND == 3 && left >= 0) {
        const long long j = key - diag + left;
        i = j < i ? j : i;
    }
    return (int)(i < -1 ? -1 : i);
}

// The query tiles (of `block_m` rows) whose rows see at least one key of the
// kv block [n0, min(n0 + block_n, sk)): the first tile and how many (0: none).
struct QueryTiles {
    int first, count;
};
__device__ __forceinline__ QueryTiles query_tiles_seeing(int sq, int sk, int left, int right, int n0, int block_n,
                                                         int block_m) {
    const int n_last = min(n0 + block_n, sk) - 1;
    const int i_first = first_row_seeing(sq, sk, right, n0);
    const int i_last = last_row_seeing(sq, sk, left, n_last);
    QueryTiles q;
    q.first = i_first / block_m;
    q.count = i_last >= i_first ? i_last / block_m - q.first + 1 : 0;
    return q;
}

// Store a warp's accumulator tile (rows r0.., columns c0..) times `mul` to global
// memory (row pitch `stride`) in the element type: rows < valid_rows, columns < d_real.
template <int MT, int NT>
__device__ __forceinline__ void store_acc(elem_t* gbase, long long stride, const float (&acc)[MT][NT][4],
                                          int r0, int c0, int valid_rows, int d_real, float mul, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + mt * 16 + g + 8 * r;
            if (row < valid_rows) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int col = c0 + j * 8 + 2 * t;
                    if (col < d_real) {
                        *reinterpret_cast<elem2_t*>(gbase + row * stride + col) =
                            pack2(acc[mt][j][2 * r] * mul, acc[mt][j][2 * r + 1] * mul);
                    }
                }
            }
        }
    }
}

// P of one score, from the raw score s = (Q K^T)_ij and the row's LSE * log2(e)
// (+inf for rows that see no key or lie outside the sequence, so that P = 0);
// `dtanh` gets dz/dS's softcap factor 1 - tanh^2 (1 without softcap).
__device__ __forceinline__ float score_prob(float s, float lse2, bool visible, const BwdParams& p, float& dtanh) {
    float z2;
    dtanh = 1.f;
    if constexpr (SOFTCAP) {
        const float th = fast_tanh(s * p.softcap_pre);
        z2 = p.softcap_post * th;
        dtanh = 1.f - th * th;
    } else {
        z2 = s * p.scale_log2;
    }
    return visible ? fast_exp2(z2 - lse2) : 0.f;
}

// dZ / scale for one score: score_prob's P (returned through `p_out`) times
// (dP_ij - Dsum_i) and the softcap factor.
__device__ __forceinline__ float score_grad(float s, float dp, float lse2, float dsum, bool visible,
                                            const BwdParams& p, float& p_out) {
    float dtanh;
    const float pr = score_prob(s, lse2, visible, p, dtanh);
    p_out = pr;
    return pr * (dp - dsum) * dtanh;
}

// Stage LSE and Dsum of query rows m0 .. m0 + rows - 1 of head h into shared
// memory, one row per thread (tid < rows); rows past the sequence get +inf / 0
// (their P is 0). ASYNC: by 4-byte cp.async in the caller's copy group, the LSE
// left raw until `finish_rows` (the sm80-path backward: plain loads there
// stalled the staging warps, and every other warp at the next barrier; ncu,
// session 15). Otherwise plain loads and LSE * log2(e) at once, +inf for rows
// that see no key (the wgmma backward: 2.7% slower at d128 causal with ASYNC).
template <bool ASYNC>
__device__ __forceinline__ void stage_rows(const BwdParams& p, int b, int h, int q_off, int m0, int sq, int rows,
                                           int tid, float* s_lse2, float* s_dsum) {
    if (tid < rows) {
        const int i = m0 + tid;
        float lse2 = POS_INF, dsum = 0.f;
        if (i < sq) {
            const long long li = b * p.lse_sb + h * p.lse_sh + q_off + i;
            if constexpr (ASYNC) {
                cp_async_4(smem_addr(s_lse2 + tid), p.lse + li);
                cp_async_4(smem_addr(s_dsum + tid), p.dsum + li);
                return;
            } else {
                const float l = p.lse[li];
                if (l != NEG_INF) lse2 = l * LOG2E;
                dsum = p.dsum[li];
            }
        }
        s_lse2[tid] = lse2;
        s_dsum[tid] = dsum;
    }
}

// After the staging thread's copy group has landed (its own rows: no barrier
// needed), LSE * log2(e), and +inf for rows that see no key (LSE = -inf), so
// that their P is 0. Idempotent on the +inf of rows past the sequence.
__device__ __forceinline__ void finish_rows(float* s_lse2, int rows, int tid) {
    if (tid < rows) {
        const float l = s_lse2[tid];
        s_lse2[tid] = l == NEG_INF ? POS_INF : l * LOG2E;
    }
}

// Sequence geometry of batch entry b: offsets into packed tensors and lengths.
struct SeqInfo {
    int q_off, k_off, sq, sk;
};
__device__ __forceinline__ SeqInfo seq_info(const BwdParams& p, int b) {
    SeqInfo s{0, 0, p.seqlen_q, p.seqlen_k};
    if constexpr (IS_THD) {
        s.q_off = p.cu_seqlens_q[b];
        s.k_off = p.cu_seqlens_k[b];
        s.sq = p.cu_seqlens_q[b + 1] - s.q_off;
        s.sk = p.cu_seqlens_k[b + 1] - s.k_off;
    }
    return s;
}

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


// The block's work item of a (batch x heads, tiles) grid: `bh` indexes
// (batch, head), `tile` its kv tile (main kernels) or query tile (the dQ
// kernel). The hardware starts blocks in linear order, x fastest.
struct BlockTile {
    int bh, tile;
};
__device__ __forceinline__ BlockTile block_tile(const BwdParams& p) {
    // Head-major: consecutive blocks take consecutive tiles of one (batch,
    // head), so the blocks in flight share its operands and dQ accumulator in
    // L2 instead of streaming every head's (ncu, sm80-path d128 b4 s4096: L2
    // hit rate 67% and 1 TB/s from DRAM in the other order). Under a causal
    // mask on dense tensors in p.tile_phases phases by length
    // (common/order.cuh; not with softcap, whose d128 sm80-path build spilled).
    const long long lin = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    if constexpr ((MASK_KIND == 1 || MASK_KIND == 2) && !IS_THD && !SOFTCAP) {
        const PhaseTile pt = phase_tile(lin, (int)gridDim.y, p.tile_phases);
        return BlockTile{pt.bh, pt.tile};
    }
    return BlockTile{(int)(lin / gridDim.y), (int)(lin % gridDim.y)};
}

// ---- _pre: Dsum = rowsum(dO * O); zero dq_accum ----------------------------------

extern "C" __global__ void __launch_bounds__(ROW_WARPS * 32)
attnforge_bwd_bf16_d128_causal_br_dense_sm90a_pre(const BwdParams p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long idx = (long long)blockIdx.x * ROW_WARPS + warp;   // (row, head) pair
    if (idx >= (long long)p.rows * p.heads_q) return;
    const int row = (int)(idx / p.heads_q), h = (int)(idx % p.heads_q);
    int b = 0, i = row;                                  // THD: row is the packed token
    if constexpr (!IS_THD) {
        b = row / p.seqlen_q;
        i = row % p.seqlen_q;
    }
    const elem_t* o = p.o + b * p.o_sb + (long long)i * p.o_ss + h * p.o_sh;
    const elem_t* d = p.dout + b * p.do_sb + (long long)i * p.do_ss + h * p.do_sh;
    float acc = 0.f;
    for (int c = lane * 8; c < D_V; c += 256) {
        const u32x4 ov = *reinterpret_cast<const u32x4*>(o + c);
        const u32x4 dv = *reinterpret_cast<const u32x4*>(d + c);
        const unsigned ow[4] = { ov.x, ov.y, ov.z, ov.w };
        const unsigned dw[4] = { dv.x, dv.y, dv.z, dv.w };
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            acc += elem_to_f32((elem_t)(ow[w] & 0xffffu)) * elem_to_f32((elem_t)(dw[w] & 0xffffu));
            acc += elem_to_f32((elem_t)(ow[w] >> 16)) * elem_to_f32((elem_t)(dw[w] >> 16));
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) p.dsum[b * p.lse_sb + h * p.lse_sh + i] = acc;
    if constexpr (!DETERMINISTIC) {
        float* z = dq_acc_at(p, row, h);
        for (int c = lane * 8; c < DQK; c += 256) {
            const f32x4 zero = { 0.f, 0.f, 0.f, 0.f };
            *reinterpret_cast<f32x4*>(z + dq_acc_col(c)) = zero;
            *reinterpret_cast<f32x4*>(z + dq_acc_col(c) + 4) = zero;
        }
    }
}


// ---- _dq_convert (fast mode): dQ = scale * dq_accum ----------------------------

extern "C" __global__ void __launch_bounds__(ROW_WARPS * 32)
attnforge_bwd_bf16_d128_causal_br_dense_sm90a_dq_convert(const BwdParams p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long idx = (long long)blockIdx.x * ROW_WARPS + warp;   // (row, head) pair
    if (idx >= (long long)p.rows * p.heads_q) return;
    const int row = (int)(idx / p.heads_q), h = (int)(idx % p.heads_q);
    int b = 0, i = row;
    if constexpr (!IS_THD) {
        b = row / p.seqlen_q;
        i = row % p.seqlen_q;
    }
    const float* src = dq_acc_at(p, row, h);
    elem_t* dst = p.dq + b * p.dq_sb + (long long)i * p.dq_ss + h * p.dq_sh;
    for (int c = lane * 8; c < D_QK; c += 256) {
        const f32x4 x = *reinterpret_cast<const f32x4*>(src + dq_acc_col(c));
        const f32x4 y = *reinterpret_cast<const f32x4*>(src + dq_acc_col(c) + 4);
        const float s = p.scale;
        u32x4 out;
        out.x = pack2(x.x * s, x.y * s);
        out.y = pack2(x.z * s, x.w * s);
        out.z = pack2(y.x * s, y.y * s);
        out.w = pack2(y.z * s, y.w * s);
        *reinterpret_cast<u32x4*>(dst + c) = out;
    }
}



// Shared memory from a 1024-byte aligned base. Tiles are stored as 64-column
// chunks, chunk c of an R-row tile at c * R * 128 bytes, 16-byte unit u of row
// r at unit u ^ (r % 8): the 128-byte swizzle.
constexpr unsigned K_BYTES = BLOCK_N * 128 * QK_CHUNKS;
constexpr unsigned V_BYTES = BLOCK_N * 128 * V_CHUNKS;
constexpr unsigned Q_BYTES = BLOCK_M * 128 * QK_CHUNKS;   // per stage (2)
constexpr unsigned DO_BYTES = BLOCK_M * 128 * V_CHUNKS;   // per stage (2)
constexpr unsigned DS_BYTES = BLOCK_N * 128 * (BLOCK_M / 64);   // dS^T: [query chunk][kv row][64 columns]
constexpr unsigned OFF_V = K_BYTES;
constexpr unsigned OFF_Q = OFF_V + V_BYTES;
constexpr unsigned OFF_DO = OFF_Q + 2 * Q_BYTES;
constexpr unsigned OFF_DS = OFF_DO + 2 * DO_BYTES;
constexpr unsigned OFF_ROWS = OFF_DS + DS_BYTES;          // LSE*log2(e) [2][BLOCK_M], Dsum [2][BLOCK_M]

// Copy ROWS x (64 * CHUNKS) elements (global row pitch `stride`) into the
// swizzled layout with cp.async; rows >= valid_rows and columns >= d_real read
// as zeros.
template <int ROWS, int CHUNKS>
__device__ __forceinline__ void load_sw128(unsigned dst, const elem_t* g, long long stride, int valid_rows,
                                           int d_real, int tid) {
    constexpr int UNITS = ROWS * CHUNKS * 8;
    static_assert(UNITS % THREADS == 0, "whole passes");
#pragma unroll
    for (int k = 0; k < UNITS / THREADS; ++k) {
        const int i = tid + k * THREADS;
        const int r = i / (CHUNKS * 8), c = (i / 8) % CHUNKS, u = i % 8;
        const int col = c * 64 + u * 8;
        const bool ok = r < valid_rows && col < d_real;
        const elem_t* src = ok ? g + r * stride + col : g;
        cp_async_16(dst + c * ROWS * 128 + r * 128 + ((u ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
}

// Make this thread's generic-proxy shared-memory writes (cp.async, st.shared)
// visible to the async proxy that wgmma reads through (before a barrier).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// S^T or dP^T (64 x BLOCK_M) += A (64 x 16) B^T: both operands K-major in shared memory.
__device__ __forceinline__ void wgmma_kk(float (&d)[M_TILES][4], unsigned long long ad, unsigned long long bd, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 },\n"
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(ad), "l"(bd), "r"(acc));
}

// dV or dK (64 x D) += A (64 x 16, registers) B (16 x D), B read MN-major.
template <int D>
__device__ __forceinline__ void wgmma_rs(float (&d)[D / 8][4], const unsigned (&a)[4], unsigned long long bd);

template <>
__device__ __forceinline__ void wgmma_rs<128>(float (&d)[128 / 8][4], const unsigned (&a)[4], unsigned long long bd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 },\n"
        "{ %64, %65, %66, %67 }, %68, p, 1, 1, 1;\n}\n"
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
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1));
}

// dQ (64 x 64) += A (64 x 16) B (16 x 64): A = dS read from dS^T (MN-major),
// B = K read MN-major; both from shared memory.
__device__ __forceinline__ void wgmma_tt(float (&d)[8][4], unsigned long long ad, unsigned long long bd, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16\n"
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 },\n"
        "%32, %33, p, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(ad), "l"(bd), "r"(acc));
}

// The accumulator of two adjacent 8-column tiles as the A fragment of one
// 16-deep k-step (the m16n8 accumulator layout is the A fragment layout).
template <int N>
__device__ __forceinline__ void pack_frags(unsigned (&a)[N / 16][4], const float (&x)[N / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
        a[kk][0] = pack2(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = pack2(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = pack2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = pack2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// A pointer made opaque to the compiler (the dQ reductions' row pointer): the reductions then address their
// column blocks as immediate offsets from it, instead of the compiler splitting
// it into a per-tile part and per-thread 64-bit parts that it hoists out of the
// query loop (one register pair per reduction: the wgmma backward spilled).
__device__ __forceinline__ float* opaque_ptr(float* ptr) {
    asm("mov.b64 %0, %0;" : "+l"(ptr));
    return ptr;
}

// Where a block's walk over its n_mt query tiles starts (the plan's
// walk_rotation): at the query tile on its own diagonal (the
// one holding row n0), or at tile 0 where the keys outnumber the queries that
// far. Without a mask every kv tile of a head sees all of its query tiles, and
// blocks that all started at tile 0 would add into the same dQ rows (and read
// the same Q/dO tile) at the same moment; started on their diagonals the
// blocks in flight spread over the head's rows. Masked walks start on their
// own first visible tile already. (No integer modulo: its code made ptxas
// spill at d64.)
__device__ __forceinline__ int walk_start(int n0, int block_m, int n_mt) {
    const int m = n0 / block_m;
    return m < n_mt ? m : 0;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attnforge_bwd_bf16_d128_causal_br_dense_sm90a(const BwdParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const unsigned sK = base, sV = base + OFF_V, sQ = base + OFF_Q, sdO = base + OFF_DO, sdS = base + OFF_DS;
    float* sRows = reinterpret_cast<float*>(smem_raw + (base + OFF_ROWS - smem_addr(smem_raw)));
    float* sLse = sRows;                                 // [2][BLOCK_M]
    float* sDsum = sRows + 2 * BLOCK_M;                  // [2][BLOCK_M]

    const int tid = threadIdx.x, lane = tid % 32;
    const int wg = tid / 128, wl = (tid / 32) % 4;       // warpgroup; warp within it
    const int g = lane / 4, t = lane % 4;
    const BlockTile bt = block_tile(p);
    const int b = bt.bh / p.heads_kv, hk = bt.bh % p.heads_kv;
    const int n0 = bt.tile * BLOCK_N;
    const SeqInfo si = seq_info(p, b);
    const int sq = si.sq, sk = si.sk;
    if (n0 >= sk) return;                                // whole block uniform

    const RowWindow win{sq, sk, p.window_left, p.window_right};
    const QueryTiles qt = query_tiles_seeing(sq, sk, p.window_left, p.window_right, n0, BLOCK_N, BLOCK_M);
    const int m_begin = qt.first, n_mt = qt.count;
    const int n_iters = n_mt * p.gqa_ratio;              // (query head of the group, query tile)
    // The walk's positions it = rot .. rot + n_iters - 1, position it at (query
    // head it / n_mt of the group, wrapped; query tile it % n_mt); rot even, so
    // that a position's buffer is still it & 1 (walk_start).
    const int rot = WALK_ROT ? walk_start(n0, BLOCK_M, n_mt) & ~1 : 0;
    const int it_end = rot + n_iters;

    const elem_t* gK = p.k + b * p.k_sb + (long long)(si.k_off + n0) * p.k_ss + hk * p.k_sh;
    const elem_t* gV = p.v + b * p.v_sb + (long long)(si.k_off + n0) * p.v_ss + hk * p.v_sh;

    auto query_head = [&](int it) {
        const int qh = it / n_mt;
        return hk * p.gqa_ratio + (WALK_ROT && qh == p.gqa_ratio ? 0 : qh);
    };
    // Stage the query tile of walk position `it` (Q, dO, LSE, Dsum) into buffer `buf`.
    auto load_q_tile = [&](int it, int buf) {
        const int h = query_head(it);
        const int m0 = (m_begin + it % n_mt) * BLOCK_M;
        const long long row0 = si.q_off + m0;
        load_sw128<BLOCK_M, QK_CHUNKS>(sQ + buf * Q_BYTES, p.q + b * p.q_sb + row0 * p.q_ss + h * p.q_sh, p.q_ss,
                                       sq - m0, D_QK, tid);
        load_sw128<BLOCK_M, V_CHUNKS>(sdO + buf * DO_BYTES, p.dout + b * p.do_sb + row0 * p.do_ss + h * p.do_sh,
                                      p.do_ss, sq - m0, D_V, tid);
        stage_rows<false>(p, b, h, si.q_off, m0, sq, BLOCK_M, tid, sLse + buf * BLOCK_M, sDsum + buf * BLOCK_M);
    };

    // dK and dV of this warpgroup's 64 kv rows, for the whole block.
    float acc_dk[DQK / 8][4], acc_dv[DV / 8][4];
#pragma unroll
    for (int j = 0; j < DQK / 8; ++j) acc_dk[j][0] = acc_dk[j][1] = acc_dk[j][2] = acc_dk[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) acc_dv[j][0] = acc_dv[j][1] = acc_dv[j][2] = acc_dv[j][3] = 0.f;

    if (n_iters > 0) {
        load_sw128<BLOCK_N, QK_CHUNKS>(sK, gK, p.k_ss, sk - n0, D_QK, tid);
        load_sw128<BLOCK_N, V_CHUNKS>(sV, gV, p.v_ss, sk - n0, D_V, tid);
        load_q_tile(rot, 0);
        cp_async_commit();
    }
    const unsigned k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;   // this warpgroup's K_w, V_w
    const int row_w = 16 * wl + g;                       // this thread's kv rows: row_w, row_w + 8 (of 64)

    for (int it = rot; it < it_end; ++it) {
        const int buf = it & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();                                 // tile `it` landed; buffer buf ^ 1 is free
        if (it + 1 < it_end) {
            load_q_tile(it + 1, buf ^ 1);                // prefetch under this tile's products
            cp_async_commit();
        }
        const int h = query_head(it);
        const int m0 = (m_begin + it % n_mt) * BLOCK_M;
        const unsigned q_t = sQ + buf * Q_BYTES, do_t = sdO + buf * DO_BYTES;
        // Opaque copies of the loop-invariant bases: otherwise ptxas hoists
        // every K, V, dS^T descriptor (two registers each) out of the loop,
        // next to 128 f32 of dK/dV, and spills; rebuilt per tile they cost a
        // few integer ops.
        unsigned kw = k_rows, vw = v_rows, kb = sK, dsb = sdS;
        asm volatile("" : "+r"(kw), "+r"(vw), "+r"(kb), "+r"(dsb));
        const float* lse2_t = sLse + buf * BLOCK_M;
        const float* dsum_t = sDsum + buf * BLOCK_M;

        // S^T = K_w Q^T first; P^T from it; then dP^T = V_w dO^T and dV += P^T dO
        // together. S^T and dP^T are never live at once (with dK and dV's 128
        // f32 at d128 they would not fit the registers): P^T waits as
        // element-type fragments, which are also the A operand of dV's product.
        float acc_s[M_TILES][4];
        // Each k-step's descriptors: the low words once, plus a constant
        // (common/hopper.cuh's sw128_desc_lo / sw128_desc_at).
        const unsigned kw_lo = sw128_desc_lo(kw, 16), qk_lo = sw128_desc_lo(q_t, 16);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < DQK / 16; ++ks) {
            const unsigned off = (ks % 4) * 32;
            wgmma_kk(acc_s, sw128_desc_at(kw_lo, (ks / 4) * BLOCK_N * 128 + off),
                     sw128_desc_at(qk_lo, (ks / 4) * BLOCK_M * 128 + off), ks > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();

        // P^T: rows are keys n0 + 64 wg + row_w (+8), columns query rows m0 + 8 j + 2 t (+1).
        unsigned pa[M_KSTEPS][4];

        {
            const int m_last = min(m0 + BLOCK_M, sq) - 1;
            const bool edge = (n0 + BLOCK_N > sk) || (MASK_KIND != 0 &&
                (win.key_lo(m_last) > n0 || win.key_hi(m0) < n0 + BLOCK_N - 1));

#pragma unroll
            for (int j = 0; j < M_TILES; ++j) {
#pragma unroll
                for (int e1 = 0; e1 < 2; ++e1) {
                    const int ci = 8 * j + 2 * t + e1;   // query row within the tile
                    const float lse2 = lse2_t[ci];
                    const int lo = win.key_lo(m0 + ci), hi = win.key_hi(m0 + ci);
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int e = 2 * r + e1;
                        const int key = n0 + 64 * wg + row_w + 8 * r;
                        const bool vis = !edge || (key >= lo && key <= hi);
                        float dt;
                        acc_s[j][e] = score_prob(acc_s[j][e], lse2, vis, p, dt);

                    }
                }
            }

        }
        pack_frags<BLOCK_M>(pa, acc_s);
        // dP^T = V_w dO^T and dV += P^T dO, one commit group.
        float acc_dp[M_TILES][4];
        // V_w's descriptor stays whole per step: taken once, ptxas kept its
        // low word in a vector register through the score code, and the
        // d32/d64 window softcap kernels (255 registers) spilled.
        const unsigned dok_lo = sw128_desc_lo(do_t, 16), dom_lo = sw128_desc_lo(do_t, BLOCK_M * 128);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < DV / 16; ++ks) {
            const unsigned off = (ks % 4) * 32;
            wgmma_kk(acc_dp, sw128_desc(vw + (ks / 4) * BLOCK_N * 128 + off, 16),
                     sw128_desc_at(dok_lo, (ks / 4) * BLOCK_M * 128 + off), ks > 0);
        }
#pragma unroll
        for (int kk = 0; kk < M_KSTEPS; ++kk)
            wgmma_rs<DV>(acc_dv, pa[kk], sw128_desc_at(dom_lo, kk * 16 * 128));
        wgmma_commit();
        wgmma_wait<0>();

        // dS^T = P^T (dP^T - Dsum) (softcap: times 1 - tanh^2), from the packed P^T.
        unsigned dsa[M_KSTEPS][4];
#pragma unroll
        for (int j = 0; j < M_TILES; ++j) {
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
                const float dsum = dsum_t[8 * j + 2 * t + e1];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int e = 2 * r + e1;
                    const unsigned pw = pa[j / 2][(j & 1) * 2 + r];
                    const float pr = elem_to_f32((elem_t)(e1 ? pw >> 16 : pw & 0xffffu));

                    acc_dp[j][e] = pr * (acc_dp[j][e] - dsum);

                }
            }
        }
        pack_frags<BLOCK_M>(dsa, acc_dp);

        // dK += dS^T Q (runs while dS^T is stored).
        const unsigned qm_lo = sw128_desc_lo(q_t, BLOCK_M * 128);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < M_KSTEPS; ++kk)
            wgmma_rs<DQK>(acc_dk, dsa[kk], sw128_desc_at(qm_lo, kk * 16 * 128));
        wgmma_commit();

        // dS^T into shared memory ([64-column chunk][kv row][column], swizzled):
        // 4-byte stores, the eight rows g of a warp on distinct 16-byte units.
#pragma unroll
        for (int j = 0; j < M_TILES; ++j) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = 64 * wg + row_w + 8 * r;
                const unsigned addr = dsb + (j / 8) * BLOCK_N * 128 + row * 128 + (((j % 8) ^ (row & 7)) << 4) + 4 * t;
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(dsa[j / 2][(j & 1) * 2 + r]) : "memory");
            }
        }
        fence_proxy_async();
        if constexpr (DQ_SPLIT != 0) {
            named_bar_sync(1, THREADS);                  // both warpgroups' dS^T rows
        } else {
            named_bar_sync(1 + wg, 128);                 // this warpgroup's own rows
        }

        // dQ (64 x DQ_N) = dS K over this warpgroup's share.
        float acc_dq[8][4];
        constexpr int DQ_KSTEPS = DQ_SPLIT != 0 ? BLOCK_N / 16 : 4;
        const int kv0 = DQ_SPLIT != 0 ? 0 : 64 * wg;     // first kv row of the k range
        const int c0 = DQ_SPLIT == 1 ? 64 * wg : 0;      // first dQ column
        const int q0 = DQ_SPLIT == 2 ? 64 * wg : 0;      // first dQ row (query row of the tile)
        const unsigned ds_lo = sw128_desc_lo(dsb + (q0 / 64) * BLOCK_N * 128, BLOCK_N * 128);
        const unsigned kb_lo = sw128_desc_lo(kb + (c0 / 64) * BLOCK_N * 128, BLOCK_N * 128);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < DQ_KSTEPS; ++kk) {
            const int kv = kv0 + 16 * kk;
            wgmma_tt(acc_dq, sw128_desc_at(ds_lo, kv * 128), sw128_desc_at(kb_lo, kv * 128), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();

        // dq_accum += dQ: lanes t = 2k, 2k + 1 swap halves so that each holds four
        // consecutive columns of one row (16-byte reductions).
        {
            // In the tiled accumulator (DQ_G = 16) a warp's 32 reductions of one
            // column block j are its 16 rows x 8 columns: 512 contiguous bytes
            // (in at most two tiles where the query tile starts mid-tile).
            // (DQ_G = 1, the row-major accumulator: the address as before the
            // tiles, which ptxas keeps spill-free where the tiles' is not.)
            const long long acc_row0 = IS_THD ? (long long)si.q_off + m0 : (long long)b * p.seqlen_q + m0;
            const bool odd = t & 1;
            const int row = q0 + 16 * wl + g + (odd ? 8 : 0);
            float* gacc = DQ_G == 1
                ? p.dq_accum + (acc_row0 * p.heads_q + h) * DQK + row * ((long long)p.heads_q * DQK) + c0 + 4 * (t >> 1)
                : opaque_ptr(dq_acc_at(p, acc_row0 + row, h) + dq_acc_col(c0 + 4 * (t >> 1)));
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float* a = acc_dq[j];
                const float x0 = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[2], 1);
                const float x1 = __shfl_xor_sync(0xffffffffu, odd ? a[1] : a[3], 1);
                if (m0 + row < sq) {
                    float* dst = gacc + j * DQ_COL_STEP;
                    if (odd) red_add_f32x4(dst, x0, x1, a[2], a[3]);
                    else red_add_f32x4(dst, a[0], a[1], x0, x1);
                }
            }
        }
        __syncthreads();                                 // dS^T and buffer `buf` are rewritten next
    }

    // Epilogue: dK (times scale) and dV of this warpgroup's rows, in the element type.
    const long long kv_row0 = si.k_off + n0 + 64 * wg;
    const int valid = sk - n0 - 64 * wg;
    store_acc<1, DQK / 8>(p.dk + b * p.dk_sb + kv_row0 * p.dk_ss + hk * p.dk_sh, p.dk_ss,
                          *reinterpret_cast<const float (*)[1][DQK / 8][4]>(&acc_dk), 16 * wl, 0, valid, D_QK,
                          p.scale, lane);
    store_acc<1, DV / 8>(p.dv + b * p.dv_sb + kv_row0 * p.dv_ss + hk * p.dv_sh, p.dv_ss,
                         *reinterpret_cast<const float (*)[1][DV / 8][4]>(&acc_dv), 16 * wl, 0, valid, D_V, 1.f,
                         lane);
}
