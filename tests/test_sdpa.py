"""scaled_dot_product_attention and replace_sdpa against torch's SDPA (math backend), every argument."""
import collections
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only
import flashattn_lite
import flashattn_lite.ops.attention as attn_ops
from flashattn_lite import replace_sdpa, scaled_dot_product_attention
from flashattn_lite.dropout import dropout_keep_torch
from flashattn_lite.integrations.sdpa import SDPAUnsupportedError
from flashattn_lite.reference import attention_reference

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}


def torch_math(*args, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kwargs)


def _rand(shape, dtype, g, requires_grad=True):
    return torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_(requires_grad)


def _mask(kind, shape, dtype, g):
    if kind == "bool":
        m = torch.rand(shape, generator=g) > 0.3
        m[..., 0] = True  # every row keeps a key: torch's fused CUDA kernels and ours then agree
        return m.to(DEVICE)
    m = torch.randn(shape, generator=g)
    m[..., 1::3] = float("-inf")
    return m.to(DEVICE, dtype if kind == "float" else torch.float32)


# (id, q shape, k shape, v shape, mask kind, mask shape, kwargs). Leading dims, GQA, broadcasting,
# causal with L ≠ S both ways, masks of each kind and broadcast pattern.
CASES = [
    ("bhld", (2, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 16), None, None, {}),
    ("causal-L<S", (1, 2, 7, 16), (1, 2, 12, 16), (1, 2, 12, 8), None, None, dict(is_causal=True)),
    ("causal-L>S", (1, 2, 12, 16), (1, 2, 5, 16), (1, 2, 5, 16), None, None, dict(is_causal=True)),
    ("bool-mask-LS", (2, 2, 9, 16), (2, 2, 10, 16), (2, 2, 10, 16), "bool", (9, 10), {}),
    ("bool-mask-B11S", (2, 2, 9, 16), (2, 2, 10, 16), (2, 2, 10, 16), "bool", (2, 1, 1, 10), {}),
    ("float-mask-full", (1, 2, 9, 32), (1, 2, 10, 32), (1, 2, 10, 32), "float", (1, 2, 9, 10), {}),
    ("f32-mask-H1S", (2, 4, 6, 16), (2, 4, 10, 16), (2, 4, 10, 16), "float32", (4, 1, 10), dict(scale=0.3)),
    ("gqa-4:2", (1, 4, 8, 16), (1, 2, 13, 16), (1, 2, 13, 16), None, None, dict(enable_gqa=True, is_causal=True)),
    ("gqa-mask", (2, 4, 8, 16), (2, 1, 13, 16), (2, 1, 13, 16), "bool", (2, 1, 8, 13), dict(enable_gqa=True)),
    ("mqa-broadcast", (1, 3, 8, 16), (1, 1, 9, 16), (1, 1, 9, 16), None, None, {}),
    ("kv-batch-broadcast", (3, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 16), None, None, {}),
    ("3d", (3, 7, 16), (3, 9, 16), (3, 9, 16), "bool", (7, 9), {}),
    ("2d", (7, 16), (9, 16), (9, 24), None, None, dict(is_causal=True)),
    ("5d", (2, 2, 2, 5, 16), (2, 2, 2, 6, 16), (2, 2, 2, 6, 16), "float", (2, 1, 1, 5, 6), {}),
    ("5d-gqa-bcast", (2, 2, 4, 5, 16), (1, 2, 2, 6, 16), (1, 2, 2, 6, 16), None, None, dict(enable_gqa=True)),
]


# float32 on the GPU: the argument handling (ranks, broadcasting) is dtype-free and runs in fp16/bf16 at
# every case; in float32 the cases that switch on the kernel's options: causal with Dv ≠ D, GQA with a
# broadcast bool mask, a broadcast float32 mask with a scale.
FP32_GPU_CASES = [c for c in CASES if c[0] in ("causal-L<S", "gqa-mask", "f32-mask-H1S")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@gpu_fp32_only(case=FP32_GPU_CASES)
def test_matches_torch(case, dtype):
    _, qs, ks, vs, mkind, mshape, kw = case
    g = torch.Generator().manual_seed(hash(case[0]) % 2 ** 31)
    q, k, v = _rand(qs, dtype, g), _rand(ks, dtype, g), _rand(vs, dtype, g)
    mask = None if mkind is None else _mask(mkind, mshape, dtype, g)
    ours = scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    same = torch_math(q, k, v, attn_mask=mask, **kw)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch_math(q64, k64, v64, attn_mask=None if mask is None else
                     (mask if mask.dtype == torch.bool else mask.double()), **kw)
    assert ours.shape == ref.shape and ours.dtype == dtype
    assert_close_to_ref(ours, same, ref, eps=EPS[dtype])
    do = torch.randn(ref.shape, generator=g).to(DEVICE, dtype)
    g_ours = torch.autograd.grad(ours, (q, k, v), do)
    g_same = torch.autograd.grad(same, (q, k, v), do)
    g_ref = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for name, a, b, r in zip("qkv", g_ours, g_same, g_ref):
        assert a.shape == r.shape
        assert_close_to_ref(a, b, r, eps=2 * EPS[dtype], what=f"d{name}")


def test_broadcast_mask_is_not_expanded_in_memory(monkeypatch):
    seen = []
    orig = attn_ops._forward_impl
    monkeypatch.setattr(attn_ops, "_forward_impl", lambda *a: seen.append(a[3]) or orig(*a))
    q = torch.randn(2, 4, 8, 16, device=DEVICE)
    mask = torch.rand(8, 8, device=DEVICE) > 0.5
    mask[:, 0] = True
    scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert seen[0].shape == (1, 1, 8, 8) and seen[0].data_ptr() == mask.data_ptr()


def test_fully_masked_rows_are_zero_like_torch_math():
    q = torch.randn(1, 2, 4, 16, device=DEVICE)
    mask = torch.ones(4, 6, dtype=torch.bool, device=DEVICE)
    mask[1] = False
    ours = scaled_dot_product_attention(q, q[:, :, :1].expand(-1, -1, 6, -1), q[:, :, :1].expand(-1, -1, 6, -1),
                                        attn_mask=mask)
    assert torch.equal(ours[:, :, 1], torch.zeros_like(ours[:, :, 1]))
    assert torch.isfinite(ours).all()


def test_lse_is_computed_only_for_the_backward(monkeypatch):
    # The drop-in never returns lse: a no-grad call skips it, a call with a backward still needs it.
    asked = []
    forward = attn_ops.attention_forward
    monkeypatch.setattr(attn_ops, "attention_forward",
                        lambda *a, **kw: asked.append(kw["need_lse"]) or forward(*a, **kw))
    q, k, v = (torch.randn(1, 2, 5, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        o_no_grad = scaled_dot_product_attention(q, k, v, is_causal=True)
    o = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert asked == [False, True]
    assert torch.equal(o_no_grad, o.detach())
    do = torch.randn_like(o)
    ours = torch.autograd.grad(o, (q, k, v), do)
    ref = torch.autograd.grad(torch_math(q, k, v, is_causal=True), (q, k, v), do)
    for a, r in zip(ours, ref):
        assert torch.allclose(a, r, atol=1e-3)


def _seed_after(s):
    torch.manual_seed(s)
    return attn_ops.draw_seed()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dropout_mask_equals_philox_twin(dtype):
    """Output and gradients equal the float64 reference with the exact keep-mask the kernel draws."""
    B, Hq, Hkv, L, S, D, p = 2, 4, 2, 9, 13, 16, 0.3
    g = torch.Generator().manual_seed(1)
    q, k, v = _rand((B, Hq, L, D), dtype, g), _rand((B, Hkv, S, D), dtype, g), _rand((B, Hkv, S, D), dtype, g)
    mask = _mask("bool", (B, 1, L, S), dtype, g)
    seed = _seed_after(123)
    torch.manual_seed(123)
    ours = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=True)
    keep = dropout_keep_torch(seed, B, Hq, L, S, p).to(DEVICE)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, attn_mask=mask, dropout_keep=keep, dropout_p=p)
    torch.manual_seed(123)
    same = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=True)
    assert torch.equal(ours, same), "torch.manual_seed must reproduce the dropout mask"
    no_drop, _ = attention_reference(q64, k64, v64, attn_mask=mask)
    assert (ref - no_drop).abs().max() > 0.1, "the test must see the dropout"
    err = (ours.double() - ref).norm() / ref.norm()
    assert err < 4 * EPS[dtype], f"output: rel err {err:.2e}"
    do = torch.randn(ref.shape, generator=g).to(DEVICE, dtype)
    for name, a, r in zip("qkv", torch.autograd.grad(ours, (q, k, v), do),
                          torch.autograd.grad(ref, (q64, k64, v64), do.double())):
        err = (a.double() - r).norm() / r.norm()
        assert err < 20 * EPS[dtype], f"d{name}: rel err {err:.2e}"


def test_dropout_statistics_and_fresh_seeds():
    """Uniform weights and v = 1: each output is (kept / S) / (1 − p), mean 1, drop rate p."""
    B, H, L, S, p = 2, 2, 16, 64, 0.25
    q = torch.zeros(B, H, L, 8, device=DEVICE)
    k = torch.randn(B, H, S, 8, device=DEVICE)
    v = torch.ones(B, H, S, 8, device=DEVICE)
    o1 = scaled_dot_product_attention(q, k, v, dropout_p=p)[..., 0]
    o2 = scaled_dot_product_attention(q, k, v, dropout_p=p)[..., 0]
    assert not torch.equal(o1, o2), "each call draws a fresh seed"
    kept = o1 * (1 - p) * S
    assert torch.allclose(kept, kept.round(), atol=1e-3)
    n = B * H * L * S
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(1 - kept.sum().item() / n - p) < 5 * sigma
    assert torch.equal(scaled_dot_product_attention(q, k, v, dropout_p=1.0), torch.zeros_like(q))


BAD = [
    ("mask-and-causal", dict(attn_mask=torch.ones(5, 7, dtype=torch.bool), is_causal=True), None),
    ("mask-float64", dict(attn_mask=torch.zeros(5, 7, dtype=torch.float64)), None),
    ("mask-int", dict(attn_mask=torch.zeros(5, 7, dtype=torch.int64)), None),
    ("mask-shape", dict(attn_mask=torch.zeros(5, 6)), None),
    ("mask-too-many-dims", dict(attn_mask=torch.zeros(1, 1, 1, 5, 7)), None),
    ("dropout>1", dict(dropout_p=1.5), None),
    ("dtype-mismatch", {}, "k-half"),
    ("E-mismatch", {}, "k-E8"),
    ("heads-no-gqa", {}, "kv-H2"),
    ("gqa-not-divisor", dict(enable_gqa=True), "kv-H3"),
    ("1-d", {}, "1d"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_raises_where_torch_raises(case):
    _, kw, change = case
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    if change == "k-half":
        k = k.half()
    elif change == "k-E8":
        k = k[..., :8]
    elif change == "kv-H2":
        k, v = k[:, :2], v[:, :2]
    elif change == "kv-H3":
        k, v = k[:, :3], v[:, :3]
    elif change == "1d":
        q, k, v = q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]
    kw = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    with pytest.raises(RuntimeError):
        torch_math(q, k, v, **kw)
    with pytest.raises(RuntimeError, match="scaled_dot_product_attention"):
        scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("case", ["float64", "head-dim-512", "mask-requires-grad", "empty"])
def test_unsupported_cases_raise_not_implemented(case):
    q = torch.randn(1, 2, 4, 16, device=DEVICE)
    kw = {}
    if case == "float64":
        q = q.double()
    elif case == "head-dim-512":
        q = torch.randn(1, 2, 4, 512, device=DEVICE)
    elif case == "mask-requires-grad":
        kw["attn_mask"] = torch.zeros(4, 4, device=DEVICE, requires_grad=True)
    else:
        q = q[:, :, :0]
    with pytest.raises(SDPAUnsupportedError):
        scaled_dot_product_attention(q, q, q, **kw)


# ------------------------------------------------------------------ replace_sdpa

def _count_calls(monkeypatch):
    calls = []
    orig = attn_ops._forward_impl
    monkeypatch.setattr(attn_ops, "_forward_impl", lambda *a: calls.append(1) or orig(*a))
    return calls


class _Block(torch.nn.Module):
    def forward(self, x):
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def test_replace_sdpa_context_manager_routes_and_restores(monkeypatch):
    calls = _count_calls(monkeypatch)
    x = torch.randn(1, 2, 6, 16, device=DEVICE)
    torch_out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    assert not calls
    with replace_sdpa() as handle:
        out = _Block()(x)
        assert len(calls) == 1 and handle.active
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    _Block()(x)
    assert len(calls) == 1
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-4)


def test_replace_sdpa_patches_imported_aliases(monkeypatch):
    calls = _count_calls(monkeypatch)
    mod = types.ModuleType("_fake_model_module")
    exec("from torch.nn.functional import scaled_dot_product_attention as sdpa\n"
         "def run(x):\n    return sdpa(x, x, x)\n", vars(mod))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    x = torch.randn(1, 2, 5, 16, device=DEVICE)
    h = replace_sdpa()
    try:
        mod.run(x)
        assert len(calls) == 1
    finally:
        h.restore()
    h.restore()  # idempotent
    assert mod.sdpa is torch._C._nn.scaled_dot_product_attention
    mod.run(x)
    assert len(calls) == 1


def test_replace_sdpa_scoped_to_a_model(monkeypatch):
    calls = _count_calls(monkeypatch)
    model, x = _Block(), torch.randn(1, 2, 6, 16, device=DEVICE)
    with replace_sdpa(model):
        model(x)
        assert len(calls) == 1
        F.scaled_dot_product_attention(x, x, x)  # outside the model: torch's
        assert len(calls) == 1
        with replace_sdpa():  # nesting
            F.scaled_dot_product_attention(x, x, x)
            assert len(calls) == 2
        model(x)
        assert len(calls) == 3
    model(x)
    assert len(calls) == 3 and not model._forward_pre_hooks


def test_replace_sdpa_falls_back_once_per_case(monkeypatch):
    monkeypatch.setattr("flashattn_lite._log._fallbacks", collections.Counter())
    x = torch.randn(1, 2, 5, 16, device=DEVICE, dtype=torch.float64)
    with replace_sdpa():
        with pytest.warns(UserWarning, match="dtype"):
            out = F.scaled_dot_product_attention(x, x, x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F.scaled_dot_product_attention(x, x, x)
        with pytest.raises(RuntimeError):  # invalid calls still raise
            F.scaled_dot_product_attention(x.float(), x, x)
    torch.testing.assert_close(out, torch_math(x, x, x))
    counts = {reason: n for (where, reason), n in flashattn_lite._log.fallback_counts().items()
              if where == "replace_sdpa"}
    assert len(counts) == 1 and "float64" in next(iter(counts)) and next(iter(counts.values())) == 2, counts


@pytest.mark.skipif(ON_GPU, reason="the CPU fallback")
def test_replace_sdpa_sends_cpu_tensors_to_torch_without_interpreter(torch_cpu_path, monkeypatch):
    monkeypatch.setattr("flashattn_lite._log._fallbacks", collections.Counter())
    calls = _count_calls(monkeypatch)
    x = torch.randn(1, 2, 5, 16)
    with replace_sdpa(), pytest.warns(UserWarning, match="CPU"):
        F.scaled_dot_product_attention(x, x, x)
    assert not calls
    flashattn_lite.scaled_dot_product_attention(x, x, x)  # the direct call runs our CPU twin
    assert len(calls) == 1


# ------------------------------------------------------------------ GPU: bf16, real sizes

@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_gpu_large_against_torch(dtype, mask):
    g = torch.Generator().manual_seed(7)
    B, Hq, Hkv, L, S, D = 2, 16, 4, 1000, 1537, 128
    q, k, v = _rand((B, Hq, L, D), dtype, g), _rand((B, Hkv, S, D), dtype, g), _rand((B, Hkv, S, D), dtype, g)
    m = None if mask is None else _mask(mask, (B, 1, L, S), dtype, g)
    kw = dict(attn_mask=m, enable_gqa=True, is_causal=m is None)
    ours = scaled_dot_product_attention(q, k, v, **kw)
    same = F.scaled_dot_product_attention(q, k, v, **kw)
    ref = torch_math(*(t.detach().float() for t in (q, k, v)), attn_mask=None if m is None else
                     (m if m.dtype == torch.bool else m.float()), **{n: kw[n] for n in ("enable_gqa", "is_causal")})
    assert_close_to_ref(ours, same, ref, eps=EPS[dtype])
    do = torch.randn_like(ours)
    for name, a, b in zip("qkv", torch.autograd.grad(ours, (q, k, v), do), torch.autograd.grad(same, (q, k, v), do)):
        assert (a.float() - b.float()).norm() / b.float().norm() < 3 * EPS[dtype], f"d{name}"


@pytest.mark.parametrize("kwargs", [{}, dict(is_causal=True), "mask"], ids=["plain", "causal", "bool-mask"])
def test_output_takes_q_layout_as_torch_flash_does(kwargs):
    # A model's (B, N, H, D) projections seen as (B, H, N, D): o comes back in that storage (torch's
    # flash and cuDNN backends do the same), so the model's o.transpose(1, 2).reshape(...) copies nothing.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 16, generator=g).to(DEVICE, torch.float16).transpose(1, 2) for _ in range(3))
    if kwargs == "mask":
        kwargs = dict(attn_mask=_mask("bool", (9, 9), torch.float16, g))
    o = scaled_dot_product_attention(q, k, v, **kwargs)
    assert o.stride() == torch.empty_like(q).stride() and o.transpose(1, 2).is_contiguous()
    want = torch_math(q.float(), k.float(), v.float(), **kwargs)
    assert (o.float() - want).abs().max() <= 5e-3


def test_dropout_p_may_be_a_numpy_float():
    """torch's SDPA takes any real float (a numpy float64 is one: a float subclass); so does the drop-in:
    the same probability, the same seeded result."""
    import numpy as np
    q, k, v = (torch.randn(1, 2, 9, 8, device=DEVICE) for _ in range(3))
    torch.manual_seed(5)
    want = flashattn_lite.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    torch.manual_seed(5)
    torch.testing.assert_close(flashattn_lite.scaled_dot_product_attention(q, k, v, dropout_p=np.float64(0.25)), want)
