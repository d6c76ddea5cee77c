"""Exact attention: validation, the custom ops and their autograd, the CPU twin, the public function.

The life of a call: ``attention`` → ``attention_core`` (checks, defaults) → ``_run`` → the
``flashattn_lite::attention_fwd`` custom op (autograd: ``flashattn_lite::attention_bwd``) →
``attention_forward`` / ``attention_backward`` (Triton, in ``attention_fwd.py`` /
``attention_bwd.py``) or ``_cpu_forward`` / ``_cpu_backward`` (the same algorithm in PyTorch, for
CPU tensors when the Triton interpreter is off).

Both directions are ``torch.library.custom_op``s with fake (meta) implementations, so
``torch.compile(fullgraph=True)`` traces through them without a graph break. In plain eager mode
``_run`` skips the custom-op dispatcher and calls ``_AttentionFn`` (an ``autograd.Function`` over
the same implementations): the dispatcher round trip costs ≈ 40 µs per forward+backward on the CPU
side (measured in ``benchmarks/sdpa_overhead.py``), which at small shapes is more than the kernels.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import _checks
from .._autograd import first_order_only
from .._runtime import runs_triton
from .attention_bwd import attention_backward
from .attention_cpu import cpu_backward, cpu_forward, work_dtype
from .attention_fwd import (PLAIN, SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN, Variant,
                            attention_forward, dense_output)
from .outside_rows import clear_outside_rows

_SEED_BOUND = 2 ** 62


def _validate(q, k, v, attn_mask, dropout_p, packed: bool = False):
    """Check q, k, v, mask and dropout; returns the mask as a 4-D view (no copy) or None.
    ``packed``: q, k, v are a varlen batch's (total, H, D) tensors (checked to be 3-D), checked as
    the (1, H, total, D) views the kernels read.

    The common, valid call costs one compound test (this runs on every call, so it is kept to
    ≈ 2 µs); only a failing call walks the detailed checks that name the culprit (on the views)."""
    try:
        if packed:  # the views' shapes, without the six view ops
            qs, ks, vs = ((1, t.shape[1], t.shape[0], t.shape[2]) for t in (q, k, v))
        else:
            qs, ks, vs = q.shape, k.shape, v.shape
        ok = (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and _dtype_ok(q)
              and k.dtype == q.dtype and v.dtype == q.dtype and k.device == q.device and v.device == q.device
              and qs[0] == ks[0] == vs[0] > 0 and ks[1] == vs[1] > 0 and qs[1] % ks[1] == 0 and qs[1] > 0
              and ks[2] == vs[2] > 0 and qs[2] > 0 and ks[3] == qs[3] and 0 < qs[3] <= 256 and 0 < vs[3] <= 256
              and isinstance(dropout_p, (float, int)) and not isinstance(dropout_p, bool)  # (numpy floats too)
              and 0.0 <= dropout_p < 1.0)
    except (AttributeError, TypeError):
        ok = False
    if not ok:
        _explain_invalid(*((_packed_as_4d(t) for t in (q, k, v)) if packed else (q, k, v)), dropout_p)
    if attn_mask is not None:
        attn_mask = _validate_mask(attn_mask, q, (qs[0], qs[1], qs[2], ks[2]))
    return attn_mask


def _dtype_ok(q) -> bool:
    """fp16/bf16/fp32 everywhere; float64 only on the PyTorch CPU twin (for gradcheck and
    references), never in a Triton kernel."""
    return q.dtype in _checks.FLOAT_DTYPES or (q.dtype == torch.float64 and not runs_triton(q))


def _explain_invalid(q, k, v, dropout_p):
    """Raise the error that names the first bad argument."""
    dtypes = _checks.FLOAT_DTYPES + ((torch.float64,) if isinstance(q, torch.Tensor) and _dtype_ok(q) else ())
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=4, dtypes=dtypes)
    _checks.check_same(("q", "k", "v"), (q, k, v), "dtype")
    _checks.check_same(("q", "k", "v"), (q, k, v), "device")
    B, Hq, Nq, D = q.shape
    _checks.check_dim("k", "batch size (dim 0)", k.shape[0], B, "q's")
    _checks.check_dim("v", "batch size (dim 0)", v.shape[0], B, "q's")
    _checks.check_dim("v", "heads (dim 1)", v.shape[1], k.shape[1], "k's")
    _checks.check_dim("v", "sequence length (dim 2)", v.shape[2], k.shape[2], "k's")
    _checks.check_dim("k", "head dim (dim 3)", k.shape[3], D, "q's")
    if k.shape[1] == 0 or Hq % k.shape[1] != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({k.shape[1]}) for GQA/MQA")
    if Nq == 0 or k.shape[2] == 0 or B == 0 or Hq == 0:
        raise ValueError(f"q, k, v must be non-empty, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    _checks.check_head_dim("q/k", D, 1, 256)
    _checks.check_head_dim("v", v.shape[3], 1, 256)
    raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")


def _validate_mask(attn_mask, q, full):
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    # float64 where q is (the CPU twin's float64 calls: references, gradcheck); the kernels read 16/32 bits.
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in _checks.FLOAT_DTYPES + (q.dtype,):
        raise TypeError(f"attn_mask must be bool, float16, bfloat16 or float32 (float64 only with float64 q, "
                        f"on the CPU), got {attn_mask.dtype}")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask must be on q's device ({q.device}), got {attn_mask.device}")
    if attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError("attn_mask must not require grad: gradients with respect to the mask are not supported")
    if attn_mask.dim() > 4 or any(m != 1 and m != f for m, f in zip(attn_mask.shape[::-1], full[::-1])):
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"(B, Hq, Nq, Nk) = {tuple(full)}")
    return _as_4d(attn_mask)


def _as_4d(mask: torch.Tensor) -> torch.Tensor:
    """Leading size-1 dims added as a view: the op sees the mask as small as the caller made it."""
    return mask if mask.dim() == 4 else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def draw_seed() -> int:
    """A fresh dropout seed from torch's default CPU generator (``torch.manual_seed`` reproduces
    it; a CPU draw, so no device sync)."""
    return int(torch.randint(0, _SEED_BOUND, (1,)).item())


# ------------------------------------------------------------------ score options and layouts

def _window_side(value, side: str) -> int:
    if value is None or (type(value) is int and value == -1):
        return -1
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"window {side} side must be an int ≥ 0, −1 or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"window {side} side must be ≥ 0 (−1 or None: unbounded), got {value}")
    return value


def _check_window(window) -> tuple[int, int]:
    """(left, right) in keys, −1 for an unbounded side."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a (left, right) pair, got {window!r}")
    return _window_side(window[0], "left"), _window_side(window[1], "right")


def _check_softcap(softcap) -> float:
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float > 0 or None, got {type(softcap).__name__}")
    if not (softcap >= 0.0 and softcap != float("inf")):
        raise ValueError(f"softcap must be a finite float > 0 (0 or None: no softcap), got {softcap}")
    return float(softcap)


def _check_head_vector(name, t, q, shapes, dtypes):
    _checks.check_tensor(name, t, dtypes=dtypes)
    if tuple(t.shape) not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")


def _check_sinks(sinks, q, Hq: int):
    if sinks is not None:
        _check_head_vector("sinks", sinks, q, [(Hq,)], _checks.FLOAT_DTYPES + (torch.float64,))
    return sinks


def _check_alibi(alibi, q, B: int, Hq: int):
    if alibi is None:
        return None
    _check_head_vector("alibi_slopes", alibi, q, [(Hq,), (B, Hq)], (torch.float32, torch.float64))
    if alibi.requires_grad and torch.is_grad_enabled():
        raise ValueError("alibi_slopes must not require grad: gradients with respect to the slopes are not supported")
    return alibi


def _check_bounds(name: str, t, q, rows: int | None, total: int | None, check: bool):
    """Int32 sequence bounds on q's device: (B, 2) ranges [start, end) within [0, rows), or (B+1,)
    cu_seqlens from 0 up to ``total``. Values are read only where that is free (CPU) or asked."""
    _checks.check_tensor(name, t, dtypes=(torch.int32,))
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
    if rows is not None:
        if t.dim() != 2 or t.shape[1] != 2 or t.shape[0] != q.shape[0]:
            raise ValueError(f"{name} must have shape (B, 2) = ({q.shape[0]}, 2), got {tuple(t.shape)}")
        if check:
            lo, hi = t[:, 0], t[:, 1]
            if bool(((lo < 0) | (hi < lo) | (hi > rows)).any()):
                raise ValueError(f"{name} must hold [start, end) ranges with 0 ≤ start ≤ end ≤ {rows}, "
                                 f"got {t.tolist()}")
        return
    if t.dim() != 1 or t.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B ≥ 1, got {tuple(t.shape)}")
    if check:
        values = t.tolist()
        if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])) or values[-1] != total:
            raise ValueError(f"{name} must start at 0, never decrease and end at the total length ({total}), "
                             f"got {values}")


def _check_offset(offset) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"causal_offset must be an int or None, got {type(offset).__name__}")
    if abs(offset) >= 2 ** 30:  # i + offset is computed in int32 in the kernels
        raise ValueError(f"causal_offset must be within ±2^30, got {offset}")
    return offset


def _bounds_checked(check_seqlens, t) -> bool:
    """The default checks where reading the values is free: CPU tensors in eager mode (a compiled
    graph cannot read them without breaking; the kernels read unchecked bounds clamped)."""
    if check_seqlens is None:
        return t.device.type == "cpu" and not torch.compiler.is_compiling()
    return bool(check_seqlens)


def _variant(q, k, *, window, softcap, sinks, alibi_slopes, seq=SEQ_DENSE, seq_q=None, seq_k=None,
             offset: int | None = None) -> Variant:
    """The call's options as the launchers take them. ``offset``: the call's causal_offset (None:
    bottom-right, Nk − Nq), which places the window."""
    if seq == SEQ_DENSE and window is None and softcap is None and sinks is None and alibi_slopes is None:
        return PLAIN  # the common call: no checks to walk on its host path
    left, right = _check_window(window)
    cap = _check_softcap(softcap)
    B, Hq = (q.shape[0], q.shape[1]) if seq <= SEQ_RANGES else (seq_q.shape[0] - 1, q.shape[1])
    alibi, sinks = _check_alibi(alibi_slopes, q, B, Hq), _check_sinks(sinks, q, Hq)
    if seq == SEQ_DENSE:
        # A side that cuts no (query, key) pair is unbounded: j ≥ i + off − left holds for every
        # pair once left ≥ Nq − 1 + off, j ≤ i + off + right once right ≥ Nk − 1 − off (``offset``:
        # the call's causal_offset). The sides kept are below |off| + N, so i + off ± side stays
        # within int32 in the kernels.
        off = k.shape[2] - q.shape[2] if offset is None else offset
        bounds = (q.shape[2] - 1 + off, k.shape[2] - 1 - off)
    else:
        # Positions are per sequence: a side at least as wide as both lengths bounds nothing.
        reach = (q.shape[0] + k.shape[0]) if seq > SEQ_RANGES else (q.shape[2] + k.shape[2])
        bounds = (reach, reach)
    left, right = (-1 if side >= bound else side for side, bound in zip((left, right), bounds))
    # The kernels read sinks and sequence bounds at unit steps (no copy when already so).
    contiguous = lambda t: None if t is None else t.contiguous()  # noqa: E731
    variant = Variant(left, right, cap, alibi, contiguous(sinks), seq, contiguous(seq_q), contiguous(seq_k))
    return PLAIN if variant == PLAIN else variant  # e.g. window=(None, None)


# ------------------------------------------------------------------ entry points

def attention_core(q, k, v, *, causal: bool = False, causal_offset: int | None = None, scale=None,
                   attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, return_lse: bool = False,
                   window=None, softcap=None, sinks=None, alibi_slopes=None, q_ranges=None, k_ranges=None,
                   check_seqlens=None):
    """Everything the kernels can do on a dense batch, for wrappers to build on (``attention``, the
    SDPA drop-in, the HF integration).

    ``causal_offset``: the diagonal that causal, window and ALiBi positions are measured from (key
    j is visible to query i iff j ≤ i + causal_offset under causal); default Nk − Nq
    (bottom-right). ALiBi's distances |i + offset − j| are float32: past about 2²⁰ from the
    diagonal the bias loses precision (a far block under ALiBi is weighted ≈ 0 anyway).
    ``attn_mask`` broadcastable to (B, Hq, Nq, Nk), bool (True = take part) or float (added to
    the scaled scores); broadcast dims are read with stride 0, never copied.
    Dropout seeds come from ``draw_seed``. ``window``, ``softcap``, ``sinks``, ``alibi_slopes``: as
    in :func:`attention`.

    ``q_ranges``/``k_ranges``: int32 (B, 2) on q's device, [start, end) of each batch row's valid
    positions in a padded batch (no (L, S) mask): keys outside are invisible, query rows outside
    give o = 0 and lse = −inf, and positions are measured per sequence from the range starts,
    bottom-right. Not combined with ``attn_mask``, dropout or ``causal_offset``. Range values are
    checked where that costs no device sync (CPU tensors) or with ``check_seqlens=True``.
    """
    attn_mask = _validate(q, k, v, attn_mask, dropout_p)
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    _checks.check_bool("causal", causal)
    _checks.check_bool("return_lse", return_lse)
    if check_seqlens is not None:
        _checks.check_bool("check_seqlens", check_seqlens)
    seq, seq_q, seq_k = SEQ_DENSE, None, None
    if q_ranges is not None or k_ranges is not None:
        if q_ranges is None or k_ranges is None:
            raise ValueError("q_ranges and k_ranges must be given together")
        if attn_mask is not None or dropout_p > 0 or causal_offset is not None:
            raise ValueError("q_ranges/k_ranges cannot be combined with attn_mask, dropout_p or causal_offset")
        _check_bounds("q_ranges", q_ranges, q, q.shape[2], None, _bounds_checked(check_seqlens, q_ranges))
        _check_bounds("k_ranges", k_ranges, q, k.shape[2], None, _bounds_checked(check_seqlens, k_ranges))
        seq, seq_q, seq_k = SEQ_RANGES, q_ranges, k_ranges
    offset = k.shape[2] - q.shape[2] if causal_offset is None else _check_offset(causal_offset)
    variant = _variant(q, k, window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
                       seq=seq, seq_q=seq_q, seq_k=seq_k, offset=offset)
    o, lse = _run(q, k, v, attn_mask, float(scale), causal, offset, float(dropout_p), need_lse=return_lse,
                  variant=variant)
    return (o, lse) if return_lse else o


def _run(q, k, v, mask, scale: float, causal: bool, offset: int, dropout_p: float, need_lse: bool = True,
         variant: Variant = PLAIN):
    """Validated arguments in, (o, lse) out. ``mask`` is None or 4-D broadcastable to (B, Hq, Nq, Nk).
    With ``need_lse=False`` the caller discards lse, and a call with nothing to differentiate skips
    computing it (lse is then None). Varlen calls pass q/k/v packed (total, H, D).

    Plain eager calls go straight to ``_AttentionFn`` (or to the kernels when no input needs a
    gradient); anything traced (Dynamo, export, FX, fake/functional tensors, subclasses) goes
    through the registered custom op, which those systems understand. The op takes the dropout
    seed as a CPU int64 tensor drawn in the graph: Dynamo cannot turn a fresh random number into a
    Python int without a graph break (``.item()`` breaks; values from ``random`` become 0-d tensors
    too)."""
    sinks = variant.sinks
    eager = type(q) is torch.Tensor and not q.is_meta  # (meta tensors: the op's fake gives the shapes)
    if eager and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None:
        seed = draw_seed() if dropout_p > 0.0 else 0
        if (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                         or (sinks is not None and sinks.requires_grad))) or _transformed():
            return _AttentionFn.apply(q, k, v, sinks, mask, scale, causal, offset, dropout_p, seed, variant)
        # Nothing to differentiate: autograd.Function.apply would only cost time (≈ 20% of a tiny call),
        # and without a backward only the caller may want lse (allocating it costs µs at tiny shapes).
        return _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed, need_lse, variant)
    seed_t = torch.randint(0, _SEED_BOUND, (), dtype=torch.int64) if dropout_p > 0.0 else None
    return torch.ops.flashattn_lite.attention_fwd(q, k, v, mask, sinks, variant.alibi, variant.seq_q, variant.seq_k,
                                                  scale, causal, offset, *_scalars(variant), dropout_p, seed_t)


def _scalars(variant: Variant):
    return variant.left, variant.right, variant.softcap, variant.seq


def _from_op(sinks, alibi, seq_q, seq_k, left, right, softcap, seq) -> Variant:
    variant = Variant(left, right, softcap, alibi, sinks, seq, seq_q, seq_k)
    return PLAIN if variant == PLAIN else variant


def _transformed() -> bool:
    """Forward-mode AD or a functorch transform is active: its tangents do not set requires_grad,
    so only ``autograd.Function`` (which refuses what it cannot differentiate) may see the call."""
    return fwAD._current_level >= 0 or torch._C._are_functorch_transforms_active()


# ------------------------------------------------------------------ implementations

def _packed_as_4d(t: torch.Tensor) -> torch.Tensor:
    """(total, H, D) → a (1, H, total, D) view: the kernels' layout for a packed batch."""
    return t.transpose(0, 1).unsqueeze(0)


def _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed, need_lse=True, variant=PLAIN, out=None):
    """(o, lse); lse is None when ``need_lse`` is False. Varlen: o (total, Hq, Dv), lse (Hq, total).
    ``out``: a tensor of o's shape and dtype that receives o, which is then it: the Gluon forward
    writes it there (a dense batch), other paths' o is copied in."""
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    varlen = variant.seq >= SEQ_VARLEN
    if varlen:
        q, k, v = _packed_as_4d(q), _packed_as_4d(k), _packed_as_4d(v)
    fwd = attention_forward if runs_triton(q) else cpu_forward
    writes = dict(out=out) if out is not None and runs_triton(q) and not varlen else {}
    o, lse = fwd(q, k, v, scale=scale, causal=causal, causal_offset=offset, mask=mask,
                 dropout_p=dropout_p, seed=seed, need_lse=need_lse, variant=variant, **writes)
    if varlen:  # contiguous (total, Hq, Dv), as the kernels write it (the CPU twin needs the copy)
        o = o[0].transpose(0, 1).contiguous()
        lse = None if lse is None else lse[0]
        if runs_triton(q):  # rows outside every sequence: o = 0, lse = −inf (the CPU twin's already)
            clear_outside_rows(variant.seq_q, o, 0.0, lse, float("-inf"), b_rows_dim=1)
    elif variant.seq == SEQ_DENSE and not runs_triton(q) and out is None and not q.is_contiguous():
        o = dense_output(q, v.shape[3]).copy_(o)  # the kernels' layout (and the fake's); the twin's is contiguous
    if out is not None and o is not out:
        o = out.copy_(o)
    return o, lse


def _backward_impl(do, q, k, v, o, lse, dlse, mask, scale, causal, offset, dropout_p, seed, variant=PLAIN,
                   out=None):
    """(dq, dk, dv, dsinks), each gradient laid out as ``torch.empty_like`` of its input (dsinks
    None without sinks). ``out``: (dq, dk, dv) tensors of the gradients' shapes and dtypes that
    receive them, which are then they: the Gluon backward writes them there (a dense batch), other
    paths' gradients are copied in."""
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    shapes = (q, k, v)
    if variant.seq >= SEQ_VARLEN:
        do, q, k, v, o = (_packed_as_4d(t) for t in (do, q, k, v, o))
        lse = lse.unsqueeze(0)
        dlse = None if dlse is None else dlse.unsqueeze(0)
    kwargs = dict(scale=scale, causal=causal, causal_offset=offset, mask=mask, dropout_p=dropout_p, seed=seed,
                  variant=variant)
    if runs_triton(q):
        writes = dict(out=out) if out is not None and variant.seq < SEQ_VARLEN else {}
        dq, dk, dv, dsinks = attention_backward(do, q, k, v, o, lse, dlse, **kwargs, **writes)
    else:
        dq, dk, dv, dsinks = cpu_backward(do, q, k, v, o, lse, dlse, **kwargs)
    if variant.seq >= SEQ_VARLEN:
        dq, dk, dv = (g[0].transpose(0, 1) for g in (dq, dk, dv))
        if runs_triton(q):  # rows outside every sequence: zero gradients (the CPU twin's already)
            clear_outside_rows(variant.seq_q, dq)
            clear_outside_rows(variant.seq_k, dk, 0.0, dv)
    if out is not None:
        return (*(dest if dest is g else dest.copy_(g) for dest, g in zip(out, (dq, dk, dv))), dsinks)
    # Same strides as the inputs (and the fake kernel): empty_like of each input.
    grads = tuple(g if g.stride() == x.stride() else torch.empty_like(x).copy_(g) for x, g in zip(shapes, (dq, dk, dv)))
    return (*grads, dsinks)


# ------------------------------------------------------------------ custom ops (torch.compile)

def _seed_int(seed: torch.Tensor | None) -> int:
    return 0 if seed is None else int(seed.item())  # a CPU tensor: no device sync


@torch.library.custom_op("flashattn_lite::attention_fwd", mutates_args=())
def _attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                      sinks: Optional[torch.Tensor], alibi: Optional[torch.Tensor], seq_q: Optional[torch.Tensor],
                      seq_k: Optional[torch.Tensor], scale: float, causal: bool, causal_offset: int,
                      left: int, right: int, softcap: float, seq: int, dropout_p: float,
                      seed: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o (B, Hq, Nq, Dv) in q's dtype (``dense_output``'s layout; ranges: contiguous), lse
    (B, Hq, Nq) float32; packed varlen (``seq`` ≥ SEQ_VARLEN): o (total, Hq, Dv), lse (Hq, total).
    ``seed``: CPU int64 scalar tensor (None without dropout)."""
    variant = _from_op(sinks, alibi, seq_q, seq_k, left, right, softcap, seq)
    return _forward_impl(q, k, v, mask, scale, causal, causal_offset, dropout_p, _seed_int(seed), True, variant)


@_attention_fwd_op.register_fake
def _(q, k, v, mask, sinks, alibi, seq_q, seq_k, scale, causal, causal_offset, left, right, softcap, seq,
      dropout_p, seed):
    if seq >= SEQ_VARLEN:
        total, Hq, _ = q.shape
        return q.new_empty((total, Hq, v.shape[2])), q.new_empty((Hq, total), dtype=work_dtype(q))
    B, Hq, Nq, _ = q.shape
    o = q.new_empty((B, Hq, Nq, v.shape[3])) if seq == SEQ_RANGES else dense_output(q, v.shape[3])
    return o, q.new_empty((B, Hq, Nq), dtype=work_dtype(q))


@torch.library.custom_op("flashattn_lite::attention_bwd", mutates_args=())
def _attention_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor, dlse: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                      sinks: Optional[torch.Tensor], alibi: Optional[torch.Tensor], seq_q: Optional[torch.Tensor],
                      seq_k: Optional[torch.Tensor], scale: float, causal: bool, causal_offset: int,
                      left: int, right: int, softcap: float, seq: int, dropout_p: float,
                      seed: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks), each gradient laid out as ``torch.empty_like`` of its input; dk, dv
    summed over GQA groups; dsinks (Hq,) (empty without sinks)."""
    variant = _from_op(sinks, alibi, seq_q, seq_k, left, right, softcap, seq)
    dq, dk, dv, dsinks = _backward_impl(do, q, k, v, o, lse, dlse, mask, scale, causal, causal_offset, dropout_p,
                                        _seed_int(seed), variant)
    return dq, dk, dv, (dsinks if dsinks is not None else q.new_empty((0,)))


@_attention_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, mask, sinks, alibi, seq_q, seq_k, scale, causal, causal_offset, left, right,
      softcap, seq, dropout_p, seed):
    dsinks = torch.empty_like(sinks) if sinks is not None else q.new_empty((0,))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def _setup_context(ctx, inputs, output):
    q, k, v, mask, sinks, alibi, seq_q, seq_k, *args = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask, sinks, alibi, seq_q, seq_k)
    ctx.args = tuple(args)
    ctx.set_materialize_grads(False)


def _op_backward(ctx, do, dlse):
    q, k, v, o, lse, mask, sinks, alibi, seq_q, seq_k = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv, dsinks = torch.ops.flashattn_lite.attention_bwd(do, q, k, v, o, lse, dlse, mask, sinks, alibi,
                                                                seq_q, seq_k, *ctx.args)
    dq, dk, dv, dsinks = first_order_only((dq, dk, dv, dsinks if sinks is not None else None), (q, k, v, sinks),
                                          "flashattn_lite's attention")
    return (dq, dk, dv, None, dsinks) + (None,) * 12


_attention_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)


class _AttentionFn(torch.autograd.Function):
    """The eager twin of the custom op's autograd: same implementations, no dispatcher hop."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, mask, scale, causal, offset, dropout_p, seed, variant):
        o, lse = _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed, True, variant)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.args = (scale, causal, offset, dropout_p, seed, variant)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, mask = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv, dsinks = _backward_impl(do, q, k, v, o, lse, dlse, mask, *ctx.args)
        sinks = ctx.args[-1].sinks
        dq, dk, dv, dsinks = first_order_only((dq, dk, dv, dsinks), (q, k, v, sinks), "flashattn_lite's attention")
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, window: tuple | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
              return_lse: bool = False, q_ranges: torch.Tensor | None = None,
              k_ranges: torch.Tensor | None = None, check_seqlens: bool | None = None):
    """Exact softmax attention, memory O(N·D), forward and backward fused in Triton.

    Args:
        q: (B, Hq, Nq, D). k: (B, Hkv, Nk, D). v: (B, Hkv, Nk, Dv). fp16, bf16 or fp32, one device.
            Hq must be a multiple of Hkv (GQA; MQA when Hkv = 1): query head h reads KV head
            h // (Hq / Hkv). Any strides (a (B, N, H, D) tensor passed as ``.transpose(1, 2)``
            is read in place). Any Nq, Nk ≥ 1; D, Dv in [1, 256].
        causal: mask key j for query i when j > i + (Nk − Nq) (bottom-right aligned, as in
            FlashAttention and KV-cache prefill; top-left is available through the SDPA drop-in).
        scale: multiplies q·k; defaults to D ** -0.5.
        window: (left, right) local attention: key j is visible to query i iff
            i + off − left ≤ j ≤ i + off + right, off = Nk − Nq; a side of None (or −1) is
            unbounded; with ``causal`` the right side is capped at 0. Key tiles outside the band
            are never visited: cost O(N·(left + right)). A sliding window of W tokens
            (Mistral-style) is ``causal=True, window=(W - 1, 0)``.
        softcap: c > 0: scores s ← c·tanh(s / c) before masking (Gemma 2); gradients flow
            through the tanh. 0 or None: no softcap.
        sinks: (Hq,) per-head logits (gpt-oss attention sinks): one extra term exp(sink_h) in each
            row's softmax denominator, with no value. Differentiable. A row with no visible key
            gives o = 0 and lse = sink_h.
        alibi_slopes: (Hq,) or (B, Hq) float32: s ← s − slope·|i + off − j| (after softcap).
        return_lse: also return the log-sum-exp of the final scores, (B, Hq, Nq) float32, natural
            log, including the sink term. It is differentiable.
        q_ranges, k_ranges: a padded batch without an (Nq, Nk) mask: int32 (B, 2) on q's device,
            [start, end) of each batch row's valid query and key positions (left padding: start
            = the pad count, end = N; right padding: start 0). Keys outside are invisible, query
            rows outside give o = 0 and lse = −inf (and no gradient), and causal, window and
            ALiBi positions are measured per row from the range starts, bottom-right. Given
            together. Range values are checked where that costs no device sync (CPU tensors) or
            with ``check_seqlens=True``; unchecked bad values are read clamped into [0, N].

    float64 inputs are accepted on the CPU twin only (``gradcheck``, references). A scale whose
    product with log2 e overflows float32 (|scale| > 2.36e38) is a ValueError.

    Returns:
        o (B, Hq, Nq, Dv) in the input dtype (and lse), laid out as q where Dv is q's head dim (a
        ``q.transpose(1, 2)`` of (B, N, H, D) storage gives o in (B, N, H, D) storage, as torch's
        flash SDPA does), contiguous otherwise. A query row whose keys are all masked gives o = 0
        and lse = −inf.

    Arithmetic is float32 (fp32 inputs use TF32 only where torch's CUDA matmuls may:
    ``torch.backends.cuda.matmul.allow_tf32`` or ``fp32_precision == "tf32"``); the softcap's
    tanh uses the hardware approximation for fp16/bf16 inputs (as FlashAttention does). The
    backward is deterministic (the same inputs give bit-identical gradients) except where, on
    sm_90, a Gluon backward adds fp32 partial sums in the order its tiles finish (large fp16/bf16
    calls without mask or dropout; docs/api.md, "Which kernel a call takes"): dq at kernel head
    dims up to 128 and in the head dim 256 one pass (plain causal calls with q's head dim above 128
    beside v's at most 128, as MLA's 192 / 128); dk and dv too in plain causal GQA calls over dense
    batches from 4096 keys (2048 where group × head dim ≥ 1024) at head dims up to 128. Under
    ``torch.use_deterministic_algorithms(True)`` every gradient is bit-identical.
    CUDA tensors run Triton kernels; CPU tensors run the same tiled algorithm in PyTorch (or the
    Triton kernels in the interpreter when ``TRITON_INTERPRET=1``).

        >>> import torch, flashattn_lite
        >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> o, lse = flashattn_lite.attention(q, k, v, causal=True, return_lse=True)   # GQA 4:2
        >>> o.shape, lse.shape
        (torch.Size([1, 4, 3, 8]), torch.Size([1, 4, 3]))
        >>> visible = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)   # bottom-right: 3 queries are the last of 5
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=visible)
        >>> torch.allclose(o, ref, atol=1e-5)
        True
        >>> local = flashattn_lite.attention(q, k, v, causal=True, window=(1, 0))   # each query sees 2 keys
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=visible & ~visible.tril(0))
        >>> torch.allclose(local, ref, atol=1e-5)
        True
    """
    return attention_core(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
                          alibi_slopes=alibi_slopes, return_lse=return_lse, q_ranges=q_ranges, k_ranges=k_ranges,
                          check_seqlens=check_seqlens)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                     *, causal: bool = False, scale: float | None = None, window: tuple | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None,
                     alibi_slopes: torch.Tensor | None = None, return_lse: bool = False,
                     check_seqlens: bool | None = None):
    """Attention over a packed batch of variable-length sequences (FlashAttention-2's
    ``flash_attn_varlen_func`` layout): no padding, each sequence attends only to itself.

    Args:
        q: (total_q, Hq, D). k: (total_k, Hkv, D). v: (total_k, Hkv, Dv). Sequence b holds rows
            [cu_seqlens[b], cu_seqlens[b + 1]).
        cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) on q's device, starting at 0, non-decreasing,
            ending at total_q / total_k.
        max_seqlen_q, max_seqlen_k: accepted for FlashAttention compatibility and checked where
            checking is free; not needed: the grid is sized from the totals and each program finds
            its sequence on the device, so there is no device→host sync, the call is CUDA-graph
            and torch.compile friendly, and a new batch of lengths never recompiles.
        causal, scale, window, softcap, sinks, alibi_slopes, return_lse: as in :func:`attention`,
            per sequence (bottom-right aligned within each sequence; ``alibi_slopes`` may be
            (B, Hq), one row per sequence).
        check_seqlens: validate the cu_seqlens values (a device sync on GPU tensors; a graph break
            under ``torch.compile``). Default: only where it is free, on CPU tensors outside
            ``torch.compile``. Unchecked bad values are read clamped into
            [0, total], never an access outside q, k, v or o: where that gives a valid batch (past
            the total, below 0, a zero-padded tail) the call computes it; rows before the first
            bound or from the largest on (a batch ending early, e.g. a buffer padded for CUDA
            graphs) give o = 0, lse = −inf (sinks or not) and zero gradients; sequences that
            still overlap give unspecified rows.

    Returns:
        o (total_q, Hq, Dv) in q's dtype, and with ``return_lse`` lse (Hq, total_q) float32.
        Forward and backward (dq, dk, dv and dsinks).

        >>> import torch
        >>> from flashattn_lite import attention, attention_varlen
        >>> cu = torch.tensor([0, 3, 8], dtype=torch.int32)            # two sequences: 3 and 5 tokens
        >>> q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
        >>> o = attention_varlen(q, k, v, cu, cu, causal=True)
        >>> o.shape
        torch.Size([8, 4, 16])
        >>> dense = attention(*(t[3:].transpose(0, 1)[None] for t in (q, k, v)), causal=True)
        >>> torch.allclose(o[3:], dense[0].transpose(0, 1), atol=1e-5)
        True
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=3, dtypes=_checks.FLOAT_DTYPES + (torch.float64,))
    if q.shape[0] == 0:  # (named here: the dense checks below see (1, H, total, D) views)
        raise ValueError(f"q must hold at least one row (total_q ≥ 1), got shape {tuple(q.shape)}")
    _checks.check_bool("causal", causal)
    _checks.check_bool("return_lse", return_lse)
    if check_seqlens is not None:
        _checks.check_bool("check_seqlens", check_seqlens)
    check = _bounds_checked(check_seqlens, cu_seqlens_q)
    _check_bounds("cu_seqlens_q", cu_seqlens_q, q, None, q.shape[0], check)
    _check_bounds("cu_seqlens_k", cu_seqlens_k, q, None, k.shape[0], check)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (B + 1), got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    max_q, max_k = (_check_max(name, m) for name, m in (("max_seqlen_q", max_seqlen_q),
                                                           ("max_seqlen_k", max_seqlen_k)))
    if check and (max_q or max_k):
        lens_q, lens_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
        if (max_q and int(lens_q.max()) > max_q) or (max_k and int(lens_k.max()) > max_k):
            raise ValueError(f"max_seqlen_q/max_seqlen_k ({max_q}, {max_k}) are below the longest sequences "
                             f"({int(lens_q.max())}, {int(lens_k.max())})")
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if k.shape[0] == 0 and q.shape[0] > 0:  # no key in any sequence: every row sees nothing
        _check_window(window), _check_softcap(softcap)
        _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
        return _no_keys(q, k, v, _check_sinks(sinks, q, q.shape[1]), return_lse)
    # The checks of a dense call on the (1, H, total, D) views the kernels read.
    _validate(q, k, v, None, 0.0, packed=True)
    variant = _variant(q, k, window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
                       seq=SEQ_VARLEN, seq_q=cu_seqlens_q, seq_k=cu_seqlens_k)
    o, lse = _run(q, k, v, None, float(scale), causal, 0, 0.0, need_lse=return_lse, variant=variant)
    return (o, lse) if return_lse else o


def _no_keys(q, k, v, sinks, return_lse):
    """A packed batch whose key sequences are all empty: o = 0 and lse = the sink (−inf without),
    with the shapes and (zero) gradients of a normal call."""
    for name, t in (("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=3)
    _checks.check_dim("v", "total length (dim 0)", v.shape[0], k.shape[0], "k's")
    # A dense call's checks (dtypes, devices, heads, head dims) on one-row stand-ins for the empty k, v.
    k1, v1 = (t.new_zeros((1, *t.shape[1:])) for t in (k, v))
    _validate(q, k1, v1, None, 0.0, packed=True)
    o = torch.zeros((*q.shape[:2], v.shape[2]), device=q.device, dtype=q.dtype)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # keeps o in the graph (zero gradients) whatever values q, k, v hold
        o = o + sum(t.flatten()[:1].nan_to_num(0.0, 0.0, 0.0).sum() * 0 for t in (q, k, v) if t.numel())
    if sinks is None:
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device, dtype=torch.float32)
    else:
        lse = sinks.float()[:, None].expand(q.shape[1], q.shape[0])
    return (o, lse) if return_lse else o


def _check_max(name: str, m) -> int:
    if m is None:
        return 0
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(f"{name} must be an int or None, got {type(m).__name__}")
    if m < 1:
        raise ValueError(f"{name} must be ≥ 1, got {m}")
    return m
