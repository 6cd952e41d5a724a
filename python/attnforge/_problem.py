"""Problem descriptions for the Rust core, without torch.

Two forms reach ``attnforge._core``:

- a **dict** with the core's field names (``dtype``, ``head_dim``, ``layout``,
  ``batch``, ``heads_q``, ``heads_kv``, ``seqlen_q``, ``seqlen_k``,
  ``total_q``, ``total_k``, ``mask``, ``window``, ``softcap``, ``scale``,
  ``dropout_p``, ``attn_mask``, ``equal_seqlens``, ``requires_grad``,
  ``deterministic``, ``arch``) for ``explain``/``decide``;
- a flat **tuple** in :data:`FIELDS` order on the hot path (one tuple build
  per call instead of a dict).

:func:`problem_from_kwargs` turns the friendlier keyword arguments of
:func:`attnforge.explain` (the CLI's flag names: ``heads``, ``kv_heads``,
``causal``, ``dropout``, ...) into the dict form.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

#: Field order of the hot-path problem tuple (``_core.PROBLEM_FIELDS``).
FIELDS: Tuple[str, ...] = (
    "dtype",
    "layout",
    "mask",
    "head_dim_qk",
    "head_dim_v",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "total_q",
    "total_k",
    "window_left",
    "window_right",
    "scale",
    "softcap",
    "dropout_p",
    "flags",
    "cc_major",
    "cc_minor",
)

FLAG_ATTN_MASK = 1
FLAG_REQUIRES_GRAD = 2
FLAG_DETERMINISTIC = 4
FLAG_EQUAL_SEQLENS = 8

MASKS = ("none", "causal-tl", "causal-br", "window")


def mask_of(causal: Union[bool, str, None], window: Optional[Tuple[int, int]]) -> Tuple[str, Tuple[int, int]]:
    """The core's mask token and window from ``causal``/``window`` arguments.

    ``causal``: ``False``/``None`` (no mask), ``True`` or ``"top-left"``
    (torch SDPA's ``is_causal``), ``"bottom-right"`` (FlashAttention's).
    ``window``: ``(left, right)`` around the bottom-right diagonal, ``-1`` =
    unbounded; ``(-1, -1)`` or ``None`` = no window. A causal bottom-right
    mask with a window becomes the window ``(left, min(right, 0))``.
    """
    w = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if len(tuple(w)) != 2 or w[0] < -1 or w[1] < -1:
        raise ValueError(f"window must be (left, right) with sizes >= -1 (-1 = unbounded), got {window!r}")
    if causal in (None, False):
        kind = "none"
    elif causal is True or causal in ("top-left", "top_left", "causal-tl", "tl"):
        kind = "causal-tl"
    elif causal in ("bottom-right", "bottom_right", "causal-br", "br"):
        kind = "causal-br"
    else:
        raise ValueError(f"causal must be False, True, 'top-left' or 'bottom-right', got {causal!r}")
    if w == (-1, -1):
        return kind, w
    if kind == "causal-tl":
        raise ValueError(
            "a sliding window is aligned at the bottom-right diagonal; "
            "combine it with causal='bottom-right' (or window=(left, 0) alone)"
        )
    if kind == "causal-br":
        w = (w[0], 0 if w[1] < 0 else min(w[1], 0))
    return "window", w


def dtype_token(dtype: Any) -> str:
    """``torch.bfloat16``, ``"bf16"``, ``"bfloat16"`` ... -> the core's token."""
    s = str(dtype).replace("torch.", "").strip().lower()
    table = {
        "float16": "f16",
        "half": "f16",
        "f16": "f16",
        "fp16": "f16",
        "bfloat16": "bf16",
        "bf16": "bf16",
        "float32": "f32",
        "float": "f32",
        "f32": "f32",
        "fp32": "f32",
    }
    if s not in table:
        raise ValueError(f"dtype {dtype!r}: attnforge's kernels take float16 or bfloat16")
    return table[s]


def problem_from_kwargs(
    *,
    dtype: Any = "bf16",
    head_dim: int = 128,
    head_dim_v: Optional[int] = None,
    batch: int = 1,
    heads: int = 16,
    kv_heads: Optional[int] = None,
    seqlen_q: int = 4096,
    seqlen_k: Optional[int] = None,
    causal: Union[bool, str, None] = False,
    window: Optional[Tuple[int, int]] = None,
    softcap: float = 0.0,
    scale: Optional[float] = None,
    dropout: float = 0.0,
    attn_mask: bool = False,
    layout: str = "dense",
    total_q: Optional[int] = None,
    total_k: Optional[int] = None,
    equal_seqlens: Optional[bool] = None,
    arch: str = "sm90a",
    requires_grad: bool = False,
    deterministic: bool = False,
) -> Dict[str, Any]:
    """The dict form from the CLI-style keyword arguments (see ``attnforge explain --help``)."""
    mask, w = mask_of(causal, window)
    d: Dict[str, Any] = {
        "dtype": dtype_token(dtype),
        "head_dim": int(head_dim),
        "head_dim_v": int(head_dim if head_dim_v is None else head_dim_v),
        "layout": layout,
        "batch": int(batch),
        "heads_q": int(heads),
        "heads_kv": int(heads if kv_heads is None else kv_heads),
        "seqlen_q": int(seqlen_q),
        "seqlen_k": int(seqlen_q if seqlen_k is None else seqlen_k),
        "mask": mask,
        "softcap": float(softcap),
        "dropout_p": float(dropout),
        "attn_mask": bool(attn_mask),
        "requires_grad": bool(requires_grad),
        "deterministic": bool(deterministic),
        "arch": str(arch),
    }
    if mask == "window":
        d["window"] = w
    if scale is not None:
        d["scale"] = float(scale)
    if total_q is not None:
        d["total_q"] = int(total_q)
    if total_k is not None:
        d["total_k"] = int(total_k)
    if equal_seqlens is not None:
        d["equal_seqlens"] = bool(equal_seqlens)
    return d
