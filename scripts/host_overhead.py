"""Host time per eager call of the torch front end, layer by layer, next to
torch SDPA in the same process (GPU machine). A tiny problem so that the GPU
never limits the loop; best of 5 rounds of n calls.
    python3 scripts/host_overhead.py [--profile]
"""
import cProfile
import pstats
import sys
import time

import torch
import torch.nn.functional as F

import attnforge
import attnforge.torch as at


def per_call(fn, n=400):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main():
    attnforge.set_policy(fwd="generated,torch-cudnn,torch-flash", bwd="generated,torch-cudnn,torch-flash")
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = [
        ("torch F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("attnforge scaled_dot_product_attention", lambda: at.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("torch.ops.attnforge.sdpa_fwd", lambda: torch.ops.attnforge.sdpa_fwd(q, k, v, None, None, 128, 128, 0.0,
                                                                              "causal-tl", -1, -1, 0.0)),
        ("torch.empty_like x2 (allocation floor)", lambda: (torch.empty_like(q), torch.empty_like(q))),
    ]
    for name, fn in rows:
        print(f"{name:45s} {per_call(fn):8.1f} us")
    if "--profile" in sys.argv:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            at.scaled_dot_product_attention(q, k, v, is_causal=True)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(35)


if __name__ == "__main__":
    main()
