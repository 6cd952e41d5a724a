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
{%- if ptx_type == "bf16" %}
    return __uint_as_float((unsigned)x << 16);
{%- else %}
    float r;
    asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(r) : "h"(x));
    return r;
{%- endif %}
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

{% include "common/order.cuh" %}

// The block's work item of a (batch x heads, tiles) grid: `bh` indexes
// (batch, head), `tile` its kv tile (main kernels) or query tile (the dQ
// kernel). The hardware starts blocks in linear order, x fastest.
struct BlockTile {
    int bh, tile;
};
__device__ __forceinline__ BlockTile block_tile(const BwdParams& p) {
{%- if head_major %}
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
{%- else %}
    return BlockTile{(int)blockIdx.x, (int)blockIdx.y};
{%- endif %}
}

// ---- _pre: Dsum = rowsum(dO * O); zero dq_accum ----------------------------------

extern "C" __global__ void __launch_bounds__(ROW_WARPS * 32)
{{ entry }}_pre(const BwdParams p) {
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

{% if not deterministic %}
// ---- _dq_convert (fast mode): dQ = scale * dq_accum ----------------------------

extern "C" __global__ void __launch_bounds__(ROW_WARPS * 32)
{{ entry }}_dq_convert(const BwdParams p) {
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
{% endif %}
