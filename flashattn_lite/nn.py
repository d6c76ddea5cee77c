"""Attention modules on flashattn_lite's kernel.

``FlashAttention`` is the bare op as a module (no parameters); ``MultiheadAttention`` adds the
projections, grouped-query heads and an optional rotary embedding, (B, N, E) in and out.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from . import _checks
from .ops.attention import attention_core

__all__ = ["FlashAttention", "MultiheadAttention", "RotaryEmbedding"]


def _check_real(name: str, value) -> float:
    """An int or float (not a bool, nor a tensor: the kernels take the setting as a Python number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _check_dropout(dropout) -> float:
    dropout = _check_real("dropout", dropout)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return dropout


def _check_base(name: str, base) -> float:
    """A rotary base: 0, a negative or a non-finite base gives NaN or constant angles."""
    base = _check_real(name, base)
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"{name} must be a finite float > 0, got {base}")
    return base


class FlashAttention(nn.Module):
    """softmax(q·kᵀ·scale + mask)·v with our kernel; dropout only while ``self.training``.

    Args:
        causal: query i sees key j iff j ≤ i + (S − L): bottom-right aligned, which is what a KV
            cache needs (the new queries are the last L of S positions); equal to torch's
            top-left ``is_causal`` when L = S. Can be combined with ``attn_mask``.
        scale: multiplies q·k; default 1/√D.
        dropout: probability of dropping an attention weight during training.

    Forward: q (B, Hq, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) with Hq a multiple of Hkv
    (GQA); any strides with a unit last stride, so (B, N, H, D) tensors pass as
    ``.transpose(1, 2)`` without a copy. ``attn_mask`` bool (True = take part) or float (added),
    broadcastable to (B, Hq, L, S). Returns (B, Hq, L, Dv); fully masked rows are zeros.

    >>> import torch
    >>> from flashattn_lite.nn import FlashAttention
    >>> attn = FlashAttention(causal=True)
    >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    >>> attn(q, k, v).shape              # 3 new queries are the last 3 of 6 positions
    torch.Size([1, 4, 3, 8])
    """

    def __init__(self, causal: bool = False, scale: Optional[float] = None, dropout: float = 0.0):
        super().__init__()
        # Checked here, not at the first forward: a bad setting fails where it was written.
        _checks.check_bool("causal", causal)
        scale = _checks.check_scale(scale)
        dropout = _check_dropout(dropout)
        self.causal = causal
        self.scale = scale
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return attention_core(q, k, v, causal=self.causal, scale=self.scale, attn_mask=attn_mask,
                              dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, scale={self.scale}, dropout={self.dropout}"


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE), "rotate half" convention (GPT-NeoX, Llama): the pair
    (x[i], x[i + D/2]) of each head is rotated by position · base^(−2i/D).

    The frequencies are computed at the first eager call on each device and precision (float32;
    float64 for a float64 ``x``; at every call inside a compiled graph) and kept in a plain dict,
    not in a buffer: a buffer would be cast to 16 bits by ``module.half()`` (angles off by radians at
    long positions) and left uninitialised by meta-device construction (``to_empty``), as it is not
    in the state dict. ``device`` is accepted for the ``nn.Module`` convention; nothing is allocated."""

    def __init__(self, head_dim: int, base: float = 10000.0, device=None):
        super().__init__()
        # forward rotates the pairs (x[i], x[i + D/2]): D must split into two halves.
        if _checks.check_positive_int("head_dim", head_dim) % 2:
            raise ValueError(f"head_dim must be even (rotary embedding rotates pairs), got {head_dim}")
        base = _check_base("base", base)
        self._inv_freq: dict = {}  # {(device, dtype): frequencies}, made at the first call there
        self.head_dim = head_dim
        self.base = base

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, N, H, D), positions (N,) or (B, N) integer; returns x rotated, in x's dtype."""
        _checks.check_tensor("x", x, ndim=4, dtypes=None)
        _checks.check_dim("x", "last dim", x.shape[-1], self.head_dim, "head_dim")
        B, N = x.shape[:2]
        _checks.check_tensor("positions", positions, ndim=(1, 2), dtypes=None)
        # Broadcasting would take a length-1 positions for any N: every token at one position.
        if tuple(positions.shape) not in ((N,), (B, N), (1, N)):
            raise ValueError(f"positions must have shape (N,) = ({N},) or (B, N) = ({B}, {N}) for x of shape "
                             f"{tuple(x.shape)}, got {tuple(positions.shape)}")
        _checks.check_same(("x", "positions"), (x, positions), "device")
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        # Kept once per device and precision in eager calls only: a compiled graph's output may live
        # in a CUDA graph's memory (mode="reduce-overhead"), which its next replay overwrites.
        compiling = torch.compiler.is_compiling()
        inv_freq = None if compiling else self._inv_freq.get((x.device, dtype))
        if inv_freq is None:
            inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, device=x.device, dtype=dtype) / self.head_dim)
            if not compiling:
                self._inv_freq[x.device, dtype] = inv_freq
        angles = positions.to(dtype)[..., None] * inv_freq  # (…, N, D/2)
        cos, sin = angles.cos(), angles.sin()
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B|1, N, 1, D/2)
        x1, x2 = x.to(dtype).chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"


class MultiheadAttention(nn.Module):
    """Multi-head attention with grouped-query heads: (B, L, E) in, (B, L, E) out.

    Args:
        embed_dim: E, the model width.
        num_heads: query heads Hq.
        num_kv_heads: key/value heads Hkv (a divisor of Hq; default Hq; 1 = multi-query).
        head_dim: D (default E // Hq).
        bias: biases in the q/k/v and output projections.
        dropout: attention-weight dropout probability, applied only while ``self.training``.
        causal: causal self-attention (bottom-right aligned when L ≠ S, see ``FlashAttention``).
        fused_qkv: one (E → (Hq + 2·Hkv)·D) projection instead of three; with a separate
            ``context`` (cross-attention) its weight is split into the q part and the k/v part.
        rotary: apply rotary position embeddings to q and k (``rotary_base`` sets the base).
        scale: multiplies q·k; default 1/√D.

    Forward: ``x`` (B, L, E); ``context`` (B, S, E) for cross-attention (default: ``x``);
    ``attn_mask`` bool (True = take part: SDPA's convention, the opposite of
    ``torch.nn.MultiheadAttention``'s, where True blocks) or float, broadcastable to (B, Hq, L, S),
    e.g. a (B, 1, 1, S) key-padding mask; ``positions`` (L,) or (B, L) for the rotary embedding (default
    0 … L − 1; with a context, keys take positions 0 … S − 1).

    >>> import torch
    >>> from flashattn_lite.nn import MultiheadAttention
    >>> mha = MultiheadAttention(32, num_heads=4, num_kv_heads=2, causal=True, rotary=True)
    >>> mha(torch.randn(2, 5, 32)).shape
    torch.Size([2, 5, 32])
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: Optional[int] = None, *,
                 head_dim: Optional[int] = None, bias: bool = True, dropout: float = 0.0, causal: bool = False,
                 fused_qkv: bool = True, rotary: bool = False, rotary_base: float = 10000.0,
                 scale: Optional[float] = None, device=None, dtype=None):
        super().__init__()
        for name, flag in (("bias", bias), ("fused_qkv", fused_qkv), ("rotary", rotary)):
            _checks.check_bool(name, flag)
        attn = FlashAttention(causal=causal, scale=scale, dropout=dropout)  # checks those before any allocation
        rotary_base = _check_base("rotary_base", rotary_base)
        _checks.check_positive_int("embed_dim", embed_dim)
        _checks.check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _checks.check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}), "
                                 "or pass head_dim")
            head_dim = embed_dim // num_heads
            if head_dim > 256:
                raise ValueError(f"head_dim (embed_dim // num_heads = {head_dim}) must be at most 256, the kernel's "
                                 "limit: pass head_dim or more heads")
        elif _checks.check_positive_int("head_dim", head_dim) > 256:
            raise ValueError(f"head_dim must be at most 256, the kernel's limit, got {head_dim}")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.fused_qkv = fused_qkv
        kw = dict(bias=bias, device=device, dtype=dtype)
        q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
        if fused_qkv:
            self.qkv_proj = nn.Linear(embed_dim, q_dim + 2 * kv_dim, **kw)
        else:
            self.q_proj = nn.Linear(embed_dim, q_dim, **kw)
            self.k_proj = nn.Linear(embed_dim, kv_dim, **kw)
            self.v_proj = nn.Linear(embed_dim, kv_dim, **kw)
        self.out_proj = nn.Linear(q_dim, embed_dim, **kw)
        self.attn = attn
        self.rotary = RotaryEmbedding(head_dim, rotary_base, device=device) if rotary else None

    def _project(self, x: torch.Tensor, context: Optional[torch.Tensor]):
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        if not self.fused_qkv:
            src = x if context is None else context
            return self.q_proj(x), self.k_proj(src), self.v_proj(src)
        if context is None:
            return self.qkv_proj(x).split([q_dim, kv_dim, kv_dim], dim=-1)
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        q = nn.functional.linear(x, w[:q_dim], None if b is None else b[:q_dim])
        kv = nn.functional.linear(context, w[q_dim:], None if b is None else b[q_dim:])
        return (q, *kv.split([kv_dim, kv_dim], dim=-1))

    def _check_inputs(self, x, context, positions) -> None:
        """Before the projections, whose errors (matmul shapes, unpacking, broadcasting in the rotary
        embedding) name none of forward's arguments."""
        _checks.check_tensor("x", x, ndim=3, dtypes=None)
        _checks.check_dim("x", "last dim", x.shape[-1], self.embed_dim, "embed_dim")
        B, L = x.shape[:2]
        if context is not None:
            _checks.check_tensor("context", context, ndim=3, dtypes=None)
            _checks.check_dim("context", "batch size", context.shape[0], B, "x's")
            _checks.check_dim("context", "last dim", context.shape[-1], self.embed_dim, "embed_dim")
            _checks.check_same(("x", "context"), (x, context), "device")
        if positions is not None:
            if self.rotary is None:  # only the rotary embedding reads positions
                raise ValueError("positions needs a module built with rotary=True (it has no rotary embedding)")
            _checks.check_tensor("positions", positions, ndim=(1, 2), dtypes=None)
            if tuple(positions.shape) not in ((L,), (B, L), (1, L)):
                raise ValueError(f"positions must have shape (L,) = ({L},) or (B, L) = ({B}, {L}), "
                                 f"got {tuple(positions.shape)}")
            _checks.check_same(("x", "positions"), (x, positions), "device")

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._check_inputs(x, context, positions)
        B, L, _ = x.shape
        S = L if context is None else context.shape[1]
        q, k, v = self._project(x, context)
        q = q.view(B, L, self.num_heads, self.head_dim)
        k = k.view(B, S, self.num_kv_heads, self.head_dim)
        v = v.view(B, S, self.num_kv_heads, self.head_dim)
        if self.rotary is not None:
            q_pos = torch.arange(L, device=x.device) if positions is None else positions
            k_pos = q_pos if context is None else torch.arange(S, device=x.device)
            q, k = self.rotary(q, q_pos), self.rotary(k, k_pos)
        # (B, N, H, D) → (B, H, N, D) views: the kernel reads them in place.
        o = self.attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, fused_qkv={self.fused_qkv}")
