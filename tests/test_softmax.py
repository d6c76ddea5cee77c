"""softmax / log_softmax / logsumexp: every strategy against a float64 reference, forward and backward.

Without CUDA the kernels run in the Triton interpreter (shapes kept small); bf16 and long rows run
on the GPU only. Tolerances: err(ours) ≤ 2·err(torch, same dtype) + eps, both against float64.
"""
import importlib.util
from pathlib import Path
from unittest import mock

import pytest
import torch

import flashattn_lite as fl
from flashattn_lite.ops import softmax as sm
from flashattn_lite.reference import dtype_eps

from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only

# The interpreter evaluates exp(-inf), log(0), 0/0 in numpy, which warns; the results are checked.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

OPS = {
    "softmax": (fl.softmax, lambda x, d: torch.softmax(x, d)),
    "log_softmax": (fl.log_softmax, lambda x, d: torch.log_softmax(x, d)),
    "logsumexp": (fl.logsumexp, lambda x, d: torch.logsumexp(x, d)),
}
OP_CODE = {"softmax": sm.SOFTMAX, "log_softmax": sm.LOG_SOFTMAX, "logsumexp": sm.LOGSUMEXP}
STRATEGIES = ["auto", "row", "two_pass", "split"]
DT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def ours(op, x, dim=-1, strategy="auto"):
    return sm._apply(OP_CODE[op], x, dim, strategy=strategy)


def hard_rows(R, N, dtype, seed=0):
    """Rows that stress the (m, ℓ) state: plain, −inf entries, shifted by +1e4, ±1e4 spikes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, N, generator=g) * 3
    if N > 1:
        x[1 % R, 1::3] = float("-inf")
    x[2 % R] += 1e4
    if N > 2:
        x[3 % R, N // 2] = 1e4
        x[3 % R, N - 1] = -1e4
    return x.to(DEVICE, dtype)


def check_forward(op, x, strategy="auto"):
    y = ours(op, x, strategy=strategy)
    ref = OPS[op][1](x.double(), -1)
    same = OPS[op][1](x, -1)
    assert y.dtype == x.dtype and y.shape == ref.shape
    if op == "log_softmax":
        # −inf inputs give −inf log-probabilities: compare them exactly, the rest by error.
        fin = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(y), fin)
        y, ref, same = y[fin], ref[fin], same[fin]
    assert_close_to_ref(y, same, ref, eps=dtype_eps(x.dtype), what=f"{op} forward")


def check_backward(op, x, strategy="auto", dim=-1):
    g = torch.Generator().manual_seed(1)
    x64 = x.double().requires_grad_()
    ref = OPS[op][1](x64, dim)
    dy = torch.randn(ref.shape, generator=g).to(x.device, torch.float64)
    (ref * dy).sum().backward()
    xs = x.clone().requires_grad_()
    (OPS[op][1](xs, dim) * dy.to(x.dtype)).sum().backward()
    xo = x.clone().requires_grad_()
    y = sm._apply(OP_CODE[op], xo, dim, strategy=strategy)
    (y * dy.to(x.dtype)).sum().backward()
    assert xo.grad.dtype == x.dtype
    assert_close_to_ref(xo.grad, xs.grad, x64.grad, eps=dtype_eps(x.dtype), what=f"{op} grad")


# ------------------------------------------------------------------ every strategy, every op

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("N", [1, 7, 1000, 5000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
@pytest.mark.parametrize("op", list(OPS))
def test_forward(op, dtype, N, strategy):
    check_forward(op, hard_rows(4, N, dtype), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("N", [7, 1000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
@pytest.mark.parametrize("op", list(OPS))
def test_backward(op, dtype, N, strategy):
    check_backward(op, hard_rows(4, N, dtype), strategy)


@pytest.mark.parametrize("op", list(OPS))
def test_long_single_row_cpu_sized(op):
    """N = 70000 in one row: split into segments of several chunks each (auto picks split)."""
    x = hard_rows(1, 70000, torch.float32)
    check_forward(op, x)


# ------------------------------------------------------------------ the split kernel's settings

# Passed as the split kernel's ``settings`` on top of the chosen chunk sizes (under the interpreter 256
# elements on 4 warps): every value of every switch in both directions, and every (ticket, sync),
# (sync, pad) and (sync, hold) pair. "chosen" runs each direction's and dtype's own default.
# ``resident`` only caps registers on the GPU (see test_split_layout).
SPLIT_SETTINGS = {
    "chosen": {},
    "relaxed-cflags-pad32-raw": dict(ticket="relaxed", sync="counter_flags", pad=32, hold="raw", resident=5),
    "acq_rel-counter-pad1-f32": dict(ticket="acq_rel", sync="counter", pad=1, hold="f32", resident=0),
    "acq_rel-cflags-pad1-f32": dict(ticket="acq_rel", sync="counter_flags", pad=1, hold="f32", resident=0),
    "relaxed-counter-pad32-raw": dict(ticket="relaxed", sync="counter", pad=32, hold="raw", resident=5),
    "relaxed-cflags-pad32-first": dict(ticket="relaxed", sync="counter_flags", pad=32, hold="first", resident=5),
    "acq_rel-counter-pad1-first": dict(ticket="acq_rel", sync="counter", pad=1, hold="first", resident=2),
    # L2 prefetch of later rows (GPU only: the interpreter runs no inline asm, and drops it).
    "relaxed-cflags-pad32-f32-prefetch": dict(ticket="relaxed", sync="counter_flags", pad=32, hold="f32",
                                              resident=0, prefetch=64, prefetch_after=32),
    "acq_rel-counter-pad1-first-prefetch": dict(ticket="acq_rel", sync="counter", pad=1, hold="first",
                                                resident=2, prefetch=16, prefetch_after=128),
}


@pytest.mark.parametrize("N", [601, 1301], ids=["N601-one-chunk", "N1301-two-chunks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=DT.get)
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "two-launch"])
@pytest.mark.parametrize("name", list(SPLIT_SETTINGS))
def test_split_settings(name, fused, dtype, N, monkeypatch):
    """Each setting of the split kernel is exact: forward (softmax, log_softmax, logsumexp) and
    backward, rows of several segments, −inf entries, an all −inf row, odd N. The one-launch form
    runs under the interpreter with its partials and counters filled beforehand
    (``emulate_wait``): all of its code but the waiting; the two-launch form reads the partials
    each setting writes."""
    monkeypatch.setattr(sm, "_ALLOW_SPIN", fused)
    split = dict(settings=SPLIT_SETTINGS[name], emulate_wait=fused)
    x = torch.cat([hard_rows(4, N, dtype), torch.full((1, N), float("-inf"), device=DEVICE, dtype=dtype)])
    eps = dtype_eps(dtype)
    for op in OPS:
        y = sm._forward(OP_CODE[op], x, dtype, "split", **split).to(dtype)
        ref, same = OPS[op][1](x.double(), -1), OPS[op][1](x, -1)
        assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert_close_to_ref(y[fin], same[fin], ref[fin], eps=eps, what=f"{op} forward")
    g = torch.Generator().manual_seed(1)
    dy = torch.randn(4, N, generator=g).to(DEVICE, dtype)
    for op, code in (("softmax", sm.SOFTMAX), ("log_softmax", sm.LOG_SOFTMAX)):
        y64 = OPS[op][1](x[:4].double(), -1)
        y = y64.to(dtype)
        dx = sm._backward(code, y, dy, dtype, "split", **split)
        ref = torch._softmax_backward_data if op == "softmax" else torch._log_softmax_backward_data
        assert_close_to_ref(dx, ref(dy, y, -1, dtype), ref(dy.double(), y.double(), -1, torch.float64),
                            eps=eps, what=f"{op} backward")


@pytest.mark.parametrize("N", [601, 1301], ids=["N601-one-chunk", "N1301-two-chunks"])
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "two-launch"])
@pytest.mark.parametrize("name", ["chosen", "acq_rel-counter-pad1-f32"])
def test_split_logsumexp_of_rows_holding_nan(name, fused, N, monkeypatch):
    """logsumexp's partials and their merge, both syncs and holds (fp32 "chosen" holds raw): a +inf
    in one segment and a NaN in another merge to NaN, a +inf alone to +inf (``nan_rows``)."""
    monkeypatch.setattr(sm, "_ALLOW_SPIN", fused)
    x = nan_rows(N)
    y = sm._forward(sm.LOGSUMEXP, x, torch.float32, "split", settings=SPLIT_SETTINGS[name], emulate_wait=fused)
    ref = torch.logsumexp(x.double(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), f"NaN rows differ: {y}"
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-6, equal_nan=True)


def _on_gpu(fn, *args):
    """``fn`` as it decides on the GPU (not the interpreter's small chunks)."""
    with mock.patch.object(sm, "interpreter_active", lambda: False):
        return fn(*args)


_FAST = dict(ticket="relaxed", sync="counter_flags", pad=32, segments=0, prefetch=0, prefetch_after=0)
_FWD_FP32 = dict(_FAST, hold="raw", resident=5)
_STREAM = dict(_FAST, hold="f32", resident=0)
_BWD_FP32 = dict(_FAST, hold="first", resident=2)
_BWD_HALF = dict(_FAST, hold="first", resident=6)
# (forward, itemsize) → N → (block, warps, switches), on a 132-SM H100.
SPLIT_DEFAULTS = {
    (True, 4): {2 ** 16: (8192, 8, _FWD_FP32), 2 ** 20: (8192, 8, _FWD_FP32),
                2 ** 21: (16384, 8, dict(_STREAM, segments=64, prefetch=256)),
                2 ** 22: (16384, 8, dict(_STREAM, segments=128, prefetch=256))},
    (True, 2): {2 ** 16: (8192, 8, _STREAM), 2 ** 18: (8192, 8, _STREAM), 2 ** 19: (8192, 8, dict(_STREAM, segments=32)),
                2 ** 20: (8192, 8, dict(_STREAM, segments=64)),
                2 ** 22: (16384, 8, dict(_STREAM, segments=128, prefetch=512))},
    (False, 4): {2 ** 16: (16384, 8, _BWD_FP32), 2 ** 20: (16384, 8, _BWD_FP32),
                 2 ** 21: (16384, 8, dict(_BWD_FP32, prefetch=128)),
                 2 ** 22: (16384, 8, dict(_BWD_FP32, prefetch_after=256)),
                 2 ** 22 + 2 ** 18: (32768, 16, dict(_STREAM, ticket="acq_rel", sync="counter", pad=1))},
    (False, 2): {2 ** 16: (8192, 8, _BWD_HALF), 2 ** 20: (8192, 8, _BWD_HALF),
                 2 ** 20 + 1: (16384, 16, dict(_STREAM, segments=33, prefetch=128)),
                 2 ** 22: (16384, 16, dict(_STREAM, segments=128, prefetch=128))},
}


@pytest.mark.parametrize("itemsize", [4, 2])
@pytest.mark.parametrize("op", [sm.SOFTMAX, sm.LOG_SOFTMAX, sm.LOGSUMEXP, sm.SOFTMAX_BWD, sm.LOG_SOFTMAX_BWD],
                         ids=["softmax", "log_softmax", "logsumexp", "softmax_bwd", "log_softmax_bwd"])
def test_split_defaults(op, itemsize):
    """The chosen settings depend on the direction, itemsize and N only: the same for every op of
    a direction."""
    for N, (block, warps, switches) in SPLIT_DEFAULTS[(op < 3, itemsize)].items():
        assert _on_gpu(sm._split_config, op, N, itemsize, 132) == dict(block=block, warps=warps, **switches), N


def test_split_layout(monkeypatch):
    """Segments, chunks and the register cap; settings replace only the keys they name."""
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 20, 4, 132)[1:] == (1, 128, 48)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX_BWD, 2 ** 20, 2, 132)[1:] == (1, 128, 40)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132)[1:] == (2, 128, None)  # streams: no cap
    # A cap of r per SM lets one-chunk segments number up to r × SMs; past that they stream.
    capped = dict(block=8192, resident=5, segments=0)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132, capped)[1:] == (1, 512, 48)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 660 * 8192, 4, 132, capped)[1:] == (1, 660, 48)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 660 * 8192 + 1, 4, 132, capped)[1:] == (6, 111, None)
    # 5 programs of 16 warps exceed an SM's 64 warps: the cap cannot make room for them.
    wide = dict(block=8192, warps=16, resident=5, segments=0)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132, wide)[1:] == (4, 128, None)
    t, chunks, S, cap = _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 20, 4, 132, dict(resident=2, sync="counter"))
    assert (t["sync"], t["ticket"], cap) == ("counter", "relaxed", 128)
    with pytest.raises(ValueError, match="per_sm"):
        sm._split_layout(sm.SOFTMAX, 2 ** 20, 4, 132, dict(per_sm=2))
    for bad in (dict(prefetch=96), dict(prefetch_after=-4), dict(prefetch=2.0)):  # tl.arange needs 2^k lines
        with pytest.raises(ValueError, match="power of two"):
            sm._split_layout(sm.SOFTMAX_BWD, 2 ** 21, 4, 132, bad)
    # The prefetch is PTX: kept on the GPU, dropped on ROCm whatever the settings ask.
    pf = dict(prefetch=64, prefetch_after=32)
    assert [_on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132, pf)[0][k] for k in pf] == [64, 32]
    monkeypatch.setattr(sm, "_L2_PREFETCH", False)
    assert [_on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132, pf)[0][k] for k in pf] == [0, 0]
    monkeypatch.setattr(sm, "_MAXNREG", False)  # a Triton without maxnreg: no cap, same kernel
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 20, 4, 132)[1:] == (1, 128, None)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 22, 4, 132, capped)[1:] == (4, 128, None)  # nor more than SMs


def test_split_sweep_variants_are_valid_overrides():
    """benchmarks/softmax_split_sweep.py's variants name only settings the kernel has (a variant is
    skipped where it equals the chosen kernel); "uncapped" is the settings before the register cap (2026-11-23)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "softmax_split_sweep.py"
    spec = importlib.util.spec_from_file_location("softmax_split_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    for name in sweep.VARIANTS:
        for op in (sm.SOFTMAX, sm.SOFTMAX_BWD):
            for itemsize in (4, 2):
                for N in (2 ** 16, 2 ** 20, 2 ** 22):
                    t = _on_gpu(sweep.tuning_at, name, op, itemsize, N, 132)
                    assert t is not None or name != "chosen"
                    _on_gpu(sm._split_layout, op, N, itemsize, 132, t)
    assert _on_gpu(sweep.tuning_at, "uncapped", sm.SOFTMAX_BWD, 4, 2 ** 20, 132)["block"] == 8192
    assert _on_gpu(sweep.tuning_at, "uncapped", sm.SOFTMAX, 4, 2 ** 20, 132) is None
    assert _on_gpu(sweep.tuning_at, "fwd-4k", sm.SOFTMAX_BWD, 2, 2 ** 20, 132) is None
    # ``segments`` makes a row's segments stream: 2^20 in 64 segments of 2 chunks.
    seg64 = _on_gpu(sweep.tuning_at, "fwd-seg64", sm.SOFTMAX, 2, 2 ** 20, 132)
    assert _on_gpu(sm._split_layout, sm.SOFTMAX, 2 ** 20, 2, 132, seg64)[1:] == (2, 64, None)


# ------------------------------------------------------------------ torch's semantics at the edges

@pytest.mark.parametrize("strategy", ["row", "two_pass", "split"])
@pytest.mark.parametrize("op", list(OPS))
def test_special_rows_match_torch(op, strategy):
    """All −inf → NaN (softmax, log_softmax) / −inf (logsumexp); +inf → NaN / +inf; NaN → NaN."""
    x = torch.randn(4, 600)
    x[0] = float("-inf")
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    x = x.to(DEVICE)
    y = ours(op, x, strategy=strategy)
    ref = OPS[op][1](x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), f"NaN pattern differs: {y} vs {ref}"
    assert torch.allclose(y, ref, atol=1e-6, rtol=1e-5, equal_nan=True)


def nan_rows(N):
    """fp32 rows: NaN only; +inf and NaN; −inf and NaN; NaN among finite values; then +inf among
    finite values, all −inf and finite, which hold no NaN (7 rows: auto splits rows past ROW_MAX
    on the CPU too, below 2 rows a CPU "SM")."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, N, generator=g) * 3
    nan, inf = float("nan"), float("inf")
    x[0] = nan
    x[1, N // 3], x[1, N - 1] = inf, nan
    x[2, 0], x[2, N // 2] = -inf, nan
    x[2, N - 1] = -inf
    x[3, (2 * N) // 3] = nan
    x[4, N // 2] = inf
    x[5] = -inf
    return x.to(DEVICE)


# Every strategy on short rows; past ROW_MAX (the shortest rows auto splits) auto and two_pass.
NAN_ROW_CASES = [(7, s) for s in STRATEGIES] + [(sm.ROW_MAX + 1, s) for s in ("auto", "two_pass")]


@pytest.mark.parametrize("N,strategy", NAN_ROW_CASES, ids=[f"N{n}-{s}" for n, s in NAN_ROW_CASES])
@pytest.mark.parametrize("op", list(OPS))
def test_rows_holding_nan_match_torch(op, strategy, N):
    """A row holding NaN is NaN, with +inf (the running maximum skips NaN and stops at +inf) or
    −inf in it too; torch's values everywhere, forward and backward (past ROW_MAX logsumexp's only,
    the one that reads the lse), against float64."""
    x = nan_rows(N).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y, ref = ours(op, x, strategy=strategy), OPS[op][1](x64, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), f"NaN rows differ: {torch.isnan(y).reshape(7, -1).any(-1)}"
    torch.testing.assert_close(y.double(), ref.detach(), atol=1e-5, rtol=1e-5, equal_nan=True)
    if N > sm.ROW_MAX and op != "logsumexp":
        return
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (y * dy.to(DEVICE, torch.float32)).sum().backward()
    (ref * dy.to(DEVICE)).sum().backward()
    assert torch.equal(torch.isnan(x.grad), torch.isnan(x64.grad))
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("op", list(OPS))
def test_all_neg_inf_row_gradient_matches_torch(op):
    x = torch.full((2, 9), float("-inf"), device=DEVICE)
    x[1] = torch.randn(9)
    grads = []
    for fn in (lambda t: ours(op, t), lambda t: OPS[op][1](t, -1)):
        t = x.clone().requires_grad_()
        fn(t).nan_to_num(0.0).sum().backward()
        grads.append(t.grad)
    assert torch.equal(torch.isnan(grads[0]), torch.isnan(grads[1]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape,dim", [((0, 5), -1), ((3, 0), -1), ((3, 0), 0), ((2, 0, 4), 2)],
                         ids=["rows0", "N0", "dim0-of-empty", "3d-empty"])
def test_empty(op, shape, dim):
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    y, ref = ours(op, x, dim), OPS[op][1](x.detach(), dim)
    assert y.shape == ref.shape and torch.equal(y, ref)
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("op", list(OPS))
def test_scalar(op):
    x = torch.tensor(1.5, device=DEVICE)
    for d in (0, -1):
        y, ref = ours(op, x, d), OPS[op][1](x, d)
        assert y.shape == () and torch.allclose(y, ref)


# ------------------------------------------------------------------ dims, ranks and strides

LAYOUTS = {
    "3d-last": (lambda: torch.randn(3, 4, 50), -1),
    "3d-middle": (lambda: torch.randn(3, 50, 4), 1),
    "3d-first": (lambda: torch.randn(50, 3, 4), 0),
    "transposed-leading": (lambda: torch.randn(4, 3, 5, 50).transpose(0, 2), -1),
    "sliced-rows-and-cols": (lambda: torch.randn(6, 8, 120)[::2, 1:7, 10:70], -1),
    "five-leading-dims": (lambda: torch.randn(2, 3, 2, 3, 2, 40).permute(4, 2, 0, 3, 1, 5), -1),
    "reduced-dim-strided": (lambda: torch.randn(50, 6)[:, ::2].t().t(), 0),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts(op, layout):
    make, dim = LAYOUTS[layout]
    x = make().to(DEVICE)
    y = ours(op, x, dim)
    ref = OPS[op][1](x.double(), dim)
    assert y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    check_backward(op, x, dim=dim)


def test_backward_with_expanded_and_strided_grads():
    """dy with stride 0 (from .sum()) or strided along the row reaches the kernels correctly."""
    x = torch.randn(4, 6, 300, device=DEVICE).transpose(0, 1)
    for op in OPS:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours(op, a).sum().backward()
        OPS[op][1](b, -1).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
        g = torch.randn(6, 4, 600, device=DEVICE)[..., ::2] if op != "logsumexp" else torch.randn(4, 6, device=DEVICE).t()
        a.grad = b.grad = None
        ours(op, a).backward(g)
        OPS[op][1](b, -1).backward(g)
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dims,keepdim", [((0, 2), False), ((2, 0), True), ((1,), True), ((-1, -2), False)],
                         ids=["02", "20-keep", "1-keep", "last-two"])
def test_logsumexp_many_dims(dims, keepdim):
    x = torch.randn(3, 4, 5, device=DEVICE, requires_grad=True)
    y = fl.logsumexp(x, dims, keepdim=keepdim)
    ref = torch.logsumexp(x.detach().double(), dims, keepdim=keepdim)
    assert y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    y.sum().backward()
    xr = x.detach().double().requires_grad_()
    torch.logsumexp(xr, dims, keepdim=keepdim).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", list(OPS))
def test_dtype_argument(op):
    x = torch.randn(3, 100, device=DEVICE, dtype=torch.float16)
    fn = OPS[op][0]
    y = fn(x, -1, dtype=torch.float32)
    ref = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}.get(op)
    expected = ref(x, -1, dtype=torch.float32) if ref else torch.logsumexp(x.float(), -1)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-5)
    xi = torch.arange(12, device=DEVICE).reshape(3, 4)
    torch.testing.assert_close(fn(xi, -1, dtype=torch.float32), (ref or torch.logsumexp)(xi.float(), -1))


@pytest.mark.parametrize("op", list(OPS))
def test_dtype_casts_the_input_first_as_torch(op):
    """``dtype`` narrower than x casts x first, then computes (torch's order): 1000.1 and 1000.3
    round to 1000.0 and 1000.5 in fp16 before the softmax."""
    x = torch.tensor([[1000.1, 1000.3, 999.9]], device=DEVICE)
    fn = OPS[op][0]
    ref = (torch.logsumexp(x.to(torch.float16).double(), -1) if op == "logsumexp" else
           {"softmax": torch.softmax, "log_softmax": torch.log_softmax}[op](x.to(torch.float16).double(), -1))
    got = fn(x, -1, dtype=torch.float16)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), ref.to(torch.float16).double(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("op", list(OPS))
def test_second_derivatives_match_torch(op):
    """create_graph=True gives a gradient with a graph (the kernels' carries none): a loss of the
    gradient differentiates as torch's does, through each strategy."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 37, generator=g).to(DEVICE)
    w = torch.randn(3, 37, generator=g).to(DEVICE)
    w_out = w if op != "logsumexp" else w[:, 0]
    def second(fn, xx):
        xx = xx.clone().requires_grad_()
        (gx,) = torch.autograd.grad((fn(xx) * w_out.to(xx.dtype)).sum(), xx, create_graph=True)
        assert gx.requires_grad
        return torch.autograd.grad((gx ** 2).sum() + (xx ** 2).sum(), xx)[0]

    want = second(lambda t: OPS[op][1](t, -1), x.double())  # torch in float64
    for strategy in STRATEGIES[:3]:
        got = second(lambda t: ours(op, t, strategy=strategy), x)
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_logsumexp_over_dims_beside_an_empty_kept_dim():
    for shape, dims, keepdim in (((0, 3, 4), (1, 2), False), ((3, 0, 4), (0, 2), True)):
        x = torch.randn(*shape, device=DEVICE)
        want = torch.logsumexp(x, dims, keepdim=keepdim)
        got = fl.logsumexp(x, dims, keepdim=keepdim)
        assert got.shape == want.shape


def test_dims_as_torch_takes_them():
    """numpy integers and 0-d integer tensors name a dim (torch takes them); bools do not."""
    np = pytest.importorskip("numpy")
    x = torch.randn(2, 5, device=DEVICE)
    for dim in (np.int64(1), torch.tensor(-1)):
        torch.testing.assert_close(fl.softmax(x, dim), torch.softmax(x, -1))
    with pytest.raises(TypeError, match="dim must be an int, got bool"):
        fl.softmax(x, True)
    with pytest.raises(TypeError, match="keepdim must be a bool, got numpy.bool"):
        fl.logsumexp(x, 0, np.bool_(True))
    with pytest.raises(TypeError, match="dense \\(strided\\) tensor"):
        fl.softmax(x.cpu().to_sparse(), 0)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("op", list(OPS))
def test_bad_input(op):
    fn = OPS[op][0]
    x = torch.randn(3, 4, device=DEVICE)
    with pytest.raises(TypeError, match="dtype"):
        fn(torch.arange(6, device=DEVICE).reshape(2, 3))
    with pytest.raises(TypeError, match="dtype"):
        fn(x.double())
    with pytest.raises(TypeError, match="dtype"):
        fn(x, -1, dtype=torch.int32)
    with pytest.raises(IndexError, match="out of range"):
        fn(x, 2)
    with pytest.raises(IndexError, match="out of range"):
        fn(x, -3)
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn([1.0, 2.0])
    with pytest.raises(ValueError, match="strategy"):
        ours(op, x, strategy="fastest")
    with pytest.raises(ValueError, match="N must be"):
        ours(op, torch.zeros(1, sm.ROW_LIMIT + 1, device=DEVICE), strategy="row")


def test_logsumexp_bad_dims():
    x = torch.randn(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="repeat"):
        fl.logsumexp(x, (0, -2))
    with pytest.raises(ValueError, match="at least one"):
        fl.logsumexp(x, ())
    with pytest.raises(TypeError, match="int"):
        fl.softmax(x, (0, 1))


# ------------------------------------------------------------------ strategy choice and the CPU twin

def test_auto_choice():
    t = torch.empty(0, device=DEVICE)
    assert sm._choose("auto", 10 ** 5, 1000, t) == "row"
    assert sm._choose("auto", 1, 10 ** 6, t) == "split"
    expected_many = "split" if sm._spin_allowed(t) else "two_pass"
    assert sm._choose("auto", 10 ** 5, 10 ** 5, t) == expected_many


@pytest.mark.parametrize("op", list(OPS))
def test_cpu_twin(torch_cpu_path, op):
    x = hard_rows(4, 300, torch.float32).cpu()
    check_forward(op, x)
    check_backward(op, x)
    check_backward(op, hard_rows(3, 40, torch.float16).cpu())


# ------------------------------------------------------------------ GPU: long rows, bf16, the fused split

gpu = pytest.mark.skipif(not ON_GPU, reason="needs CUDA")


@gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launch"])
@pytest.mark.parametrize("strategy", ["auto", "two_pass", "split"])
@pytest.mark.parametrize("R,N", [(3, 70000), (300, 70000), (2, 2 ** 20), (2, 2 ** 21 + 5), (1, 2 ** 22 + 3)],
                         ids=["3x70000", "300x70000", "2x1M", "2x2M+5", "1x4M+3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
@pytest.mark.parametrize("op", list(OPS))
# float32 on the GPU: 2×1M takes the same 4-byte split settings as 3×70000 (SPLIT_DEFAULTS), and 300 rows
# differ from 3 only in the (dtype-free) row grid and strategy choice: three sizes cover every float32 setting.
@gpu_fp32_only(R=[3, 2, 1], N=[70000, 2 ** 21 + 5, 2 ** 22 + 3])
def test_gpu_long_rows(op, dtype, R, N, strategy, fused, monkeypatch):
    if not fused and strategy == "two_pass":
        pytest.skip("two_pass never waits")
    monkeypatch.setattr(sm, "_ALLOW_SPIN", fused)
    x = hard_rows(R, N, dtype)
    check_forward(op, x, strategy)
    if R * N <= 2 ** 23:  # 2 × 2M+5: the backward's prefetching settings
        check_backward(op, x, strategy)


@gpu
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("N", [2 ** k for k in range(10, 15)] + [3000, 16384, 20000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
def test_gpu_row_sizes(op, dtype, N):
    """Every row-kernel block size the benchmark meets, with many rows (several rows per program)."""
    x = hard_rows(513, N, dtype)
    check_forward(op, x)
    check_backward(op, x)


@gpu
def test_gpu_split_is_deterministic_and_repeatable():
    """The fused split reuses no state between calls (fresh counters each launch)."""
    x = torch.randn(5, 3_000_000, device="cuda")
    a, b = fl.softmax(x), fl.softmax(x)
    assert torch.equal(a, b)
    torch.testing.assert_close(a.sum(-1), torch.ones(5, device="cuda"), atol=1e-4, rtol=0)


@pytest.mark.skipif(not ON_GPU, reason="65,536+ row tiles: too slow for the interpreter")
def test_gpu_logsumexp_backward_over_more_than_65535_rows():
    # One row tile per program at N ≥ 4096: the row tiles must not sit on a capped grid axis.
    x = torch.randn(70_000, 4096, device=DEVICE).requires_grad_()
    lse = fl.logsumexp(x, dim=-1)
    dy = torch.randn_like(lse)
    (dx,) = torch.autograd.grad(lse, x, dy)
    expected = dy[:, None] * torch.softmax(x.detach(), dim=-1)
    assert torch.allclose(dx, expected, atol=1e-6, rtol=1e-4)
