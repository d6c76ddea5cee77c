"""Exact attention: validation, autograd, the CPU twin, and the public function.

The life of a call: ``attention`` → ``attention_core`` (checks, defaults) → ``_AttentionFn`` →
``attention_forward`` / ``attention_backward`` (Triton, in ``attention_fwd.py`` /
``attention_bwd.py``) or ``_cpu_forward`` / ``_cpu_backward`` (the same algorithm in PyTorch, for
CPU tensors when the Triton interpreter is off).
"""
from __future__ import annotations

import torch

from .. import _checks
from .._runtime import runs_triton
from ..dropout import dropout_keep_torch
from ..merge import lse_of_torch, online_softmax_update_torch
from ..reference import causal_mask
from .attention_bwd import attention_backward
from .attention_fwd import attention_forward

_CPU_CHUNK = 512


def _validate(q, k, v, attn_mask, dropout_p):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=4)
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
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in _checks.FLOAT_DTYPES:
            raise TypeError(f"attn_mask must be bool or a float dtype, got {attn_mask.dtype}")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask must be on q's device ({q.device}), got {attn_mask.device}")
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise ValueError("attn_mask must not require grad: gradients with respect to the mask are not supported")
        try:
            attn_mask = attn_mask.expand(B, Hq, Nq, k.shape[2])
        except RuntimeError:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                             f"(B, Hq, Nq, Nk) = {(B, Hq, Nq, k.shape[2])}") from None
    return attn_mask


def attention_core(q, k, v, *, causal: bool = False, causal_offset: int | None = None, scale=None,
                   attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, return_lse: bool = False):
    """Everything the kernels can do, for wrappers to build on (``attention``, the SDPA drop-in).

    ``causal_offset``: key j is visible to query i iff j ≤ i + causal_offset; default Nk − Nq
    (bottom-right). ``attn_mask`` broadcastable to (B, Hq, Nq, Nk), bool or float; it is expanded
    as a stride-0 view, never copied. Dropout draws from torch's default CPU generator.
    """
    attn_mask = _validate(q, k, v, attn_mask, dropout_p)
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    offset = k.shape[2] - q.shape[2] if causal_offset is None else int(causal_offset)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if dropout_p > 0 else 0
    o, lse = _AttentionFn.apply(q, k, v, attn_mask, float(scale), causal, offset, float(dropout_p), seed)
    return (o, lse) if return_lse else o


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

    Returns:
        o (B, Hq, Nq, Dv) in the input dtype (and lse). A query row whose keys are all masked
        gives o = 0 and lse = −inf.

    Arithmetic is float32 (fp32 inputs use TF32 only where ``torch.backends.cuda.matmul.allow_tf32``
    allows it). The backward is deterministic: the same inputs give bit-identical gradients.
    CUDA tensors run Triton kernels; CPU tensors run the same tiled algorithm in PyTorch (or the
    Triton kernels in the interpreter when ``TRITON_INTERPRET=1``).
    """
    return attention_core(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal, offset, dropout_p, seed):
        fwd = attention_forward if runs_triton(q) else _cpu_forward
        o, lse = fwd(q, k, v, scale=scale, causal=causal, causal_offset=offset, mask=mask,
                     dropout_p=dropout_p, seed=seed)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.args = (scale, causal, offset, dropout_p, seed)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, mask = ctx.saved_tensors
        scale, causal, offset, dropout_p, seed = ctx.args
        bwd = attention_backward if runs_triton(q) else _cpu_backward
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = bwd(do, q, k, v, o, lse, dlse, scale=scale, causal=causal, causal_offset=offset,
                         mask=mask, dropout_p=dropout_p, seed=seed)
        return dq, dk, dv, None, None, None, None, None, None


# ------------------------------------------------------------------ CPU twin (PyTorch, tiled)

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
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
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


def _cpu_forward(q, k, v, *, scale, causal, causal_offset, mask, dropout_p, seed):
    qg, kg, vg = _grouped(q.float(), k.float(), v.float())
    B, Hkv, G, Nq, _ = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    m = torch.full((B, Hkv, G, Nq), float("-inf"))
    l = torch.zeros_like(m)
    acc = torch.zeros((B, Hkv, G, Nq, Dv))
    for j0 in range(0, Nk, _CPU_CHUNK):
        j1 = min(Nk, j0 + _CPU_CHUNK)
        s, keep = _chunk_scores(qg, kg, j0, j1, scale, causal, causal_offset, mask, dropout_p, seed)
        m, l, p, alpha = online_softmax_update_torch(m, l, s)
        if keep is not None:
            p = p * keep
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vg[:, :, :, j0:j1])
    if dropout_p > 0:
        acc = acc / (1.0 - dropout_p)
    lse = lse_of_torch(m, l)
    o = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    Hq = Hkv * G
    return o.reshape(B, Hq, Nq, Dv).to(q.dtype), lse.reshape(B, Hq, Nq)


def _cpu_backward(do, q, k, v, o, lse, dlse, *, scale, causal, causal_offset, mask, dropout_p, seed):
    qg, kg, vg = _grouped(q.float(), k.float(), v.float())
    B, Hkv, G, Nq, D = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    dog = do.float().reshape(B, Hkv, G, Nq, Dv)
    delta = (dog * o.float().reshape(B, Hkv, G, Nq, Dv)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.reshape(B, Hkv, G, Nq)
    lse_g = lse.reshape(B, Hkv, G, Nq)
    lse_g = torch.where(lse_g == float("-inf"), torch.full_like(lse_g, float("inf")), lse_g)
    drop_scale = 1.0 / (1.0 - dropout_p)
    dq = torch.zeros_like(qg)
    dk = torch.zeros((B, Hkv, Nk, D))
    dv = torch.zeros((B, Hkv, Nk, Dv))
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
