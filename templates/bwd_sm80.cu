// attnforge generated kernel: {{ spec }}
// template bwd_sm80.cu — FlashAttention-2-style backward on the sm80 instruction
// path (mma.sync m16n8k16, ldmatrix, cp.async). Plan: block_n={{ block_n }} kv rows x
// block_m={{ block_m }} query rows, {{ num_warps }} warps, Q/dO stages={{ q_stages }},
// S/dQ accumulator chunks <= {{ acc_chunk }} f32 per thread.
// Do not edit: rendered by attnforge from templates/bwd_sm80.cu.
//
// Entry points (one shared BwdParams), launched in this order:
//   {{ entry }}_pre          Dsum = rowsum(dO * O) in f32 (LSE layout){% if not deterministic %}; zero dq_accum{% endif %}
//   {{ entry }}              main: one block per (kv tile, batch, kv head): dK, dV{% if not deterministic %},
//                            and dQ added to the f32 dq_accum with red.global.add
//                            (one 16-byte red.global.add.v4.f32 per 4 columns on sm_90){% endif %}
{%- if deterministic %}
//   {{ entry }}_dq           one block per query tile recomputes dS and writes dQ (no atomics)
{%- else %}
//   {{ entry }}_dq_convert   dQ = scale * dq_accum, in the element type
{%- endif %}
//
// Notation: S = Q K^T (raw), z = S*scale (softcap: z = cap*tanh(S*scale/cap)),
// P = exp(z - LSE), dP = dO V^T, Dsum = rowsum(dO*O), dZ = P*(dP - Dsum),
// dS = dZ * dz/dS / scale (softcap: (1 - tanh^2); the factor `scale` is applied to
// dQ and dK at the end). dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K.

constexpr int BLOCK_M = {{ block_m }};               // query rows per inner step (main)
constexpr int BLOCK_N = {{ block_n }};               // kv rows per block (main)
constexpr int NUM_WARPS = {{ num_warps }};
constexpr int THREADS = NUM_WARPS * 32;
constexpr int Q_STAGES = {{ q_stages }};             // Q/dO shared-memory buffers
constexpr int D_QK = {{ d_qk }};                     // real head dims
constexpr int D_V = {{ d_v }};
constexpr int DQK = {{ d_qk_pad }};                  // padded (multiple of 16; see the plan)
constexpr int DV = {{ d_v_pad }};
constexpr int PITCH_QK = {{ pitch_qk }};             // shared-memory row pitches, elements
constexpr int PITCH_V = {{ pitch_v }};
constexpr int PITCH_M = {{ pitch_m }};               // P^T / dS^T tiles [BLOCK_N][PITCH_M]
// The main kernel's Q and dO tiles, copied once per query tile: swizzled rows
// without a pad (the plan's qdo_swizzle; common/tile.cuh, load_tile) where
// their rows are whole 128-byte lines, else padded as K and V.
constexpr bool QDO_SW = {{ qdo_swizzle }};
constexpr int PITCH_Q = QDO_SW ? DQK : PITCH_QK;
constexpr int PITCH_DO = QDO_SW ? DV : PITCH_V;
constexpr int MASK_KIND = {{ mask_kind }};
constexpr bool IS_THD = {{ is_thd }};
constexpr bool SOFTCAP = {{ softcap }};
constexpr bool DETERMINISTIC = {{ deterministic }};

// Warp grids of the main kernel's three products (rows x cols of warps; warps
// beyond rows*cols sit the product out). Every warp tile is a multiple of 16x16.
constexpr int S_WN = {{ s_wn }}, S_WM = {{ s_wm }};      // S^T, dP^T: [BLOCK_N x BLOCK_M]
constexpr int S_ROWS = BLOCK_N / S_WN, S_COLS = BLOCK_M / S_WM;
constexpr int DK_WN = {{ dk_wn }}, DK_WD = {{ dk_wd }};  // dK: [BLOCK_N x DQK]
constexpr int DK_ROWS = BLOCK_N / DK_WN, DK_COLS = DQK / DK_WD;
constexpr int DV_WN = {{ dv_wn }}, DV_WD = {{ dv_wd }};  // dV: [BLOCK_N x DV]
constexpr int DV_ROWS = BLOCK_N / DV_WN, DV_COLS = DV / DV_WD;
constexpr int DQ_WM = {{ dq_wm }}, DQ_WD = {{ dq_wd }};  // dQ: [BLOCK_M x DQK] (fast mode)
constexpr int DQ_ROWS = BLOCK_M / DQ_WM, DQ_COLS = DQK / DQ_WD;

// The S and dQ phases walk their warp tile in column chunks so that their
// accumulators (on top of the dK/dV accumulators held for the whole block)
// stay within ACC_CHUNK f32 per thread per array (the plan's choice): a chunk
// re-reads the A operand from shared memory, for fewer live registers.
constexpr int ACC_CHUNK = {{ acc_chunk }};
// The dQ phase's own limit (the plan's dq_chunk): larger where the S phase's
// registers are free by then (kv_in_regs: P and dS are consumed in the S phase).
constexpr int DQ_CHUNK = {{ dq_chunk }};
// Largest even divisor of nt with mt * 4 * divisor <= limit (2 at least).
constexpr int chunk_nt(int mt, int nt, int limit = ACC_CHUNK) {
    int best = 2;
    for (int c = 2; c <= nt; c += 2)
        if (nt % c == 0 && mt * 4 * c <= limit) best = c;
    return best;
}

constexpr int ROW_WARPS = {{ row_warps }};           // _pre / _dq_convert: one (token, head) row per warp
constexpr int DQ_G = {{ dq_tile_rows }};             // dq_accum: tiles of DQ_G tokens x 8 columns (fast mode)
{%- if deterministic %}
constexpr int DQB_WARPS = {{ dqb_warps }};           // _dq kernel: 16 query rows per warp
constexpr int DQB_THREADS = DQB_WARPS * 32;
constexpr int DQB_M = {{ dqb_m }};
constexpr int DQB_N = {{ dqb_n }};                   // kv rows per step
constexpr int DQB_STAGES = {{ dqb_stages }};         // K/V shared-memory buffers
{%- endif %}

{% include "common/ptx.cuh" %}
{% include "common/mask.cuh" %}

{% include "common/bwd_common.cuh" %}
{% include "common/tile.cuh" %}
// Tracing (gpu_bench --trace80b): lane 0 of every warp of the main kernel
// stamps the phases of each query tile.
#ifdef ATTNFORGE_TRACE
constexpr int TRACE_ROLES = 16;
#endif
{% include "common/trace.cuh" %}
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

{% if dq_frags_once -%}
// The A fragments of a whole [16 MT x 16 KSTEPS] operand, loaded once for a
// product walked in column chunks (warp_gemm_a), so that the chunks do not
// re-read it from shared memory.
template <int MT, int KSTEPS, bool A_T>
__device__ __forceinline__ void load_a(unsigned (&a)[MT][KSTEPS][4], unsigned sA, int pitch_a, int r0, int lane) {
    int ln = lane;                                       // opaque, as in warp_gemm
    asm volatile("" : "+r"(ln));
    const unsigned a0 = sA + a_lane_off<A_T>(pitch_a, ln) + tile_off<A_T>(pitch_a, r0, 0);
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4<A_T>(a[mt][ks], a0 + tile_off<A_T>(pitch_a, mt * 16, ks * 16));
}

// acc = A x B[.., c0 .. c0 + 8 NT) with A's fragments already in registers (load_a).
template <int MT, int NT, int KSTEPS, bool B_T>
__device__ __forceinline__ void warp_gemm_a(float (&acc)[MT][NT][4], const unsigned (&a)[MT][KSTEPS][4],
                                            unsigned sB, int pitch_b, int c0, int lane) {
    static_assert(NT % 2 == 0, "B operands are loaded two n8 tiles at a time");
    int ln = lane;
    asm volatile("" : "+r"(ln));
    const unsigned b0 = sB + b_lane_off<B_T>(pitch_b, ln) + tile_off<B_T>(pitch_b, c0, 0);
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned b[4];
            ldsm_x4<B_T>(b, b0 + tile_off<B_T>(pitch_b, np * 16, ks * 16));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mma_pair(acc[mt][2 * np], acc[mt][2 * np + 1], a[mt][ks], b, ks == 0);
        }
}

{% endif -%}
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
{{ entry }}(const BwdParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* sK = reinterpret_cast<elem_t*>(smem_raw);    // [BLOCK_N][PITCH_QK]
    elem_t* sV = sK + BLOCK_N * PITCH_QK;                // [BLOCK_N][PITCH_V]
    elem_t* sQ = sV + BLOCK_N * PITCH_V;                 // [Q_STAGES][BLOCK_M][PITCH_Q]
    elem_t* sdO = sQ + Q_STAGES * BLOCK_M * PITCH_Q;     // [Q_STAGES][BLOCK_M][PITCH_DO]
    // P^T and dS^T [BLOCK_N][PITCH_M] each: no P^T tile where dV and dK are
    // accumulated from registers (kv_in_regs), and then no dS^T tile either
    // without a dQ phase (deterministic mode).
    constexpr int P_TILE = {% if kv_in_regs %}0{% else %}BLOCK_N * PITCH_M{% endif %};
    constexpr int DS_TILE = {% if kv_in_regs and deterministic %}0{% else %}BLOCK_N * PITCH_M{% endif %};
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
{%- if kv_in_regs %}
        if (Q_STAGES == 2 && it + 1 < n_iters) {
            load_q_tile(next_step(cur), buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();                          // tile `it`, with its LSE and Dsum
        } else {
            cp_async_wait<0>();
        }
{%- else %}
        cp_async_wait<0>();                              // tile `it`, with its LSE and Dsum
{%- endif %}
        finish_rows(sLse + buf * BLOCK_M, BLOCK_M, tid);
        __syncthreads();                                 // every thread's copies landed; P^T and dS^T are free
        TRACE(EV_B_ITER);
{%- if not kv_in_regs %}
        if (Q_STAGES == 2 && it + 1 < n_iters) {
            load_q_tile(next_step(cur), buf ^ 1);        // under this tile's products
            cp_async_commit();
        }
{%- endif %}

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
{%- if kv_in_regs %}
                // dV += P^T dO and dK += dS^T Q over this chunk's query rows (NT / 2
                // k-steps). This warp owns the same kv rows in all three grids, and
                // the accumulators of two n8 tiles are the A operand of one k-step,
                // so P and dS feed the products from registers.
                static_assert(S_WM == 1 && DV_WD == 1 && DK_WD == 1 && DV_ROWS == S_ROWS && DK_ROWS == S_ROWS,
                              "kv_in_regs needs coinciding warp grids");
#pragma unroll
                for (int kk = 0; kk < NT / 2; ++kk) {
                    unsigned ap[MT][4], ads[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                        for (int h2 = 0; h2 < 2; ++h2) {
                            const float* s0 = acc_s[mt][2 * kk + h2];
                            const float* d0 = acc_dp[mt][2 * kk + h2];
                            ap[mt][2 * h2] = pack2(s0[0], s0[1]);
                            ap[mt][2 * h2 + 1] = pack2(s0[2], s0[3]);
                            ads[mt][2 * h2] = pack2(d0[0], d0[1]);
                            ads[mt][2 * h2 + 1] = pack2(d0[2], d0[3]);
                        }
                    }
                    kstep_from_regs<MT, DV_COLS / 8, QDO_SW>(acc_dv, ap, sdOa, PITCH_DO, c0 + kk * 16, lane);
                    kstep_from_regs<MT, DK_COLS / 8, QDO_SW>(acc_dk, ads, sQa, PITCH_Q, c0 + kk * 16, lane);
                }
{%- endif %}
{%- if not kv_in_regs or not deterministic %}
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int off = (r0 + mt * 16 + g + 8 * r) * PITCH_M + c0 + nt * 8 + 2 * t;
{%- if not kv_in_regs %}
                            *reinterpret_cast<elem2_t*>(sP + off) = pack2(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]);
{%- endif %}
                            *reinterpret_cast<elem2_t*>(sdS + off) = pack2(acc_dp[mt][nt][2 * r], acc_dp[mt][nt][2 * r + 1]);
                        }
                    }
                }
{%- endif %}
            }
        }
        TRACE(EV_B_S);
        __syncthreads();
        TRACE(EV_B_SYNC1);

{% if kv_in_regs %}        // (dV and dK were accumulated in the S phase: kv_in_regs.)
{% else %}        // ---- KV phase: dV += P^T dO, dK += dS^T Q (accumulators stay in registers).
        if (warp < DV_WN * DV_WD)
            warp_gemm<DV_ROWS / 16, DV_COLS / 8, BLOCK_M / 16, false, true, false, QDO_SW>(acc_dv, sPa, PITCH_M, dv_r0,
                                                                                          sdOa, PITCH_DO, dv_c0, lane);
{%- if not dk_after_dq and not dk_in_dq %}
        if (warp < DK_WN * DK_WD)
            warp_gemm<DK_ROWS / 16, DK_COLS / 8, BLOCK_M / 16, false, true, false, QDO_SW>(acc_dk, sdSa, PITCH_M, dk_r0,
                                                                                          sQa, PITCH_Q, dk_c0, lane);
{%- endif %}
{% endif %}        TRACE(EV_B_KV);

        // ---- dQ phase (fast mode): dq_accum += dS K, f32 reductions in global memory.
        if constexpr (!DETERMINISTIC) {
            if (warp < DQ_WM * DQ_WD) {
                constexpr int MT = DQ_ROWS / 16, NT_ALL = DQ_COLS / 8, NT = chunk_nt(MT, NT_ALL, DQ_CHUNK);
                const int r0 = (warp / DQ_WD) * DQ_ROWS;
{%- if dq_frags_once %}
                unsigned a_ds[MT][BLOCK_N / 16][4];          // dS, read once for every chunk
                load_a<MT, BLOCK_N / 16, true>(a_ds, sdSa, PITCH_M, r0, lane);
{%- endif %}
#pragma unroll 1
                for (int cc = 0; cc < NT_ALL / NT; ++cc) {
                    const int c0 = (warp % DQ_WD) * DQ_COLS + cc * NT * 8;
                    float acc[MT][NT][4];
{%- if dq_frags_once %}
                    warp_gemm_a<MT, NT, BLOCK_N / 16, true>(acc, a_ds, sKa, PITCH_QK, c0, lane);
{%- else %}
                    warp_gemm<MT, NT, BLOCK_N / 16, true, true, true>(acc, sdSa, PITCH_M, r0, sKa, PITCH_QK, c0, lane);
{%- endif %}
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
{%- if dk_in_dq %}
                    // This chunk's share of dK += dS^T Q (the plan's dk_in_dq):
                    // its MMAs issue while the chunk's reductions drain, and the
                    // next chunk's products come after them.
                    {
                        constexpr int DK_KS = BLOCK_M / 16, CHUNKS = NT_ALL / NT, KPC = DK_KS / CHUNKS;
                        static_assert(DK_KS % CHUNKS == 0, "dK's k-steps split evenly over the dQ chunks");
                        static_assert(DK_WN * DK_WD == NUM_WARPS && DQ_WM * DQ_WD == NUM_WARPS,
                                      "dk_in_dq: every warp is in both grids");
                        const unsigned kb = cc * KPC * 16;     // first query row (k) of the share
                        warp_gemm<DK_ROWS / 16, DK_COLS / 8, KPC, false, true, false, QDO_SW>(
                            acc_dk, sdSa + kb * 2, PITCH_M, dk_r0, sQa + kb * PITCH_Q * 2, PITCH_Q, dk_c0, lane);
                    }
{%- endif %}
                }
            }
        }
        TRACE(EV_B_DQ);
{%- if dk_after_dq %}
        // dK after the dQ phase (the plan's dk_after_dq): its MMAs issue while
        // the dQ reductions drain.
        if (warp < DK_WN * DK_WD)
            warp_gemm<DK_ROWS / 16, DK_COLS / 8, BLOCK_M / 16, false, true, false, QDO_SW>(acc_dk, sdSa, PITCH_M, dk_r0,
                                                                                          sQa, PITCH_Q, dk_c0, lane);
{%- endif %}
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
{% if deterministic %}
// ---- _dq (deterministic): one block per (query tile, batch, query head) --------
// Recomputes S and dP for its rows over the visible kv tiles and accumulates
// dQ = dS K in registers: a fixed summation order, no atomics.

extern "C" __global__ void __launch_bounds__(DQB_THREADS, 1)
{{ entry }}_dq(const BwdParams p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);    // [DQB_M][PITCH_QK]
    elem_t* sdO = sQ + DQB_M * PITCH_QK;                 // [DQB_M][PITCH_V]
    elem_t* sK = sdO + DQB_M * PITCH_V;                  // [DQB_STAGES][DQB_N][PITCH_QK]
    elem_t* sV = sK + DQB_STAGES * DQB_N * PITCH_QK;     // [DQB_STAGES][DQB_N][PITCH_V]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const BlockTile bt = block_tile(p);
    const int b = bt.bh / p.heads_q, h = bt.bh % p.heads_q;
    const int hk = h / p.gqa_ratio;
    const int m0 = (gridDim.y - 1 - bt.tile) * DQB_M;     // longest causal tiles first
    const SeqInfo si = seq_info(p, b);
    const int sq = si.sq, sk = si.sk;
    if (m0 >= sq) return;

    const RowWindow win{sq, sk, p.window_left, p.window_right};
    const int last_row = min(m0 + DQB_M, sq) - 1;
    const int n_begin = (win.key_lo(m0) / DQB_N) * DQB_N;
    const int n_end = min(sk, win.key_hi(last_row) + 1);
    const int n_tiles = n_end > n_begin ? (n_end - n_begin + DQB_N - 1) / DQB_N : 0;

    const long long row0 = si.q_off + m0;
    const elem_t* gK = p.k + b * p.k_sb + (long long)si.k_off * p.k_ss + hk * p.k_sh;
    const elem_t* gV = p.v + b * p.v_sb + (long long)si.k_off * p.v_ss + hk * p.v_sh;

    // This thread's rows: warp*16 + g (+8).
    const int wrow = warp * 16;
    float lse2[2], dsum[2];
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = m0 + wrow + g + 8 * r;
        lse2[r] = POS_INF;
        dsum[r] = 0.f;
        if (i < sq) {
            const long long li = b * p.lse_sb + h * p.lse_sh + si.q_off + i;
            const float l = p.lse[li];
            if (l != NEG_INF) lse2[r] = l * LOG2E;
            dsum[r] = p.dsum[li];
        }
        lo[r] = win.key_lo(i);
        hi[r] = win.key_hi(i);
    }

    float acc_dq[1][DQK / 8][4];
    zero_acc(acc_dq);

    if (n_tiles > 0) {
        load_tile<DQB_M, DQK, PITCH_QK, DQB_THREADS>(sQ, p.q + b * p.q_sb + row0 * p.q_ss + h * p.q_sh,
                                                     p.q_ss, sq - m0, D_QK, tid);
        load_tile<DQB_M, DV, PITCH_V, DQB_THREADS>(sdO, p.dout + b * p.do_sb + row0 * p.do_ss + h * p.do_sh,
                                                   p.do_ss, sq - m0, D_V, tid);
        load_tile<DQB_N, DQK, PITCH_QK, DQB_THREADS>(sK, gK + n_begin * p.k_ss, p.k_ss, sk - n_begin, D_QK, tid);
        load_tile<DQB_N, DV, PITCH_V, DQB_THREADS>(sV, gV + n_begin * p.v_ss, p.v_ss, sk - n_begin, D_V, tid);
        cp_async_commit();
    }
    const unsigned sQa = smem_addr(sQ), sdOa = smem_addr(sdO);

    for (int it = 0; it < n_tiles; ++it) {
        const int n0 = n_begin + it * DQB_N;
        const int buf = DQB_STAGES == 2 ? (it & 1) : 0;
        if (DQB_STAGES == 2 && it + 1 < n_tiles) {       // prefetch the next K/V tile
            const int n1 = n0 + DQB_N;
            load_tile<DQB_N, DQK, PITCH_QK, DQB_THREADS>(sK + (buf ^ 1) * DQB_N * PITCH_QK, gK + n1 * p.k_ss,
                                                         p.k_ss, sk - n1, D_QK, tid);
            load_tile<DQB_N, DV, PITCH_V, DQB_THREADS>(sV + (buf ^ 1) * DQB_N * PITCH_V, gV + n1 * p.v_ss,
                                                       p.v_ss, sk - n1, D_V, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const unsigned sKa = smem_addr(sK + buf * DQB_N * PITCH_QK);
        const unsigned sVa = smem_addr(sV + buf * DQB_N * PITCH_V);
        float acc_s[1][DQB_N / 8][4], acc_dp[1][DQB_N / 8][4];
        zero_acc(acc_s);
        zero_acc(acc_dp);
        warp_gemm<1, DQB_N / 8, DQK / 16, false, false>(acc_s, sQa, PITCH_QK, wrow, sKa, PITCH_QK, 0, lane);
        warp_gemm<1, DQB_N / 8, DV / 16, false, false>(acc_dp, sdOa, PITCH_V, wrow, sVa, PITCH_V, 0, lane);

        const bool edge = (n0 + DQB_N > sk) || (MASK_KIND != 0 &&
            (win.key_lo(last_row) > n0 || win.key_hi(m0) < n0 + DQB_N - 1));
#pragma unroll
        for (int j = 0; j < DQB_N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const int key = n0 + j * 8 + 2 * t + (e & 1);
                const bool vis = !edge || (key >= lo[r] && key <= hi[r]);
                float pr;
                acc_dp[0][j][e] = score_grad(acc_s[0][j][e], acc_dp[0][j][e], lse2[r], dsum[r], vis, p, pr);
            }
        }

        // dQ += dS K. The accumulator layout of two n8 tiles of dS is the A-operand
        // layout of one k-step, so dS never leaves registers; K (k = key, n = d) is
        // stored [key][d]: ldmatrix.trans.
#pragma unroll
        for (int kk = 0; kk < DQB_N / 16; ++kk) {
            unsigned a[4];
            a[0] = pack2(acc_dp[0][2 * kk][0], acc_dp[0][2 * kk][1]);
            a[1] = pack2(acc_dp[0][2 * kk][2], acc_dp[0][2 * kk][3]);
            a[2] = pack2(acc_dp[0][2 * kk + 1][0], acc_dp[0][2 * kk + 1][1]);
            a[3] = pack2(acc_dp[0][2 * kk + 1][2], acc_dp[0][2 * kk + 1][3]);
#pragma unroll
            for (int np = 0; np < DQK / 16; ++np) {
                unsigned bk[4];
                load_b<true>(bk, sKa, PITCH_QK, np * 16, kk * 16, lane);
                mma_16816(acc_dq[0][2 * np], a, bk[0], bk[1]);
                mma_16816(acc_dq[0][2 * np + 1], a, bk[2], bk[3]);
            }
        }
        __syncthreads();                                 // buffer `buf` is refilled next
        if (DQB_STAGES == 1 && it + 1 < n_tiles) {
            const int n1 = n0 + DQB_N;
            load_tile<DQB_N, DQK, PITCH_QK, DQB_THREADS>(sK, gK + n1 * p.k_ss, p.k_ss, sk - n1, D_QK, tid);
            load_tile<DQB_N, DV, PITCH_V, DQB_THREADS>(sV, gV + n1 * p.v_ss, p.v_ss, sk - n1, D_V, tid);
            cp_async_commit();
        }
    }

    store_acc(p.dq + b * p.dq_sb + row0 * p.dq_ss + h * p.dq_sh, p.dq_ss, acc_dq, wrow, 0,
              sq - m0, D_QK, p.scale, lane);
}
{% endif %}
