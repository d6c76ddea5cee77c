"""Tensors past 2^31 elements (and so past 2^31-byte offsets): no int32 offset may wrap; and rows
past 2^24, where float32 no longer holds every integer (ALiBi's distances).

GPU only, and only when selected with ``-m huge`` (each test also skips when the GPU lacks the free
memory it needs). Every operand whose element count passes 2^31 is checked where the offsets are
largest — its last heads, rows or sequences — against a float64 reference computed on that slice
alone (or the same slice run alone), so the whole file runs in about a minute on an 80 GB H100:

    python -m pytest -q -m huge tests/test_huge.py
"""
import pytest
import torch

import flashattn_lite as fl
from conftest import ON_GPU, assert_close_to_ref
from flashattn_lite.reference import attention_reference

pytestmark = [pytest.mark.huge, pytest.mark.skipif(not ON_GPU, reason="needs CUDA and tens of GB")]


@pytest.fixture(autouse=True)
def _only_when_selected(request):
    """Opt-in: the GPU suite runs several workers at once, which these tests would starve of memory."""
    if "huge" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("tens of GB each: run alone with -m huge")

BIG = 2 ** 31
DT = torch.bfloat16
EPS = 1.5e-2  # bf16 (tests/test_attention.py)


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def need(gib: float):
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2 ** 30:
        pytest.skip(f"needs {gib:.0f} GiB free on the GPU, {free / 2 ** 30:.0f} GiB are")


def randn(*shape, dtype=DT):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def check_attention_slice(o, q, k, v, grads, do, sl, **kw):
    """o and (dq, dk, dv) on q/k/v[sl] (a slice of whole heads) against float64 attention on it."""
    qs, ks, vs = (t.detach()[sl].requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(qs, ks, vs, **kw)
    same, _ = attention_reference(qs, ks, vs, dtype=DT, **kw)
    assert_close_to_ref(o[sl], same, ref, eps=EPS, what="o")
    if grads is None:
        return
    ref_g = torch.autograd.grad(ref, (qs, ks, vs), do[sl].double())
    leaves = [t.detach().requires_grad_() for t in (qs, ks, vs)]
    same_g = torch.autograd.grad(attention_reference(*leaves, dtype=DT, **kw)[0], leaves, do[sl])
    for name, ours, s, r in zip(("dq", "dk", "dv"), grads, same_g, ref_g):
        assert_close_to_ref(ours[sl], s, r, eps=2 * EPS, what=name)


def test_attention_q_k_v_o_and_grads_past_2_31_elements():
    B, H, N, D = 1, 16400, 1024, 128
    assert B * H * N * D > BIG
    need(8 * B * H * N * D * 2 / 2 ** 30 + 4)
    q, k, v = (randn(B, H, N, D).requires_grad_() for _ in range(3))
    o = fl.attention(q, k, v, causal=True)
    do = randn(*o.shape)
    grads = torch.autograd.grad(o, (q, k, v), do)
    for sl in ((slice(None), slice(H - 2, H)), (slice(None), slice(0, 1))):
        check_attention_slice(o, q, k, v, grads, do, sl, causal=True)


@pytest.mark.skipif(not hasattr(fl, "attention_varlen"), reason="attention_varlen does not exist yet")
@pytest.mark.parametrize("D", [128, 256])  # d 256: the last sequence's first dq row at q0·Hq·D ≥ 2³¹
def test_varlen_packed_rows_past_2_31_elements(D):
    H, L = 16, 1024
    n_seq = BIG // (L * H * D) + 1
    total = n_seq * L
    assert total * H * D > BIG
    need(8 * total * H * D * 2 / 2 ** 30 + 4)
    cu = torch.arange(0, total + 1, L, dtype=torch.int32, device="cuda")
    q, k, v = (randn(total, H, D).requires_grad_() for _ in range(3))
    o = fl.attention_varlen(q, k, v, cu, cu, L, L, causal=True)
    do = randn(*o.shape)
    grads = torch.autograd.grad(o, (q, k, v), do)
    last = slice(total - L, total)
    as4 = lambda t: t[last].transpose(0, 1).unsqueeze(0)  # noqa: E731
    check_attention_slice(as4(o), as4(q), as4(k), as4(v), [as4(g) for g in grads], as4(do),
                          (slice(None),), causal=True)


@pytest.mark.skipif(not hasattr(fl, "attention_varlen"), reason="attention_varlen does not exist yet")
@pytest.mark.parametrize("softcap", [None, 30.0], ids=["alibi", "softcap-alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_alibi_past_2_24_packed_rows(causal, softcap, gluon_backward_calls):
    """ALiBi's distances stay exact where packed rows pass 2²⁴ (float32 holds only even integers
    there): the last sequence's output and gradients on the Gluon backward equal those of the same
    sequence run alone (rows from 0), with steep slopes so a distance off by one moves a score by a
    whole slope. (A float64 reference would not do: the bf16 one that sets its tolerance rounds the
    steep biases themselves.) d 64 and one head: the Hopper paths take tensors below 2³¹ elements,
    so no other head dim reaches 2²⁴ rows on them."""
    from conftest import rel_err
    calls = gluon_backward_calls
    H, L, D = 1, 2048, 64
    n_seq = 2 ** 24 // L + 2
    total = n_seq * L
    need(12 * total * H * D * 2 / 2 ** 30 + 4)
    slopes = torch.full((H,), 0.75, device="cuda")
    shift = 7  # the first sequence has 7 more keys: later sequences' first key rows ≠ their first query rows
    q, do = (randn(total, H, D) for _ in range(2))
    k, v = (randn(total + shift, H, D) for _ in range(2))

    def run(q_rows, k_rows, n):
        cu_q = torch.arange(0, n + 1, L, dtype=torch.int32, device="cuda")
        cu_k = cu_q.clone()
        if n > L:
            cu_k[1:] += shift
        leaves = [q[q_rows].requires_grad_(), k[k_rows].requires_grad_(), v[k_rows].requires_grad_()]
        o = fl.attention_varlen(*leaves, cu_q, cu_k, causal=causal, alibi_slopes=slopes,
                                softcap=softcap)
        return (o, *torch.autograd.grad(o, leaves, do[q_rows]))
    last_q, last_k = slice(total - L, total), slice(total + shift - L, total + shift)
    o, dq, dk, dv = run(slice(None), slice(None), total)
    batch = [o[last_q], dq[last_q], dk[last_k], dv[last_k]]
    assert calls, "the Gluon backward was not taken"
    alone = run(last_q, last_k, L)
    for name, b, a in zip(("o", "dq", "dk", "dv"), batch, alone):
        assert rel_err(b, a) < 1e-2, f"{name}: {rel_err(b, a):.3e} from the sequence run alone"


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_mask_past_2_31_elements(kind):
    """A (N, N) mask broadcast over heads with N² > 2^31: its last query rows."""
    H, N, D = 2, 46400, 64
    assert N * N > BIG
    need(N * N * (3 if kind == "bool" else 2) / 2 ** 30 + 6)
    if kind == "bool":
        mask = torch.randint(0, 5, (N, N), device="cuda", dtype=torch.uint8) != 0
    else:
        mask = torch.randn(N, N, device="cuda", dtype=DT)
    q, k, v = (randn(1, H, N, D).requires_grad_() for _ in range(3))
    o = fl.nn.FlashAttention()(q, k, v, attn_mask=mask)
    do = randn(*o.shape)
    (dq,) = torch.autograd.grad(o, q, do)
    rows = slice(N - 16, N)
    qs = q.detach()[:, :, rows].requires_grad_()
    ref, _ = attention_reference(qs, k.detach(), v.detach(), attn_mask=mask[rows])
    same, _ = attention_reference(qs.detach(), k.detach(), v.detach(), attn_mask=mask[rows], dtype=DT)
    assert_close_to_ref(o[:, :, rows], same, ref, eps=EPS, what="o")
    (dq_ref,) = torch.autograd.grad(ref, qs, do[:, :, rows].double())
    assert_close_to_ref(dq[:, :, rows], dq_ref.to(DT), dq_ref, eps=2 * EPS, what="dq")


@pytest.mark.parametrize("R,N", [(2 ** 21 + 8, 1024), (130, 2 ** 24)], ids=["many-rows", "split-rows"])
def test_softmax_family_past_2_31_elements(R, N):
    assert R * N > BIG
    need(4 * R * N * 2 / 2 ** 30 + 4)
    x = randn(R, N).requires_grad_()
    tail = x.detach()[-2:].double().requires_grad_()
    for ours, theirs in ((fl.softmax, torch.softmax), (fl.log_softmax, torch.log_softmax),
                         (fl.logsumexp, torch.logsumexp)):
        y = ours(x, -1)
        dy = randn(*y.shape)
        (dx,) = torch.autograd.grad(y, x, dy)
        ref = theirs(tail, -1)
        (dx_ref,) = torch.autograd.grad(ref, tail, dy[-2:].double())
        assert_close_to_ref(y[-2:], theirs(x.detach()[-2:], -1), ref, eps=8e-3, what=f"{ours.__name__} y")
        assert_close_to_ref(dx[-2:], dx_ref.to(DT), dx_ref, eps=8e-3, what=f"{ours.__name__} dx")
        del y, dy, dx


def _decode_reference_check(o, lse, q, k_seq, v_seq, b):
    """Sequence b of a decode call against causal float64 attention over its keys."""
    args = (q[b:b + 1], k_seq, v_seq)
    ref, lse_ref = attention_reference(*args, causal=True)
    same, _ = attention_reference(*args, causal=True, dtype=DT)
    assert_close_to_ref(o[b:b + 1], same, ref, eps=EPS, what=f"decode o[{b}]")
    torch.testing.assert_close(lse[b:b + 1].double(), lse_ref, atol=2e-2, rtol=0)


@pytest.mark.parametrize("splits", [None, 1])
def test_decode_contiguous_cache_past_2_31_elements(splits):
    B, Hq, Hkv, Nmax, D = 3, 32, 8, 2 ** 20, 128
    assert B * Hkv * Nmax * D > BIG
    need(2 * B * Hkv * Nmax * D * 2 / 2 ** 30 + 4)
    k, v = randn(B, Hkv, Nmax, D), randn(B, Hkv, Nmax, D)
    q = randn(B, Hq, 2, D)
    # Sequence 2 starts 2·Hkv·Nmax·D > 2^31 elements into the cache.
    lens = torch.tensor([1000, 1, 5000], dtype=torch.int32, device="cuda")
    o, lse = fl.decode(q, k, v, lens, num_splits=splits, return_lse=True)
    for b, L in enumerate(lens.tolist()):
        _decode_reference_check(o, lse, q, k[b:b + 1, :, :L], v[b:b + 1, :, :L], b)


def test_decode_paged_cache_past_2_31_elements():
    """Blocks at the end of a pool of 2^31+ elements (block ids near num_blocks)."""
    Hq, Hkv, bs, D = 32, 8, 256, 128
    n_blocks = 8200
    assert n_blocks * Hkv * bs * D > BIG
    need(2 * n_blocks * Hkv * bs * D * 2 / 2 ** 30 + 4)
    k, v = randn(n_blocks, Hkv, bs, D), randn(n_blocks, Hkv, bs, D)
    lens = [3000, 700]
    width = 12
    table = torch.full((2, width), -1, dtype=torch.int32)
    table[0, :12] = torch.arange(n_blocks - 12, n_blocks).flip(0)      # the last blocks of the pool
    table[1, :3] = torch.tensor([n_blocks - 13, 5, n_blocks // 2])
    table = table.cuda()
    q = randn(2, Hq, 1, D)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    for splits in (None, 1, 3):
        o, lse = fl.decode(q, k, v, seqlens, block_table=table, num_splits=splits, return_lse=True)
        for b, L in enumerate(lens):
            blocks = table[b, :-(-L // bs)].long()
            k_seq = k[blocks].transpose(0, 1).reshape(Hkv, -1, D)[None, :, :L]
            v_seq = v[blocks].transpose(0, 1).reshape(Hkv, -1, D)[None, :, :L]
            _decode_reference_check(o, lse, q, k_seq, v_seq, b)


@pytest.mark.parametrize("path", ["default", "portable"])
def test_decode_mla_latent_cache_past_2_31_elements(path):
    """MLA's latent cache (576 / 512, v a view of k), whose last sequence starts past 2^31 elements, and
    the last blocks of a paged pool of 2^31+ elements: the default path (on sm_90 with triton 3.6 the
    Gluon kernel, asserted) and the portable kernel."""
    from contextlib import nullcontext

    from flashattn_lite import _launcher
    from flashattn_lite.ops import attention_fwd_hopper, decode_mla_gluon
    Hq, D, Dv = 128, 576, 512
    B, Nmax, n_blocks, bs = 3, 2 ** 21, 58600, 64
    assert 2 * Nmax * D > BIG and n_blocks * bs * D > BIG
    need((B * Nmax + n_blocks * bs) * D * 2 / 2 ** 30 + 6)
    cache, pool = randn(B, 1, Nmax, D), randn(n_blocks, 1, bs, D)
    q = randn(B, Hq, 2, D)
    lens = [700, 1, 3000]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    width = 47
    table = torch.full((B, width), -1, dtype=torch.int32)
    table[0, :11] = torch.arange(n_blocks - 11, n_blocks).flip(0)       # the last blocks of the pool
    table[1, :1] = n_blocks - 12
    table[2, :width] = torch.arange(n_blocks - 59, n_blocks - 12)
    table = table.cuda()
    scale = D ** -0.5
    gluon = path == "default" and decode_mla_gluon.reason(q, pool, pool[..., :Dv], table, scale) is None
    with attention_fwd_hopper.disabled() if path == "portable" else nullcontext(), _launcher.recording() as runs:
        o, lse = fl.decode(q, cache, cache[..., :Dv], seqlens, return_lse=True)
        o_p, lse_p = fl.decode(q, pool, pool[..., :Dv], seqlens, block_table=table, return_lse=True)
    ran = [r.kernel for r in runs]
    assert ran.count("_mla_decode_kernel") == (2 if gluon else 0), ran
    for b, L in enumerate(lens):
        _decode_reference_check(o, lse, q, cache[b:b + 1, :, :L], cache[b:b + 1, :, :L, :Dv], b)
        blocks = table[b, :-(-L // bs)].long()
        k_seq = pool[blocks].reshape(1, 1, -1, D)[:, :, :L]
        _decode_reference_check(o_p, lse_p, q, k_seq, k_seq[..., :Dv], b)


def test_merge_stacked_past_2_31_elements():
    S, B, H, N, D = 2, 1, 16400, 512, 128
    assert S * B * H * N * D > BIG
    need(1.5 * S * B * H * N * D * 2 / 2 ** 30 + 4)
    o_parts = randn(S, B, H, N, D, dtype=torch.float16)
    lse_parts = torch.randn(S, B, H, N, device="cuda") * 3
    o, lse = fl.merge_attention_states_stacked(o_parts, lse_parts)
    tail = (slice(None), slice(None), slice(H - 2, H))
    lse_ref = torch.logsumexp(lse_parts[tail].double(), 0)
    w = torch.exp(lse_parts[tail].double() - lse_ref)
    o_ref = (w.unsqueeze(-1) * o_parts[tail].double()).sum(0)
    torch.testing.assert_close(lse[:, H - 2:].double(), lse_ref, atol=1e-5, rtol=1e-5)
    assert_close_to_ref(o[:, H - 2:], o_ref.half(), o_ref, eps=2e-3, what="merged o")
