"""attention() variants (window, softcap, sinks, ALiBi), varlen and padded ranges: forward, lse and
backward (sinks included) against the float64 reference, alone and combined."""
import pytest
import torch

from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only, rel_err
from flashattn_lite import attention, attention_varlen
from flashattn_lite.ops.attention import attention_core
from flashattn_lite.reference import attention_reference, attention_varlen_reference

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}

# (name, causal, options); sinks / alibi are built per shape by _options.
CASES = [
    ("window-left-causal", True, dict(window=(5, None))),
    ("window-both", False, dict(window=(4, 3))),
    ("window-0-0", False, dict(window=(0, 0))),
    ("window-right-only", False, dict(window=(-1, 2))),
    ("softcap", False, dict(softcap=2.5)),
    ("softcap-causal", True, dict(softcap=30.0)),
    ("sinks", False, dict(sinks=True)),
    ("sinks-causal-window", True, dict(sinks=True, window=(6, 0))),
    ("alibi-h", True, dict(alibi="h")),
    ("alibi-bh", False, dict(alibi="bh")),
    ("all", True, dict(window=(7, None), softcap=4.0, sinks=True, alibi="bh")),
]
# (B, Hq, Hkv, Nq, Nk, D, Dv)
CPU_SHAPES = [(2, 4, 2, 17, 23, 16, 8), (1, 2, 1, 40, 17, 32, 32)]
GPU_SHAPES = [(2, 8, 2, 1000, 1000, 64, 64), (1, 4, 1, 257, 4097, 128, 128), (1, 4, 4, 1000, 300, 96, 80)]
SHAPES = (CPU_SHAPES[1:] + GPU_SHAPES) if ON_GPU else CPU_SHAPES  # on the GPU one tiny shape is enough
# float32 on the GPU: CUDA-core dots of the fp16/bf16 kernels' source (those run every case at every
# shape), slow to compile (three kernels per option set): one shape of multi-tile windows; "all" switches
# every option's code on (both window sides — causal is the right side at 0 —, softcap with the exact
# tanh, sinks, per-batch ALiBi), then both window sides alone (wide, and zero-width), and sinks alone.
FP32_GPU_CASES = [c for c in CASES if c[0] in ("all", "window-both", "window-0-0", "sinks")]


def _shape_id(s):
    return "b{}-h{}:{}-q{}-k{}-d{}-dv{}".format(*s)


def _scaled_window(window, n):
    """CPU windows are a few keys; on GPU shapes the same case spans a few tiles."""
    if window is None or n < 100:
        return window
    return tuple(w if w is None or w < 0 else w * 37 for w in window)


def _options(opts, shape, dtype, seed=0):
    b, hq = shape[0], shape[1]
    g = torch.Generator().manual_seed(seed)
    out = dict(opts)
    out["window"] = _scaled_window(opts.get("window"), shape[3])
    if opts.get("sinks"):
        out["sinks"] = (torch.randn(hq, generator=g) * 2).to(DEVICE, torch.float32)
    if opts.get("alibi"):
        size = (hq,) if opts["alibi"] == "h" else (b, hq)
        out["alibi_slopes"] = (torch.rand(size, generator=g) * 0.3).to(DEVICE, torch.float32)
        del out["alibi"]
    return {k: v for k, v in out.items() if v is not None}


def _qkv(shape, dtype, seed=0):
    b, hq, hkv, nq, nk, d, dv = shape
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(DEVICE, dtype).requires_grad_()
            for s in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, dv))]


def _finite(x):
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _like(t, seed=1):
    """Random normal values shaped like ``t``, from a seeded generator: a test's inputs must not
    depend on which tests ran before it in its worker (dsinks sums signed terms over rows, and a
    rare draw of dO nearly cancels it)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g).to(t.device, t.dtype)


def _reference_grads(q, k, v, opts, do, dlse, dtype, causal):
    """(o, lse, grads) of the reference in ``dtype`` (sinks' gradient last when present)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    kw = dict(opts)
    if "sinks" in kw:
        kw["sinks"] = kw["sinks"].detach().to(dtype).requires_grad_()
        leaves.append(kw["sinks"])
    o, lse = attention_reference(*leaves[:3], causal=causal, dtype=dtype, **kw)
    loss = (o * do.to(dtype)).sum() + (_finite(lse) * dlse.to(dtype)).sum()
    return o, lse, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(shape=GPU_SHAPES[:1], case=FP32_GPU_CASES)
def test_variant_forward_backward(shape, dtype, case):
    _, causal, opts = case
    q, k, v = _qkv(shape, dtype)
    opts = _options(opts, shape, dtype)
    if "sinks" in opts:
        opts["sinks"].requires_grad_()
    o, lse = attention(q, k, v, causal=causal, return_lse=True, **opts)
    do, dlse = _like(o), _like(lse, seed=2)
    leaves = [q, k, v] + ([opts["sinks"]] if "sinks" in opts else [])
    grads = torch.autograd.grad((o * do).sum() + (_finite(lse) * dlse).sum(), leaves)
    o_ref, lse_ref, g_ref = _reference_grads(q, k, v, opts, do, dlse, torch.float64, causal)
    o_same, _, g_same = _reference_grads(q, k, v, opts, do, dlse, dtype, causal)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 3e-2)
    for name, ours, same, ref in zip(("dq", "dk", "dv", "dsinks"), grads, g_same, g_ref):
        assert ours.shape == ref.shape
        assert_close_to_ref(ours, same, ref, eps=2 * EPS[dtype], what=name)


@pytest.mark.parametrize("softcap", [1e4, 1e6])
def test_fp32_large_softcap_is_float32_exact(softcap):
    """Under a large softcap c, c·tanh(s/c) ≈ s: the float32 tanh is evaluated at |x| ~ 1/c, where
    (1 − e)/(1 + e) cancels (it left ~c·3e-8 on each score: o off by 9e-5 at c = 1e4, 8e-3 at 1e6).
    Forward, lse and backward hold float32 accuracy, as torch in float32 does (~2e-7)."""
    q, k, v = _qkv((1, 2, 1, 19, 37, 16, 16), torch.float32, seed=4)
    o, lse = attention(q, k, v, causal=True, softcap=softcap, return_lse=True)
    do, dlse = _like(o), _like(lse, seed=2)
    grads = torch.autograd.grad((o * do).sum() + (lse * dlse).sum(), (q, k, v))
    opts = dict(softcap=softcap)
    o_ref, lse_ref, g_ref = _reference_grads(q, k, v, opts, do, dlse, torch.float64, True)
    o_same, _, g_same = _reference_grads(q, k, v, opts, do, dlse, torch.float32, True)
    assert_close_to_ref(o, o_same, o_ref, eps=1e-6)
    assert (lse.double() - lse_ref).abs().max() < 1e-5
    for name, ours, same, ref in zip(("dq", "dk", "dv"), grads, g_same, g_ref):
        assert_close_to_ref(ours, same, ref, eps=1e-6, what=name)


def test_options_matter():
    """Each option changes the result (so the tests above would see one being ignored)."""
    shape = (1, 2, 1, 17, 23, 16, 16)
    q, k, v = _qkv(shape, torch.float32)
    base = attention(q, k, v)
    for opts in (dict(window=(3, 3)), dict(softcap=0.5), dict(sinks=torch.full((2,), 2.0, device=DEVICE)),
                 dict(alibi_slopes=torch.full((2,), 0.5, device=DEVICE))):
        assert rel_err(attention(q, k, v, **opts), base) > 1e-2, opts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_alibi_distances_stay_whole_in_16_bits(dtype):
    # The 16-bit reference is the bar the kernels' error is held to (``assert_close_to_ref``): its
    # ALiBi distances must be whole numbers (bf16 holds every integer only up to 256, fp16 2048; the
    # reference forms them as integers and computes in float32), or its own error, and with it the
    # tolerance, grows past what a wrong bias costs.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (300, 3000, 3000))
    slopes = torch.tensor([0.3, 0.05])
    ref, _ = attention_reference(q, k, v, alibi_slopes=slopes)
    plain_ref, _ = attention_reference(q, k, v)
    err = rel_err(attention_reference(q, k, v, alibi_slopes=slopes, dtype=dtype)[0], ref)
    plain = rel_err(attention_reference(q, k, v, dtype=dtype)[0], plain_ref)
    assert err < 2 * plain, f"{dtype}: ALiBi reference error {err:.2e} against {plain:.2e} without"


def test_window_band_crosses_whole_tiles():
    """A band wider than a tile: the unmasked middle stage runs between two masked edges."""
    shape = (1, 2, 1, 70, 90, 32, 32)
    q, k, v = _qkv(shape, torch.float32, seed=3)
    for causal, window in ((False, (20, 20)), (True, (33, None)), (False, (None, 40))):
        o = attention(q, k, v, causal=causal, window=window)
        o_ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal, window=window)
        assert rel_err(o, o_ref) < 1e-4, (causal, window)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_without_keys_give_zero_and_the_sink(dtype):
    q, k, v = _qkv((1, 2, 1, 30, 9, 16, 16), dtype)
    sinks = torch.tensor([0.5, -1.0], device=DEVICE)
    o, lse = attention(q, k, v, causal=True, window=(2, 0), sinks=sinks, return_lse=True)
    hidden = slice(0, 30 - 9)  # bottom-right causal: these rows see no key
    assert (o[:, :, hidden] == 0).all() and torch.isfinite(o).all()
    assert torch.equal(lse[0, :, hidden], sinks[:, None].expand(2, 21).float())


def test_sliding_window_matches_a_dense_mask():
    """window=(W−1, 0) with causal is the Mistral sliding window (i − W < j ≤ i)."""
    q, k, v = _qkv((1, 2, 2, 33, 33, 16, 16), torch.float32)
    w = 8
    i, j = torch.arange(33)[:, None], torch.arange(33)[None, :]
    mask = ((j <= i) & (j > i - w)).to(DEVICE)
    o = attention(q, k, v, causal=True, window=(w - 1, 0))
    o_ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), attn_mask=mask)
    assert rel_err(o, o_ref) < 1e-5


# ------------------------------------------------------------------ varlen

def _packed(lens_q, lens_k, hq, hkv, d, dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = [torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE) for lens in (lens_q, lens_k)]
    tq, tk = sum(lens_q), sum(lens_k)
    t = [torch.randn(*s, generator=g).to(DEVICE, dtype).requires_grad_() for s in ((tq, hq, d), (tk, hkv, d), (tk, hkv, dv))]
    return (*t, *cu)


VARLEN_LENS = ([5, 0, 17, 33, 1], [5, 3, 17, 40, 9])
GPU_VARLEN_LENS = ([1, 1000, 4097, 17, 513], [1, 1000, 4097, 300, 1024])


VARLEN_CASES = [c for c in CASES if c[0] in ("window-both", "softcap-causal", "all")] + [("causal", True, {})]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(case=[c for c in VARLEN_CASES if c[0] in ("all", "causal")])  # with and without the maxima
def test_varlen_matches_each_sequence_alone(dtype, case):
    _, causal, opts = case
    lens_q, lens_k = GPU_VARLEN_LENS if ON_GPU else VARLEN_LENS
    q, k, v, cq, ck = _packed(lens_q, lens_k, 4, 2, 32, 16, dtype)
    opts = _options(opts, (len(lens_q), 4, 2, max(lens_q)), dtype)
    if "sinks" in opts:
        opts["sinks"].requires_grad_()
    mx = (max(lens_q), max(lens_k)) if case[0] == "all" else (None, None)  # FlashAttention's optional maxima
    o, lse = attention_varlen(q, k, v, cq, ck, *mx, causal=causal, return_lse=True, **opts)
    assert o.shape == (q.shape[0], 4, 16) and lse.shape == (4, q.shape[0])
    do, dlse = _like(o), _like(lse, seed=2)
    leaves = [q, k, v] + ([opts["sinks"]] if "sinks" in opts else [])
    grads = torch.autograd.grad((o * do).sum() + (_finite(lse) * dlse).sum(), leaves)

    def ref(dtype_):
        ls = [t.detach().to(dtype_).requires_grad_() for t in leaves]
        kw = dict(opts)
        if "sinks" in kw:
            kw["sinks"] = ls[3]
        o_r, lse_r = attention_varlen_reference(*ls[:3], cq.cpu(), ck.cpu(), causal=causal, dtype=dtype_, **kw)
        g = torch.autograd.grad((o_r * do.to(dtype_)).sum() + (_finite(lse_r) * dlse.to(dtype_)).sum(), ls)
        return o_r, lse_r, g

    o_ref, lse_ref, g_ref = ref(torch.float64)
    o_same, _, g_same = ref(dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    finite = torch.isfinite(lse_ref)
    assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 3e-2)
    for name, ours, same, r in zip(("dq", "dk", "dv", "dsinks"), grads, g_same, g_ref):
        assert_close_to_ref(ours, same, r, eps=2 * EPS[dtype], what=name)


def test_varlen_equals_dense_on_equal_lengths():
    """The dense call is varlen with equal lengths: bit-for-bit the same math per sequence."""
    q, k, v = _qkv((3, 4, 2, 19, 19, 16, 16), torch.float32)
    o = attention(q, k, v, causal=True, window=(4, 0))
    pack = lambda t: t.detach().transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])
    cu = torch.arange(0, 4 * 19, 19, dtype=torch.int32, device=DEVICE)
    ov = attention_varlen(pack(q), pack(k), pack(v), cu, cu, causal=True, window=(4, 0))
    assert rel_err(ov, pack(o)) < 1e-6


@pytest.mark.parametrize("call", [attention_core, attention], ids=["core", "public"])
def test_padded_ranges_match_each_sequence_and_zero_the_padding(call):
    B, L, S = 3, 20, 26
    qr = torch.tensor([[3, 20], [0, 12], [19, 20]], dtype=torch.int32, device=DEVICE)
    kr = torch.tensor([[9, 26], [0, 12], [2, 26]], dtype=torch.int32, device=DEVICE)
    q, k, v = _qkv((B, 4, 2, L, S, 16, 16), torch.float32)
    sinks = torch.randn(4, device=DEVICE)
    o, lse = call(q, k, v, causal=True, window=(4, 0), sinks=sinks, q_ranges=qr, k_ranges=kr, return_lse=True)
    do = _like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    for b in range(B):
        (a0, a1), (b0, b1) = qr[b].tolist(), kr[b].tolist()
        leaves = [t.detach()[b:b + 1, :, r0:r1].double().requires_grad_()
                  for t, (r0, r1) in ((q, (a0, a1)), (k, (b0, b1)), (v, (b0, b1)))]
        o_ref, lse_ref = attention_reference(*leaves, causal=True, window=(4, 0), sinks=sinks)
        g_ref = torch.autograd.grad(o_ref, leaves, do[b:b + 1, :, a0:a1].double())
        assert rel_err(o[b:b + 1, :, a0:a1], o_ref) < 1e-5
        assert rel_err(lse[b:b + 1, :, a0:a1], lse_ref) < 1e-5
        for ours, ref, (r0, r1) in zip((dq, dk, dv), g_ref, ((a0, a1), (b0, b1), (b0, b1))):
            assert rel_err(ours[b:b + 1, :, r0:r1], ref) < 1e-4
        outside_q = torch.ones(L, dtype=torch.bool)
        outside_q[a0:a1] = False
        outside_k = torch.ones(S, dtype=torch.bool)
        outside_k[b0:b1] = False
        assert (o[b][:, outside_q] == 0).all() and (dq[b][:, outside_q] == 0).all()
        assert (dk[b][:, outside_k] == 0).all() and (dv[b][:, outside_k] == 0).all()


# ------------------------------------------------------------------ bad input

def _small():
    return [torch.randn(*s, device=DEVICE) for s in ((1, 2, 5, 8), (1, 1, 5, 8), (1, 1, 5, 8))]


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(window=3), TypeError, "window"),
    (dict(window=(1, 2, 3)), TypeError, "window"),
    (dict(window=(-2, 0)), ValueError, "window left"),
    (dict(window=(0, 1.5)), TypeError, "window right"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=float("nan")), ValueError, "softcap"),
    (dict(softcap="1"), TypeError, "softcap"),
    (dict(sinks=torch.zeros(3)), ValueError, "sinks"),
    (dict(sinks=torch.zeros(2, dtype=torch.int32)), TypeError, "sinks"),
    (dict(sinks=[0.0, 0.0]), TypeError, "sinks"),
    (dict(alibi_slopes=torch.zeros(2, dtype=torch.float16)), TypeError, "alibi_slopes"),
    (dict(alibi_slopes=torch.zeros(2, 2)), ValueError, "alibi_slopes"),
])
def test_bad_options_name_the_argument(kwargs, error, name):
    q, k, v = _small()
    kwargs = {key: (val.to(DEVICE) if isinstance(val, torch.Tensor) else val) for key, val in kwargs.items()}
    with pytest.raises(error, match=name):
        attention(q, k, v, **kwargs)


@pytest.mark.parametrize("cu_q, error, match", [
    ([1, 5, 10], ValueError, "cu_seqlens_q must start at 0"),
    ([0, 6, 5, 10], ValueError, "cu_seqlens_q"),
    ([0, 5, 9], ValueError, "total length"),
    ([[0, 10]], ValueError, "cu_seqlens_q must have shape"),
])
def test_bad_cu_seqlens_raise(cu_q, error, match):
    q, k, v = (torch.randn(10, 2, 8), torch.randn(10, 1, 8), torch.randn(10, 1, 8))
    cu_k = torch.tensor([0, 5, 10], dtype=torch.int32) if len(cu_q) != 4 else torch.tensor([0, 3, 5, 10], dtype=torch.int32)
    with pytest.raises(error, match=match):
        attention_varlen(q, k, v, torch.tensor(cu_q, dtype=torch.int32), cu_k)


def test_bad_varlen_arguments_raise():
    q, k, v = (torch.randn(10, 2, 8), torch.randn(10, 1, 8), torch.randn(10, 1, 8))
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        attention_varlen(q, k, v, cu.long(), cu)
    with pytest.raises(ValueError, match="max_seqlen"):
        attention_varlen(q, k, v, cu, cu, 3, 5)
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        attention_varlen(q[None], k, v, cu, cu)
    with pytest.raises(ValueError, match="same length"):
        attention_varlen(q, k, v, cu, torch.tensor([0, 10], dtype=torch.int32))


def test_bad_ranges_raise():
    q, k, v = _small()
    r = torch.tensor([[0, 5]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="together"):
        attention_core(q, k, v, q_ranges=r)
    with pytest.raises(ValueError, match="k_ranges"):
        attention_core(q, k, v, q_ranges=r, k_ranges=torch.tensor([[0, 6]], dtype=torch.int32, device=DEVICE),
                       check_seqlens=True)
    with pytest.raises(ValueError, match="cannot be combined"):
        attention_core(q, k, v, q_ranges=r, k_ranges=r, causal_offset=0)
    with pytest.raises(ValueError, match="together"):  # the public attention takes them as the core does
        attention(q, k, v, k_ranges=r)
    with pytest.raises(TypeError, match="q_ranges"):
        attention(q, k, v, q_ranges=r.long(), k_ranges=r)
    with pytest.raises(ValueError, match="q_ranges must hold"):
        attention(q, k, v, q_ranges=torch.tensor([[2, 9]], dtype=torch.int32, device=DEVICE), k_ranges=r,
                  check_seqlens=True)


# ------------------------------------------------------------------ GPU only

@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
def test_varlen_without_max_captures_in_a_cuda_graph():
    """No device→host sync: the call records into a CUDA graph, and a new batch of lengths
    replays correctly without recapture."""
    q, k, v, cq, ck = _packed([7, 300, 1], [7, 300, 1], 4, 2, 64, 64, torch.bfloat16)
    q, k, v = (t.detach() for t in (q, k, v))
    attention_varlen(q, k, v, cq, ck, causal=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_varlen(q, k, v, cq, ck, causal=True)
    cq.copy_(torch.tensor([0, 200, 300, 308], dtype=torch.int32))
    ck.copy_(cq)
    graph.replay()
    o_ref, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=True)
    assert rel_err(out, o_ref.to(out.device)) < 2e-2


# ------------------------------------------------------------------ found in review

def test_varlen_with_many_sequences():
    """More sequences than one scan chunk (64) of ``varlen_tile``: a long one first, empty ones among them
    (71 sequences: two chunks; the interpreter's time grows with the count)."""
    g = torch.Generator().manual_seed(7)
    lens = [40] + [int(x) for x in torch.randint(0, 4, (70,), generator=g)]
    q, k, v, cq, ck = _packed(lens, lens, 2, 1, 16, 16, torch.float32)
    o = attention_varlen(q, k, v, cq, ck, causal=True)
    do = _like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = attention_varlen_reference(*leaves, cq.cpu(), ck.cpu(), causal=True)
    g_ref = torch.autograd.grad(o_ref, leaves, do.double())
    assert rel_err(o, o_ref) < 1e-5
    for ours, ref in zip(grads, g_ref):
        assert rel_err(ours, ref) < 1e-5


def _clamped_cu(cu, total):
    """The cu_seqlens that unchecked bad bounds act as: each bound clamped into [0, total], then a
    running max (the kernels clamp each sequence, ``seq_bounds``, and the Gluon backward takes the
    running max, ``nondecreasing_bounds``: the same batch for the cases below)."""
    out = []
    for c in cu:
        out.append(max(min(max(c, 0), total), out[-1] if out else 0))
    return torch.tensor(out, dtype=torch.int32)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _unchecked_batch(bounds, dtype, seed):
    """q, k, v of 13 units of rows (Hq 4, Hkv 2) and ``bounds`` ((q, k) cu_seqlens in units) in rows.
    A unit is 100 rows of d 64 on the GPU, where such a batch takes the Hopper paths; 1 of d 16 on
    the CPU."""
    unit, d = (100, 64) if ON_GPU else (1, 16)
    cu_q, cu_k = ([c * unit for c in cu] for cu in bounds)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(13 * unit, h, d, generator=g).to(DEVICE, dtype).requires_grad_() for h in (4, 2, 2))
    return q, k, v, cu_q, cu_k


BAD_CU = {"past-total": ([0, 5, 40], [0, 7, 60]), "negative": ([-8, 5, 13], [-1, 7, 13]),
          "end-before-start": ([0, 9, 13, 2], [0, 5, 13, 3]),
          "zero-padded-tail": ([0, 5, 13, 0, 0], [0, 7, 13, 0, 0])}  # a preallocated buffer's unused tail


@pytest.mark.parametrize("path", ["kernels"] + ([] if ON_GPU else ["cpu-twin"]))
@pytest.mark.parametrize("bad", BAD_CU, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unchecked_bad_cu_seqlens_act_as_their_clamped_bounds(dtype, bad, path, request):
    """check_seqlens=False (the default on CUDA tensors: a check costs a sync) with bounds past the
    packed total, negative, an end before its start, or a zero-padded tail: the kernels read each
    sequence clamped into the tensors, so nothing outside q, k, v, o is touched (the interpreter
    segfaulted before), and the call computes the batch of the clamped bounds, forward and
    backward. On the CPU the PyTorch twin too."""
    if path == "cpu-twin":
        request.getfixturevalue("torch_cpu_path")
    q, k, v, cu_q, cu_k = _unchecked_batch(BAD_CU[bad], dtype, seed=3)
    o = attention_varlen(q, k, v, _i32(cu_q), _i32(cu_k), causal=True, check_seqlens=False)
    do = _like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)

    def ref(dtype_):
        leaves = [t.detach().to(dtype_).requires_grad_() for t in (q, k, v)]
        o_r, _ = attention_varlen_reference(*leaves, _clamped_cu(cu_q, q.shape[0]), _clamped_cu(cu_k, k.shape[0]),
                                            causal=True, dtype=dtype_)
        return o_r, torch.autograd.grad(o_r, leaves, do.to(dtype_))

    (o_ref, g_ref), (o_same, g_same) = ref(torch.float64), ref(dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    for name, ours, same, r in zip(("dq", "dk", "dv"), grads, g_same, g_ref):
        assert_close_to_ref(ours, same, r, eps=2 * EPS[dtype], what=name)


# Bounds that leave rows outside every sequence (in units, of 13 rows): a batch ending early (a
# buffer padded to a fixed token count, for CUDA graphs), one starting late, both, and a sequence of
# keys that ends early while its queries fill the tensor.
OUTSIDE_CU = {"short-tail": ([0, 5, 9], [0, 7, 10]), "late-start": ([3, 8, 13], [2, 7, 13]),
              "both": ([3, 8, 9], [1, 7, 11]), "keys-only": ([0, 5, 13], [0, 6, 9])}


def _covering_cu(cq, ck, total_q):
    """Reference bounds covering every query row: the rows before the first bound and past the last
    become sequences with no key (o = 0, lse = −inf); key rows outside stay in none (no gradient)."""
    rq, rk = list(cq), list(ck)
    if cq[0] > 0:
        rq, rk = [0] + rq, [ck[0]] + rk
    if cq[-1] < total_q:
        rq, rk = rq + [total_q], rk + [ck[-1]]
    return torch.tensor(rq, dtype=torch.int32), torch.tensor(rk, dtype=torch.int32)


@pytest.mark.parametrize("path", ["kernels"] + ([] if ON_GPU else ["cpu-twin"]))
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("case", OUTSIDE_CU, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_outside_every_sequence_see_no_key(dtype, case, sinks, path, request):
    """Unchecked cu_seqlens that start late or end early (a padded buffer's tail): the rows outside
    every sequence get o = 0 and lse = −inf (sinks or not: they are no sequence's rows) and zero dq,
    dk, dv, never what the allocation held (garbage there flows into the weights' gradients, and
    into dsinks through lse). The rest is the batch of the given bounds."""
    if path == "cpu-twin":
        request.getfixturevalue("torch_cpu_path")
    q, k, v, cq, ck = _unchecked_batch(OUTSIDE_CU[case], dtype, seed=4)
    leaves = (q, k, v)
    opts = dict(causal=True)
    if sinks:
        opts["sinks"] = (torch.randn(q.shape[1], generator=torch.Generator().manual_seed(5)) * 2).to(DEVICE)
        leaves += (opts["sinks"].requires_grad_(),)
    o, lse = attention_varlen(q, k, v, _i32(cq), _i32(ck), check_seqlens=False, return_lse=True, **opts)
    do = _like(o)
    grads = torch.autograd.grad(o, leaves, do)
    ref_q, ref_k = _covering_cu(cq, ck, q.shape[0])

    def ref(dtype_):
        ref_leaves = [t.detach().to(dtype_ if t.dim() > 1 else torch.float64).requires_grad_() for t in leaves]
        ref_opts = dict(opts, sinks=ref_leaves[3]) if sinks else opts
        o_r, lse_r = attention_varlen_reference(*ref_leaves[:3], ref_q, ref_k, dtype=dtype_, **ref_opts)
        return o_r, lse_r, torch.autograd.grad(o_r, ref_leaves, do.to(dtype_))

    (o_ref, lse_ref, g_ref), (o_same, _, g_same) = ref(torch.float64), ref(dtype)
    outside = torch.ones(q.shape[0], dtype=torch.bool, device=DEVICE)
    outside[cq[0]:cq[-1]] = False
    key_outside = torch.ones(k.shape[0], dtype=torch.bool, device=DEVICE)
    key_outside[ck[0]:ck[-1]] = False
    assert not o[outside].any() and bool((lse[:, outside] == float("-inf")).all())
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    lse_in, ref_in = lse[:, ~outside], lse_ref[:, ~outside]
    seen = torch.isfinite(ref_in)  # (a row before its sequence's first visible key has lse −inf)
    assert torch.equal(torch.isfinite(lse_in), seen) and rel_err(lse_in[seen], ref_in[seen]) < EPS[dtype]
    for name, ours, same, r in zip(("dq", "dk", "dv", "dsinks"), grads, g_same, g_ref):
        assert_close_to_ref(ours, same, r, eps=2 * EPS[dtype], what=name)
    assert not grads[0][outside].any() and not grads[1][key_outside].any() and not grads[2][key_outside].any()


def test_strided_bounds_and_sinks_are_read_as_values():
    """Sequence bounds and sinks given as strided views mean their values, as contiguous ones do."""
    q, k, v = _qkv((2, 4, 2, 12, 15, 16, 16), torch.float32)
    sinks = torch.randn(8, device=DEVICE)[::2]
    starts, ends = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE), torch.tensor([12, 9], dtype=torch.int32,
                                                                                          device=DEVICE)
    k_starts, k_ends = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE), torch.tensor([15, 15],
                                                                                             dtype=torch.int32,
                                                                                             device=DEVICE)
    strided = dict(q_ranges=torch.stack([starts, ends]).T, k_ranges=torch.stack([k_starts, k_ends]).T)
    assert not strided["q_ranges"].is_contiguous() and not sinks.is_contiguous()
    kw = dict(causal=True, sinks=sinks, return_lse=True)
    o, lse = attention_core(q, k, v, **strided, **kw)
    o_c, lse_c = attention_core(q, k, v, **{n: r.contiguous() for n, r in strided.items()},
                                **dict(kw, sinks=sinks.contiguous()))
    assert torch.equal(o, o_c) and torch.equal(lse, lse_c)
    pack = lambda t: t.detach()[0].transpose(0, 1)  # noqa: E731
    cu = torch.tensor([0, 0, 5, 5, 12, 12], dtype=torch.int32, device=DEVICE)[::2]  # [0, 5, 12]
    ov = attention_varlen(pack(q), pack(k)[:12], pack(v)[:12], cu, cu)
    ov_c = attention_varlen(pack(q), pack(k)[:12], pack(v)[:12], cu.contiguous(), cu.contiguous())
    assert torch.equal(ov, ov_c)


def test_window_sides_past_the_sequence_are_unbounded():
    q, k, v = _qkv((1, 2, 1, 17, 23, 16, 16), torch.float32)
    o = attention(q, k, v, causal=True)
    for window in ((2 ** 31 - 1, None), (2 ** 31 - 2, 2 ** 31 - 2), (None, 2 ** 40)):
        assert torch.equal(attention(q, k, v, causal=True, window=window), o), window
    with pytest.raises(ValueError, match="causal_offset"):
        attention_core(q, k, v, causal=True, causal_offset=2 ** 31)
    with pytest.raises(TypeError, match="causal_offset"):
        attention_core(q, k, v, causal=True, causal_offset=1.5)


@pytest.mark.parametrize("offset, window", [(40, (45, None)), (-40, (None, 45)), (30, (33, 2)),
                                            (2 ** 30 - 1, (2 ** 30 + 2, 2 ** 30 + 6)),
                                            (1 - 2 ** 30, (2 ** 30 + 6, 2 ** 30 + 1))])
def test_window_sides_are_measured_from_a_far_diagonal(offset, window):
    # A side wider than both sequences still cuts when the diagonal sits far off (ring attention's
    # blocks): it is unbounded only where it cuts nothing, and a side kept near 2^30 with an offset
    # near 2^30 must not overflow the kernels' int32 positions.
    q, k, v = _qkv((1, 2, 1, 9, 7, 16, 16), torch.float32)
    o, lse = attention_core(q, k, v, causal_offset=offset, window=window, return_lse=True)
    o_ref, lse_ref = attention_reference(q, k, v, causal_offset=offset, window=window)
    o_same, _ = attention_reference(q, k, v, causal_offset=offset, window=window, dtype=q.dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=1e-5)
    assert (lse.isinf() == lse_ref.isinf()).all() and not o.isnan().any()
    assert not torch.allclose(o, attention_core(q, k, v, causal_offset=offset))  # the window does cut


def test_sinks_of_rows_without_keys_get_their_lse_gradient():
    """A batch row whose key range is empty has lse = sink: d(Σ lse)/d sink counts its rows."""
    q, k, v = _qkv((2, 2, 1, 5, 6, 16, 16), torch.float32)
    sinks = torch.tensor([0.7, -1.3], device=DEVICE, requires_grad=True)
    qr = torch.tensor([[0, 5], [0, 5]], dtype=torch.int32, device=DEVICE)
    kr = torch.tensor([[0, 6], [3, 3]], dtype=torch.int32, device=DEVICE)  # row 1: no key
    _, lse = attention_core(q, k, v, sinks=sinks, q_ranges=qr, k_ranges=kr, return_lse=True)
    # lse = ln 2 · (sink · log2 e): the sink to float32 rounding
    assert torch.allclose(lse[1], sinks.detach()[:, None].expand(2, 5), rtol=1e-6, atol=1e-6)
    (dsinks,) = torch.autograd.grad(lse.sum(), sinks)
    leaves = [t.detach().double()[0:1] for t in (q, k, v)]
    s64 = sinks.detach().double().requires_grad_()
    _, lse_ref = attention_reference(*leaves, sinks=s64)
    (d_ref,) = torch.autograd.grad(lse_ref.sum(), s64)
    assert torch.allclose(dsinks.double(), d_ref + 5, atol=1e-5)  # row 1's five rows add 1 each
