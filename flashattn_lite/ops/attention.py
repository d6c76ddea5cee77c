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
from .._runtime import runs_triton
from ..merge import lse_of_torch, online_softmax_update_torch
from ..reference import causal_mask
from .attention_bwd import attention_backward
from .attention_fwd import attention_forward

_CPU_CHUNK = 512
_SEED_BOUND = 2 ** 62


def _validate(q, k, v, attn_mask, dropout_p):
    """Check q, k, v, mask and dropout; returns the mask as a 4-D view (no copy) or None.

    The common, valid call costs one compound test (this runs on every call, so it is kept to
    ≈ 2 µs); only a failing call walks the detailed checks that name the culprit."""
    try:
        qs, ks, vs = q.shape, k.shape, v.shape
        ok = (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and _dtype_ok(q)
              and k.dtype == q.dtype and v.dtype == q.dtype and k.device == q.device and v.device == q.device
              and qs[0] == ks[0] == vs[0] > 0 and ks[1] == vs[1] > 0 and qs[1] % ks[1] == 0 and qs[1] > 0
              and ks[2] == vs[2] > 0 and qs[2] > 0 and ks[3] == qs[3] and 0 < qs[3] <= 256 and 0 < vs[3] <= 256
              and type(dropout_p) in (float, int) and 0.0 <= dropout_p < 1.0)
    except (AttributeError, TypeError):
        ok = False
    if not ok:
        _explain_invalid(q, k, v, dropout_p)
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
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"attn_mask must be bool or a float dtype, got {attn_mask.dtype}")
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


def attention_core(q, k, v, *, causal: bool = False, causal_offset: int | None = None, scale=None,
                   attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, return_lse: bool = False):
    """Everything the kernels can do, for wrappers to build on (``attention``, the SDPA drop-in).

    ``causal_offset``: key j is visible to query i iff j ≤ i + causal_offset; default Nk − Nq
    (bottom-right). ``attn_mask`` broadcastable to (B, Hq, Nq, Nk), bool (True = take part) or
    float (added to the scaled scores); broadcast dims are read with stride 0, never copied.
    Dropout seeds come from ``draw_seed``.
    """
    attn_mask = _validate(q, k, v, attn_mask, dropout_p)
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    offset = k.shape[2] - q.shape[2] if causal_offset is None else int(causal_offset)
    return_lse = bool(return_lse)
    o, lse = _run(q, k, v, attn_mask, float(scale), causal, offset, float(dropout_p), need_lse=return_lse)
    return (o, lse) if return_lse else o


def _run(q, k, v, mask, scale: float, causal: bool, offset: int, dropout_p: float, need_lse: bool = True):
    """Validated arguments in, (o, lse) out. ``mask`` is None or 4-D broadcastable to (B, Hq, Nq, Nk).
    With ``need_lse=False`` the caller discards lse, and a call with nothing to differentiate skips
    computing it (lse is then None).

    Plain eager calls go straight to ``_AttentionFn`` (or to the kernels when no input needs a
    gradient); anything traced (Dynamo, export, FX, fake/functional tensors, subclasses) goes
    through the registered custom op, which those systems understand. The op takes the dropout
    seed as a CPU int64 tensor drawn in the graph: Dynamo cannot turn a fresh random number into a
    Python int without a graph break (``.item()`` breaks; values from ``random`` become 0-d tensors
    too)."""
    if type(q) is torch.Tensor and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None:
        seed = draw_seed() if dropout_p > 0.0 else 0
        if (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) or _transformed():
            return _AttentionFn.apply(q, k, v, mask, scale, causal, offset, dropout_p, seed)
        # Nothing to differentiate: autograd.Function.apply would only cost time (≈ 20% of a tiny call),
        # and without a backward only the caller may want lse (allocating it costs µs at tiny shapes).
        return _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed, need_lse)
    seed_t = torch.randint(0, _SEED_BOUND, (), dtype=torch.int64) if dropout_p > 0.0 else None
    return torch.ops.flashattn_lite.attention_fwd(q, k, v, mask, scale, causal, offset, dropout_p, seed_t)


def _transformed() -> bool:
    """Forward-mode AD or a functorch transform is active: its tangents do not set requires_grad,
    so only ``autograd.Function`` (which refuses what it cannot differentiate) may see the call."""
    return fwAD._current_level >= 0 or torch._C._are_functorch_transforms_active()


# ------------------------------------------------------------------ implementations

def _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed, need_lse=True):
    """(o, lse); lse is None when ``need_lse`` is False."""
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    fwd = attention_forward if runs_triton(q) else _cpu_forward
    return fwd(q, k, v, scale=scale, causal=causal, causal_offset=offset, mask=mask,
               dropout_p=dropout_p, seed=seed, need_lse=need_lse)


def _backward_impl(do, q, k, v, o, lse, dlse, mask, scale, causal, offset, dropout_p, seed):
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if runs_triton(q):
        return attention_backward(do, q, k, v, o, lse, dlse, scale=scale, causal=causal, causal_offset=offset,
                                  mask=mask, dropout_p=dropout_p, seed=seed)
    grads = _cpu_backward(do, q, k, v, o, lse, dlse, scale=scale, causal=causal, causal_offset=offset,
                          mask=mask, dropout_p=dropout_p, seed=seed)
    # Same strides as the Triton launcher (and the fake kernel): empty_like of each input.
    return tuple(torch.empty_like(x).copy_(g) for x, g in zip((q, k, v), grads))


# ------------------------------------------------------------------ custom ops (torch.compile)

def _seed_int(seed: torch.Tensor | None) -> int:
    return 0 if seed is None else int(seed.item())  # a CPU tensor: no device sync


@torch.library.custom_op("flashattn_lite::attention_fwd", mutates_args=())
def _attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                      scale: float, causal: bool, causal_offset: int, dropout_p: float,
                      seed: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o (B, Hq, Nq, Dv) contiguous in q's dtype, lse (B, Hq, Nq) float32.
    ``seed``: CPU int64 scalar tensor (None without dropout)."""
    return _forward_impl(q, k, v, mask, scale, causal, causal_offset, dropout_p, _seed_int(seed))


@_attention_fwd_op.register_fake
def _(q, k, v, mask, scale, causal, causal_offset, dropout_p, seed):
    B, Hq, Nq, _ = q.shape
    return q.new_empty((B, Hq, Nq, v.shape[3])), q.new_empty((B, Hq, Nq), dtype=_work_dtype(q))


@torch.library.custom_op("flashattn_lite::attention_bwd", mutates_args=())
def _attention_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor, dlse: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                      scale: float, causal: bool, causal_offset: int, dropout_p: float,
                      seed: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each laid out as ``torch.empty_like`` of its input; dk, dv summed over GQA groups."""
    return _backward_impl(do, q, k, v, o, lse, dlse, mask, scale, causal, causal_offset, dropout_p,
                          _seed_int(seed))


@_attention_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, mask, scale, causal, causal_offset, dropout_p, seed):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, scale, causal, offset, dropout_p, seed = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask)
    ctx.args = (scale, causal, offset, dropout_p, seed)
    ctx.set_materialize_grads(False)


def _op_backward(ctx, do, dlse):
    q, k, v, o, lse, mask = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = torch.ops.flashattn_lite.attention_bwd(do, q, k, v, o, lse, dlse, mask, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


_attention_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)


class _AttentionFn(torch.autograd.Function):
    """The eager twin of the custom op's autograd: same implementations, no dispatcher hop."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal, offset, dropout_p, seed):
        o, lse = _forward_impl(q, k, v, mask, scale, causal, offset, dropout_p, seed)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.args = (scale, causal, offset, dropout_p, seed)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, mask = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = _backward_impl(do, q, k, v, o, lse, dlse, mask, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, return_lse: bool = False):
    """Exact softmax attention, memory O(N·D), forward and backward fused in Triton.

    Args:
        q: (B, Hq, Nq, D). k: (B, Hkv, Nk, D). v: (B, Hkv, Nk, Dv). fp16, bf16 or fp32, one device.
            Hq must be a multiple of Hkv (GQA; MQA when Hkv = 1): query head h reads KV head
            h // (Hq / Hkv). Any strides (a (B, N, H, D) tensor passed as ``.transpose(1, 2)``
            is read in place). Any Nq, Nk ≥ 1; D, Dv in [1, 256].
        causal: mask key j for query i when j > i + (Nk − Nq) (bottom-right aligned, as in
            FlashAttention and KV-cache prefill; top-left is available through the SDPA drop-in).
        scale: multiplies q·k; defaults to D ** -0.5.
        return_lse: also return the log-sum-exp of the scaled scores, (B, Hq, Nq) float32,
            natural log. It is differentiable.

    float64 inputs are accepted on the CPU twin only (``gradcheck``, references).

    Returns:
        o (B, Hq, Nq, Dv) in the input dtype (and lse). A query row whose keys are all masked
        gives o = 0 and lse = −inf.

    Arithmetic is float32 (fp32 inputs use TF32 only where torch's CUDA matmuls may:
    ``torch.backends.cuda.matmul.allow_tf32`` or ``fp32_precision == "tf32"``). The backward is
    deterministic: the same inputs give bit-identical gradients.
    CUDA tensors run Triton kernels; CPU tensors run the same tiled algorithm in PyTorch (or the
    Triton kernels in the interpreter when ``TRITON_INTERPRET=1``).
    """
    return attention_core(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


# ------------------------------------------------------------------ CPU twin (PyTorch, tiled)

def _work_dtype(q: torch.Tensor) -> torch.dtype:
    """float32 arithmetic (and lse), float64 for float64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _grouped(q, k, v):
    """Views with the GQA group as its own dim: q (B, Hkv, G, Nq, D), k/v (B, Hkv, 1, Nk, ·)."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    return q.reshape(B, Hkv, Hq // Hkv, Nq, D), k.unsqueeze(2), v.unsqueeze(2)


def _chunk_scores(qg, kg, j0, j1, scale, causal, offset, mask, dropout_p, seed):
    """Scaled scores for key chunk [j0, j1) with masks applied, and the dropout keep-mask (or None)."""
    B, Hkv, G, Nq, _ = qg.shape
    Nk = kg.shape[3]
    s = torch.matmul(qg, kg[:, :, :, j0:j1].transpose(-1, -2)) * scale
    if mask is not None:
        m = mask[..., j0:j1].reshape(B, Hkv, G, Nq, j1 - j0)
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(s.dtype)
    if causal:
        visible = causal_mask(Nq, Nk, offset, s.device)[:, j0:j1]
        s = s.masked_fill(~visible, float("-inf"))
    keep = None
    if dropout_p > 0:
        rows = torch.arange(B * Hkv * G * Nq, dtype=torch.int64).view(B, Hkv, G, Nq, 1)
        offsets = rows * Nk + torch.arange(j0, j1, dtype=torch.int64)
        from ..dropout import keep_threshold, philox_randint_torch
        keep = (philox_randint_torch(seed, offsets) & 0x7FFFFFFF) >= keep_threshold(dropout_p)
    return s, keep


def _cpu_forward(q, k, v, *, scale, causal, causal_offset, mask, dropout_p, seed, need_lse=True):
    w = _work_dtype(q)
    qg, kg, vg = _grouped(q.to(w), k.to(w), v.to(w))
    B, Hkv, G, Nq, _ = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    m = torch.full((B, Hkv, G, Nq), float("-inf"), dtype=w)
    l = torch.zeros_like(m)
    acc = torch.zeros((B, Hkv, G, Nq, Dv), dtype=w)
    for j0 in range(0, Nk, _CPU_CHUNK):
        j1 = min(Nk, j0 + _CPU_CHUNK)
        s, keep = _chunk_scores(qg, kg, j0, j1, scale, causal, causal_offset, mask, dropout_p, seed)
        m, l, p, alpha = online_softmax_update_torch(m, l, s)
        if keep is not None:
            p = p * keep
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vg[:, :, :, j0:j1])
    if dropout_p > 0:
        acc = acc / (1.0 - dropout_p)
    o = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    Hq = Hkv * G
    # None as from the kernels' launcher, so a path that drops lse behaves alike on both.
    lse = lse_of_torch(m, l).reshape(B, Hq, Nq) if need_lse else None
    return o.reshape(B, Hq, Nq, Dv).to(q.dtype), lse


def _cpu_backward(do, q, k, v, o, lse, dlse, *, scale, causal, causal_offset, mask, dropout_p, seed):
    w = _work_dtype(q)
    qg, kg, vg = _grouped(q.to(w), k.to(w), v.to(w))
    B, Hkv, G, Nq, D = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    dog = do.to(w).reshape(B, Hkv, G, Nq, Dv)
    delta = (dog * o.to(w).reshape(B, Hkv, G, Nq, Dv)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.reshape(B, Hkv, G, Nq)
    lse_g = lse.reshape(B, Hkv, G, Nq)
    lse_g = torch.where(lse_g == float("-inf"), torch.full_like(lse_g, float("inf")), lse_g)
    drop_scale = 1.0 / (1.0 - dropout_p)
    dq = torch.zeros_like(qg)
    dk = torch.zeros((B, Hkv, Nk, D), dtype=w)
    dv = torch.zeros((B, Hkv, Nk, Dv), dtype=w)
    for j0 in range(0, Nk, _CPU_CHUNK):
        j1 = min(Nk, j0 + _CPU_CHUNK)
        s, keep = _chunk_scores(qg, kg, j0, j1, scale, causal, causal_offset, mask, dropout_p, seed)
        p = torch.exp(s - lse_g.unsqueeze(-1))
        dp = torch.matmul(dog, vg[:, :, :, j0:j1].transpose(-1, -2))
        p_used = p
        if keep is not None:
            p_used = p * keep * drop_scale
            dp = dp * keep * drop_scale
        dv[:, :, j0:j1] = torch.matmul(p_used.transpose(-1, -2), dog).sum(2)
        ds = p * (dp - delta.unsqueeze(-1))
        dq += torch.matmul(ds, kg[:, :, :, j0:j1]) * scale
        dk[:, :, j0:j1] = torch.matmul(ds.transpose(-1, -2), qg).sum(2) * scale
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
