"""Attention backward (FlashAttention-2 scheme, deterministic): kernels and launcher.

The forward saved q, k, v, o and the lse. The backward recomputes the probabilities tile by tile
as P = exp2(S·scale·log2 e − lse₂) and never stores them:

1. ``_bwd_preprocess``: δ = rowsum(dO ∘ O) − dlse (the lse's own gradient folds in here), and
   lse₂ = lse·log2 e with −inf (fully masked rows) turned into +inf so those rows give P = 0.
2. ``_bwd_dkdv_kernel``: one program per key tile of one KV head; it loops over every query
   head of the GQA group and every query tile, accumulating dK and dV in registers.
3. ``_bwd_dq_kernel``: one program per query tile; loops over key tiles, accumulating dQ.

No atomics: each output element is written by exactly one program, so gradients are
bit-identical from run to run.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launcher import launcher
from .._runtime import cdiv, interpreter_active, next_pow2, tile_and_slab, tuned
from ..dropout import dropout_keep, keep_threshold
from ..merge import LOG2E
from .attention_fwd import (MASK_BOOL, _fits, head_base, key_range, length_bucket, load_tile, mask_kind,
                            mask_scores, precision_for, query_tile)


@launcher
@triton.jit
def _bwd_preprocess(o, do, lse, dlse, delta, lse2,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    n_heads, n_q, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                    HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr):
    tile, bh = tile_and_slab(tl.cdiv(n_q, BLOCK_M))
    b = bh // n_heads
    h = bh % n_heads
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    o_t = load_tile(head_base(o, b, h, stride_ob, stride_oh), offs_m[:, None], stride_om, n_q,
                    offs_d[None, :], stride_od, HEAD_DIM_V)
    do_t = load_tile(head_base(do, b, h, stride_dob, stride_doh), offs_m[:, None], stride_dom, n_q,
                     offs_d[None, :], stride_dod, HEAD_DIM_V)
    d = tl.sum(o_t.to(tl.float32) * do_t.to(tl.float32), 1)
    row = bh.to(tl.int64) * n_q + offs_m
    row_ok = offs_m < n_q
    if HAS_DLSE:
        d -= tl.load(dlse + row, mask=row_ok, other=0.0)
    tl.store(delta + row, d, mask=row_ok)
    l = tl.load(lse + row, mask=row_ok, other=0.0)
    tl.store(lse2 + row, tl.where(l == float("-inf"), float("inf"), l * 1.4426950408889634), mask=row_ok)


@triton.jit
def _scores_T(k_t, q_base, do_base, mask_base, lse2_row, start_m, offs_n, offs_m0, offs_d, offs_dv,
              n_q, n_k, causal_offset, qk_scale, stride_qm, stride_qd, stride_dom, stride_dod,
              stride_mask_m, stride_mask_n,
              BOUNDARY: tl.constexpr, MASK_KIND: tl.constexpr, HEAD_DIM: tl.constexpr,
              HEAD_DIM_V: tl.constexpr, PRECISION: tl.constexpr):
    """One query tile against this program's key tile: loads qᵀ and dO and recomputes the
    probabilities Pᵀ [BLOCK_N, BLOCK_M] from the saved lse (masks applied, no dropout yet)."""
    offs_m = start_m + offs_m0
    row_ok = offs_m < n_q
    q_t = load_tile(q_base, offs_m[None, :], stride_qm, n_q, offs_d[:, None], stride_qd, HEAD_DIM)
    do_t = load_tile(do_base, offs_m[:, None], stride_dom, n_q, offs_dv[None, :], stride_dod, HEAD_DIM_V)
    l2 = tl.load(lse2_row + offs_m, mask=row_ok, other=float("inf"))
    st = tl.dot(k_t, q_t, input_precision=PRECISION) * qk_scale
    st = mask_scores(st, offs_m[None, :], offs_n[:, None], mask_base, stride_mask_m, stride_mask_n, n_q, n_k,
                     causal_offset, BOUNDARY, True, MASK_KIND)
    pt = tl.math.exp2(st - l2[None, :])
    return q_t, do_t, pt, offs_m


@triton.jit
def _dkdv_tile(dk, dv, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row, start_m,
               offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
               stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
               seed, drop_base, drop_threshold, drop_scale,
               BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
               DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               PRECISION: tl.constexpr):
    q_t, do_t, pt, offs_m = _scores_T(
        k_t, q_base, do_base, mask_base, lse2_row, start_m, offs_n, offs_m0, offs_d, offs_dv,
        n_q, n_k, causal_offset, qk_scale, stride_qm, stride_qd, stride_dom, stride_dod,
        stride_mask_m, stride_mask_n, BOUNDARY, MASK_KIND, HEAD_DIM, HEAD_DIM_V, PRECISION)
    d = tl.load(delta_row + offs_m, mask=offs_m < n_q, other=0.0)
    dpt = tl.dot(v_t, tl.trans(do_t), input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, drop_base + offs_m[None, :].to(tl.int64) * n_k + offs_n[:, None], drop_threshold)
        dv = tl.dot(tl.where(keep, pt * drop_scale, 0.0).to(do_t.dtype), do_t, dv, input_precision=PRECISION)
        dpt = tl.where(keep, dpt * drop_scale, 0.0)
    else:
        dv = tl.dot(pt.to(do_t.dtype), do_t, dv, input_precision=PRECISION)
    dst = pt * (dpt - d[None, :])
    dk = tl.dot(dst.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
    return dk, dv


def _bwd_configs():
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in [(64, 128, 8, 2), (32, 128, 4, 2), (64, 128, 8, 3), (32, 64, 4, 3),
                                 (64, 64, 4, 2), (64, 64, 8, 3), (128, 128, 8, 2), (16, 64, 4, 2),
                                 (32, 32, 4, 1), (16, 32, 4, 1)]]


def _prune_bwd(configs, named_args):
    # dK/dV (or dQ) accumulators and the K/V (or Q/dO) tiles live in registers for the whole loop.
    d = next_pow2(named_args["HEAD_DIM"])
    dv = next_pow2(named_args["HEAD_DIM_V"])
    itemsize = named_args["q"].element_size()
    return [c for c in configs
            if _fits(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_M"], c.num_warps, c.num_stages, d, dv, itemsize)
            and (d + dv) * max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) / (c.num_warps * 32) <= 128]


_INTERP_CFG = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)
_BWD_KEY = ["HEAD_DIM", "HEAD_DIM_V", "IS_CAUSAL", "MASK_KIND", "DROPOUT", "GROUP", "n_bucket"]


@tuned(_bwd_configs(), key=_BWD_KEY, interpreter_config=_INTERP_CFG,
       prune=_prune_bwd)
@triton.jit
def _bwd_dkdv_kernel(q, k, v, do, dk, dv, lse2, delta, mask,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_dob, stride_doh, stride_dom, stride_dod,
                     stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                     stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                     n_heads, n_kv_heads, n_q, n_k, causal_offset, qk_scale, sm_scale,
                     seed, drop_threshold, drop_scale, n_bucket,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                     PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile, bh_kv = tile_and_slab(tl.cdiv(n_k, BLOCK_N))
    start_n = tile * BLOCK_N
    b = bh_kv // n_kv_heads
    h_kv = bh_kv % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < n_k
    k_t = load_tile(head_base(k, b, h_kv, stride_kb, stride_kh), offs_n[:, None], stride_kn, n_k,
                    offs_d[None, :], stride_kd, HEAD_DIM)
    v_t = load_tile(head_base(v, b, h_kv, stride_vb, stride_vh), offs_n[:, None], stride_vn, n_k,
                    offs_dv[None, :], stride_vd, HEAD_DIM_V)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # Query rows [lo, n_q) can see some key of this tile; rows from `mid` on see all of them.
    if IS_CAUSAL:
        lo = tl.maximum(start_n - causal_offset, 0)
        lo = tl.minimum((lo // BLOCK_M) * BLOCK_M, n_q)
        mid = tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, lo), n_q)
        mid = lo + tl.cdiv(mid - lo, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        mid = 0
    for g in range(GROUP):
        h = h_kv * GROUP + g
        bh = b * n_heads + h
        q_base = head_base(q, b, h, stride_qb, stride_qh)
        do_base = head_base(do, b, h, stride_dob, stride_doh)
        mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
        lse2_row = lse2 + bh.to(tl.int64) * n_q
        delta_row = delta + bh.to(tl.int64) * n_q
        drop_base = bh.to(tl.int64) * n_q * n_k
        for start_m in tl.range(lo, mid, BLOCK_M):
            dk_acc, dv_acc = _dkdv_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row, start_m,
                                offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
                                stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
                                seed, drop_base, drop_threshold, drop_scale,
                                True, IS_CAUSAL, MASK_KIND, DROPOUT, HEAD_DIM, HEAD_DIM_V, PRECISION)
        for start_m in tl.range(mid, n_q, BLOCK_M):
            dk_acc, dv_acc = _dkdv_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row, start_m,
                                offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
                                stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
                                seed, drop_base, drop_threshold, drop_scale,
                                False, IS_CAUSAL, MASK_KIND, DROPOUT, HEAD_DIM, HEAD_DIM_V, PRECISION)

    store_n = col_ok[:, None]
    tl.store(head_base(dk, b, h_kv, stride_dkb, stride_dkh)
             + offs_n[:, None].to(tl.int64) * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk_acc * sm_scale).to(dk.dtype.element_ty), mask=store_n & (offs_d[None, :] < HEAD_DIM))
    tl.store(head_base(dv, b, h_kv, stride_dvb, stride_dvh)
             + offs_n[:, None].to(tl.int64) * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv_acc.to(dv.dtype.element_ty), mask=store_n & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_tile(dq, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d, offs_dv,
             n_q, n_k, causal_offset, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
             stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
             BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
             DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
             PRECISION: tl.constexpr):
    cols = start_n + offs_n0
    k_t = load_tile(k_base, cols[:, None], stride_kn, n_k, offs_d[None, :], stride_kd, HEAD_DIM)
    v_t = load_tile(v_base, cols[None, :], stride_vn, n_k, offs_dv[:, None], stride_vd, HEAD_DIM_V)
    s = tl.dot(q_t, tl.trans(k_t), input_precision=PRECISION) * qk_scale
    s = mask_scores(s, offs_m[:, None], cols[None, :], mask_base, stride_mask_m, stride_mask_n, n_q, n_k,
                    causal_offset, BOUNDARY, IS_CAUSAL, MASK_KIND)
    p = tl.math.exp2(s - l2[:, None])
    dp = tl.dot(do_t, v_t, input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, drop_base + offs_m[:, None].to(tl.int64) * n_k + cols[None, :], drop_threshold)
        dp = tl.where(keep, dp * drop_scale, 0.0)
    ds = p * (dp - d[:, None])
    return tl.dot(ds.to(k_t.dtype), k_t, dq, input_precision=PRECISION)


@tuned(_bwd_configs(), key=_BWD_KEY, interpreter_config=_INTERP_CFG,
       prune=_prune_bwd)
@triton.jit
def _bwd_dq_kernel(q, k, v, do, dq, lse2, delta, mask,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                   stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                   n_heads, n_q, n_k, causal_offset, qk_scale, sm_scale,
                   seed, drop_threshold, drop_scale, n_bucket,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh, b, h, h_kv = query_tile(n_q, n_heads, GROUP, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < n_q
    q_t = load_tile(head_base(q, b, h, stride_qb, stride_qh), offs_m[:, None], stride_qm, n_q,
                    offs_d[None, :], stride_qd, HEAD_DIM)
    do_t = load_tile(head_base(do, b, h, stride_dob, stride_doh), offs_m[:, None], stride_dom, n_q,
                     offs_dv[None, :], stride_dod, HEAD_DIM_V)
    row = bh.to(tl.int64) * n_q + offs_m
    l2 = tl.load(lse2 + row, mask=row_ok, other=float("inf"))
    d = tl.load(delta + row, mask=row_ok, other=0.0)
    k_base = head_base(k, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v, b, h_kv, stride_vb, stride_vh)
    mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
    drop_base = bh.to(tl.int64) * n_q * n_k
    dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full, hi = key_range(start_m, n_k, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)
    for start_n in tl.range(0, full, BLOCK_N):
        dq_acc = _dq_tile(dq_acc, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d, offs_dv,
                      n_q, n_k, causal_offset, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                      stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
                      False, IS_CAUSAL, MASK_KIND, DROPOUT, HEAD_DIM, HEAD_DIM_V, PRECISION)
    for start_n in tl.range(full, hi, BLOCK_N):
        dq_acc = _dq_tile(dq_acc, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d, offs_dv,
                      n_q, n_k, causal_offset, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                      stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
                      True, IS_CAUSAL, MASK_KIND, DROPOUT, HEAD_DIM, HEAD_DIM_V, PRECISION)
    tl.store(head_base(dq, b, h, stride_dqb, stride_dqh)
             + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq_acc * sm_scale).to(dq.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


def attention_backward(do, q, k, v, o, lse, dlse, *, scale: float, causal: bool, causal_offset: int,
                       mask: torch.Tensor | None, dropout_p: float, seed: int):
    """Gradients (dq, dk, dv) in the inputs' dtypes; dk, dv summed over each GQA group."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if dlse is not None:
        dlse = dlse.float().contiguous()  # autograd hands over expanded (stride-0) grads, e.g. from lse.sum()
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    delta = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    lse2 = torch.empty_like(delta)
    block_dv = max(16, next_pow2(Dv))
    pre_m = 16 if interpreter_active() else 64
    _bwd_preprocess[(cdiv(Nq, pre_m) * B * Hq,)](
        o, do, lse, dlse if dlse is not None else lse, delta, lse2, *o.stride(), *do.stride(),
        Hq, Nq, HEAD_DIM_V=Dv, BLOCK_DV=block_dv, HAS_DLSE=dlse is not None, BLOCK_M=pre_m)

    kind = mask_kind(mask)
    mask_arg = (mask.view(torch.uint8) if kind == MASK_BOOL else mask) if mask is not None else q
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    common = dict(GROUP=Hq // Hkv, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=max(16, next_pow2(D)),
                  BLOCK_DV=block_dv, IS_CAUSAL=causal, MASK_KIND=kind, DROPOUT=dropout_p > 0.0,
                  PRECISION=precision_for(q.dtype))
    drop = (seed, keep_threshold(dropout_p), 1.0 / (1.0 - dropout_p) if dropout_p > 0 else 1.0)
    n_bucket = length_bucket(Nq, Nk)
    _bwd_dkdv_kernel[lambda meta: (cdiv(Nk, meta["BLOCK_N"]) * B * Hkv,)](
        q, k, v, do, dk, dv, lse2, delta, mask_arg,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), *mask_strides,
        Hq, Hkv, Nq, Nk, causal_offset, scale * LOG2E, scale, *drop, n_bucket, **common)
    _bwd_dq_kernel[lambda meta: (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,)](
        q, k, v, do, dq, lse2, delta, mask_arg,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *mask_strides,
        Hq, Nq, Nk, causal_offset, scale * LOG2E, scale, *drop, n_bucket, **common)
    return dq, dk, dv
