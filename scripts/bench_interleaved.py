"""Forward bench with the peers interleaved: attnforge's planner kernel (through
the torch front end, `ATTNFORGE_BACKEND_FWD=generated`), the same problem on
the sm80 instruction path (the policy's `generated_path="sm80"`: the
mma.sync template, issue 3's kernel, on Hopper), torch SDPA's flash
(FlashAttention-2) and cuDNN backends, timed in alternating rounds on the same
inputs in one process, so that clock and temperature drift between the
modules cancels out of the ratios (`make gpu-bench` times ours in the Rust
binary first and the peers afterwards).

Per config: ROUNDS rounds, each timing every module once (triton's do_bench,
median of its repetitions); the figure is the median over the rounds, and the
spread (min-max over rounds) is reported beside it. The order of the modules
in a round comes from a balanced Latin square (Williams): over a square's
rows every module runs right after every other module equally often. A
kernel's clocks depend on what ran just before it (a module that follows one
at the power limit starts slower), and session 32 measured a cyclic order
(each round starting at the next module, the same neighbour before every
module every round) putting the sm80 path 7-10% under its own figure in a
gpu_bench A/B among modules of its own power. The JSON keeps, per figure,
the module that ran before it. Standard sweep: d 64/128/256 x seqlen 512/2k/8k/16k x
causal or not, batch x seqlen = 16k tokens, heads x d = 2048, bf16.

Runs on the GPU machine with the attnforge wheel importable (session step
`inter`, scripts/gpu-session.sh; also the last step of `make gpu-bench`).
Writes $OUT/interleaved.{md,json,png}.
  usage: bench_interleaved.py [--rounds N] [--seqs 2048,8192] [--dims 128,256] [--no-sm80]
                              [--only sm80_path,torch-flash] [--causal no|yes] [--bwd]
--bwd times the backward instead (dQ, dK, dV from one forward graph per module
and round, `torch.autograd.grad(..., retain_graph=True)`; FLOPs = 2.5 x the
forward's; ours run both directions on our kernels) and writes
$OUT/interleaved-bwd.{md,json,png}.
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

import attnforge  # noqa: E402
import attnforge.torch as aft  # noqa: E402
from interleave import plot, report, williams  # noqa: E402  (scripts/interleave.py)


def arg(name, default):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


ROUNDS = int(arg("--rounds", "8"))
SEQS = tuple(int(x) for x in arg("--seqs", "512,2048,8192,16384").split(","))
DIMS = tuple(int(x) for x in arg("--dims", "64,128,256").split(","))
SM80 = "--no-sm80" not in sys.argv
BWD = "--bwd" in sys.argv
NAME = "interleaved-bwd" if BWD else "interleaved"
ONLY = [n.strip().replace("_", " ") for n in arg("--only", "").split(",") if n.strip()]  # sm80_path = "sm80 path"
CAUSAL = {"no": (False,), "yes": (True,)}.get(arg("--causal", ""), (False, True))
# The policy each of our modules runs under (set before its timing and its check).
POLICY = {"attnforge": dict(fwd="generated", bwd="generated"),
          "sm80 path": dict(fwd="generated", bwd="generated", generated_path="sm80")}
out = os.environ.get("OUT") or os.path.join(os.getcwd(), "gpu-results")
os.makedirs(out, exist_ok=True)
dev = torch.device("cuda")


def flops(b, h, s, d, causal):
    return 4 * b * h * s * s * d * (0.5 if causal else 1.0) * (2.5 if BWD else 1.0)


def timed(fwd, q, k, v, g):
    """What a round times for one module: its forward, or (--bwd) a zero-argument
    backward of a forward graph built here, outside the timing."""
    if not BWD:
        return fwd
    out = fwd()
    return lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)


def modules(q, k, v, causal, g=None):
    """name -> zero-argument forward, each checked once against torch's flash
    (with --bwd: its dQ against flash's)."""

    def peer(backend):
        def run():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    ours = lambda: aft.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    mods = {"attnforge": ours}
    if SM80:
        mods["sm80 path"] = ours
    mods["torch-flash"] = peer(SDPBackend.FLASH_ATTENTION)
    mods["torch-cudnn"] = peer(SDPBackend.CUDNN_ATTENTION)
    first = (lambda r: r[0] if BWD else r)  # noqa: E731
    ref = first(timed(mods["torch-flash"], q, k, v, g)()).float()
    if ONLY:
        mods = {n: f for n, f in mods.items() if n in ONLY}
    for name, fn in list(mods.items()):
        try:
            use(name)
            o = first(timed(fn, q, k, v, g)()).float()
            err = ((o - ref).norm() / ref.norm()).item()
            if not err < 2e-2:  # NaN fails too
                raise RuntimeError(f"relative error {err:.3g} against torch-flash")
        except Exception as e:  # a module that cannot run this config says why
            print(f"  {name}: {str(e).splitlines()[0][:160]}", flush=True)
            del mods[name]
    return mods


def use(name):
    """Set the policy of one of our modules (the peers need none)."""
    if name in POLICY:
        attnforge.set_policy(**POLICY[name])


def main():
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for d in DIMS:
        for s in SEQS:
            for causal in CAUSAL:
                b, h = max(1, 16384 // s), 2048 // d
                q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=BWD)
                           for _ in range(3))
                g = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) if BWD else None
                mods = modules(q, k, v, causal, g)
                names = list(mods)
                figures = {n: [] for n in names}
                after = {n: [] for n in names}              # the module timed right before each figure
                square, prev = williams(len(names)), None
                for r in range(ROUNDS):
                    for i in square[r % len(square)]:
                        n = names[i]
                        use(n)
                        fn = timed(mods[n], q, k, v, g)
                        ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                        del fn
                        figures[n].append(flops(b, h, s, d, causal) / ms / 1e9)
                        after[n].append(prev)
                        prev = n
                row = {"d": d, "s": s, "b": b, "h": h, "causal": causal, "rounds": figures, "after": after,
                       "median": {n: statistics.median(f) for n, f in figures.items()}}
                rows.append(row)
                med = row["median"]
                print(f"d={d:<3} s={s:<5} causal={causal!s:<5} "
                      + "  ".join(f"{n} {med[n]:6.1f}" for n in names), flush=True)
                del q, k, v, g, mods
    meta = {"date": started, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "rounds": ROUNDS, "order": "williams",
            "direction": "bwd" if BWD else "fwd"}
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(out, f"{NAME}.json"), "w"), indent=1)
    table = report(meta, rows)
    open(os.path.join(out, f"{NAME}.md"), "w").write(table + "\n")
    print(table)
    plot(meta, rows, os.path.join(out, f"{NAME}.png"))


if __name__ == "__main__":
    main()
