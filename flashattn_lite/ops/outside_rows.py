"""The rows of a packed (varlen) batch that lie outside every sequence.

``cu_seqlens`` should span its tensors' rows, from 0 to the total. Unchecked (``check_seqlens=False``,
the default on CUDA tensors, where a check costs a device sync), a batch may start late or end early:
a buffer padded to a fixed token count for CUDA graphs, say, with ``cu_seqlens[-1]`` below its rows.
The attention kernels visit only the sequences' rows, so the others would keep what
``torch.empty`` held, and garbage gradients there flow into every weight that produced q, k, v (the
sum over rows of x·dq). Those rows belong to no sequence, and get what the CPU twin and a ranges
batch give such rows: o = 0, lse = −inf (sinks or not), zero gradients.

One launch clears up to two tensors that share the bounds (o and lse; dk and dv), with no
device→host sync: each program reads the bounds, and only a block of rows before the first bound
or from the largest one on writes. Bounds are read clamped into [0, total] (as ``seq_bounds`` reads
them), so the sequences span [first, max) exactly where the bounds never go back; where they do,
the rows between are unspecified, as the documentation says of overlapping sequences.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launcher import keep_bound, launcher
from .._runtime import cdiv, next_pow2

_BLOCK_ROWS = 64
_SCAN = 128  # bounds read per step of the scan for the last one


@triton.jit
def _fill_rows(t, n_heads, n_cols, s_row, s_head, s_col, fill, rows, outside,
               BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    value = (tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32) + fill).to(t.dtype.element_ty)
    head = t + rows.to(tl.int64)[:, None] * s_row  # pointers step per head: 64-bit offsets throughout
    for _ in range(n_heads):
        for c0 in range(0, n_cols, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            tl.store(head + cols.to(tl.int64)[None, :] * s_col, value, mask=outside[:, None] & (cols < n_cols)[None, :])
        head += s_head


@launcher
@triton.jit(do_not_specialize=["n_bounds", "total"])
def _clear_outside_kernel(bounds, a, b, n_bounds, total,
                          a_heads, a_cols, a_row, a_head, a_col, a_fill,
                          b_heads, b_cols, b_row, b_head, b_col, b_fill,
                          HAS_B: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                          SCAN: tl.constexpr):
    first = tl.minimum(tl.maximum(tl.load(bounds), 0), total)
    last = first
    for s0 in range(0, n_bounds, SCAN):
        idx = s0 + tl.arange(0, SCAN)
        last = tl.maximum(last, tl.max(tl.load(bounds + idx, mask=idx < n_bounds, other=0), axis=0))
    last = tl.minimum(last, total)
    r0 = tl.program_id(0) * BLOCK_R
    if (r0 < first) | (r0 + BLOCK_R > last):
        rows = r0 + tl.arange(0, BLOCK_R)
        outside = (rows < total) & ((rows < first) | (rows >= last))
        _fill_rows(a, a_heads, a_cols, a_row, a_head, a_col, a_fill, rows, outside, BLOCK_R, BLOCK_C)
        if HAS_B:
            _fill_rows(b, b_heads, b_cols, b_row, b_head, b_col, b_fill, rows, outside, BLOCK_R, BLOCK_C)


def _as_rows(t: torch.Tensor, rows_dim: int):
    """(rows, heads, cols, row stride, head stride, col stride) of a (total, H, D) tensor
    (``rows_dim`` 0) or an (H, total) one (``rows_dim`` 1: lse, one column)."""
    if rows_dim == 0:
        return t.shape[0], t.shape[1], t.shape[2], *t.stride()
    return t.shape[1], t.shape[0], 1, t.stride(1), t.stride(0), 0


def clear_outside_rows(cu_seqlens: torch.Tensor, a: torch.Tensor, a_fill: float = 0.0,
                       b: torch.Tensor | None = None, b_fill: float = 0.0, b_rows_dim: int = 0) -> None:
    """Set the rows of ``a`` (total, H, D) and ``b`` (the same rows: (total, H, D), or an (H, total)
    lse with ``b_rows_dim=1``) outside every sequence of ``cu_seqlens`` to ``a_fill`` / ``b_fill``,
    in place."""
    total, *a_args = _as_rows(a, 0)
    has_b = b is not None and b.numel() > 0
    if has_b:
        b_total, *b_args = _as_rows(b, b_rows_dim)
        assert b_total == total, (b_total, total)
    else:
        b, b_args = a, a_args  # an unread stand-in
    if total == 0 or a.numel() == 0:
        return
    # A repeated call (the same shapes, strides, dtypes and bound count) launches the compiled kernel
    # directly, skipping the launcher's key: 16 µs of host time a launch instead of 23 (an H200's host).
    key = (a.device, cu_seqlens.dtype, a.dtype, b.dtype, has_b, cu_seqlens.shape[0], total, *a_args, *b_args,
           a_fill, b_fill)
    bound = _BOUND.get(key)
    if bound is not None and bound(cu_seqlens, a, b):
        return
    grid = (cdiv(total, _BLOCK_ROWS),)
    args = (cu_seqlens, a, b, cu_seqlens.shape[0], total, *a_args, float(a_fill), *b_args, float(b_fill))
    constexprs = dict(HAS_B=has_b, BLOCK_R=_BLOCK_ROWS, BLOCK_C=min(128, next_pow2(max(a_args[1], b_args[1]))),
                      SCAN=_SCAN, num_warps=4)
    _clear_outside_kernel[grid](*args, **constexprs)
    if bound is None:  # (None also where these tensors cannot be bound, e.g. misaligned: the next call tries)
        keep_bound(_BOUND, key, _clear_outside_kernel.bind(grid, args, constexprs, 3))


_BOUND: dict = {}  # call signature → bound launch (see ``Launcher.bind``)
