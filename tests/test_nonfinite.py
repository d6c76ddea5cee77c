"""NaN and ±inf in the inputs: what comes out (the contract in docs/trust.md).

The rule: a non-finite input poisons exactly what it feeds, as in torch's math (softmax(q·kᵀ)·v in
float64), and nothing else — every output it cannot reach is bit-identical to the run without it.
No call hangs, crashes or raises on non-finite values. Two documented differences from torch:
a query row with every key masked gives 0, not NaN; and a non-finite value of v at a key a row does
not see may or may not reach that row (torch's 0·NaN = NaN when the key's tile is computed, nothing
when the tile is skipped), so only the columns it sits in are unspecified there.
"""
import math

import pytest
import torch

import flashattn_lite as fl
from conftest import DEVICE, DTYPES, ON_GPU, gpu_fp32_only
from flashattn_lite.ops import softmax as sm

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NAN, INF = float("nan"), float("inf")
VALUES = [NAN, INF, -INF]
VALUE_IDS = ["nan", "+inf", "-inf"]
# (B, H, Nq, Nk, D): Nq ≤ Nk, so with bottom-right causal every row sees a key.
SHAPE = (2, 2, 150, 300, 64) if ON_GPU else (2, 2, 12, 40, 16)
ROW, KEY, COL = 3, 35 if not ON_GPU else 290, 5  # the poisoned query row, key and head-dim column


def inputs(dtype, seed=0):
    B, H, Nq, Nk, D = SHAPE
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(DEVICE, dtype) for s in ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D))]


def torch_math(q, k, v, causal, mask=None):
    """torch's semantics in float64: softmax(scale·q·kᵀ + mask) · v, bottom-right causal."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s + mask.double()
    if causal:
        nq, nk = s.shape[-2:]
        hidden = torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(nk - nq + 1)
        s = s.masked_fill(hidden, -INF)
    return torch.softmax(s, -1) @ v


def same_nonfinite(ours, ref, what):
    """Where the reference is NaN or ±inf, ours is the same; where it is finite, ours is too."""
    ours = ours.double()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref)), f"{what}: NaN pattern differs from torch's"
    assert torch.equal(torch.isposinf(ours), torch.isposinf(ref)) and torch.equal(torch.isneginf(ours),
                                                                                   torch.isneginf(ref)), what


def sees(causal):
    """Bool (Nq,): which query rows see key KEY."""
    _, _, Nq, Nk, _ = SHAPE
    rows = torch.arange(Nq, device=DEVICE)
    return rows + (Nk - Nq) >= KEY if causal else torch.ones(Nq, dtype=torch.bool, device=DEVICE)


# float32 on the GPU: causal only — its rows include both those that see the poisoned entry and those
# that do not, and each float32 kernel is a slow compile (fp16/bf16 run both).
@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(causal=[True])
def test_attention_poisoned_q_row(dtype, causal, value):
    q, k, v = (t.requires_grad_() for t in inputs(dtype))
    clean = fl.attention(q, k, v, causal=causal)
    do = torch.randn_like(clean)
    (dq_clean,) = torch.autograd.grad(clean, q, do)
    qb = q.detach().clone()
    qb[0, 1, ROW, COL] = value
    qb.requires_grad_()
    o = fl.attention(qb, k, v, causal=causal)
    same_nonfinite(o, torch_math(qb.detach(), k.detach(), v.detach(), causal), "o")
    assert torch.isnan(o[0, 1, ROW]).all()
    others = torch.ones_like(o, dtype=torch.bool)
    others[0, 1, ROW] = False
    assert torch.equal(o[others], clean[others]), "rows the NaN cannot reach changed"
    (dq,) = torch.autograd.grad(o, qb, do)
    others = torch.ones_like(dq, dtype=torch.bool)
    others[0, 1, ROW] = False
    assert torch.equal(dq[others], dq_clean[others]), "dq of the other rows changed"


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(causal=[True])
def test_attention_poisoned_key(dtype, causal, value):
    q, k, v = inputs(dtype)
    clean = fl.attention(q, k, v, causal=causal)
    k[0, 1, KEY, COL] = value
    o = fl.attention(q, k, v, causal=causal)
    same_nonfinite(o, torch_math(q, k, v, causal), "o")
    blind = ~sees(causal)
    # Rows that do not see the key: masked before the softmax, bit-identical to the clean run.
    assert torch.equal(o[0, 1, blind], clean[0, 1, blind])
    assert torch.equal(o[1], clean[1]) and torch.equal(o[0, 0], clean[0, 0])


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(causal=[True])
def test_attention_poisoned_value(dtype, causal, value):
    q, k, v = inputs(dtype)
    clean = fl.attention(q, k, v, causal=causal)
    v[0, 1, KEY, COL] = value
    o = fl.attention(q, k, v, causal=causal)
    seen = sees(causal)
    ref = torch_math(q, k, v, causal)
    same_nonfinite(o[0, 1, seen], ref[0, 1, seen], "rows that see the key")
    # Every other column, and the other heads and batches, are untouched.
    other_cols = torch.ones(o.shape[-1], dtype=torch.bool, device=DEVICE)
    other_cols[COL] = False
    assert torch.equal(o[0, 1][:, other_cols], clean[0, 1][:, other_cols])
    assert torch.equal(o[1], clean[1]) and torch.equal(o[0, 0], clean[0, 0])
    # Rows that do not see the key: its column is the clean value or NaN (0·value), nothing else.
    blind = o[0, 1, ~seen, COL]
    assert (torch.isnan(blind) | (blind == clean[0, 1, ~seen, COL])).all()


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_float_mask_entries(dtype, value):
    """NaN or +inf added to one score poisons its row (as in torch); −inf removes the key exactly
    as a False in a bool mask does."""
    q, k, v = inputs(dtype)
    Nq, Nk = q.shape[2], k.shape[2]
    attn = fl.nn.FlashAttention(causal=True)
    mask = torch.zeros(Nq, Nk, device=DEVICE)
    clean = attn(q, k, v, attn_mask=mask)
    mask[ROW, KEY - 20] = value
    o = attn(q, k, v, attn_mask=mask)
    same_nonfinite(o, torch_math(q, k, v, True, mask), "o")
    others = torch.ones(Nq, dtype=torch.bool, device=DEVICE)
    others[ROW] = False
    assert torch.equal(o[:, :, others], clean[:, :, others])
    if value == -INF:  # the same attention as a bool mask (to rounding: the bool path folds the
        # scale into the exponent's FMA, the additive one scales first)
        keep = torch.ones(Nq, Nk, dtype=torch.bool, device=DEVICE)
        keep[ROW, KEY - 20] = False
        o_bool = attn(q, k, v, attn_mask=keep)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert ((o.float() - o_bool.float()).norm() / o_bool.float().norm()).item() < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_are_zero_with_zero_gradient(dtype):
    q, k, v = (t.requires_grad_() for t in inputs(dtype))
    mask = torch.zeros(q.shape[2], k.shape[2], device=DEVICE)
    mask[ROW] = -INF
    o = fl.nn.FlashAttention()(q, k, v, attn_mask=mask)
    assert (o[:, :, ROW] == 0).all() and torch.isfinite(o).all()
    (dq,) = torch.autograd.grad(o, q, torch.randn_like(o))
    assert (dq[:, :, ROW] == 0).all() and torch.isfinite(dq).all()


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_sinks(value):
    """A NaN or +inf sink makes its head NaN (o and lse; the exact limit of +inf would be o = 0,
    lse = +inf); −inf is no sink at all, bit for bit. Other heads are untouched."""
    q, k, v = inputs(torch.float16)
    sinks = torch.zeros(q.shape[1], device=DEVICE)
    clean, clean_lse = fl.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    sinks[1] = value
    o, lse = fl.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(o[:, 0], clean[:, 0]) and torch.equal(lse[:, 0], clean_lse[:, 0])
    if value == -INF:
        o_none, lse_none = fl.attention(q, k, v, causal=True, return_lse=True)
        assert torch.equal(o[:, 1], o_none[:, 1]) and torch.equal(lse[:, 1], lse_none[:, 1])
    else:
        assert torch.isnan(o[:, 1]).all() and torch.isnan(lse[:, 1]).all()


# ------------------------------------------------------------------ softmax family

TORCH_OPS = {sm.SOFTMAX: torch.softmax, sm.LOG_SOFTMAX: torch.log_softmax, sm.LOGSUMEXP: torch.logsumexp}


@pytest.mark.parametrize("strategy", ["auto", "two_pass", "split"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_family(dtype, strategy):
    """Rows holding NaN, +inf, −inf entries, all −inf: torch's results exactly (NaN rows where torch
    has them, 0 / −inf for −inf entries); the clean rows bit-identical to a clean run."""
    N = 5000 if ON_GPU else 300
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, N, generator=g).to(DEVICE, dtype)
    clean_x = x.clone()
    x[0, 7], x[1, N - 1], x[2, 100:110], x[3] = NAN, INF, -INF, -INF
    for op, fn in TORCH_OPS.items():
        y = sm._apply(op, x, -1, strategy=strategy)
        same_nonfinite(y, fn(x.double(), -1), f"op {op}")
        assert torch.equal(y[4:], sm._apply(op, clean_x, -1, strategy=strategy)[4:])
        if op != sm.LOGSUMEXP:
            xl = x.detach().requires_grad_()
            y = sm._apply(op, xl, -1, strategy=strategy)
            (dx,) = torch.autograd.grad(y, xl, torch.ones_like(y))
            assert dx.shape == x.shape and torch.isfinite(dx[4:]).all()


# ------------------------------------------------------------------ merge

@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_merge(value):
    """lse_a NaN or +inf: the row is NaN (o and lse); −inf: part a is empty and ignored. A
    non-finite element of o_a reaches only its own element of the result."""
    g = torch.Generator().manual_seed(2)
    o_a, o_b = (torch.randn(1, 2, 4, 8, generator=g).to(DEVICE) for _ in range(2))
    lse_a, lse_b = (torch.randn(1, 2, 4, generator=g).to(DEVICE) for _ in range(2))
    clean, clean_lse = fl.merge_attention_states(o_a, lse_a, o_b, lse_b)
    bad_lse = lse_a.clone()
    bad_lse[0, 1, 2] = value
    o, lse = fl.merge_attention_states(o_a, bad_lse, o_b, lse_b)
    rest = torch.ones(1, 2, 4, dtype=torch.bool, device=DEVICE)
    rest[0, 1, 2] = False
    assert torch.equal(o[rest], clean[rest]) and torch.equal(lse[rest], clean_lse[rest])
    if value == -INF:
        assert torch.equal(o[0, 1, 2], o_b[0, 1, 2]) and lse[0, 1, 2] == lse_b[0, 1, 2]
    else:
        assert torch.isnan(o[0, 1, 2]).all() and torch.isnan(lse[0, 1, 2])
    bad_o = o_a.clone()
    bad_o[0, 1, 2, 3] = value
    o, lse = fl.merge_attention_states(bad_o, lse_a, o_b, lse_b)
    hit = torch.zeros_like(o, dtype=torch.bool)
    hit[0, 1, 2, 3] = True
    assert torch.equal(o[~hit], clean[~hit]) and torch.equal(lse, clean_lse)
    if math.isnan(value):
        assert torch.isnan(o[hit]).all()
    else:
        assert o[hit].item() == value


# ------------------------------------------------------------------ decode

@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_decode(value, paged):
    """A poisoned query row or cached key reaches only the rows that read it; values past a
    sequence's length are never read."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, Nmax, D = 2, 4, 2, (608 if ON_GPU else 48), 16
    q = torch.randn(B, Hq, 1, D, generator=g).to(DEVICE)
    kc, vc = (torch.randn(B, Hkv, Nmax, D, generator=g).to(DEVICE) for _ in range(2))
    lens = torch.tensor([Nmax - 8, Nmax // 2], dtype=torch.int32, device=DEVICE)

    def run(q_, k_, v_):
        if not paged:
            return fl.decode(q_, k_, v_, lens, num_splits=3)
        bs = 16
        table = torch.arange(B * Nmax // bs, dtype=torch.int32, device=DEVICE).view(B, -1)
        page = lambda t: t.view(B, Hkv, -1, bs, D).transpose(1, 2).reshape(-1, Hkv, bs, D)  # noqa: E731
        return fl.decode(q_, page(k_), page(v_), lens, block_table=table, num_splits=3)

    clean = run(q, kc, vc)
    qb = q.clone()
    qb[0, 1, 0, 2] = value
    o = run(qb, kc, vc)
    assert torch.isnan(o[0, 1]).all()
    rest = torch.ones(B, Hq, dtype=torch.bool, device=DEVICE)
    rest[0, 1] = False
    assert torch.equal(o[rest], clean[rest])
    kb = kc.clone()
    kb[1, 0, 5, 2] = value                       # seen by sequence 1, query heads 0 and 1
    kb[1, 1, int(lens[1]) + 3] = value            # past sequence 1's length: never read
    o = run(q, kb, vc)
    same_nonfinite(o[1, :2], torch_math(q[1:2, :2], kb[1:2, :1, :int(lens[1])], vc[1:2, :1, :int(lens[1])],
                                        False)[0], "rows that read the key")
    assert torch.equal(o[0], clean[0]) and torch.equal(o[1, 2:], clean[1, 2:])
