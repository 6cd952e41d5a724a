#!/usr/bin/env python3
"""A model of how the sm90a forward's one-tile blocks fill the GPU (no GPU needed).

Each block is one work tile (block_m query rows of one sequence and head); the
hardware starts blocks in their linear order on whichever SM frees first (one
block per SM: the forward's shared memory allows no second). A tile's time is
its tensor work at a given per-SM rate (block_m rows x its key tiles x block_n
keys x 4 d FLOPs, partial tiles at full cost, as the kernel runs them) plus a
fixed cost per tile (prologue and epilogue); a tile past its sequence's end
costs `--empty-us`. The makespan against the useful FLOPs (4 s_q s_k d h,
halved under a causal mask) gives the TFLOP/s the order allows.

Orders: `current` (tile_at's head-major order: sequence by sequence in batch
order, each head's query blocks the last first, the empty tiles of the short
sequences among them), `sorted` (the sequences longest keys first, the empty
tiles last: branch s19-ragged-lpt's `ragged_order`) and `lpt` (every tile
sorted by its time, the bound of any static order).

    usage: tile_schedule.py [--lens 2864,1856,...] [--heads 8] [--d 256]
                            [--block-m 128] [--block-n 80] [--rate 757]
                            [--causal] [--fixed-us 2] [--empty-us 0.5] [--sms 132]

The defaults are the bench's ragged d256 problem (examples/gpu_bench.rs,
`ragged_lens` of seed 11) at the planner's d256 tiles and the dense 8k rate of
the session 17 bench. The model is coarse: it ignores L2 effects, the walk
entry and the partial overlap of one block's end with the next's start.
"""
import argparse
import heapq
import math


def tiles(lens, heads, d, block_m, block_n, rate_tflops, causal, fixed_us, empty_us, sms):
    """(time_us, sequence, real) per tile in tile_at's head-major order."""
    per_sm = rate_tflops * 1e12 / sms
    m = math.ceil(max(lens) / block_m)
    out = []
    for b, length in enumerate(lens):
        for _ in range(heads):
            for qb in range(m):
                m0 = (m - 1 - qb) * block_m
                if m0 >= length:
                    out.append((empty_us, b, False))
                    continue
                last = min(m0 + block_m, length) - 1
                keys = last + 1 if causal else length      # bottom-right, s_q = s_k
                n_tiles = math.ceil(keys / block_n)
                flops = 4 * block_m * n_tiles * block_n * d
                out.append((flops / per_sm * 1e6 + fixed_us, b, True))
    return out


def makespan(order, sms):
    free = [0.0] * sms
    for t, _, _ in order:
        start = heapq.heappop(free)
        heapq.heappush(free, start + t)
    return max(free)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", default="2864,1856,734,3733,1257,2479,575,576,444,1866")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=80)
    ap.add_argument("--rate", type=float, default=757.0, help="dense TFLOP/s of the kernel at long rows")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fixed-us", type=float, default=2.0)
    ap.add_argument("--empty-us", type=float, default=0.5)
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    lens = [int(x) for x in a.lens.split(",")]
    ts = tiles(lens, a.heads, a.d, a.block_m, a.block_n, a.rate, a.causal, a.fixed_us, a.empty_us, a.sms)
    useful = sum(4 * n * n * a.d * a.heads / (2 if a.causal else 1) for n in lens)
    by_len = sorted(range(len(lens)), key=lambda b: (-lens[b], b))
    orders = {
        "current": ts,
        "sorted": [t for b in by_len for t in ts if t[1] == b and t[2]] + [t for t in ts if not t[2]],
        "lpt": sorted((t for t in ts if t[2]), key=lambda t: -t[0]),
    }
    ideal = sum(t[0] for t in ts if t[2]) / a.sms
    for name, order in orders.items():
        span = makespan(order, a.sms)
        print(f"{name:8} {span:8.1f} us  {useful / span / 1e6:6.1f} TFLOP/s")
    print(f"{'ideal':8} {ideal:8.1f} us  {useful / ideal / 1e6:6.1f} TFLOP/s  (no tail: the tiles' time / {a.sms})")


if __name__ == "__main__":
    main()
