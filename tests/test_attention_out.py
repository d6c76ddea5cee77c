"""Attention's results written into given tensors (``out`` of ``_forward_impl`` and ``_backward_impl``):
ring attention's step-0 pieces write o, dq, dk, dv straight into their rows of the ring's sums. The
Gluon kernels (sm_90) write into such views themselves; every other path copies its result in. Either
way the view must hold the call's own result, and nothing outside its rows may change.
"""
import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashattn_lite.ops import attention_bwd, attention_bwd_gluon, attention_fwd, attention_fwd_gluon
from flashattn_lite.ops.attention import _backward_impl, _forward_impl, _variant

SENTINEL = 7.0
PAD = 3  # rows of the larger tensor before the view's (and after): they must keep SENTINEL


def _gluon_reason():
    if not ON_GPU or torch.cuda.get_device_capability()[0] != 9:
        return "the Gluon kernels need an sm_90 GPU"
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device="cuda")
    return attention_fwd_gluon.supported(q, q, q)


GLUON = _gluon_reason()


def _rows_of_larger(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the larger tensor, filled with SENTINEL; the view of ``like``'s shape at rows PAD … PAD + N)."""
    B, H, N, D = like.shape
    big = torch.full((B, H, N + 2 * PAD, D), SENTINEL, dtype=like.dtype, device=like.device)
    return big, big[:, :, PAD:PAD + N]


def _untouched(big: torch.Tensor, n: int) -> bool:
    return bool((big[:, :, :PAD] == SENTINEL).all() and (big[:, :, PAD + n:] == SENTINEL).all())


def _inputs(dtype, B, Hq, Hkv, N, D, causal, window, sinks, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, h, N, D, generator=g).to(DEVICE, dtype) for h in (Hq, Hkv, Hkv, Hq))
    sink = torch.randn(Hq, generator=g).to(DEVICE) if sinks else None
    variant = _variant(q, k, window=window, softcap=None, sinks=sink, alibi_slopes=None, offset=0)
    return q, k, v, do, variant


def _check(dtype, B, Hq, Hkv, N, D, causal, window, sinks, close):
    """o, lse and (dq, dk, dv) with ``out`` against the same calls without it."""
    q, k, v, do, variant = _inputs(dtype, B, Hq, Hkv, N, D, causal, window, sinks)
    scale = D ** -0.5
    args = (None, scale, causal, 0, 0.0, 0)
    o_ref, lse_ref = _forward_impl(q, k, v, *args, True, variant)
    big_o, view_o = _rows_of_larger(o_ref)
    o, lse = _forward_impl(q, k, v, *args, True, variant, out=view_o)
    assert o.data_ptr() == view_o.data_ptr() and o.shape == view_o.shape
    assert torch.equal(view_o, o_ref) and torch.equal(lse, lse_ref), "forward"
    assert _untouched(big_o, N), "forward: rows outside the view changed"

    grads_ref = _backward_impl(do, q, k, v, o_ref, lse_ref, None, *args, variant)
    bigs, views = zip(*(_rows_of_larger(t) for t in (q, k, v)))
    grads = _backward_impl(do, q, k, v, o_ref, lse_ref, None, *args, variant, out=views)
    for what, got, view, ref, big in zip(("dq", "dk", "dv"), grads, views, grads_ref, bigs):
        assert got.data_ptr() == view.data_ptr(), what
        close(view, ref, what)  # (the fused dQ adds in any order: dq need not repeat bit for bit)
        assert _untouched(big, N), f"{what}: rows outside the view changed"
    if sinks:
        torch.testing.assert_close(grads[3], grads_ref[3], rtol=1e-4, atol=1e-5)


def _equal(a, b, what):
    assert torch.equal(a, b), what


@pytest.mark.parametrize("twin", [False, True], ids=["kernels", "cpu-twin"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal,window,sinks", [(False, None, False), (True, (5, 0), True)])
def test_out_where_the_results_are_copied_in(dtype, causal, window, sinks, twin, monkeypatch):
    """The portable kernels (interpreted on the CPU) and the CPU twin return new tensors, copied
    into the views: the same bits."""
    if twin:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    _check(dtype, 1, 4, 2, 17, 16, causal, window, sinks, _equal)


def _spy(monkeypatch, module, name: str) -> list:
    """(the ``out`` keyword, the result) of each call of ``module.name`` (still run), as a list."""
    seen, real = [], getattr(module, name)

    def spy(*a, **kw):
        result = real(*a, **kw)
        seen.append((kw.get("out"), result))
        return result
    monkeypatch.setattr(module, name, spy)
    return seen


def _wrote_into(out, result) -> bool:
    """Whether a call given ``out`` returned those very tensors (it wrote them, nothing was copied in)."""
    if isinstance(out, torch.Tensor):
        return result[0] is out
    return all(g is t for g, t in zip(result[:3], out))


@pytest.mark.skipif(GLUON is not None, reason=str(GLUON))
@pytest.mark.parametrize("dtype,D", [(torch.bfloat16, 128), (torch.float16, 64)])
@pytest.mark.parametrize("causal,window,sinks", [(False, None, False), (True, None, True), (True, (300, 0), False)])
@pytest.mark.parametrize("chunked", [False, True])
def test_gluon_kernels_write_into_views(dtype, D, causal, window, sinks, chunked, monkeypatch):
    """The Gluon forward and backward write o and (dq, dk, dv) into rows of larger tensors
    themselves: GQA, an odd length past the causal crossover, the backward whole and in chunks
    (one batch row and KV head a launch, each writing views of the views)."""
    monkeypatch.setattr(attention_fwd, "_HOPPER", {})  # the decisions bound to the spies below
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    forward_outs = _spy(monkeypatch, attention_fwd_gluon, "attention_forward_gluon")
    backward_outs = _spy(monkeypatch, attention_bwd_gluon, "attention_backward_gluon")
    launches = _spy(monkeypatch, attention_bwd_gluon, "_backward")
    if chunked:
        monkeypatch.setattr(attention_bwd_gluon, "DQ_BUFFER_BYTES", 1)
    tol = dict(rtol=2e-2, atol=2e-3) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-4)
    _check(dtype, 2, 8, 2, 2100, D, causal, window, sinks,
           lambda a, b, what: torch.testing.assert_close(a, b, **tol, msg=lambda m: f"{what}: {m}"))
    assert [out is not None for out, _ in forward_outs] == [False, True], "the Gluon forward took out"
    assert _wrote_into(*forward_outs[1]), "the Gluon forward wrote o into out"
    assert [out is not None for out, _ in backward_outs] == [False, True], "the Gluon backward took out"
    assert _wrote_into(*backward_outs[1]), "the Gluon backward wrote the gradients into out"
    assert len(launches) == (2 * 2 * 2 if chunked else 2)  # two calls, each of B · Hkv launches when chunked


@pytest.mark.skipif(GLUON is not None, reason=str(GLUON))
def test_gluon_forward_into_a_view_without_lse():
    """``need_lse=False`` with ``out``: o in the view, no lse."""
    q, k, v, _, variant = _inputs(torch.bfloat16, 2, 8, 2, 2100, 128, True, None, False)
    o_ref, _ = _forward_impl(q, k, v, None, 128 ** -0.5, True, 0, 0.0, 0, True, variant)
    big, view = _rows_of_larger(o_ref)
    o, lse = _forward_impl(q, k, v, None, 128 ** -0.5, True, 0, 0.0, 0, False, variant, out=view)
    assert lse is None and o.data_ptr() == view.data_ptr() and torch.equal(view, o_ref) and _untouched(big, 2100)


def test_writes_into_refuses_what_tma_cannot_store():
    """A view whose base or row stride is not a multiple of 16 bytes, another dtype or shape: no."""
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    v = q
    fine = torch.zeros(1, 2, 10, 64, dtype=torch.float16)[:, :, 1:9]
    assert attention_fwd_gluon.writes_into(fine, q, v)
    odd_base = torch.zeros(1, 2, 8 * 64 + 1, dtype=torch.float16)[:, :, 1:].view(1, 2, 8, 64)
    assert not attention_fwd_gluon.writes_into(odd_base, q, v)
    assert attention_fwd_gluon.writes_into(torch.zeros(1, 2, 8, 72, dtype=torch.float16)[..., :64], q, v)
    assert not attention_fwd_gluon.writes_into(torch.zeros(1, 2, 8, 68, dtype=torch.float16)[..., :64], q, v)
    assert not attention_fwd_gluon.writes_into(fine.float(), q, v)
    assert not attention_fwd_gluon.writes_into(fine[:, :, 1:], q, v)
    broadcast = torch.zeros(1, 1, 8, 64, dtype=torch.float16).expand(1, 2, 8, 64)  # its heads share memory
    assert not attention_fwd_gluon.writes_into(broadcast, q, v)
    cfg = attention_bwd_gluon.default_config(64)
    assert attention_bwd_gluon._takes_out((fine, fine, fine), q, q, q, cfg, None)
    assert not attention_bwd_gluon._takes_out((fine, odd_base, fine), q, q, q, cfg, None)
    assert not attention_bwd_gluon._takes_out((fine, fine, broadcast), q, q, q, cfg, None)
    assert not attention_bwd_gluon._takes_out((fine, fine, fine), q, q, q, cfg._replace(fused_dq=False), None)


def test_gluon_entries_refuse_an_out_they_cannot_write():
    """Given an ``out`` TMA cannot store into, the Gluon entry points raise ValueError naming out
    (before anything launches), rather than write elsewhere."""
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    odd_rows = torch.zeros(1, 2, 8, 66, dtype=torch.float16)[..., :64]  # 132-byte rows
    with pytest.raises(ValueError, match="out must be"):
        attention_fwd_gluon.attention_forward_gluon(q, q, q, 0.125, False, out=odd_rows)
    with pytest.raises(ValueError, match="out must be"):
        attention_bwd_gluon.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.125, causal=False,
                                                     out=(q.clone(), odd_rows, q.clone()))
