"""attnforge: specialized attention kernels compiled at run time, and a
dispatcher that picks a forward and a backward backend per problem.

Without torch (and without a GPU) this package explains decisions::

    >>> import attnforge
    >>> attnforge.explain(dtype="bf16", head_dim=128, causal=True, requires_grad=True)

The PyTorch front end is :mod:`attnforge.torch` (``scaled_dot_product_attention``,
``varlen_attention``, the ``attnforge::sdpa_fwd/sdpa_bwd`` custom ops and
``intercept()``).

Policy: ``ATTNFORGE_BACKEND_FWD`` / ``ATTNFORGE_BACKEND_BWD`` (comma lists of
``generated``, ``torch-flash``, ``torch-cudnn``), ``ATTNFORGE_DEBUG=1`` (one
stderr line per distinct decision), ``ATTNFORGE_GENERATED_PATH=sm80`` (the
generated kernels on the sm80 instruction path on Hopper too), or
:func:`set_policy`.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

from . import _core
from ._problem import problem_from_kwargs

__version__ = _core.__version__

__all__ = [
    "explain",
    "explanation",
    "decide",
    "backends",
    "set_policy",
    "policy",
    "__version__",
]


def _as_problem(problem: Optional[Dict[str, Any]], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    if problem is not None and kwargs:
        raise TypeError("pass either a problem dict or keyword arguments, not both")
    if problem is not None:
        if not isinstance(problem, dict):
            raise TypeError(f"problem must be a dict, got {type(problem).__name__}")
        return problem
    return problem_from_kwargs(**kwargs)


def explanation(problem: Optional[Dict[str, Any]] = None, /, **kwargs: Any) -> str:
    """The dispatcher's explanation of a problem, as text (no GPU needed).

    Either a problem dict with the core's field names (see
    :mod:`attnforge._problem`) or the CLI-style keywords: ``dtype``,
    ``head_dim``, ``head_dim_v``, ``batch``, ``heads``, ``kv_heads``,
    ``seqlen_q``, ``seqlen_k``, ``causal`` (``True``/``"top-left"``/
    ``"bottom-right"``), ``window=(left, right)``, ``softcap``, ``scale``,
    ``dropout``, ``attn_mask``, ``layout`` (``"dense"``/``"thd"``), ``arch``
    (``"sm80"``, ``"sm90a"``, ``"9.0"``), ``requires_grad``, ``deterministic``.
    """
    p = _as_problem(problem, kwargs)
    return f"available {', '.join(_core.backends())}\npolicy    {_core.policy()}\n" + _core.explain(p)


def explain(problem: Optional[Dict[str, Any]] = None, /, *, file: Any = None, **kwargs: Any) -> None:
    """Print :func:`explanation` (to ``file``, default stdout)."""
    print(explanation(problem, **kwargs), end="", file=file if file is not None else sys.stdout)


def decide(problem: Optional[Dict[str, Any]] = None, /, **kwargs: Any) -> Tuple[Optional[str], Optional[str], Dict[str, Any]]:
    """``(forward backend, backward backend, reasons)`` for a problem.

    A name is ``None`` when no backend supports that direction; ``reasons``
    then holds the error under ``"fwd"``/``"bwd"``; ``"fwd_spec"``/``"bwd_spec"``
    name the generated kernel when it is chosen; ``"summary"`` is one line.
    """
    return _core.decide(_as_problem(problem, kwargs))


def backends() -> list:
    """The registered backends: ``generated``, ``torch-flash``, ``torch-cudnn``."""
    return list(_core.backends())


def set_policy(fwd: Optional[str] = None, bwd: Optional[str] = None, debug: bool = False,
               generated_path: Optional[str] = None) -> None:
    """Restrict and order the backends per direction (comma lists; ``None`` or
    ``"auto"`` = the default ranking). ``generated_path``: ``"planner"`` (the
    default: the planner's template for the device) or ``"sm80"`` (the
    generated kernels on the sm80 instruction path, ``mma.sync``, on Hopper
    too; for comparing the paths). Replaces the environment's policy."""
    _core.set_policy(fwd, bwd, debug, generated_path)


def policy() -> str:
    """The policy in effect, e.g. ``"fwd=auto bwd=torch-flash (policy)"``."""
    return _core.policy()
