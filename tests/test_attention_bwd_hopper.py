"""The Hopper backward (TMA descriptors, ops/attention_bwd_hopper.py): against float64 reference
gradients and the portable backward, on the same saved o and lse.

On the CPU the Triton interpreter runs the kernels (tensor descriptors included) in fp16/fp32 at
tiny shapes (bf16 tl.dot is wrong in the interpreter); on an sm_90 GPU, fp16/bf16 up to 4097
tokens at the default config, and every config of the sweep once on partial tiles. Elsewhere
(another GPU, or a triton without descriptors) the module is skipped, saying why.
"""
import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_close_to_ref
from flashattn_lite.ops import attention_bwd_hopper as hopper_bwd
from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
from flashattn_lite.ops.attention_bwd import attention_backward
from flashattn_lite.reference import attention_reference
from test_attention_hopper import DTYPES, EPS, cannot_run, config_id, make_qkv, shape_id, shapes
from test_attention_hopper import portable as forward  # the portable forward's o and lse, as training hands over


def _tiny_call():
    q = torch.zeros(1, 1, 1, 64, dtype=torch.float16)
    lse = torch.zeros(1, 1, 1)
    hopper_bwd.attention_backward_hopper(q, q, q, q, q, lse, scale=1.0, causal=False)


_CANNOT_RUN = cannot_run("the Hopper backward", _tiny_call)
pytestmark = pytest.mark.skipif(_CANNOT_RUN is not None, reason=str(_CANNOT_RUN))

# The forward tests' shapes (lengths 1, 17, 100, Nq ≠ Nk both ways, GQA 2:1 and on the GPU 4:1),
# and a Nq > Nk tail at d 128 on the CPU.
SHAPES = shapes([(1, 2, 1, 33, 20, 128)], [])
CONFIGS = [None] if ON_GPU else [hopper_bwd.INTERPRETER_CONFIG]


def make_inputs(shape, dtype, *, layout="bhnd", seed=1):
    """q, k, v and dO, each (B, H, N, D); ``bnhd``: (B, N, H, D) storage seen as (B, H, N, D)."""
    return make_qkv(shape, dtype, layout=layout, seed=seed, with_do=True)


def portable_backward(do, q, k, v, o, lse, causal, dlse=None):
    with hopper_fwd.disabled():  # large causal calls would take the Hopper backward itself
        dq, dk, dv, dsinks = attention_backward(do, q, k, v, o, lse, dlse, scale=q.shape[-1] ** -0.5,
                                                causal=causal, causal_offset=k.shape[2] - q.shape[2], mask=None,
                                                dropout_p=0.0, seed=0)
    assert dsinks is None
    return dq, dk, dv


def reference_grads(q, k, v, do, causal, work_dtype, dlse=None):
    leaves = [t.detach().to(work_dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_reference(*leaves, causal=causal, dtype=work_dtype)
    if dlse is None:
        return torch.autograd.grad(out, leaves, do.to(work_dtype))
    return torch.autograd.grad((out, lse), leaves, (do.to(work_dtype), dlse.to(work_dtype)))


def check_backward(shape, dtype, causal, config, *, layout="bhnd", with_dlse=False):
    q, k, v, do = make_inputs(shape, dtype, layout=layout)
    assert not ON_GPU or hopper_bwd.supported(q, k, v, do, causal=causal) is None
    o, lse = forward(q, k, v, causal)
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE) if with_dlse else None
    scale = q.shape[-1] ** -0.5
    ours = hopper_bwd.attention_backward_hopper(do, q, k, v, o, lse, scale=scale, causal=causal, config=config,
                                                dlse=dlse)
    port = portable_backward(do, q, k, v, o, lse, causal, dlse)
    ref = reference_grads(q, k, v, do, causal, torch.float64, dlse)
    same = reference_grads(q, k, v, do, causal, dtype, dlse)
    for name, a, p, s, r, x in zip(("dq", "dk", "dv"), ours, port, same, ref, (q, k, v)):
        # Exactly what the portable backward hands back: empty_like of the input (its strides).
        assert a.shape == p.shape == x.shape and a.dtype == p.dtype == dtype and a.stride() == p.stride(), name
        assert_close_to_ref(a, s, r, eps=2 * EPS[dtype], what=name)
        assert_close_to_ref(a, p, r, eps=2 * EPS[dtype], what=f"{name} vs the portable backward's error")
    hidden = ~torch.isfinite(lse)  # rows with no visible key: no gradient, exactly 0
    assert (ours[0][hidden] == 0).all()
    return ours


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_matches_reference_and_portable(shape, dtype, causal, config):
    check_backward(shape, dtype, causal, config)


def test_rows_with_no_visible_key_are_covered():
    # The causal Nq > Nk shapes above leave rows with no key; make sure the test set has such rows.
    q, k, v, _ = make_inputs((1, 2, 1, 100, 17, 64), torch.float16)
    _, lse = forward(q, k, v, True)
    assert (~torch.isfinite(lse)).any()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dlse_folds_into_delta(causal):
    # The lse's own gradient (training through the lse, e.g. ring attention) goes through δ.
    shape = (1, 2, 1, 33, 20, 64) if not ON_GPU else (1, 4, 2, 1000, 777, 128)
    check_backward(shape, torch.float16, causal, None if ON_GPU else hopper_bwd.INTERPRETER_CONFIG, with_dlse=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_heads_read_and_written_in_place(causal):
    # (B, N, H, D) storage, as HuggingFace models hand it over: the descriptors take the strides and
    # the gradients come back in the inputs' layout (empty_like), equal to the contiguous call's.
    shape = (2, 4, 2, 40, 37, 64) if not ON_GPU else (2, 8, 2, 1000, 777, 128)
    dtype = torch.float16
    config = None if ON_GPU else hopper_bwd.INTERPRETER_CONFIG
    ours = check_backward(shape, dtype, causal, config, layout="bnhd")
    q, k, v, do = make_inputs(shape, dtype, layout="bnhd")
    assert not q.is_contiguous() and ours[0].stride() == q.stride() and ours[1].stride() == k.stride()
    qc, kc, vc, doc = (t.contiguous() for t in (q, k, v, do))
    o, lse = forward(qc, kc, vc, causal)
    contiguous = hopper_bwd.attention_backward_hopper(doc, qc, kc, vc, o, lse, scale=shape[-1] ** -0.5,
                                                      causal=causal, config=config)
    for a, c in zip(ours, contiguous):
        assert torch.equal(a, c)


def test_is_deterministic():
    shape = (1, 4, 2, 40, 37, 64) if not ON_GPU else (2, 8, 2, 2000, 2000, 128)
    q, k, v, do = make_inputs(shape, torch.float16)
    o, lse = forward(q, k, v, True)
    config = None if ON_GPU else hopper_bwd.INTERPRETER_CONFIG
    first = hopper_bwd.attention_backward_hopper(do, q, k, v, o, lse, scale=0.125, causal=True, config=config)
    second = hopper_bwd.attention_backward_hopper(do, q, k, v, o, lse, scale=0.125, causal=True, config=config)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter runs one config (the tests above)")
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in hopper_bwd.HEAD_DIMS for c in hopper_bwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, hopper_bwd.Config) else f"d{x}")
def test_every_swept_config_on_partial_tiles(head_dim, config):
    # The benchmark checks each config at whole-tile lengths; here the tails and the bottom-right
    # diagonal (Nq < Nk, neither a tile multiple), GQA 2:1.
    check_backward((1, 4, 2, 1000, 1037, head_dim), torch.float16, True, config)


def test_supported_reasons():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16, device=DEVICE)
    if not ON_GPU:
        assert "CUDA" in hopper_bwd.supported(q, q, q, q, causal=True)
        return
    kv = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device=DEVICE)
    assert hopper_bwd.supported(q, kv, kv, q, causal=True, scale=0.1, causal_offset=0) is None
    assert hopper_bwd.supported(q, kv, kv, q, causal=True, dlse=torch.zeros(1, 2, 8, device=DEVICE)) is None
    assert "head dim" in hopper_bwd.supported(q[..., :48], kv[..., :48], kv[..., :48], q[..., :48])
    assert "causal_offset" in hopper_bwd.supported(q, kv, kv, q, causal=True, causal_offset=3)
    assert "dropout" in hopper_bwd.supported(q, kv, kv, q, dropout_p=0.1)
    assert "do " in hopper_bwd.supported(q, kv, kv, q.float())
    assert "broadcast" in hopper_bwd.supported(q, kv, kv, torch.ones(1, 1, 1, 64, dtype=q.dtype,
                                                                     device=DEVICE).expand_as(q))
    odd = torch.zeros(1, 2, 8, 68, dtype=torch.float16, device=DEVICE)[..., :64]  # rows 136 B apart
    assert "aligned" in hopper_bwd.supported(q, kv, kv, odd)


@pytest.mark.parametrize("loss", ["square", "sum", "with_lse"])
def test_attention_backward_dispatch(monkeypatch, loss):
    # attention()'s backward takes the Hopper kernels for plain causal calls the fast path accepts
    # (on the CPU the decision is faked and the interpreter runs them), and gives the portable
    # backward's gradients: with a dense dO, an expanded one (o.sum()), and with the lse's own
    # gradient. Non-causal calls keep the portable kernels.
    from flashattn_lite import attention
    from flashattn_lite.ops import attention_bwd, attention_bwd_gluon
    calls = []
    real = hopper_bwd.attention_backward_hopper
    # The Gluon backward comes first where it runs (tests/test_attention_bwd_gluon.py); off here.
    monkeypatch.setattr(attention_bwd_gluon, "fast_path", lambda *args: False)

    def counting(*args, **kwargs):
        calls.append(kwargs["causal"])
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper_bwd, "attention_backward_hopper", counting)
    if not ON_GPU:
        monkeypatch.setattr(hopper_bwd, "fast_path",
                            lambda do, q, k, v, causal, offset, scale: causal and hopper_fwd.enabled())
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    shape, dtype = ((2, 8, 4, 2048, 2048, 128), torch.bfloat16) if ON_GPU else ((1, 2, 1, 20, 37, 64), torch.float16)

    def grads(causal):
        q, k, v = (t.requires_grad_() for t in make_qkv(shape, dtype, seed=3))
        o, lse = attention(q, k, v, causal=causal, return_lse=True)
        if loss == "square":
            total = o.float().square().sum()
        elif loss == "sum":
            total = o.sum()
        else:
            total = o.float().square().sum() + lse[lse.isfinite()].sum()
        return torch.autograd.grad(total, (q, k, v))

    for causal in (True, False):
        calls.clear()
        got = grads(causal)
        assert calls == ([True] if causal else [])
        with hopper_fwd.disabled():
            want = grads(causal)
        assert calls == ([True] if causal else [])
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert (g.float() - w.float()).norm() <= 2e-2 * w.float().norm()
