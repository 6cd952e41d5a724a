#!/usr/bin/env python3
"""Executed SASS instructions per opcode, from ncu's source page.

Input: the CSV that `ncu --import R.ncu-rep --page source --csv --print-source sass`
writes for one kernel (a report taken with `--section SourceCounters`): one row
per SASS instruction with its address, text and executed-instruction count
(warp level). Output: one line per opcode (the mnemonic without modifiers, or
with them under --full), executed count, share of the total and count per
executed HMMA or HGMMA (a wgmma kernel's column counts per HGMMA, whatever its shape), largest first; several CSVs side by side as columns.

    usage: sass_opcodes.py [--full] [--top N] NAME=FILE.csv [NAME=FILE.csv ...]
"""
import collections
import csv
import re
import sys


def load(path):
    """Rows of (address, instruction text, executed count)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    # ncu prints a few lines (==PROF== ..., kernel names) before the header.
    start = next(i for i, l in enumerate(lines) if "Source" in l and "Instructions Executed" in l)
    rows = list(csv.DictReader(lines[start:]))
    out = []
    for r in rows:
        n = r.get("Instructions Executed") or r.get("Warp Instructions Executed") or "0"
        try:
            n = int(float(n.replace(",", "") or 0))
        except ValueError:
            continue
        out.append((r.get("Address", ""), r.get("Source", ""), n))
    return out


def opcode(text, full):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", text.strip())
    op = t.split(" ")[0] if t else "?"
    return op if full else op.split(".")[0]


def main(argv):
    full = "--full" in argv
    top = 40
    if "--top" in argv:
        top = int(argv[argv.index("--top") + 1])
    named = [a.split("=", 1) for a in argv if "=" in a and not a.startswith("--")]
    if not named:
        print(__doc__)
        return 2
    counts = {}
    for name, path in named:
        c = collections.Counter()
        for _, text, n in load(path):
            c[opcode(text, full)] += n
        counts[name] = c
    keys = collections.Counter()
    for c in counts.values():
        keys.update(c)
    names = [n for n, _ in named]
    print(f"{'opcode':<28}" + "".join(f"{n:>16}{'share':>7}{'/HMMA':>7}" for n in names))
    totals = {n: sum(counts[n].values()) for n in names}
    hmma = {n: max(1, sum(v for k, v in counts[n].items() if k.startswith(("HMMA", "HGMMA")))) for n in names}
    for k, _ in keys.most_common(top):
        print(f"{k:<28}" + "".join(
            f"{counts[n][k]:>16,}{100 * counts[n][k] / max(1, totals[n]):>6.1f}%{counts[n][k] / hmma[n]:>7.2f}"
            for n in names))
    print(f"{'total':<28}" + "".join(f"{totals[n]:>16,}{'':>7}{totals[n] / hmma[n]:>7.2f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
