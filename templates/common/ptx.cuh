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
        "mma.sync.aligned.m16n8k16.row.col.f32.{{ ptx_type }}.{{ ptx_type }}.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16, row) * B(16x8, col), f32: the first k-step of a product, with no
// accumulator to clear first (C is a zero operand: ptxas reads RZ).
__device__ __forceinline__ void mma_16816_first(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const float z = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.{{ ptx_type }}.{{ ptx_type }}.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %10, %10, %10, %10 };\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

// Round two floats to the element type (nearest even) and pack them.
__device__ __forceinline__ elem2_t pack2(float lo, float hi) {
    elem2_t r;
    asm("cvt.rn.{{ ptx_type }}x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
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
