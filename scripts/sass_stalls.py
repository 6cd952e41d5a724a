#!/usr/bin/env python3
"""PC-sampled warp stalls of one kernel, from ncu's source page (SASS view).

Input: the CSV that `ncu --import R.ncu-rep --page source --csv --print-source sass`
writes for a report taken with `--section SourceCounters` (scripts/ncu-stalls.sh):
one row per SASS instruction with its executed count and its samples per stall
reason. Output: the kernel's samples per reason (share of all samples), then the
instructions with the most samples (address, text, executed count, samples and
their two largest reasons), then the samples summed over the address ranges that
`--region NAME=START-END` names (hex addresses; several allowed).

    usage: sass_stalls.py [--top N] [--region NAME=START-END ...] FILE.csv
"""
import collections
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
    return list(csv.DictReader(lines[start:]))


def num(x):
    try:
        return float((x or "0").replace(",", ""))
    except ValueError:
        return 0.0


def main(argv):
    top, regions, files = 25, [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--top":
            top = int(argv[i + 1]); i += 2
        elif argv[i] == "--region":
            name, r = argv[i + 1].split("=")
            a, b = r.split("-")
            regions.append((name, int(a, 16), int(b, 16))); i += 2
        else:
            files.append(argv[i]); i += 1
    for path in files:
        rows = load(path)
        reasons = [k for k in rows[0] if k.startswith("stall_") and "(Not Issued)" not in k]
        total = collections.Counter()
        per = []
        for r in rows:
            c = collections.Counter({k[6:]: num(r[k]) for k in reasons if num(r[k])})
            total += c
            addr = int(r["Address"], 16) if r["Address"].startswith("0x") else int(r["Address"] or 0)
            per.append((addr, r["Source"].strip(), num(r["Instructions Executed"]), c))
        all_s = sum(total.values()) or 1
        ins = sum(p[2] for p in per)
        print(f"== {path}: {int(all_s)} samples, {int(ins)} warp instructions executed")
        print("  " + ", ".join(f"{k} {v / all_s:.1%}" for k, v in total.most_common(10)))
        print(f"  top {top} instructions by samples:")
        for addr, text, n, c in sorted(per, key=lambda p: -sum(p[3].values()))[:top]:
            s = sum(c.values())
            why = ", ".join(f"{k} {v / s:.0%}" for k, v in c.most_common(2))
            print(f"    {addr:05x} {s / all_s:6.2%} x{int(n):>9} {text[:58]:58s} {why}")
        for name, a, b in regions:
            c = collections.Counter()
            n = 0
            for addr, _, k, cc in per:
                if a <= addr < b:
                    c += cc
                    n += k
            s = sum(c.values())
            print(f"  region {name} [{a:x},{b:x}): {s / all_s:6.1%} of samples, {int(n)} instructions; "
                  + ", ".join(f"{k} {v / (s or 1):.0%}" for k, v in c.most_common(4)))


if __name__ == "__main__":
    main(sys.argv[1:])
