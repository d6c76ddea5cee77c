"""Merging attention states: partial results over disjoint key sets combine exactly.

If (O_a, lse_a) is attention of some queries over key set A and (O_b, lse_b) over a disjoint key
set B, then attention over A ∪ B is::

    lse = log(exp(lse_a) + exp(lse_b))
    O   = O_a·exp(lse_a − lse) + O_b·exp(lse_b − lse)

This is what split-KV decoding (``decode``), paged attention and ring attention rely on. The pair
form runs ``merge.merge_states`` on [rows, D] tiles. The stacked form (S partials) treats the S
partial lse's of a row as the scores of a softmax whose "values" are the partial outputs:
O = softmax(lse_1..S) · (O_1..S), folded with ``merge.online_softmax_update`` in chunks of S and
closed with ``merge.finalize`` — the same (m, ℓ) reduction as every other kernel here.

An empty partial (lse = −inf, e.g. a split with no visible keys) has weight 0 and its o is never
read (it may hold NaN or uninitialised memory); if every partial of a row is empty the result is
O = 0, lse = −inf. Outputs are differentiable (the backward is closed-form PyTorch:
dO_s = w_s·dO, dlse_s = w_s·(dlse + ⟨dO, O_s − O⟩) with w_s = exp(lse_s − lse), O summed again in
float32).
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
import triton
import triton.language as tl

from .. import _checks
from .._launcher import launcher
from .._runtime import cdiv, device_sm_count, interpreter_active, next_pow2, runs_triton
from ..merge import (finite_or_zero_torch, finalize, lse_of_torch, merge_states, merge_states_torch,
                     online_softmax_update, online_softmax_update_torch)
# Programmatic dependent launch (Triton ≥ 3.4); without it the two decode stages simply queue.
_HAS_GDC = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")


# ------------------------------------------------------------------ kernels

@triton.jit
def _row_offsets(rows, n_h, n_n, stride_b, stride_h, stride_n):
    # Flattened row index over (B, H, N) -> element offset, int64 (B·H·N·D can exceed 2³¹).
    b = rows // (n_h * n_n)
    h = (rows // n_n) % n_h
    n = rows % n_n
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + n.to(tl.int64) * stride_n


@launcher
@triton.jit(do_not_specialize=["n_rows"])
def _merge_pair_kernel(o_a, lse_a, o_b, lse_b, o, lse,
                       s_oab, s_oah, s_oan, s_oad, s_lab, s_lah, s_lan,
                       s_obb, s_obh, s_obn, s_obd, s_lbb, s_lbh, s_lbn,
                       s_ob, s_oh, s_on, s_od, s_lb, s_lh, s_ln,
                       n_h, n_n, n_rows,
                       HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    ra = _row_offsets(rows, n_h, n_n, s_oab, s_oah, s_oan)
    rb = _row_offsets(rows, n_h, n_n, s_obb, s_obh, s_obn)
    la = tl.load(lse_a + _row_offsets(rows, n_h, n_n, s_lab, s_lah, s_lan), mask=row_ok, other=float("-inf"))
    lb = tl.load(lse_b + _row_offsets(rows, n_h, n_n, s_lbb, s_lbh, s_lbn), mask=row_ok, other=float("-inf"))
    # An empty part's o is never read: a NaN or uninitialised buffer there cannot poison the sum.
    xa = tl.load(o_a + ra[:, None] + offs_d[None, :] * s_oad, mask=tile_ok & (la > float("-inf"))[:, None],
                 other=0.0).to(tl.float32)
    xb = tl.load(o_b + rb[:, None] + offs_d[None, :] * s_obd, mask=tile_ok & (lb > float("-inf"))[:, None],
                 other=0.0).to(tl.float32)
    out, lse_out = merge_states(xa, la, xb, lb)
    ro = _row_offsets(rows, n_h, n_n, s_ob, s_oh, s_on)
    tl.store(o + ro[:, None] + offs_d[None, :] * s_od, out.to(o.dtype.element_ty), mask=tile_ok)
    if tl.program_id(1) == 0:
        tl.store(lse + _row_offsets(rows, n_h, n_n, s_lb, s_lh, s_ln), lse_out, mask=row_ok)


@launcher
@triton.jit(do_not_specialize=["n_rows", "n_splits"])
def _merge_stacked_kernel(o_parts, lse_parts, o, lse,
                          s_ps, s_pb, s_ph, s_pn, s_pd, s_qs, s_qb, s_qh, s_qn,
                          s_ob, s_oh, s_on, s_od, s_lb, s_lh, s_ln,
                          n_h, n_n, n_rows, n_splits,
                          HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_D: tl.constexpr, AFTER_PRODUCER: tl.constexpr = False,
                          PARTS_FINITE: tl.constexpr = False):
    if AFTER_PRODUCER:
        # Launched as a programmatic dependent of the kernel that wrote the partials: this
        # program may start before that kernel ends, and waits here until its writes are visible.
        # Then the next kernel may be placed (a decode loop's next stage 1 waits in the same way).
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    rp = _row_offsets(rows, n_h, n_n, s_pb, s_ph, s_pn)
    rq = _row_offsets(rows, n_h, n_n, s_qb, s_qh, s_qn)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s0 in tl.range(0, n_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        rs_ok = row_ok[:, None] & (offs_s[None, :] < n_splits)
        part_lse = tl.load(lse_parts + rq[:, None] + offs_s[None, :].to(tl.int64) * s_qs,
                           mask=rs_ok, other=float("-inf"))
        # The partial lse's are the scores of a softmax over the partials (base 2 for exp2).
        m_i, l_i, p, alpha = online_softmax_update(m_i, l_i, part_lse * 1.4426950408889634)
        # An empty partial's o is read only from a producer known to write it finite (then its
        # weight p = 0 cancels it, and the o loads need not wait for the lse's).
        o_ok = rs_ok if PARTS_FINITE else part_lse > float("-inf")
        part_o = tl.load(o_parts + rp[:, None, None] + offs_s[None, :, None].to(tl.int64) * s_ps
                         + offs_d[None, None, :] * s_pd,
                         mask=o_ok[:, :, None] & (offs_d[None, None, :] < HEAD_DIM), other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * part_o.to(tl.float32), 1)
    out, lse_out = finalize(acc, m_i, l_i)
    ro = _row_offsets(rows, n_h, n_n, s_ob, s_oh, s_on)
    tl.store(o + ro[:, None] + offs_d[None, :] * s_od, out.to(o.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if tl.program_id(1) == 0:
        tl.store(lse + _row_offsets(rows, n_h, n_n, s_lb, s_lh, s_ln), lse_out, mask=row_ok)


# ------------------------------------------------------------------ launchers

def _tiles(n_rows: int, d: int, per_row_elems: int, t: torch.Tensor):
    """(BLOCK_R, BLOCK_D): about 4k fp32 values per program, but enough programs to fill the GPU
    (small merges, e.g. decode at B=1, split D across programs rather than leave SMs idle)."""
    block_d = max(16, next_pow2(d))
    if interpreter_active():
        return 4, block_d
    block_r = max(2, min(64, next_pow2(max(1, 4096 // (per_row_elems * block_d)))))
    sms = device_sm_count(t)
    while block_r > 2 and cdiv(n_rows, block_r) < 2 * sms:
        block_r //= 2
    while block_d > 32 and cdiv(n_rows, block_r) * cdiv(d, block_d) < 2 * sms:
        block_d //= 2
    return block_r, block_d


def stacked_tiles(n_rows: int, d: int, n_splits: int, t: torch.Tensor) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_R, BLOCK_D) of the stacked merge: up to 32 splits a pass with ``_tiles``' rows
    and columns; from 512 columns (MLA's latent 512) every split in one pass (up to 128), 128 columns
    and up to 4 rows a program, ~16k float32 (the kernel alone, cold L2, H200: 66 splits × 128 rows
    12.5 µs against 21.0 with the narrow rule, 8 × 1024 rows 11.6 against 14.4; through decode, B 1 ×
    32k 39.0 → 36.4 µs a step: ``bench_ab-20261130-1551.json``)."""
    if d >= 512 and not interpreter_active():
        block_s = min(128, next_pow2(n_splits))
        return block_s, max(1, min(4, 16384 // (block_s * 128))), 128
    block_s = min(32, next_pow2(n_splits))
    return (block_s, *_tiles(n_rows, d, block_s, t))


def merge_pair_launch(o_a, lse_a, o_b, lse_b, o, lse):
    """Kernel launch for the pair merge: o_* (B, H, N, D) any strides, lse_* (B, H, N) fp32;
    writes o (in its own dtype) and lse."""
    B, H, N, D = o_a.shape
    rows = B * H * N
    block_r, block_d = _tiles(rows, D, 2, o)
    grid = (cdiv(rows, block_r), cdiv(D, block_d))
    _merge_pair_kernel[grid](o_a, lse_a, o_b, lse_b, o, lse,
                             *o_a.stride(), *lse_a.stride(), *o_b.stride(), *lse_b.stride(),
                             *o.stride(), *lse.stride(), H, N, rows,
                             HEAD_DIM=D, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4)


def merge_stacked_launch(o_parts, lse_parts, o, lse, after_producer: bool = False, parts_finite: bool = False):
    """Kernel launch for the stacked merge: o_parts (S, B, H, N, D) any strides (fp32 or the
    output dtype), lse_parts (S, B, H, N) fp32; writes o (its own dtype) and lse (B, H, N).
    Used by ``decode`` as its second stage: ``after_producer`` (only where
    ``dependent_launch_supported``) launches it as a programmatic dependent of the kernel just
    launched, so its launch and start overlap that kernel's end (from the point where that kernel
    calls ``gdc_launch_dependents``, or from its end). ``parts_finite``: every partial's o is
    finite, an empty one's too (as decode's stage 1 writes them), so o is read without waiting
    for lse."""
    S, B, H, N, D = o_parts.shape
    rows = B * H * N
    block_s, block_r, block_d = stacked_tiles(rows, D, S, o)
    grid = (cdiv(rows, block_r), cdiv(D, block_d))
    _merge_stacked_kernel[grid](o_parts, lse_parts, o, lse,
                                *o_parts.stride(), *lse_parts.stride(), *o.stride(), *lse.stride(),
                                H, N, rows, S,
                                HEAD_DIM=D, BLOCK_R=block_r, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4,
                                PARTS_FINITE=parts_finite,
                                **(dict(AFTER_PRODUCER=True, launch_pdl=True) if after_producer else {}))


@functools.lru_cache(maxsize=None)
def _pdl_device(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def dependent_launch_supported(t: torch.Tensor) -> bool:
    """Programmatic dependent launch: NVIDIA Hopper or newer, compiled kernels (not the
    interpreter), and a Triton that has it."""
    return (t.is_cuda and _HAS_GDC and torch.version.hip is None and not interpreter_active()
            and _pdl_device(t.device.index or 0))


# ------------------------------------------------------------------ PyTorch twins

def merge_stacked_torch(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """Twin of the stacked kernel: o_parts (S, ..., D), lse_parts (S, ...); float32 (o, lse)."""
    scores = lse_parts.float().movedim(0, -1)                       # (..., S)
    m0 = torch.full(scores.shape[:-1], float("-inf"), device=scores.device)
    m, l, p, _ = online_softmax_update_torch(m0, torch.zeros_like(m0), scores)
    o_parts = torch.where(torch.isneginf(lse_parts).unsqueeze(-1), 0.0, o_parts.float())
    acc = torch.einsum("...s,s...d->...d", p, o_parts)
    o = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    return o, lse_of_torch(m, l)


def _empty_to_zero(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(lse).unsqueeze(-1), 0.0, o.float())


def merge_pair_into(o: torch.Tensor, lse: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """(o, lse) ← the merge of (o, lse) and (o_b, lse_b), in place, without autograd: for a loop
    that merges many parts into one accumulator (ring attention's forward keeps o in float32 and
    merges each piece's 16-bit output). o_b may be in any float dtype; empty parts (lse −inf) as in
    ``merge_attention_states``. The kernel reads each element of ``o`` once before writing it; the
    merged lse goes through a new tensor, since the programs over a row's D blocks all read the
    old one."""
    if runs_triton(o):
        merged_lse = torch.empty_like(lse)
        merge_pair_launch(o, lse, o_b, lse_b, o, merged_lse)
        lse.copy_(merged_lse)
    else:
        o_m, lse_m = merge_states_torch(_empty_to_zero(o, lse), lse, _empty_to_zero(o_b, lse_b), lse_b)
        o.copy_(o_m)
        lse.copy_(lse_m)


# ------------------------------------------------------------------ autograd

def _merge_backward(o_parts, lse_parts, lse, do, dlse):
    """Closed-form gradients of the stacked merge. Shapes as in the forward, S first; ``do`` or
    ``dlse`` None where that output reached no loss (the Functions leave gradients unmaterialized).
    The merged output is not needed (it is formed again in float32 below), so the forward does not
    save it."""
    # The exact merge's weights exp(lse_s − lse), NaN where they are: a row with a NaN part is NaN
    # throughout, and one with a +inf part (whose lse the forward leaves NaN, the exact one being
    # +inf) NaN for the +inf parts and 0 for the others. An all-empty row (lse −inf) weighs 0.
    top = lse_parts.amax(0)  # NaN where a part is NaN
    w = torch.exp(lse_parts - finite_or_zero_torch(torch.where(top == float("inf"), top, lse)))
    if do is None:  # only the lse was used: d o_s = 0, d lse_s = w_s·dlse, no pass over the parts
        return torch.zeros_like(o_parts), w * dlse
    do = do.float()
    parts = _empty_to_zero(o_parts, lse_parts).float()
    # ⟨dO, O_s − O⟩ cancels where one part dominates: against the returned O, rounded to 16 bits, that
    # rounding would be most of it, so O is formed again here in float32 (the forward's sum, unrounded).
    o_exact = (w.unsqueeze(-1) * parts).sum(0)
    g = (do * (parts - o_exact)).sum(-1)
    if dlse is not None:
        g = g + dlse
    return (w.unsqueeze(-1) * do).to(o_parts.dtype), w * g


class _MergePairFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o_a, lse_a, o_b, lse_b):
        if runs_triton(o_a):
            o = torch.empty(o_a.shape, dtype=o_a.dtype, device=o_a.device)
            lse = torch.empty(lse_a.shape, dtype=torch.float32, device=o_a.device)
            merge_pair_launch(o_a, lse_a, o_b, lse_b, o, lse)
        else:
            o, lse = merge_states_torch(_empty_to_zero(o_a, lse_a), lse_a, _empty_to_zero(o_b, lse_b), lse_b)
            o = o.to(o_a.dtype)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (``_merge_backward``)
        ctx.save_for_backward(o_a, lse_a, o_b, lse_b, lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        o_a, lse_a, o_b, lse_b, lse = ctx.saved_tensors
        d_o, d_lse = _merge_backward(torch.stack([o_a, o_b]), torch.stack([lse_a, lse_b]), lse, do, dlse)
        return d_o[0], d_lse[0], d_o[1], d_lse[1]


class _MergeStackedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o_parts, lse_parts):
        if runs_triton(o_parts):
            o = torch.empty(o_parts.shape[1:], dtype=o_parts.dtype, device=o_parts.device)
            lse = torch.empty(lse_parts.shape[1:], dtype=torch.float32, device=o_parts.device)
            merge_stacked_launch(o_parts, lse_parts, o, lse)
        else:
            o, lse = merge_stacked_torch(o_parts, lse_parts)
            o = o.to(o_parts.dtype)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(o_parts, lse_parts, lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        o_parts, lse_parts, lse = ctx.saved_tensors
        return _merge_backward(o_parts, lse_parts, lse, do, dlse)


# ------------------------------------------------------------------ validation and public API

def _check_state(name_o: str, name_lse: str, o, lse, *, ndim: int) -> None:
    _checks.check_tensor(name_o, o, ndim=ndim)
    _checks.check_tensor(name_lse, lse, ndim=ndim - 1, dtypes=(torch.float32,))
    if tuple(lse.shape) != tuple(o.shape[:-1]):
        raise ValueError(f"{name_lse} must have shape {tuple(o.shape[:-1])} ({name_o}'s shape without its "
                         f"last dim), got {tuple(lse.shape)}")
    if o.shape[-1] == 0 or o.numel() == 0:
        raise ValueError(f"{name_o} must be non-empty, got shape {tuple(o.shape)}")


def merge_attention_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """Combine attention over two disjoint key sets into attention over their union.

    Args:
        o_a, o_b: (B, H, N, D) partial outputs, one dtype (fp16, bf16 or fp32), any strides.
        lse_a, lse_b: (B, H, N) float32 natural-log log-sum-exp of the scaled scores of each part
            (as returned by ``attention(..., return_lse=True)`` or ``decode(..., return_lse=True)``).
            −inf marks an empty part (no visible key): weight 0, its o is ignored.

    Returns:
        (o, lse): o (B, H, N, D) in the inputs' dtype, lse (B, H, N) float32. Rows whose parts
        are both empty give o = 0, lse = −inf. Exact up to rounding: arithmetic is float32.

    Differentiable in all four inputs. One pass over the inputs (memory-bound). An lse of NaN or
    +inf makes its row NaN: o, lse and the gradients through them (the o of a part outweighed by a
    +inf part gets the exact merge's gradient, 0).

    Attention over 10 keys, computed as two parts of 6 and 4 keys, then merged:

    >>> import torch, flashattn_lite
    >>> q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    >>> o_a, lse_a = flashattn_lite.attention(q, k[:, :, :6], v[:, :, :6], return_lse=True)
    >>> o_b, lse_b = flashattn_lite.attention(q, k[:, :, 6:], v[:, :, 6:], return_lse=True)
    >>> o, lse = flashattn_lite.merge_attention_states(o_a, lse_a, o_b, lse_b)
    >>> torch.allclose(o, flashattn_lite.attention(q, k, v), atol=1e-5)
    True
    """
    _check_state("o_a", "lse_a", o_a, lse_a, ndim=4)
    _check_state("o_b", "lse_b", o_b, lse_b, ndim=4)
    if tuple(o_b.shape) != tuple(o_a.shape):
        raise ValueError(f"o_b must have o_a's shape {tuple(o_a.shape)}, got {tuple(o_b.shape)}")
    _checks.check_same(("o_a", "o_b"), (o_a, o_b), "dtype")
    _checks.check_same(("o_a", "lse_a", "o_b", "lse_b"), (o_a, lse_a, o_b, lse_b), "device")
    return _MergePairFn.apply(o_a, lse_a, o_b, lse_b)


def merge_attention_states_stacked(o: torch.Tensor | Sequence[torch.Tensor],
                                   lse: torch.Tensor | Sequence[torch.Tensor]):
    """Combine S partial attention states over pairwise-disjoint key sets.

    Args:
        o: (S, B, H, N, D) tensor, any strides, fp16/bf16/fp32 — or a sequence of S (B, H, N, D)
            tensors (stacked into one tensor first: one copy).
        lse: (S, B, H, N) float32 natural log (or a sequence of S (B, H, N)); −inf = empty part.

    Returns:
        (o, lse): (B, H, N, D) in o's dtype and (B, H, N) float32; all-empty rows give 0, −inf.

    Computes O = Σ_s softmax(lse)_s·O_s and lse = logsumexp_s lse_s in one pass over the partials.
    Differentiable.

    >>> import torch, flashattn_lite
    >>> o_parts = torch.randn(3, 1, 1, 2, 4)                     # S = 3 partial outputs
    >>> lse_parts = torch.tensor([0.0, 0.0, float("-inf")]).view(3, 1, 1, 1).expand(3, 1, 1, 2)
    >>> o, lse = flashattn_lite.merge_attention_states_stacked(o_parts, lse_parts.contiguous())
    >>> torch.allclose(o, (o_parts[0] + o_parts[1]) / 2, atol=1e-6), lse[0, 0].tolist()
    (True, [0.6931471824645996, 0.6931471824645996])
    """
    if isinstance(o, (list, tuple)):
        _checks.check_parts("o", o, ndim=4)
        o = torch.stack(list(o))
    if isinstance(lse, (list, tuple)):
        _checks.check_parts("lse", lse, ndim=3, dtypes=(torch.float32,))
        lse = torch.stack(list(lse))
    _check_state("o", "lse", o, lse, ndim=5)
    _checks.check_same(("o", "lse"), (o, lse), "device")
    return _MergeStackedFn.apply(o, lse)


__all__ = ["merge_attention_states", "merge_attention_states_stacked"]
