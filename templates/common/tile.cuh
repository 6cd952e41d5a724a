// ---- common/tile.cuh: global -> shared tile copies (cp.async) ---------------------

// Copy ROWS x DPAD tile rows from global (row pitch `stride` elements) into
// shared memory (pitch PITCH elements) with cp.async, zero-filling rows >=
// valid_rows and columns >= d_real; NTHREADS threads share the work.
// Where the threads cover whole rows per pass (NTHREADS a multiple of the
// row's 16-byte chunks), each thread keeps one column and one source pointer
// and steps it by a constant row count: one 64-bit add, a compare and the
// copy per chunk (ncu, bwd d128: the general form's per-chunk divisions and
// 64-bit multiplies were 12% of the main kernel's instructions).
template <int ROWS, int DPAD, int PITCH, int NTHREADS>
__device__ __forceinline__ void load_tile(elem_t* smem, const elem_t* gbase, long long stride,
                                          int valid_rows, int d_real, int tid) {
    constexpr int CHUNKS = DPAD / 8;                     // 16-byte chunks per row
    const unsigned s0 = smem_addr(smem);
    constexpr int TOTAL = ROWS * CHUNKS;
    if constexpr (NTHREADS % CHUNKS == 0) {
        constexpr int RPP = NTHREADS / CHUNKS;           // rows per pass
        const int r = tid / CHUNKS, c = tid % CHUNKS;
        const bool col_ok = c * 8 < d_real;          // d_real is a constant at every call
        const int rows_left = valid_rows - r;            // this thread's rows r + i * RPP
        const elem_t* src = gbase + r * stride + c * 8;
        const long long step = RPP * stride;
        const unsigned dst = s0 + (r * PITCH + c * 8) * 2;
#pragma unroll
        for (int i = 0; i < (ROWS + RPP - 1) / RPP; ++i) {  // compile-time trip count
            if (ROWS % RPP != 0 && r + i * RPP >= ROWS) break;
            const bool ok = col_ok && i * RPP < rows_left;
            cp_async_16(dst + i * RPP * PITCH * 2, ok ? src : gbase, ok ? 16 : 0);
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
            cp_async_16(s0 + (r * PITCH + c * 8) * 2, src, ok ? 16 : 0);
        }
    }
}
