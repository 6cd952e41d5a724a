// attnforge generated kernel: fwd.f16.d40.none.thd.sm86
// template fwd_sm80.cu — FlashAttention-2-style forward on the sm80 instruction
// path (mma.sync m16n8k16, ldmatrix, cp.async). Plan: block_m=128
// block_n=64 warps=4 m_tiles/warp=2.
// Do not edit: rendered by attnforge from templates/fwd_sm80.cu.

constexpr int BLOCK_M = 128;
constexpr int BLOCK_N = 64;
constexpr int NUM_WARPS = 4;
constexpr int THREADS = NUM_WARPS * 32;
constexpr int M_TILES = 2;               // 16-row MMA tiles per warp
constexpr int STAGES = 2;                 // K/V buffers: 2 = double-buffered, 1 = FA2's order
constexpr int D_QK = 40;                     // real head dims
constexpr int D_V = 40;
constexpr int DQK = 48;                  // padded to the k-step (16)
constexpr int DV = 48;
// K (SW), Q and V tiles swizzled instead of padded (the plan's smem_swizzle,
// per tile plan::fwd_swizzled_tiles; common/tile.cuh, load_tile's SW):
// unpadded rows of whole 128-byte lines, so each copy writes whole
// shared-memory lines. Else padded rows (the plan's row pitches, elements;
// the plan's shared-memory size keeps them either way).
constexpr bool SW = false;
constexpr bool SW_Q = false, SW_V = false;
constexpr int PITCH_QK = SW ? DQK : 56;     // K
constexpr int PITCH_Q = SW_Q ? DQK : 56;
constexpr int PITCH_V = SW_V ? DV : 56;
constexpr int MASK_KIND = 0;
constexpr bool IS_THD = true;
constexpr bool SOFTCAP = false;

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
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16, row) * B(16x8, col), f32: the first k-step of a product, with no
// accumulator to clear first (C is a zero operand: ptxas reads RZ).
__device__ __forceinline__ void mma_16816_first(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const float z = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %10, %10, %10, %10 };\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

// Round two floats to the element type (nearest even) and pack them.
__device__ __forceinline__ elem2_t pack2(float lo, float hi) {
    elem2_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
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


// ---- common/tile.cuh: global -> shared tile copies (cp.async) ---------------------

// The stored chunk index of 16-byte chunk `c` of row `row` in a swizzled tile:
// the low three bits of the chunk index XOR the row's low three bits.
__device__ __forceinline__ int sw_chunk(int c, int row) { return c ^ (row & 7); }

// The ldmatrix address of the fragment tile `rows` rows down and `col` columns
// across (multiples of 16) in a swizzled tile, from a lane's address (the
// tile's base, the lane's row and its swizzled chunk): the column's 16-element
// block j within its 128-byte line moves the lane's chunk by 2j, which is an
// XOR by 2j because the lane's own chunk bit and 2j do not overlap. The XOR
// acts on the absolute address, so the tile's base is a multiple of 128 bytes.
__device__ __forceinline__ unsigned sw_frag_addr(unsigned lane_addr, int pitch, int rows, int col) {
    return (lane_addr ^ (unsigned)(((col >> 4) & 3) << 5)) + rows * pitch * 2 + (col >> 6) * 128;
}

// Copy ROWS x DPAD tile rows from global (row pitch `stride` elements) into
// shared memory (pitch PITCH elements) with cp.async, zero-filling rows >=
// valid_rows and columns >= d_real; NTHREADS threads share the work.
// Where the threads cover whole rows per pass (NTHREADS a multiple of the
// row's 16-byte chunks), each thread keeps one column and one source pointer
// and steps it by a constant row count: one 64-bit add, a compare and the
// copy per chunk (ncu, bwd d128: the general form's per-chunk divisions and
// 64-bit multiplies were 12% of the main kernel's instructions).
//
// SW: the tile is stored swizzled (see `sw_chunk`): rows of exactly PITCH
// elements, a multiple of 128 bytes, with each 16-byte chunk at chunk index
// `c ^ (row % 8)`. Every 128-byte line of a global row then lands in one
// aligned 128-byte line of shared memory (ncu, session 29: the padded rows'
// copies took 2.3-2.6x the ideal shared-memory wavefronts, the swizzled rows of
// FlashAttention-2 exactly the ideal), and ldmatrix's eight rows of one chunk
// column still fall in eight different bank groups.
template <int ROWS, int DPAD, int PITCH, int NTHREADS, bool SW = false>
__device__ __forceinline__ void load_tile(elem_t* smem, const elem_t* gbase, long long stride,
                                          int valid_rows, int d_real, int tid) {
    constexpr int CHUNKS = DPAD / 8;                     // 16-byte chunks per row
    static_assert(!SW || (PITCH == DPAD && PITCH % 64 == 0), "swizzled tiles: unpadded rows of whole 128-byte lines");
    const unsigned s0 = smem_addr(smem);
    constexpr int TOTAL = ROWS * CHUNKS;
    if constexpr (NTHREADS % CHUNKS == 0) {
        constexpr int RPP = NTHREADS / CHUNKS;           // rows per pass
        const int r = tid / CHUNKS, c = tid % CHUNKS;
        const bool col_ok = c * 8 < d_real;          // d_real is a constant at every call
        const int rows_left = valid_rows - r;            // this thread's rows r + i * RPP
        const elem_t* src = gbase + r * stride + c * 8;
        const long long step = RPP * stride;
        const unsigned dst = s0 + (r * PITCH + (SW ? sw_chunk(c, r) : c) * 8) * 2;
#pragma unroll
        for (int i = 0; i < (ROWS + RPP - 1) / RPP; ++i) {  // compile-time trip count
            if (ROWS % RPP != 0 && r + i * RPP >= ROWS) break;
            const bool ok = col_ok && i * RPP < rows_left;
            // RPP % 8 == 0 keeps the row's swizzle; other row steps re-swizzle.
            const unsigned d = SW && RPP % 8 != 0 ? s0 + ((r + i * RPP) * PITCH + sw_chunk(c, r + i * RPP) * 8) * 2
                                                  : dst + i * RPP * PITCH * 2;
            cp_async_16(d, ok ? src : gbase, ok ? 16 : 0);
            src += step;
        }
    } else {
#pragma unroll
        for (int i = 0; i < (TOTAL + NTHREADS - 1) / NTHREADS; ++i) {  // compile-time trip count
            const int idx = tid + i * NTHREADS;
            if (TOTAL % NTHREADS != 0 && idx >= TOTAL) break;
            const int r = idx / CHUNKS, c = idx % CHUNKS;
            const bool ok = r < valid_rows && c * 8 < d_real;
            const elem_t* src = ok ? gbase + r * stride + c * 8 : gbase;
            cp_async_16(s0 + (r * PITCH + (SW ? sw_chunk(c, r) : c) * 8) * 2, src, ok ? 16 : 0);
        }
    }
}

// A stream of ROWS x DPAD tiles that follow each other in one tensor (the
// forward's K and V): each thread keeps the source pointer of its chunk in
// the next tile and advances it by whole tiles, so a full tile costs one
// 64-bit add and the copy per chunk (ncu, forward d128: rebuilding the
// pointers from the launch for every tile, with a row guard and a pointer
// select per chunk, was ~100 of the ~690 instructions per warp and tile).
// Consecutive threads keep consecutive chunks of a row, so each warp's copy
// reads whole sectors (a thread per row with its chunks at immediate
// offsets read every sector twice and ran 11-25% slower). Only tiles that
// end past `valid_rows` take the guarded form. Threads whose column lies in
// the head-dim pad read nothing (source size 0) from a pointer that stays
// on the first tile. Needs NTHREADS % (DPAD / 8) == 0 (each thread keeps
// one column): FITS says whether it does, and load_tile serves the other
// shapes.
template <int ROWS, int DPAD, int PITCH, int NTHREADS, bool SW = false>
struct TileStream {
    static constexpr int CHUNKS = DPAD / 8;              // 16-byte chunks per row
    static constexpr int RPP = NTHREADS % CHUNKS == 0 ? NTHREADS / CHUNKS : 1;   // rows per pass
    // Swizzled (load_tile's SW): a thread's rows keep one swizzle when the
    // passes step whole 8-row groups.
    static constexpr bool FITS = NTHREADS % CHUNKS == 0 && (!SW || RPP % 8 == 0);
    static constexpr int PASSES = (ROWS + RPP - 1) / RPP;
    const elem_t* src;                                   // this thread's chunk in the next tile
    long long pass_step;                                 // RPP rows (0 in the pad)
    int row;                                             // this thread's first row in a tile
    int bytes;                                           // 16, or 0 in the pad
    unsigned dst;                                        // byte offset in a tile buffer

    // `first`: row 0 of the first tile; `stride`: the row pitch, elements.
    __device__ __forceinline__ TileStream(const elem_t* first, long long stride, int d_real, int tid) {
        row = tid / CHUNKS;
        const int c = tid % CHUNKS;
        const bool col_ok = c * 8 < d_real;
        src = col_ok ? first + row * stride + c * 8 : first;
        pass_step = col_ok ? RPP * stride : 0;
        bytes = col_ok ? 16 : 0;
        dst = (row * PITCH + (SW ? sw_chunk(c, row) : c) * 8) * 2;
    }

    // Copy the next tile into the buffer at shared address `s0`, rows at or
    // past `valid_rows` zero-filled (their copies read nothing, from `safe`,
    // any readable address), and step to the tile after it.
    __device__ __forceinline__ void copy(unsigned s0, int valid_rows, const elem_t* safe) {
        const elem_t* p = src;
        if (valid_rows >= ROWS) {                        // uniform: every tile but a last partial one
#pragma unroll
            for (int i = 0; i < PASSES; ++i) {
                if (ROWS % RPP != 0 && row + i * RPP >= ROWS) break;
                cp_async_16(s0 + dst + i * RPP * PITCH * 2, p, bytes);
                p += pass_step;
            }
        } else {
            const int rows_left = valid_rows - row;
#pragma unroll
            for (int i = 0; i < PASSES; ++i) {
                if (ROWS % RPP != 0 && row + i * RPP >= ROWS) break;
                const bool ok = bytes != 0 && i * RPP < rows_left;
                cp_async_16(s0 + dst + i * RPP * PITCH * 2, ok ? p : safe, ok ? 16 : 0);
                p += pass_step;
            }
        }
        if constexpr (ROWS % RPP == 0) {
            src = p;                                     // PASSES passes = one tile
        } else {
            src += ROWS * (pass_step / RPP);
        }
    }
};

// The same stream with each row's chunks at immediate offsets from one
// pointer per row (the forward's K and V at d256): G consecutive threads
// copy G * 16 contiguous bytes of a row per instruction (G = 8: whole
// 128-byte lines, as many per warp instruction as TileStream's), and each
// thread keeps the pointers of its ROWS * G / NTHREADS rows, stepped by a
// whole tile *before* the copies. A cp.async reads its address registers only
// when the load/store unit takes it, which under a full tile of copies is
// hundreds of cycles later; TileStream's per-pass addresses are temporaries
// that the next instructions reuse, and that rewrite waits on the long
// scoreboard (ncu, d256: 9% of the samples on the two pointer adds). Here
// the copies read only the row pointers, written a whole tile earlier.
// Measured against TileStream (same-process A/B, H200, s8k): d256 (4 chunks
// per row pointer) +3.0%, long-scoreboard samples 9.7% -> 4.1%; d128 (2 per
// pointer) -1.0%; with G = 2 or 4 (4 chunks per pointer at d64 and d128, so
// half or quarter lines per row and instruction) -6% to -17%: a warp's copy
// must read whole lines. So FITS asks for rows of whole lines, 4 chunks or more per
// thread and row (d256), and threads that cover whole rows; else TileStream
// serves.
template <int ROWS, int DPAD, int PITCH, int NTHREADS, int D_REAL, bool SW = false>
struct RowStream {
    static constexpr int CHUNKS = DPAD / 8;
    static constexpr int G = 8;                          // threads per row: one 128-byte line each
    static constexpr int CPR = CHUNKS / G;               // chunks per thread and row
    static constexpr int SLOTS = NTHREADS / G;           // rows per pass
    static constexpr int RPT = SLOTS > 0 ? ROWS / SLOTS : 0;   // rows per thread
    static constexpr bool FITS = CHUNKS % G == 0 && CPR >= 4 && NTHREADS % G == 0 && SLOTS > 0 &&
                                 ROWS % SLOTS == 0 && RPT >= 1 && RPT <= 4 && (!SW || SLOTS % 8 == 0);
    const elem_t* src[RPT > 0 ? RPT : 1];                // this thread's rows in the last tile copied
    long long tile_step;                                 // ROWS rows
    int row;                                             // first row in a tile (then + SLOTS each)
    int col;                                             // first chunk (then + G each)
    unsigned dst;                                        // byte offset in a tile buffer

    __device__ __forceinline__ RowStream(const elem_t* first, long long stride, int /*d_real*/, int tid) {
        row = tid / G;
        col = tid % G;
        tile_step = ROWS * stride;
#pragma unroll
        for (int j = 0; j < RPT; ++j) src[j] = first + (row + j * SLOTS) * stride + col * 8 - tile_step;
        // Swizzled: the thread's chunks col + i * G (G = 8) keep col's low bits.
        dst = (row * PITCH + (SW ? sw_chunk(col, row) : col) * 8) * 2;
    }

    // Chunk i of the row is in the head dim (pad chunks read nothing).
    __device__ __forceinline__ bool col_ok(int i) const { return DPAD == D_REAL || (col + i * G) * 8 < D_REAL; }

    // As TileStream::copy.
    __device__ __forceinline__ void copy(unsigned s0, int valid_rows, const elem_t* safe) {
#pragma unroll
        for (int j = 0; j < RPT; ++j) src[j] += tile_step;
        if (valid_rows >= ROWS) {                        // uniform: every tile but a last partial one
            copy_rows<false>(s0, valid_rows, safe);
        } else {
            copy_rows<true>(s0, valid_rows, safe);
        }
    }

    // This thread's chunks of the stepped tile; GUARD: rows at or past
    // `valid_rows` read nothing (zero-filled).
    template <bool GUARD>
    __device__ __forceinline__ void copy_rows(unsigned s0, int valid_rows, const elem_t* safe) const {
#pragma unroll
        for (int j = 0; j < RPT; ++j)
#pragma unroll
            for (int i = 0; i < CPR; ++i) {
                const bool ok = col_ok(i) && (!GUARD || row + j * SLOTS < valid_rows);
                cp_async_16(s0 + dst + (j * SLOTS * PITCH + i * G * 8) * 2, ok ? src[j] + i * G * 8 : safe,
                            ok ? 16 : 0);
            }
    }
};

// The K/V stream of a tile shape: RowStream where it fits, else TileStream.
template <bool C, typename A, typename B> struct pick_type { using type = A; };
template <typename A, typename B> struct pick_type<false, A, B> { using type = B; };
template <int ROWS, int DPAD, int PITCH, int NTHREADS, int D_REAL, bool SW = false>
using KvStream = typename pick_type<RowStream<ROWS, DPAD, PITCH, NTHREADS, D_REAL, SW>::FITS,
                                    RowStream<ROWS, DPAD, PITCH, NTHREADS, D_REAL, SW>,
                                    TileStream<ROWS, DPAD, PITCH, NTHREADS, SW>>::type;

// Tracing (gpu_bench --trace80f): lane 0 of every warp stamps each key tile's
// phases, and thread 0 records the block's SM, start and end.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_ROLES = 16;
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

enum : unsigned { EV_F_START = 1, EV_F_FIRST, EV_F_TILE, EV_F_S, EV_F_V, EV_F_SOFTMAX, EV_F_PV, EV_F_EPI };
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


// The block's (batch, head, query block) and its sequence's place, formed
// from %ctaid reads that the compiler may neither merge nor hoist: the kernel
// forms it once before the key loop and again for the epilogue, so that
// nothing only the epilogue needs stays live across the loop (at 255
// registers it would be spilled).
struct FwdBlock {
    int b, h, m_block, q_off, k_off, sq, sk;
};

__device__ __forceinline__ FwdBlock fwd_block(const FwdParams& p) {
    unsigned bx, by;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(by));
    int bh = (int)bx;
    int m_block = gridDim.y - 1 - (int)by;               // longest causal tiles first
    // Ragged batches without a mask, where the launcher asks (p.ragged_order):
    // the sequences longest keys first, each head's real query blocks the last
    // first, and the blocks past the last real one empty (common/order.cuh's
    // ragged_order, warp-collective: every lane of every warp computes it), so
    // that a long sequence late in the batch does not run alone at the end
    // (session 30, one cubin in both orders: +4.2..+7.2% at d128/d256). Under a
    // causal mask the grid's order is kept: its rows start every sequence's
    // last query block first, the longest tiles of the whole batch first, and
    // sequence by sequence measured 2.1-4.7% slower.
    if (MASK_KIND == 0 && p.ragged_order != 0 && p.batch <= RAGGED_ORDER_MAX_BATCH) {
        const int m = (int)gridDim.y;
        const int tile = ragged_order(p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.heads_q, m, BLOCK_M,
                                      (int)(by * gridDim.x + bx));
        if (tile < 0) return FwdBlock{0, 0, 0, 0, 0, 0, 0};   // no tile: m0 >= sq, the block exits
        bh = tile / m;
        m_block = m - 1 - tile % m;
    }
    FwdBlock f{bh / p.heads_q, bh % p.heads_q, m_block, 0, 0, p.seqlen_q, p.seqlen_k};
    if constexpr (IS_THD) {
        f.q_off = p.cu_seqlens_q[f.b];
        f.k_off = p.cu_seqlens_k[f.b];
        f.sq = p.cu_seqlens_q[f.b + 1] - f.q_off;
        f.sk = p.cu_seqlens_k[f.b + 1] - f.k_off;
    }
    return f;
}

// A fragment tile's address from the lane's address (its tile's base plus
// its row and chunk): `rows` whole rows down and `col` columns across (both
// multiples of 16); in a swizzled tile (S) by common/tile.cuh's sw_frag_addr
// (the tile bases are multiples of 128 bytes).
template <bool S>
__device__ __forceinline__ unsigned frag_addr(unsigned lane_addr, int pitch, int rows, int col) {
    if constexpr (S) {
        return sw_frag_addr(lane_addr, pitch, rows, col);
    } else {
        return lane_addr + (rows * pitch + col) * 2;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
attnforge_fwd_f16_d40_none_thd_sm86(const FwdParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* sK = sQ + BLOCK_M * PITCH_Q;                 // [STAGES][BLOCK_N][PITCH_QK]
    elem_t* sV = sK + STAGES * BLOCK_N * PITCH_QK;       // [STAGES][BLOCK_N][PITCH_V]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // The swizzled fragment addresses (frag_addr) XOR bits of the absolute address.
    if (SW && (smem_addr(smem_raw) & 127) != 0) __trap();
#ifdef ATTNFORGE_TRACE
    if (tid == 0) trace_block_start();
    Tracer tr = lane == 0 ? tracer_for(warp) : Tracer{};
    TRACE(EV_F_START);
#endif
    const FwdBlock blk = fwd_block(p);
    const int b = blk.b, h = blk.h, m_block = blk.m_block;
    const int hk = h / p.gqa_ratio;
    const int sq = blk.sq, sk = blk.sk, q_off = blk.q_off, k_off = blk.k_off;
    const int m0 = m_block * BLOCK_M;
    if (m0 >= sq) return;                                // whole block uniform

    const elem_t* gQ = p.q + b * p.q_sb + (q_off + (long long)m0) * p.q_ss + h * p.q_sh;
    const elem_t* gK = p.k + b * p.k_sb + (long long)k_off * p.k_ss + hk * p.k_sh;
    const elem_t* gV = p.v + b * p.v_sb + (long long)k_off * p.v_ss + hk * p.v_sh;

    const RowWindow win(sq, sk, p.window_left, p.window_right);
    const int last_row = min(m0 + BLOCK_M, sq) - 1;
    const int n_begin = (win.key_lo(m0) / BLOCK_N) * BLOCK_N;
    const int n_end = min(sk, win.key_hi(last_row) + 1);
    const int n_tiles = n_end > n_begin ? (n_end - n_begin + BLOCK_N - 1) / BLOCK_N : 0;

    // Per-thread state. Thread (g = lane/4, t = lane%4) owns rows g and g+8 of
    // each of its warp's 16-row tiles, and columns 2t, 2t+1 of each 8-wide n-tile.
    float acc_o[M_TILES][DV / 8][4];
    float row_max[M_TILES][2], row_sum[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int j = 0; j < DV / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][j][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    const int warp_row0 = warp * 16 * M_TILES;
    const int g = lane / 4, t = lane % 4;
    // Each lane's ldmatrix row and column within a fragment, as byte offsets
    // (the k-step and tile parts are then immediates): Q's x4 reads rows
    // 0-15 at columns 0/8, K's keys 0-7/8-15 at columns 0/8, V's (transposed)
    // keys 0-15 at columns 0/8.
    // Swizzled tiles: the lane's chunk is swizzled by its row (row % 8 = lane % 8).
    const int q_ch = SW_Q ? sw_chunk(lane >> 4, lane) : lane >> 4;
    const int k_ch = SW ? sw_chunk((lane >> 3) & 1, lane) : (lane >> 3) & 1;
    const int v_ch = SW_V ? sw_chunk(lane >> 4, lane) : lane >> 4;
    const unsigned q_frag = ((warp_row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * PITCH_Q + q_ch * 8) * 2;
    const unsigned k_frag = (((lane & 7) + (lane >> 4) * 8) * PITCH_QK + k_ch * 8) * 2;
    const unsigned v_frag = (((lane & 7) + ((lane >> 3) & 1) * 8) * PITCH_V + v_ch * 8) * 2;

    // K/V tiles: each thread streams its own chunks through the tiles
    // (common/tile.cuh: KvStream picks RowStream at d256, else TileStream
    // where each thread keeps one column), else the general copy.
    using KStream = KvStream<BLOCK_N, DQK, PITCH_QK, THREADS, D_QK, SW>;
    using VStream = KvStream<BLOCK_N, DV, PITCH_V, THREADS, D_V, SW_V>;
    KStream k_stream(gK + n_begin * p.k_ss, p.k_ss, D_QK, tid);
    VStream v_stream(gV + n_begin * p.v_ss, p.v_ss, D_V, tid);
    // Shared-memory byte addresses of the buffers, formed once (a generic
    // pointer per tile costs a window lookup and a conversion each time).
    const unsigned sQa = smem_addr(sQ), sKa0 = smem_addr(sK), sVa0 = smem_addr(sV);
    constexpr unsigned K_BUF = BLOCK_N * PITCH_QK * 2, V_BUF = BLOCK_N * PITCH_V * 2;
    auto load_k = [&](int n, int buf) {
        if constexpr (KStream::FITS) {
            k_stream.copy(sKa0 + buf * K_BUF, sk - n, gK);
        } else {
            load_tile<BLOCK_N, DQK, PITCH_QK, THREADS, SW>(sK + buf * BLOCK_N * PITCH_QK, gK + n * p.k_ss, p.k_ss, sk - n, D_QK, tid);
        }
    };
    auto load_v = [&](int n, int buf) {
        if constexpr (VStream::FITS) {
            v_stream.copy(sVa0 + buf * V_BUF, sk - n, gV);
        } else {
            load_tile<BLOCK_N, DV, PITCH_V, THREADS, SW_V>(sV + buf * BLOCK_N * PITCH_V, gV + n * p.v_ss, p.v_ss, sk - n, D_V, tid);
        }
    };
    if (n_tiles > 0) {
        load_tile<BLOCK_M, DQK, PITCH_Q, THREADS, SW_Q>(sQ, gQ, p.q_ss, sq - m0, D_QK, tid);
        load_k(n_begin, 0);
        if constexpr (STAGES == 2) load_v(n_begin, 0);
        cp_async_commit();
    }

    for (int it = 0; it < n_tiles; ++it) {
        const int n0 = n_begin + it * BLOCK_N;
        const int buf = STAGES == 2 ? it & 1 : 0;
        if constexpr (STAGES == 2) {
            if (it + 1 < n_tiles) {                      // prefetch the next K/V tile
                load_k(n0 + BLOCK_N, buf ^ 1);
                load_v(n0 + BLOCK_N, buf ^ 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
        } else {
            // One buffer each, FlashAttention-2's order: K(it) has landed and
            // every warp is past P V(it-1), so V(it) may replace V(it-1); it
            // loads under S.
            cp_async_wait<0>();
            __syncthreads();
            load_v(n0, 0);
            cp_async_commit();
        }
        TRACE(it == 0 ? EV_F_FIRST : EV_F_TILE);         // the first: the prologue's loads

        const unsigned sKa = sKa0 + buf * K_BUF, sVa = sVa0 + buf * V_BUF;
        // The lanes' Q and K fragment addresses for this tile. Swizzled, each
        // k-step position in a 128-byte line has its own XORed address; made
        // opaque here, the four XORs are formed per tile and die with the S
        // product, instead of being hoisted and held across the key loop
        // (which spills at d128).
        unsigned q_lane = sQa + q_frag, k_lane = sKa + k_frag;
        if constexpr (SW_Q) asm volatile("" : "+r"(q_lane));
        if constexpr (SW) asm volatile("" : "+r"(k_lane));

        // S = Q K^T for this warp's rows.
        float acc_s[M_TILES][BLOCK_N / 8][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = 0.f;
        // Four k-steps per trip with two m16 tiles per warp: unrolled fully,
        // ptxas hoists every step's operands and spills 16 B on sm_90a at d128
        // (240 registers and no spills this way).
#pragma unroll 4
        for (int ks = 0; ks < DQK / 16; ++ks) {
            unsigned a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
                ldmatrix_x4(a[mt], frag_addr<SW_Q>(q_lane, PITCH_Q, mt * 16, ks * 16));
#pragma unroll
            for (int np = 0; np < BLOCK_N / 16; ++np) {
                unsigned bk[4];
                ldmatrix_x4(bk, frag_addr<SW>(k_lane, PITCH_QK, np * 16, ks * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_16816(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
                    mma_16816(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
                }
            }
        }

        TRACE(EV_F_S);
        if constexpr (STAGES == 1) {
            // V(it) has landed and every warp is done with K(it): K(it+1)
            // loads under the softmax and P V.
            cp_async_wait<0>();
            __syncthreads();
            if (it + 1 < n_tiles) {
                load_k(n0 + BLOCK_N, 0);
                cp_async_commit();
            }
            TRACE(EV_F_V);
        }

        // Softcap into the log2 domain (otherwise the softmax scales the scores).
        if constexpr (SOFTCAP) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc_s[mt][j][e] = p.softcap_post * fast_tanh(acc_s[mt][j][e] * p.softcap_pre);
        }
        // Mask, only on tiles that cross a row's visible range or the end of K.
        const bool edge = (n0 + BLOCK_N > sk) || (MASK_KIND != 0 &&
            (win.key_lo(last_row) > n0 || win.key_hi(m0) < n0 + BLOCK_N - 1));
        if (edge) apply_mask<M_TILES, BLOCK_N>(acc_s, win, m0 + warp_row0 + g, n0 + 2 * t);
        // Online softmax: running max and sum per row, rescale O.
        online_softmax<M_TILES, BLOCK_N / 8>(acc_s, row_max, row_sum, SOFTCAP ? 1.f : p.scale_log2, [&](int mt, int r, float alpha) {
#pragma unroll
            for (int j = 0; j < DV / 8; ++j) {
                acc_o[mt][j][2 * r] *= alpha;
                acc_o[mt][j][2 * r + 1] *= alpha;
            }
        });

        TRACE(EV_F_SOFTMAX);
        // O += P V. The S accumulator layout of two n-tiles is the A-operand
        // layout of one k-step, so P never leaves registers.
        unsigned v_lane = sVa + v_frag;                  // opaque when swizzled, as q_lane
        if constexpr (SW_V) asm volatile("" : "+r"(v_lane));
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            unsigned pa[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                pa[mt][0] = pack2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                pa[mt][1] = pack2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                pa[mt][2] = pack2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int np = 0; np < DV / 16; ++np) {
                unsigned bv[4];
                ldmatrix_x4_trans(bv, frag_addr<SW_V>(v_lane, PITCH_V, kk * 16, np * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_16816(acc_o[mt][2 * np], pa[mt], bv[0], bv[1]);
                    mma_16816(acc_o[mt][2 * np + 1], pa[mt], bv[2], bv[3]);
                }
            }
        }
        TRACE(EV_F_PV);
        if constexpr (STAGES == 2) __syncthreads();     // buffer `buf` is refilled next iteration
    }

    // Epilogue: normalize, write O (elements) and LSE (f32, natural log;
    // a null p.lse means not wanted). A quad holds 8 columns of a row per
    // n-tile j, 2 per lane; a transpose within the quad (common/ptx.cuh)
    // gives each lane 8 consecutive columns of one of four n-tiles, written
    // as one 16-byte store (the launcher checks 16-byte aligned pointers and
    // strides): a quarter of the store instructions, whole 32-byte sectors.
    const FwdBlock eb = fwd_block(p);
    unsigned etid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(etid));
    const int e_row0 = (int)(etid / 32) * 16 * M_TILES + eb.m_block * BLOCK_M;
    const int eg = (etid % 32) / 4, et = etid % 4;
    elem_t* gO = p.o + eb.b * p.o_sb + (long long)eb.q_off * p.o_ss + eb.h * p.o_sh;
    float* gL = p.lse != nullptr ? p.lse + eb.b * p.lse_sb + eb.h * p.lse_sh + eb.q_off : nullptr;
    constexpr int GROUPS = (DV / 8 + 3) / 4;
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        unsigned v[2][GROUPS][4];
        float l[2], inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] = quad_sum(row_sum[mt][r]);
            inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
        }
        pack_rows_for_16b_stores(acc_o[mt], inv, et, v);   // this lane: n-tile 4gr + et of each group gr
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = e_row0 + mt * 16 + eg + 8 * r;
            if (i < eb.sq) {
                elem_t* row = gO + i * p.o_ss;
#pragma unroll
                for (int gr = 0; gr < GROUPS; ++gr) {
                    const int col = (4 * gr + et) * 8;
                    if (col < D_V) *reinterpret_cast<uint4*>(row + col) = make_uint4(v[r][gr][0], v[r][gr][1], v[r][gr][2], v[r][gr][3]);
                }
                if (et == 0 && gL != nullptr) {
                    gL[i] = l[r] > 0.f ? (row_max[mt][r] + fast_log2(l[r])) * 0.6931471805599453f : NEG_INF;
                }
            }
        }
    }
#ifdef ATTNFORGE_TRACE
    TRACE(EV_F_EPI);
    if (lane == 0) trace_block_end();
#endif
}
