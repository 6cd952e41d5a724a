#!/usr/bin/env python3
"""A model of how one-tile-per-block grids fill the GPU (no GPU needed).

Each block is one work tile; the hardware starts blocks in their linear order
on whichever slot (SM, or SM x blocks per SM) frees first. The makespan of a
block order against the work per slot says how much a tail costs.

Forward (the sm90a one-tile entry): a tile is block_m query rows of one
sequence and head; its time is its tensor work at a per-SM rate (block_m rows x
its key tiles x block_n keys x 4 d FLOPs, partial tiles at full cost, as the
kernel runs them) plus a fixed cost; a tile past its sequence's end (ragged
batches count max_seqlen_q's blocks for every sequence) costs --empty-us.
Backward (--bwd): a block is one kv tile of block_n keys walking the query tiles
of block_m rows that see it; its time is those query tiles plus one (units, not
microseconds: only the ratios mean anything).

Orders: `current` (tile_at's / block_tile's head-major order: sequence by
sequence, each head's tiles the longest first, ragged empty tiles among
them), `sorted` (ragged: sequences longest first, empty tiles last; branch
s19-ragged-lpt), `phases P` (every head's longest P-th of tiles first, then the
next P-th, head-major inside each; branches s19-causal-phases /
s19-bwd-phases), `lpt` (every tile by time: the bound of any static order);
`ideal` is the work per slot (no tail). The model ignores L2 (the reason for
head-major), the walk entry and the overlap of one block's end with the next
block's start; it ranks orders, its absolute figures are rough.

    usage: tile_schedule.py [--lens 2864,1856,... | --lens 2048x8] [--heads 8] [--d 256]
                            [--block-m 128] [--block-n 80] [--rate 757] [--causal]
                            [--fixed-us 2] [--empty-us 0.5] [--slots 132] [--bwd]

`--lens 2048x8` is 8 sequences of 2048 (a dense batch). The defaults are the
bench's ragged d256 forward problem (examples/gpu_bench.rs, the lengths of its
session 17 run) at the planner's d256 tiles and the dense 8k rate of the
session 17 bench. Examples: the backward's d256 8k causal at the planner's
64 x 64 tiles, `--bwd --causal --lens 8192x2 --heads 8 --block-m 64 --block-n 64`;
the sm80 path's d64 shape (two blocks per SM) `--slots 264 --block-n 128 --block-m 64`.
"""
import argparse
import heapq
import math


def fwd_tiles(lens, heads, d, block_m, block_n, rate_tflops, causal, fixed_us, empty_us, slots):
    """(time, sequence, real, head, index) per tile in tile_at's head-major order."""
    per_slot = rate_tflops * 1e12 / slots
    m = math.ceil(max(lens) / block_m)
    out = []
    for b, length in enumerate(lens):
        for h in range(heads):
            for qb in range(m):
                m0 = (m - 1 - qb) * block_m
                if m0 >= length:
                    out.append((empty_us, b, False, h, qb))
                    continue
                last = min(m0 + block_m, length) - 1
                keys = last + 1 if causal else length      # bottom-right, s_q = s_k
                flops = 4 * block_m * math.ceil(keys / block_n) * block_n * d
                out.append((flops / per_slot * 1e6 + fixed_us, b, True, h, qb))
    return out, m


def bwd_tiles(lens, heads, block_m, block_n, causal):
    """The backward's main kernel: one block per kv tile, head-major."""
    n = math.ceil(max(lens) / block_n)
    out = []
    for b, length in enumerate(lens):
        for h in range(heads):
            for j in range(n):
                n0 = j * block_n
                if n0 >= length:
                    out.append((0.1, b, False, h, j))
                    continue
                rows = length - n0 if causal else length    # top-left, s_q = s_k
                out.append((math.ceil(rows / block_m) + 1, b, True, h, j))
    return out, n


def makespan(order, slots):
    free = [0.0] * slots
    for tile in order:
        start = heapq.heappop(free)
        heapq.heappush(free, start + tile[0])
    return max(free)


def phased(ts, m, phases):
    """Every head's tiles [lo, hi) of each phase in turn, head-major inside."""
    bounds = [i * m // phases for i in range(phases + 1)]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        out += [t for t in ts if lo <= t[4] < hi]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", default="2864,1856,734,3733,1257,2479,575,576,444,1866")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=80)
    ap.add_argument("--rate", type=float, default=757.0, help="dense TFLOP/s of the forward at long rows")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fixed-us", type=float, default=2.0)
    ap.add_argument("--empty-us", type=float, default=0.5)
    ap.add_argument("--slots", type=int, default=132)
    ap.add_argument("--bwd", action="store_true", help="the backward's main kernel (kv tiles)")
    a = ap.parse_args()
    if "x" in a.lens:
        length, count = a.lens.split("x")
        lens = [int(length)] * int(count)
    else:
        lens = [int(x) for x in a.lens.split(",")]
    if a.bwd:
        ts, m = bwd_tiles(lens, a.heads, a.block_m, a.block_n, a.causal)
        unit = "units"
    else:
        ts, m = fwd_tiles(lens, a.heads, a.d, a.block_m, a.block_n, a.rate, a.causal, a.fixed_us, a.empty_us,
                          a.slots)
        unit = "us"
    useful = sum(4 * n * n * a.d * a.heads / (2 if a.causal else 1) for n in lens)
    by_len = sorted(range(len(lens)), key=lambda b: (-lens[b], b))
    orders = {"current": ts}
    if len(set(lens)) > 1:
        orders["sorted"] = [t for b in by_len for t in ts if t[1] == b and t[2]] + [t for t in ts if not t[2]]
    if a.causal and len(set(lens)) == 1:
        for p in (2, 3, 4):
            orders[f"phases {p}"] = phased(ts, m, p)
    orders["lpt"] = sorted((t for t in ts if t[2]), key=lambda t: -t[0])
    ideal = sum(t[0] for t in ts if t[2]) / a.slots
    for name, order in orders.items():
        span = makespan(order, a.slots)
        rate = "" if a.bwd else f"  {useful / span / 1e6:6.1f} TFLOP/s"
        print(f"{name:9} {span:9.1f} {unit}  {100 * ideal / span:5.1f}% of the work per slot{rate}")


if __name__ == "__main__":
    main()
