// attnforge generated kernel: {{ spec }}
// template fwd_sm80.cu — FlashAttention-2-style forward on the sm80 instruction
// path (mma.sync m16n8k16, ldmatrix, cp.async). Plan: block_m={{ block_m }}
// block_n={{ block_n }} warps={{ num_warps }} m_tiles/warp={{ m_tiles }}.
// Do not edit: rendered by attnforge from templates/fwd_sm80.cu.

constexpr int BLOCK_M = {{ block_m }};
constexpr int BLOCK_N = {{ block_n }};
constexpr int NUM_WARPS = {{ num_warps }};
constexpr int THREADS = NUM_WARPS * 32;
constexpr int M_TILES = {{ m_tiles }};               // 16-row MMA tiles per warp
constexpr int STAGES = {{ stages }};                 // K/V buffers: 2 = double-buffered, 1 = FA2's order
constexpr int D_QK = {{ d_qk }};                     // real head dims
constexpr int D_V = {{ d_v }};
constexpr int DQK = {{ d_qk_pad }};                  // padded to the k-step (16)
constexpr int DV = {{ d_v_pad }};
// K (SW), Q and V tiles swizzled instead of padded (the plan's smem_swizzle,
// per tile plan::fwd_swizzled_tiles; common/tile.cuh, load_tile's SW):
// unpadded rows of whole 128-byte lines, so each copy writes whole
// shared-memory lines. Else padded rows (the plan's row pitches, elements;
// the plan's shared-memory size keeps them either way).
constexpr bool SW = {{ swizzle[1] }};
constexpr bool SW_Q = {{ swizzle[0] }}, SW_V = {{ swizzle[2] }};
constexpr int PITCH_QK = SW ? DQK : {{ pitch_qk }};     // K
constexpr int PITCH_Q = SW_Q ? DQK : {{ pitch_qk }};
constexpr int PITCH_V = SW_V ? DV : {{ pitch_v }};
constexpr int MASK_KIND = {{ mask_kind }};
constexpr bool IS_THD = {{ is_thd }};
constexpr bool SOFTCAP = {{ softcap }};

{% include "common/ptx.cuh" %}
{% include "common/mask.cuh" %}
{% include "common/softmax.cuh" %}

{% include "common/fwd_params.cuh" %}

{% include "common/tile.cuh" %}
// Tracing (gpu_bench --trace80f): lane 0 of every warp stamps each key tile's
// phases, and thread 0 records the block's SM, start and end.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_ROLES = 16;
#endif
{% include "common/trace.cuh" %}
enum : unsigned { EV_F_START = 1, EV_F_FIRST, EV_F_TILE, EV_F_S, EV_F_V, EV_F_SOFTMAX, EV_F_PV, EV_F_EPI };
{%- if head_major or is_thd %}
{% include "common/order.cuh" %}
{%- endif %}

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
{%- if head_major %}
    // Head-major: the hardware starts blocks in linear order (x fastest), and
    // consecutive blocks take one (batch, head)'s query blocks, so the blocks
    // in flight read the same K and V from L2 instead of every head's.
    // Dense causal grids go in p.tile_phases phases by length (common/order.cuh),
    // so that the last heads' longest blocks do not start at the end. (The
    // launcher keeps the grid below 2^32 blocks.)
    const unsigned lin = by * gridDim.x + bx;
    int bh, m_block;
    if constexpr ((MASK_KIND == 1 || MASK_KIND == 2) && !IS_THD) {
        const PhaseTile pt = phase_tile(lin, (int)gridDim.y, p.tile_phases);
        bh = pt.bh;
        m_block = gridDim.y - 1 - pt.tile;               // tile 0: the longest
    } else {
        bh = (int)(lin / gridDim.y);
        m_block = gridDim.y - 1 - (int)(lin % gridDim.y);
    }
{%- else %}
    int bh = (int)bx;
    int m_block = gridDim.y - 1 - (int)by;               // longest causal tiles first
{%- endif %}
{%- if is_thd %}
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
{%- endif %}
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

extern "C" __global__ void __launch_bounds__(THREADS, {{ min_blocks }})
{{ entry }}(const FwdParams p) {
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

{%- if m_tiles == 2 %}
        // Four k-steps per trip with two m16 tiles per warp: unrolled fully,
        // ptxas hoists every step's operands and spills 16 B on sm_90a at d128
        // (240 registers and no spills this way).
#pragma unroll 4
{%- else %}
#pragma unroll
{%- endif %}
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
