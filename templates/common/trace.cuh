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
