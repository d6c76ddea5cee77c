"""Attention's CPU twin: the kernels' tiled algorithm in PyTorch, for CPU tensors when the Triton
interpreter is off (and float64, for ``gradcheck``).

Same arguments and results as ``attention_forward`` / ``attention_backward``: keys are taken
``CPU_CHUNK`` at a time with the online (m, ℓ) update, so memory stays O(N·chunk) as in the
kernels; ranges and varlen batches run one sequence at a time.
"""
from __future__ import annotations

import torch

from ..dropout import keep_threshold, philox_randint_torch
from ..merge import lse_of_torch, online_softmax_update_torch
from .attention_bwd import sinks_grad
from .attention_fwd import PLAIN, SEQ_DENSE, SEQ_RANGES, Variant, causal_window

CPU_CHUNK = 512


def work_dtype(q: torch.Tensor) -> torch.dtype:
    """float32 arithmetic (and lse), float64 for float64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _grouped(q, k, v):
    """Views with the GQA group as its own dim: q (B, Hkv, G, Nq, D), k/v (B, Hkv, 1, Nk, ·)."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    return q.reshape(B, Hkv, Hq // Hkv, Nq, D), k.unsqueeze(2), v.unsqueeze(2)


def _chunk_scores(qg, kg, j0, j1, scale, offset, mask, dropout_p, seed, variant, slopes):
    """Scores for key chunk [j0, j1) with every option applied, the dropout keep-mask (or None),
    and d(softcapped)/d(scaled) = 1 − tanh² (or None)."""
    B, Hkv, G, Nq, _ = qg.shape
    Nk = kg.shape[3]
    s = torch.matmul(qg, kg[:, :, :, j0:j1].transpose(-1, -2)) * scale
    dcap = None
    if variant.softcap > 0:
        t = torch.tanh(s / variant.softcap)
        s, dcap = t * variant.softcap, 1.0 - t * t
    if slopes is not None:  # (B, Hkv, G, 1, 1)
        i = torch.arange(Nq)[:, None] + offset  # integers first: exact at any length
        j = torch.arange(j0, j1)[None, :]
        s = s - slopes * (i - j).abs().to(s.dtype)
    if mask is not None:
        m = mask[..., j0:j1].reshape(B, Hkv, G, Nq, j1 - j0)
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(s.dtype)
    if variant.left >= 0 or variant.right >= 0:  # only this chunk's columns: O(Nq·chunk) memory
        i = torch.arange(Nq)[:, None] + offset
        j = torch.arange(j0, j1)[None, :]
        visible = torch.ones(Nq, j1 - j0, dtype=torch.bool)
        if variant.left >= 0:
            visible &= j >= i - variant.left
        if variant.right >= 0:
            visible &= j <= i + variant.right
        s = s.masked_fill(~visible, float("-inf"))
    keep = None
    if dropout_p > 0:
        rows = torch.arange(B * Hkv * G * Nq, dtype=torch.int64).view(B, Hkv, G, Nq, 1)
        offsets = rows * Nk + torch.arange(j0, j1, dtype=torch.int64)
        keep = (philox_randint_torch(seed, offsets) & 0x7FFFFFFF) >= keep_threshold(dropout_p)
    return s, keep, dcap


def _slopes(variant, B, Hkv, G, w):
    if variant.alibi is None:
        return None
    a = variant.alibi.to(w)
    a = a.expand(B, -1) if a.dim() == 1 else a
    return a.reshape(B, Hkv, G, 1, 1)


def _sequences(variant: Variant, q, k):
    """(batch row, q rows, k rows) slices of each sequence of a ranges or varlen call, its bounds
    clamped into the tensors as the kernels clamp them (``attention_fwd.seq_bounds``)."""
    sq, sk = variant.seq_q.tolist(), variant.seq_k.tolist()

    def rows(first, end, total):
        first = min(max(first, 0), total)
        return slice(first, min(max(end, first), total))
    nq, nk = q.shape[2], k.shape[2]
    if variant.seq == SEQ_RANGES:
        return [(b, rows(*sq[b], nq), rows(*sk[b], nk)) for b in range(len(sq))]
    return [(0, rows(sq[b], sq[b + 1], nq), rows(sk[b], sk[b + 1], nk)) for b in range(len(sq) - 1)]


def _one_sequence(variant: Variant, index: int, b: int) -> Variant:
    """The dense variant of sequence ``index`` (its ALiBi row when slopes are per sequence)."""
    alibi = variant.alibi
    if alibi is not None and alibi.dim() == 2:
        alibi = alibi[index:index + 1]
    return variant._replace(seq=SEQ_DENSE, seq_q=None, seq_k=None, alibi=alibi)


def cpu_forward(q, k, v, *, scale, causal, causal_offset, mask, dropout_p, seed, need_lse=True,
                variant: Variant = PLAIN):
    variant = causal_window(variant, causal)
    if variant.seq != SEQ_DENSE:
        return _per_sequence_forward(q, k, v, scale, variant, need_lse)
    w = work_dtype(q)
    qg, kg, vg = _grouped(q.to(w), k.to(w), v.to(w))
    B, Hkv, G, Nq, _ = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    slopes = _slopes(variant, B, Hkv, G, w)
    m = torch.full((B, Hkv, G, Nq), float("-inf"), dtype=w)
    l = torch.zeros_like(m)
    acc = torch.zeros((B, Hkv, G, Nq, Dv), dtype=w)
    for j0 in range(0, Nk, CPU_CHUNK):
        j1 = min(Nk, j0 + CPU_CHUNK)
        s, keep, _ = _chunk_scores(qg, kg, j0, j1, scale, causal_offset, mask, dropout_p, seed, variant, slopes)
        m, l, p, alpha = online_softmax_update_torch(m, l, s)
        if keep is not None:
            p = p * keep
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vg[:, :, :, j0:j1])
    if variant.sinks is not None:  # a value-less term exp(sink) in each row's denominator
        sink = variant.sinks.to(w).view(1, Hkv, G, 1).expand_as(m)
        m_new = torch.maximum(m, sink)
        m_ref = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_ref)
        l = l * alpha + torch.exp(sink - m_ref)
        acc, m = acc * alpha.unsqueeze(-1), m_new
    if dropout_p > 0:
        acc = acc / (1.0 - dropout_p)
    o = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    Hq = Hkv * G
    # None as from the kernels' launcher, so a path that drops lse behaves alike on both.
    lse = lse_of_torch(m, l).reshape(B, Hq, Nq) if need_lse else None
    return o.reshape(B, Hq, Nq, Dv).to(q.dtype), lse


def _per_sequence_forward(q, k, v, scale, variant, need_lse):
    B, Hq, Nq, _ = q.shape
    o = torch.zeros((B, Hq, Nq, v.shape[3]), dtype=q.dtype)
    lse = torch.full((B, Hq, Nq), float("-inf"), dtype=work_dtype(q))
    for index, (b, rq, rk) in enumerate(_sequences(variant, q, k)):
        if rq.stop <= rq.start:
            continue
        qs, ks, vs = q[b:b + 1, :, rq], k[b:b + 1, :, rk], v[b:b + 1, :, rk]
        if ks.shape[2] == 0:  # no key: o = 0, lse = the sink or −inf
            if variant.sinks is not None:
                lse[b, :, rq] = variant.sinks.to(lse.dtype)[:, None]
            continue
        o_s, lse_s = cpu_forward(qs, ks, vs, scale=scale, causal=False, causal_offset=ks.shape[2] - qs.shape[2],
                                 mask=None, dropout_p=0.0, seed=0, variant=_one_sequence(variant, index, b))
        o[b:b + 1, :, rq] = o_s
        lse[b:b + 1, :, rq] = lse_s
    return o, (lse if need_lse else None)


def cpu_backward(do, q, k, v, o, lse, dlse, *, scale, causal, causal_offset, mask, dropout_p, seed,
                 variant: Variant = PLAIN):
    """(dq, dk, dv, dsinks) as from ``attention_backward``."""
    variant = causal_window(variant, causal)
    if variant.seq != SEQ_DENSE:
        return _per_sequence_backward(do, q, k, v, o, lse, dlse, scale, variant)
    w = work_dtype(q)
    qg, kg, vg = _grouped(q.to(w), k.to(w), v.to(w))
    B, Hkv, G, Nq, D = qg.shape
    Nk, Dv = k.shape[2], v.shape[3]
    slopes = _slopes(variant, B, Hkv, G, w)
    dog = do.to(w).reshape(B, Hkv, G, Nq, Dv)
    delta = (dog * o.to(w).reshape(B, Hkv, G, Nq, Dv)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(w).reshape(B, Hkv, G, Nq)
    lse_g = lse.to(w).reshape(B, Hkv, G, Nq)
    lse_g = torch.where(lse_g == float("-inf"), torch.full_like(lse_g, float("inf")), lse_g)
    drop_scale = 1.0 / (1.0 - dropout_p)
    dq = torch.zeros_like(qg)
    dk = torch.zeros((B, Hkv, Nk, D), dtype=w)
    dv = torch.zeros((B, Hkv, Nk, Dv), dtype=w)
    for j0 in range(0, Nk, CPU_CHUNK):
        j1 = min(Nk, j0 + CPU_CHUNK)
        s, keep, dcap = _chunk_scores(qg, kg, j0, j1, scale, causal_offset, mask, dropout_p, seed, variant, slopes)
        p = torch.exp(s - lse_g.unsqueeze(-1))
        dp = torch.matmul(dog, vg[:, :, :, j0:j1].transpose(-1, -2))
        p_used = p
        if keep is not None:
            p_used = p * keep * drop_scale
            dp = dp * keep * drop_scale
        dv[:, :, j0:j1] = torch.matmul(p_used.transpose(-1, -2), dog).sum(2)
        ds = p * (dp - delta.unsqueeze(-1))
        if dcap is not None:
            ds = ds * dcap
        dq += torch.matmul(ds, kg[:, :, :, j0:j1]) * scale
        dk[:, :, j0:j1] = torch.matmul(ds.transpose(-1, -2), qg).sum(2) * scale
    dsinks = None
    if variant.sinks is not None:  # the kernels' reduction (rows with lse = ±inf give 0)
        dsinks = sinks_grad(variant.sinks, lse_g.reshape(B, Hkv * G, Nq), delta.reshape(B, Hkv * G, Nq))
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks


def _per_sequence_backward(do, q, k, v, o, lse, dlse, scale, variant):
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsinks = None if variant.sinks is None else torch.zeros_like(variant.sinks)
    for index, (b, rq, rk) in enumerate(_sequences(variant, q, k)):
        if rq.stop <= rq.start:
            continue
        if rk.stop <= rk.start:  # rows with no key: o = 0 and lse = the sink, which still gets dlse
            if dsinks is not None and dlse is not None:
                dsinks += dlse[b, :, rq].sum(-1).to(dsinks.dtype)
            continue
        qs, ks, vs = q[b:b + 1, :, rq], k[b:b + 1, :, rk], v[b:b + 1, :, rk]
        grads = cpu_backward(do[b:b + 1, :, rq], qs, ks, vs, o[b:b + 1, :, rq], lse[b:b + 1, :, rq],
                             None if dlse is None else dlse[b:b + 1, :, rq], scale=scale, causal=False,
                             causal_offset=ks.shape[2] - qs.shape[2], mask=None, dropout_p=0.0, seed=0,
                             variant=_one_sequence(variant, index, b))
        dq[b:b + 1, :, rq], dk[b:b + 1, :, rk], dv[b:b + 1, :, rk] = grads[:3]
        if dsinks is not None:
            dsinks += grads[3]
    return dq, dk, dv, dsinks
