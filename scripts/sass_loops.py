#!/usr/bin/env python3
"""The loops of a kernel's machine code, read statically (no GPU, no profiler).

Input: `cuobjdump -sass` text of one kernel (ours: `attnforge compile SPEC -o X.cubin`;
FlashAttention-2's: scripts/fa2-sass.sh). A loop is a backward branch; for each
one the address range, its instruction count and its opcodes by count (root
opcode, e.g. HMMA; `--full` adds the complete opcodes, e.g.
HMMA.16816.F32.BF16). `--seq START-END` prints the order of the memory and
tensor instructions over an address range as one letter each (H mma, L
ldmatrix, g cp.async, l/s shared load/store, R global reduction, e MUFU,
| barrier, b branch, . anything else), 120 per line: where the operand loads
sit against the products they feed.

Static counts: both sides of a branch count, and an inner loop counts once per
appearance, not per trip (multiply by its trips for the dynamic figure).

    usage: sass_loops.py [--full] [--seq START-END] FILE.sass
"""
import collections
import re
import sys

LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LETTERS = {"HMMA": "H", "HGMMA": "H", "LDSM": "L", "LDGSTS": "g", "LDS": "l", "STS": "s",
           "REDG": "R", "RED": "R", "MUFU": "e", "BAR": "|", "BRA": "b"}


def parse(path):
    ins = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def opcode(text):
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0]


def loops(ins):
    at = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, t) in enumerate(ins):
        if opcode(t) != "BRA" and not opcode(t).startswith("BRA."):
            continue
        m = re.search(r"0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            found.append((at[int(m.group(1), 16)], i))
    return found


def main(argv):
    full = "--full" in argv
    seq = None
    args = [a for a in argv if a != "--full"]
    if "--seq" in args:
        k = args.index("--seq")
        lo, hi = (int(x, 16) for x in args[k + 1].split("-"))
        seq = (lo, hi)
        del args[k:k + 2]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    ins = parse(args[0])
    if not ins:
        print(f"{args[0]}: no SASS lines", file=sys.stderr)
        return 1
    if seq:
        s = "".join(LETTERS.get(opcode(t).split(".")[0], ".") for a, t in ins if seq[0] <= a <= seq[1])
        print("\n".join(s[i:i + 120] for i in range(0, len(s), 120)))
        return 0
    print(f"{len(ins)} instructions")
    for s, e in loops(ins):
        body = [t for _, t in ins[s:e + 1]]
        roots = collections.Counter(opcode(t).split(".")[0] for t in body)
        print(f"loop 0x{ins[s][0]:x}-0x{ins[e][0]:x}: {len(body)} instructions; "
              + ", ".join(f"{k} {v}" for k, v in roots.most_common()))
        if full:
            ops = collections.Counter(opcode(t) for t in body)
            print("    " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
