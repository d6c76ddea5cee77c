"""Invariances: what must not change a result, bit for bit, and where only a bound holds.

Bit-identical:
- a sequence's outputs wherever it sits in its batch (attention, varlen, decode, softmax rows):
  each is computed by programs that read only their own sequence, in the same order;
- decode over a paged cache, whatever the page size, and over the contiguous cache, at one split
  count and one key-tile size (the tile is part of the summation order; autotuning may choose it per
  page size, so the tests pin it through ``decode.decode_forward``'s launch settings);
- every backward, run twice (no atomics whose order varies), and every forward, run twice.

Bounded, not identical: decode's split count changes how the keys are grouped before the partial
states merge, so float32 sums are taken in another order. The bound asserted (and stated in
docs/trust.md): |o(splits) − o(1 split)| ≤ 4 ulp of the output dtype at the row's largest |o|,
plus 16 float32 ulp of max|v| for the float32 accumulation, and |Δlse| ≤ 1e-5·(1 + |lse|).
"""
import pytest
import torch

import flashattn_lite as fl
from conftest import DEVICE, DTYPES, ON_GPU, gpu_fp32_only
from flashattn_lite.ops import decode as decode_module
from flashattn_lite.ops import softmax as sm

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (B, Hq, Hkv, Nq, Nk, D, Dv)
ATTN_SHAPE = (4, 4, 2, 300, 700, 64, 64) if ON_GPU else (3, 4, 2, 9, 21, 16, 8)
# Interpreted kernels are slow: the CPU runs one dtype where the property does not depend on it.
ONE_DTYPE = DTYPES if ON_GPU else [torch.float16]
G = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731


def rand(*shape, dtype, g):
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def same(a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(a, b), f"{what}: max |diff| {(a.double() - b.double()).abs().max().item():.3e}"


def attn_inputs(dtype, seed=0, grad=True):
    B, Hq, Hkv, Nq, Nk, D, Dv = ATTN_SHAPE
    g = G(seed)
    return [rand(*s, dtype=dtype, g=g).requires_grad_(grad) for s in ((B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, Dv))]


OPTION_SETS = {
    "plain": {},
    "causal": dict(causal=True),
    "window-softcap-alibi-sinks": dict(causal=True, window=(5, 0), softcap=8.0, alibi_slopes="per-head", sinks=True),
}


def options(name, Hq):
    kw = dict(OPTION_SETS[name])
    if kw.get("alibi_slopes") == "per-head":
        kw["alibi_slopes"] = torch.linspace(0.1, 1.0, Hq, device=DEVICE)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.linspace(-1.0, 1.0, Hq, device=DEVICE).requires_grad_()
    return kw


def _backward(q, k, v, kw, do):
    o, lse = fl.attention(q, k, v, return_lse=True, **kw)
    leaves = [q, k, v] + ([kw["sinks"]] if "sinks" in kw else [])
    return (o, lse, *torch.autograd.grad((o, lse), leaves, (do, torch.ones_like(lse))))


# float32 on the GPU: the summation order (what these tests pin) is the launch's, not the dtype's; fp16/bf16
# run every option set, float32 the causal one (each float32 option set is a slow compile).
@pytest.mark.parametrize("opts", list(OPTION_SETS))
@pytest.mark.parametrize("dtype", ONE_DTYPE, ids=str)
@gpu_fp32_only(opts=["causal"])
def test_attention_forward_and_backward_are_deterministic(dtype, opts):
    q, k, v = attn_inputs(dtype)
    kw = options(opts, q.shape[1])
    do = rand(*q.shape[:3], v.shape[-1], dtype=dtype, g=G(9))
    first, second = _backward(q, k, v, kw, do), _backward(q, k, v, kw, do)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv", "dsinks"), first, second):
        same(a, b, name)


@pytest.mark.parametrize("opts", list(OPTION_SETS))
@pytest.mark.parametrize("dtype", ONE_DTYPE, ids=str)
@gpu_fp32_only(opts=["causal"])
def test_attention_does_not_depend_on_batch_position(dtype, opts):
    """Batch order reversed, and each sequence alone: the same bits, forward and backward."""
    q, k, v = attn_inputs(dtype)
    B = q.shape[0]
    kw = options(opts, q.shape[1])
    kw.pop("sinks", None)  # its gradient sums over the batch: compared per sequence only without it
    do = rand(*q.shape[:3], v.shape[-1], dtype=dtype, g=G(9))
    base = _backward(q, k, v, kw, do)
    rev = torch.arange(B - 1, -1, -1)
    flipped = _backward(*(t.detach()[rev].requires_grad_() for t in (q, k, v)), kw, do[rev])
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), base, flipped):
        same(a, b[rev], name + " (batch reversed)")
    for b in (0, B - 1):
        alone = _backward(*(t.detach()[b:b + 1].requires_grad_() for t in (q, k, v)), kw, do[b:b + 1])
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), base, alone):
            same(x[b:b + 1], y, f"{name} (sequence {b} alone)")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_does_not_depend_on_position_in_the_packed_batch(dtype):
    """The packed batch in another order (same totals, so the same kernel configuration)."""
    lens_q, lens_k = ([300, 1, 257, 64], [700, 33, 257, 1]) if ON_GPU else ([5, 1, 9], [12, 3, 9])
    Hq, Hkv, D = 4, 2, (64 if ON_GPU else 16)
    g = G(3)
    qs = [rand(n, Hq, D, dtype=dtype, g=g) for n in lens_q]
    ks = [rand(n, Hkv, D, dtype=dtype, g=g) for n in lens_k]
    vs = [rand(n, Hkv, D, dtype=dtype, g=g) for n in lens_k]
    dos = [rand(n, Hq, D, dtype=dtype, g=g) for n in lens_q]

    def run(order):
        cu = lambda lens: torch.tensor([0] + torch.tensor([lens[i] for i in order]).cumsum(0).tolist(),  # noqa: E731
                                       dtype=torch.int32, device=DEVICE)
        q, k, v = (torch.cat([ts[i] for i in order]).requires_grad_() for ts in (qs, ks, vs))
        o, lse = fl.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal=True,
                                     return_lse=True)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.cat([dos[i] for i in order]))
        split = lambda t, lens, dim=0: dict(zip(order, t.split([lens[i] for i in order], dim)))  # noqa: E731
        return (split(o, lens_q), split(lse, lens_q, 1), split(dq, lens_q), split(dk, lens_k), split(dv, lens_k))

    n = len(lens_q)
    base, rolled = run(list(range(n))), run([(i + 1) % n for i in range(n)])
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), base, rolled):
        for i in range(n):
            same(a[i], b[i], f"{name} of sequence {i}")


# ------------------------------------------------------------------ softmax

@pytest.mark.parametrize("strategy", ["auto", "two_pass", "split"])
@pytest.mark.parametrize("dtype", ONE_DTYPE, ids=str)
def test_softmax_rows_do_not_depend_on_their_neighbours(dtype, strategy):
    """Each row alone, and the rows reversed, give the same bits; two runs give the same bits."""
    R, N = (6, 5000) if ON_GPU else (3, 300)
    x = rand(R, N, dtype=dtype, g=G(4)) * 4
    dy = rand(R, N, dtype=dtype, g=G(5))
    for code in (sm.SOFTMAX, sm.LOG_SOFTMAX, sm.LOGSUMEXP):
        def run(x_, dy_):
            xl = x_.detach().requires_grad_()
            y = sm._apply(code, xl, -1, strategy=strategy)
            (dx,) = torch.autograd.grad(y, xl, dy_[..., 0] if code == sm.LOGSUMEXP else dy_)
            return y, dx
        y, dx = run(x, dy)
        for name, a, b in zip(("y", "dx"), (y, dx), run(x, dy)):
            same(a, b, f"op {code} {name} (second run)")
        rev = torch.arange(R - 1, -1, -1)
        for name, a, b in zip(("y", "dx"), (y, dx), run(x[rev], dy[rev])):
            same(a, b[rev], f"op {code} {name} (rows reversed)")
        if strategy == "auto":  # a row alone may take another kernel (the choice depends on the row
            # count on the GPU): the same math, so equal to float32 rounding, not bit for bit
            for name, a, b in zip(("y", "dx"), (y, dx), run(x[1:2], dy[1:2])):
                if ON_GPU:
                    torch.testing.assert_close(a[1:2], b, rtol=1e-5, atol=1e-6, msg=f"op {code} {name} (row alone)")
                else:
                    same(a[1:2], b, f"op {code} {name} (row alone)")


def test_merge_is_deterministic_and_row_local():
    g = G(6)
    o = rand(3, 2, 4, 5, 16, dtype=torch.float32, g=g).requires_grad_()
    lse = rand(3, 2, 4, 5, dtype=torch.float32, g=g).requires_grad_()
    do = rand(2, 4, 5, 16, dtype=torch.float32, g=g)

    def run(o_, lse_, do_):
        o_, lse_ = o_.detach().requires_grad_(), lse_.detach().requires_grad_()
        out, out_lse = fl.merge_attention_states_stacked(o_, lse_)
        return (out, out_lse, *torch.autograd.grad((out, out_lse), (o_, lse_), (do_, torch.ones_like(out_lse))))

    base = run(o, lse, do)
    for name, a, b in zip(("o", "lse", "do", "dlse"), base, run(o, lse, do)):
        same(a, b, name)
    alone = run(o[:, 1:], lse[:, 1:], do[1:])
    for name, a, b in zip(("o", "lse"), base, alone):
        same(a[1:], b, f"{name} (batch entry alone)")


# ------------------------------------------------------------------ decode

def paged(k_dense, v_dense, lengths, block_size, g):
    """The contiguous cache (B, Hkv, Nmax, ·) as pages of ``block_size`` in shuffled blocks."""
    B, Hkv, nmax, D = k_dense.shape
    width = -(-nmax // block_size)
    perm = torch.randperm(B * width, generator=g)
    table = perm.view(B, width).to(torch.int32)
    pad = width * block_size - nmax
    kp = torch.nn.functional.pad(k_dense, (0, 0, 0, pad)).view(B, Hkv, width, block_size, D)
    vp = torch.nn.functional.pad(v_dense, (0, 0, 0, pad)).view(B, Hkv, width, block_size, v_dense.shape[-1])
    k_cache = torch.empty(B * width, Hkv, block_size, D, dtype=k_dense.dtype, device=DEVICE)
    v_cache = torch.empty(B * width, Hkv, block_size, v_dense.shape[-1], dtype=v_dense.dtype, device=DEVICE)
    k_cache[perm] = kp.permute(0, 2, 1, 3, 4).reshape(B * width, Hkv, block_size, D)
    v_cache[perm] = vp.permute(0, 2, 1, 3, 4).reshape(B * width, Hkv, block_size, -1)
    return k_cache, v_cache, table.to(DEVICE)


DECODE = dict(B=3, Hq=8, Hkv=2, Nq=2, D=64, lengths=[3000, 1, 1777]) if ON_GPU else \
    dict(B=3, Hq=4, Hkv=2, Nq=2, D=16, lengths=[70, 1, 45])


def decode_inputs(dtype, seed=7):
    c = DECODE
    g = G(seed)
    nmax = max(c["lengths"]) + 5
    q = rand(c["B"], c["Hq"], c["Nq"], c["D"], dtype=dtype, g=g)
    k = rand(c["B"], c["Hkv"], nmax, c["D"], dtype=dtype, g=g)
    v = rand(c["B"], c["Hkv"], nmax, c["D"], dtype=dtype, g=g)
    return q, k, v, torch.tensor(c["lengths"], dtype=torch.int32, device=DEVICE)


def pinned_tile_decode(q, k_cache, v_cache, lens, block_table=None, *, num_splits):
    """(o, lse) of decode with one key-tile size for every page size: the tile is part of the
    summation order."""
    return decode_module.decode_forward(q, k_cache, v_cache, lens, block_table, scale=q.shape[-1] ** -0.5,
                                        num_splits=num_splits,
                                        launch={"config": (16, 4, 1) if not ON_GPU else (64, 4, 2)})


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(splits=[3])
def test_decode_page_size_does_not_change_the_bits(dtype, splits):
    q, k, v, lens = decode_inputs(dtype)
    base = pinned_tile_decode(q, k, v, lens, num_splits=splits)
    for block_size in (1, 7, 16, 64, 256):
        kc, vc, table = paged(k, v, lens, block_size, G(block_size))
        out = pinned_tile_decode(q, kc, vc, lens, table, num_splits=splits)
        for name, a, b in zip(("o", "lse"), base, out):
            same(a, b, f"{name}, page size {block_size}")


@pytest.mark.parametrize("splits", [None, 1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_does_not_depend_on_batch_position(dtype, splits):
    q, k, v, lens = decode_inputs(dtype)
    base = fl.decode(q, k, v, lens, num_splits=splits, return_lse=True)
    rev = torch.arange(q.shape[0] - 1, -1, -1)
    out = fl.decode(q[rev], k[rev], v[rev], lens[rev], num_splits=splits, return_lse=True)
    for name, a, b in zip(("o", "lse"), base, out):
        same(a, b[rev], f"{name} (batch reversed)")
    if splits is not None:  # None: the split count is chosen from the batch size
        for b in range(q.shape[0]):
            alone = fl.decode(q[b:b + 1], k[b:b + 1], v[b:b + 1], lens[b:b + 1], num_splits=splits, return_lse=True)
            for name, x, y in zip(("o", "lse"), base, alone):
                same(x[b:b + 1], y, f"{name} (sequence {b} alone)")


MLA = dict(B=3, Hq=128, Nq=2, lengths=[3000, 1, 1777]) if ON_GPU else dict(B=3, Hq=3, Nq=2, lengths=[70, 1, 45])


def mla_decode(q, cache, lens, table=None, *, num_splits):
    """(o, lse) of decode against MLA's latent cache (v its first 512 columns). On the GPU as shipped
    (on sm_90 the Gluon kernel, whose 64-key tile is fixed); on the CPU the portable kernel with its
    key tile pinned, as ``pinned_tile_decode``."""
    if ON_GPU:
        return fl.decode(q, cache, cache[..., :512], lens, block_table=table, num_splits=num_splits, return_lse=True)
    return decode_module.decode_forward(q, cache, cache[..., :512], lens, table, scale=576 ** -0.5,
                                        num_splits=num_splits, launch={"config": (16, 8, 1)})


@pytest.mark.parametrize("splits", [1, 3])
def test_mla_decode_does_not_depend_on_batch_position_or_pages(splits):
    from flashattn_lite.ops import decode_mla_gluon
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    c, g = MLA, G(11)
    q = rand(c["B"], c["Hq"], c["Nq"], 576, dtype=dtype, g=g)
    cache = rand(c["B"], 1, max(c["lengths"]) + 5, 576, dtype=dtype, g=g)
    lens = torch.tensor(c["lengths"], dtype=torch.int32, device=DEVICE)
    base = mla_decode(q, cache, lens, num_splits=splits)
    rev = torch.arange(c["B"] - 1, -1, -1)
    for name, a, b in zip(("o", "lse"), base, mla_decode(q[rev], cache[rev], lens[rev], num_splits=splits)):
        same(a, b[rev], f"{name} (batch reversed)")
    for b in range(c["B"]):
        alone = mla_decode(q[b:b + 1], cache[b:b + 1], lens[b:b + 1], num_splits=splits)
        for name, x, y in zip(("o", "lse"), base, alone):
            same(x[b:b + 1], y, f"{name} (sequence {b} alone)")
    # Pages the same kernel takes at the same tile: 64 and 128 rows for the Gluon kernel (smaller ones
    # run the portable kernel on sm_90), any on the CPU.
    gluon = ON_GPU and decode_mla_gluon.reason(q, cache, cache[..., :512], None, 576 ** -0.5) is None
    if ON_GPU and not gluon:
        return
    for block_size in (64, 128) if ON_GPU else (16, 64):
        pool, _, table = paged(cache, cache[..., :1], lens, block_size, G(block_size))
        for name, a, b in zip(("o", "lse"), base, mla_decode(q, pool, lens, table, num_splits=splits)):
            same(a, b, f"{name}, page size {block_size}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_split_count_changes_results_only_within_the_bound(dtype):
    q, k, v, lens = decode_inputs(dtype)
    o1, lse1 = fl.decode(q, k, v, lens, num_splits=1, return_lse=True)
    o1 = o1.double()
    ulp = torch.finfo(dtype).eps
    row_max = o1.abs().amax(-1, keepdim=True)
    bound = 4 * ulp * row_max + 16 * torch.finfo(torch.float32).eps * v.double().abs().max()
    for splits in (2, 3, 5, 8, 16):
        o, lse = fl.decode(q, k, v, lens, num_splits=splits, return_lse=True)
        diff = (o.double() - o1).abs()
        assert (diff <= bound).all(), f"{splits} splits: max |Δo| / bound {(diff / bound).max().item():.2f}"
        fin = torch.isfinite(lse1)  # −inf: a row that sees no key, at any split count
        assert torch.equal(lse[~fin], lse1[~fin]), f"{splits} splits: rows without keys"
        assert ((lse - lse1).abs()[fin] <= 1e-5 * (1 + lse1[fin].abs())).all(), f"{splits} splits: lse"
