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
