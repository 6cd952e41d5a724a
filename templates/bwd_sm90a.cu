{%- import "common/wgmma_operands.tera" as wg -%}
// attnforge generated kernel: {{ spec }}
// template bwd_sm90a.cu — Hopper backward (fast mode): every product on wgmma.
// One block per (kv tile of {{ block_n }} rows, batch, kv head), two warpgroups of
// 64 kv rows each; all 256 threads stage the query tiles ({{ block_m }} rows of Q,
// dO, LSE, Dsum; next tile prefetched) with cp.async into 128-byte-swizzled
// shared memory, the layout wgmma's descriptors read.
// Do not edit: rendered by attnforge from templates/bwd_sm90a.cu.
//
// Entry points (the BwdParams of common/bwd_common.cuh), launched in this order:
//   {{ entry }}_pre          Dsum = rowsum(dO * O) in f32 (LSE layout); zero dq_accum
//   {{ entry }}              main: dK, dV; dQ added to the f32 dq_accum (red.global.add.v4.f32)
//   {{ entry }}_dq_convert   dQ = scale * dq_accum, in the element type
//
// Per query tile, warpgroup w (kv rows n0 + 64w ..):
//   S^T  = K_w Q^T,  dP^T = V_w dO^T        wgmma, both operands K-major in shared memory
//   P^T in registers (common/bwd_common.cuh: score_prob), kept as bf16/f16 fragments; then dP^T and dS^T
//   dV_w += P^T dO,  dK_w += dS^T Q          wgmma, A = P^T / dS^T fragments from
//                                            registers, B = dO / Q read MN-major
//   dS^T -> shared memory; dQ (64 x {{ dq_n }} per warpgroup) = dS K over {% if dq_split == 1 %}all 128 kv rows,
//   the warpgroups splitting dQ's columns{% elif dq_split == 2 %}all 128 kv rows,
//   the warpgroups splitting dQ's rows{% else %}the warpgroup's own 64 kv rows,
//   both warpgroups adding into dq_accum{% endif %}; A = dS^T read MN-major, B = K read MN-major.
// Notation as in bwd_sm80.cu: dS here is dZ / scale; dK and dQ take `scale` at the end.

constexpr int BLOCK_M = {{ block_m }};               // query rows per step
constexpr int BLOCK_N = {{ block_n }};               // kv rows per block (64 per warpgroup)
constexpr int THREADS = 256;
constexpr int D_QK = {{ d_qk }};                     // real head dims
constexpr int D_V = {{ d_v }};
constexpr int DQK = {{ d_qk_pad }};                  // padded: 64-column (128-byte) chunks
constexpr int DV = {{ d_v_pad }};
constexpr int QK_CHUNKS = DQK / 64, V_CHUNKS = DV / 64;
constexpr int M_TILES = BLOCK_M / 8;                // 8-column tiles of S^T (query columns)
constexpr int M_KSTEPS = BLOCK_M / 16;              // k-steps of the products over query rows
constexpr int DQ_N = {{ dq_n }};                     // dQ columns per warpgroup
// How the warpgroups share dQ = dS K (64 x DQ_N each): 0 = each over its own
// 64 kv rows (both add the same dQ tile), 1 = split dQ's columns, 2 = split
// dQ's rows (128-row query tiles).
constexpr int DQ_SPLIT = {{ dq_split }};
constexpr int MASK_KIND = {{ mask_kind }};
constexpr bool IS_THD = {{ is_thd }};
constexpr bool SOFTCAP = {{ softcap }};
constexpr bool DETERMINISTIC = false;
constexpr int ROW_WARPS = {{ row_warps }};           // _pre / _dq_convert: one (token, head) row per warp
constexpr int DQ_G = {{ dq_tile_rows }};             // dq_accum: tiles of DQ_G tokens x 8 columns
// Each block's walk over its query tiles starts at its own kv tile (the
// plan's walk_rotation).
constexpr bool WALK_ROT = {{ walk_rotation }};
static_assert((BLOCK_M == 64 || BLOCK_M == 128) && BLOCK_N == 128, "two warpgroups of 64 kv rows");
static_assert(DQ_SPLIT != 2 || (BLOCK_M == 128 && DQK == 64), "row split: 128-row query tiles at d64");
static_assert(DQK % 64 == 0 && DV % 64 == 0 && DQ_N == 64, "whole 128-byte chunks");

{% include "common/ptx.cuh" %}
{% include "common/hopper.cuh" %}
{% include "common/mask.cuh" %}
{% include "common/bwd_common.cuh" %}

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
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ block_m / 2 + 2 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ block_m }}k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=block_m / 2) }} },\n"
        "%{{ block_m / 2 }}, %{{ block_m / 2 + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {{ wg::acc_operands(tiles=block_m / 8) }}
        : "l"(ad), "l"(bd), "r"(acc));
}

// dV or dK (64 x D) += A (64 x 16, registers) B (16 x D), B read MN-major.
template <int D>
__device__ __forceinline__ void wgmma_rs(float (&d)[D / 8][4], const unsigned (&a)[4], unsigned long long bd);
{% for n in rs_ns %}
template <>
__device__ __forceinline__ void wgmma_rs<{{ n }}>(float (&d)[{{ n }} / 8][4], const unsigned (&a)[4], unsigned long long bd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n / 2 + 5 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ n }}k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=n / 2) }} },\n"
        "{ %{{ n / 2 }}, %{{ n / 2 + 1 }}, %{{ n / 2 + 2 }}, %{{ n / 2 + 3 }} }, %{{ n / 2 + 4 }}, p, 1, 1, 1;\n}\n"
        : {{ wg::acc_operands(tiles=n / 8) }}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1));
}
{% endfor %}
// dQ (64 x 64) += A (64 x 16) B (16 x 64): A = dS read from dS^T (MN-major),
// B = K read MN-major; both from shared memory.
__device__ __forceinline__ void wgmma_tt(float (&d)[8][4], unsigned long long ad, unsigned long long bd, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.{{ ptx_type }}.{{ ptx_type }}\n"
        "{ {{ wg::acc_regs(n=32) }} },\n"
        "%32, %33, p, 1, 1, 1, 1;\n}\n"
        : {{ wg::acc_operands(tiles=8) }}
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
{{ entry }}(const BwdParams p) {
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
{% if softcap %}
        unsigned tha[M_KSTEPS][4];                       // softcap: 1 - tanh^2, packed the same way
{% endif %}
        {
            const int m_last = min(m0 + BLOCK_M, sq) - 1;
            const bool edge = (n0 + BLOCK_N > sk) || (MASK_KIND != 0 &&
                (win.key_lo(m_last) > n0 || win.key_hi(m0) < n0 + BLOCK_N - 1));
{% if softcap %}
            float dth[M_TILES][4];
{% endif %}
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
{% if softcap %}
                        dth[j][e] = dt;
{% endif %}
                    }
                }
            }
{% if softcap %}
            pack_frags<BLOCK_M>(tha, dth);
{% endif %}
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
{% if softcap %}
                    const unsigned tw = tha[j / 2][(j & 1) * 2 + r];
                    const float dt = elem_to_f32((elem_t)(e1 ? tw >> 16 : tw & 0xffffu));
                    acc_dp[j][e] = pr * (acc_dp[j][e] - dsum) * dt;
{% else %}
                    acc_dp[j][e] = pr * (acc_dp[j][e] - dsum);
{% endif %}
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
