"""Attention backward (FlashAttention-2 scheme, deterministic): kernels and launcher.

The forward saved q, k, v, o and the lse. The backward recomputes the probabilities tile by tile
as P = exp2(S·scale·log2 e − lse₂) and never stores them:

1. ``_bwd_preprocess``: δ = rowsum(dO ∘ O) − dlse (the lse's own gradient folds in here), and
   lse₂ = lse·log2 e with −inf (fully masked rows) turned into +inf so those rows give P = 0.
2. ``_bwd_dkdv_kernel``: one program per key tile of one KV head; it loops over every query
   head of the GQA group and every query tile, accumulating dK and dV in registers.
3. ``_bwd_dq_kernel``: one program per query tile; loops over key tiles, accumulating dQ.
4. ``_bwd_short_kernel``, instead of 1–3 where every key of a (batch, KV head) fits one tile of at
   most ``SHORT_MAX_N`` keys, there are at most ``SHORT_MAX_NQ`` queries, and the call has no mask,
   dropout or sinks over a dense batch (windows,
   softcap, ALiBi and an lse gradient are taken; see ``_short_config``): one program per (batch,
   KV head) holds that head's K, V and the dK, dV accumulators in registers and loops over the
   group's query heads and their query tiles, doing 1. for the tile in registers and storing its
   dQ, complete since there is no other key tile. One launch and three allocations replace three
   launches and five (a tiny call's cost is host time), and on the H100 it also ran 2.5–9.4× faster
   on the device (``benchmarks/short_backward.py``, 2026-11-24).

No atomics: each output element is written by exactly one program, so gradients are
bit-identical from run to run. (``attention_backward`` hands large fp16/bf16 calls on sm_90, plain
or with a window, softcap, ALiBi or sinks, over a dense, ranges or varlen batch, to the Gluon
backward, ``attention_bwd_gluon``, whose dq at d ≤ 128 is not bit-reproducible unless
``torch.use_deterministic_algorithms(True)`` (at d 256 it has one writer per element, but in plain
causal calls with v at most 128 wide, MLA's, whose dq is reduce-added in one pass); plain ones
otherwise to the TMA pair,
``attention_bwd_hopper``.)
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launcher import keep_bound, launch_bound, launcher
from .._log import note_path
from .._runtime import cdiv, interpreter_active, next_pow2, tile_and_slab, tuned
from ..dropout import dropout_keep, keep_threshold
from ..merge import LOG2E
from .attention_fwd import (MASK_BOOL, NOT_SPECIALIZED, PLAIN, head_tiles, SEQ_RANGES, SEQ_VARLEN, Variant, _fits, causal_window, head_base,
                            key_range, length_bucket, load_tile, lse_strides, mask_kind, precision_for, query_grid,
                            query_program, score_args, score_tensors, score_tile, seq_args, sequence, varlen_program, _plain_signature,
                            _variant_signature, SEQ_DENSE)
from .attention_fwd_hopper import _tensor_reason


@triton.jit
def row_delta(o_t, do_t):
    """δ = rowsum(dO ∘ O) of a [rows, Dv] tile pair, in float32."""
    return tl.sum(o_t.to(tl.float32) * do_t.to(tl.float32), 1)


@triton.jit
def base2_lse(l):
    """lse₂ = lse·log2 e, with −inf (a row that sees no key) turned into +inf: that row's
    P = exp2(s − lse₂) is then 0 and its gradients 0, never NaN."""
    return tl.where(l == float("-inf"), float("inf"), l * 1.4426950408889634)


@triton.jit
def row_stats_tile(o, do, lse, dlse, bh, n_heads, offs_m,
                   stride_ob, stride_oh, stride_om, stride_od,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   n_q, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr):
    """(δ, lse₂, the rows' offsets in the (B·Hq, Nq) statistics, which rows exist) of query rows
    ``offs_m`` of (batch, head) ``bh``: δ = rowsum(dO ∘ O) − dlse (0 on rows past Nq), lse₂ =
    ``base2_lse`` of the lse (of 0 on rows past Nq)."""
    b = bh // n_heads
    h = bh % n_heads
    offs_d = tl.arange(0, BLOCK_DV)
    o_t = load_tile(head_base(o, b, h, stride_ob, stride_oh), offs_m[:, None], stride_om, n_q,
                    offs_d[None, :], stride_od, HEAD_DIM_V)
    do_t = load_tile(head_base(do, b, h, stride_dob, stride_doh), offs_m[:, None], stride_dom, n_q,
                     offs_d[None, :], stride_dod, HEAD_DIM_V)
    d = row_delta(o_t, do_t)
    row = bh.to(tl.int64) * n_q + offs_m
    row_ok = offs_m < n_q
    if HAS_DLSE:
        d -= tl.load(dlse + row, mask=row_ok, other=0.0)
    l = tl.load(lse + row, mask=row_ok, other=0.0)
    return d, base2_lse(l), row, row_ok


@launcher
@triton.jit(do_not_specialize=["n_q", "n_heads"])
def _bwd_preprocess(o, do, lse, dlse, delta, lse2,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    n_heads, n_q, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                    HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr):
    tile, bh = tile_and_slab(tl.cdiv(n_q, BLOCK_M))
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d, l2, row, row_ok = row_stats_tile(o, do, lse, dlse, bh, n_heads, offs_m, stride_ob, stride_oh, stride_om,
                                        stride_od, stride_dob, stride_doh, stride_dom, stride_dod, n_q,
                                        HEAD_DIM_V, BLOCK_DV, HAS_DLSE)
    tl.store(delta + row, d, mask=row_ok)
    tl.store(lse2 + row, l2, mask=row_ok)


@triton.jit
def query_range(start_n, n_q, off, win_left, win_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the key tile starting at ``start_n``: (lo, mid_lo, mid_hi, hi) over query rows, the
    transpose of ``key_range``. Rows [mid_lo, mid_hi) (whole tiles) see every key of the tile;
    rows [lo, mid_lo) and [mid_hi, hi) some. Rows past n_q may run the unmasked body: their P is 0
    (lse₂ = +inf), so without a left side the last partial tile needs no masking."""
    last = start_n + BLOCK_N - 1
    lo = 0
    full_lo = 0
    hi = n_q
    full_hi = n_q
    if HAS_RIGHT:  # rows i with i + off + right ≥ the tile's first key
        lo = tl.maximum(start_n - off - win_right, 0)
        full_lo = tl.maximum(last - off - win_right, 0)
    if HAS_LEFT:   # rows i with i + off − left ≤ the tile's last key
        hi = tl.minimum(tl.maximum(last - off + win_left + 1, 0), n_q)
        full_hi = tl.minimum(tl.maximum(start_n - off + win_left + 1, 0), n_q)
    lo = (tl.minimum(lo, hi) // BLOCK_M) * BLOCK_M
    mid_lo = tl.minimum(tl.cdiv(full_lo, BLOCK_M) * BLOCK_M, hi)
    if HAS_LEFT:
        mid_hi = tl.maximum((full_hi // BLOCK_M) * BLOCK_M, mid_lo)
    else:
        mid_hi = tl.maximum(hi, mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _dkdv_tile(dk, dv, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row, start_m,
               offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale,
               softcap_scale, softcap2, slope2,
               stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
               seed, drop_base, drop_threshold, drop_scale,
               BOUNDARY: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FAST_TANH: tl.constexpr,
               DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               PRECISION: tl.constexpr):
    """One query tile against this program's key tile, transposed: recompute Pᵀ [BLOCK_N, BLOCK_M]
    from the saved lse, fold it into dV and dSᵀ into dK."""
    offs_m = start_m + offs_m0
    row_ok = offs_m < n_q
    q_t = load_tile(q_base, offs_m[None, :], stride_qm, n_q, offs_d[:, None], stride_qd, HEAD_DIM)
    do_t = load_tile(do_base, offs_m[:, None], stride_dom, n_q, offs_dv[None, :], stride_dod, HEAD_DIM_V)
    l2 = tl.load(lse2_row + offs_m, mask=row_ok, other=float("inf"))
    st, tt = score_tile(tl.dot(k_t, q_t, input_precision=PRECISION), offs_m[None, :], offs_n[:, None],
                        mask_base, stride_mask_m, stride_mask_n, n_q, n_k, off, win_left, win_right,
                        qk_scale, softcap_scale, softcap2, slope2,
                        BOUNDARY, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH)
    pt = tl.math.exp2(st - l2[None, :])
    d = tl.load(delta_row + offs_m, mask=row_ok, other=0.0)
    dpt = tl.dot(v_t, tl.trans(do_t), input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, drop_base + offs_m[None, :].to(tl.int64) * n_k + offs_n[:, None], drop_threshold)
        dv = tl.dot(tl.where(keep, pt * drop_scale, 0.0).to(do_t.dtype), do_t, dv, input_precision=PRECISION)
        dpt = tl.where(keep, dpt * drop_scale, 0.0)
    else:
        dv = tl.dot(pt.to(do_t.dtype), do_t, dv, input_precision=PRECISION)
    dst = pt * (dpt - d[None, :])
    if SOFTCAP:  # d(c·tanh(x/c))/dx = 1 − tanh²
        dst = dst * (1.0 - tt * tt)
    dk = tl.dot(dst.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
    return dk, dv


def _bwd_configs():
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in [(64, 128, 8, 2), (32, 128, 4, 2), (64, 128, 8, 3), (32, 64, 4, 3),
                                 (64, 64, 4, 2), (64, 64, 8, 3), (128, 128, 8, 2), (16, 64, 4, 2),
                                 (32, 32, 4, 1), (16, 32, 4, 1)]]


def _prune_bwd(configs, named_args):
    # dK/dV (or dQ) accumulators and the K/V (or Q/dO) tiles live in registers for the whole loop
    # (fp32 tiles: twice the registers of 16-bit ones).
    d = next_pow2(named_args["HEAD_DIM"])
    dv = next_pow2(named_args["HEAD_DIM_V"])
    itemsize = named_args["q"].element_size()
    return [c for c in configs
            if _fits(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_M"], c.num_warps, c.num_stages, d, dv, itemsize)
            and (d + dv) * max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) * max(1, itemsize // 2)
            / (c.num_warps * 32) <= 128]


_INTERP_CFG = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)
_BWD_KEY = ["HEAD_DIM", "HEAD_DIM_V", "HAS_LEFT", "HAS_RIGHT", "MASK_KIND", "SOFTCAP", "ALIBI", "SEQ", "DROPOUT",
            "GROUP", "n_bucket"]


@tuned(_bwd_configs(), key=_BWD_KEY, interpreter_config=_INTERP_CFG,
       prune=_prune_bwd, length="n_bucket")
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _bwd_dkdv_kernel(q, k, v, do, dk, dv, lse2, delta, mask, alibi, q_starts, q_ends, k_starts, k_ends,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_dob, stride_doh, stride_dom, stride_dod,
                     stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                     stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                     stride_lse_b, stride_lse_h, stride_alibi_b, stride_alibi_h, stride_seq,
                     n_heads, n_kv_heads, n_q, n_k, n_seq, off, win_left, win_right, qk_scale, sm_scale,
                     softcap_scale, softcap2, seed, drop_threshold, drop_scale, n_bucket,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
                     SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEQ: tl.constexpr, FAST_TANH: tl.constexpr,
                     DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if SEQ == 2:
        h_kv, b, start_n, live = varlen_program(k_starts, k_ends, n_seq, n_k, n_kv_heads, BLOCK_N)
    else:
        tile, bh_kv = tile_and_slab(tl.cdiv(n_k, BLOCK_N))
        start_n = tile * BLOCK_N
        b = bh_kv // n_kv_heads
        h_kv = bh_kv % n_kv_heads
    q0, n_q, k0, n_k, off = sequence(b, n_q, n_k, q_starts, q_ends, k_starts, k_ends, stride_seq, off, SEQ)
    if SEQ == 2:
        n_k = tl.where(live, n_k, 0)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < n_k
    k_base = head_base(k, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v, b, h_kv, stride_vb, stride_vh)
    dk_base = head_base(dk, b, h_kv, stride_dkb, stride_dkh)
    dv_base = head_base(dv, b, h_kv, stride_dvb, stride_dvh)
    if SEQ != 0:
        k_base += k0.to(tl.int64) * stride_kn
        v_base += k0.to(tl.int64) * stride_vn
        dk_base += k0.to(tl.int64) * stride_dkn
        dv_base += k0.to(tl.int64) * stride_dvn
    k_t = load_tile(k_base, offs_n[:, None], stride_kn, n_k, offs_d[None, :], stride_kd, HEAD_DIM)
    v_t = load_tile(v_base, offs_n[:, None], stride_vn, n_k, offs_dv[None, :], stride_vd, HEAD_DIM_V)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # A key tile past its sequence's end (ranges, varlen) visits no query.
    n_q_visit = tl.where(start_n < n_k, n_q, 0)
    lo, mid_lo, mid_hi, hi = query_range(start_n, n_q_visit, off, win_left, win_right, HAS_LEFT, HAS_RIGHT,
                                         BLOCK_M, BLOCK_N)
    for g in range(GROUP):
        h = h_kv * GROUP + g
        q_base = head_base(q, b, h, stride_qb, stride_qh)
        do_base = head_base(do, b, h, stride_dob, stride_doh)
        lse2_row = lse2 + b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h
        delta_row = delta + b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h
        if SEQ != 0:
            q_base += q0.to(tl.int64) * stride_qm
            do_base += q0.to(tl.int64) * stride_dom
            lse2_row += q0
            delta_row += q0
        mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
        drop_base = (b * n_heads + h).to(tl.int64) * n_q * n_k
        slope2 = 0.0
        if ALIBI:
            slope2 = tl.load(alibi + b.to(tl.int64) * stride_alibi_b + h * stride_alibi_h).to(tl.float32) * 1.4426950408889634
        if HAS_RIGHT:  # rows before the diagonal band: only with a right side
            for start_m in tl.range(lo, mid_lo, BLOCK_M):
                dk_acc, dv_acc = _dkdv_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row,
                                            start_m, offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, off, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, slope2,
                                            stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
                                            seed, drop_base, drop_threshold, drop_scale,
                                            True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                            HEAD_DIM, HEAD_DIM_V, PRECISION)
        for start_m in tl.range(mid_lo, mid_hi, BLOCK_M):
            dk_acc, dv_acc = _dkdv_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row,
                                        start_m, offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, off, win_left, win_right,
                                        qk_scale, softcap_scale, softcap2, slope2,
                                        stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
                                        seed, drop_base, drop_threshold, drop_scale,
                                        False, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                        HEAD_DIM, HEAD_DIM_V, PRECISION)
        if HAS_LEFT:  # rows past the band: only with a left side
            for start_m in tl.range(mid_hi, hi, BLOCK_M):
                dk_acc, dv_acc = _dkdv_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, mask_base, lse2_row, delta_row,
                                            start_m, offs_n, offs_m0, offs_d, offs_dv, n_q, n_k, off, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, slope2,
                                            stride_qm, stride_qd, stride_dom, stride_dod, stride_mask_m, stride_mask_n,
                                            seed, drop_base, drop_threshold, drop_scale,
                                            True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                            HEAD_DIM, HEAD_DIM_V, PRECISION)

    store_n = col_ok[:, None]
    tl.store(dk_base + offs_n[:, None].to(tl.int64) * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk_acc * sm_scale).to(dk.dtype.element_ty), mask=store_n & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_base + offs_n[:, None].to(tl.int64) * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv_acc.to(dv.dtype.element_ty), mask=store_n & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_tile(dq, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d, offs_dv,
             n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
             stride_kn, stride_kd, stride_vn, stride_vd,
             stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
             BOUNDARY: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
             SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FAST_TANH: tl.constexpr,
             DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
             PRECISION: tl.constexpr):
    cols = start_n + offs_n0
    k_t = load_tile(k_base, cols[:, None], stride_kn, n_k, offs_d[None, :], stride_kd, HEAD_DIM)
    v_t = load_tile(v_base, cols[None, :], stride_vn, n_k, offs_dv[:, None], stride_vd, HEAD_DIM_V)
    s, t = score_tile(tl.dot(q_t, tl.trans(k_t), input_precision=PRECISION), offs_m[:, None], cols[None, :],
                      mask_base, stride_mask_m, stride_mask_n, n_q, n_k, off, win_left, win_right,
                      qk_scale, softcap_scale, softcap2, slope2,
                      BOUNDARY, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH)
    p = tl.math.exp2(s - l2[:, None])
    dp = tl.dot(do_t, v_t, input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, drop_base + offs_m[:, None].to(tl.int64) * n_k + cols[None, :], drop_threshold)
        dp = tl.where(keep, dp * drop_scale, 0.0)
    ds = p * (dp - d[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return tl.dot(ds.to(k_t.dtype), k_t, dq, input_precision=PRECISION)


@tuned(_bwd_configs(), key=_BWD_KEY, interpreter_config=_INTERP_CFG,
       prune=_prune_bwd, length="n_bucket")
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _bwd_dq_kernel(q, k, v, do, dq, lse2, delta, mask, alibi, q_starts, q_ends, k_starts, k_ends,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                   stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                   stride_lse_b, stride_lse_h, stride_alibi_b, stride_alibi_h, stride_seq,
                   n_heads, n_q, n_k, n_seq, off, win_left, win_right, qk_scale, sm_scale,
                   softcap_scale, softcap2, seed, drop_threshold, drop_scale, n_bucket,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
                   SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEQ: tl.constexpr, FAST_TANH: tl.constexpr,
                   DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, b, h, h_kv, q0, n_q, k0, n_k, off = query_program(n_q, n_k, n_heads, n_seq, q_starts, q_ends, k_starts,
                                                               k_ends, stride_seq, off, GROUP, BLOCK_M, SEQ)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < n_q
    q_base = head_base(q, b, h, stride_qb, stride_qh)
    do_base = head_base(do, b, h, stride_dob, stride_doh)
    dq_base = head_base(dq, b, h, stride_dqb, stride_dqh)
    k_base = head_base(k, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v, b, h_kv, stride_vb, stride_vh)
    row_base = b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h
    if SEQ != 0:
        q_base += q0.to(tl.int64) * stride_qm
        do_base += q0.to(tl.int64) * stride_dom
        dq_base += q0.to(tl.int64) * stride_dqm
        k_base += k0.to(tl.int64) * stride_kn
        v_base += k0.to(tl.int64) * stride_vn
        row_base += q0
    q_t = load_tile(q_base, offs_m[:, None], stride_qm, n_q, offs_d[None, :], stride_qd, HEAD_DIM)
    do_t = load_tile(do_base, offs_m[:, None], stride_dom, n_q, offs_dv[None, :], stride_dod, HEAD_DIM_V)
    l2 = tl.load(lse2 + row_base + offs_m, mask=row_ok, other=float("inf"))
    d = tl.load(delta + row_base + offs_m, mask=row_ok, other=0.0)
    mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
    drop_base = (b * n_heads + h).to(tl.int64) * n_q * n_k
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(alibi + b.to(tl.int64) * stride_alibi_b + h * stride_alibi_h).to(tl.float32) * 1.4426950408889634
    dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    n_k_visit = tl.where(start_m < n_q, n_k, 0)
    lo, mid_lo, mid_hi, hi = key_range(start_m, n_k_visit, off, win_left, win_right, HAS_LEFT, HAS_RIGHT,
                                       BLOCK_M, BLOCK_N)
    if HAS_LEFT:  # without a left side the range is empty: no code for it
        for start_n in tl.range(lo, mid_lo, BLOCK_N):
            dq_acc = _dq_tile(dq_acc, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d,
                              offs_dv, n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                              stride_kn, stride_kd, stride_vn, stride_vd,
                              stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
                              True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                              HEAD_DIM, HEAD_DIM_V, PRECISION)
    for start_n in tl.range(mid_lo, mid_hi, BLOCK_N):
        dq_acc = _dq_tile(dq_acc, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d,
                          offs_dv, n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                          stride_kn, stride_kd, stride_vn, stride_vd,
                          stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
                          False, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                          HEAD_DIM, HEAD_DIM_V, PRECISION)
    for start_n in tl.range(mid_hi, hi, BLOCK_N):
        dq_acc = _dq_tile(dq_acc, q_t, do_t, l2, d, k_base, v_base, mask_base, start_n, offs_m, offs_n0, offs_d,
                          offs_dv, n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                          stride_kn, stride_kd, stride_vn, stride_vd,
                          stride_mask_m, stride_mask_n, seed, drop_base, drop_threshold, drop_scale,
                          True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                          HEAD_DIM, HEAD_DIM_V, PRECISION)
    tl.store(dq_base + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq_acc * sm_scale).to(dq.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


# The one-launch backward of short calls: all keys of a (batch, KV head) in one tile. Its key tiles
# (each its own binary: warmup compiles a call of each) and the query tile it loops over.
SHORT_BLOCKS = (16, 32, 64)
SHORT_MAX_N = SHORT_BLOCKS[-1]
# Its programs loop over every query tile in turn, dQ included, where the three launches spread dQ
# over one program per query tile: past a few tiles of queries those win.
SHORT_MAX_NQ = 256
_SHORT_BLOCK_M = 16


@triton.jit
def _short_tile(dk, dv, k_t, v_t, q_base, do_base, o_base, dq_base, lse_row, dlse_row, start_m, offs_m0, offs_n,
                offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale, sm_scale, softcap_scale, softcap2,
                slope2, stride_qm, stride_qd, stride_dom, stride_dod, stride_om, stride_od, stride_dqm, stride_dqd,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                FAST_TANH: tl.constexpr, HAS_DLSE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                PRECISION: tl.constexpr):
    """One query tile against every key: P and dS [BLOCK_M, BLOCK_N] as in ``_dq_tile``, with the
    preprocess (δ, lse₂) done in registers; dK and dV take their transposes, and the tile's dQ,
    complete since there is no other key tile, is stored. (Query-major: ``_dkdv_tile``'s key-major
    order spilled registers at d 128 where this one does not; see ``_short_config``.)"""
    offs_m = start_m + offs_m0
    row_ok = offs_m < n_q
    q_t = load_tile(q_base, offs_m[:, None], stride_qm, n_q, offs_d[None, :], stride_qd, HEAD_DIM)
    do_t = load_tile(do_base, offs_m[:, None], stride_dom, n_q, offs_dv[None, :], stride_dod, HEAD_DIM_V)
    o_t = load_tile(o_base, offs_m[:, None], stride_om, n_q, offs_dv[None, :], stride_od, HEAD_DIM_V)
    d = row_delta(o_t, do_t)
    if HAS_DLSE:
        d -= tl.load(dlse_row + offs_m, mask=row_ok, other=0.0)
    l2 = base2_lse(tl.load(lse_row + offs_m, mask=row_ok, other=float("-inf")))  # rows past n_q: P = 0
    # Every tile is a boundary tile: keys past n_k (zeros in k_t) and the window are masked.
    s, t = score_tile(tl.dot(q_t, tl.trans(k_t), input_precision=PRECISION), offs_m[:, None], offs_n[None, :],
                      q_base, 0, 0, n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                      True, HAS_LEFT, HAS_RIGHT, 0, SOFTCAP, ALIBI, FAST_TANH)
    p = tl.math.exp2(s - l2[:, None])
    dv = tl.dot(tl.trans(p.to(do_t.dtype)), do_t, dv, input_precision=PRECISION)
    dp = tl.dot(do_t, tl.trans(v_t), input_precision=PRECISION)
    ds = p * (dp - d[:, None])
    if SOFTCAP:  # d(c·tanh(x/c))/dx = 1 − tanh²
        ds = ds * (1.0 - t * t)
    dk = tl.dot(tl.trans(ds.to(q_t.dtype)), q_t, dk, input_precision=PRECISION)
    dq = tl.dot(ds.to(k_t.dtype), k_t, input_precision=PRECISION)
    tl.store(dq_base + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq * sm_scale).to(dq_base.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    return dk, dv


@launcher
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _bwd_short_kernel(q, k, v, do, o, lse, dq, dk, dv, dlse, alibi,
                      stride_qb, stride_qh, stride_qm, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_dob, stride_doh, stride_dom, stride_dod,
                      stride_ob, stride_oh, stride_om, stride_od,
                      stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                      stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                      stride_lse_b, stride_lse_h, stride_alibi_b, stride_alibi_h,
                      n_kv_heads, n_q, n_k, off, win_left, win_right, qk_scale, sm_scale, softcap_scale, softcap2,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                      FAST_TANH: tl.constexpr, HAS_DLSE: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // n_kv_heads
    h_kv = pid % n_kv_heads
    offs_n = tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_t = load_tile(head_base(k, b, h_kv, stride_kb, stride_kh), offs_n[:, None], stride_kn, n_k,
                    offs_d[None, :], stride_kd, HEAD_DIM)
    v_t = load_tile(head_base(v, b, h_kv, stride_vb, stride_vh), offs_n[:, None], stride_vn, n_k,
                    offs_dv[None, :], stride_vd, HEAD_DIM_V)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for g in range(GROUP):
        h = h_kv * GROUP + g
        q_base = head_base(q, b, h, stride_qb, stride_qh)
        do_base = head_base(do, b, h, stride_dob, stride_doh)
        o_base = head_base(o, b, h, stride_ob, stride_oh)
        dq_base = head_base(dq, b, h, stride_dqb, stride_dqh)
        row = b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h
        slope2 = 0.0
        if ALIBI:
            slope2 = tl.load(alibi + b.to(tl.int64) * stride_alibi_b + h * stride_alibi_h).to(tl.float32) * 1.4426950408889634
        # Every query tile, even one that sees no key: its dQ rows (zeros) are written by no one else.
        for start_m in tl.range(0, n_q, BLOCK_M):
            dk_acc, dv_acc = _short_tile(dk_acc, dv_acc, k_t, v_t, q_base, do_base, o_base, dq_base, lse + row,
                                         dlse + row, start_m, offs_m0, offs_n, offs_d, offs_dv, n_q, n_k, off,
                                         win_left, win_right, qk_scale, sm_scale, softcap_scale, softcap2, slope2,
                                         stride_qm, stride_qd, stride_dom, stride_dod, stride_om, stride_od,
                                         stride_dqm, stride_dqd, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                                         HAS_DLSE, HEAD_DIM, HEAD_DIM_V, PRECISION)
    col_ok = offs_n[:, None] < n_k
    dk_base = head_base(dk, b, h_kv, stride_dkb, stride_dkh)
    dv_base = head_base(dv, b, h_kv, stride_dvb, stride_dvh)
    tl.store(dk_base + offs_n[:, None].to(tl.int64) * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk_acc * sm_scale).to(dk.dtype.element_ty), mask=col_ok & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_base + offs_n[:, None].to(tl.int64) * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv_acc.to(dv.dtype.element_ty), mask=col_ok & (offs_dv[None, :] < HEAD_DIM_V))


_HOPPER: dict = {}  # call signature → (a Hopper backward's entry point, explain()'s note), or False
_HOPPER_ENTRIES = 256
# Calls without a mask, dropout or dlse: the call's launches (the short kernel's one, or the three)
# bound to its arguments (entries: see ``_bound_short``), keyed by the call's signature, its variant's,
# and dO's strides and dtype, O's and lse's strides: a repeated small call skips the argument walk (as
# the forward's ``_BOUND``). The short kernel's limits (``SHORT_MAX_N`` …) are not in the key: a
# change of them (tests) must clear the table.
_BOUND: dict = {}


def _hopper_backward(q, k, v, causal, causal_offset, scale, variant: Variant = PLAIN, signature=None,
                     variant_signature=None):
    """(a Hopper backward's entry point, what explain() says of it) if this call (no mask or
    dropout) takes one, else False: the Gluon warp-specialized backward where its ``fast_path``
    says so (plain, or a window, softcap, ALiBi, sinks; over a dense batch, a padded one with per-row
    ranges or a packed varlen one), else for a plain
    call the Triton TMA pair (``attention_bwd_hopper.fast_path``). Decided once per call signature
    (with the variant's, ``_variant_signature``, as the forward keys it; both modules import this
    one), base-pointer alignment checked on every call. The caller hands it a contiguous dO (so
    only dO's base alignment is left to check), and where it has them the call's ``_plain_signature``
    and its variant's ``_variant_signature``."""
    if q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16:
        return False
    deterministic = torch.are_deterministic_algorithms_enabled()
    if signature is None:
        signature = _plain_signature(q, k, v, causal, causal_offset, scale, True)
    key = (signature, deterministic)
    if variant is not PLAIN:  # (with the batch layout and its bounds' layouts)
        key = (*key, _variant_signature(variant) if variant_signature is None else variant_signature)
    hopper = _HOPPER.get(key)
    if hopper is None:
        from . import attention_bwd_gluon, attention_bwd_hopper
        if len(_HOPPER) >= _HOPPER_ENTRIES:
            _HOPPER.clear()
        # q stands in for the contiguous dO: same shape and dtype, and its strides pass the same rules
        # (v's head dim not q's: a contiguous tensor of dO's shape, once per signature).
        do = q if v.shape[3] == q.shape[3] else q.new_empty((*q.shape[:3], v.shape[3]))
        note = attention_bwd_gluon.path_note(variant, q.shape[3], deterministic, causal, v.shape[3])
        if variant is not PLAIN:
            gluon = attention_bwd_gluon.fast_path(do, q, k, v, causal, causal_offset, scale, deterministic,
                                                  variant=variant)
            hopper = (attention_bwd_gluon.attention_backward_gluon, note) if gluon else False
        elif attention_bwd_gluon.fast_path(do, q, k, v, causal, causal_offset, scale, deterministic):
            hopper = (attention_bwd_gluon.attention_backward_gluon, note)
        elif attention_bwd_hopper.fast_path(q, q, k, v, causal, causal_offset, scale):
            hopper = (attention_bwd_hopper.attention_backward_hopper, attention_bwd_hopper.PATH_NOTE)
        else:
            hopper = False
        _HOPPER[key] = hopper
    return hopper


def _short_config(variant: Variant, mask, dropout_p: float, Nq: int, Nk: int, block_d: int, block_dv: int,
                  itemsize: int):
    """(BLOCK_N, num_warps) of the one-launch backward where it takes the call, else None: no mask,
    dropout or sinks, a dense batch, at most SHORT_MAX_NQ queries, every key of a (batch, KV head)
    in one tile of ≤ SHORT_MAX_N,
    and that tile's dK and dV accumulators, held in registers for the whole call, at most 64
    floats a thread on 4 warps or, where they need it, 8 (fp32: 16 on 8 warps). Those are the
    kernels that compiled for sm_90 without spills (triton 3.9's PTX, ``ptxas -v``: head dims
    16–256, each key tile, plain and with every option; one exception, 8 bytes at d 256 on 16 keys
    with the options); fp32, whose dots run on CUDA cores with their operands in registers, spilled
    past 16. The rest take the three launches."""
    if mask is not None or dropout_p > 0.0 or variant.sinks is not None or variant.seq != SEQ_DENSE \
            or Nk > SHORT_MAX_N or Nq > SHORT_MAX_NQ:
        return None
    block_n = max(SHORT_BLOCKS[0], next_pow2(Nk))
    heads = block_d + block_dv
    if itemsize == 4:  # dots on CUDA cores, their operands in registers too
        return (block_n, 8) if heads * block_n * 2 <= 16 * 8 * 32 else None
    for warps in (4, 8):
        if heads * block_n <= 64 * warps * 32:
            return block_n, warps
    return None


def _short_backward(do, q, k, v, o, lse, dlse, variant: Variant, scale: float, causal_offset: int,
                    block_d: int, block_dv: int, block_n: int, warps: int):
    """The one-launch backward (``_bwd_short_kernel``, one program per (batch, KV head)):
    (dq, dk, dv, its launch as (grid, args, constexprs) for ``Launcher.bind``)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    (_, alibi_arg), alibi_strides, score_scalars, score_constexprs = score_args(variant, q, scale)
    grid = (B * Hkv,)
    args = (q, k, v, do, o, lse, dq, dk, dv, lse if dlse is None else dlse, alibi_arg,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *o.stride(), *dq.stride(), *dk.stride(),
            *dv.stride(), *lse_strides(variant, Hq, Nq), *alibi_strides,
            Hkv, Nq, Nk, causal_offset, variant.left, variant.right, scale * LOG2E, scale, *score_scalars)
    constexprs = dict(GROUP=Hq // Hkv, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=block_d, BLOCK_DV=block_dv,
                      HAS_LEFT=score_constexprs["HAS_LEFT"], HAS_RIGHT=score_constexprs["HAS_RIGHT"],
                      SOFTCAP=score_constexprs["SOFTCAP"], ALIBI=score_constexprs["ALIBI"],
                      FAST_TANH=score_constexprs["FAST_TANH"], HAS_DLSE=dlse is not None,
                      PRECISION=precision_for(q.dtype), BLOCK_M=_SHORT_BLOCK_M, BLOCK_N=block_n, num_warps=warps)
    _bwd_short_kernel[grid](*args, **constexprs)
    return dq, dk, dv, (grid, args, constexprs)


# A ``_BOUND`` entry runs a repeated call's backward, ``entry(q, k, v, do, o, lse, dq, dk, dv, variant)``,
# and returns False where a launch declined (the caller then takes the full path, which redoes every
# output), else the call's δ (for the sinks' gradient) or True (the short kernel: no sinks there).
# The bound tensors besides the call's: the short kernel's dlse placeholder (lse: bound calls have no
# dlse) and ALiBi slopes; the three launches' mask placeholder, slopes and sequence bounds
# (``seq_args``); q where absent.

def _bound_short(launch):
    """The short kernel's bound launch as one ``_BOUND`` entry."""
    return lambda q, k, v, do, o, lse, dq, dk, dv, variant: launch(q, k, v, do, o, lse, dq, dk, dv, lse,
                                                                   score_tensors(variant, q)[1])


def _bound_three(pre, kv, qt):
    """The three-launch backward's bound launches as one ``_BOUND`` entry (δ and lse₂ allocated per
    call), made after one check (``launch_bound``)."""
    def run(q, k, v, do, o, lse, dq, dk, dv, variant):
        delta, lse2 = torch.empty_like(lse), torch.empty_like(lse)
        read = (q, score_tensors(variant, q)[1], *seq_args(variant, q)[:4])  # mask, slopes, bounds
        tensors = ((o, do, lse, lse, delta, lse2), (q, k, v, do, dk, dv, lse2, delta, *read),
                   (q, k, v, do, dq, lse2, delta, *read))
        return launch_bound((pre, kv, qt), tensors) == 3 and delta
    return run


def attention_backward(do, q, k, v, o, lse, dlse, *, scale: float, causal: bool, causal_offset: int,
                       mask: torch.Tensor | None, dropout_p: float, seed: int, variant: Variant = PLAIN,
                       out: tuple | None = None):
    """Gradients (dq, dk, dv, dsinks) in the inputs' dtypes; dk, dv summed over each GQA group;
    dsinks (Hq,) float32, or None without sinks. Tensors laid out as for ``attention_forward``.
    ``out``: (dq, dk, dv) to write; where the Gluon backward runs the call and can
    (``attention_bwd_gluon.writes_grads_into``), the gradients are written there and returned; elsewhere
    they are new tensors (the caller copies them: ``_backward_impl``)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    signature = None
    if mask is None and dropout_p == 0.0:
        signature = _plain_signature(q, k, v, causal, causal_offset, scale, True)
        variant_signature = None if variant is PLAIN else _variant_signature(variant)
        hopper = _hopper_backward(q, k, v, causal, causal_offset, scale, variant, signature, variant_signature)
        # dO is read as it is wherever TMA can (a (B, N, H, D) layout's transposed view, rows of a
        # larger tensor, a packed varlen batch): autograd may hand over an expanded one (e.g. of
        # o.sum()), which TMA takes contiguous.
        dense_do = None
        if hopper:
            dense_do = do if _tensor_reason("do", do) is None else do.contiguous()
        if hopper and dense_do.data_ptr() % 16 == 0:
            run, note = hopper
            note_path("hopper", "attention backward", note)
            into = {}
            if out is not None:  # (ring attention's rows of its sums: no per-call import otherwise)
                from . import attention_bwd_gluon as gluon
                if run is gluon.attention_backward_gluon and gluon.writes_grads_into(out, q, k, v, causal, variant):
                    into = dict(out=out)
            if variant is PLAIN:
                return (*run(dense_do, q, k, v, o, lse, scale=scale, causal=causal, dlse=dlse, **into), None)
            # The Gluon backward with the options: (dq, dk, dv, dsinks), as below.
            return run(dense_do, q, k, v, o, lse, scale=scale, causal=causal, dlse=dlse, variant=variant, **into)
    # Rows outside every range of a padded batch are no program's: their gradients are 0.
    alloc = torch.zeros_like if variant.seq == SEQ_RANGES else torch.empty_like
    # A repeated call without a mask, dropout or dlse: its launches bound to its arguments
    # (``Launcher.bind``), keyed by everything else they depend on.
    bound_key = None
    if signature is not None and dlse is None and _bwd_dq_kernel.enabled:
        bound_key = (signature, do.stride(), do.dtype, o.stride(), lse.stride(), variant_signature)
        bound = _BOUND.get(bound_key)
        if bound is not None:
            dq, dk, dv = alloc(q), alloc(k), alloc(v)
            # Each launch writes its outputs whole, so one that declines (returns False: a tensor not
            # 16-byte aligned, a profiler hook) falls through to the full path, which redoes them all.
            done = bound(q, k, v, do, o, lse, dq, dk, dv, variant)
            if done is not False:
                dsinks = sinks_grad(variant.sinks, lse, done) if variant.sinks is not None else None
                return dq, dk, dv, dsinks
    variant = causal_window(variant, causal)
    if dlse is not None:
        dlse = dlse.float().contiguous()  # autograd hands over expanded (stride-0) grads, e.g. from lse.sum()
    block_d, block_dv = head_tiles(D, Dv)
    short = _short_config(variant, mask, dropout_p, Nq, Nk, block_d, block_dv, q.element_size())
    if short is not None:
        dq, dk, dv, launch = _short_backward(do, q, k, v, o, lse, dlse, variant, scale, causal_offset,
                                             block_d, block_dv, *short)
        if bound_key is not None:
            bound = _bwd_short_kernel.bind(*launch, 11)
            keep_bound(_BOUND, bound_key, _bound_short(bound) if bound is not None else None)
        return dq, dk, dv, None
    dq, dk, dv = alloc(q), alloc(k), alloc(v)
    # δ and lse₂ in the forward's lse layout, seen by the preprocess as dense (B, Hq, Nq) rows.
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    pre_m = 16 if interpreter_active() else 64
    pre_grid = (cdiv(Nq, pre_m) * B * Hq,)
    pre_args = (o, do, lse, dlse if dlse is not None else lse, delta, lse2, *o.stride(), *do.stride(), Hq, Nq)
    pre_constexprs = dict(HEAD_DIM_V=Dv, BLOCK_DV=block_dv, HAS_DLSE=dlse is not None, BLOCK_M=pre_m)
    _bwd_preprocess[pre_grid](*pre_args, **pre_constexprs)

    a = _launch_args(q, k, v, mask, dropout_p, seed, variant, scale, causal_offset)
    if variant.seq == SEQ_VARLEN:
        kv_grid = lambda meta: ((cdiv(Nk, meta["BLOCK_N"]) + a.n_seq) * Hkv,)
    else:
        kv_grid = lambda meta: (cdiv(Nk, meta["BLOCK_N"]) * B * Hkv,)
    sq, sk, sv, sdo, sdk, sdv = _strides(variant, q, k, v, do, dk, dv)
    kv_args = (q, k, v, do, dk, dv, lse2, delta, a.mask, a.alibi, *a.seq_ptrs,
               *sq, *sk, *sv, *sdo, *sdk, *sdv, *a.tail, Hq, Hkv, Nq, Nk, a.n_seq, *a.scalars)
    _bwd_dkdv_kernel[kv_grid](*kv_args, **a.constexprs)
    q_grid, q_args = _dq_launch(q, k, v, do, dq, lse2, delta, variant, a)
    if bound_key is not None:
        bound = (_bwd_preprocess.bind(pre_grid, pre_args, pre_constexprs, 6),
                 _bwd_dkdv_kernel.bind(kv_grid, kv_args, a.constexprs, 14),
                 _bwd_dq_kernel.bind(q_grid, q_args, a.constexprs, 13))
        keep_bound(_BOUND, bound_key, _bound_three(*bound) if all(b is not None for b in bound) else None)
    dsinks = sinks_grad(variant.sinks, lse, delta) if variant.sinks is not None else None
    return dq, dk, dv, dsinks


class _LaunchArgs(NamedTuple):
    """What the dK/dV and dQ kernels take besides their tensors and those tensors' strides."""
    constexprs: dict
    mask: torch.Tensor  # the mask (uint8 view of a bool one), or a placeholder
    alibi: torch.Tensor
    seq_ptrs: tuple  # q_starts, q_ends, k_starts, k_ends
    n_seq: int
    tail: tuple  # the mask's, the lse's, the slopes' and the sequence bounds' strides
    scalars: tuple  # window, scales, score options, dropout, length bucket


def _launch_args(q, k, v, mask, dropout_p: float, seed: int, variant: Variant, scale: float,
                 causal_offset: int) -> _LaunchArgs:
    Hq, Nq, D = q.shape[1], q.shape[2], q.shape[3]
    Nk, Dv = k.shape[2], v.shape[3]
    kind = mask_kind(mask)
    mask_arg = (mask.view(torch.uint8) if kind == MASK_BOOL else mask) if mask is not None else q
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    *seq_ptrs, stride_seq, n_seq = seq_args(variant, q)
    (_, alibi_arg), alibi_strides, score_scalars, score_constexprs = score_args(variant, q, scale)
    score_constexprs.pop("SINKS")
    block_d, block_dv = head_tiles(D, Dv)
    constexprs = dict(GROUP=Hq // k.shape[1], HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=block_d,
                      BLOCK_DV=block_dv, MASK_KIND=kind, **score_constexprs, DROPOUT=dropout_p > 0.0,
                      PRECISION=precision_for(q.dtype))
    drop = (seed, keep_threshold(dropout_p), 1.0 / (1.0 - dropout_p) if dropout_p > 0 else 1.0)
    tail = (*mask_strides, *lse_strides(variant, Hq, Nq), *alibi_strides, stride_seq)
    scalars = (causal_offset, variant.left, variant.right, scale * LOG2E, scale, *score_scalars, *drop,
               length_bucket(Nq, Nk))
    return _LaunchArgs(constexprs, mask_arg, alibi_arg, tuple(seq_ptrs), n_seq, tail, scalars)


def _strides(variant: Variant, *tensors) -> list:
    """Each tensor's strides as the kernels take them (a packed varlen batch: no batch stride)."""
    strides = [t.stride() for t in tensors]
    return [(0, *s[1:]) for s in strides] if variant.seq >= SEQ_VARLEN else strides


def _dq_launch(q, k, v, do, dq, lse2, delta, variant: Variant, a: _LaunchArgs):
    """``_bwd_dq_kernel`` into ``dq``: (grid, args) of the launch."""
    B, Hq, Nq = q.shape[:3]
    q_grid = query_grid(variant, Nq, B, Hq, a.n_seq)
    sq, sk, sv, sdo, sdq = _strides(variant, q, k, v, do, dq)
    q_args = (q, k, v, do, dq, lse2, delta, a.mask, a.alibi, *a.seq_ptrs,
              *sq, *sk, *sv, *sdo, *sdq, *a.tail, Hq, Nq, k.shape[2], a.n_seq, *a.scalars)
    _bwd_dq_kernel[q_grid](*q_args, **a.constexprs)
    return q_grid, q_args


def attention_dq(do, q, k, v, dq, lse2, delta, *, scale: float, causal: bool, variant: Variant = PLAIN):
    """dq alone, into ``dq``, by the portable dQ kernel: one program per query tile, each element
    written once (bit-reproducible), with every score option and batch layout of ``variant``
    (``causal``: the window's right side capped at 0, bottom-right, per sequence under ranges and
    varlen). lse₂ and δ in the lse's layout, as the preprocess writes them (dense ones contiguous).
    The Gluon backward's one-writer configs take it where the Triton TMA dQ kernel (plain attention
    over a dense batch) does not reach."""
    variant = causal_window(variant, causal)
    a = _launch_args(q, k, v, None, 0.0, 0, variant, scale, k.shape[2] - q.shape[2])
    _dq_launch(q, k, v, do, dq, lse2, delta, variant, a)


def row_stats(do, o, lse, dlse):
    """(δ, lse₂), (B, Hq, Nq) float32, by the portable preprocess kernel: δ = rowsum(dO ∘ O) − dlse,
    lse₂ = lse·log2 e (+inf where lse = −inf). The Hopper and Gluon backwards read
    them, and the ring's sinks gradient."""
    B, Hq, Nq, Dv = o.shape
    lse = lse.contiguous()  # the forward's lse already is: (B, Hq, Nq) rows N apart
    if dlse is not None:
        dlse = dlse.float().contiguous()
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    pre_m = 16 if interpreter_active() else 64
    _bwd_preprocess[(cdiv(Nq, pre_m) * B * Hq,)](
        o, do, lse, dlse if dlse is not None else lse, delta, lse2, *o.stride(), *do.stride(), Hq, Nq,
        HEAD_DIM_V=Dv, BLOCK_DV=next_pow2(Dv), HAS_DLSE=dlse is not None, BLOCK_M=pre_m)
    return delta, lse2


def sinks_grad(sinks: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """∂L/∂sinks (Hq,) in the sinks' dtype from the forward's lse (sink included) and δ (dlse
    included), both in the lse's layout: d lse/d sink = P_sink = exp(sink − lse), so
    ∂L/∂sink_h = −Σ_rows of head h δ·P_sink (rows with lse = −inf give 0). The Gluon backward uses
    it too, and the CPU twin and the ring."""
    Hq = sinks.shape[0]
    lse3 = lse.reshape(-1, Hq, lse.shape[-1])
    p_sink = torch.exp(sinks.to(torch.promote_types(lse.dtype, torch.float32)).view(1, Hq, 1) - lse3)
    contrib = torch.where(torch.isfinite(lse3), -delta.reshape_as(lse3) * p_sink, torch.zeros_like(p_sink))
    return contrib.sum((0, 2)).to(sinks.dtype)

