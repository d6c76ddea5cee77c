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

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .._launcher import BOUND_ENTRIES, keep_bound
from .._log import note_path
from .._runtime import allow_tf32, cdiv, interpreter_active, next_pow2, tile_and_slab, tuned
from ..dropout import dropout_keep, keep_threshold
from ..merge import LOG2E, add_sink, finalize, online_softmax_update_scaled

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
# How the batch is laid out: dense (B, H, N, D); padded dense with one valid [start, end) range per
# batch row (``q_ranges``/``k_ranges``); packed varlen (1, H, total, D) with cu_seqlens, the grid sized
# from the totals (no max length needed: see ``varlen_tile``).
SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN = 0, 1, 2


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
def tanh(x, FAST: tl.constexpr):
    """tanh in float32. FAST: the hardware approximation (``tanh.approx.f32``, one MUFU op, relative
    error ~2⁻¹¹, what FlashAttention's softcap uses) for 16-bit inputs; otherwise a relative error
    of at most 2.3 float32 ulps over the whole range (H200: every float32 in [1/8, 2), samples
    elsewhere; 0.53 below 1/8; 2.0 in the interpreter), ±inf → ±1, NaN → NaN; no inline asm
    (the interpreter runs none)."""
    if FAST:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        e = tl.math.exp2(-2.8853900817779268 * tl.abs(x))  # exp(−2|x|)
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(x < 0, -t, t)
        # 1 − e cancels as |x| shrinks: e's rounding becomes ~2⁻²⁶/|x| of t (4–7 ulps at 1/8,
        # hundreds at 1e-3, all of t below 3e-8). Below 0.55, where t < 1/2 (above, the form is
        # within ~2 ulps), an odd minimax polynomial of degree 11 takes over: 1e-9 relative,
        # within 1 ulp as evaluated. Both are computed, a select picks one.
        x2 = x * x
        p = -0.0062729237 * x2 + 0.021070745
        p = p * x2 - 0.053852085
        p = p * x2 + 0.13332585
        p = p * x2 - 0.33333316
        return tl.where(tl.abs(x) < 0.55, x + x * (x2 * p), t)


@triton.jit
def mask_scores(s, rows, cols, mask_base, stride_mask_m, stride_mask_n, n_q, n_k, off, win_left, win_right,
                BOUNDARY: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                MASK_KIND: tl.constexpr):
    """Every mask of a score tile, forward and backward alike. ``rows``/``cols`` are query/key
    indices broadcast to ``s`` ([M, 1] and [1, N], or transposed). The user mask: bool → −inf where
    False; additive → + bias·log2 e (``s`` must already be scaled then). On BOUNDARY tiles: keys
    past the end, and the window: key j visible to query i iff
    i + off − win_left ≤ j ≤ i + off + win_right (causal is the right side at 0)."""
    if MASK_KIND != 0:
        mptrs = mask_base + rows.to(tl.int64) * stride_mask_m + cols.to(tl.int64) * stride_mask_n
        in_bounds = (rows < n_q) & (cols < n_k)
        if MASK_KIND == 1:
            s = tl.where(tl.load(mptrs, mask=in_bounds, other=0) != 0, s, float("-inf"))
        else:
            s += tl.load(mptrs, mask=in_bounds, other=0.0).to(tl.float32) * 1.4426950408889634
    if BOUNDARY:
        visible = cols < n_k
        if HAS_LEFT:
            visible = visible & (cols >= rows + off - win_left)
        if HAS_RIGHT:
            visible = visible & (cols <= rows + off + win_right)
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def fold_factor(qk, qk_scale, softcap_scale, softcap2, SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr):
    """(x, factor) with base-2 score = x·factor, for scores with masks only (no bias): −inf
    survives a positive factor, so the caller folds it into the exponent's FMA. The factor is the
    scale·log2 e, or with softcap c·log2 e after x = tanh(qk·scale/c)."""
    if SOFTCAP:
        x = tanh(qk * softcap_scale, FAST_TANH)
        factor = softcap2
    else:
        x = qk
        factor = qk_scale
    return x, factor


@triton.jit
def score_tile(qk, rows, cols, mask_base, stride_mask_m, stride_mask_n, n_q, n_k, off, win_left, win_right,
               qk_scale, softcap_scale, softcap2, slope2,
               BOUNDARY: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               MASK_KIND: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FAST_TANH: tl.constexpr):
    """Base-2 scores of a tile from the raw products ``qk``, in the reference's order: scale,
    softcap (c·tanh(s/c): ``softcap_scale`` = scale/c, ``softcap2`` = c·log2 e), ALiBi
    (− slope·|i + off − j|, ``slope2`` = slope·log2 e), the user mask, the window. Returns
    (s, t) with t = tanh(·) for the softcap's gradient (``qk`` itself without softcap)."""
    if SOFTCAP:
        t = tanh(qk * softcap_scale, FAST_TANH)
        s = t * softcap2
    else:
        t = qk
        s = qk * qk_scale
    if ALIBI:
        s -= slope2 * tl.abs(rows + off - cols).to(tl.float32)
    s = mask_scores(s, rows, cols, mask_base, stride_mask_m, stride_mask_n, n_q, n_k, off, win_left, win_right,
                    BOUNDARY, HAS_LEFT, HAS_RIGHT, MASK_KIND)
    return s, t


@triton.jit
def key_range(start_m, n_k, off, win_left, win_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query tile starting at ``start_m``: (lo, mid_lo, mid_hi, hi). Keys [mid_lo, mid_hi)
    (whole tiles) are visible to every row of the tile: the unmasked stage. Keys [lo, mid_lo) and
    [mid_hi, hi) are visible to some row: the masked stage. Keys outside [lo, hi) are visible to no
    row and are never visited, so a window of W keys costs O(W) per row."""
    last = start_m + BLOCK_M - 1
    lo = 0
    full_lo = 0
    hi = n_k
    full_hi = n_k
    if HAS_LEFT:
        lo = tl.maximum(start_m + off - win_left, 0)
        full_lo = tl.maximum(last + off - win_left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(tl.maximum(last + off + win_right + 1, 0), n_k)
        full_hi = tl.minimum(tl.maximum(start_m + off + win_right + 1, 0), n_k)
    lo = (tl.minimum(lo, hi) // BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, hi)
    mid_hi = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def query_tile(n_q, n_heads, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's query tile: (start_m, bh, b, h, h_kv). Tiles of the last query rows, the
    heaviest under causal masking, are scheduled first."""
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    tile, bh = tile_and_slab(n_tiles)
    h = bh % n_heads
    return (n_tiles - 1 - tile) * BLOCK_M, bh, bh // n_heads, h, h // GROUP


@triton.jit
def seq_bounds(first, end, total):
    """(first row, length) of a sequence whose bounds were read as [first, end), clamped into the
    tensor's rows: 0 ≤ first ≤ end ≤ total. Valid bounds pass unchanged; unchecked bad ones
    (``check_seqlens=False``: past the total, below 0, going back) never make a kernel read or write
    outside the tensors (they segfaulted the interpreter)."""
    first = tl.minimum(tl.maximum(first, 0), total)
    return first, tl.minimum(tl.maximum(end, first), total) - first


@triton.jit
def varlen_tile(starts, ends, n_seq, total, t, BLOCK: tl.constexpr, SCAN: tl.constexpr = 64):
    """Tile slot ``t`` of a packed batch whose sequence b spans [starts[b], ends[b]) (cu_seqlens):
    returns (b, first row of the tile in sequence b); a slot past the last tile gives b = n_seq.
    Each sequence is read clamped into the ``total`` rows of the packed tensor (``seq_bounds``).
    Slots count the sequences' tiles in order, each sequence's last (under causal, heaviest) tile
    first. The grid is sized from the totals alone, cdiv(total, BLOCK) + B slots bounding the sum of
    per-sequence tile counts: no max length, so no device→host sync and no recompile per batch.
    (Measured on the H100, 2026-11-24, ``flashattn-lite variants``: as fast as a grid sized from
    the max lengths at one sequence, 13% faster on 22 mixed ones, where that grid idles.)"""
    b = 0
    before = 0  # tiles of the sequences before b
    own = 0     # tiles of sequence b
    seen = 0    # tiles of every sequence in the chunks scanned so far
    for c in range(0, n_seq, SCAN):
        idx = c + tl.arange(0, SCAN)
        ok = idx < n_seq
        _, n = seq_bounds(tl.load(starts + idx, mask=ok, other=0), tl.load(ends + idx, mask=ok, other=0), total)
        tiles = tl.where(ok, tl.cdiv(n, BLOCK), 0)
        ends_t = tl.cumsum(tiles, 0) + seen  # where each sequence's tiles end, over the whole batch
        done = (ends_t <= t) & ok
        b += tl.sum(done.to(tl.int32), 0)
        own += tl.sum(tl.where(ok & ~done & (ends_t - tiles <= t), tiles, 0), 0)
        before += tl.sum(tl.where(done, tiles, 0), 0)
        seen += tl.sum(tiles, 0)
    return b, tl.where(own > 0, own - 1 - (t - before), 0) * BLOCK  # past the last tile: 0 (an empty program)


@triton.jit
def varlen_slot(pid, n_programs, n_heads, HEADS_FASTEST: tl.constexpr = False):
    """(head, slot) of program ``pid`` of a varlen grid of n_programs = slots · ``n_heads``: one head's
    slots after another, so the programs running at once read one head's rows (in L2), as the dense
    grids' head-major order has them. ``HEADS_FASTEST``: every head of a slot together."""
    if HEADS_FASTEST:
        return pid % n_heads, pid // n_heads
    n_slots = n_programs // n_heads
    return pid // n_slots, pid % n_slots


@triton.jit
def varlen_scan(starts, ends, n_seq, total, t, lanes, BLOCK: tl.constexpr, stride=1):
    """``varlen_tile`` with the chunk's lanes (0 … SCAN − 1) passed in: the Gluon forward passes
    them in a layout of its own (a Gluon arange needs one). The same scan, written out twice: the
    portable kernel calling this one compiles to other PTX (the arange hoisted out of the loop),
    and its PTX is kept as it ran on the GPU (``benchmarks/ptx_hashes.py``); the tests run both
    against brute force. ``stride``: the bounds' step (2: per-row ranges, ``seq_args``)."""
    SCAN: tl.constexpr = lanes.shape[0]
    b = 0
    before = 0  # tiles of the sequences before b
    own = 0     # tiles of sequence b
    seen = 0    # tiles of every sequence in the chunks scanned so far
    for c in range(0, n_seq, SCAN):
        idx = c + lanes
        ok = idx < n_seq
        first, end = tl.load(starts + idx * stride, mask=ok, other=0), tl.load(ends + idx * stride, mask=ok, other=0)
        _, n = seq_bounds(first, end, total)
        tiles = tl.where(ok, tl.cdiv(n, BLOCK), 0)
        ends_t = tl.cumsum(tiles, 0) + seen  # where each sequence's tiles end, over the whole batch
        done = (ends_t <= t) & ok
        b += tl.sum(done.to(tl.int32), 0)
        own += tl.sum(tl.where(ok & ~done & (ends_t - tiles <= t), tiles, 0), 0)
        before += tl.sum(tl.where(done, tiles, 0), 0)
        seen += tl.sum(tiles, 0)
    return b, tl.where(own > 0, own - 1 - (t - before), 0) * BLOCK  # past the last tile: 0 (an empty program)


@triton.jit
def sequence(pid_b, n_q, n_k, q_starts, q_ends, k_starts, k_ends, stride_seq, off, SEQ: tl.constexpr):
    """(q0, n_q, k0, n_k, off) of batch row ``pid_b``: its first query and key row, its lengths and
    diagonal offset. Dense: the whole tensor, ``off`` as given. Ranges and varlen: read from the
    per-sequence bounds, bottom-right aligned per sequence."""
    if SEQ == 0:
        return 0, n_q, 0, n_k, off
    else:
        q0, n_q_b = seq_bounds(tl.load(q_starts + pid_b * stride_seq), tl.load(q_ends + pid_b * stride_seq), n_q)
        k0, n_k_b = seq_bounds(tl.load(k_starts + pid_b * stride_seq), tl.load(k_ends + pid_b * stride_seq), n_k)
        return q0, n_q_b, k0, n_k_b, n_k_b - n_q_b


@triton.jit
def varlen_program(starts, ends, n_seq, total, n_heads, BLOCK: tl.constexpr):
    """A varlen program's head, sequence and tile start (``varlen_tile`` over slot pid // n_heads),
    and whether its slot holds a tile: a slot past the last tile takes the last sequence, which the
    caller then gives no rows."""
    pid = tl.program_id(0)
    h = pid % n_heads
    b, start = varlen_tile(starts, ends, n_seq, total, pid // n_heads, BLOCK)
    live = b < n_seq
    return h, tl.minimum(b, n_seq - 1), start, live


@triton.jit
def query_program(n_q, n_k, n_heads, n_seq, q_starts, q_ends, k_starts, k_ends, stride_seq, off,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, SEQ: tl.constexpr):
    """This query-tile program's (start_m, b, h, h_kv) and its sequence's (q0, n_q, k0, n_k, off), as
    ``sequence`` gives them. Varlen: the tile slot by ``varlen_tile``; a slot past the last tile takes
    the last sequence with no query row (n_q = 0), so it visits no key and stores nothing."""
    if SEQ == 2:
        h, b, start_m, live = varlen_program(q_starts, q_ends, n_seq, n_q, n_heads, BLOCK_M)
        h_kv = h // GROUP
    else:
        start_m, _, b, h, h_kv = query_tile(n_q, n_heads, GROUP, BLOCK_M)
    q0, n_q, k0, n_k, off = sequence(b, n_q, n_k, q_starts, q_ends, k_starts, k_ends, stride_seq, off, SEQ)
    if SEQ == 2:
        n_q = tl.where(live, n_q, 0)
    return start_m, b, h, h_kv, q0, n_q, k0, n_k, off


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, k_base, v_base, mask_base, start_n,
              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale,
              softcap_scale, softcap2, slope2,
              stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
              seed, drop_base, drop_threshold,
              BOUNDARY: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FAST_TANH: tl.constexpr,
              DROPOUT: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, PRECISION: tl.constexpr,
              FOLD_SCALE: tl.constexpr):
    """One key/value tile folded into the running state. BOUNDARY switches on the window and
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
    qk = tl.dot(q, k, input_precision=PRECISION)
    if FOLD_SCALE:
        x, fold = fold_factor(qk, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
        s = mask_scores(x, offs_m[:, None], cols[None, :], mask_base, stride_mask_m, stride_mask_n, n_q, n_k,
                        off, win_left, win_right, BOUNDARY, HAS_LEFT, HAS_RIGHT, MASK_KIND)
        m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, s, fold)
    else:
        s, _ = score_tile(qk, offs_m[:, None], cols[None, :], mask_base, stride_mask_m, stride_mask_n, n_q, n_k,
                          off, win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                          BOUNDARY, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH)
        m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, s, 1.0)
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


# Lengths, offsets, the lse's strides (its rows are N apart), the dropout seed and the head count
# change from call to call (the head count between models, or between warmup's dummy call and the
# model's): specialising on them (Triton's "== 1" and "divisible by 16") would compile a new binary
# for a new length or head count and pays nothing here (no load is vectorised along them). q/k/v
# strides stay specialised: N·D is divisible by 16 for the usual head dims at every N, and their
# divisibility is what lets tile rows load as vectors.
NOT_SPECIALIZED = ["n_q", "n_k", "n_seq", "off", "win_left", "win_right", "seed", "drop_threshold", "n_bucket",
                   "stride_lse_b", "stride_lse_h", "n_heads", "n_kv_heads"]


def _fwd_configs():
    configs = []
    for bm, bn, warps, stages in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4),
                                  (64, 64, 4, 3), (64, 32, 4, 4), (128, 128, 8, 2), (64, 128, 4, 3),
                                  (64, 32, 4, 2), (32, 32, 4, 2)]:
        configs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages))
    return configs


def _fits(bm: int, bn: int, warps: int, stages: int, d: int, dv: int, itemsize: int) -> bool:
    """Rough Hopper budget: K/V stages plus the Q tile in shared memory (≤ 200 KB), and the
    fp32 accumulator plus one score tile per thread in registers (≤ ~160 floats). fp32 inputs
    multiply on CUDA cores with the Q tile held in registers too: without counting it, d 128
    picked a 128-row tile whose kernels spilled and compiled for minutes."""
    smem = stages * bn * (d + dv) * itemsize + bm * d * itemsize
    regs = (bm * dv + bm * bn + (bm * d if itemsize == 4 else 0)) / (warps * 32)
    return smem <= 200 * 1024 and regs <= 160


def _prune_configs(configs, named_args):
    d = next_pow2(named_args["HEAD_DIM"])
    dv = next_pow2(named_args["HEAD_DIM_V"])
    itemsize = named_args["q"].element_size()
    return [c for c in configs if _fits(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages,
                                        d, dv, itemsize)]


@tuned(_fwd_configs(), key=["HEAD_DIM", "HEAD_DIM_V", "HAS_LEFT", "HAS_RIGHT", "MASK_KIND", "SOFTCAP", "ALIBI",
                            "SINKS", "SEQ", "DROPOUT", "n_bucket"],
       interpreter_config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1),
       prune=_prune_configs, length="n_bucket")
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _attn_fwd_kernel(q, k, v, o, lse, mask, sinks, alibi, q_starts, q_ends, k_starts, k_ends,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_mask_b, stride_mask_h, stride_mask_m, stride_mask_n,
                     stride_lse_b, stride_lse_h, stride_alibi_b, stride_alibi_h, stride_seq,
                     n_heads, n_q, n_k, n_seq, off, win_left, win_right, qk_scale, softcap_scale, softcap2,
                     seed, drop_threshold, drop_scale, n_bucket,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
                     SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr, SEQ: tl.constexpr,
                     FAST_TANH: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                     FOLD_SCALE: tl.constexpr, STORE_LSE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, b, h, h_kv, q0, n_q, k0, n_k, off = query_program(n_q, n_k, n_heads, n_seq, q_starts, q_ends, k_starts,
                                                               k_ends, stride_seq, off, GROUP, BLOCK_M, SEQ)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    EVEN_DV: tl.constexpr = HEAD_DIM_V == BLOCK_DV

    q_base = head_base(q, b, h, stride_qb, stride_qh)
    k_base = head_base(k, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v, b, h_kv, stride_vb, stride_vh)
    o_base = head_base(o, b, h, stride_ob, stride_oh)
    lse_base = lse + b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h
    if SEQ != 0:  # the sequence's first rows
        q_base += q0.to(tl.int64) * stride_qm
        k_base += k0.to(tl.int64) * stride_kn
        v_base += k0.to(tl.int64) * stride_vn
        o_base += q0.to(tl.int64) * stride_om
        lse_base += q0
    mask_base = head_base(mask, b, h, stride_mask_b, stride_mask_h)
    q_tile = load_tile(q_base, offs_m[:, None], stride_qm, n_q, offs_d[None, :], stride_qd, HEAD_DIM)
    drop_base = (b * n_heads + h).to(tl.int64) * n_q * n_k
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(alibi + b.to(tl.int64) * stride_alibi_b + h * stride_alibi_h).to(tl.float32) * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # A tile past its sequence's end (ranges, varlen) visits no key.
    n_k_visit = tl.where(start_m < n_q, n_k, 0)
    lo, mid_lo, mid_hi, hi = key_range(start_m, n_k_visit, off, win_left, win_right, HAS_LEFT, HAS_RIGHT,
                                       BLOCK_M, BLOCK_N)
    if HAS_LEFT:  # without a left side the range is empty: no code for it
        for start_n in tl.range(lo, mid_lo, BLOCK_N):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_tile, k_base, v_base, mask_base, start_n,
                                      offs_m, offs_n, offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale,
                                      softcap_scale, softcap2, slope2,
                                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
                                      seed, drop_base, drop_threshold,
                                      True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                      EVEN_D, EVEN_DV, HEAD_DIM, HEAD_DIM_V, PRECISION, FOLD_SCALE)
    for start_n in tl.range(mid_lo, mid_hi, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_tile, k_base, v_base, mask_base, start_n,
                                  offs_m, offs_n, offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale,
                                  softcap_scale, softcap2, slope2,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
                                  seed, drop_base, drop_threshold,
                                  False, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                  EVEN_D, EVEN_DV, HEAD_DIM, HEAD_DIM_V, PRECISION, FOLD_SCALE)
    for start_n in tl.range(mid_hi, hi, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_tile, k_base, v_base, mask_base, start_n,
                                  offs_m, offs_n, offs_d, offs_dv, n_q, n_k, off, win_left, win_right, qk_scale,
                                  softcap_scale, softcap2, slope2,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_mask_m, stride_mask_n,
                                  seed, drop_base, drop_threshold,
                                  True, HAS_LEFT, HAS_RIGHT, MASK_KIND, SOFTCAP, ALIBI, FAST_TANH, DROPOUT,
                                  EVEN_D, EVEN_DV, HEAD_DIM, HEAD_DIM_V, PRECISION, FOLD_SCALE)

    if SINKS:  # one more term exp(sink) in the denominator, with no value
        m_i, l_i, acc = add_sink(m_i, l_i, acc, tl.load(sinks + h).to(tl.float32) * 1.4426950408889634)
    out, lse_row = finalize(acc, m_i, l_i)
    if DROPOUT:
        out = out * drop_scale  # kept probabilities are divided by 1 − p
    row_ok = offs_m < n_q
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    if STORE_LSE:  # False when nothing reads it (no backward, no return_lse): ``lse`` is then a placeholder
        tl.store(lse_base + offs_m, lse_row, mask=row_ok)


def head_tiles(D: int, Dv: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DV) of the attention kernels: powers of two ≥ 16. A value tile much narrower
    than the key tile (BLOCK_D 64, BLOCK_DV 32: D 40, Dv 24) makes triton 3.6 emit an out-of-bounds
    shared-memory read in the forward (compute-sanitizer memcheck, H100, 2026-11-24), so the value
    tile is padded to min(64, BLOCK_D): masked lanes, nothing else."""
    block_d = max(16, next_pow2(D))
    return block_d, max(16, next_pow2(Dv), min(64, block_d))


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


_PTX = torch.version.hip is None  # inline PTX (the fast tanh) only where the backend is NVIDIA's


class Variant(NamedTuple):
    """What a call asks of the scores beyond plain attention, and how its batch is laid out, as
    the launchers take it. Tensors for varlen calls arrive viewed as (1, H, total, D)."""
    left: int = -1          # window sides in keys, −1 = unbounded (causal is right = 0)
    right: int = -1
    softcap: float = 0.0    # 0: none
    alibi: Optional[torch.Tensor] = None   # (Hq,) or (B, Hq) slopes, float32
    sinks: Optional[torch.Tensor] = None   # (Hq,) logits
    seq: int = SEQ_DENSE
    seq_q: Optional[torch.Tensor] = None   # int32: (B, 2) [start, end) ranges, or (B+1,) cu_seqlens
    seq_k: Optional[torch.Tensor] = None


PLAIN = Variant()


def causal_window(variant: Variant, causal: bool) -> Variant:
    """Causal attention is the window's right side capped at 0."""
    if not causal:
        return variant
    return variant._replace(right=0 if variant.right < 0 else min(variant.right, 0))


def seq_args(variant: Variant, placeholder: torch.Tensor):
    """(q_starts, q_ends, k_starts, k_ends, stride, n_seq) for the kernels: views into the ranges
    or cu_seqlens, no copies."""
    if variant.seq == SEQ_DENSE:
        return placeholder, placeholder, placeholder, placeholder, 0, 0
    if variant.seq == SEQ_RANGES:
        sq, sk = variant.seq_q, variant.seq_k
        return sq[:, 0], sq[:, 1], sk[:, 0], sk[:, 1], 2, sq.shape[0]
    cq, ck = variant.seq_q, variant.seq_k
    return cq[:-1], cq[1:], ck[:-1], ck[1:], 1, cq.shape[0] - 1


def score_tensors(variant: Variant, placeholder: torch.Tensor):
    """(sinks, ALiBi slopes) as the kernels take them: the placeholder where absent."""
    return (placeholder if variant.sinks is None else variant.sinks,
            placeholder if variant.alibi is None else variant.alibi)


def score_args(variant: Variant, q: torch.Tensor, scale: float):
    """The score options as the kernels take them: (tensors, scalars, constexprs)."""
    alibi, sinks = variant.alibi, variant.sinks
    cap = variant.softcap
    alibi_strides = (0, 0)
    if alibi is not None:
        alibi_strides = (0, alibi.stride(0)) if alibi.dim() == 1 else alibi.stride()
    # The kernels read sinks[h] and the sequence bounds at unit steps: ``_variant`` made them contiguous.
    tensors = score_tensors(variant, q)
    scalars = (scale / cap if cap else 0.0, cap * LOG2E)
    constexprs = dict(HAS_LEFT=variant.left >= 0, HAS_RIGHT=variant.right >= 0, SOFTCAP=cap > 0,
                      ALIBI=alibi is not None, SINKS=sinks is not None, SEQ=variant.seq,
                      FAST_TANH=cap > 0 and q.dtype != torch.float32 and _PTX and not interpreter_active())
    return tensors, alibi_strides, scalars, constexprs


def dense_output(q: torch.Tensor, Dv: int) -> torch.Tensor:
    """o's buffer for a dense batch: in q's layout where v's head dim is q's (``torch.empty_like``:
    a model's (B, N, H, D) projection seen as (B, H, N, D) gives o in (B, N, H, D) storage, as
    torch's flash SDPA returns it, so the model's transpose back to (B, N, H·D) is no copy), else
    contiguous. The custom op's fake allocates by this rule too: compiled graphs see the real
    strides. (empty_like and empty_strided parse fewer arguments than torch.empty: 3.4 / 3.9 µs
    against 5.7 µs a call on the H100's host.)"""
    if Dv == q.shape[3]:
        return torch.empty_like(q)
    B, Hq, Nq, _ = q.shape
    return torch.empty_strided((B, Hq, Nq, Dv), (Hq * Nq * Dv, Nq * Dv, Dv, 1), device=q.device, dtype=q.dtype)


def output_buffers(q, Dv: int, variant: Variant, need_lse: bool):
    """o (B, Hq, Nq, Dv) and lse (B, Hq, Nq), or for varlen o viewed from (total, Hq, Dv) and lse
    (Hq, total) viewed as (1, Hq, total). Rows no program writes (padding of a ranges call) are
    0 and −inf."""
    B, Hq, Nq, D = q.shape
    if variant.seq >= SEQ_VARLEN:
        o = torch.empty((Nq, Hq, Dv), device=q.device, dtype=q.dtype).transpose(0, 1).unsqueeze(0)
    elif variant.seq == SEQ_RANGES:
        o = torch.zeros((B, Hq, Nq, Dv), device=q.device, dtype=q.dtype)
    else:
        o = dense_output(q, Dv)
    if not need_lse:
        return o, None
    if variant.seq == SEQ_RANGES:
        return o, torch.full((B, Hq, Nq), float("-inf"), device=q.device, dtype=torch.float32)
    return o, torch.empty_strided((B, Hq, Nq), (Hq * Nq, Nq, 1), device=q.device, dtype=torch.float32)


def lse_strides(variant: Variant, Hq: int, Nq: int):
    """(batch, head) strides of the lse: varlen rows of every sequence share one (Hq, total) plane."""
    return (0, Nq) if variant.seq >= SEQ_VARLEN else (Hq * Nq, Nq)


def query_grid(variant: Variant, n_q: int, batch: int, n_heads: int, n_seq: int):
    """Programs over query tiles: tiles × batch × heads, or for varlen cdiv(total, BLOCK_M) +
    sequences tile slots per head (see ``varlen_tile``)."""
    if variant.seq == SEQ_VARLEN:
        return lambda meta: ((cdiv(n_q, meta["BLOCK_M"]) + n_seq) * n_heads,)
    return lambda meta: (cdiv(n_q, meta["BLOCK_M"]) * batch * n_heads,)


# Bound launches of the forward kernel for calls without a mask or dropout, keyed by what their
# arguments depend on (``_plain_signature``, and a variant's ``_variant_signature``): a repeated call
# skips the argument walk. The tensors: q, k, v, o, lse, the mask's placeholder, the score options'
# (``score_tensors``) and the sequence bounds (``seq_args``).
_BOUND: dict = {}
_N_TENSORS = 12


_HOPPER: dict = {}  # call signature → (the Hopper kernel's entry point, explain()'s note), or False


def _hopper_path(q, k, v, causal, causal_offset, scale, variant=PLAIN):
    """(a Hopper forward's entry point, what explain() says of it) if this call (no mask or dropout)
    takes one (CUDA sm_90 only): the Gluon kernel where it measured fastest
    (``attention_fwd_gluon.fast_path``: plain, window, softcap, ALiBi, sinks; causal or windowed
    calls from its ``CAUSAL_MIN_N`` on; per-row ranges and varlen batches, which only it takes),
    else the Triton TMA kernel (``attention_fwd_hopper.fast_path``), else False. Imported here: those modules build
    on this one's helpers."""
    from . import attention_fwd_gluon, attention_fwd_hopper
    if len(_HOPPER) >= BOUND_ENTRIES:
        _HOPPER.clear()
    if attention_fwd_gluon.fast_path(q, k, v, causal, causal_offset, scale, variant):
        note = attention_fwd_gluon.path_note(variant, q.shape[-1], v.shape[-1])
        return attention_fwd_gluon.attention_forward_gluon, note
    if not attention_fwd_hopper.fast_path(q, k, v, causal, causal_offset, scale, variant):
        return False
    return attention_fwd_hopper.attention_forward_hopper, attention_fwd_hopper.path_note(variant)


def _plain_signature(q, k, v, causal, causal_offset, scale, need_lse):
    tf32 = q.dtype == torch.float32 and allow_tf32()
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device,
            causal, causal_offset, scale, tf32, need_lse)


def _variant_signature(variant: Variant):
    """What the Hopper path's decision depends on in a variant, besides the plain signature: the
    window sides, the softcap, the slopes' and sinks' layouts, and the batch layout with its bounds'
    (not their values: every sequence length takes the same path)."""
    layout = lambda t: None if t is None else (t.shape, t.stride(), t.dtype, t.device)  # noqa: E731
    return (variant.left, variant.right, variant.softcap, layout(variant.alibi), layout(variant.sinks),
            variant.seq, layout(variant.seq_q), layout(variant.seq_k))


def attention_forward(q, k, v, *, scale: float, causal: bool, causal_offset: int,
                      mask: torch.Tensor | None, dropout_p: float, seed: int, need_lse: bool = True,
                      variant: Variant = PLAIN, out: torch.Tensor | None = None):
    """Launch the forward kernel. Inputs already validated; mask is (B, Hq, Nq, Nk)-shaped
    (broadcast dims with stride 0). ``causal`` caps the window's right side at 0. Returns o
    (B, Hq, Nq, Dv) in q's dtype and lse (B, Hq, Nq) fp32, or None for lse with ``need_lse=False``
    (nothing allocated or stored: no-grad inference). ``out``: where the Gluon kernel runs the call
    and can (``attention_fwd_gluon.writes_into``), o is written into it and returned; elsewhere o is
    a new tensor (the caller copies it: ``_forward_impl``).

    This runs on every call: at small shapes its host time is the call's time, so it stays lean
    (no per-call imports, and a bound launch for repeated calls without a mask or dropout)."""
    B, Hq, Nq, D = q.shape
    Dv = v.shape[3]
    key = None
    if mask is None and dropout_p == 0.0:  # what the Hopper kernels may take (ranges, varlen: the Gluon one)
        signature = _plain_signature(q, k, v, causal, causal_offset, scale, need_lse)
        key = signature if variant is PLAIN else (signature, _variant_signature(variant))
        hopper = _HOPPER.get(key)
        if hopper is None:
            hopper = _HOPPER[key] = _hopper_path(q, k, v, causal, causal_offset, scale, variant)
        if hopper and not (q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16):
            run, note = hopper
            note_path("hopper", "attention forward", note)
            into = {}
            if out is not None:  # (ring attention's rows of its sums: no per-call import otherwise)
                from . import attention_fwd_gluon as gluon
                if run is gluon.attention_forward_gluon and gluon.writes_into(out, q, v, variant):
                    into = dict(out=out)
            o, lse = run(q, k, v, scale, causal, variant=variant, **into)
            return o, lse if need_lse else None
    o, lse = output_buffers(q, Dv, variant, need_lse)
    lse_arg = q if lse is None else lse  # never written without need_lse: STORE_LSE is False
    bindable = key is not None and _attn_fwd_kernel.enabled
    if bindable:
        bound = _BOUND.get(key)
        if bound is not None and bound(q, k, v, o, lse_arg, q, *(
                (q,) * 6 if variant is PLAIN else (*score_tensors(variant, q), *seq_args(variant, q)[:4]))):
            return o, lse
    _, Hkv, Nk, _ = k.shape
    variant = causal_window(variant, causal)
    if mask is None:
        kind, mask_arg, mask_strides = MASK_NONE, q, (0, 0, 0, 0)  # q is never read: MASK_KIND == 0
    else:
        kind = mask_kind(mask)
        mask_arg = mask.view(torch.uint8) if kind == MASK_BOOL else mask
        mask_strides = mask.stride()
    dropout = dropout_p > 0.0
    *seq_ptrs, stride_seq, n_seq = seq_args(variant, q)
    option_tensors, alibi_strides, score_scalars, score_constexprs = score_args(variant, q, scale)
    q_strides, k_strides, v_strides, o_strides = q.stride(), k.stride(), v.stride(), o.stride()
    if variant.seq >= SEQ_VARLEN:  # one packed batch: the sequence index moves no pointer
        q_strides, k_strides, v_strides, o_strides = ((0, *t[1:]) for t in (q_strides, k_strides, v_strides, o_strides))
    args = (q, k, v, o, lse_arg, mask_arg, *option_tensors, *seq_ptrs,
            *q_strides, *k_strides, *v_strides, *o_strides, *mask_strides,
            *lse_strides(variant, Hq, Nq), *alibi_strides, stride_seq,
            Hq, Nq, Nk, n_seq,
            causal_offset, variant.left, variant.right, scale * LOG2E, *score_scalars,
            seed, keep_threshold(dropout_p) if dropout else 0, 1.0 / (1.0 - dropout_p), length_bucket(Nq, Nk))
    fold = (scale > 0 or variant.softcap > 0) and kind != MASK_ADD and variant.alibi is None
    block_d, block_dv = head_tiles(D, Dv)
    constexprs = dict(GROUP=Hq // Hkv, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=block_d, BLOCK_DV=block_dv,
                      MASK_KIND=kind, **score_constexprs, DROPOUT=dropout, PRECISION=precision_for(q.dtype),
                      FOLD_SCALE=fold, STORE_LSE=need_lse)
    grid = query_grid(variant, Nq, B, Hq, n_seq)
    _attn_fwd_kernel[grid](*args, **constexprs)
    if bindable:
        keep_bound(_BOUND, key, _attn_fwd_kernel.bind(grid, args, constexprs, _N_TENSORS))
    return o, lse
