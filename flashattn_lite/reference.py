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
    """logsumexp by splitting the row into ``splits`` parts and merging their (m, ℓ) states.

    >>> import torch
    >>> x = torch.randn(3, 1000, dtype=torch.float64)
    >>> torch.allclose(split_logsumexp(x, splits=7), torch.logsumexp(x, -1))
    True
    """
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


def window_mask(nq: int, nk: int, offset: int, left: int | None, right: int | None, device=None) -> torch.Tensor:
    """Bool (nq, nk), True where key j is visible to query i: i + offset − left ≤ j ≤ i + offset + right
    (a side that is None is unbounded). ``causal_mask`` is the window (None, 0)."""
    i = torch.arange(nq, device=device)[:, None] + offset
    j = torch.arange(nk, device=device)[None, :]
    visible = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if left is not None:
        visible &= j >= i - left
    if right is not None:
        visible &= j <= i + right
    return visible


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        causal_offset: int | None = None, attn_mask: torch.Tensor | None = None,
                        dropout_keep: torch.Tensor | None = None, dropout_p: float = 0.0,
                        window: tuple | None = None, softcap: float | None = None,
                        sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                        dtype=torch.float64):
    """Exact attention, materialising the scores, in ``dtype`` (float64 by default). A 16-bit
    ``dtype`` is computed as a fused kernel computes it: float32 arithmetic from inputs in that
    dtype, o and lse rounded to it (a reference in 16-bit arithmetic is far less accurate than any
    kernel, so as the tests' bar for "as good as torch in this dtype" it would hide real errors).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hq a multiple of Hkv (query head h
    reads key head h // (Hq/Hkv)). ``causal_offset`` (default Nk − Nq, bottom-right) places the
    diagonal that causal and window masks are measured from. The scores, in this order:

    1. s = scale·q·k;
    2. ``softcap`` c: s ← c·tanh(s / c);
    3. ``alibi_slopes`` (Hq,) or (B, Hq): s ← s − slope·|i + offset − j|;
    4. ``attn_mask`` broadcastable to (B, Hq, Nq, Nk): bool (True = take part) or float (added);
    5. ``window`` (left, right): key j visible iff i + offset − left ≤ j ≤ i + offset + right, a
       side that is None (or −1) unbounded; ``causal`` caps right at 0.

    ``sinks`` (Hq,): one extra term exp(sink_h) in each row's softmax denominator, with no value.
    ``dropout_keep`` bool (B, Hq, Nq, Nk): kept probabilities are divided by 1 − dropout_p; the lse
    is that of the probabilities before dropout.

    Returns (o, lse): o (B, Hq, Nq, Dv), lse (B, Hq, Nq) natural log, including the sink term. A
    query row with every key masked gives o = 0 and lse = −inf (the sink, with sinks).
    """
    if dtype in (torch.float16, torch.bfloat16):
        o, lse = attention_reference(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal, scale=scale,
                                     causal_offset=causal_offset, attn_mask=attn_mask, dropout_keep=dropout_keep,
                                     dropout_p=dropout_p, window=window, softcap=softcap, sinks=sinks,
                                     alibi_slopes=alibi_slopes, dtype=torch.float32)
        return o.to(dtype), lse.to(dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    nq, nk = s.shape[-2:]
    offset = nk - nq if causal_offset is None else causal_offset
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype)
        slopes = slopes.view(1, -1, 1, 1) if slopes.dim() == 1 else slopes.view(slopes.shape[0], -1, 1, 1)
        # distances as integers first: bf16 holds every integer only up to 256 (fp16 2048)
        i = torch.arange(nq, device=s.device)[:, None] + offset
        j = torch.arange(nk, device=s.device)[None, :]
        s = s - slopes * (i - j).abs().to(dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(dtype)
    left, right = ((None if w is None or w < 0 else w) for w in window) if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is not None or right is not None:
        s = s.masked_fill(~window_mask(nq, nk, offset, left, right, s.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.to(dtype).view(1, -1, 1).expand_as(lse))
    lse_ref = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - lse_ref.unsqueeze(-1))
    if dropout_keep is not None:
        p = torch.where(dropout_keep, p / (1.0 - dropout_p), torch.zeros_like(p))
    o = torch.einsum("bhij,bhjd->bhid", p, v)
    return o, lse


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, **options):
    """:func:`attention_reference` over a packed batch: q (total_q, Hq, D), k/v (total_k, Hkv, ·),
    sequence b holding rows [cu_seqlens[b], cu_seqlens[b+1]). Each sequence is attended alone,
    bottom-right aligned. Returns o (total_q, Hq, Dv) and lse (Hq, total_q). ``alibi_slopes`` of
    shape (B, Hq) give sequence b its row."""
    dtype = options.get("dtype", torch.float64)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    alibi = options.pop("alibi_slopes", None)
    os_, lses = [], []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
        kb = k[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        vb = v[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[b])
        if kb.shape[2] == 0:
            o = torch.zeros(1, q.shape[1], qb.shape[2], v.shape[2], dtype=dtype, device=q.device)
            lse = torch.full((1, q.shape[1], qb.shape[2]), float("-inf"), dtype=dtype, device=q.device)
            if options.get("sinks") is not None:
                lse = options["sinks"].to(dtype).view(1, -1, 1).expand_as(lse).clone()
        else:
            o, lse = attention_reference(qb, kb, vb, alibi_slopes=slopes, **options)
        os_.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(os_, 0), torch.cat(lses, 1)


def rel_err(a: torch.Tensor, ref: torch.Tensor, floor_rms: float = 1e-3) -> float:
    """‖a − ref‖ / ‖ref‖, with ‖ref‖ floored at an RMS of ``floor_rms`` so exact zeros (a softmax
    over one key has no gradient) are compared absolutely instead of dividing by nothing."""
    if isinstance(floor_rms, bool) or not isinstance(floor_rms, (int, float)) or not 0 < floor_rms < float("inf"):
        raise ValueError(f"rel_err: floor_rms must be a finite number > 0, got {floor_rms!r}")
    a, ref = a.double(), ref.double()
    floor = floor_rms * max(ref.numel(), 1) ** 0.5
    return ((a - ref).norm() / ref.norm().clamp_min(floor)).item()


def dtype_eps(dtype: torch.dtype) -> float:
    return {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]


__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "online_softmax_stats", "split_logsumexp",
           "causal_mask", "window_mask", "attention_reference",
           "attention_varlen_reference", "rel_err", "dtype_eps"]
