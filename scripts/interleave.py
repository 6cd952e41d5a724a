"""The pure parts of scripts/bench_interleaved.py (no torch, no GPU): the
balanced order of the modules in a round, the markdown report and the plot of
a run (meta and rows as in interleaved.json). Tested on the CPU by
python/tests/test_interleave.py."""
import statistics


def williams(n):
    """A balanced Latin square's rows for n modules: each module follows every
    other one equally often over the rows (n rows for even n, 2n for odd)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def report(meta, rows):
    """The markdown table of a run (meta and rows as in interleaved.json)."""
    started = meta["date"]

    def cell(row, n):
        f = row["rounds"].get(n)
        if not f:
            return "n/a"
        return f"{statistics.median(f):.0f} ({min(f):.0f}-{max(f):.0f})"

    def ratio(row, n, ours="attnforge"):
        m = row["median"]
        return f"{m[ours] / m[n]:.2f}x" if ours in m and n in m else "n/a"

    what = ("Backward (dQ, dK, dV; FLOPs = 2.5 x the forward's; ours: both directions on our kernels)"
            if meta.get("direction") == "bwd" else "Forward")
    lines = [f"{what}, bf16, {meta['device']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, measured {started}.",
             f"Interleaved: {meta['rounds']} rounds per config, each timing every module once (median of do_bench's "
             "repetitions), the modules of a round in a balanced Latin square's order (each module after every "
             "other equally often); TFLOP/s median over the rounds (min-max).", "",
             "attnforge = the planner's kernel; sm80 path = the mma.sync template on the same problem "
             "(`set_policy(generated_path=\"sm80\")`).", "",
             "| d | seqlen | batch x heads | causal | attnforge | sm80 path | torch-flash (FA2) | torch-cudnn "
             "| vs FA2 | vs cuDNN | sm80 path vs FA2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['d']} | {r['s']} | {r['b']} x {r['h']} | {'yes' if r['causal'] else 'no'} | "
                     f"{cell(r, 'attnforge')} | {cell(r, 'sm80 path')} | {cell(r, 'torch-flash')} | "
                     f"{cell(r, 'torch-cudnn')} | {ratio(r, 'torch-flash')} | {ratio(r, 'torch-cudnn')} | "
                     f"{ratio(r, 'torch-flash', 'sm80 path')} |")
    # Carry-over: each module's figure after each other module, relative to
    # its median in the same config, then the median over the configs.
    mods_all = [n for n in ("attnforge", "sm80 path", "torch-flash", "torch-cudnn") if any(n in r["rounds"] for r in rows)]
    lines += ["", "What ran before (each module's figure right after another, relative to its median in the same "
              "config; median over the configs):", "",
              "| module | " + " | ".join(f"after {n}" for n in mods_all) + " |",
              "|---|" + "---|" * len(mods_all)]
    for m in mods_all:
        cells = []
        for before in mods_all:
            rel = [f / r["median"][m] for r in rows if m in r["rounds"]
                   for f, a in zip(r["rounds"][m], r["after"][m]) if a == before]
            cells.append(f"{statistics.median(rel):.3f} ({len(rel)})" if rel else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(meta, rows, path):
    """Ratios per config: the planner's kernel against cuDNN (issue 4), the sm80
    path against FlashAttention-2 (issue 3); the 1.0 line."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # no matplotlib on this machine: the tables stand alone
        print("plot skipped:", e)
        return
    labels = [f"d{r['d']} s{r['s']}{' c' if r['causal'] else ''}" for r in rows]
    x = list(range(len(rows)))

    def ratios(ours, peer):
        return [r["median"][ours] / r["median"][peer] if ours in r["median"] and peer in r["median"] else 0
                for r in rows]

    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.45), 4.5))
    w = 0.38
    ax.bar([i - w / 2 for i in x], ratios("attnforge", "torch-cudnn"), w, label="attnforge / cuDNN")
    ax.bar([i + w / 2 for i in x], ratios("sm80 path", "torch-flash"), w, label="sm80 path / FA2")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"ratio of medians (bf16 {meta.get('direction', 'fwd')})")
    ax.set_title(f"{meta['device']}, interleaved ({meta['rounds']} balanced rounds), {meta['date']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
