"""The one idea of the package: a softmax row is a reduction whose state is (m, ℓ).

m is the running maximum of the scores, ℓ the running sum of exp(score − m). Two states merge
exactly::

    m = max(m_a, m_b)
    ℓ = ℓ_a·exp(m_a − m) + ℓ_b·exp(m_b − m)

and attention outputs, kept with their log-sum-exp lse = m + log ℓ, merge as::

    lse = log(exp(lse_a) + exp(lse_b))
    O   = O_a·exp(lse_a − lse) + O_b·exp(lse_b − lse)

Every kernel in the package applies these at some granularity (a tile, a chunk of a long row, a
split of a KV cache). They live here once, as ``@triton.jit`` helpers imported by the kernels, with
PyTorch twins beside them for the CPU path and the references.

Units: the Triton (m, ℓ) helpers work in base 2 (scores already multiplied by log2(e), exponentials
are ``exp2``), which is what the hardware computes fastest; ``finalize`` converts to a natural-log
lse once at the end. The (O, lse) merge takes natural-log lse, as users and other libraries store it.
An empty state is m = −inf, ℓ = 0 (lse = −inf); every helper keeps it NaN-free.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


@triton.jit
def _finite_or_zero(m):
    # exp2(x - m) with m = -inf would be NaN for x = -inf; an empty state subtracts 0 instead.
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def online_softmax_update(m_i, l_i, s):
    """Fold a tile of base-2 scores ``s`` [ROWS, COLS] into the row states (m_i, l_i) [ROWS].

    Returns (m_new, l_new, p, alpha): p = exp2(s − m_new) are the tile's unnormalised
    probabilities and alpha = exp2(m_i − m_new) the factor that rescales anything accumulated
    against the old maximum (ℓ here; the output accumulator O in attention).
    """
    return online_softmax_update_scaled(m_i, l_i, s, 1.0)


@triton.jit
def online_softmax_update_scaled(m_i, l_i, s, scale):
    """:func:`online_softmax_update` for the scores ``s·scale`` (scale > 0), with the scaling folded
    into the exponent: max(s·scale) = scale·max(s), and exp2(s·scale − m) is a single FMA per
    element instead of a multiply followed by a subtract."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
    m_ref = _finite_or_zero(m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s * scale - m_ref[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, p, alpha


@triton.jit
def merge_ml(m_a, l_a, m_b, l_b):
    """Merge two base-2 (m, ℓ) states. Associative, so it is also a ``tl.reduce`` combine_fn."""
    m = tl.maximum(m_a, m_b)
    m_ref = _finite_or_zero(m)
    l = l_a * tl.math.exp2(m_a - m_ref) + l_b * tl.math.exp2(m_b - m_ref)
    return m, l


@triton.jit
def online_softmax_update_ln(m_i, l_i, x):
    """:func:`online_softmax_update` for raw natural-log scores ``x`` [ROWS, COLS], m_i in x's units.

    The log2(e) scale is applied after subtracting the maximum, p = exp2((x − m)·log2 e), so entries
    near the maximum keep full float32 accuracy however large |x| is (scaling first would round
    x·log2 e to ~1e-3 at |x| = 1e4). ℓ and p mean the same as in the base-2 helper.
    """
    m_new = tl.maximum(m_i, tl.max(x, 1))
    m_ref = _finite_or_zero(m_new)
    alpha = tl.math.exp2((m_i - m_ref) * 1.4426950408889634)
    p = tl.math.exp2((x - m_ref[:, None]) * 1.4426950408889634)
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, p, alpha


@triton.jit
def merge_ml_ln(m_a, l_a, m_b, l_b):
    """:func:`merge_ml` for states whose m is in natural-log units (from ``online_softmax_update_ln``).
    Associative, so it is also a ``tl.reduce`` combine_fn."""
    m = tl.maximum(m_a, m_b)
    m_ref = _finite_or_zero(m)
    l = l_a * tl.math.exp2((m_a - m_ref) * 1.4426950408889634) + l_b * tl.math.exp2((m_b - m_ref) * 1.4426950408889634)
    return m, l


@triton.jit
def lse_of_ln(m_i, l_i):
    """Natural-log lse of a natural-unit (m, ℓ) state, m + log ℓ; −inf for an empty one."""
    empty = l_i == 0.0
    return tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)) * 0.6931471805599453)


@triton.jit
def finalize(acc, m_i, l_i):
    """Turn a base-2 state into (O, lse): O = acc / ℓ, lse = ln 2·(m + log2 ℓ).

    acc is [ROWS, D] (or a [ROWS] placeholder); an empty row (ℓ = 0) gives O = 0, lse = −inf.
    """
    empty = l_i == 0.0
    inv_l = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
    return acc * inv_l[:, None], lse_of(m_i, l_i)


@triton.jit
def add_sink(m_i, l_i, acc, sink):
    """Fold a value-less term exp2(sink) into base-2 row states (m, ℓ) and their accumulator
    ``acc`` [ROWS, D] (an attention sink: it takes probability mass and contributes nothing)."""
    m_new = tl.maximum(m_i, sink)
    m_ref = _finite_or_zero(m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    return m_new, l_i * alpha + tl.math.exp2(sink - m_ref), acc * alpha[:, None]


@triton.jit
def lse_of(m_i, l_i):
    """Natural-log lse of a base-2 (m, ℓ) state; −inf for an empty one."""
    empty = l_i == 0.0
    return tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)


@triton.jit
def merge_states(o_a, lse_a, o_b, lse_b):
    """Merge two attention partials over disjoint key sets: o [ROWS, D] float32, lse [ROWS] (natural log)."""
    lse_max = tl.maximum(lse_a, lse_b)
    ref = _finite_or_zero(lse_max)
    w_a = tl.exp(lse_a - ref)
    w_b = tl.exp(lse_b - ref)
    total = w_a + w_b
    empty = total == 0.0
    lse = tl.where(empty, float("-inf"), ref + tl.log(tl.where(empty, 1.0, total)))
    inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, total))
    # One fma in a fixed form: left to contraction, which product is fused may differ between two
    # compilations (o_a loaded as bf16 or as float32), and so the last bit of the float32 sum.
    o = tl.fma(o_b, (w_b * inv)[:, None], o_a * (w_a * inv)[:, None])
    return o, lse


# ----------------------------------------------------------------------------------------------
# PyTorch twins (natural log units), used by the CPU path and the references.
# ----------------------------------------------------------------------------------------------

def finite_or_zero_torch(m: torch.Tensor) -> torch.Tensor:
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def online_softmax_update_torch(m_i: torch.Tensor, l_i: torch.Tensor, s: torch.Tensor):
    """Twin of :func:`online_softmax_update` in natural units, reducing the last dim of ``s``."""
    m_new = torch.maximum(m_i, s.amax(-1))
    m_ref = finite_or_zero_torch(m_new)
    alpha = torch.exp(m_i - m_ref)
    p = torch.exp(s - m_ref.unsqueeze(-1))
    return m_new, l_i * alpha + p.sum(-1), p, alpha


def merge_ml_torch(m_a, l_a, m_b, l_b):
    """Twin of :func:`merge_ml` in natural units.

    The state of a whole row is the merge of the states of its parts:

    >>> import torch
    >>> x = torch.tensor([1.0, 3.0, 2.0, 5.0], dtype=torch.float64)
    >>> state = lambda part: (part.max(), torch.exp(part - part.max()).sum())
    >>> m, l = merge_ml_torch(*state(x[:2]), *state(x[2:]))
    >>> torch.allclose(lse_of_torch(m, l), torch.logsumexp(x, 0))
    True
    """
    m = torch.maximum(m_a, m_b)
    m_ref = finite_or_zero_torch(m)
    return m, l_a * torch.exp(m_a - m_ref) + l_b * torch.exp(m_b - m_ref)


def lse_of_torch(m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """Natural-log lse of a natural-unit (m, ℓ) state; −inf for an empty one."""
    empty = l == 0
    return torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(torch.where(empty, torch.ones_like(l), l)))


def add_sink_torch(o: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor):
    """Twin of :func:`add_sink` on a finished (O, lse) state: a value-less term exp(sink) joins
    each row's denominator (an attention sink). o [..., D], lse [...] natural log, sink
    broadcastable to lse; returns float32 (o, lse). A row with no key stays O = 0, lse = sink.

    >>> import torch
    >>> s, v = torch.tensor([0.5, 2.0]), torch.tensor([[1.0], [3.0]])
    >>> o, lse = add_sink_torch(torch.softmax(s, 0) @ v, torch.logsumexp(s, 0), torch.tensor(1.0))
    >>> with_sink = torch.tensor([0.5, 2.0, 1.0])  # the sink's logit last: it has no value
    >>> torch.allclose(o, torch.softmax(with_sink, 0)[:2] @ v), torch.allclose(lse, torch.logsumexp(with_sink, 0))
    (True, True)
    """
    lse, sink = lse.float(), sink.float()
    total = torch.logaddexp(lse, sink)
    weight = torch.where(lse == float("-inf"), torch.zeros_like(total), torch.exp(lse - total))
    return o.float() * weight.unsqueeze(-1), total


def merge_states_torch(o_a, lse_a, o_b, lse_b):
    """Twin of :func:`merge_states`: o [..., D], lse [...] natural log; returns float32 (o, lse)."""
    o_a, o_b, lse_a, lse_b = o_a.float(), o_b.float(), lse_a.float(), lse_b.float()
    ref = finite_or_zero_torch(torch.maximum(lse_a, lse_b))
    w_a, w_b = torch.exp(lse_a - ref), torch.exp(lse_b - ref)
    total = w_a + w_b
    empty = total == 0
    safe_total = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(ref, float("-inf")), ref + torch.log(safe_total))
    o = o_a * (w_a / safe_total).unsqueeze(-1) + o_b * (w_b / safe_total).unsqueeze(-1)
    return o, lse
