"""The eager fast path's decision logic on CPU: which calls may take it,
what its cache key distinguishes, what an entry holds for a signature (the
dispatcher's real decisions for a given compute capability, the Rust launch
handle with its checks), and that everything unusual is left to the custom
op. The launches themselves are tested on the GPU (test_gpu.py)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch._subclasses.fake_tensor import FakeTensorMode

import attnforge
import attnforge.torch as at
from attnforge import _core

SM90 = (9, 0)
OURS_FIRST = "generated,torch-cudnn,torch-flash"
BF16 = torch.bfloat16


def bhsd(b=1, h=8, s=128, d=64, dtype=BF16):
    return torch.randn(b, h, s, d, dtype=dtype)


def bshd(b=1, h=8, s=128, d=64, dtype=BF16):
    return torch.randn(b, s, h, d, dtype=dtype).transpose(1, 2)


def reason(q, k=None, v=None, attn_mask=None, dropout_p=0.0):
    return at._why_not_fast(q, q if k is None else k, q if v is None else v, attn_mask, dropout_p)


# --- which calls may take the fast path ----------------------------------------------------------


def test_plain_cpu_tensors_are_turned_away_only_by_the_device():
    # Every other condition holds for plain 4-D tensors: the device check is the last one.
    assert reason(bhsd()) == "not on a CUDA device"
    assert reason(bshd()) == "not on a CUDA device"


def test_masks_dropout_and_ranks_take_the_custom_op_path():
    q = bhsd()
    assert reason(q, attn_mask=torch.zeros(128, 128)).startswith("attn_mask")
    assert reason(q, dropout_p=0.1).startswith("dropout")
    assert reason(q[0]) == "not 4-D (BHSD)"
    assert reason(q.unsqueeze(0)) == "not 4-D (BHSD)"


class Sub(torch.Tensor):
    pass


def test_subclasses_parameters_and_fake_tensors_take_the_custom_op_path():
    q = bhsd()
    assert reason(q.as_subclass(Sub)).startswith("not plain tensors")
    assert reason(q, k=torch.nn.Parameter(q.clone())).startswith("not plain tensors")
    assert reason(q, v="not a tensor").startswith("not plain tensors")
    with FakeTensorMode() as mode:
        fq = mode.from_tensor(q)
        assert reason(fq).startswith("not plain tensors")
        # Real tensors while a fake mode is active: the mode is seen.
        assert reason(q) == "a TorchDispatchMode is active"


class PassFunction(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class PassDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_active_modes_take_the_custom_op_path():
    q = bhsd()
    with PassFunction():
        assert reason(q) == "a TorchFunctionMode is active"
    with PassDispatch():
        assert reason(q) == "a TorchDispatchMode is active"
    assert reason(q) == "not on a CUDA device"


def test_functorch_transforms_take_the_custom_op_path():
    seen = []

    def f(x):
        seen.append(reason(x.unsqueeze(0)))
        return x

    torch.vmap(f)(torch.randn(2, 8, 16, 64))
    torch.func.grad(lambda x: (f(x) ** 2).sum())(torch.randn(8, 16, 64))
    assert seen == ["a functorch transform (vmap, grad, jvp, functionalize) is active"] * 2


def test_compiled_code_takes_the_custom_op_path():
    seen = []

    def f(q):
        seen.append(at._why_not_fast(q, q, q, None, 0.0))
        return q + 1

    torch.compile(f, backend="eager", fullgraph=True)(bhsd(s=16))
    assert seen and seen[0].startswith("tracing/compiling"), seen
    f(bhsd(s=16))
    assert seen[-1] == "not on a CUDA device"


# --- the cache key -----------------------------------------------------------------------------


def key(q, k=None, v=None, is_causal=True, scale=None, enable_gqa=False, grad=False):
    return at._fast_key(q, q if k is None else k, q if v is None else v, is_causal, scale, enable_gqa, grad)


def test_key_is_the_signature_not_the_tensor():
    assert key(bhsd()) == key(bhsd())
    assert hash(key(bhsd())) == hash(key(bhsd()))


def test_key_distinguishes_what_changes_the_entry():
    base = key(bhsd())
    different = {
        "strides (BSHD view, same shape)": key(bshd()),
        "dtype": key(bhsd(dtype=torch.float16)),
        "shape": key(bhsd(s=256)),
        "head dim": key(bhsd(d=128)),
        "k shape": key(bhsd(), k=bhsd(h=2)),
        "scale given": key(bhsd(), scale=0.125),
        "not causal": key(bhsd(), is_causal=False),
        "enable_gqa": key(bhsd(), enable_gqa=True),
        "grad needed": key(bhsd(), grad=True),
    }
    for what, k in different.items():
        assert k != base, what
    assert key(bhsd(), scale=0.125) != key(bhsd(), scale=0.25)
    assert len(set(different.values())) == len(different)


def test_key_follows_deterministic_mode_and_policy_changes():
    q = bhsd()
    before = key(q)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert key(q) != before
    finally:
        torch.use_deterministic_algorithms(False)
    assert key(q) == before
    epoch = _core.policy_epoch()
    attnforge.set_policy(fwd="torch-flash")
    assert _core.policy_epoch() == epoch + 1
    assert key(q) != before


# --- what an entry holds ----------------------------------------------------------------------


def plan(q, k=None, v=None, is_causal=True, scale=None, enable_gqa=False, grad=False, det=False):
    return at._fast_plan(q, q if k is None else k, q if v is None else v, is_causal, scale, enable_gqa, grad, det,
                         SM90, 0)


@pytest.mark.parametrize("make, want", [
    (bhsd, lambda dv: (8 * 128 * dv, 128 * dv, dv, 1)),  # O laid out BHSD like q
    (bshd, lambda dv: (128 * 8 * dv, dv, 8 * dv, 1)),    # ... and BSHD like q
])
@pytest.mark.parametrize("dv", [64, 32])
def test_output_layout_follows_q(make, want, dv):
    # One rule (_like_layout) for the custom op, its fake kernel and the fast path.
    q = make()
    assert at._like_layout(tuple(q.shape), q.stride(), dv) == ((1, 8, 128, dv), want(dv))
    o = at._alloc_like(q, dv)
    assert (tuple(o.shape), o.stride()) == ((1, 8, 128, dv), want(dv))
    # Size-1 dims and ties: the stable order (stride, then dim index).
    q1 = torch.randn(1, 1, 5, 64).transpose(1, 2)
    assert at._like_layout(tuple(q1.shape), q1.stride(), 64) == ((1, 5, 1, 64), (320, 64, 320, 1))


def test_entry_for_the_generated_forward_holds_a_launch_handle():
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    q = bshd()
    e = plan(q)
    assert e is not None and e.fwd == "generated"
    assert e.handle.spec == "fwd.bf16.d64.causal-tl.dense.sm90a"
    assert not e.handle.loaded
    assert e.out == (tuple(q.shape), at._alloc_like(q, 64).stride())
    # O by torch.empty_like(q) where that gives O's layout, checked by a probe.
    assert e.out_like_q and at._fast_out(e, q).stride() == e.out[1]
    assert e.lse == ((1, 8, 128), (8 * 128, 128, 1))
    assert e.scale == pytest.approx(1 / 8) and e.scale_arg == 0.0
    assert e.prob == at._problem(q, q, q, None, None, 128, 128, 1 / 8, "causal-tl", (-1, -1), 0.0, False, False,
                                 SM90)
    # The forward named by the entry is the core's decision for the call.
    assert _core.decide(e.prob)[0] == "generated"


@pytest.mark.parametrize("q, dv, like", [
    (bhsd(), 64, True),   # dense: empty_like keeps q's strides
    (bshd(), 64, True),
    # A slice of packed qkv (gaps between rows): empty_like packs it in q's order, as O is.
    (torch.randn(1, 128, 3, 8, 64, dtype=BF16)[:, :, 0].transpose(1, 2), 64, True),
    (bhsd(d=192), 128, False),  # d_v != d_qk: O is not shaped like q
])
def test_output_allocation_matches_the_entry_layout(q, dv, like):
    v = torch.randn(*q.shape[:-1], dv, dtype=BF16)
    e = plan(q, q.clone(), v, is_causal=False)
    assert e is not None and e.out_like_q == like
    if like:  # (otherwise O comes from torch.empty_strided on the entry's CUDA device)
        out = at._fast_out(e, q)
        assert (tuple(out.shape), out.stride()) == e.out and out.dtype == q.dtype


def test_entry_for_a_torch_forward_has_no_handle():
    attnforge.set_policy(fwd="torch-flash", bwd=OURS_FIRST)
    e = plan(bhsd(), grad=True)
    assert e.fwd == "torch-flash" and e.handle is None
    assert e.grads == tuple(at._like_layout((1, 8, 128, 64), bhsd().stride(), 64) for _ in range(3))


def test_what_the_custom_op_path_refuses_or_copies_gets_no_entry():
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    q = bhsd()
    assert plan(q, k=bhsd(h=2), v=bhsd(h=2)) is None, "GQA without enable_gqa"
    assert plan(q, k=bhsd(h=2), v=bhsd(h=2), enable_gqa=True).fwd == "generated"
    assert plan(bhsd(dtype=torch.float32)) is None, "dtype"
    assert plan(bhsd(d=100)) is None, "no backend for head dim 100"
    assert plan(q, k=bhsd(s=0), v=bhsd(s=0)) is None, "no keys"
    assert plan(bhsd(s=0)) is None, "empty"
    assert plan(q, scale=-1.0) is None, "bad scale"
    odd = torch.randn(1, 8, 128, 68, dtype=BF16)[..., :64]  # row stride 68: copied by the custom-op path
    assert plan(odd) is None
    assert plan(q, k=q.transpose(2, 3)) is None, "k head dim not contiguous"
    # A broadcast (stride 0) over several heads: the sm90a forward's TMA cannot read it in place.
    wide = bhsd(h=1).expand(1, 8, 128, 64)
    assert plan(q, k=wide, v=wide) is None, "broadcast heads are copied by the custom-op path"
    assert at._kernel_ready(wide).stride() == (8 * 128 * 64, 128 * 64, 64, 1)
    # Grad needed and no backward anywhere: refused (the custom-op path names why).
    attnforge.set_policy(fwd=OURS_FIRST, bwd="torch-cudnn")
    assert plan(bhsd(d=192), grad=False) is not None
    assert plan(bhsd(d=192), grad=True) is None


# --- the Rust launch handle -------------------------------------------------------------------


def handle(q_strides=(0, 64, 8192), o_strides=(0, 64, 8192)):
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    prob = at._problem(bhsd(), bhsd(), bhsd(), None, None, 128, 128, 0.125, "causal-tl", (-1, -1), 0.0, False, False,
                       SM90)
    return _core.FwdLaunch(prob, q_strides, (0, 64, 8192), (0, 64, 8192), o_strides, 0)


def test_launch_handle_refuses_strides_and_problems_at_construction():
    assert handle().spec == "fwd.bf16.d64.causal-tl.dense.sm90a"
    with pytest.raises(ValueError, match="multiples of 8"):
        handle(q_strides=(0, 68, 8192 + 4))
    with pytest.raises(NotImplementedError, match="head_dim|multiple of 8"):
        prob = at._problem(bhsd(d=100), bhsd(d=100), bhsd(d=100), None, None, 128, 128, 0.1, "none", (-1, -1), 0.0,
                           False, False, SM90)
        _core.FwdLaunch(prob, (0, 104, 13312), (0, 104, 13312), (0, 104, 13312), (0, 104, 13312), 0)
    with pytest.raises(ValueError, match="expected 20"):
        _core.FwdLaunch(("bf16",), (0, 64, 8192), (0, 64, 8192), (0, 64, 8192), (0, 64, 8192), 0)


def test_launch_handle_checks_pointers_before_anything_runs():
    h = handle()
    good = 0x10000
    with pytest.raises(ValueError, match="16-byte aligned"):
        h.run(good + 8, good, good, good, good, 0, 0, 0)
    with pytest.raises(ValueError, match="null pointer"):
        h.run(good, good, good, 0, good, 0, 0, 0)
    with pytest.raises(ValueError, match="LSE"):  # 0 = no LSE wanted (no-grad calls); misaligned is an error
        h.run(good, good, good, good, good + 2, 0, 0, 0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        h.run(good, good, good, good, good, good, good, 0)
    assert not h.loaded


# --- the Rust backward handle -----------------------------------------------------------------

DENSE = (0, 64, 8192)  # (batch, seq, head) strides of a 1x8x128x64 BHSD tensor (batch 1: stride 0)


def bwd_problem(d=64, det=False, q=None):
    q = bhsd(d=d) if q is None else q
    return at._problem(q, q, q, None, None, 128, 128, 0.125, "causal-tl", (-1, -1), 0.0, True, det, SM90)


def bwd_handle(prob=None, producer="generated", strides=(DENSE,) * 8):
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    return _core.BwdLaunch(bwd_problem() if prob is None else prob, producer, *strides, 0)


def core_bwd(prob, producer="generated", strides=(DENSE,) * 8):
    """``_core.bwd`` with the same problem, producer and strides and aligned
    stand-in pointers (it refuses before touching the driver)."""
    t = [(0x10000,) + s for s in strides]
    return _core.bwd(prob, producer, *t, 0x20000, 0, 0, 0x30000, 1 << 24, 0, 0)


def test_backward_handle_constructs_without_a_gpu():
    for det in (False, True):
        prob = bwd_problem(det=det)
        for producer in ("generated", "torch-flash", "torch-cudnn"):
            h = bwd_handle(prob, producer)
            assert h.spec == "bwd.bf16.d64.causal-tl.dense" + (".det" if det else "") + ".sm90a"
            assert h.producer == producer
            assert h.workspace_bytes == _core.bwd_workspace_bytes(prob)
            assert not h.loaded
    # Deterministic: Dsum only (f32 [1, 8, 128]); fast mode adds the f32 dQ accumulator.
    assert bwd_handle(bwd_problem(det=True)).workspace_bytes == 4 * 8 * 128
    assert bwd_handle().workspace_bytes > 4 * 8 * 128
    # dO (and every other tensor) strided its own way: BSHD views.
    bshd_s = (0, 8 * 64, 64)
    assert bwd_handle(strides=(bshd_s, DENSE, bshd_s, DENSE, bshd_s, DENSE, DENSE, bshd_s)).spec.startswith("bwd.")


def test_backward_handle_refuses_what_core_bwd_refuses_with_the_same_types():
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    odd = (0, 68, 8192 + 4)
    cases = {
        "dO row stride": (bwd_problem(), "generated", (DENSE,) * 4 + (odd,) + (DENSE,) * 3, ValueError,
                          "`d_o`: strides must be non-negative multiples of 8"),
        "dK row stride": (bwd_problem(), "generated", (DENSE,) * 6 + (odd, DENSE), ValueError, "`dk`"),
        "producer": (bwd_problem(), "flash9", (DENSE,) * 8, ValueError, "unknown producer backend `flash9`"),
        "head dim": (bwd_problem(d=100), "generated", ((0, 104, 13312),) * 8, NotImplementedError,
                     "head_dim|multiple of 8"),
        "problem": (("bf16",), "generated", (DENSE,) * 8, ValueError, "expected 20"),
    }
    for what, (prob, producer, strides, exc, match) in cases.items():
        with pytest.raises(exc, match=match):
            _core.BwdLaunch(prob, producer, *strides, 0)
        with pytest.raises(exc):
            core_bwd(prob, producer, strides)
    # Dropout: the generated backward declines; GQA heads that do not divide: a bad problem.
    q = bhsd()
    drop = list(bwd_problem(q=q))
    drop[16] = 0.1
    gqa = list(bwd_problem(q=q))
    gqa[7] = 3
    for prob, exc in ((tuple(drop), NotImplementedError), (tuple(gqa), ValueError)):
        with pytest.raises(exc):
            _core.BwdLaunch(prob, "generated", *(DENSE,) * 8, 0)
        with pytest.raises(exc):
            core_bwd(prob)


def test_backward_handle_checks_pointers_before_anything_runs():
    h = bwd_handle()
    good = 0x10000
    names = ["q", "k", "v", "o", "d_o", "dq", "dk", "dv"]
    for i, name in enumerate(names):
        ptrs = [good] * 8
        ptrs[i] = 0
        with pytest.raises(ValueError, match=f"`{name}`: null pointer"):
            h.run(*ptrs, good, good, 0)
        ptrs[i] = good + 8
        with pytest.raises(ValueError, match=f"`{name}`: pointer 0x10008 is not 16-byte aligned"):
            h.run(*ptrs, good, good, 0)
    with pytest.raises(ValueError, match="`lse`"):
        h.run(*[good] * 8, 0, good, 0)
    with pytest.raises(ValueError, match="`workspace`"):
        h.run(*[good] * 8, good, 0, 0)
    with pytest.raises(ValueError, match="`workspace`"):
        h.run(*[good] * 8, good, good + 8, 0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        h.run(*[good] * 8, good, good, 0, cu_seqlens_q=good, cu_seqlens_k=good)
    assert not h.loaded


def test_backward_handle_takes_ragged_problems_with_cu_seqlens():
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    t = torch.randn(300, 8, 64, dtype=BF16)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    prob = at._problem(t, t, t, cu, cu, 200, 200, 0.125, "causal-br", (-1, -1), 0.0, True, False, SM90)
    h = _core.BwdLaunch(prob, "generated", *((0, 8 * 64, 64),) * 8, 0)
    assert h.spec == "bwd.bf16.d64.causal-br.thd.sm90a"
    assert h.workspace_bytes == _core.bwd_workspace_bytes(prob)
    with pytest.raises(ValueError, match="cu_seqlens"):
        h.run(*[0x10000] * 10, 0)


# --- which backward a fast-path entry runs ------------------------------------------------------


def grad_entry(q, det=False):
    attnforge.set_policy(fwd=OURS_FIRST, bwd=OURS_FIRST)
    e = plan(q, grad=True, det=det)
    assert e is not None and e.fwd == "generated"
    return e


def like_out(e):
    return torch.empty_strided(e.out[0], e.out[1], dtype=e.dtype)


def test_backward_handle_of_an_entry_follows_the_dout_layout():
    q = bshd()
    e = grad_entry(q)
    prob = bwd_problem(q=q)
    got = at._bwd_launch(e, prob, q, q, q, like_out(e))
    assert got is not None
    h, ws = got
    assert h.spec == "bwd.bf16.d64.causal-tl.dense.sm90a" and h.producer == "generated"
    assert ws == h.workspace_bytes == _core.bwd_workspace_bytes(prob)
    # dO in another layout than O (contiguous BHSD while O is laid out like a BSHD q): a handle of its own.
    assert at._bwd_launch(e, prob, q, q, q, bhsd()) is not None
    # What the kernels cannot read in place: no handle (the executor copies dO).
    g = torch.randn(1, 8, 128, 128, dtype=BF16)
    assert at._bwd_launch(e, prob, q, q, q, g[..., ::2]) is None, "head dim not contiguous"
    assert at._bwd_launch(e, prob, q, q, q, g[..., :64]) is not None, "row stride 128: in place"
    assert at._bwd_launch(e, prob, q, q, q, torch.randn(1, 8, 128, 68, dtype=BF16)[..., :64]) is None, "row stride 68"
    assert at._bwd_launch(e, prob, q, q, q, torch.ones((), dtype=BF16).expand(1, 8, 128, 64)) is None, "broadcast"


def test_fast_backward_picks_the_handle_or_the_executor(monkeypatch):
    # The selection logic on CPU tensors: the launches are recorded, not run.
    q = bhsd()
    e = grad_entry(q)
    e.device = torch.device("cpu")  # the gradients and the workspace are allocated there
    taken = []

    def fast(h, e_, dout, *rest):
        taken.append(("handle", h[0].spec, dout.stride()))
        return rest[-3:]

    def executor(prob, producer, dout, *rest):
        taken.append(("executor", producer, dout.stride()))
        return rest[7:10]  # dq, dk, dv

    monkeypatch.setattr(at, "_bwd_generated_fast", fast)
    monkeypatch.setitem(at._BWD, "generated", executor)
    out, lse = like_out(e), torch.empty(e.lse[0])
    dense = torch.randn(1, 8, 128, 64, dtype=BF16)
    misaligned = torch.randn(1, 8, 128, 72, dtype=BF16)[..., 4:68]  # row stride 72, pointer 8 bytes off
    assert misaligned.data_ptr() % 16 == 8
    strided = torch.randn(1, 8, 128, 128, dtype=BF16)[..., ::2]
    for dout in (dense, dense, misaligned, strided, dense.as_subclass(Sub)):
        dq, dk, dv = at._fast_backward(e, dout, q, q, q, out, lse)
        assert dq.shape == dk.shape == dv.shape == q.shape
    spec = "bwd.bf16.d64.causal-tl.dense.sm90a"
    assert taken == [
        ("handle", spec, dense.stride()),
        ("handle", spec, dense.stride()),
        ("executor", "generated", misaligned.stride()),  # a handle for its strides, but the pointer: per call
        ("executor", "generated", strided.stride()),
        ("executor", "generated", dense.stride()),
    ]
    prob, name, launches = e.bwd[False]
    assert name == "generated" and prob == bwd_problem(q=q)
    assert set(launches) == {dense.stride(), misaligned.stride(), strided.stride()}
    assert launches[strided.stride()] is None
    # Deterministic mode: its own decision and handles.
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        taken.clear()
        at._fast_backward(e, dense, q, q, q, out, lse)
    finally:
        torch.use_deterministic_algorithms(False)
    assert taken == [("handle", spec.replace(".sm90a", ".det.sm90a"), dense.stride())]
    assert set(e.bwd) == {False, True}


def test_fast_backward_by_torch_keeps_its_executor(monkeypatch):
    q = bhsd()
    attnforge.set_policy(fwd=OURS_FIRST, bwd="torch-flash")
    e = plan(q, grad=True)
    e.device = torch.device("cpu")
    taken = []

    def flash(prob, producer, dout, *rest):
        taken.append(("torch-flash", producer))
        return rest[7:10]  # dq, dk, dv

    monkeypatch.setattr(at, "_bwd_generated_fast", lambda *a: taken.append("handle"))
    monkeypatch.setitem(at._BWD, "torch-flash", flash)
    at._fast_backward(e, torch.randn(1, 8, 128, 64, dtype=BF16), q, q, q, like_out(e), torch.empty(e.lse[0]))
    assert taken == [("torch-flash", "generated")]
    assert e.bwd[False][1] == "torch-flash" and e.bwd[False][2] == {}
