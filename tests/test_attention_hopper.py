"""The Hopper forward (TMA descriptors, ops/attention_fwd_hopper.py): against the float64 reference
and the portable kernel, on the same inputs.

On the CPU the Triton interpreter runs the kernel (tensor descriptors included) in fp16/fp32 at
tiny shapes; on an sm_90 GPU, fp16/bf16 at up to 4097 tokens at the
default config, and every config of the benchmark's sweep once on partial tiles. Elsewhere
(another GPU, or a triton without descriptors) the module is skipped.
"""
import functools

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_close_to_ref
from flashattn_lite._runtime import interpreter_active
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops.attention_fwd import attention_forward
from flashattn_lite.reference import attention_reference

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9
EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}


def cannot_run(what: str, tiny_call) -> str | None:
    """Why this machine cannot run ``what`` (a Hopper kernel, in words), or None; ``tiny_call()``
    runs it once on tiny CPU tensors to see whether the interpreter can (the backward's tests too)."""
    if not hopper._HAS_TMA:
        return "this triton has no tensor descriptors"
    if ON_GPU:
        return None if ON_HOPPER else f"{what} needs an sm_90 GPU"
    if not interpreter_active():
        return "CPU without TRITON_INTERPRET=1"
    try:  # the interpreter must run descriptor loads/stores (triton 3.9 does; 3.6's fails on numpy 2.4)
        tiny_call()
    except Exception as e:  # noqa: BLE001 - any failure here means: skip, saying why
        return f"the Triton interpreter cannot run {what} here ({type(e).__name__}: {e})"
    return None


@functools.lru_cache(maxsize=None)
def _cannot_run() -> str | None:
    """Why this machine cannot run the kernel, or None."""
    def tiny_call():
        q = torch.zeros(1, 1, 1, 64, dtype=torch.float16)
        hopper.attention_forward_hopper(q, q, q, 1.0, False)
    return cannot_run("the Hopper kernel", tiny_call)


pytestmark = pytest.mark.skipif(_cannot_run() is not None, reason=str(_cannot_run()))

# (B, Hq, Hkv, Nq, Nk, D): lengths 1, 17, 100 (partial tiles), Nq ≠ Nk both ways (Nq > Nk under
# causal leaves rows with no key), GQA 2:1 and 4:1. COMMON_*: shared with the backward's tests.
COMMON_CPU_SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (1, 2, 1, 17, 17, 64),
    (2, 4, 2, 17, 100, 64),
    (1, 2, 1, 100, 17, 64),
    (1, 2, 2, 1, 100, 128),
]
COMMON_GPU_SHAPES = [
    (1, 2, 2, 1, 1, 64),
    (2, 4, 1, 17, 17, 64),
    (2, 8, 2, 1000, 1000, 64),
    (1, 4, 4, 4097, 4097, 64),
    (1, 4, 1, 1000, 4097, 64),
    (1, 2, 2, 4097, 1000, 64),
    (1, 4, 2, 1, 4097, 64),
]


def shapes(cpu_extra, gpu_extra):
    """The shapes to run here: the common ones plus these; on the GPU each at d 64 and at d 128."""
    if not ON_GPU:
        return COMMON_CPU_SHAPES + cpu_extra
    return [s for base in COMMON_GPU_SHAPES + gpu_extra for s in (base, base[:5] + (128,))]


SHAPES = shapes([(1, 4, 1, 64, 100, 128)], [(1, 4, 2, 17, 1000, 64)])
DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16, torch.float32]
# On the GPU the default config for the shape (the sweep test and the benchmark run the others).
CONFIGS = [None] if ON_GPU else [hopper.INTERPRETER_CONFIG]


def shape_id(s):
    b, hq, hkv, nq, nk, d = s
    return f"b{b}-h{hq}:{hkv}-q{nq}-k{nk}-d{d}"


def config_id(c):
    return "default" if c is None else c.name


def make_qkv(shape, dtype, *, layout="bhnd", seed=0, with_do=False):
    """q, k, v (and with ``with_do`` a dO like q, drawn after them), each (B, H, N, D)."""
    b, hq, hkv, nq, nk, d = shape
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(heads, n):
        if layout == "bnhd":  # (B, N, H, D) storage seen as (B, H, N, D): strided heads and rows
            return torch.randn(b, n, heads, d, generator=g).to(DEVICE, dtype).transpose(1, 2)
        return torch.randn(b, heads, n, d, generator=g).to(DEVICE, dtype)

    qkv = rand(hq, nq), rand(hkv, nk), rand(hkv, nk)
    return qkv + (rand(hq, nq),) if with_do else qkv


def portable(q, k, v, causal):
    with hopper.disabled():  # large plain calls would take the Hopper kernel itself
        return attention_forward(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal,
                                 causal_offset=k.shape[2] - q.shape[2], mask=None, dropout_p=0.0, seed=0)


def check_lse(lse, lse_ref, dtype):
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[~finite] == float("-inf")).all()
    assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 2e-2)


def check_forward(shape, dtype, causal, config):
    q, k, v = make_qkv(shape, dtype)
    assert not ON_GPU or hopper.supported(q, k, v, causal=causal) is None
    o, lse = hopper.attention_forward_hopper(q, k, v, q.shape[-1] ** -0.5, causal, config=config)
    assert o.shape == q.shape and o.dtype == dtype and o.is_contiguous()
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()

    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    check_lse(lse, lse_ref, dtype)
    hidden = ~torch.isfinite(lse_ref)  # rows with no visible key: o = 0 exactly, never NaN
    assert (o[hidden] == 0).all()

    o_port, lse_port = portable(q, k, v, causal)
    assert_close_to_ref(o, o_port, o_ref, eps=EPS[dtype], what="output vs the portable kernel's error")
    check_lse(lse, lse_port.double(), dtype)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_reference_and_portable(shape, dtype, causal, config):
    check_forward(shape, dtype, causal, config)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter runs one config (the test above)")
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in hopper.HEAD_DIMS for c in hopper.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, hopper.Config) else f"d{x}")
def test_every_swept_config_on_partial_tiles(head_dim, config):
    # The benchmark checks each config at lengths that are whole tiles; here the tails and the
    # bottom-right diagonal (Nq < Nk, neither a tile multiple), GQA 2:1.
    check_forward((1, 4, 2, 1000, 1037, head_dim), torch.float16, True, config)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_heads_read_in_place(causal):
    # (B, N, H, D) storage, as HuggingFace models hand it over: the descriptors take the strides.
    shape = (2, 4, 2, 100, 37, 64) if not ON_GPU else (2, 8, 2, 1000, 777, 128)
    dtype = torch.float16
    q, k, v = make_qkv(shape, dtype, layout="bnhd")
    assert not q.is_contiguous()
    config = None if ON_GPU else hopper.INTERPRETER_CONFIG
    o, lse = hopper.attention_forward_hopper(q, k, v, 0.125, causal, config=config)
    oc, lsec = hopper.attention_forward_hopper(q.contiguous(), k.contiguous(), v.contiguous(), 0.125, causal,
                                               config=config)
    assert torch.equal(o, oc) and torch.equal(lse, lsec)


def test_supported_reasons():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16, device=DEVICE)
    if not ON_GPU:
        assert "CUDA" in hopper.supported(q, q, q, causal=True)
        return
    kv = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device=DEVICE)
    assert hopper.supported(q, kv, kv, causal=True, scale=0.1, causal_offset=0) is None
    assert hopper.supported(q, kv, kv, need_lse=False) is None
    assert "head dim" in hopper.supported(q[..., :48], kv[..., :48], kv[..., :48])
    assert "dtype" in hopper.supported(q.float(), kv.float(), kv.float())
    assert "window" in hopper.supported(q, kv, kv, window=(4, 0))
    assert "causal_offset" in hopper.supported(q, kv, kv, causal=True, causal_offset=3)
    assert "scale" in hopper.supported(q, kv, kv, scale=-1.0)
    assert "dropout" in hopper.supported(q, kv, kv, dropout_p=0.1)
    assert "not handled" in hopper.supported(q, kv, kv, frobnicate=True)
    odd = torch.zeros(1, 2, 8, 68, dtype=torch.float16, device=DEVICE)[..., :64]  # rows 136 B apart
    assert "aligned" in hopper.supported(odd, kv, kv)
    assert "strided" in hopper.supported(q.transpose(2, 3).contiguous().transpose(2, 3), kv, kv)
    assert "broadcast" in hopper.supported(q, kv.expand(1, 2, 8, 64), kv.expand(1, 2, 8, 64))
    big = torch.empty(1, 1, 2 ** 31 // 64, 64, dtype=torch.float16, device=DEVICE)  # 4 GiB, never written
    assert "2³¹" in hopper.supported(big, kv[:, :, :1], kv[:, :, :1])


@pytest.mark.skipif(not ON_HOPPER, reason="dispatch to the Hopper kernel happens on sm_90 only")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_dispatches_large_plain_calls_to_it(causal):
    # Large enough to pass MIN_WORK (2·8·2048·2048·128 = 2³³): attention() takes the TMA kernel on
    # the triton it was verified with, and gives what the portable kernel gives; with
    # FLASHATTN_LITE_HOPPER=0 it takes the portable kernel; the backward works from either.
    import triton

    from flashattn_lite import attention, explain
    from flashattn_lite.ops import attention_fwd
    q, k, v = (t.requires_grad_() for t in make_qkv((2, 8, 8, 2048, 2048, 128), torch.bfloat16))
    attention_fwd._HOPPER.clear()
    tested = triton.__version__.startswith(hopper.TESTED_TRITON)
    assert (explain(q, k, v, causal=causal).path == "hopper") == tested
    o = attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(o.float().square().sum(), (q, k, v))
    with hopper.disabled():
        assert explain(q, k, v, causal=causal).path == "triton"
        o_port = attention(q, k, v, causal=causal)
        grads_port = torch.autograd.grad(o_port.float().square().sum(), (q, k, v))
    o_ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal)
    o_same, _ = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal, dtype=torch.bfloat16)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[torch.bfloat16])
    assert_close_to_ref(o, o_port, o_ref, eps=EPS[torch.bfloat16], what="vs the portable kernel")
    for g, gp in zip(grads, grads_port):
        assert (g.float() - gp.float()).norm() <= 2e-2 * gp.float().norm()


def test_the_switch_takes_0_or_1_only(monkeypatch):
    for value, on in (("1", True), ("0", False), ("", True)):
        monkeypatch.setenv("FLASHATTN_LITE_HOPPER", value)
        assert hopper.enabled() is on
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "off")
    with pytest.raises(ValueError, match="FLASHATTN_LITE_HOPPER"):
        hopper.enabled()
    with hopper.disabled():
        assert not hopper.enabled()
