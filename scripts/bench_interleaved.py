"""Forward bench with the peers interleaved: attnforge's planner kernel (through
the torch front end, `ATTNFORGE_BACKEND_FWD=generated`), torch SDPA's flash
(FlashAttention-2) and cuDNN backends, timed in alternating rounds on the same
inputs in one process, so that clock and temperature drift between the
modules cancels out of the ratios (`make gpu-bench` times ours in the Rust
binary first and the peers afterwards).

Per config: ROUNDS rounds, each timing every module once (triton's do_bench,
median of its repetitions), each round starting at the next module; the
figure is the median over the rounds, and the spread (min-max over rounds) is
reported beside it. Standard sweep: d 64/128/256 x seqlen 512/2k/8k/16k x
causal or not, batch x seqlen = 16k tokens, heads x d = 2048, bf16.

Runs on the GPU machine with the attnforge wheel importable (session step
`inter`, scripts/gpu-session.sh). Writes $OUT/interleaved.{md,json}.
  usage: bench_interleaved.py [--rounds N] [--seqs 2048,8192] [--dims 128,256]
"""
import datetime
import json
import os
import statistics
import sys

os.environ.setdefault("ATTNFORGE_BACKEND_FWD", "generated")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import attnforge.torch as aft  # noqa: E402


def arg(name, default):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


ROUNDS = int(arg("--rounds", "5"))
SEQS = tuple(int(x) for x in arg("--seqs", "512,2048,8192,16384").split(","))
DIMS = tuple(int(x) for x in arg("--dims", "64,128,256").split(","))
out = os.environ.get("OUT") or os.path.join(os.getcwd(), "gpu-results")
os.makedirs(out, exist_ok=True)
dev = torch.device("cuda")


def flops(b, h, s, d, causal):
    return 4 * b * h * s * s * d * (0.5 if causal else 1.0)


def modules(q, k, v, causal):
    """name -> zero-argument forward, each checked once against torch's flash."""

    def peer(backend):
        def run():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    mods = {
        "attnforge": lambda: aft.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "torch-flash": peer(SDPBackend.FLASH_ATTENTION),
        "torch-cudnn": peer(SDPBackend.CUDNN_ATTENTION),
    }
    ref = mods["torch-flash"]().float()
    for name, fn in list(mods.items()):
        try:
            o = fn().float()
            err = ((o - ref).norm() / ref.norm()).item()
            if not err < 2e-2:  # NaN fails too
                raise RuntimeError(f"relative error {err:.3g} against torch-flash")
        except Exception as e:  # a module that cannot run this config says why
            print(f"  {name}: {str(e).splitlines()[0][:160]}", flush=True)
            del mods[name]
    return mods


def main():
    started = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for d in DIMS:
        for s in SEQS:
            for causal in (False, True):
                b, h = max(1, 16384 // s), 2048 // d
                q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
                mods = modules(q, k, v, causal)
                names = list(mods)
                figures = {n: [] for n in names}
                for r in range(ROUNDS):
                    for i in range(len(names)):
                        n = names[(i + r) % len(names)]
                        ms = do_bench(mods[n], warmup=10, rep=40, return_mode="median")
                        figures[n].append(flops(b, h, s, d, causal) / ms / 1e9)
                row = {"d": d, "s": s, "b": b, "h": h, "causal": causal, "rounds": figures,
                       "median": {n: statistics.median(f) for n, f in figures.items()}}
                rows.append(row)
                med = row["median"]
                print(f"d={d:<3} s={s:<5} causal={causal!s:<5} "
                      + "  ".join(f"{n} {med[n]:6.1f}" for n in names), flush=True)
                del q, k, v
    meta = {"date": started, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "rounds": ROUNDS}
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(out, "interleaved.json"), "w"), indent=1)

    def cell(row, n):
        f = row["rounds"].get(n)
        if not f:
            return "n/a"
        return f"{statistics.median(f):.0f} ({min(f):.0f}-{max(f):.0f})"

    def ratio(row, n):
        m = row["median"]
        return f"{m['attnforge'] / m[n]:.2f}x" if "attnforge" in m and n in m else "n/a"

    lines = [f"Forward, bf16, {meta['device']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, measured {started}.",
             f"Interleaved: {ROUNDS} rounds per config, each timing every module once (median of do_bench's "
             "repetitions), each round starting at the next module; TFLOP/s median over the rounds (min-max).", "",
             "| d | seqlen | batch x heads | causal | attnforge | torch-flash (FA2) | torch-cudnn | vs FA2 | vs cuDNN |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['d']} | {r['s']} | {r['b']} x {r['h']} | {'yes' if r['causal'] else 'no'} | "
                     f"{cell(r, 'attnforge')} | {cell(r, 'torch-flash')} | {cell(r, 'torch-cudnn')} | "
                     f"{ratio(r, 'torch-flash')} | {ratio(r, 'torch-cudnn')} |")
    table = "\n".join(lines)
    open(os.path.join(out, "interleaved.md"), "w").write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
