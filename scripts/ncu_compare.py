#!/usr/bin/env python3
"""Side-by-side metrics of several ncu profiles (their `--page raw --csv` exports).

    usage: ncu_compare.py DIR NAME [NAME ...]     (reads DIR/NAME.raw.csv)

Prints the metrics that say where a matrix kernel's time goes (duration,
issue, the tensor and other pipes, shared memory, stall reasons, launch
shape) for each profile in one column; with NCU_COMPARE_ALL=1 every metric
whose name matches one of the patterns, not only the short list.
"""
import csv
import os
import re
import sys

SHORT = [
    r"^gpu__time_duration\.sum$",
    r"^sm__cycles_elapsed\.avg$",
    r"^smsp__cycles_active\.avg$",
    r"^launch__(grid_size|block_size|registers_per_thread|shared_mem_per_block_dynamic)$",
    r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$",
    r"^smsp__inst_executed\.sum$",
    r"^sm__pipe_.*(tensor|gmma|shared|fma|alu|xu|uniform).*pct_of_peak_sustained_active$",
    r"^sm__inst_executed_pipe_.*pct_of_peak_sustained_active$",
    r"^l1tex__data_pipe_lsu_wavefronts_mem_shared.*(sum|pct_of_peak_sustained_elapsed)$",
    r"^l1tex__data_bank_(reads|writes)\.avg\.pct_of_peak_sustained_elapsed$",
    r"^l1tex__throughput\.avg\.pct_of_peak_sustained_active$",
    r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$",
    r"^smsp__warps_active\.avg\.per_cycle_active$",
    r"^lts__t_sector_hit_rate\.pct$",
    r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^dram__bytes_(read|write)\.sum$",
]
ALL = [r"pipe", r"stall", r"shared", r"bank", r"gmma", r"tensor", r"inst_executed", r"cycles", r"duration", r"launch__", r"dram__bytes", r"lts__t_sector_hit"]


def load(path):
    with open(path, newline="") as f:
        lines = [l for l in f.read().splitlines() if l.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        return {}
    names, units, values = rows[0], rows[1], rows[2]
    return {n: (v, u) for n, u, v in zip(names, units, values)}


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    d, names = sys.argv[1], sys.argv[2:]
    profs = [load(os.path.join(d, f"{n}.raw.csv")) for n in names]
    pats = ALL if os.environ.get("NCU_COMPARE_ALL") == "1" else SHORT
    keys = sorted({k for p in profs for k in p if any(re.search(x, k) for x in pats)})
    width = max([len(k) for k in keys] + [10])
    print(" " * width + "".join(f"{n[:22]:>24}" for n in names))
    for k in keys:
        vals = [p.get(k, ("", ""))[0] for p in profs]
        if all((num(v) or 0) == 0 for v in vals):
            continue
        unit = next((p[k][1] for p in profs if k in p), "")
        print(f"{k:<{width}}" + "".join(f"{v[:22]:>24}" for v in vals) + f"  {unit}")


if __name__ == "__main__":
    main()
