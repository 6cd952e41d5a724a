"""Backward peers on the GPU machine: torch SDPA's flash (FlashAttention-2) and
cuDNN backends, timed like `gpu_bwd`'s bench and tuning loop (median of
do_bench, bf16, FLOPs = 2.5 x forward = 10·b·h·s²·d, halved when causal), on
the same shapes:
  default   batch·seqlen = 16k tokens, heads·d = 2048, seqlen in SEQS (2048,8192)
  --tune    batch 4, seqlen 4096, heads·d = 2048
usage: python3 scripts/bwd_bench.py [--tune] [--seqs 2048,8192]
"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench

PEERS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def shapes():
    if "--tune" in sys.argv:
        for d in (64, 128, 256):
            for causal in (False, True):
                yield 4, 2048 // d, 4096, d, causal
        return
    seqs = [2048, 8192]
    if "--seqs" in sys.argv:
        seqs = [int(x) for x in sys.argv[sys.argv.index("--seqs") + 1].split(",")]
    for d in (64, 128, 256):
        for s in seqs:
            for causal in (False, True):
                yield max(1, 16384 // s), 2048 // d, s, d, causal


def main():
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("| peer | d | batch x heads x seqlen | causal | bwd ms | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for b, h, s, d, causal in shapes():
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        for name, bk in PEERS.items():
            try:
                with sdpa_kernel([bk]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    do = torch.randn_like(o)
                    ms = do_bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                                  warmup=10, rep=40, return_mode="median")
                fl = 10.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                print(f"| {name} | {d} | {b} x {h} x {s} | {'yes' if causal else 'no'} | {ms:.3f} | {fl / ms / 1e9:.1f} |", flush=True)
            except Exception as e:
                print(f"| {name} | {d} | {b} x {h} x {s} | {'yes' if causal else 'no'} | error: {str(e).splitlines()[0][:100]} | |", flush=True)
        del q, k, v


if __name__ == "__main__":
    main()
