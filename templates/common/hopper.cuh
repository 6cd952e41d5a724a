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
        " [%0], [%1, {% raw %}{%2, %3, %4, %5}{% endraw %}], [%6];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// tma_load_4d with an L2 eviction priority for the lines it reads (`policy`
// from l2_policy_evict_first / l2_policy_evict_last).
__device__ __forceinline__ void tma_load_4d_hint(unsigned dst, const TmaMap* map, unsigned bar,
                                                 int c0, int c1, int c2, int c3, unsigned long long policy) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {% raw %}{%2, %3, %4, %5}{% endraw %}], [%6], %7;\n"
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
        " [%0], [%1, {% raw %}{%2, %3, %4, %5}{% endraw %}], [%6], %7;\n"
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
        " [%0, {% raw %}{%1, %2, %3, %4}{% endraw %}], [%5];\n"
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
    asm volatile("st.shared.v4.b32 [%0], {% raw %}{%1, %2, %3, %4}{% endraw %};\n" :: "r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}
