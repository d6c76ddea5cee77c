"""attention(): forward, lse and backward against the float64 reference, every option."""
import pytest
import torch

from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only, rel_err
import flashattn_lite.ops.attention as attn_ops
import flashattn_lite.ops.attention_fwd as fwd_mod
from flashattn_lite import attention
from flashattn_lite.ops.attention import attention_core
from flashattn_lite.reference import attention_reference

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}

# (B, Hq, Hkv, Nq, Nk, D, Dv): odd lengths, Nq ≠ Nk both ways, GQA 2:1 / 4:1, MQA, Dv ≠ D.
CPU_SHAPES = [
    (1, 1, 1, 1, 1, 16, 16),
    (1, 2, 1, 17, 17, 40, 40),
    (2, 4, 1, 17, 33, 64, 64),
    (1, 4, 2, 33, 20, 32, 48),
    (1, 2, 2, 1, 40, 80, 80),
]
GPU_SHAPES = [
    (2, 8, 2, 1000, 1000, 64, 64),
    (1, 4, 1, 128, 1000, 128, 128),
    (1, 4, 4, 1000, 128, 80, 80),
    (2, 8, 2, 257, 4097, 96, 96),
    (1, 2, 1, 1000, 1000, 40, 40),
    (1, 2, 2, 300, 300, 256, 256),
    (1, 2, 2, 300, 333, 192, 128),
    (1, 4, 4, 4097, 4097, 128, 128),
    (2, 4, 2, 37, 53, 40, 24),   # a value tile narrower than the key tile (a compiler bug, worked around)
    (1, 2, 1, 100, 100, 64, 16),
]
SHAPES = CPU_SHAPES + (GPU_SHAPES if ON_GPU else [])
# float32 on the GPU: the same kernel source as fp16/bf16 (which run every shape) with CUDA-core dots,
# so lengths 1, 33→20 (GQA, Dv > D) and 257→4097 (D 96) cover its code paths at a fraction of the compiles.
FP32_GPU_SHAPES = [CPU_SHAPES[0], CPU_SHAPES[3], GPU_SHAPES[3]]


def shape_id(s):
    b, hq, hkv, nq, nk, d, dv = s
    return f"b{b}-h{hq}:{hkv}-q{nq}-k{nk}-d{d}" + (f"-dv{dv}" if dv != d else "")


def make_qkv(shape, dtype, *, requires_grad=False, layout="bhnd", seed=0):
    b, hq, hkv, nq, nk, d, dv = shape
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*s, heads):
        if layout == "bnhd":  # (B, N, H, D) storage, handed over as a (B, H, N, D) view
            x = torch.randn(s[0], s[2], heads, s[3], generator=g).to(DEVICE, dtype).transpose(1, 2)
        else:
            x = torch.randn(*s, generator=g).to(DEVICE, dtype)
        return x.requires_grad_(requires_grad)

    return rand(b, hq, nq, d, heads=hq), rand(b, hkv, nk, d, heads=hkv), rand(b, hkv, nk, dv, heads=hkv)


def reference_pair(q, k, v, **kw):
    """(float64 reference, PyTorch's same-dtype computation) outputs and lse."""
    ref = attention_reference(q.detach(), k.detach(), v.detach(), **kw)
    same = attention_reference(q.detach(), k.detach(), v.detach(), dtype=q.dtype, **kw)
    return ref, same


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(shape=FP32_GPU_SHAPES)
def test_forward_and_lse(shape, dtype, causal):
    q, k, v = make_qkv(shape, dtype)
    o, lse = attention(q, k, v, causal=causal, return_lse=True)
    assert o.shape == (*q.shape[:3], v.shape[-1]) and o.dtype == dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    (o_ref, lse_ref), (o_same, _) = reference_pair(q, k, v, causal=causal)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[~finite] == float("-inf")).all()
    assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(shape=FP32_GPU_SHAPES)
def test_backward(shape, dtype, causal):
    q, k, v = make_qkv(shape, dtype, requires_grad=True, seed=1)
    o = attention(q, k, v, causal=causal)
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)

    def grads(work_dtype):
        leaves = [t.detach().to(work_dtype).requires_grad_() for t in (q, k, v)]
        out, _ = attention_reference(*leaves, causal=causal, dtype=work_dtype)
        return torch.autograd.grad(out, leaves, do.to(work_dtype))

    ref, same = grads(torch.float64), grads(dtype)
    for name, ours, s, r in zip(("dq", "dk", "dv"), (dq, dk, dv), same, ref):
        assert ours.shape == r.shape and ours.dtype == dtype
        assert_close_to_ref(ours, s, r, eps=2 * EPS[dtype], what=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_inputs_are_read_in_place(dtype):
    shape = (2, 4, 2, 17, 33, 32, 32)
    q, k, v = make_qkv(shape, dtype, layout="bnhd", requires_grad=True)
    assert not q.is_contiguous()
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    oc, lsec = attention(qc, kc, vc, causal=True, return_lse=True)
    assert torch.equal(o, oc) and torch.equal(lse, lsec)
    do = torch.randn_like(o)
    g = torch.autograd.grad(o, (q, k, v), do)
    gc = torch.autograd.grad(oc, (qc, kc, vc), do)
    for a, b in zip(g, gc):
        assert torch.equal(a, b)


def test_output_takes_q_layout():
    # A model's (B, N, H, D) projection seen as (B, H, N, D): o comes back in (B, N, H, D) storage, as
    # torch's flash SDPA returns it, so the model's o.transpose(1, 2) is contiguous (no copy); a
    # contiguous q gives a contiguous o, and v's head dim apart from q's a contiguous o too.
    q, k, v = make_qkv((2, 4, 2, 17, 33, 32, 32), torch.float16, layout="bnhd")
    o = attention(q, k, v, causal=True)
    assert o.stride() == q.stride() and o.transpose(1, 2).is_contiguous()
    assert attention(q.contiguous(), k, v, causal=True).is_contiguous()
    q, k, v = make_qkv((2, 4, 2, 17, 33, 32, 16), torch.float16, layout="bnhd")
    assert attention(q, k, v).is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_give_zero_not_nan(dtype):
    # causal with Nq > Nk, bottom-right: the first Nq − Nk query rows see no key at all.
    q, k, v = make_qkv((1, 2, 1, 40, 9, 16, 16), dtype, requires_grad=True)
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    hidden = slice(0, 40 - 9)
    assert (o[:, :, hidden] == 0).all() and (lse[:, :, hidden] == float("-inf")).all()
    assert torch.isfinite(o).all()
    (o.float().square().sum() + lse[:, :, 31:].sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, hidden] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_huge_logits_do_not_overflow(dtype):
    q, k, v = make_qkv((1, 2, 2, 33, 47, 32, 32), dtype, requires_grad=True)
    with torch.no_grad():
        q.mul_(300.0)  # with scale 1, scores of magnitude ~1e4
    o, lse = attention(q, k, v, causal=True, scale=1.0, return_lse=True)
    o_ref, lse_ref = attention_reference(q.detach(), k.detach(), v.detach(), causal=True, scale=1.0)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert lse.abs().max() > 1e3
    # With near one-hot rows the output is v at the argmax: compare directly.
    assert (o.double() - o_ref).abs().max() < 5 * EPS[dtype] * 10
    o.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_gradient(dtype):
    q, k, v = make_qkv((1, 4, 2, 17, 33, 32, 32), dtype, requires_grad=True, seed=3)
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    do, dl = torch.randn_like(o), torch.randn_like(lse)
    ours = torch.autograd.grad((o, lse), (q, k, v), (do, dl))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_r, lse_r = attention_reference(*leaves, causal=True)
    ref = torch.autograd.grad((o_r, lse_r), leaves, (do.double(), dl.double()))
    leaves_s = [t.detach().requires_grad_() for t in (q, k, v)]
    o_s, lse_s = attention_reference(*leaves_s, causal=True, dtype=dtype)
    same = torch.autograd.grad((o_s, lse_s), leaves_s, (do, dl.to(dtype)))
    for name, a, s, r in zip(("dq", "dk", "dv"), ours, same, ref):
        assert_close_to_ref(a, s, r, eps=2 * EPS[dtype], what=name)


def test_gradient_of_lse_alone_arrives_broadcast():
    # lse.sum() hands the backward an expanded dlse with stride 0 (the form AOTAutograd uses too).
    q, k, v = make_qkv((1, 2, 1, 19, 23, 16, 16), torch.float32, requires_grad=True, seed=4)
    _, lse = attention(q, k, v, causal=True, return_lse=True)
    ours = torch.autograd.grad(lse.sum(), (q, k))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_reference(*leaves, causal=True)[1].sum(), leaves[:2])
    for a, r in zip(ours, ref):
        assert torch.allclose(a.double(), r, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_no_grad_call_skips_lse_unless_asked(dtype, causal, monkeypatch):
    # Without a backward only return_lse=True needs the lse: otherwise none is allocated or stored
    # (STORE_LSE=False), and o is bitwise the same. Each call twice: on the GPU the second takes the
    # bound launch (_BOUND), whose key must tell the two apart.
    returned, stored = [], []
    forward, kernel = attn_ops.attention_forward, fwd_mod._attn_fwd_kernel
    launch = kernel.launch

    def spy_forward(*a, **kw):
        o, lse = forward(*a, **kw)
        returned.append((kw["need_lse"], lse is None))
        return o, lse

    def spy_launch(grid, args, kw):
        stored.append(kw["STORE_LSE"])
        return launch(grid, args, kw)

    monkeypatch.setattr(attn_ops, "attention_forward", spy_forward)
    monkeypatch.setattr(kernel, "launch", spy_launch)
    monkeypatch.setattr(fwd_mod, "_BOUND", {})  # a fresh cache: the first call of each kind launches
    q, k, v = make_qkv((1, 2, 1, 17, 33, 32, 32), dtype, seed=12)
    with torch.no_grad():
        plain = [attention(q, k, v, causal=causal) for _ in range(2)]
        with_lse = [attention(q, k, v, causal=causal, return_lse=True) for _ in range(2)]
    assert returned == [(False, True)] * 2 + [(True, False)] * 2
    assert stored[0] is False and stored[-1] is True
    (o_ref, lse_ref), (o_same, _) = reference_pair(q, k, v, causal=causal)
    assert_close_to_ref(plain[0], o_same, o_ref, eps=EPS[dtype])
    finite = torch.isfinite(lse_ref)
    for o in plain:
        assert torch.equal(o, with_lse[0][0])
    for o, lse in with_lse:
        assert torch.equal(o, plain[0])
        assert torch.equal(torch.isfinite(lse), finite)
        assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 2e-2)


def test_backward_is_deterministic():
    shape = (1, 4, 1, 65, 70, 32, 32) if not ON_GPU else (2, 8, 2, 1000, 1000, 64, 64)
    q, k, v = make_qkv(shape, torch.float16, requires_grad=True)
    o = attention(q, k, v, causal=True)
    do = torch.randn_like(o)
    first = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    second = torch.autograd.grad(o, (q, k, v), do)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_twin_matches_reference(torch_cpu_path, causal):
    q, k, v = (t.cpu() for t in make_qkv((1, 4, 2, 37, 1100, 24, 40), torch.float32, requires_grad=True))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o, lse = attention(q, k, v, causal=causal, return_lse=True)
    o_ref, lse_ref = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal)
    assert torch.allclose(o.double(), o_ref, atol=1e-5)
    do = torch.randn_like(o)
    ours = torch.autograd.grad(o, (q, k, v), do)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_reference(*leaves, causal=causal)[0], leaves, do.double())
    for a, r in zip(ours, ref):
        assert torch.allclose(a.double(), r, atol=1e-4)


def test_masks_and_top_left_causal():
    # attention_core options used by the SDPA drop-in: bool and additive masks broadcast with
    # stride 0, top-left causal alignment.
    q, k, v = make_qkv((2, 4, 2, 19, 23, 32, 32), torch.float32, requires_grad=True, seed=5)
    bool_mask = torch.rand(2, 1, 19, 23, generator=torch.Generator().manual_seed(0)) > 0.3
    add_mask = torch.randn(1, 4, 1, 23, generator=torch.Generator().manual_seed(1))
    for mask in (bool_mask.to(DEVICE), add_mask.to(DEVICE)):
        o = attention_core(q, k, v, causal=True, causal_offset=0, attn_mask=mask)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        o_ref, _ = attention_reference(*leaves, causal=True, causal_offset=0, attn_mask=mask)
        assert torch.allclose(o.double(), o_ref, atol=2e-3)
        do = torch.randn_like(o)
        ours = torch.autograd.grad(o, (q, k, v), do)
        ref = torch.autograd.grad(o_ref, leaves, do.double())
        for a, r in zip(ours, ref):
            assert torch.allclose(a.double(), r, atol=5e-3)


def test_bad_input_names_the_argument():
    q, k, v = make_qkv((1, 4, 2, 8, 8, 16, 16), torch.float16)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        attention(q[0], k, v)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="k head dim"):
        attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="batch size"):
        attention(q, torch.cat([k, k]), torch.cat([v, v]))
    with pytest.raises(ValueError, match="share one dtype"):
        attention(q, k.float(), v)
    with pytest.raises(TypeError, match="q must have dtype"):
        attention(q.to(torch.int32), k, v)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        attention(q.tolist(), k, v)
    with pytest.raises(ValueError, match="scale must be finite"):
        attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="head dim must be in"):
        big = torch.zeros(1, 1, 4, 300, dtype=torch.float16, device=DEVICE)
        attention(big, big, big)
    with pytest.raises(ValueError, match="sequence length"):
        attention(q, k, v[:, :, :4])


@pytest.mark.parametrize("scale", [0.05, -0.3], ids=["small", "negative"])
def test_explicit_scale(scale):
    q, k, v = make_qkv((1, 2, 1, 21, 30, 32, 32), torch.float32, requires_grad=True, seed=7)
    o, lse = attention(q, k, v, causal=True, scale=scale, return_lse=True)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = attention_reference(*leaves, causal=True, scale=scale)
    assert torch.allclose(o.double(), o_ref, atol=2e-3)
    assert torch.allclose(lse.double(), lse_ref, atol=1e-3)
    do = torch.randn_like(o)
    for a, r in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(o_ref, leaves, do.double())):
        assert torch.allclose(a.double(), r, atol=5e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_float64_cpu_twin(torch_cpu_path, causal):
    # float64 runs on the PyTorch twin only; the same tiled forward/backward formulas as the kernels.
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 1, 5, 7, generator=g) > 0.3

    def f(q, k, v):
        o, lse = attention_core(q, k, v, causal=causal, attn_mask=mask, return_lse=True)
        return o, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_twin_sink_gradient_matches_reference(torch_cpu_path, causal):
    # The twin's dsinks is the kernels' reduction (attention_bwd.sinks_grad); a window leaves some
    # rows with few keys, so the sink weighs differently row to row.
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 4, 17, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 23, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 23, 8, generator=g, requires_grad=True)
    sinks = torch.randn(4, generator=g, requires_grad=True)
    o, lse = attention(q, k, v, causal=causal, window=(5, 3), sinks=sinks, return_lse=True)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    o_ref, lse_ref = attention_reference(*leaves[:3], causal=causal, window=(5, 3), sinks=leaves[3])
    assert torch.allclose(o.double(), o_ref, atol=1e-5)
    assert torch.allclose(lse.double(), lse_ref, atol=1e-5)
    do, dlse = torch.randn_like(o), torch.randn_like(lse)
    ours = torch.autograd.grad((o, lse), (q, k, v, sinks), (do, dlse))
    ref = torch.autograd.grad((o_ref, lse_ref), leaves, (do.double(), dlse.double()))
    for a, r in zip(ours, ref):
        assert torch.allclose(a.double(), r, atol=1e-4)


def test_float64_additive_mask_with_float64_q(torch_cpu_path):
    """A float64 call (the twin's) takes a float64 additive mask; a 16/32-bit call names the dtypes it takes."""
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    mask = torch.randn(1, 1, 5, 7, generator=g, dtype=torch.float64)
    mask[..., 2] = float("-inf")
    o_ref, _ = attention_reference(q, k, v, attn_mask=mask)
    assert rel_err(attention_core(q, k, v, attn_mask=mask), o_ref) < 1e-12
    with pytest.raises(TypeError, match="attn_mask must be bool, float16, bfloat16 or float32 .float64 only"):
        attention_core(q.float(), k.float(), v.float(), attn_mask=mask)


def test_float64_is_refused_by_the_kernels():
    x = torch.randn(1, 1, 4, 16, dtype=torch.float64, device=DEVICE)
    with pytest.raises(TypeError, match="q must have dtype"):
        attention(x, x, x)


def _huge_row_stride_view(n_rows, row_len, dtype, stride=2 ** 21):
    """(1, 1, n_rows, row_len) view whose rows lie ``stride`` elements apart, so row · stride passes
    2³¹ from row 1024 on. Only the touched pages of the (virtual) buffer are ever committed."""
    buf = torch.empty(n_rows * stride, dtype=dtype, device=DEVICE)
    return buf.as_strided((1, 1, n_rows, row_len), (0, 0, stride, 1))


def test_key_row_offsets_beyond_int32():
    # e.g. a (B, N, H, D) cache with H·D = 4096 read in place past N = 512k.
    nk, d = 1056, 16
    k = _huge_row_stride_view(nk, d, torch.float16)
    v = _huge_row_stride_view(nk, d, torch.float16)
    g = torch.Generator().manual_seed(0)
    k.copy_(torch.randn(1, 1, nk, d, generator=g).to(DEVICE, torch.float16))
    v.copy_(torch.randn(1, 1, nk, d, generator=g).to(DEVICE, torch.float16))
    q = torch.randn(1, 1, 3, d, generator=g).to(DEVICE, torch.float16)
    o = attention(q, k, v)
    o_ref, _ = attention_reference(q, k, v)
    assert (o.double() - o_ref).abs().max() < 1e-2


def test_mask_row_offsets_beyond_int32():
    # A dense (Nq, Nk) mask passes 2³¹ elements from Nq·Nk ≈ 46k² on; here via a wide row stride.
    nq, nk = 1100, 16
    mask = _huge_row_stride_view(nq, nk, torch.bool)
    keep = torch.rand(1, 1, nq, nk, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[..., 0] = True
    mask.copy_(keep.to(DEVICE))
    q, k, v = make_qkv((1, 1, 1, nq, nk, 16, 16), torch.float32, requires_grad=True, seed=9)
    o = attention_core(q, k, v, attn_mask=mask)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = attention_reference(*leaves, attn_mask=keep.to(DEVICE))
    assert (o.double() - o_ref).abs().max() < 2e-3
    do = torch.randn_like(o)
    for a, r in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(o_ref, leaves, do.double())):
        assert (a.double() - r).abs().max() < 5e-3


@pytest.mark.skipif(not ON_GPU, reason="65,536+ programs per launch: too slow for the interpreter")
def test_more_than_65535_heads_times_batch():
    # CUDA caps grid axes 1 and 2 at 65,535; every attention launch puts (tile, B·H) on axis 0.
    q, k, v = make_qkv((4100, 16, 16, 17, 17, 16, 16), torch.float16, requires_grad=True)
    o = attention(q, k, v, causal=True)
    o_ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), causal=True)
    assert (o.double() - o_ref).abs().max() < 1e-2
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))


def test_forward_mode_ad_is_refused_not_silently_dropped():
    """Dual tensors do not set requires_grad: the no-gradient shortcut must not take them (it
    would return o without its tangent); autograd.Function refuses them (no jvp rule)."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = make_qkv((1, 2, 2, 5, 7, 16, 16), torch.float32)
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(RuntimeError, match="jvp"):
            attention(dual, k, v)


def test_tf32_follows_torchs_new_precision_setting_too():
    from flashattn_lite.ops.attention_fwd import precision_for
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has only allow_tf32")
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # torch then refuses to read allow_tf32
        assert precision_for(torch.float32) == "tf32"
        matmul.fp32_precision = "ieee"
        assert precision_for(torch.float32) == "ieee"
    finally:
        matmul.fp32_precision = before
    assert precision_for(torch.float16) == "tf32"  # the tl.dot input precision knob only matters for fp32


def test_second_derivative_raises_instead_of_dropping_terms():
    """The backward is a kernel (first derivatives only). Under create_graph=True its gradients must
    not look constant to autograd (a gradient penalty would silently lose its terms through q, k, v):
    they carry a graph whose differentiation raises, as torch's flash and cuDNN backends do. The
    first derivative itself is unchanged."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    w = torch.randn(1, 2, 9, 16, generator=g).to(DEVICE)
    plain = torch.autograd.grad((attention(q, k, v, causal=True) * w).sum(), (q, k, v))
    graph = torch.autograd.grad((attention(q, k, v, causal=True) * w).sum(), (q, k, v), create_graph=True)
    for a, b in zip(plain, graph):
        assert b.requires_grad and torch.equal(a, b.detach())
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad((graph[0] ** 2).sum(), q)
