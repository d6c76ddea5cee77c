"""Plain-PyTorch references: the executable version of the math, used by tests and docs.

Nothing here is fast. Everything here is obviously right, computed in float64 where it matters.
"""
from __future__ import annotations


import torch

from .merge import lse_of_torch, merge_ml_torch, online_softmax_update_torch


# ------------------------------------------------------------------ softmax, three ways

def naive_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / Σ exp(x): overflows for large x. Shown for contrast."""
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def safe_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Subtract the row max first (two passes over the row, then a third to normalise)."""
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    return e / e.sum(dim, keepdim=True)


def online_softmax_stats(x: torch.Tensor, dim: int = -1, chunk: int = 1):
    """One pass over the row carrying (m, ℓ), ``chunk`` elements at a time (1 = element-wise).

    Returns (m, ℓ) with the reduced dim removed. Chunks are folded with the same update rule the
    kernels use; two chunk states could equally be combined with ``merge_ml_torch``.
    """
    x = x.movedim(dim, -1)
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], chunk):
        m, l, _, _ = online_softmax_update_torch(m, l, x[..., start:start + chunk])
    return m, l


def online_softmax(x: torch.Tensor, dim: int = -1, chunk: int = 1) -> torch.Tensor:
    """Softmax from the online (m, ℓ) pass, then one normalising pass."""
    m, l = online_softmax_stats(x, dim, chunk)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.exp(x - m.unsqueeze(dim)) / l.unsqueeze(dim)


def split_logsumexp(x: torch.Tensor, splits: int, dim: int = -1) -> torch.Tensor:
    """logsumexp by splitting the row into ``splits`` parts and merging their (m, ℓ) states."""
    x = x.movedim(dim, -1)
    states = [online_softmax_stats(part, -1, chunk=max(1, part.shape[-1]))
              for part in x.tensor_split(splits, dim=-1)]
    m, l = states[0]
    for m_b, l_b in states[1:]:
        m, l = merge_ml_torch(m, l, m_b, l_b)
    return lse_of_torch(m, l)


# ------------------------------------------------------------------ attention

def causal_mask(nq: int, nk: int, offset: int, device=None) -> torch.Tensor:
    """Bool (nq, nk), True where key j is visible to query i: j ≤ i + offset.

    offset = nk − nq is bottom-right alignment (FlashAttention, KV-cache prefill); offset = 0 is
    top-left alignment (torch's ``is_causal``).
    """
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + offset


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        causal_offset: int | None = None, attn_mask: torch.Tensor | None = None,
                        dropout_keep: torch.Tensor | None = None, dropout_p: float = 0.0,
                        dtype=torch.float64):
    """Exact attention, materialising the scores, in ``dtype`` (float64 by default).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hq a multiple of Hkv (query head h
    reads key head h // (Hq/Hkv)). ``causal_offset`` defaults to Nk − Nq (bottom-right).
    ``attn_mask`` broadcastable to (B, Hq, Nq, Nk): bool (True = take part) or float (added to the
    scaled scores). ``dropout_keep`` bool (B, Hq, Nq, Nk): kept probabilities are divided by
    1 − dropout_p; the lse is that of the probabilities before dropout.

    Returns (o, lse): o (B, Hq, Nq, Dv), lse (B, Hq, Nq) natural log. A query row with every key
    masked gives o = 0 and lse = −inf.
    """
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    nq, nk = s.shape[-2:]
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(dtype)
    if causal:
        offset = nk - nq if causal_offset is None else causal_offset
        s = s.masked_fill(~causal_mask(nq, nk, offset, s.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lse_ref = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - lse_ref.unsqueeze(-1))
    if dropout_keep is not None:
        p = torch.where(dropout_keep, p / (1.0 - dropout_p), torch.zeros_like(p))
    o = torch.einsum("bhij,bhjd->bhid", p, v)
    return o, lse


def dtype_eps(dtype: torch.dtype) -> float:
    return {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]


__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "online_softmax_stats", "split_logsumexp",
           "causal_mask", "attention_reference", "dtype_eps"]
