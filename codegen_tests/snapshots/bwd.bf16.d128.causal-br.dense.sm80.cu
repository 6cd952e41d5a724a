// attnforge generated kernel: bwd.bf16.d128.causal-br.dense.sm80
// template bwd_sm80.cu — FlashAttention-2-style backward on the sm80 instruction
// path (mma.sync m16n8k16, ldmatrix, cp.async). Plan: block_n=128 kv rows x
// block_m=64 query rows, 8 warps, Q/dO stages=1,
// S/dQ accumulator chunks <= 16 f32 per thread.
// Do not edit: rendered by attnforge from templates/bwd_sm80.cu.
//
// Entry points (one shared BwdParams), launched in this order:
//   attnforge_bwd_bf16_d128_causal_br_dense_sm80_pre          Dsum = rowsum(dO * O) in f32 (LSE layout); zero dq_accum
//   attnforge_bwd_bf16_d128_causal_br_dense_sm80              main: one block per (kv tile, batch, kv head): dK, dV,
//                            and dQ added to the f32 dq_accum with red.global.add
//                            (one 16-byte red.global.add.v4.f32 per 4 columns on sm_90)
//   attnforge_bwd_bf16_d128_causal_br_dense_sm80_dq_convert   dQ = scale * dq_accum, in the element type
//
// Notation: S = Q K^T (raw), z = S*scale (softcap: z = cap*tanh(S*scale/cap)),
// P = exp(z - LSE), dP = dO V^T, Dsum = rowsum(dO*O), dZ = P*(dP - Dsum),
// dS = dZ * dz/dS / scale (softcap: (1 - tanh^2); the factor `scale` is applied to
// dQ and dK at the end). dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K.

constexpr int BLOCK_M = 64;               // query rows per inner step (main)
constexpr int BLOCK_N = 128;               // kv rows per block (main)
constexpr int NUM_WARPS = 8;
constexpr int THREADS = NUM_WARPS * 32;
constexpr int Q_STAGES = 1;             // Q/dO shared-memory buffers
constexpr int D_QK = 128;                     // real head dims
constexpr int D_V = 128;
constexpr int DQK = 128;                  // padded (multiple of 16; see the plan)
constexpr int DV = 128;
constexpr int PITCH_QK = 136;             // shared-memory row pitches, elements
constexpr int PITCH_V = 136;
constexpr int PITCH_M = 72;               // P^T / dS^T tiles [BLOCK_N][PITCH_M]
// The main kernel's Q and dO tiles, copied once per query tile: swizzled rows
// without a pad (the plan's qdo_swizzle; common/tile.cuh, load_tile) where
// their rows are whole 128-byte lines, else padded as K and V.
constexpr bool QDO_SW = true;
constexpr int PITCH_Q = QDO_SW ? DQK : PITCH_QK;
constexpr int PITCH_DO = QDO_SW ? DV : PITCH_V;
constexpr int MASK_KIND = 2;
constexpr bool IS_THD = false;
constexpr bool SOFTCAP = false;
constexpr bool DETERMINISTIC = false;

// Warp grids of the main kernel's three products (rows x cols of warps; warps
// beyond rows*cols sit the product out). Every warp tile is a multiple of 16x16.
constexpr int S_WN = 4, S_WM = 2;      // S^T, dP^T: [BLOCK_N x BLOCK_M]
constexpr int S_ROWS = BLOCK_N / S_WN, S_COLS = BLOCK_M / S_WM;
constexpr int DK_WN = 4, DK_WD = 2;  // dK: [BLOCK_N x DQK]
constexpr int DK_ROWS = BLOCK_N / DK_WN, DK_COLS = DQK / DK_WD;
constexpr int DV_WN = 4, DV_WD = 2;  // dV: [BLOCK_N x DV]
constexpr int DV_ROWS = BLOCK_N / DV_WN, DV_COLS = DV / DV_WD;
constexpr int DQ_WM = 2, DQ_WD = 4;  // dQ: [BLOCK_M x DQK] (fast mode)
constexpr int DQ_ROWS = BLOCK_M / DQ_WM, DQ_COLS = DQK / DQ_WD;

// The S and dQ phases walk their warp tile in column chunks so that their
// accumulators (on top of the dK/dV accumulators held for the whole block)
// stay within ACC_CHUNK f32 per thread per array (the plan's choice): a chunk
// re-reads the A operand from shared memory, for fewer live registers.
constexpr int ACC_CHUNK = 16;
// The dQ phase's own limit (the plan's dq_chunk): larger where the S phase's
// registers are free by then (kv_in_regs: P and dS are consumed in the S phase).
constexpr int DQ_CHUNK = 16;
// Largest even divisor of nt with mt * 4 * divisor <= limit (2 at least).
constexpr int chunk_nt(int mt, int nt, int limit = ACC_CHUNK) {
    int best = 2;
    for (int c = 2; c <= nt; c += 2)
        if (nt % c == 0 && mt * 4 * c <= limit) best = c;
    return best;
}

constexpr int ROW_WARPS = 4;           // _pre / _dq_convert: one (token, head) row per warp
constexpr int DQ_G = 8;             // dq_accum: tiles of DQ_G tokens x 8 columns (fast mode)

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
attnforge_bwd_bf16_d128_causal_br_dense_sm80_pre(const BwdParams p) {
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
attnforge_bwd_bf16_d128_causal_br_dense_sm80_dq_convert(const BwdParams p) {
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

// Tracing (gpu_bench --trace80b): lane 0 of every warp of the main kernel
// stamps the phases of each query tile.
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

enum : unsigned { EV_B_ITER = 1, EV_B_S, EV_B_SYNC1, EV_B_KV, EV_B_DQ, EV_B_SYNC2, EV_B_EPI };

// ---- tiles and warp-level GEMM ----------------------------------------------------

// ldmatrix addresses. A fragment tile (16 x 16) is `outer` rows/cols by `k`
// (16 each); its byte offset in a tile stored with row pitch `pitch`
// (elements) is (outer * pitch + k) * 2 when stored [outer][k], and
// (k * pitch + outer) * 2 when stored [k][outer] (read with ldmatrix.trans).
// Each lane adds its own row address inside the tile once (`*_lane_off`), so
// that in the k-loops only constant offsets change and the compiler folds them
// into the instructions' immediates.
template <bool T>
__device__ __forceinline__ int tile_off(int pitch, int outer, int k) {
    return T ? (k * pitch + outer) * 2 : (outer * pitch + k) * 2;
}

// A operand (16 x 16) of mma.m16n8k16. A_T = false: stored row-major
// [row][k] (ldmatrix); A_T = true: stored [k][row], i.e. A is the transpose of
// the stored tile (ldmatrix.trans). Fragment: a0 (rows 0-7, k 0-7), a1 (rows
// 8-15, k 0-7), a2 (rows 0-7, k 8-15), a3 (rows 8-15, k 8-15); lanes
// 8q..8q+7 address the eight rows of matrix q.
template <bool A_T>
__device__ __forceinline__ int a_lane_off(int pitch, int lane) {
    if constexpr (!A_T) {
        return tile_off<false>(pitch, (lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8);
    } else {
        return tile_off<true>(pitch, ((lane >> 3) & 1) * 8, (lane & 7) + (lane >> 4) * 8);
    }
}

// B operands of two adjacent n8 tiles (cols c0..c0+15, k k0..k0+15): b[0], b[1] for
// cols c0..c0+7 (k 0-7, k 8-15), b[2], b[3] for cols c0+8..c0+15.
//   B_T = false: stored [col][k] (ldmatrix);  B_T = true: stored [k][col] (ldmatrix.trans).
template <bool B_T>
__device__ __forceinline__ int b_lane_off(int pitch, int lane) {
    if constexpr (!B_T) {
        return tile_off<false>(pitch, (lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
    } else {
        return tile_off<true>(pitch, (lane >> 4) * 8, (lane & 7) + ((lane >> 3) & 1) * 8);
    }
}

// B operands in a swizzled tile (QDO_SW): rows of pitch * 2 bytes, a multiple
// of 128, chunk c of row r stored at sw_chunk(c, r) (common/tile.cuh). The
// lane's row and chunk at (outer, k) = (0, 0), as b_lane_off, with its chunk
// swizzled by its row (the lane's row % 8 is lane % 8 in both forms, every
// fragment tile starting at a row that is a multiple of 8).
template <bool B_T>
__device__ __forceinline__ int sw_lane_off(int pitch, int lane) {
    const int row = B_T ? (lane & 7) + ((lane >> 3) & 1) * 8 : (lane & 7) + (lane >> 4) * 8;
    const int chunk = B_T ? lane >> 4 : (lane >> 3) & 1;
    return row * pitch * 2 + (sw_chunk(chunk, lane) << 4);    // row % 8 == lane % 8
}

// The address of the fragment tile at (outer, k) (constants at every call) from
// `base` = the tile's address + sw_lane_off + whole rows (stored [col][k]) or
// whole 64-column lines (stored [k][col]); common/tile.cuh's sw_frag_addr (the
// kernel checks that the tile bases are multiples of 128 bytes).
template <bool B_T>
__device__ __forceinline__ unsigned sw_addr(unsigned base, int pitch, int outer, int k) {
    return B_T ? sw_frag_addr(base, pitch, k, outer) : sw_frag_addr(base, pitch, outer, k);
}

template <bool T>
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    if constexpr (T) {
        ldmatrix_x4_trans(r, addr);
    } else {
        ldmatrix_x4(r, addr);
    }
}

template <bool B_T, bool B_SW = false>
__device__ __forceinline__ void load_b(unsigned (&b)[4], unsigned base, int pitch, int c0, int k0, int lane) {
    if constexpr (B_SW) {
        ldsm_x4<B_T>(b, sw_addr<B_T>(base + sw_lane_off<B_T>(pitch, lane), pitch, c0, k0));
    } else {
        ldsm_x4<B_T>(b, base + b_lane_off<B_T>(pitch, lane) + tile_off<B_T>(pitch, c0, k0));
    }
}

// The products of one A fragment with a pair of B fragments (two n8 tiles,
// b[0..1] and b[2..3]): the first k-step writes the accumulators, later ones
// add (`first` is a constant at every call).
__device__ __forceinline__ void mma_pair(float (&d0)[4], float (&d1)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[4], bool first) {
    if (first) {
        mma_16816_first(d0, a, b[0], b[1]);
        mma_16816_first(d1, a, b[2], b[3]);
    } else {
        mma_16816(d0, a, b[0], b[1]);
        mma_16816(d1, a, b[2], b[3]);
    }
}

// acc[MT][NT][4] += A[r0 .. r0 + 16 MT) x B[.., c0 .. c0 + 8 NT), k over [0, 16 KSTEPS)
// (FIRST: acc = the product; its first k-step writes the accumulators instead
// of adding to cleared ones, which saves clearing them: ncu counted the
// clears at 7% of the main kernel's instructions).
// Accumulator layout: thread (g = lane/4, t = lane%4) holds, of each 16x8 tile,
// rows g (elements 0, 1) and g + 8 (elements 2, 3), columns 2t and 2t + 1.
// B_SW: B is a swizzled tile (sw_addr); c0 is then a multiple of 8 rows
// (stored [col][k]) or of 64 columns (stored [k][col]).
template <int MT, int NT, int KSTEPS, bool A_T, bool B_T, bool FIRST = false, bool B_SW = false>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], unsigned sA, int pitch_a, int r0,
                                          unsigned sB, int pitch_b, int c0, int lane) {
    static_assert(NT % 2 == 0, "B operands are loaded two n8 tiles at a time");
    // An opaque copy of the lane: otherwise ptxas hoists every product's two
    // base addresses out of the query-tile loop, next to the dK/dV
    // accumulators, and spills; rebuilt per product they cost a few integer ops.
    int ln = lane;
    asm volatile("" : "+r"(ln));
    const unsigned a0 = sA + a_lane_off<A_T>(pitch_a, ln) + tile_off<A_T>(pitch_a, r0, 0);
    const unsigned b0 =
        sB + (B_SW ? sw_lane_off<B_T>(pitch_b, ln) : b_lane_off<B_T>(pitch_b, ln)) + tile_off<B_T>(pitch_b, c0, 0);
    // One k-step: MT A fragments, NT / 2 B fragment pairs, MT x NT products.
    auto step = [&](int ks, bool first) {   // `first` is a constant at both calls
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4<A_T>(a[mt], a0 + tile_off<A_T>(pitch_a, mt * 16, ks * 16));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned b[4];
            ldsm_x4<B_T>(b, B_SW ? sw_addr<B_T>(b0, pitch_b, np * 16, ks * 16)
                                 : b0 + tile_off<B_T>(pitch_b, np * 16, ks * 16));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mma_pair(acc[mt][2 * np], acc[mt][2 * np + 1], a[mt], b, first);
        }
    };
    if constexpr (FIRST) step(0, true);
    // The k-loop only moves addresses (the accumulators are indexed by mt and
    // np), so a partial unroll by 4 keeps everything in registers while
    // stopping the compiler from hoisting the operands of all k-steps at once.
    // Past 8 k-steps (d > 128: the S and dP products) it is unrolled fully, so
    // that each k-step's loads issue under the previous k-step's MMAs instead
    // of opening a rolled trip with no product to hide them (session 23).
    constexpr int UNROLL = KSTEPS > 8 ? KSTEPS : 4;
#pragma unroll UNROLL
    for (int ks = FIRST ? 1 : 0; ks < KSTEPS; ++ks) step(ks, false);
}

// One k-step, acc[MT][NT][4] += A x B[k0 .. k0 + 16, 0 .. 8 NT): A in registers
// (MT fragments), B stored [k][col] (ldmatrix.trans). The S phase's dV/dK
// products under kv_in_regs.
template <int MT, int NT, bool B_SW = false>
__device__ __forceinline__ void kstep_from_regs(float (&acc)[MT][NT][4], const unsigned (&a)[MT][4], unsigned sB,
                                                int pitch_b, int k0, int lane) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
        unsigned b[4];
        load_b<true, B_SW>(b, sB, pitch_b, np * 16, k0, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_pair(acc[mt][2 * np], acc[mt][2 * np + 1], a[mt], b, false);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
}

// ---- main: one block per (kv tile, batch, kv head) -----------------------------

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attnforge_bwd_bf16_d128_causal_br_dense_sm80(const BwdParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* sK = reinterpret_cast<elem_t*>(smem_raw);    // [BLOCK_N][PITCH_QK]
    elem_t* sV = sK + BLOCK_N * PITCH_QK;                // [BLOCK_N][PITCH_V]
    elem_t* sQ = sV + BLOCK_N * PITCH_V;                 // [Q_STAGES][BLOCK_M][PITCH_Q]
    elem_t* sdO = sQ + Q_STAGES * BLOCK_M * PITCH_Q;     // [Q_STAGES][BLOCK_M][PITCH_DO]
    // P^T and dS^T [BLOCK_N][PITCH_M] each: no P^T tile where dV and dK are
    // accumulated from registers (kv_in_regs), and then no dS^T tile either
    // without a dQ phase (deterministic mode).
    constexpr int P_TILE = BLOCK_N * PITCH_M;
    constexpr int DS_TILE = BLOCK_N * PITCH_M;
    elem_t* sP = sdO + Q_STAGES * BLOCK_M * PITCH_DO;    // P^T
    elem_t* sdS = sP + P_TILE;                           // dS^T
    float* sLse = reinterpret_cast<float*>(sdS + DS_TILE);             // [Q_STAGES][BLOCK_M]
    float* sDsum = sLse + Q_STAGES * BLOCK_M;                          // [Q_STAGES][BLOCK_M]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    // Swizzled Q/dO tiles (sw_addr): whole 64-column lines per warp tile of
    // the dK/dV products, and tile buffers at multiples of 128 bytes.
    static_assert(!QDO_SW || (DK_COLS % 64 == 0 && DV_COLS % 64 == 0 && (BLOCK_N * (PITCH_QK + PITCH_V) * 2) % 128 == 0),
                  "qdo_swizzle: 64-column warp tiles, 128-byte aligned Q/dO buffers");
    if (QDO_SW && (smem_addr(smem_raw) & 127) != 0) __trap();
#ifdef ATTNFORGE_TRACE
    if (tid == 0) trace_block_start();
    Tracer tr = lane == 0 ? tracer_for(warp) : Tracer{};
#endif
    const BlockTile bt = block_tile(p);
    const int b = bt.bh / p.heads_kv, hk = bt.bh % p.heads_kv;
    const int n0 = bt.tile * BLOCK_N;                 // kv tiles with the most query rows first
    const SeqInfo si = seq_info(p, b);
    const int sq = si.sq, sk = si.sk;
    if (n0 >= sk) return;                                // whole block uniform

    const RowWindow win{sq, sk, p.window_left, p.window_right};
    const QueryTiles qt = query_tiles_seeing(sq, sk, p.window_left, p.window_right, n0, BLOCK_N, BLOCK_M);
    const int m_begin = qt.first, n_mt = qt.count;
    const int n_iters = n_mt * p.gqa_ratio;              // (query head of the group, query tile)

    const elem_t* gK = p.k + b * p.k_sb + (long long)(si.k_off + n0) * p.k_ss + hk * p.k_sh;
    const elem_t* gV = p.v + b * p.v_sb + (long long)(si.k_off + n0) * p.v_ss + hk * p.v_sh;

    // Iteration it = (query head of the group, query tile) = (it / n_mt,
    // it % n_mt), tracked by counters: no integer division in the loop.
    struct Step {
        int qh, mt;
    };
    auto next_step = [&](Step s) { return s.mt + 1 == n_mt ? Step{s.qh + 1, 0} : Step{s.qh, s.mt + 1}; };
    // Stage the query tile of step `st` (Q, dO, LSE, Dsum) into buffer `buf`.
    auto load_q_tile = [&](Step st, int buf) {
        const int h = hk * p.gqa_ratio + st.qh;
        const int m0 = (m_begin + st.mt) * BLOCK_M;
        const long long row0 = si.q_off + m0;
        load_tile<BLOCK_M, DQK, PITCH_Q, THREADS, QDO_SW>(sQ + buf * BLOCK_M * PITCH_Q,
            p.q + b * p.q_sb + row0 * p.q_ss + h * p.q_sh, p.q_ss, sq - m0, D_QK, tid);
        load_tile<BLOCK_M, DV, PITCH_DO, THREADS, QDO_SW>(sdO + buf * BLOCK_M * PITCH_DO,
            p.dout + b * p.do_sb + row0 * p.do_ss + h * p.do_sh, p.do_ss, sq - m0, D_V, tid);
        stage_rows<true>(p, b, h, si.q_off, m0, sq, BLOCK_M, tid, sLse + buf * BLOCK_M, sDsum + buf * BLOCK_M);
    };

    // dK and dV accumulators of this warp (its tile of each warp grid), for the whole block.
    float acc_dk[DK_ROWS / 16][DK_COLS / 8][4];
    float acc_dv[DV_ROWS / 16][DV_COLS / 8][4];
    zero_acc(acc_dk);
    zero_acc(acc_dv);
    const int dk_r0 = (warp / DK_WD) * DK_ROWS, dk_c0 = (warp % DK_WD) * DK_COLS;
    const int dv_r0 = (warp / DV_WD) * DV_ROWS, dv_c0 = (warp % DV_WD) * DV_COLS;

    if (n_iters > 0) {
        load_tile<BLOCK_N, DQK, PITCH_QK, THREADS>(sK, gK, p.k_ss, sk - n0, D_QK, tid);
        load_tile<BLOCK_N, DV, PITCH_V, THREADS>(sV, gV, p.v_ss, sk - n0, D_V, tid);
        load_q_tile(Step{0, 0}, 0);
        cp_async_commit();
    }
    const unsigned sKa = smem_addr(sK), sVa = smem_addr(sV);
    const unsigned sPa = smem_addr(sP), sdSa = smem_addr(sdS);

    Step cur{0, 0};
    for (int it = 0; it < n_iters; ++it, cur = next_step(cur)) {
        const int buf = Q_STAGES == 2 ? (it & 1) : 0;
        // The next tile goes into buffer buf ^ 1 once no warp reads it: after the
        // barrier below (every warp is done with tile it - 1), or before it under
        // kv_in_regs, where nothing reads Q/dO after the S phase (dV and dK come
        // from registers) and every warp is past the previous tile's S phase.
        cp_async_wait<0>();                              // tile `it`, with its LSE and Dsum
        finish_rows(sLse + buf * BLOCK_M, BLOCK_M, tid);
        __syncthreads();                                 // every thread's copies landed; P^T and dS^T are free
        TRACE(EV_B_ITER);
        if (Q_STAGES == 2 && it + 1 < n_iters) {
            load_q_tile(next_step(cur), buf ^ 1);        // under this tile's products
            cp_async_commit();
        }

        const int h = hk * p.gqa_ratio + cur.qh;
        const int m0 = (m_begin + cur.mt) * BLOCK_M;
        const unsigned sQa = smem_addr(sQ + buf * BLOCK_M * PITCH_Q);
        const unsigned sdOa = smem_addr(sdO + buf * BLOCK_M * PITCH_DO);
        const float* lse2_t = sLse + buf * BLOCK_M;
        const float* dsum_t = sDsum + buf * BLOCK_M;

        // ---- S phase: S^T = K Q^T, dP^T = V dO^T; P^T and dS^T into shared memory.
        if (warp < S_WN * S_WM) {
            constexpr int MT = S_ROWS / 16, NT_ALL = S_COLS / 8, NT = chunk_nt(MT, NT_ALL);
            const int r0 = (warp / S_WM) * S_ROWS;       // kv row within the tile
            const int m_last = min(m0 + BLOCK_M, sq) - 1;
            const bool edge = (n0 + BLOCK_N > sk) || (MASK_KIND != 0 &&
                (win.key_lo(m_last) > n0 || win.key_hi(m0) < n0 + BLOCK_N - 1));
#pragma unroll 1
            for (int cc = 0; cc < NT_ALL / NT; ++cc) {
                const int c0 = (warp % S_WM) * S_COLS + cc * NT * 8;   // query row within the tile
                float acc_s[MT][NT][4], acc_dp[MT][NT][4];
                warp_gemm<MT, NT, DQK / 16, false, false, true, QDO_SW>(acc_s, sKa, PITCH_QK, r0, sQa, PITCH_Q, c0, lane);
                warp_gemm<MT, NT, DV / 16, false, false, true, QDO_SW>(acc_dp, sVa, PITCH_V, r0, sdOa, PITCH_DO, c0,
                                                                       lane);
                // P and dS of the chunk. Tiles away from the sequence ends and
                // the mask's edge skip the per-score visibility test (a separate,
                // uniform path: as one path, the compiler predicated every score).
                auto scores = [&](bool check) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e1 = 0; e1 < 2; ++e1) {
                            const int ci = c0 + nt * 8 + 2 * t + e1;   // query row within the tile
                            const float lse2 = lse2_t[ci], dsum = dsum_t[ci];
                            const int lo = win.key_lo(m0 + ci), hi = win.key_hi(m0 + ci);
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                                for (int r = 0; r < 2; ++r) {
                                    const int e = 2 * r + e1;
                                    const int key = n0 + r0 + mt * 16 + g + 8 * r;
                                    const bool vis = !check || (key >= lo && key <= hi);
                                    float pr;
                                    acc_dp[mt][nt][e] = score_grad(acc_s[mt][nt][e], acc_dp[mt][nt][e], lse2, dsum, vis, p, pr);
                                    acc_s[mt][nt][e] = pr;
                                }
                            }
                        }
                    }
                };
                if (edge) {
                    scores(true);
                } else {
                    scores(false);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int off = (r0 + mt * 16 + g + 8 * r) * PITCH_M + c0 + nt * 8 + 2 * t;
                            *reinterpret_cast<elem2_t*>(sP + off) = pack2(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]);
                            *reinterpret_cast<elem2_t*>(sdS + off) = pack2(acc_dp[mt][nt][2 * r], acc_dp[mt][nt][2 * r + 1]);
                        }
                    }
                }
            }
        }
        TRACE(EV_B_S);
        __syncthreads();
        TRACE(EV_B_SYNC1);

        // ---- KV phase: dV += P^T dO, dK += dS^T Q (accumulators stay in registers).
        if (warp < DV_WN * DV_WD)
            warp_gemm<DV_ROWS / 16, DV_COLS / 8, BLOCK_M / 16, false, true, false, QDO_SW>(acc_dv, sPa, PITCH_M, dv_r0,
                                                                                          sdOa, PITCH_DO, dv_c0, lane);
        TRACE(EV_B_KV);

        // ---- dQ phase (fast mode): dq_accum += dS K, f32 reductions in global memory.
        if constexpr (!DETERMINISTIC) {
            if (warp < DQ_WM * DQ_WD) {
                constexpr int MT = DQ_ROWS / 16, NT_ALL = DQ_COLS / 8, NT = chunk_nt(MT, NT_ALL, DQ_CHUNK);
                const int r0 = (warp / DQ_WD) * DQ_ROWS;
#pragma unroll 1
                for (int cc = 0; cc < NT_ALL / NT; ++cc) {
                    const int c0 = (warp % DQ_WD) * DQ_COLS + cc * NT * 8;
                    float acc[MT][NT][4];
                    warp_gemm<MT, NT, BLOCK_N / 16, true, true, true>(acc, sdSa, PITCH_M, r0, sKa, PITCH_QK, c0, lane);
                    const long long acc_row0 = IS_THD ? (long long)si.q_off + m0 : (long long)b * p.seqlen_q + m0;
                    // No branch around rows past the sequence (the last tile's):
                    // their dQ is exactly zero (P = 0 from the LSE staged as +inf,
                    // zero-filled dO), so it is added to the last row instead,
                    // which keeps the address in bounds.
#if __CUDA_ARCH__ >= 900
                    // One 8-byte vector reduction per accumulator row pair (before
                    // session 15 a lane-pair shuffle formed 16-byte ones, whose
                    // SHFL/FSEL cost more than the extra requests). In the tiled
                    // accumulator (DQ_G = 8) a warp's 32 of them are 8 rows x 8
                    // columns: 256 contiguous bytes (two runs where the rows
                    // straddle a tile: ragged batches, odd lengths).
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int row_in = min(m0 + r0 + mt * 16 + g + 8 * r, sq - 1) - m0;
                            float* grow = dq_acc_at(p, acc_row0 + row_in, h) + dq_acc_col(c0 + 2 * t);
#pragma unroll
                            for (int nt = 0; nt < NT; ++nt) {
                                const float* a = acc[mt][nt];
                                red_add_f32x2(grow + nt * DQ_COL_STEP, a[2 * r], a[2 * r + 1]);
                            }
                        }
                    }
#else
                    // Scalar reductions; lanes t = 2k and 2k + 1 swap halves so that
                    // each holds four consecutive columns 4k..4k+3 of one row (the
                    // even lane of row g, the odd lane of row g + 8): fewer live
                    // addresses than two rows per lane (the sm_80 build at d128
                    // spills 20 B with those).
                    const bool odd = t & 1;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const int row = r0 + mt * 16 + g + (odd ? 8 : 0);
                        const int row_in = min(m0 + row, sq - 1) - m0;
                        float* grow = dq_acc_at(p, acc_row0 + row_in, h) + dq_acc_col(c0 + 4 * (t >> 1));
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const float* a = acc[mt][nt];
                            const float x0 = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[2], 1);
                            const float x1 = __shfl_xor_sync(0xffffffffu, odd ? a[1] : a[3], 1);
                            float* dst = grow + nt * DQ_COL_STEP;
                            red_add_f32x4(dst, odd ? x0 : a[0], odd ? x1 : a[1], odd ? a[2] : x0, odd ? a[3] : x1);
                        }
                    }
#endif
                }
            }
        }
        TRACE(EV_B_DQ);
        // dK after the dQ phase (the plan's dk_after_dq): its MMAs issue while
        // the dQ reductions drain.
        if (warp < DK_WN * DK_WD)
            warp_gemm<DK_ROWS / 16, DK_COLS / 8, BLOCK_M / 16, false, true, false, QDO_SW>(acc_dk, sdSa, PITCH_M, dk_r0,
                                                                                          sQa, PITCH_Q, dk_c0, lane);
        if (Q_STAGES == 1) {
            __syncthreads();                             // P^T, dS^T and the one Q/dO buffer are rewritten next
            if (it + 1 < n_iters) {
                load_q_tile(next_step(cur), 0);
                cp_async_commit();
            }
        }
        TRACE(EV_B_SYNC2);
    }

    // ---- epilogue: dK (times scale) and dV in the element type.
    const long long kv_row0 = si.k_off + n0;
    if (warp < DK_WN * DK_WD)
        store_acc(p.dk + b * p.dk_sb + kv_row0 * p.dk_ss + hk * p.dk_sh, p.dk_ss, acc_dk, dk_r0, dk_c0,
                  sk - n0, D_QK, p.scale, lane);
    if (warp < DV_WN * DV_WD)
        store_acc(p.dv + b * p.dv_sb + kv_row0 * p.dv_ss + hk * p.dv_sh, p.dv_ss, acc_dv, dv_r0, dv_c0,
                  sk - n0, D_V, 1.f, lane);
    TRACE(EV_B_EPI);
#ifdef ATTNFORGE_TRACE
    if (lane == 0) trace_block_end();
#endif
}

