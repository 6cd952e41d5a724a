#!/usr/bin/env python3
"""A markdown table from the log of `gpu_bench --ab` (session step `ab`).

Each `ab ...` line of the log is one module's median on one cell: this tree's
kernel, or a dir's cubin (`.gpu/DIR/FILE`). The table has one row per cell and
one column per dir, each figure with its change against this tree; the spread
of this tree's five rounds goes beside it, so that a change inside it reads as
noise. With NAMES, only those dirs, in that order.

    usage: ab_table.py AB_LOG [DIR_NAME ...]
"""
import re
import sys

LINE = re.compile(
    r"ab (?P<kind>fwd80|bwd90|bwd)?\s*d=(?P<d>\d+)\s+s=(?P<s>\w+)\s+causal=(?P<causal>\w+)\s+"
    r"(?P<tf>[\d.]+) TFLOP/s median \(rounds (?P<rounds>[\d ]+)\)(?P<entry>[^.]*?)\s*"
    r"(?P<who>this tree|\S+)\s*$")


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cells, dirs = {}, []
    with open(argv[0]) as f:
        for line in f:
            m = LINE.match(line.rstrip())
            if not m:
                continue
            kind = m["kind"] or "fwd90"
            seq = "ragged" if m["s"] == "thd" else f"s{m['s']}"
            cell = f"{kind} d{m['d']} {seq}{' causal' if m['causal'] == 'true' else ''}{m['entry'].rstrip()}"
            who = m["who"]
            if who != "this tree":
                parts = who.split("/")
                who = parts[-2] if len(parts) >= 2 else who
                if who not in dirs:
                    dirs.append(who)
            rounds = [float(x) for x in m["rounds"].split()]
            cells.setdefault(cell, {})[who] = (float(m["tf"]), rounds)
    names = argv[1:] or dirs
    if not cells:
        print(f"{argv[0]}: no `ab` lines", file=sys.stderr)
        return 1
    print("| cell | this tree (rounds) | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for cell, by in cells.items():
        base = by.get("this tree")
        if base is None:
            continue
        tf, rounds = base
        spread = (max(rounds) - min(rounds)) / tf * 100
        out = []
        for name in names:
            x = by.get(name)
            out.append("–" if x is None else f"{x[0]:.1f} ({(x[0] / tf - 1) * 100:+.1f}%)")
        print(f"| {cell} | {tf:.1f} (±{spread / 2:.1f}%) | " + " | ".join(out) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
