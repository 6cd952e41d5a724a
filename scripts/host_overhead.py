"""Host time per eager call of the torch front end, layer by layer, next to
torch SDPA in the same process (GPU machine). A tiny problem; per row two
figures (see `per_call`): host = the enqueue time of short rounds of calls
(best of 40 rounds of 50), sustained = the time per call of a 400-call burst
drained, which a kernel longer than the host's work per call dominates.
Policy: ours first (the generated kernels; torch's as fallbacks), as the GPU
tests.

Rows: no-grad forward; forward with inputs requiring grad (builds the
autograd graph); a training step (forward + backward); the custom op alone
(what torch.compile graphs contain, and what every eager call paid before
the fast path) and the custom op with its autograd formula (the eager
training path before); the allocation floor (two torch.empty_strided). Then
the fast path piece by piece: the no-grad forward's parts, and the
training step's generated backward (`_fast_backward` whole, its
allocations, `BwdLaunch.run` alone). `--profile` adds cProfile tables of
no-grad calls and of training steps.

    python3 scripts/host_overhead.py [--profile]
"""
import cProfile
import itertools
import pstats
import sys
import time

import torch
import torch.nn.functional as F

import attnforge
import attnforge.torch as at


def per_call(fn, n=50, rounds=40, burst=400):
    """(host µs, sustained µs) per call. Host: the best of `rounds` rounds of
    `n` calls, timed to the end of the enqueue loop; a round is short so that
    the launch queue never fills (once it does, a launch waits for the GPU
    and the loop measures GPU time: a tiny problem's kernels can take longer
    than the host's work, and our launches carry 3 tensor maps, ~0.6 KB of
    parameters each). Sustained: `burst` calls then a drain, per call, best
    of 3: the rate at which calls complete, bounded by the slower of host and
    GPU."""
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    best_host = best_all = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best_host = min(best_host, (t1 - t0) / n)
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        torch.cuda.synchronize()
        best_all = min(best_all, (time.perf_counter() - t0) / burst)
    return best_host * 1e6, best_all * 1e6


def main():
    attnforge.set_policy(fwd="generated,torch-cudnn,torch-flash", bwd="generated,torch-cudnn,torch-flash")
    shape = (1, 8, 128, 64)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    def step(sdpa):
        def run():
            out = sdpa(qg, kg, vg, is_causal=True)
            torch.autograd.grad(out, (qg, kg, vg), dout)
        return run

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, attnforge {attnforge.__version__}, "
          f"problem {'x'.join(map(str, shape))} bf16 causal, policy {attnforge.policy()}")
    print(f"decision: {attnforge.decide(dtype='bf16', head_dim=64, heads=8, seqlen_q=128, causal=True, requires_grad=True, arch='%d.%d' % torch.cuda.get_device_capability())[:2]}")
    # Eight input sets taken in turn: every call sees new Q/K/V pointers, as
    # the layers of a model do (the sm90a forward re-encodes its TMA maps).
    sets = [tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(8)]
    turn = itertools.cycle(sets)

    def fresh(sdpa):
        def run():
            a, b, c = next(turn)
            return sdpa(a, b, c, is_causal=True)
        return run

    rows = [
        ("no grad", "torch F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("no grad", "attnforge scaled_dot_product_attention", lambda: at.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("no grad", "torch, new inputs each call", fresh(F.scaled_dot_product_attention)),
        ("no grad", "attnforge, new inputs each call", fresh(at.scaled_dot_product_attention)),
        ("grad fwd", "torch F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
        ("grad fwd", "attnforge scaled_dot_product_attention", lambda: at.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
        ("fwd+bwd", "torch F.scaled_dot_product_attention", step(F.scaled_dot_product_attention)),
        ("fwd+bwd", "attnforge scaled_dot_product_attention", step(at.scaled_dot_product_attention)),
        ("no grad", "torch.ops.attnforge.sdpa_fwd (custom op)", lambda: torch.ops.attnforge.sdpa_fwd(
            q, k, v, None, None, 128, 128, 0.0, "causal-tl", -1, -1, 0.0)),
        ("fwd+bwd", "custom op + its autograd (eager path before)", lambda: torch.autograd.grad(
            torch.ops.attnforge.sdpa_fwd(qg, kg, vg, None, None, 128, 128, 0.0, "causal-tl", -1, -1, 0.0)[0],
            (qg, kg, vg), dout)),
        ("floor", "torch.empty_strided (O)", lambda: torch.empty_strided(
            shape, (65536, 8192, 64, 1), dtype=torch.bfloat16, device=q.device)),
        ("floor", "torch.empty_strided x2 (O, LSE)", lambda: (
            torch.empty_strided(shape, (65536, 8192, 64, 1), dtype=torch.bfloat16, device=q.device),
            torch.empty_strided(shape[:3], (1024, 128, 1), dtype=torch.float32, device=q.device))),
    ]
    print(f"{'':9s} {'':45s} {'host':>8s}    {'sustained':>9s}")
    for mode, name, fn in rows:
        host, total = per_call(fn)
        print(f"{mode:9s} {name:45s} {host:8.1f} us {total:8.1f} us")
    print(f"fast-path entries: {len(at._FAST)}; {next(iter(at._FAST.values()), None)!r}")
    # The no-grad call with O from torch.empty_strided, as before empty_like (A/B in one process).
    e0 = next((x for x in at._FAST.values() if x is not None and x.handle is not None and x.out_like_q), None)
    if e0 is not None:
        e0.out_like_q = False
        host, total = per_call(lambda: at.scaled_dot_product_attention(q, k, v, is_causal=True))
        e0.out_like_q = True
        print(f"{'no grad':9s} {'attnforge, O by torch.empty_strided':45s} {host:8.1f} us {total:8.1f} us")
    # The no-grad fast path piece by piece (each timed alone, same problem).
    e = next((x for x in at._FAST.values() if x is not None and x.handle is not None), None)
    if e is not None:
        out, lse = at._fast_forward(e, q, k, v)
        stream = at._raw_stream(e.index)
        parts = [
            ("eligibility checks (_why_not_fast)", lambda: at._why_not_fast(q, k, v, None, 0.0)),
            ("call signature (_fast_key)", lambda: at._fast_key(q, k, v, True, None, False, False)),
            ("current raw stream", lambda: at._raw_stream(e.index)),
            ("4 x data_ptr()", lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())),
            ("one torch.empty_strided (O)", lambda: at._empty_strided(e.out[0], e.out[1], dtype=e.dtype,
                                                                      device=e.device)),
            ("O as the fast path allocates it (_fast_out)", lambda: at._fast_out(e, q)),
            ("a pyo3 call with no work (policy_epoch)", at._core.policy_epoch),
            ("Rust launch alone, no LSE (FwdLaunch.run)", lambda: e.handle.run(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0, 0, 0, stream)),
            ("Rust launch alone, with LSE", lambda: e.handle.run(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), 0, 0, stream)),
            ("Rust launch alone, new Q/K/V each call", lambda: e.handle.run(
                *(t.data_ptr() for t in next(turn)), out.data_ptr(), 0, 0, 0, stream)),
        ]
        print("breakdown of the no-grad fast path:")
        for name, fn in parts:
            host, _ = per_call(fn)
            print(f"  {name:45s} {host:8.2f} us")
    # The training step's backward piece by piece: the entry of the grad
    # calls, with the BwdLaunch its fwd+bwd row made for this dO layout.
    eg = next((x for x in at._FAST.values() if x is not None and x.bwd), None)
    launch = None if eg is None else eg.bwd.get(torch.are_deterministic_algorithms_enabled())
    h = None if launch is None else launch[2].get(dout.stride())
    if h is None:
        print(f"no BwdLaunch for the fwd+bwd row (backward by {launch and launch[1]}): no backward breakdown")
    else:
        handle, ws_numel = h
        with torch.no_grad():
            out, lse = at._fast_forward(eg, qg, kg, vg)
        dq, dk, dv = (torch.empty_like(t) for t in (qg, kg, vg))
        ws = torch.empty(ws_numel, dtype=torch.uint8, device=q.device)
        stream = at._raw_stream(eg.index)
        (qs, qt), (ks, kt), (vs, vt) = eg.grads
        parts = [
            ("_fast_backward (the autograd node's body)", lambda: at._fast_backward(eg, dout, qg, kg, vg, out, lse)),
            ("three torch.empty_strided (dQ, dK, dV)", lambda: (
                at._empty_strided(qs, qt, dtype=eg.dtype, device=eg.device),
                at._empty_strided(ks, kt, dtype=eg.dtype, device=eg.device),
                at._empty_strided(vs, vt, dtype=eg.dtype, device=eg.device))),
            (f"workspace torch.empty ({ws_numel} bytes)", lambda: at._empty(ws_numel, dtype=at._U8, device=eg.device)),
            ("Rust launch alone (BwdLaunch.run)", lambda: handle.run(
                qg.data_ptr(), kg.data_ptr(), vg.data_ptr(), out.data_ptr(), dout.data_ptr(), dq.data_ptr(),
                dk.data_ptr(), dv.data_ptr(), lse.data_ptr(), ws.data_ptr(), stream)),
        ]
        print(f"breakdown of the fast path's backward ({handle.spec}, producer {handle.producer}):")
        for name, fn in parts:
            host, _ = per_call(fn)
            print(f"  {name:45s} {host:8.2f} us")
    if "--profile" in sys.argv:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            at.scaled_dot_product_attention(q, k, v, is_causal=True)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        train = step(at.scaled_dot_product_attention)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            train()
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
