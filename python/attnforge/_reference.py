"""Attention in plain torch math: the CPU implementation of the
``attnforge::sdpa_fwd/sdpa_bwd`` ops (so the front end, ``opcheck`` and
``torch.compile`` work on CPU) and a reference for tests.

Semantics are the kernels' (``templates/common/mask.cuh``, ``src/reference.rs``):

- scores ``s = scale · q·kᵀ``; with softcap ``c > 0``: ``c · tanh(s / c)``;
- masks on query row ``i`` of a sequence with ``sq`` queries and ``sk`` keys,
  ``diag = i + sk - sq``: causal top-left ``j <= i``; causal bottom-right
  ``j <= diag``; window ``(l, r)``: ``diag - l <= j <= diag + r`` (``-1`` =
  unbounded side);
- GQA: query head ``h`` reads key/value head ``h // (heads_q / heads_kv)``;
- LSE is natural log; a row that sees no key has LSE ``-inf`` and O = 0
  (where torch's math SDPA gives NaN);
- the backward reads the forward's LSE (float32), except for float64
  inputs, where it recomputes it to stay exact to float64.

Dense tensors are BHSD ``[B, H, S, D]``; ragged (THD) tensors ``[T, H, D]``
with int32 ``cu_seqlens``. Computation runs in float64 for float64 inputs and
float32 otherwise.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def visible(mask: str, window: Tuple[int, int], sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """Bool ``[sq, sk]``: which keys each query row sees."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    diag = i + (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if mask == "causal-tl":
        ok = j <= i
    elif mask == "causal-br":
        ok = j <= diag
    elif mask == "window":
        if window[0] >= 0:
            ok = ok & (j >= diag - window[0])
        if window[1] >= 0:
            ok = ok & (j <= diag + window[1])
    elif mask != "none":
        raise ValueError(f"unknown mask {mask!r}")
    return ok


def _expand_kv(t: torch.Tensor, heads_q: int) -> torch.Tensor:
    """[..., Hkv, S, D] -> [..., Hq, S, D] (GQA: each kv head serves a group)."""
    hkv = t.shape[-3]
    if hkv == heads_q:
        return t
    return t.repeat_interleave(heads_q // hkv, dim=-3)


def _fold_kv(g: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """[Hq, S, D] -> [Hkv, S, D]: sum the gradients of each group."""
    hq = g.shape[-3]
    if hq == heads_kv:
        return g
    return g.unflatten(-3, (heads_kv, hq // heads_kv)).sum(dim=-3)


def _scores(q, k, scale, softcap):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0.0:
        t = torch.tanh(s / softcap)
        return softcap * t, t
    return s, None


def _fwd_seq(q, k, v, scale, mask, window, softcap):
    """One sequence (or a dense batch): q [.., Hq, sq, d], k/v [.., Hkv, sk, d]."""
    hq, sq, sk = q.shape[-3], q.shape[-2], k.shape[-2]
    k = _expand_kv(k, hq)
    v = _expand_kv(v, hq)
    s, _ = _scores(q, k, scale, softcap)
    ok = visible(mask, window, sq, sk, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1))
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))
    return torch.matmul(p, v), lse


def _bwd_seq(do, q, k, v, o, lse, scale, mask, window, softcap):
    hq, hkv, sq, sk = q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2]
    ke = _expand_kv(k, hq)
    ve = _expand_kv(v, hq)
    s, t = _scores(q, ke, scale, softcap)
    ok = visible(mask, window, sq, sk, q.device)
    if q.dtype == torch.float64:
        # The context's LSE is float32; a float64 reference recomputes it
        # so that its gradients are exact to float64.
        lse = torch.logsumexp(s.masked_fill(~ok, float("-inf")), dim=-1)
    finite = torch.isfinite(lse).unsqueeze(-1)
    p = torch.exp(s - torch.where(finite, lse.unsqueeze(-1), torch.zeros_like(lse.unsqueeze(-1))))
    p = torch.where(ok & finite, p, torch.zeros_like(p))
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, ve.transpose(-1, -2))
    dsum = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - dsum)
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = torch.matmul(ds, ke) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    return dq, _fold_kv(dk, hkv), _fold_kv(dv, hkv)


def _bounds(cu: torch.Tensor) -> List[Tuple[int, int]]:
    c = [int(x) for x in cu.tolist()]
    return list(zip(c[:-1], c[1:]))


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    scale: float,
    mask: str,
    window: Tuple[int, int],
    softcap: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O in the compute dtype, LSE float32): dense O ``[B, H, Sq, Dv]``,
    LSE ``[B, H, Sq]``; THD O ``[Tq, H, Dv]``, LSE ``[H, Tq]``."""
    cd = _compute_dtype(q.dtype)
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    if cu_seqlens_q is None:
        o, lse = _fwd_seq(q, k, v, scale, mask, window, softcap)
        return o, lse.to(torch.float32)
    tq, hq = q.shape[0], q.shape[1]
    o = torch.zeros(tq, hq, v.shape[-1], dtype=cd, device=q.device)
    lse = torch.full((hq, tq), float("-inf"), dtype=torch.float32, device=q.device)
    for (a, b), (c, d) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k)):
        if b == a:
            continue
        qs, ks, vs = (x.transpose(0, 1) for x in (q[a:b], k[c:d], v[c:d]))
        if d == c:
            continue  # no keys: O = 0, LSE = -inf
        os_, ls = _fwd_seq(qs, ks, vs, scale, mask, window, softcap)
        o[a:b] = os_.transpose(0, 1)
        lse[:, a:b] = ls.to(torch.float32)
    return o, lse


def attention_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    scale: float,
    mask: str,
    window: Tuple[int, int],
    softcap: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the compute dtype, shaped like q, k, v."""
    cd = _compute_dtype(q.dtype)
    do, q, k, v, o = (x.to(cd) for x in (do, q, k, v, o))
    lse = lse.to(cd)
    if cu_seqlens_q is None:
        return _bwd_seq(do, q, k, v, o, lse, scale, mask, window, softcap)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (a, b), (c, d) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k)):
        if b == a or d == c:
            continue
        tr = lambda x: x.transpose(0, 1)  # noqa: E731
        g = _bwd_seq(tr(do[a:b]), tr(q[a:b]), tr(k[c:d]), tr(v[c:d]), tr(o[a:b]), lse[:, a:b], scale, mask, window, softcap)
        dq[a:b] = tr(g[0])
        dk[c:d] = tr(g[1])
        dv[c:d] = tr(g[2])
    return dq, dk, dv
