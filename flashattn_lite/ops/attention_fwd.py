"""Attention forward: the Triton kernel and its launcher.

One program owns BLOCK_M query rows of one (batch, query head) and streams the keys/values of the
matching KV head in BLOCK_N tiles, carrying (m, ℓ, O) with ``merge.online_softmax_update``. The
N×N score matrix never exists; memory is O(N·D). Scores are kept in base 2 (scale·log2 e folded
into one multiply), the lse is written in natural log.

Causal attention, the sequence tails and user masks are handled by stages: key tiles wholly
visible to every row of the query tile run the lean unmasked body; the rest run the masked body.
Tiles wholly hidden by causality are never visited.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import allow_tf32, cdiv, interpreter_active, next_pow2, tile_and_slab, tuned
from ..dropout import dropout_keep, keep_threshold
from ..merge import LOG2E, finalize, online_softmax_update_scaled

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2


@triton.jit
def head_base(ptr, b, h, stride_b, stride_h):
    """Start of (batch b, head h) of a 4-D tensor, in 64-bit: B·H·N·D can pass 2³¹."""
    return ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def load_tile(base, rows, stride_r, n_rows, cols, stride_c, n_cols):
    """base[rows, cols] with zeros outside [0, n_rows) × [0, n_cols); 64-bit row offsets.
    ``rows``/``cols`` broadcast to the tile ([R, 1] and [1, C], or the other way for a transposed
    tile)."""
    return tl.load(base + rows.to(tl.int64) * stride_r + cols * stride_c,
                   mask=(rows < n_rows) & (cols < n_cols), other=0.0)


@triton.jit
def mask_scores(s, rows, cols, mask_base, stride_mask_m, stride_mask_n, n_q, n_k, causal_offset,
                BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """Every mask of a score tile, forward and backward alike. ``rows``/``cols`` are query/key
    indices broadcast to ``s`` ([M, 1] and [1, N], or transposed). The user mask: bool → −inf where
    False; additive → + bias·log2 e (``s`` must already be scaled then). On BOUNDARY tiles: keys
    past the end, and causal (key j hidden from query i when j > i + causal_offset)."""
    if MASK_KIND != 0:
        mptrs = mask_base + rows.to(tl.int64) * stride_mask_m + cols.to(tl.int64) * stride_mask_n
        in_bounds = (rows < n_q) & (cols < n_k)
        if MASK_KIND == 1:
            s = tl.where(tl.load(mptrs, mask=in_bounds, other=0) != 0, s, float("-inf"))
        else:
            s += tl.load(mptrs, mask=in_bounds, other=0.0).to(tl.float32) * 1.4426950408889634
    if BOUNDARY:
        visible = cols < n_k
        if IS_CAUSAL:
            visible = visible & (cols <= rows + causal_offset)
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def key_range(start_m, n_k, causal_offset, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """For the query tile starting at ``start_m``: keys [0, full) are visible to every row (full a
    multiple of BLOCK_N: the unmasked stage), keys [full, hi) to some row (the masked stage);
    keys from ``hi`` on to none, and are never visited."""
    if IS_CAUSAL:
        hi = tl.minimum(n_k, tl.maximum(start_m + BLOCK_M + causal_offset, 0))
        full = tl.minimum(hi, tl.maximum(start_m + causal_offset + 1, 0))
    else:
        hi = n_k
        full = n_k
    return (full // BLOCK_N) * BLOCK_N, hi


@triton.jit
def query_tile(n_q, n_heads, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's query tile: (start_m, bh, b, h, h_kv). Tiles of the last query rows, the
    heaviest under causal masking, are scheduled first."""
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    tile, bh = tile_and_slab(n_tiles)
    h = bh % n_heads
    return (n_tiles - 1 - tile) * BLOCK_M, bh, bh // n_heads, h, h // GROUP


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, k_base, v_base, mask_base, start_n,
              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
              stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
              seed, drop_base, drop_threshold,
              BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
              DROPOUT: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, PRECISION: tl.constexpr,
              POS_SCALE: tl.constexpr):
    """One key/value tile folded into the running state. BOUNDARY switches on the causal and
    sequence-end masks; the unmasked body is what long sequences spend their time in."""
    cols = start_n + offs_n
    # The tile's first row in 64-bit (row · stride passes 2³¹ at long N), offsets inside it in 32-bit.
    k_ptrs = k_base + tl.cast(start_n, tl.int64) * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_base + tl.cast(start_n, tl.int64) * stride_vn + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    if BOUNDARY:
        k = tl.load(k_ptrs, mask=(cols[None, :] < n_k) & (offs_d[:, None] < HEAD_DIM), other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
    s = tl.dot(q, k, input_precision=PRECISION)
    if MASK_KIND == 2 or not POS_SCALE:
        s = s * qk_scale  # scale applied up front; otherwise it is folded into the exponent below
    s = mask_scores(s, offs_m[:, None], cols[None, :], mask_base, stride_mask_m, stride_mask_n, n_q, n_k,
                    causal_offset, BOUNDARY, IS_CAUSAL, MASK_KIND)
    if MASK_KIND == 2 or not POS_SCALE:
        m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, s, 1.0)
    else:
        m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, s, qk_scale)
    acc = acc * alpha[:, None]
    if DROPOUT:
        keep = dropout_keep(seed, drop_base + offs_m[:, None].to(tl.int64) * n_k + cols[None, :], drop_threshold)
        p = tl.where(keep, p, 0.0)
    if BOUNDARY:
        v = tl.load(v_ptrs, mask=(cols[:, None] < n_k) & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    elif EVEN_DV:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, m_i, l_i


def _fwd_configs():
    configs = []
    for bm, bn, warps, stages in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4),
                                  (64, 64, 4, 3), (64, 32, 4, 4), (128, 128, 8, 2), (64, 128, 4, 3),
                                  (64, 32, 4, 2), (32, 32, 4, 2)]:
        configs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages))
    return configs


def _fits(bm: int, bn: int, warps: int, stages: int, d: int, dv: int, itemsize: int) -> bool:
    """Rough Hopper budget: K/V stages plus the Q tile in shared memory (≤ 200 KB), and the
    fp32 accumulator plus one score tile per thread in registers (≤ ~160 floats)."""
    smem = stages * bn * (d + dv) * itemsize + bm * d * itemsize
    regs = (bm * dv + bm * bn) / (warps * 32)
    return smem <= 200 * 1024 and regs <= 160


def _prune_configs(configs, named_args):
    d = next_pow2(named_args["HEAD_DIM"])
    dv = next_pow2(named_args["HEAD_DIM_V"])
    itemsize = named_args["q"].element_size()
    return [c for c in configs if _fits(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages,
                                        d, dv, itemsize)]


@tuned(_fwd_configs(), key=["HEAD_DIM", "HEAD_DIM_V", "IS_CAUSAL", "MASK_KIND", "DROPOUT", "n_bucket"],
       interpreter_config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1),
       prune=_prune_configs)
@triton.jit
def _attn_fwd_kernel(q, k, v, o, lse, mask,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                     n_heads, n_q, n_k, causal_offset, qk_scale, seed, drop_threshold, drop_scale, n_bucket,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                     PRECISION: tl.constexpr, POS_SCALE: tl.constexpr, STORE_LSE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh, b, h, h_kv = query_tile(n_q, n_heads, GROUP, BLOCK_M)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    EVEN_DV: tl.constexpr = HEAD_DIM_V == BLOCK_DV

    k_base = head_base(k, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v, b, h_kv, stride_vb, stride_vh)
    mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
    q_tile = load_tile(head_base(q, b, h, stride_qb, stride_qh), offs_m[:, None], stride_qm, n_q,
                       offs_d[None, :], stride_qd, HEAD_DIM)
    drop_base = bh.to(tl.int64) * n_q * n_k

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    full, hi = key_range(start_m, n_k, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)
    for start_n in tl.range(0, full, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_tile, k_base, v_base, mask_base, start_n,
                                  offs_m, offs_n, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
                                  seed, drop_base, drop_threshold,
                                  False, IS_CAUSAL, MASK_KIND, DROPOUT, EVEN_D, EVEN_DV,
                                  HEAD_DIM, HEAD_DIM_V, PRECISION, POS_SCALE)
    for start_n in tl.range(full, hi, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_tile, k_base, v_base, mask_base, start_n,
                                  offs_m, offs_n, offs_d, offs_dv, n_q, n_k, causal_offset, qk_scale,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
                                  seed, drop_base, drop_threshold,
                                  True, IS_CAUSAL, MASK_KIND, DROPOUT, EVEN_D, EVEN_DV,
                                  HEAD_DIM, HEAD_DIM_V, PRECISION, POS_SCALE)

    out, lse_row = finalize(acc, m_i, l_i)
    if DROPOUT:
        out = out * drop_scale  # kept probabilities are divided by 1 − p
    row_ok = offs_m < n_q
    o_ptrs = (head_base(o, b, h, stride_ob, stride_oh)
              + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    if STORE_LSE:  # False when nothing reads it (no backward, no return_lse): ``lse`` is then a placeholder
        tl.store(lse + bh.to(tl.int64) * n_q + offs_m, lse_row, mask=row_ok)


def length_bucket(n_q: int, n_k: int) -> int:
    """Autotuning key for sequence length: powers of two up to 8192, one bucket beyond. The best
    tiles stop changing once the grid fills the GPU, and re-tuning at every length of a 1M-token
    sweep would cost minutes of timing runs at each new size."""
    return 0 if interpreter_active() else min(next_pow2(max(n_q, n_k)), 8192)


def precision_for(dtype: torch.dtype) -> str:
    """tl.dot precision: fp32 inputs use TF32 only where torch allows it."""
    if dtype == torch.float32 and not allow_tf32():
        return "ieee"
    return "tf32"


def mask_kind(mask: torch.Tensor | None) -> int:
    if mask is None:
        return MASK_NONE
    return MASK_BOOL if mask.dtype == torch.bool else MASK_ADD


# Bound launches of the forward kernel for mask-free, dropout-free calls, keyed by what their
# arguments depend on (``_plain_signature``): a repeated call skips the argument walk.
_BOUND: dict = {}
_BOUND_ENTRIES = 256


def _plain_signature(q, k, v, causal, causal_offset, scale, need_lse):
    tf32 = q.dtype == torch.float32 and allow_tf32()
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, causal,
            causal_offset, scale, tf32, need_lse)


def attention_forward(q, k, v, *, scale: float, causal: bool, causal_offset: int,
                      mask: torch.Tensor | None, dropout_p: float, seed: int, need_lse: bool = True):
    """Launch the forward kernel. Inputs already validated; mask is (B, Hq, Nq, Nk)-shaped
    (broadcast dims with stride 0). Returns o (B, Hq, Nq, Dv) in q's dtype and lse (B, Hq, Nq) fp32,
    or None for lse with ``need_lse=False`` (nothing allocated or stored: no-grad inference).

    This runs on every call: at small shapes its host time is the call's time, so it stays lean
    (no per-call imports, and a bound launch for repeated plain calls)."""
    B, Hq, Nq, D = q.shape
    Dv = v.shape[3]
    # Contiguous outputs (the fake implementation's strides); empty_like and empty_strided parse
    # fewer arguments than torch.empty (3.4 / 3.9 µs against 5.7 µs a call on the H100's host).
    if Dv == D:
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        o = torch.empty_strided((B, Hq, Nq, Dv), (Hq * Nq * Dv, Nq * Dv, Dv, 1), device=q.device, dtype=q.dtype)
    if need_lse:
        lse = lse_arg = torch.empty_strided((B, Hq, Nq), (Hq * Nq, Nq, 1), device=q.device, dtype=torch.float32)
    else:
        lse, lse_arg = None, q  # never written: STORE_LSE is False
    plain = mask is None and dropout_p == 0.0 and _attn_fwd_kernel.enabled
    if plain:
        signature = _plain_signature(q, k, v, causal, causal_offset, scale, need_lse)
        bound = _BOUND.get(signature)
        if bound is not None and bound(q, k, v, o, lse_arg, q):
            return o, lse
    _, Hkv, Nk, _ = k.shape
    if mask is None:
        kind, mask_arg, mask_strides = MASK_NONE, q, (0, 0, 0, 0)  # q is never read: MASK_KIND == 0
    else:
        kind = mask_kind(mask)
        mask_arg = mask.view(torch.uint8) if kind == MASK_BOOL else mask
        mask_strides = mask.stride()
    dropout = dropout_p > 0.0
    args = (q, k, v, o, lse_arg, mask_arg,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(), *mask_strides,
            Hq, Nq, Nk, causal_offset, scale * LOG2E, seed, keep_threshold(dropout_p) if dropout else 0,
            1.0 / (1.0 - dropout_p), length_bucket(Nq, Nk))
    constexprs = dict(GROUP=Hq // Hkv, HEAD_DIM=D, HEAD_DIM_V=Dv,
                      BLOCK_D=max(16, next_pow2(D)), BLOCK_DV=max(16, next_pow2(Dv)),
                      IS_CAUSAL=causal, MASK_KIND=kind, DROPOUT=dropout, PRECISION=precision_for(q.dtype),
                      POS_SCALE=scale > 0, STORE_LSE=need_lse)
    grid = lambda meta: (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,)
    _attn_fwd_kernel[grid](*args, **constexprs)
    if plain:
        if len(_BOUND) >= _BOUND_ENTRIES:
            _BOUND.clear()
        bound = _attn_fwd_kernel.bind(grid, args, constexprs, 6)
        if bound is not None:
            _BOUND[signature] = bound
    return o, lse
