        // ---- dQ phase (fast mode): dq_accum += dS K, f32 reductions in global memory.
        if constexpr (!DETERMINISTIC) {
            if (warp < DQ_WM * DQ_WD) {
                constexpr int MT = DQ_ROWS / 16, NT_ALL = DQ_COLS / 8, NT = chunk_nt(MT, NT_ALL);
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
                    float* gacc = p.dq_accum + (acc_row0 * p.heads_q + h) * DQK;
                    const long long row_pitch = (long long)p.heads_q * DQK;
                    // Lanes t = 2k and 2k + 1 swap halves so that each holds four
                    // consecutive columns 4k..4k+3 of one row: the even lane of row g,
                    // the odd lane of row g + 8. One 16-byte reduction per n8 tile.
                    const bool odd = t & 1;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const int row = r0 + mt * 16 + g + (odd ? 8 : 0);
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const float* a = acc[mt][nt];
                            const float x0 = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[2], 1);
                            const float x1 = __shfl_xor_sync(0xffffffffu, odd ? a[1] : a[3], 1);
                            // No branch around rows past the sequence (the last tile's):
                            // their dQ is exactly zero (P = 0 from the LSE staged as +inf,
                            // zero-filled dO), so it is added to the last row instead,
                            // which keeps the address in bounds. Selects, not two calls.
                            const int row_in = min(m0 + row, sq - 1) - m0;
                            float* dst = gacc + row_in * row_pitch + c0 + nt * 8 + 4 * (t >> 1);
                            red_add_f32x4(dst, odd ? x0 : a[0], odd ? x1 : a[1], odd ? a[2] : x0, odd ? a[3] : x1);
                        }
                    }
                }
            }
        }
        TRACE(EV_B_DQ);{# bwd_sm80.cu's dQ phase (fast mode), included before or after the dV/dK phase (the plan's dq_first) #}