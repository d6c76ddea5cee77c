"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Each of the W ranks holds n = N/W tokens of q, k, v (a layout of ``sharding``). K/V blocks travel
around the ring: at step s rank r holds the block of rank (r − s) mod W, and while it attends its
queries to that block the next block is already on its way (the exchange is posted before the
compute). Everything here is scheduling and communication; the math is the package's:

- forward: each (query slice, key slice) piece is ``attention_core(..., return_lse=True)`` with
  the causal diagonal placed by ``causal_offset`` (``schedule`` chooses the pieces), and the partial
  (o, lse) are combined with ``merge_attention_states`` into a float32 accumulator;
- backward: FlashAttention-2's recomputation P = exp(S − lse) is exact for one key block when
  given the *global* o and lse (δ = rowsum(dO∘O) − dlse is a property of the query row, not of
  the block), so each piece is the attention backward (``_backward_impl``) with the global o and
  lse. dQ accumulates locally; each block's dK/dV accumulator travels around the ring with the
  block, one hop behind it, and after W hops arrives back at its owner.

Memory per rank is O(n): its own q, k, v, o, do, two K/V blocks in flight and two dK/dV
accumulators, never the whole sequence.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _checks
from .._runtime import runs_triton
from ..ops.attention import _backward_impl, attention_core
from ..ops.merge_states import merge_attention_states
from ._group import Group, agree, describe
from .sharding import check_layout, runs


# ------------------------------------------------------------------ which pieces to compute

class Piece(NamedTuple):
    """One attention call: local query rows [q0, q1) against local key rows [k0, k1); with
    ``causal``, key j' (counted from k0) is visible to query i' (from q0) iff j' ≤ i' + offset."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    offset: int


def _one_piece(q_runs, k_runs) -> list[Piece] | None:
    """The (query runs) × (key runs) rectangle as at most one call: [] when no key is visible to any
    query, [Piece] when one causal offset (or none) gives exactly the causal mask of the global
    positions, None when no single offset does.

    For a run pair the global mask is j' − i' ≤ d (d from the runs' global starts); on the pair's
    rectangle j' − i' spans [lo, hi], so an offset o gives the same mask iff o = d (the diagonal
    crosses the rectangle), o ≥ hi (d ≥ hi: all visible) or o < lo (d < lo: all hidden). The
    call exists iff those intervals intersect."""
    qs, ks = q_runs[0][0], k_runs[0][0]
    lower, upper = -float("inf"), float("inf")
    any_visible = any_hidden = False
    for q_local, q_global, q_len in q_runs:
        for k_local, k_global, k_len in k_runs:
            i0, j0 = q_local - qs, k_local - ks
            d = (q_global - i0) - (k_global - j0)
            lo, hi = j0 - (i0 + q_len - 1), j0 + k_len - 1 - i0
            if d >= hi:
                lower, any_visible = max(lower, hi), True
            elif d < lo:
                upper, any_hidden = min(upper, lo - 1), True
            else:
                lower, upper, any_visible, any_hidden = max(lower, d), min(upper, d), True, True
    if not any_visible:
        return []
    if lower > upper:
        return None
    q1, k1 = q_runs[-1][0] + q_runs[-1][2], k_runs[-1][0] + k_runs[-1][2]
    return [Piece(qs, q1, ks, k1, any_hidden, int(lower) if any_hidden else 0)]


def _fewest_pieces(q_runs: tuple, k_runs: tuple) -> list[Piece]:
    """Exact cover of the visible pairs by the fewest calls: one call if possible, else the better
    of splitting the key runs or the query runs in two (layouts have at most two runs)."""
    one = _one_piece(q_runs, k_runs)
    if one is not None:
        return one
    options = []
    if len(k_runs) > 1:
        h = len(k_runs) // 2
        options.append(_fewest_pieces(q_runs, k_runs[:h]) + _fewest_pieces(q_runs, k_runs[h:]))
    if len(q_runs) > 1:
        h = len(q_runs) // 2
        options.append(_fewest_pieces(q_runs[:h], k_runs) + _fewest_pieces(q_runs[h:], k_runs))
    return min(options, key=len)


def schedule(layout: str, rank: int, world: int, n_local: int, causal: bool) -> tuple[list[Piece], ...]:
    """The pieces rank ``rank`` computes at each ring step s, against the block of rank (rank − s) mod W.

    Without a mask every step is one full call. With one, a block entirely in the future is
    skipped (no pieces) and one entirely in the past runs non-causal; with zigzag shards every
    step is a single call (the diagonal block causal; the others n × n/2, non-causal)."""
    if not causal:
        return tuple([Piece(0, n_local, 0, n_local, False, 0)] for _ in range(world))
    mine = tuple(runs(layout, rank, world, n_local))
    return tuple(_fewest_pieces(mine, tuple(runs(layout, (rank - s) % world, world, n_local)))
                 for s in range(world))


# ------------------------------------------------------------------ forward and backward

def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k and v in one contiguous buffer: one transfer per ring step, whatever the inputs' strides."""
    kv = torch.empty(k.numel() + v.numel(), dtype=k.dtype, device=k.device)
    k_view, v_view = _unpack(kv, k.shape, v.shape)
    k_view.copy_(k)
    v_view.copy_(v)
    return kv


def _unpack(buf: torch.Tensor, k_shape, v_shape):
    nk = k_shape.numel()
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def _forward(q, k, v, *, scale: float, ring, steps):
    """(o, lse) of this rank's queries over the whole sequence. ``ring`` has ``shift(tensor)`` (see
    ``_group.Group``); ``steps`` is ``schedule(...)``."""
    B, Hq, n, _ = q.shape
    # float32 partials: W merges in bf16 would round W times (merges take float32 lse, so float64
    # inputs merge in float32 too).
    out = torch.zeros((B, Hq, n, v.shape[3]), dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, n), float("-inf"), dtype=torch.float32, device=q.device)
    kv = _pack(k, v)
    for step, pieces in enumerate(steps):
        incoming = ring.shift(kv) if step + 1 < len(steps) else None
        k_blk, v_blk = _unpack(kv, k.shape, v.shape)
        for p in pieces:
            o_p, lse_p = attention_core(q[:, :, p.q0:p.q1], k_blk[:, :, p.k0:p.k1], v_blk[:, :, p.k0:p.k1],
                                        causal=p.causal, causal_offset=p.offset, scale=scale, return_lse=True)
            o_m, lse_m = merge_attention_states(out[:, :, p.q0:p.q1], lse[:, :, p.q0:p.q1], o_p.float(), lse_p.float())
            if p.q1 - p.q0 == n:
                out, lse = o_m, lse_m
            else:
                out[:, :, p.q0:p.q1], lse[:, :, p.q0:p.q1] = o_m, lse_m
        if incoming is not None:
            kv = incoming.wait()
    return out.to(q.dtype), lse


def _backward(do, dlse, q, k, v, o, lse, *, scale: float, ring, steps):
    """(dq, dk, dv) for this rank's shards. At step s the gradient of the block held (that of rank
    r − s) is added to the accumulator received from rank r − 1 and passed on to rank r + 1; the
    last hop brings each rank its own block's total."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32  # W sums of per-block gradients
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = _pack(k, v)
    grads_in = None
    for step, pieces in enumerate(steps):
        incoming = ring.shift(kv) if step + 1 < len(steps) else None
        k_blk, v_blk = _unpack(kv, k.shape, v.shape)
        mine = None
        for p in pieces:
            rows, keys = slice(p.q0, p.q1), slice(p.k0, p.k1)
            # The Triton backward reads lse as a dense (B, H, N) array, hence the copy of a slice.
            # (dq, dk, dv) lead the result (options such as sinks may append their gradients).
            dq_p, dk_p, dv_p = _backward_impl(
                do[:, :, rows], q[:, :, rows], k_blk[:, :, keys], v_blk[:, :, keys], o[:, :, rows],
                lse[:, :, rows].contiguous(), None if dlse is None else dlse[:, :, rows].contiguous(),
                None, scale, p.causal, p.offset, 0.0, 0)[:3]
            dq[:, :, rows] += dq_p
            if mine is None:
                mine = torch.zeros(kv.numel(), dtype=acc, device=kv.device)
            dk_acc, dv_acc = _unpack(mine, k.shape, v.shape)
            dk_acc[:, :, keys] += dk_p
            dv_acc[:, :, keys] += dv_p
        # Step 0 always has a piece (a rank's own block), so ``mine`` or ``grads_in`` is set.
        if grads_in is None:
            grads = mine
        elif mine is None:
            grads = grads_in.wait()
        else:
            grads = mine.add_(grads_in.wait())
        grads_in = ring.shift(grads, tag=1) if len(steps) > 1 else None
        if incoming is not None:
            kv = incoming.wait()
    if grads_in is not None:
        grads = grads_in.wait()
    dk, dv = _unpack(grads, k.shape, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttentionFn(torch.autograd.Function):
    """Forward and backward of the whole ring as one autograd node (the backward needs the global
    o and lse, and must run the same communication on every rank)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, ring, steps):
        o, lse = _forward(q, k, v, scale=scale, ring=ring, steps=steps)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = dict(scale=scale, ring=ring, steps=steps)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = _backward(do, dlse, q, k, v, o, lse, **ctx.args)
        return dq, dk, dv, None, None, None


# ------------------------------------------------------------------ validation and public API

def _check_local(q, k, v, causal, scale, layout, group: Group) -> float | None:
    """Everything one rank can check alone; returns the scale (None: the default)."""
    dtypes = _checks.FLOAT_DTYPES
    if isinstance(q, torch.Tensor) and not runs_triton(q):
        dtypes += (torch.float64,)  # the CPU twin, for exact checks
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=4, dtypes=dtypes)
    _checks.check_same(("q", "k", "v"), (q, k, v), "dtype")
    _checks.check_same(("q", "k", "v"), (q, k, v), "device")
    group.check_device("q", q)
    B, Hq, n, D = q.shape
    if min(q.shape) == 0 or min(k.shape) == 0 or min(v.shape) == 0:
        raise ValueError(f"q, k, v must be non-empty, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    for name, t in (("k", k), ("v", v)):
        _checks.check_dim(name, "batch size (dim 0)", t.shape[0], B, "q's")
        _checks.check_dim(name, "local sequence length (dim 2)", t.shape[2], n, "q's")
    _checks.check_dim("v", "heads (dim 1)", v.shape[1], k.shape[1], "k's")
    _checks.check_dim("k", "head dim (dim 3)", k.shape[3], D, "q's")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({k.shape[1]}) for GQA/MQA")
    _checks.check_head_dim("q/k", D)
    _checks.check_head_dim("v", v.shape[3])
    check_layout(layout)
    if layout == "zigzag" and n % 2 != 0:
        raise ValueError(f"q, k, v local sequence length (dim 2) must be even for layout='zigzag' (each rank "
                         f"holds two half-shards), got {n}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {type(causal).__name__}")
    return _checks.check_scale(scale)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   scale: float | None = None, group=None, layout: str = "zigzag", return_lse: bool = False):
    """Exact attention over a sequence sharded across the ranks of ``group`` (ring / context parallel).

    Args:
        q: (B, Hq, n, D), k: (B, Hkv, n, D), v: (B, Hkv, n, Dv): this rank's shard of a global
            sequence of W·n tokens (W = the size of ``group``; ``shard`` cuts a full tensor), laid
            out by ``layout``. Same shapes and dtype on every rank. GQA, Dv ≠ D, dtypes and
            strides as in ``flashattn_lite.attention``; float64 on the CPU twin (merges are float32).
            CUDA tensors for the NCCL backend (``torch.cuda.set_device`` to each rank's GPU), CPU
            tensors for gloo.
        causal: key at global position j visible to the query at global position i iff j ≤ i.
        scale: multiplies q·k; defaults to D ** -0.5.
        group: a ``torch.distributed`` process group (default: the whole world).
        layout: ``"zigzag"`` (n even; balances causal work across ranks) or ``"contiguous"``.
        return_lse: also return the log-sum-exp over the whole sequence, (B, Hq, n) float32.

    Returns:
        o (B, Hq, n, Dv) in q's dtype: this rank's shard of the output (and lse), same layout.

    Every rank of ``group`` must call it, and run the backward, with the same arguments: bad
    arguments (on any rank, or differing between ranks) raise on every rank, after one small
    all-gather and before any K/V moves. Communication: W − 1 K/V transfers to the next rank in
    the forward, posted before each block's compute so they overlap it; in the backward the same
    and W transfers of the float32 dK/dV accumulators. Memory per rank O(n·(D + Dv)).
    """
    g = Group(group)
    error, checked_scale = None, None
    try:
        checked_scale = _check_local(q, k, v, causal, scale, layout, g)
    except (TypeError, ValueError) as e:
        error = e
    # Whether a backward will follow must agree too: a rank without one would leave the others waiting.
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    agree(g, "ring_attention", error, {"q": describe(q), "k": describe(k), "v": describe(v), "causal": repr(causal),
                                       "scale": repr(checked_scale), "layout": repr(layout),
                                       "requires_grad": repr(needs_grad)})
    scale = q.shape[-1] ** -0.5 if checked_scale is None else checked_scale
    steps = schedule(layout, g.rank, g.world, q.shape[2], causal)
    o, lse = _RingAttentionFn.apply(q, k, v, scale, g, steps)
    return (o, lse) if return_lse else o
