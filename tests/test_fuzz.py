"""Property tests: every public op against the float64 reference on random shapes, layouts, dtypes and
options, forward and backward.

Hypothesis draws the cases (``derandomize=True``: the same cases on every run, no example database;
a failure prints the drawn values and a ``@reproduce_failure`` blob). The budget per test is small
on the CPU (the kernels run in the interpreter) and on a GPU (where nearly every attention case is a
fresh compile, and the whole suite must fit one 10-minute call); ``FLASHATTN_LITE_FUZZ_EXAMPLES=N``
sets it for every test, for a larger-budget run in a call of its own. Attention options that
``attention`` does not take yet (window, softcap, sinks, alibi_slopes; ``attention_varlen``) are
drawn only once its signature has them, so they start being fuzzed the moment they land.

Tolerance everywhere: err(ours) ≤ 2·err(the same math in the input dtype) + eps, both against
float64 (``conftest.assert_close_to_ref``), on the entries where the reference is finite; where it
is not, ours must be the same non-finite value. Gradients get 3·eps: where the exact gradient is ~0
(a softmax over one key has none) the backward's float32 dp − δ cancellation leaves noise that
torch's own formula does not have. Errors are relative, absolute below a floor (``out_floor``,
``grad_floor``).
"""
import inspect
import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import flashattn_lite as fl
from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref
from flashattn_lite.ops import softmax as sm
from flashattn_lite.reference import attention_reference, dtype_eps

# The interpreter evaluates exp(−inf), 0/0 in numpy, which warns; results are checked.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

EXAMPLES = int(os.environ.get("FLASHATTN_LITE_FUZZ_EXAMPLES", "0")) or None
EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}
GRAD_EPS = {dtype: 3 * eps for dtype, eps in EPS.items()}
# Longest sequence / row drawn: tiles and chunks are 16–256 wide under the interpreter, so these
# still cross tile boundaries; on a GPU (64–128 wide tiles) longer ones do.
MAX_N = 300 if ON_GPU else 40
MAX_D = 256 if ON_GPU else 32
# Every head dim is a compile on the GPU (it is a constexpr): there, a fixed set with odd ones.
HEAD_DIMS = st.sampled_from([1, 7, 16, 33, 64, 80, 96, 128, 160, 192, 256]) if ON_GPU else st.integers(1, MAX_D)
ATTN_PARAMS = set(inspect.signature(fl.attention).parameters)
OPTIONS = [name for name in ("window", "softcap", "sinks", "alibi_slopes") if name in ATTN_PARAMS]
HAS_VARLEN = hasattr(fl, "attention_varlen")


def fuzz(cpu_examples: int, gpu_examples: int = 12):
    """Seeded settings: ``cpu_examples`` cases on the CPU, ``gpu_examples`` on a GPU (each op's cost
    differs: an attention case compiles its kernels, ~10 s each in the GPU suite), or
    FLASHATTN_LITE_FUZZ_EXAMPLES for every test. No shrinking: under the interpreter it can take many
    minutes; the failing case is printed as drawn (small already: every size is drawn from a small
    range)."""
    return settings(max_examples=EXAMPLES or (gpu_examples if ON_GPU else cpu_examples), derandomize=True,
                    deadline=None, database=None, print_blob=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------ helpers

def rand(shape, dtype, g, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(DEVICE, dtype)


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as x (B, H, N, D), stored another way: (B, N, H, D) read through a transpose,
    a slice of a larger buffer, or broadcast along the batch (stride 0, x[0] for every batch)."""
    if layout == "bnhd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "sliced":
        big = torch.zeros(x.shape[0], x.shape[1] + 1, x.shape[2] + 3, x.shape[3] + 5, dtype=x.dtype, device=x.device)
        big[:, 1:, 2:-1, 3:-2] = x
        return big[:, 1:, 2:-1, 3:-2]
    if layout == "expand":
        return x[:1].expand(x.shape)
    return x


def rms(t: torch.Tensor) -> float:
    """RMS of the finite entries (0 where there are none)."""
    t = t[torch.isfinite(t)].double()
    return t.square().mean().sqrt().item() if t.numel() else 0.0


def out_floor(ref_fn, q, k, v, lse, *, packed: bool = False, **kw) -> float:
    """An attention output's ``floor_rms``: half the RMS of T = √(Σⱼ pᵢⱼ²·vⱼ²), the size o's entries
    have when v's signs are random. P·V's rounding (the kernels round P to the input dtype) errs by a
    fraction of T, not of o, so an o that cancels below T/2 (one element of 0.0026 over 489 keys, D 1,
    fp16, on a GPU) is compared absolutely. Σⱼ pᵢⱼ²·wⱼ = exp(lse₂ − 2·lse)·(softmax(2s)·w): ``ref_fn``
    (the float64 reference, o and ``lse``, (Hq, rows) where ``packed``) run again with every score
    term doubled and v² for v. Rows with no key count 0."""
    kw = dict(kw, scale=2 * (q.shape[-1] ** -0.5 if kw.get("scale") is None else kw["scale"]))
    assert set(kw) <= {"causal", "causal_offset", "scale", "window", "softcap", "alibi_slopes", "sinks",
                       "attn_mask"}, "out_floor doubles these score terms only"
    for name in ("softcap", "alibi_slopes", "sinks", "attn_mask"):
        if kw.get(name) is not None and getattr(kw[name], "dtype", None) != torch.bool:  # bool mask: no term
            kw[name] = 2 * kw[name]
    with torch.no_grad():
        o2, lse2 = ref_fn(q, k, v.detach().double().square(), **kw)
    w = torch.where(torch.isfinite(lse), torch.exp(lse2 - 2 * lse), torch.zeros_like(lse))  # Σⱼ pᵢⱼ²
    return max(1e-3, 0.5 * rms(((w.T if packed else w).unsqueeze(-1) * o2).sqrt()))


def grad_floor(grads) -> float:
    """A gradient's ``floor_rms``: 1% of the largest RMS among the call's reference dq, dk, dv. One
    exactly 0 by the math (dq, dk over one key) comes out of a kernel as roundoff of the terms of
    dP − δ (float32, dk RMS 1.2e-6 at 23 queries, D 33, on a GPU); it is compared absolutely."""
    return max([1e-3] + [1e-2 * rms(g) for g in grads if g is not None])


def check(ours, same, ref, eps, what, floor_rms: float = 1e-3):
    """Non-finite reference entries match exactly (NaN where NaN, ±inf where ±inf); the finite ones
    within the dtype tolerance (``rel_err``: absolute where the ref's RMS is below ``floor_rms``)."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    ours64 = ours.double()
    fin = torch.isfinite(ref)
    bad = ~fin & ~((ours64 == ref) | (torch.isnan(ours64) & torch.isnan(ref)))
    assert not bad.any(), f"{what}: {ours64[bad][:4].tolist()} where the reference has {ref[bad][:4].tolist()}"
    if fin.any():
        assert_close_to_ref(ours[fin], same[fin], ref[fin], eps=eps, what=what, floor_rms=floor_rms)


def close_lse(lse, lse_ref, dtype, what="lse"):
    fin = torch.isfinite(lse_ref)
    assert torch.equal(lse.double()[~fin], lse_ref[~fin]), f"{what}: non-finite entries differ"
    tol = 1e-3 if dtype == torch.float32 else 2e-2
    err = (lse.double()[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= tol * (1 + lse_ref[fin].abs().max().item() if fin.any() else 1), f"{what}: max err {err:.3e}"


def ref_grads(fn, inputs, cotangents, work_dtype):
    """Gradients of Σ⟨fn(inputs), cotangents⟩ with the inputs cast to ``work_dtype``."""
    leaves = [t.detach().to(work_dtype).requires_grad_() for t in inputs]
    outs = fn(*leaves, work_dtype)
    loss = sum((o * c.to(work_dtype)).sum() for o, c in zip(outs, cotangents) if c is not None)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def finite_or_zero(t):
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


# ------------------------------------------------------------------ attention (dense)

@st.composite
def attention_cases(draw, max_n=MAX_N):
    hkv = draw(st.integers(1, 2))
    case = dict(
        B=draw(st.integers(1, 2)), Hkv=hkv, Hq=hkv * draw(st.sampled_from([1, 2, 3, 4])),
        Nq=draw(st.integers(1, max_n)), Nk=draw(st.integers(1, max_n)),
        D=draw(HEAD_DIMS), dtype=draw(st.sampled_from(DTYPES)),
        layouts=[draw(st.sampled_from(["contig", "bnhd", "sliced", "expand"])) for _ in range(3)],
        causal=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)),
    )
    case["Dv"] = draw(st.one_of(st.just(case["D"]), HEAD_DIMS))
    case["scale"] = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    case["options"] = draw(score_options(case["B"], case["Hq"], case["Nk"]))
    return case


@st.composite
def score_options(draw, B, Hq, Nk, names=None):
    """A random subset of the score options ``attention`` takes (keyword → value)."""
    names = OPTIONS if names is None else names
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    opts = {}
    side = st.one_of(st.none(), st.just(-1), st.integers(0, Nk + 2))  # −1: unbounded, as None
    if "window" in names and draw(st.booleans()):
        opts["window"] = (draw(side), draw(side))
    if "softcap" in names and draw(st.booleans()):
        opts["softcap"] = draw(st.floats(0.5, 30.0))
    if "sinks" in names and draw(st.booleans()):
        opts["sinks"] = (torch.randn(Hq, generator=g) * 2).to(DEVICE)
    if "alibi_slopes" in names and draw(st.booleans()):
        shape = (Hq,) if draw(st.booleans()) else (B, Hq)
        opts["alibi_slopes"] = torch.rand(shape, generator=g).to(DEVICE)
    return opts


def make_inputs(c, g):
    q = rand((c["B"], c["Hq"], c["Nq"], c["D"]), c["dtype"], g)
    k = rand((c["B"], c["Hkv"], c["Nk"], c["D"]), c["dtype"], g)
    v = rand((c["B"], c["Hkv"], c["Nk"], c["Dv"]), c["dtype"], g)
    return [laid_out(x, lay) for x, lay in zip((q, k, v), c["layouts"])]


@given(attention_cases())
@fuzz(cpu_examples=25, gpu_examples=4)
def test_attention(c):
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    # Leaves with the drawn strides (stride 0 included): gradients are taken with respect to them.
    q, k, v = (t.detach().requires_grad_() for t in make_inputs(c, g))
    opts = dict(c["options"])
    sinks = opts.pop("sinks", None)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks.detach().requires_grad_())
    kw = dict(causal=c["causal"], scale=c["scale"], **opts)
    o, lse = fl.attention(*inputs[:3], return_lse=True, sinks=inputs[3] if sinks is not None else None, **kw)
    assert o.dtype == dtype and lse.dtype == torch.float32

    ref_kw = dict(kw, window=unbounded_as_none(kw.get("window")))

    def reference(q_, k_, v_, *rest, work):
        return attention_reference(q_, k_, v_, dtype=work, sinks=rest[0] if rest else None, **ref_kw)

    o_ref, lse_ref = reference(*inputs, work=torch.float64)
    o_same, _ = reference(*inputs, work=dtype)
    check(o, o_same, o_ref, EPS[dtype], "o", out_floor(attention_reference, q, k, v, lse_ref, sinks=sinks, **ref_kw))
    close_lse(lse, lse_ref, dtype)

    do = rand(o.shape, dtype, g)
    dlse = rand(lse.shape, torch.float32, g) if torch.isfinite(lse_ref).all() else None
    outs = (o, lse) if dlse is not None else (o,)
    grads = torch.autograd.grad(outs, inputs, (do, dlse)[:len(outs)])
    fn = lambda *a: reference(*a[:-1], work=a[-1])[:len(outs)]  # noqa: E731
    ref = ref_grads(fn, inputs, (do, dlse), torch.float64)
    same = ref_grads(fn, inputs, (do, dlse), dtype)
    floor = grad_floor(ref[:3])
    for name, ours, s, r in zip(("dq", "dk", "dv", "dsinks"), grads, same, ref):
        assert ours.dtype == (torch.float32 if name == "dsinks" else dtype)
        check(ours, s, r, GRAD_EPS[dtype], name, 1e-3 if name == "dsinks" else floor)


def unbounded_as_none(window):
    """The reference spells an unbounded window side None; the op also takes −1."""
    if window is None:
        return None
    return tuple(None if side == -1 else side for side in window)


# ------------------------------------------------------------------ masks (FlashAttention module) and SDPA

@st.composite
def mask_cases(draw):
    c = draw(attention_cases(max_n=min(MAX_N, 24 if not ON_GPU else MAX_N)))
    full = (c["B"], c["Hq"], c["Nq"], c["Nk"])
    # Each dim of the mask either full or 1 (broadcast, read with stride 0); leading dims may be absent.
    shape = tuple(draw(st.sampled_from([n, 1])) for n in full)
    c["mask_shape"] = shape[draw(st.integers(0, 2)):]
    c["mask_kind"] = draw(st.sampled_from(["bool", "float", "float32"]))
    return c


def make_mask(kind, shape, dtype, g):
    if kind == "bool":
        return (torch.rand(shape, generator=g) > 0.3).to(DEVICE)
    # Finite additive masks: a −inf row would make the float64 reference's own gradient NaN.
    return (torch.randn(shape, generator=g) * 2).to(DEVICE, dtype if kind == "float" else torch.float32)


@given(mask_cases())
@fuzz(cpu_examples=15, gpu_examples=4)
def test_flash_attention_module_with_masks(c):
    """nn.FlashAttention: bottom-right causal combined with a broadcast bool or float mask."""
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    q, k, v = (t.detach().requires_grad_() for t in make_inputs(c, g))
    mask = make_mask(c["mask_kind"], c["mask_shape"], dtype, g)
    module = fl.nn.FlashAttention(causal=c["causal"], scale=c["scale"])
    o = module(q, k, v, attn_mask=mask)
    kw = dict(causal=c["causal"], scale=c["scale"], attn_mask=mask)
    o_ref, lse_ref = attention_reference(q, k, v, **kw)
    check(o, attention_reference(q, k, v, dtype=dtype, **kw)[0], o_ref, EPS[dtype], "o",
          out_floor(attention_reference, q, k, v, lse_ref, **kw))
    do = rand(o.shape, dtype, g)
    grads = torch.autograd.grad(o, (q, k, v), do)
    fn = lambda q_, k_, v_, w: attention_reference(q_, k_, v_, dtype=w, **kw)[:1]  # noqa: E731
    ref, same = ref_grads(fn, (q, k, v), (do,), torch.float64), ref_grads(fn, (q, k, v), (do,), dtype)
    for name, ours, s, r in zip(("dq", "dk", "dv"), grads, same, ref):
        check(ours, s, r, GRAD_EPS[dtype], name, grad_floor(ref))


@given(mask_cases(), st.integers(0, 2), st.booleans())
@fuzz(cpu_examples=15, gpu_examples=4)
def test_scaled_dot_product_attention(c, extra_dims, use_mask):
    """torch's semantics: top-left is_causal (never with a mask), enable_gqa, 3-D to 5-D inputs."""
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    q, k, v = make_inputs(c, g)
    is_causal = c["causal"] and not use_mask
    mask = make_mask(c["mask_kind"], c["mask_shape"], dtype, g) if use_mask else None
    # 3-D: heads folded away (B = 1); 5-D: an extra leading dim of 1.
    if extra_dims == 0 and c["B"] == 1 and c["Hq"] == c["Hkv"] and (mask is None or mask.dim() <= 3):
        q, k, v = (t[0] for t in (q, k, v))
    elif extra_dims == 2:
        q, k, v = (t.unsqueeze(0) for t in (q, k, v))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fl.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=c["scale"],
                                        enable_gqa=c["Hq"] != c["Hkv"])
    four = lambda t: t.reshape(-1, *t.shape[-3:]) if t.dim() >= 4 else t.unsqueeze(0)  # noqa: E731
    kw = dict(causal=is_causal, causal_offset=0, scale=c["scale"], attn_mask=mask)

    def fn(q_, k_, v_, w):
        return (attention_reference(four(q_), four(k_), four(v_), dtype=w, **kw)[0].reshape(o.shape),)

    q4, k4, v4 = four(q), four(k), four(v)
    lse_ref = attention_reference(q4, k4, v4, **kw)[1]
    check(o, fn(q, k, v, dtype)[0], fn(q, k, v, torch.float64)[0], EPS[dtype], "o",
          out_floor(attention_reference, q4, k4, v4, lse_ref, **kw))
    do = rand(o.shape, dtype, g)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref, same = ref_grads(fn, (q, k, v), (do,), torch.float64), ref_grads(fn, (q, k, v), (do,), dtype)
    for name, ours, s, r in zip(("dq", "dk", "dv"), grads, same, ref):
        check(ours, s, r, GRAD_EPS[dtype], name, grad_floor(ref))


# ------------------------------------------------------------------ attention_varlen

@st.composite
def varlen_cases(draw):
    hkv = draw(st.integers(1, 2))
    B = draw(st.integers(1, 4))
    max_n = MAX_N // 2
    c = dict(B=B, Hkv=hkv, Hq=hkv * draw(st.sampled_from([1, 2, 4])),
             lens_q=[draw(st.integers(1, max_n)) for _ in range(B)],
             lens_k=[draw(st.integers(0, max_n)) for _ in range(B)],
             D=draw(HEAD_DIMS), dtype=draw(st.sampled_from(DTYPES)), causal=draw(st.booleans()),
             scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))), give_max=draw(st.booleans()),
             seed=draw(st.integers(0, 2 ** 16)))
    if sum(c["lens_k"]) == 0:  # an all-empty packed k is rejected (nothing to attend to): keep one key
        c["lens_k"][-1] = 1
    c["Dv"] = draw(st.one_of(st.just(c["D"]), HEAD_DIMS))
    params = set(inspect.signature(fl.attention_varlen).parameters)
    c["options"] = draw(score_options(B, c["Hq"], max_n, [n for n in OPTIONS if n in params]))
    # Unchecked bad bounds that clamp to the drawn batch (``seq_bounds``): ours must give that batch;
    # or tensors padded past their batch's rows (a buffer sized for CUDA graphs): those rows see no key.
    alibi = c["options"].get("alibi_slopes")
    per_sequence = alibi is not None and alibi.dim() == 2  # (B, Hq) slopes: no extra sequences
    c["bad_bounds"] = draw(st.sampled_from(["none", "past-total", "negative-first"]
                                           + ([] if per_sequence else ["zero-padded-tail", "padded-rows"])))
    c["pad"] = (draw(st.integers(1, 9)), draw(st.integers(0, 9))) if c["bad_bounds"] == "padded-rows" else (0, 0)
    return c


@pytest.mark.skipif(not HAS_VARLEN, reason="flashattn_lite.attention_varlen does not exist yet")
@given(varlen_cases() if HAS_VARLEN else st.nothing())
@fuzz(cpu_examples=15, gpu_examples=4)
def test_attention_varlen(c):
    from flashattn_lite.reference import attention_varlen_reference
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    def cu(lens):
        return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    cu_q, cu_k = cu(c["lens_q"]), cu(c["lens_k"])
    bounds = dict(check_seqlens=False)
    if c["bad_bounds"] == "past-total":
        bounds.update(cu_seqlens_q=cu_q + torch.tensor([0] * c["B"] + [7], device=DEVICE, dtype=torch.int32))
    elif c["bad_bounds"] == "negative-first":
        bounds.update(cu_seqlens_q=cu_q - torch.tensor([5] + [0] * c["B"], device=DEVICE, dtype=torch.int32))
    elif c["bad_bounds"] == "zero-padded-tail":  # and the reference's batch gains empty sequences
        bounds.update(cu_seqlens_q=torch.cat([cu_q, torch.zeros_like(cu_q[:2])]),
                      cu_seqlens_k=torch.cat([cu_k, torch.zeros_like(cu_k[:2])]))
        cu_q, cu_k = torch.cat([cu_q, cu_q[-1:], cu_q[-1:]]), torch.cat([cu_k, cu_k[-1:], cu_k[-1:]])
    elif c["bad_bounds"] == "padded-rows":  # the reference's batch gains the pad rows as a sequence with no key
        bounds.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        cu_q, cu_k = torch.cat([cu_q, cu_q[-1:] + c["pad"][0]]), torch.cat([cu_k, cu_k[-1:]])
    else:
        bounds = {}
    pad_q, pad_k = c["pad"]
    q = rand((sum(c["lens_q"]) + pad_q, c["Hq"], c["D"]), dtype, g).requires_grad_()
    k = rand((sum(c["lens_k"]) + pad_k, c["Hkv"], c["D"]), dtype, g).requires_grad_()
    v = rand((sum(c["lens_k"]) + pad_k, c["Hkv"], c["Dv"]), dtype, g).requires_grad_()
    maxes = (max(c["lens_q"]), max(c["lens_k"])) if c["give_max"] else (None, None)
    opts = dict(c["options"])
    sinks = opts.pop("sinks", None)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks.detach().requires_grad_())
    kw = dict(causal=c["causal"], scale=c["scale"], **opts)
    call_cu = (bounds.pop("cu_seqlens_q", cu_q), bounds.pop("cu_seqlens_k", cu_k))
    o, lse = fl.attention_varlen(q, k, v, *call_cu, *maxes, return_lse=True,
                                 sinks=inputs[3] if sinks is not None else None, **kw, **bounds)

    ref_kw = dict(kw, window=unbounded_as_none(kw.get("window")))

    def varlen_reference(q_, k_, v_, **kw_):
        return attention_varlen_reference(q_, k_, v_, cu_q.cpu(), cu_k.cpu(), **kw_)

    def fn(q_, k_, v_, *rest):
        *rest, work = rest
        return varlen_reference(q_, k_, v_, dtype=work, sinks=rest[0] if rest else None, **ref_kw)

    o_ref, lse_ref = fn(*inputs, torch.float64)
    if pad_q:  # pad rows are no sequence's: lse −inf even with sinks (the reference's empty one has the sink)
        lse_ref = lse_ref.detach().clone()
        lse_ref[:, -pad_q:] = float("-inf")
    check(o, fn(*inputs, dtype)[0], o_ref, EPS[dtype], "o",
          out_floor(varlen_reference, q, k, v, lse_ref, packed=True, sinks=sinks, **ref_kw))
    close_lse(lse, lse_ref, dtype)
    do = rand(o.shape, dtype, g)
    grads = torch.autograd.grad(o, inputs, do, allow_unused=True)
    one = lambda *a: fn(*a)[:1]  # noqa: E731
    ref, same = ref_grads(one, inputs, (do,), torch.float64), ref_grads(one, inputs, (do,), dtype)
    for name, ours, s, r in zip(("dq", "dk", "dv", "dsinks"), grads, same, ref):
        if r is None:  # no keys at all: nothing to differentiate
            continue
        check(ours, s, r, GRAD_EPS[dtype], name, 1e-3 if name == "dsinks" else grad_floor(ref[:3]))


# ------------------------------------------------------------------ softmax, log_softmax, logsumexp

SOFTMAX_OPS = {
    "softmax": (fl.softmax, torch.softmax, sm.SOFTMAX),
    "log_softmax": (fl.log_softmax, torch.log_softmax, sm.LOG_SOFTMAX),
    "logsumexp": (fl.logsumexp, torch.logsumexp, sm.LOGSUMEXP),
}


@st.composite
def softmax_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    dim = draw(st.integers(-ndim, ndim - 1))
    # The reduced dim gets the long length: several 256-element chunks under the interpreter.
    shape[dim] = draw(st.integers(1, 3000 if ON_GPU else 700))
    op = draw(st.sampled_from(list(SOFTMAX_OPS)))
    if op == "logsumexp" and ndim > 1 and draw(st.booleans()):
        dim = tuple(sorted({dim % ndim, draw(st.integers(0, ndim - 1))}))
    return dict(op=op, shape=shape, dim=dim, dtype=draw(st.sampled_from(DTYPES)),
                layout=draw(st.sampled_from(["contig", "transposed", "sliced"])),
                strategy=draw(st.sampled_from(["auto", "auto", "row", "two_pass", "split"])),
                neg_inf=draw(st.booleans()), shift=draw(st.sampled_from([0.0, 0.0, 1e4, -1e4])),
                keepdim=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


@given(softmax_cases())
@fuzz(cpu_examples=60)
def test_softmax_family(c):
    """Any dim (or dims, logsumexp), any row length, strided inputs, −inf entries, huge offsets,
    each kernel strategy (the public call is "auto")."""
    g = torch.Generator().manual_seed(c["seed"])
    dtype, dim = c["dtype"], c["dim"]
    x = torch.randn(c["shape"], generator=g) * 3 + c["shift"]
    if c["neg_inf"]:
        x[torch.rand(x.shape, generator=g) < 0.3] = float("-inf")
    x = x.to(DEVICE, dtype)
    if c["layout"] == "transposed" and x.dim() > 1:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    elif c["layout"] == "sliced":
        x = torch.cat([x, x], -1)[..., : x.shape[-1]]
    ours_fn, torch_fn, code = SOFTMAX_OPS[c["op"]]
    lse = c["op"] == "logsumexp"
    extra = dict(keepdim=c["keepdim"]) if lse else {}
    xo = x.detach().requires_grad_()
    y = ours_fn(xo, dim, **extra) if c["strategy"] == "auto" else sm._apply(code, xo, dim, strategy=c["strategy"],
                                                                          **extra)

    def fn(x_, w):
        return (torch_fn(x_, dim, **extra),)

    ref, same = fn(x.double(), None)[0], fn(x, None)[0]
    assert y.dtype == dtype and y.shape == ref.shape
    check(y, same, ref, dtype_eps(dtype), f"{c['op']} forward")
    dy = rand(y.shape, dtype, g)
    (dx,) = torch.autograd.grad(y, xo, dy)
    g_ref = ref_grads(fn, (x,), (dy,), torch.float64)[0]
    g_same = ref_grads(fn, (x,), (dy,), dtype)[0]
    assert dx.dtype == dtype
    check(dx, g_same, g_ref, dtype_eps(dtype), f"{c['op']} grad")


# ------------------------------------------------------------------ merge_attention_states(_stacked)

def merge_reference(o_parts, lse_parts, work):
    """float64 merge of S partial states (S first); empty parts (lse = −inf) weigh nothing."""
    lse_parts = lse_parts.to(work)
    lse = torch.logsumexp(lse_parts, 0)
    lse_safe = finite_or_zero(lse)
    w = torch.exp(lse_parts - lse_safe)
    o_parts = torch.where(torch.isneginf(lse_parts).unsqueeze(-1), torch.zeros_like(o_parts), o_parts).to(work)
    return (w.unsqueeze(-1) * o_parts).sum(0), lse


@given(st.integers(1, 5), st.integers(1, 2), st.integers(1, 3), st.integers(1, 9), HEAD_DIMS,
       st.sampled_from(DTYPES), st.sampled_from(["contig", "bnhd", "sliced"]), st.booleans(), st.floats(0, 0.6),
       st.integers(0, 2 ** 16))
@fuzz(cpu_examples=40)
def test_merge_attention_states(S, B, H, N, D, dtype, layout, pair, p_empty, seed):
    """Empty parts (lse = −inf) hold NaN in o: they must be ignored, forward and backward."""
    if pair:
        S = 2
    g = torch.Generator().manual_seed(seed)
    o_parts = [laid_out(rand((B, H, N, D), dtype, g), layout) for _ in range(S)]
    lse_parts = [rand((B, H, N), torch.float32, g, scale=3.0) for _ in range(S)]
    for o_s, l_s in zip(o_parts, lse_parts):
        empty = torch.rand(l_s.shape, generator=g).to(DEVICE) < p_empty
        l_s[empty] = float("-inf")
        o_s.masked_fill_(empty.unsqueeze(-1), float("nan"))
    o_parts = [t.requires_grad_() for t in o_parts]
    lse_parts = [t.requires_grad_() for t in lse_parts]
    if pair:
        o, lse = fl.merge_attention_states(o_parts[0], lse_parts[0], o_parts[1], lse_parts[1])
    else:
        o, lse = fl.merge_attention_states_stacked(torch.stack(o_parts), torch.stack(lse_parts))
    o_stack, lse_stack = torch.stack(o_parts).detach(), torch.stack(lse_parts).detach()
    o_ref, lse_ref = merge_reference(o_stack, lse_stack, torch.float64)
    o_same, _ = merge_reference(o_stack, lse_stack, dtype)
    assert o.dtype == dtype and lse.dtype == torch.float32
    check(o, o_same, o_ref, EPS[dtype], "o")
    close_lse(lse, lse_ref, torch.float32)

    do, dlse = rand(o.shape, dtype, g), rand(lse.shape, torch.float32, g)
    grads = torch.autograd.grad((o, lse), o_parts + lse_parts, (do, dlse))
    live = torch.isfinite(lse_ref)  # rows with at least one non-empty part
    fn = lambda o_, l_, w: merge_reference(o_, l_, w)  # noqa: E731
    ref = ref_grads(fn, (o_stack, lse_stack), (do, dlse * live), torch.float64)
    same = ref_grads(fn, (o_stack, lse_stack), (do, dlse * live), dtype)
    for s in range(S):
        d_o, d_l = grads[s], grads[S + s]
        assert torch.isfinite(d_o).all() and torch.isfinite(d_l).all()
        assert (d_o[~live] == 0).all() and (d_l[~live] == 0).all(), "all-empty rows have no gradient"
        r_o, r_l, s_o, s_l = ref[0][s], ref[1][s], same[0][s], same[1][s]
        ok = live & torch.isfinite(lse_stack[s])
        # Gradients of empty parts are 0 exactly; the rest within float32-merge rounding of float64.
        assert (d_o[~ok] == 0).all() and (d_l[~ok] == 0).all()
        assert_close_to_ref(d_o[ok], s_o[ok], r_o[ok], eps=EPS[dtype], what="d o_s")
        assert_close_to_ref(d_l[ok], s_l[ok], r_l[ok], eps=EPS[dtype], what="d lse_s")


# ------------------------------------------------------------------ decode

@st.composite
def decode_cases(draw):
    hkv = draw(st.integers(1, 2))
    B = draw(st.integers(1, 3))
    nq = draw(st.integers(1, 4))
    cap = draw(st.integers(max(1, nq), 2 * MAX_N))
    paged = draw(st.booleans())
    return dict(B=B, Hkv=hkv, Hq=hkv * draw(st.sampled_from([1, 2, 4, 8])), Nq=nq,
                # Ragged lengths, some shorter than Nq (rows that see no key) or 0.
                lens=[draw(st.one_of(st.integers(0, cap), st.just(cap))) for _ in range(B)], capacity=cap,
                D=draw(HEAD_DIMS), Dv=draw(st.one_of(st.none(), HEAD_DIMS)),
                dtype=draw(st.sampled_from(DTYPES)), block_size=draw(st.integers(1, 40)) if paged else None,
                num_splits=draw(st.one_of(st.none(), st.integers(1, 6))),
                strided=draw(st.booleans()), scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
                # Unchecked bad lengths the kernels clamp to the drawn ones: past a contiguous cache's
                # capacity for the full sequences, below 0 for the empty ones.
                bad_lengths=draw(st.sampled_from(["none", "past-capacity", "negative"])),
                seed=draw(st.integers(0, 2 ** 16)))


def build_cache(c, g):
    """q, caches, seqlens, block table, per-sequence dense K/V. Unused cache slots hold NaN, so a
    read past a sequence's length (or of a block it does not own) poisons the output."""
    B, Hkv, Hq, Nq, D = c["B"], c["Hkv"], c["Hq"], c["Nq"], c["D"]
    Dv = c["Dv"] or D
    dense_k = [torch.randn(Hkv, L, D, generator=g) for L in c["lens"]]
    dense_v = [torch.randn(Hkv, L, Dv, generator=g) for L in c["lens"]]
    q = torch.randn(B, Hq, Nq, D, generator=g)
    bs = c["block_size"]
    if bs is None:
        kc = torch.full((B, Hkv, c["capacity"], D), float("nan"))
        vc = torch.full((B, Hkv, c["capacity"], Dv), float("nan"))
        for b, L in enumerate(c["lens"]):
            kc[b, :, :L], vc[b, :, :L] = dense_k[b], dense_v[b]
        table = None
    else:
        width = -(-c["capacity"] // bs)
        used = [-(-L // bs) for L in c["lens"]]
        n_blocks = sum(used) + 2
        perm = torch.randperm(n_blocks, generator=g).tolist()
        kc = torch.full((n_blocks, Hkv, bs, D), float("nan"))
        vc = torch.full((n_blocks, Hkv, bs, Dv), float("nan"))
        table = torch.full((B, width), -1, dtype=torch.int32)
        for b, L in enumerate(c["lens"]):
            for j in range(used[b]):
                blk = perm.pop()
                table[b, j] = blk
                n = min(bs, L - j * bs)
                kc[blk, :, :n] = dense_k[b][:, j * bs:j * bs + n]
                vc[blk, :, :n] = dense_v[b][:, j * bs:j * bs + n]
        table = table.to(DEVICE)
    to = lambda t: t.to(DEVICE, c["dtype"])  # noqa: E731
    q, kc, vc = to(q), to(kc), to(vc)
    if c["strided"]:  # (…, N, H, D) storage read through a transpose
        q, kc, vc = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, kc, vc))
    seqlens = torch.tensor(c["lens"], dtype=torch.int32, device=DEVICE)
    return q, kc, vc, seqlens, table, [to(k) for k in dense_k], [to(v) for v in dense_v]


@given(decode_cases())
@fuzz(cpu_examples=40)
def test_decode(c):
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    q, kc, vc, seqlens, table, dense_k, dense_v = build_cache(c, g)
    given_lens = seqlens
    if c["bad_lengths"] == "past-capacity" and table is None:
        given_lens = torch.where(seqlens == c["capacity"], seqlens + 13, seqlens)
    elif c["bad_lengths"] == "negative":
        given_lens = torch.where(seqlens == 0, -4, seqlens)
    o, lse = fl.decode(q, kc, vc, given_lens, block_table=table, scale=c["scale"], num_splits=c["num_splits"],
                       return_lse=True, check_values=c["bad_lengths"] == "none")
    assert o.dtype == dtype and o.shape == (c["B"], c["Hq"], c["Nq"], vc.shape[-1])
    for b, L in enumerate(c["lens"]):
        if L == 0:
            assert (o[b] == 0).all() and (lse[b] == float("-inf")).all()
            continue
        args = (q[b:b + 1], dense_k[b][None], dense_v[b][None])
        o_ref, lse_ref = attention_reference(*args, causal=True, scale=c["scale"])
        o_same, _ = attention_reference(*args, causal=True, scale=c["scale"], dtype=dtype)
        check(o[b:b + 1], o_same, o_ref, EPS[dtype], f"o[{b}]",
              out_floor(attention_reference, *args, lse_ref, causal=True, scale=c["scale"]))
        close_lse(lse[b:b + 1], lse_ref, dtype, f"lse[{b}]")


MLA_DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]  # (bf16's tl.dot: GPU only)


@st.composite
def mla_decode_cases(draw):
    """MLA's latent cache (q and the cache 576 wide, v its first 512 columns: one tensor, one KV head):
    on sm_90 the Gluon kernel where its rules allow (pages of 64 or 128, a scale > 0), else the portable
    one (pages of 16, a scale ≤ 0, other devices)."""
    B, nq = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    cap = draw(st.integers(nq, 2000 if ON_GPU else 70))
    return dict(B=B, Hkv=1, Hq=draw(st.sampled_from([1, 16, 40, 128] if ON_GPU else [1, 3, 16])), Nq=nq,
                lens=[draw(st.one_of(st.integers(0, cap), st.just(cap))) for _ in range(B)], capacity=cap,
                D=576, Dv=None, dtype=draw(st.sampled_from(MLA_DTYPES)),
                block_size=draw(st.sampled_from([None, 16, 64, 128] if ON_GPU else [None, 16, 64])),
                num_splits=draw(st.one_of(st.none(), st.integers(1, 6))), strided=draw(st.booleans()),
                scale=draw(st.one_of(st.none(), st.floats(0.01, 0.2), st.floats(-0.1, -0.01))),
                seed=draw(st.integers(0, 2 ** 16)))


@given(mla_decode_cases())
@fuzz(cpu_examples=6, gpu_examples=24)
def test_decode_mla_latent_cache(c):
    g = torch.Generator().manual_seed(c["seed"])
    dtype = c["dtype"]
    q, kc, _, seqlens, table, dense_k, _ = build_cache(c, g)
    o, lse = fl.decode(q, kc, kc[..., :512], seqlens, block_table=table, scale=c["scale"],
                       num_splits=c["num_splits"], return_lse=True, check_values=True)
    assert o.dtype == dtype and o.shape == (c["B"], c["Hq"], c["Nq"], 512)
    for b, L in enumerate(c["lens"]):
        if L == 0:
            assert (o[b] == 0).all() and (lse[b] == float("-inf")).all()
            continue
        args = (q[b:b + 1], dense_k[b][None], dense_k[b][None, ..., :512])
        o_ref, lse_ref = attention_reference(*args, causal=True, scale=c["scale"])
        o_same, _ = attention_reference(*args, causal=True, scale=c["scale"], dtype=dtype)
        check(o[b:b + 1], o_same, o_ref, EPS[dtype], f"o[{b}]",
              out_floor(attention_reference, *args, lse_ref, causal=True, scale=c["scale"]))
        close_lse(lse[b:b + 1], lse_ref, dtype, f"lse[{b}]")
