"""attnforge GPU benchmark: our generated kernels and the peers, in one run.

Runs on the GPU machine (`make gpu-bench`). Times torch SDPA's flash
(FlashAttention-2) and cuDNN backends over the standard sweep, runs our Rust
timing binary (.gpu/gpu_bench) in the same process tree, and writes
  $OUT/bench.json   every row, ours and peers
  $OUT/bench.md     the table with TFLOP/s and ratios to each peer
  $OUT/bench.png    forward TFLOP/s per config

  usage: gpu_bench.py [--quick] [--peers-only [--tune] [--seqs 2048,8192]]
  --peers-only prints the peers' table alone (the backward tuning loop,
  scripts/bwd_gpu_run.sh); --tune: batch 4 x seqlen 4096 instead of the sweep.
"""
import json, os, subprocess, sys, datetime
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench

out = os.environ.get("OUT") or os.path.join(os.getcwd(), "gpu-results")
os.makedirs(out, exist_ok=True)
quick = "--quick" in sys.argv
dev = torch.device("cuda")
PEERS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def flops(b, h, s, d, causal):
    return 4 * b * h * s * s * d * (0.5 if causal else 1.0)


def configs():
    """(batch, heads, seqlen, d, causal): batch·seqlen = 16k tokens and
    heads·d = 2048 over the standard seqlens; with --peers-only, --tune (batch 4,
    seqlen 4096) or --seqs choose other shapes (ours run the standard ones)."""
    alone = "--peers-only" in sys.argv
    if alone and "--tune" in sys.argv:
        seqs, batch = (4096,), lambda s: 4
    else:
        seqs = (2048, 16384) if quick else (512, 2048, 8192, 16384)
        if alone and "--seqs" in sys.argv:
            seqs = tuple(int(x) for x in sys.argv[sys.argv.index("--seqs") + 1].split(","))
        batch = lambda s: max(1, 16384 // s)
    for d in (64, 128, 256):
        for s in seqs:
            for causal in (False, True):
                yield batch(s), 2048 // d, s, d, causal


def peers():
    rows = []
    for b, h, s, d, causal in configs():
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
        for name, bk in PEERS.items():
            row = {"impl": name, "b": b, "h": h, "s": s, "d": d, "causal": causal}
            try:
                with sdpa_kernel([bk]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fn()
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    do = torch.randn_like(o)
                    bms = do_bench(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True),
                                   warmup=10, rep=50, return_mode="median")
                row.update(fwd_ms=ms, fwd_tflops=flops(b, h, s, d, causal) / ms / 1e9,
                           bwd_ms=bms, bwd_tflops=2.5 * flops(b, h, s, d, causal) / bms / 1e9)
            except Exception as e:  # a peer that cannot run this config says why
                row["error"] = str(e).splitlines()[0][:160]
            rows.append(row)
        del q, k, v
    return rows


def gqa_peers(ours):
    """The peers on our GQA rows (query heads h, kv heads hkv; forward only):
    torch SDPA with enable_gqa, each backend alone."""
    rows = []
    for r in ours:
        if "hkv" not in r:
            continue
        b, h, hkv, s, d, causal = r["b"], r["h"], r["hkv"], r["s"], r["d"], r["causal"]
        q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        for name, bk in PEERS.items():
            row = {"impl": name, "b": b, "h": h, "hkv": hkv, "s": s, "d": d, "causal": causal}
            # enable_gqa first; a backend that refuses it runs on K and V
            # expanded to every query head (the same products, more bytes).
            for via in ("enable_gqa", "K/V expanded"):
                try:
                    if via == "enable_gqa":
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                    else:
                        ke, ve = (x.repeat_interleave(h // hkv, dim=1) for x in (k, v))
                        fn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
                    with sdpa_kernel([bk]):
                        fn()
                        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    row.update(fwd_ms=ms, fwd_tflops=flops(b, h, s, d, causal) / ms / 1e9, via=f"GQA {via}")
                    row.pop("error", None)
                    break
                except Exception as e:  # neither route: the row says why
                    row["error"] = f"{via}: " + str(e).splitlines()[0][:160]
            rows.append(row)
        del q, k, v
    return rows


def cudnn_frontend_ragged(q, k, v, lens, causal):
    """cuDNN's own ragged (THD) forward through the cudnn-frontend Python
    graph API, when the `cudnn` package is importable (scripts/gpu-bench.sh
    installs a carried nvidia-cudnn-frontend wheel from .whl/): Q/K/V/O
    declared as [B, H, S_max, D] with BSHD strides over the packed tokens and
    ragged offsets (elements), a padding mask from per-sequence lengths. The
    graph is built here, outside the timing; returns (the execute call, its
    O), or None (with the reason printed) when the package or the graph is
    missing."""
    try:
        import cudnn
    except Exception as e:  # the package is optional on the GPU machine
        print(f"cudnn-frontend route: not available ({str(e).splitlines()[0][:100]})")
        return None
    try:
        b, (total, h, d), smax = len(lens), q.shape, max(lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int64)
        ro = (cu * h * d).view(b + 1, 1, 1, 1).contiguous()
        seq = torch.tensor(lens, device=dev, dtype=torch.int32).view(b, 1, 1, 1).contiguous()
        o = torch.empty_like(q)
        dims, strides = [b, h, smax, d], [smax * h * d, d, h * d, 1]
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        t = {n: g.tensor(name=n, dim=dims, stride=strides, data_type=cudnn.data_type.BFLOAT16) for n in "qkv"}
        r = {n: g.tensor(name=n + "_ro", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
             for n in "qkvo"}
        for n in "qkv":
            t[n].set_ragged_offset(r[n])
        sq, sk = (g.tensor(name=n, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
                  for n in ("seq_q", "seq_kv"))
        out, _ = g.sdpa(name="sdpa", q=t["q"], k=t["k"], v=t["v"], generate_stats=False,
                        attn_scale=1.0 / d ** 0.5, use_padding_mask=True, seq_len_q=sq, seq_len_kv=sk,
                        use_causal_mask=causal)
        out.set_output(True).set_dim(dims).set_stride(strides).set_ragged_offset(r["o"])
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        ws = torch.empty(max(1, g.get_workspace_size()), device=dev, dtype=torch.uint8)
        pack = {t["q"]: q, t["k"]: k, t["v"]: v, out: o, sq: seq, sk: seq,
                r["q"]: ro, r["k"]: ro, r["v"]: ro, r["o"]: ro}
        return (lambda: g.execute(pack, ws, handle=handle)), o
    except Exception as e:
        print(f"cudnn-frontend route: graph failed ({str(e).splitlines()[0][:160]})")
        return None


def ragged_peer(ours):
    """The peers on the same lengths as our ragged rows: FlashAttention-2 varlen
    through aten, and cuDNN's ragged (THD) path through aten with cumulative
    sequence offsets (what torch's nested-tensor SDPA calls), else through a
    jagged nested tensor with SDPA restricted to cuDNN."""
    rows = []
    for r in ours:
        if "ragged_lens" not in r:
            continue
        lens, h, d, causal = r["ragged_lens"], r["h"], r["d"], r["causal"]
        total, mx = sum(lens), max(lens)
        pairs = sum(l * l * (0.5 if causal else 1.0) for l in lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
        q, k, v = (torch.randn(total, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))

        def cudnn_aten():
            return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, mx, mx, False, 0.0, causal, False)

        def cudnn_njt():
            offs = cu.to(torch.int64)
            nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offs).transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(nq, nk, nv, is_causal=causal)

        fa2 = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, causal, False)
        cudnn_routes = [("aten cum_seq", cudnn_aten), ("jagged nested tensor", cudnn_njt)]
        fe = cudnn_frontend_ragged(q, k, v, lens, causal)
        if fe is not None:
            # A peer figure counts only if the route computes attention: its O
            # against FlashAttention-2 varlen's on the same inputs.
            try:
                run, o_fe = fe
                run()
                torch.cuda.synchronize()
                err = (o_fe.float() - fa2()[0].float()).abs().max().item()
                print(f"cudnn-frontend route d={d} causal={causal}: max |O - O_fa2| = {err:.3e}")
                if err <= 2e-2:
                    cudnn_routes.append(("cudnn-frontend ragged graph", run))
            except Exception as e:
                print(f"cudnn-frontend route: execute failed ({str(e).splitlines()[0][:160]})")
        for impl, fns in (("torch-flash", [("aten varlen", fa2)]), ("torch-cudnn", cudnn_routes)):
            # Every route is timed; the peer's figure is its best route (the
            # aten cum_seq call has run ~100x slower than the dense cuDNN
            # kernel here, so one route alone can understate the peer).
            row = {"impl": impl, "ragged_lens": lens, "h": h, "d": d, "causal": causal, "routes": {}}
            errors = []
            for how, fn in fns:
                try:
                    fn()
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    tf = 4 * pairs * h * d / ms / 1e9
                    row["routes"][how] = round(tf, 1)
                    if tf > row.get("fwd_tflops", 0.0):
                        row.update(fwd_ms=ms, fwd_tflops=tf, via=how)
                except Exception as e:
                    errors.append(f"{how}: {str(e).splitlines()[0][:120]}")
            if errors:
                row["errors"] = "; ".join(errors)
            if "fwd_tflops" not in row:
                row["error"] = "; ".join(errors)
            print(f"ragged peer {impl} d={d} causal={causal}: {row['routes']} {row.get('errors', '')}")
            rows.append(row)
    return rows


def print_peers():
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("| peer | d | batch x heads x seqlen | causal | fwd TFLOP/s | bwd ms | bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for r in peers():
        shape = f"{r['b']} x {r['h']} x {r['s']}"
        if "error" in r:
            print(f"| {r['impl']} | {r['d']} | {shape} | {r['causal']} | error: {r['error'][:100]} | | |")
        else:
            print(f"| {r['impl']} | {r['d']} | {shape} | {'yes' if r['causal'] else 'no'} | {r['fwd_tflops']:.1f} | "
                  f"{r['bwd_ms']:.3f} | {r['bwd_tflops']:.1f} |", flush=True)


def main():
    if "--peers-only" in sys.argv:
        return print_peers()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ours_json = os.path.join(out, "ours.json")
    cmd = [os.path.join(os.path.dirname(__file__), "..", ".gpu", "gpu_bench"), ours_json] + (["--quick"] if quick else [])
    print("running", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    ours = json.load(open(ours_json))
    torch.cuda.empty_cache()
    peer_rows = peers() + ragged_peer(ours) + gqa_peers(ours)
    rows = ours + peer_rows
    meta = {"date": started, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "quick": quick}
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(out, "bench.json"), "w"), indent=1)

    def find(impl, r, field="fwd_tflops"):
        for p in peer_rows:
            if p["impl"] != impl or field not in p:
                continue
            if "ragged_lens" in r:
                if p.get("ragged_lens") == r["ragged_lens"] and p["causal"] == r["causal"] and p["d"] == r["d"]:
                    return p[field]
            elif all(p.get(x) == r.get(x) for x in ("b", "h", "hkv", "s", "d", "causal")):
                return p[field]
        return None

    lines = [f"Forward, bf16, {meta['device']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, measured {started}.",
             "TFLOP/s = 4·b·h·s²·d / time (halved when causal); ratio = ours / peer, same run.", "",
             "attnforge = the planner's kernel (template in the last column); sm80 path = the mma.sync template on the same problem.", "",
             "| d | seqlen | batch x heads | causal | attnforge | torch-flash (FA2) | torch-cudnn | vs FA2 | vs cuDNN "
             "| sm80 path | sm80 path vs FA2 | template |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # cuDNN's ragged peer is its own ragged graph (cudnn-frontend): torch's
    # routes to it run ~100x under the dense kernel, so without the wheel the
    # ragged rows have no cuDNN figure rather than a ratio against those.
    fe_missing = False
    for r in ours:
        fa, cd = find("torch-flash", r), find("torch-cudnn", r)
        if "ragged_lens" in r and find("torch-cudnn", r, "via") != "cudnn-frontend ragged graph":
            cd, fe_missing = None, True
        shape = f"ragged {len(r['ragged_lens'])} seqs" if "ragged_lens" in r else f"{r['s']}"
        bh = f"x {r['h']}" if "ragged_lens" in r else f"{r['b']} x {r['h']}"
        if "hkv" in r:
            shape, bh = f"{r['s']} GQA", f"{r['b']} x {r['h']}/{r['hkv']}"
        fmt = lambda x: f"{x:.0f}" if x else "n/a"
        ratio = lambda x, y=r["fwd_tflops"]: f"{y / x:.2f}x" if x and y else "n/a"
        s80 = r.get("fwd_sm80_tflops")
        lines.append(f"| {r['d']} | {shape} | {bh} | {'yes' if r['causal'] else 'no'} | {r['fwd_tflops']:.0f} | "
                     f"{fmt(fa)} | {fmt(cd)} | {ratio(fa)} | {ratio(cd)} | {fmt(s80)} | {ratio(fa, s80)} | "
                     f"{r.get('template', '')} |")
    lines += ["", f"Backward (dQ, dK, dV; FLOPs = 2.5 x forward), same run. attnforge: fast mode, including its preprocess and dQ convert kernels.", "",
              "attnforge = the planner's backward (template in the last column); sm80 path = bwd_sm80.cu on the same problem, where the planner took the wgmma backward.", "",
              "| d | seqlen | batch x heads | causal | attnforge | torch-flash (FA2) | torch-cudnn | vs FA2 | vs cuDNN | sm80 path | sm80 path vs FA2 | sm80 path vs cuDNN | template |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ours:
        if "bwd_tflops" not in r:
            continue
        fa, cd = find("torch-flash", r, "bwd_tflops"), find("torch-cudnn", r, "bwd_tflops")
        fmt = lambda x: f"{x:.0f}" if x else "n/a"
        ratio = lambda x, y=r["bwd_tflops"]: f"{y / x:.2f}x" if x and y else "n/a"
        w = r.get("bwd_sm80_tflops")
        lines.append(f"| {r['d']} | {r['s']} | {r['b']} x {r['h']} | {'yes' if r['causal'] else 'no'} | {r['bwd_tflops']:.0f} | "
                     f"{fmt(fa)} | {fmt(cd)} | {ratio(fa)} | {ratio(cd)} | {fmt(w)} | {ratio(fa, w)} | {ratio(cd, w)} | "
                     f"{r.get('bwd_template', '')} |")
    if fe_missing:
        lines.append("\nragged rows: no cuDNN figure (cuDNN's ragged graph did not run: no cudnn-frontend wheel in "
                     ".whl/, or its output disagreed with FlashAttention-2's; torch's routes are listed below)")
    vias = sorted({f"{p['impl']} via {p['via']}" for p in peer_rows if "via" in p and "ragged_lens" in p})
    if vias:
        lines.append("\nragged peers (each the best of its routes): " + ", ".join(vias))
    gqa_vias = sorted({f"{p['impl']} via {p['via']}" for p in peer_rows if "via" in p and "hkv" in p})
    if gqa_vias:
        lines.append("\nGQA peers: " + ", ".join(gqa_vias))
    for p in peer_rows:
        if len(p.get("routes", {})) > 1:
            lines.append(f"- {p['impl']} d{p['d']} {'causal' if p['causal'] else 'non-causal'}: "
                         + ", ".join(f"{k} {v} TFLOP/s" for k, v in p["routes"].items()))
    errs = [p for p in peer_rows if "error" in p]
    for p in errs:
        what = "ragged" if "ragged_lens" in p else f"{p.get('s')}" + (f" GQA {p['h']}/{p['hkv']}" if "hkv" in p else "")
        lines.append(f"\npeer {p['impl']} d{p['d']} {what}: {p['error']}")
    table = "\n".join(lines)
    open(os.path.join(out, "bench.md"), "w").write(table + "\n")
    print(table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        dense = [r for r in ours if "ragged_lens" not in r and "hkv" not in r]
        labels = [f"d{r['d']} s{r['s']}{' c' if r['causal'] else ''}" for r in dense]
        x = range(len(dense))
        fig, ax = plt.subplots(figsize=(max(8, len(dense) * 0.45), 4.5))
        w = 0.27
        ax.bar([i - w for i in x], [r["fwd_tflops"] for r in dense], w, label="attnforge")
        ax.bar(list(x), [find("torch-flash", r) or 0 for r in dense], w, label="torch-flash (FA2)")
        ax.bar([i + w for i in x], [find("torch-cudnn", r) or 0 for r in dense], w, label="torch-cudnn")
        ax.set_xticks(list(x)); ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (bf16 fwd)"); ax.set_title(f"{meta['device']} forward, {started}")
        ax.legend(); fig.tight_layout(); fig.savefig(os.path.join(out, "bench.png"), dpi=110)
    except Exception as e:
        print("plot failed:", e)


if __name__ == "__main__":
    main()
