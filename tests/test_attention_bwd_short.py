"""The one-launch backward of short calls (``attention_bwd._bwd_short_kernel``): gradients against the
float64 reference, which calls take it (and which the three launches), and its bound launch."""
import pytest
import torch

from bound_launch import InterpretedLaunch
from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only, rel_err
from flashattn_lite import attention
from flashattn_lite.ops import attention_bwd as bwd
from flashattn_lite.ops.attention import attention_core
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_RANGES, Variant, head_tiles
from flashattn_lite.reference import attention_reference
from test_attention import EPS, make_qkv, shape_id

THREE = ["_bwd_preprocess", "_bwd_dkdv_kernel", "_bwd_dq_kernel"]
SHORT = ["_bwd_short_kernel"]
# (B, Hq, Hkv, Nq, Nk, D, Dv): odd lengths, Nq ≠ Nk both ways, GQA and MQA, Dv ≠ D, each key tile
# (16, 32, 64). Head dims of 16/32 keep fp32 within the short kernel's register budget too.
SHAPES = [
    (1, 1, 1, 1, 1, 16, 16),
    (2, 4, 2, 5, 17, 16, 32),
    (1, 4, 1, 33, 5, 16, 16),    # causal: the first 28 rows see no key
    (1, 2, 2, 17, 64, 16, 16),
    (1, 2, 1, 64, 33, 16, 16),
]


@pytest.fixture
def launches(monkeypatch):
    """Names of the backward kernels launched through their launchers, in order (a bound launch
    goes around them). A fresh bound-launch cache, so that a call launches."""
    names = []
    for kernel in (bwd._bwd_preprocess, bwd._bwd_dkdv_kernel, bwd._bwd_dq_kernel, bwd._bwd_short_kernel):
        def spy(grid, args, kwargs, launch=kernel.launch, name=kernel.name):
            names.append(name)
            return launch(grid, args, kwargs)
        monkeypatch.setattr(kernel, "launch", spy)
    monkeypatch.setattr(bwd, "_BOUND", {})
    return names


def reference_grads(q, k, v, outputs_grads, work_dtype, **kw):
    """Gradients of (o, lse) (weighted by ``outputs_grads``; lse's may be None) in ``work_dtype``."""
    leaves = [t.detach().to(work_dtype).requires_grad_() for t in (q, k, v)]
    o, lse = attention_reference(*leaves, dtype=work_dtype, **kw)
    do, dlse = outputs_grads
    if dlse is None:
        return torch.autograd.grad(o, leaves, do.to(work_dtype))
    return torch.autograd.grad((o, lse), leaves, (do.to(work_dtype), dlse.to(work_dtype)))


def check_grads(ours, q, k, v, outputs_grads, dtype, **kw):
    ref = reference_grads(q, k, v, outputs_grads, torch.float64, **kw)
    same = reference_grads(q, k, v, outputs_grads, dtype, **kw)
    for name, a, s, r in zip(("dq", "dk", "dv"), ours, same, ref):
        assert a.shape == r.shape and a.dtype == dtype
        assert_close_to_ref(a, s, r, eps=2 * EPS[dtype], what=name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(shape=SHAPES[1:2])  # fp32: CUDA-core dots, slow compiles; GQA with Dv ≠ D covers its code
def test_short_backward_matches_the_reference(shape, dtype, causal, launches):
    q, k, v = make_qkv(shape, dtype, requires_grad=True, seed=1)
    o = attention(q, k, v, causal=causal)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert launches == SHORT
    check_grads(grads, q, k, v, (do, None), dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_without_keys_get_zero_gradients(dtype, launches):
    # Causal with Nq > Nk, bottom-right: rows 0 … Nq − Nk − 1 see no key (lse = −inf): P = 0, their dQ
    # rows exact zeros, no NaN anywhere, with the lse's own gradient too.
    q, k, v = make_qkv((1, 4, 2, 33, 5, 16, 16), dtype, requires_grad=True, seed=2)
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    do, dlse = torch.randn_like(o), torch.randn_like(lse)
    grads = torch.autograd.grad((o, lse), (q, k, v), (do, dlse))
    assert launches == SHORT
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][:, :, :28] == 0).all()
    check_grads(grads, q, k, v, (do, dlse), dtype, causal=True)


def _slopes(hq):
    return (torch.rand(hq, generator=torch.Generator().manual_seed(5)) * 0.3).to(DEVICE)


# (name, options of attention_core): any diagonal, windows, softcap and ALiBi, each with the lse's gradient.
OPTION_CASES = [
    ("offset-below", dict(causal=True, causal_offset=-4)),   # rows 0 … 3 see no key
    ("offset-above", dict(causal=True, causal_offset=9)),
    ("window", dict(window=(3, 2))),
    ("softcap-alibi-causal-window", dict(causal=True, window=(6, None), softcap=3.0, alibi_slopes="h")),
]


@pytest.mark.parametrize("case", OPTION_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(case=OPTION_CASES[-1:])  # fp32: every option's code at once
def test_options_and_the_lse_gradient(dtype, case, launches):
    _, opts = case
    q, k, v = make_qkv((2, 4, 2, 17, 20, 16, 16), dtype, requires_grad=True, seed=3)
    opts = dict(opts)
    if opts.get("alibi_slopes") == "h":
        opts["alibi_slopes"] = _slopes(q.shape[1])
    o, lse = attention_core(q, k, v, return_lse=True, **opts)
    do, dlse = torch.randn_like(o), torch.randn_like(lse)
    grads = torch.autograd.grad((o, lse), (q, k, v), (do, dlse))
    assert launches == SHORT
    check_grads(grads, q, k, v, (do, dlse), dtype, **opts)


def test_strided_inputs_and_an_expanded_output_gradient(launches):
    # (B, N, H, D) storage read in place, and o.sum()'s dO with stride 0 everywhere.
    q, k, v = make_qkv((2, 4, 2, 19, 23, 16, 16), torch.float32, requires_grad=True, seed=4, layout="bnhd")
    assert not q.is_contiguous()
    o = attention(q, k, v, causal=True)
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    assert launches == SHORT
    check_grads(grads, q, k, v, (torch.ones_like(o), None), torch.float32, causal=True)


def test_the_same_gradients_as_the_three_launches(monkeypatch, launches):
    # The same call with the short path switched off: the three kernels' gradients, to rounding
    # (fp32 in the interpreter; fp16 on the GPU, where fp32 kernels compile slowly).
    dtype = torch.float16 if ON_GPU else torch.float32
    q, k, v = make_qkv((1, 4, 2, 21, 30, 16, 32), dtype, requires_grad=True, seed=6)
    opts = dict(causal=True, window=(9, None), softcap=5.0, alibi_slopes=_slopes(4))
    o = attention(q, k, v, **opts)
    do = torch.randn_like(o)
    short = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    monkeypatch.setattr(bwd, "SHORT_MAX_N", 0)
    bwd._BOUND.clear()  # (the first call's bound short launch would take the same call again)
    three = torch.autograd.grad(o, (q, k, v), do)
    assert launches == SHORT + THREE
    for a, b in zip(short, three):
        assert rel_err(a, b) < (2e-3 if ON_GPU else 1e-5)


@pytest.mark.parametrize("n_k, kernels", [(bwd.SHORT_MAX_N, SHORT), (bwd.SHORT_MAX_N + 1, THREE)])
def test_keys_past_one_tile_take_the_three_launches(n_k, kernels, launches):
    q, k, v = make_qkv((1, 2, 1, 3, n_k, 16, 16), torch.float16, requires_grad=True, seed=7)
    o = attention(q, k, v, causal=True)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert launches == kernels
    check_grads(grads, q, k, v, (do, None), torch.float16, causal=True)


def test_which_calls_the_short_kernel_takes():
    """Masks, dropout, sinks and padded or packed batches take the three launches (the sinks'
    gradient needs δ in memory); so do head dims whose dK, dV tiles pass the register budget, and
    calls with many queries."""
    d16 = head_tiles(16, 16)
    assert bwd._short_config(PLAIN, None, 0.0, 8, 1, *d16, 2) == (16, 4)
    assert bwd._short_config(Variant(left=3, right=0, softcap=2.0, alibi=torch.ones(2)), None, 0.0, 8, 33, *d16, 2) \
        == (64, 4)
    assert bwd._short_config(PLAIN, None, 0.0, 8, bwd.SHORT_MAX_N + 1, *d16, 2) is None
    assert bwd._short_config(PLAIN, None, 0.0, bwd.SHORT_MAX_NQ, 8, *d16, 2) == (16, 4)
    assert bwd._short_config(PLAIN, None, 0.0, bwd.SHORT_MAX_NQ + 1, 8, *d16, 2) is None  # dQ in parallel
    assert bwd._short_config(PLAIN, torch.ones(1, dtype=torch.bool), 0.0, 8, 8, *d16, 2) is None
    assert bwd._short_config(PLAIN, None, 0.1, 8, 8, *d16, 2) is None
    assert bwd._short_config(Variant(sinks=torch.zeros(2)), None, 0.0, 8, 8, *d16, 2) is None
    assert bwd._short_config(Variant(seq=SEQ_RANGES), None, 0.0, 8, 8, *d16, 2) is None
    # 16-bit: 4 warps, 8 where the accumulators need them, none past that; fp32 on 8 warps, d ≤ 64.
    assert bwd._short_config(PLAIN, None, 0.0, 8, 64, *head_tiles(128, 128), 2) == (64, 8)
    assert bwd._short_config(PLAIN, None, 0.0, 8, 64, *head_tiles(256, 256), 2) is None
    assert bwd._short_config(PLAIN, None, 0.0, 8, 16, *head_tiles(64, 64), 4) == (16, 8)
    assert bwd._short_config(PLAIN, None, 0.0, 8, 17, *head_tiles(64, 64), 4) is None


class _BindableInTheInterpreter:
    """A launcher standing in for itself under the interpreter: it launches as the launcher does,
    and its ``bind`` keeps ``Launcher.bind``'s contract, returning an ``InterpretedLaunch`` that
    logs to ``log`` and declines for the kernel names in ``declines``."""
    enabled = True

    def __init__(self, launcher, log=None, declines=()):
        self.launcher, self.name = launcher, launcher.name
        self.log, self.declines = [] if log is None else log, declines

    def __getitem__(self, grid):
        return self.launcher[grid]

    def bind(self, grid, args, kwargs, n_tensors):
        rest, launcher = args[n_tensors:], self.launcher

        def run(tensors):
            type(launcher).launch(launcher, grid, (*tensors, *rest), kwargs)
        return InterpretedLaunch(launcher.name, run, self.log, self.declines)


@pytest.mark.parametrize("n_k, kernels", [(17, SHORT), (bwd.SHORT_MAX_N + 1, THREE)])
def test_a_repeated_plain_call_takes_its_bound_launches(n_k, kernels, launches, monkeypatch):
    # The first call binds its launches (one for a short call, three past the tile) as one entry;
    # the second launches through them alone, with bit-identical gradients.
    if ON_GPU and not bwd._bwd_dq_kernel.enabled:
        pytest.skip("bound launches are off (FLASHATTN_LITE_FAST_LAUNCH=0)")
    bound = []
    for name in THREE + SHORT:
        kernel = getattr(bwd, name)
        if not ON_GPU:
            kernel = _BindableInTheInterpreter(kernel)
            monkeypatch.setattr(bwd, name, kernel)
        monkeypatch.setattr(kernel, "bind", lambda *a, bind=kernel.bind, name=name: bound.append(name) or bind(*a))
    q, k, v = make_qkv((1, 4, 2, 9, n_k, 16, 16), torch.float16, requires_grad=True, seed=8)
    o = attention(q, k, v, causal=True)
    do = torch.randn_like(o)
    first = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    assert bound == kernels and launches == kernels and len(bwd._BOUND) == 1
    second = torch.autograd.grad(o, (q, k, v), do)
    assert launches == kernels  # nothing more through the launchers
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.skipif(ON_GPU, reason="stand-ins for bound launches under the interpreter (the GPU binds compiled ones)")
@pytest.mark.parametrize("declining", [None, *THREE], ids=lambda n: f"declines-{n or 'none'}")
def test_a_repeated_call_checks_once_and_a_declined_launch_redoes_the_whole_backward(declining, launches,
                                                                                     monkeypatch):
    # The three bound launches: one ready() for all, then each on one stream. Where one declines
    # (dq's, after δ and dK, dV were launched), the call takes the full path: its gradients are the
    # plain path's, bit for bit, and its launches rebind.
    log, declines = [], set()
    for name in THREE:
        monkeypatch.setattr(bwd, name, _BindableInTheInterpreter(getattr(bwd, name), log, declines))
    q, k, v = make_qkv((1, 4, 2, 9, bwd.SHORT_MAX_N + 1, 16, 16), torch.float16, requires_grad=True, seed=9)
    o = attention(q, k, v, causal=True)
    do = torch.randn_like(o)
    plain = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    assert launches == THREE and log == [] and len(bwd._BOUND) == 1
    if declining is not None:
        declines.add(declining)
    again = torch.autograd.grad(o, (q, k, v), do)
    upto = THREE[:THREE.index(declining) + 1] if declining is not None else THREE
    assert log == [("ready", THREE[0])] + [(name, name != declining) for name in upto]
    assert launches == THREE * (1 if declining is None else 2)
    for a, b in zip(plain, again):
        assert torch.equal(a, b)
