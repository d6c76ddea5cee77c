"""softmax, log_softmax and logsumexp over rows of any length, forward and backward.

Every op here is one shape of computation: reduce a row to a small state, then map each element
with that state. Forward, the state is the online-softmax (m, ℓ) of ``merge.py``, with m kept in
natural-log units (``online_softmax_update_ln`` / ``merge_ml_ln``: the log2 e scale is applied after
subtracting the maximum, so logits of magnitude 1e4 lose nothing); backward it is a plain sum
(Σ y·dy for softmax, Σ dy for log_softmax). logsumexp forward has no map; its backward has no
reduction (dx = dy·exp(x − lse), recomputed from x and the saved float32 lse).

Three strategies, each a kernel, chosen by row length N and row count R (``_choose``):

``row``       N ≤ 16384: the row lives in registers, one read and one write. Short rows pack
              ROWS rows per program so every program moves several KB; ROWS and num_warps are
              autotuned per power-of-two row length.
``two_pass``  one program per row streams it in chunks twice: pass 1 folds (m, ℓ), pass 2 maps.
              O(chunk) registers whatever N is, but x is read twice (3N bytes instead of 2N; the
              first pass asks L2 to keep the row). Chosen for long rows when programs may not
              wait on each other (the interpreter) and there are enough rows to fill the GPU.
``split``     each row is cut into S segments of k chunks (8K–32K elements each, by
              direction, dtype and row length: ``_split_config``, which also picks the kernel's
              synchronisation), one program each, so a single 16M row uses every SM. Each
              program folds its segment to a partial (m, ℓ); partials merge with
              ``merge_ml_ln`` (a ``tl.reduce`` over the row's S partials).
              On the GPU this is one kernel: programs take tickets from an atomic counter (so the
              programs of a row are always resident together: S no more than the programs sure
              to fit at once keeps this deadlock-free), publish their partial, wait for the row's
              other segments, and normalise the segment they still hold in registers (or re-read
              from L2 when a segment spans several chunks) — 2N bytes at any N (on the H100,
              0.75–1.0 × copy bandwidth for rows of 2^16–2^22 elements: ``_split_config``).
              Under the interpreter, which runs programs one at a time, the same kernel runs as
              two launches (partials, then merge + normalise with a re-read).

Layout: the reduced dim is moved last as a view. If its stride is not 1 the input is copied once
(``.contiguous()``); other dims may have any strides (up to three non-mergeable leading dims are
read in place, more are copied). Outputs are allocated contiguous in the moved layout, so for a
reduced dim that is not the last the result is a non-contiguous view of the right shape.

CPU tensors run float32 PyTorch ops with the same semantics, or the Triton kernels themselves under
``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import triton
import triton.language as tl

from .. import _checks
from .._launcher import launcher
from .._runtime import (cdiv, device_sm_count, interpreter_active, l2_prefetch, next_pow2, runs_triton,
                        tile_and_slab, tuned)
from ..merge import _finite_or_zero, lse_of_ln, merge_ml_ln, online_softmax_update_ln

# Ops, as the kernels' OP constexpr: forward 0-2, backward 3-4 (logsumexp's backward has its own
# elementwise kernel).
SOFTMAX, LOG_SOFTMAX, LOGSUMEXP, SOFTMAX_BWD, LOG_SOFTMAX_BWD = 0, 1, 2, 3, 4
_BWD_OF = {SOFTMAX: SOFTMAX_BWD, LOG_SOFTMAX: LOG_SOFTMAX_BWD}

STRATEGIES = ("auto", "row", "two_pass", "split")
ROW_MAX = 16384          # longest row the auto choice keeps in registers
ROW_LIMIT = 65536        # longest row a forced "row" strategy accepts
# The one-launch split (its programs wait for each other) or the two-launch form that never waits;
# tests turn it off too.
_ALLOW_SPIN = _checks.env_flag("FLASHATTN_LITE_SPLIT_WAIT", True)
# The split kernel's L2 prefetch is PTX inline asm (``_runtime.l2_prefetch``): none on ROCm.
_L2_PREFETCH = torch.version.hip is None


def _chunk(kind: str) -> int:
    """Elements per chunk: ~32 fp32 values per thread on the GPU, small under the interpreter so
    that short test rows still span several chunks and segments."""
    if interpreter_active():
        return 256
    return {"two_pass": 4096, "split": 8192}[kind]


# ------------------------------------------------------------------ shared kernel pieces

@triton.jit
def _row_offsets(rows, D1, D2, s0, s1, s2):
    """int64 element offset of each row: rows index a (D0, D1, D2) grid of leading dims."""
    r = rows.to(tl.int64)
    inner = r % D2
    outer = r // D2
    return (outer // D1) * s0 + (outer % D1) * s1 + inner * s2


@triton.jit
def _load(a_ptrs, b_ptrs, mask, OP: tl.constexpr, POLICY: tl.constexpr):
    """Forward reads x (padding −inf: it adds nothing to ℓ); backward reads y and dy (padding 0)."""
    if OP < 3:
        a = tl.load(a_ptrs, mask=mask, other=float("-inf"), eviction_policy=POLICY).to(tl.float32)
        b = a
    else:
        a = tl.load(a_ptrs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
        b = tl.load(b_ptrs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    return a, b


@triton.jit
def _lse_ref(m):
    """What logsumexp's exponents subtract: m, 0 for an empty state, and the largest float for a
    +inf maximum, so that a +inf entry adds +inf to ℓ rather than NaN (inf − inf). ℓ is then NaN
    exactly where the row holds a NaN (which the maximum skips), and m + log ℓ is torch's value
    (+inf or NaN) at no cost per element. softmax keeps ``merge``'s reference: a row holding +inf
    is NaN there either way."""
    return tl.where(m == float("-inf"), 0.0, tl.where(m == float("inf"), 3.4028234663852886e38, m))


@triton.jit
def _lse_update(m_i, l_i, x):
    """``online_softmax_update_ln``'s (m, ℓ) with ``_lse_ref``."""
    m = tl.maximum(m_i, tl.max(x, 1))
    ref = _lse_ref(m)
    alpha = tl.math.exp2((m_i - ref) * 1.4426950408889634)
    return m, l_i * alpha + tl.sum(tl.math.exp2((x - ref[:, None]) * 1.4426950408889634), 1)


@triton.jit
def _lse_merge(m_a, l_a, m_b, l_b):
    """``merge_ml_ln`` with ``_lse_ref`` (a ``tl.reduce`` combine_fn)."""
    m = tl.maximum(m_a, m_b)
    ref = _lse_ref(m)
    return m, (l_a * tl.math.exp2((m_a - ref) * 1.4426950408889634)
               + l_b * tl.math.exp2((m_b - ref) * 1.4426950408889634))


@triton.jit
def _fold(m, l, a, b, OP: tl.constexpr):
    """Fold a [ROWS, BLOCK] tile into the row states. Returns (m, ℓ, p): forward p = exp(x − m)
    (not for logsumexp, which maps nothing)."""
    if OP == 2:
        m, l = _lse_update(m, l, a)
        p = a
    elif OP < 3:
        m, l, p, _alpha = online_softmax_update_ln(m, l, a)
    elif OP == 3:
        p = a * b
        l = l + tl.sum(p, 1)
    else:
        p = b
        l = l + tl.sum(b, 1)
    return m, l, p


@triton.jit
def _map(a, b, m, l, OP: tl.constexpr):
    """The output tile from the inputs and the final row states m, ℓ [ROWS] (ℓ = the sum backward)."""
    if OP == 0:
        y = tl.math.exp2((a - m[:, None]) * 1.4426950408889634) * (1.0 / l)[:, None]
    elif OP == 1:
        # (x − m) − log ℓ rather than x − lse: exact near the maximum; an all −inf row gives NaN
        # as torch does.
        y = (a - m[:, None]) - (tl.math.log2(l) * 0.6931471805599453)[:, None]
    elif OP == 3:
        y = a * (b - l[:, None])
    else:
        y = b - tl.math.exp2(a * 1.4426950408889634) * l[:, None]
    return y


# ------------------------------------------------------------------ strategy 1: the row on chip

def _row_configs():
    return [triton.Config({"ROWS": rows}, num_warps=warps)
            for rows in (1, 2, 4, 8, 16, 32, 64, 128) for warps in (4, 8, 16, 32)]


def _prune_row(configs, args):
    """Keep 4-32 elements per thread and tiles of 2-16K elements (one row when the row is longer),
    best guess first (it is the config used when autotuning is off)."""
    block_n, op = args["BLOCK_N"], args["OP"]
    target = max(block_n, 8192 if op < 3 else 4096)

    def ok(c):
        tile = c.kwargs["ROWS"] * block_n
        per_thread = tile / (32 * c.num_warps)
        return (4 <= per_thread <= 32 and (c.kwargs["ROWS"] == 1 or tile <= 16384)
                and tile >= min(2048, 128 * block_n))

    def score(c):
        tile = c.kwargs["ROWS"] * block_n
        return abs(math.log2(tile / target)), abs(tile / (32 * c.num_warps) - 16)

    return sorted((c for c in configs if ok(c)), key=score)


# N stays specialized: where it is a multiple of 16, the masked row loads and the stores at rows·N
# vectorize (a new N compiles at most three variants: 1, multiple of 16, other). The row count only
# bounds a mask across rows.
@tuned(_row_configs(), key=["BLOCK_N", "OP"], interpreter_config=triton.Config({"ROWS": 2}, num_warps=4),
       prune=_prune_row)
@triton.jit(do_not_specialize=["R"])
def _row_kernel(a_ptr, b_ptr, out_ptr, R, N, D1, D2, sa0, sa1, sa2, sb0, sb1, sb2,
                OP: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < R
    mask = row_ok[:, None] & (cols[None, :] < N)
    a_ptrs = a_ptr + _row_offsets(rows, D1, D2, sa0, sa1, sa2)[:, None] + cols[None, :]
    b_ptrs = b_ptr + _row_offsets(rows, D1, D2, sb0, sb1, sb2)[:, None] + cols[None, :]
    a, b = _load(a_ptrs, b_ptrs, mask, OP, "evict_first")
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    m, l, p = _fold(m, l, a, b, OP)
    if OP == 2:
        tl.store(out_ptr + rows, lse_of_ln(m, l), mask=row_ok)
    else:
        if OP == 0:
            y = p * (1.0 / l)[:, None]
        else:
            y = _map(a, b, m, l, OP)
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------ strategy 2: two passes per row

@launcher
@triton.jit
def _two_pass_kernel(a_ptr, b_ptr, out_ptr, N, D1, D2, sa0, sa1, sa2, sb0, sb1, sb2,
                     OP: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) + tl.arange(0, 1)
    cols = tl.arange(0, BLOCK)[None, :]
    a_row = a_ptr + _row_offsets(rows, D1, D2, sa0, sa1, sa2)[:, None]
    b_row = b_ptr + _row_offsets(rows, D1, D2, sb0, sb1, sb2)[:, None]
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    for start in range(0, N, BLOCK):
        mask = start + cols < N
        a, b = _load(a_row + start + cols, b_row + start + cols, mask, OP, "evict_last")
        m, l, _p = _fold(m, l, a, b, OP)
    if OP == 2:
        tl.store(out_ptr + rows, lse_of_ln(m, l))
    else:
        out_row = out_ptr + rows.to(tl.int64)[:, None] * N
        for start in range(0, N, BLOCK):
            mask = start + cols < N
            a, b = _load(a_row + start + cols, b_row + start + cols, mask, OP, "evict_first")
            tl.store(out_row + start + cols, _map(a, b, m, l, OP).to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------ strategy 3: a row split across programs

# A packed partial: m's float32 bits in the high word, ℓ's in the low word. Workspace words start as
# _EMPTY (both words all ones); a published ℓ is never all ones (NaN is stored canonical), so a
# word ≠ _EMPTY is a published partial, and one 64-bit store publishes both values at once.
_EMPTY = tl.constexpr(-1)
_NEUTRAL = tl.constexpr(-36028797018963968)  # (m, ℓ) = (−inf, 0): what padding lanes of the vector read


@triton.jit
def _pack(m, l):
    l = tl.where(l == l, l, float("nan"))
    return (m.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (l.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _unpack(w):
    return (w >> 32).to(tl.int32).to(tl.float32, bitcast=True), w.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _load_raw(a_ptrs, b_ptrs, mask, OP: tl.constexpr, B_POLICY: tl.constexpr):
    """``_load`` without the float32 conversion (segments held across the wait in their own dtype)."""
    if OP < 3:
        a = tl.load(a_ptrs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
        b = a
    else:
        a = tl.load(a_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
        b = tl.load(b_ptrs, mask=mask, other=0.0, eviction_policy=B_POLICY)
    return a, b


@triton.jit
def _convert_again(raw, zero):
    """raw as float32, converted anew: ``zero`` is 0 at run time but unknown to the compiler, so the
    conversion made before the wait cannot be reused, and only the raw (2-byte) values stay live
    across it."""
    if raw.dtype == tl.float32:
        return (raw.to(tl.int32, bitcast=True) | zero).to(tl.float32, bitcast=True)
    else:
        return (raw.to(tl.int16, bitcast=True) | zero.to(tl.int16)).to(raw.dtype, bitcast=True).to(tl.float32)


@triton.jit
def _fold_raw(a_raw, b_raw, OP: tl.constexpr):
    """``_fold`` of one chunk from the empty state, for a chunk held raw: the exp pass converts the
    values again (``zero`` from the max pass: 0 unless the max is NaN, when ℓ is NaN anyway), so no
    float32 copy of the chunk outlives the block-wide max."""
    m = tl.full([1], float("-inf"), tl.float32)
    if OP < 3:
        m = tl.max(a_raw.to(tl.float32), 1)
        if OP == 2:
            m_ref = _lse_ref(m)
        else:
            m_ref = _finite_or_zero(m)
        x = _convert_again(a_raw, (m != m).to(tl.int32)[:, None])
        l = tl.sum(tl.math.exp2((x - m_ref[:, None]) * 1.4426950408889634), 1)
    elif OP == 3:
        l = tl.sum(a_raw.to(tl.float32) * b_raw.to(tl.float32), 1)
    else:
        l = tl.sum(b_raw.to(tl.float32), 1)
    return m, l


@launcher
@triton.jit
def _split_kernel(a_ptr, b_ptr, out_ptr, ws_m_ptr, ws_l_ptr, sync_ptr,
                  N, SEG, S, R, ahead, D1, D2, sa0, sa1, sa2, sb0, sb1, sb2,
                  OP: tl.constexpr, PHASE: tl.constexpr, ONE_CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr, S_POW2: tl.constexpr, TICKET: tl.constexpr,
                  SYNC: tl.constexpr, HOLD: tl.constexpr, PAD: tl.constexpr,
                  PREFETCH: tl.constexpr, PREFETCH_AFTER: tl.constexpr, LINE: tl.constexpr):
    """PHASE 0: write each segment's partial state. PHASE 1: merge a row's partials and map its
    segment (re-reading it). PHASE 2: both in one launch, the programs of a row waiting for each
    other; ONE_CHUNK keeps the segment in registers across the wait.

    Switches (``_split_config`` picks them per direction, dtype and N):
    TICKET  the memory order of the atomic ticket, "acq_rel" or "relaxed" (it only numbers the
            programs, so either is correct).
    SYNC    "counter": partials as two float32 planes, an arrival counter bumped after a barrier
            with release order and polled with acquire loads, which make the partials visible;
            "counter_flags": each partial one 64-bit word that is its own validity flag, so the
            counter needs no fence: bumped and polled relaxed, then the row's words read (again
            while any is still empty).
    HOLD    "f32": ONE_CHUNK holds the float32 values (forward p = exp(x − m)) across the wait;
            "raw": holds the loaded values in their own dtype (half the registers for 2-byte
            inputs, fewer live values for fp32) and converts them again afterwards (one more exp
            per element forward); "first" (backward): holds y raw and reads dy again after the
            wait, from L2 (it was loaded with evict_last moments before): half the registers of
            "raw", so more programs fit on an SM, for no extra DRAM traffic.
    PAD     ints between the counters in ``sync_ptr`` (the ticket, then one per row): 32 puts each
            on its own 128-byte line, so a row's polls do not queue behind other rows' polls and
            the tickets at one L2 slice.
    PREFETCH lines (LINE elements each) of every input that a waiting program asks the L2 for, at
            the start of the same segment ``ahead`` rows on: when a row fills the GPU, DRAM would
            otherwise idle through the row's wait and the next row's start. PREFETCH_AFTER lines
            more (the ones after those) once the wait is over."""
    if PHASE == 2:
        # Tickets hand out (row, segment) in the order programs actually start, and a program waits
        # only for its own row. Rows before the oldest unfinished one are done, and no ticket of a
        # later row is taken before all of its tickets are: so if every resident program were
        # waiting, all would hold tickets of that one row, fewer than its S, leaving a slot free
        # for the next program, which takes its next ticket. S is at most the programs that are
        # sure to fit at once (``_split_layout``: one per SM whatever the register count, or
        # ``resident`` per SM under that register cap), so this cannot deadlock, whatever the order
        # or the number of programs the hardware makes resident, and whatever the ticket's memory
        # order. The argument assumes the SMs are this kernel's: two waiting kernels running at
        # once could each hold SMs the other needs (``FLASHATTN_LITE_SPLIT_WAIT=0`` selects the
        # two-launch form for such setups).
        ticket = tl.atomic_add(sync_ptr, 1, sem=TICKET)
        row = ticket // S
        seg = ticket % S
    else:
        seg = tl.program_id(0)
        row = tl.program_id(1)
    rows = row + tl.arange(0, 1)
    cols = tl.arange(0, BLOCK)[None, :]
    a_row = a_ptr + _row_offsets(rows, D1, D2, sa0, sa1, sa2)[:, None]
    b_row = b_ptr + _row_offsets(rows, D1, D2, sb0, sb1, sb2)[:, None]
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, N)
    slot = row.to(tl.int64) * S + seg + tl.zeros([1], tl.int64)
    counter = sync_ptr + PAD + PAD * row

    if PHASE != 1:
        m = tl.full([1], float("-inf"), tl.float32)
        l = tl.zeros([1], tl.float32)
        if ONE_CHUNK and HOLD != "f32":
            mask = lo + cols < hi
            a_raw, b_raw = _load_raw(a_row + lo + cols, b_row + lo + cols, mask, OP,
                                     "evict_last" if HOLD == "first" else "evict_first")
            m, l = _fold_raw(a_raw, b_raw, OP)
        elif ONE_CHUNK:
            mask = lo + cols < hi
            a, b = _load(a_row + lo + cols, b_row + lo + cols, mask, OP, "evict_first")
            m, l, p = _fold(m, l, a, b, OP)
        else:
            for start in range(lo, hi, BLOCK):
                mask = start + cols < hi
                a, b = _load(a_row + start + cols, b_row + start + cols, mask, OP, "evict_last")
                m, l, _p = _fold(m, l, a, b, OP)
        if SYNC == "counter":
            tl.store(ws_m_ptr + slot, m)
            tl.store(ws_l_ptr + slot, l)
        else:
            tl.atomic_xchg(ws_m_ptr + slot, _pack(m, l), sem="relaxed")
    if PHASE == 0:
        return
    # Clamped: past the last row or the segment's end these are lines already on chip.
    ahead_rows = tl.minimum(rows + ahead, R - 1)
    a_ahead = a_ptr + _row_offsets(ahead_rows, D1, D2, sa0, sa1, sa2)
    b_ahead = b_ptr + _row_offsets(ahead_rows, D1, D2, sb0, sb1, sb2)
    if PHASE == 2 and PREFETCH > 0:
        lines = tl.minimum(lo + tl.arange(0, PREFETCH) * LINE, hi - 1)
        l2_prefetch(a_ahead + lines)
        if OP >= 3:
            l2_prefetch(b_ahead + lines)

    one = tl.zeros([1], tl.int32)
    writes_lse = (seg + one) == 0
    if PHASE == 2:
        if OP == 2:
            # logsumexp maps nothing: the last segment to arrive merges, nobody waits.
            tl.debug_barrier()
            writes_lse = (tl.atomic_add(counter, 1, sem="acq_rel") + one) == S - 1
        elif SYNC == "counter":
            tl.debug_barrier()
            tl.atomic_add(counter, 1, sem="release")
            arrived = tl.atomic_add(counter, 0, sem="acquire")
            while arrived < S:
                arrived = tl.atomic_add(counter, 0, sem="acquire")
        else:
            # The words carry their own validity: the arrival needs no fence, and the words are
            # read again below until all are there.
            tl.atomic_add(counter, 1, sem="relaxed")
            arrived = tl.atomic_add(counter, 0, sem="relaxed")
            while arrived < S:
                arrived = tl.atomic_add(counter, 0, sem="relaxed")
    if PHASE == 2 and PREFETCH_AFTER > 0:
        # The row's loads are all done: more of the next row, while this one is mapped.
        lines = tl.minimum(lo + (PREFETCH + tl.arange(0, PREFETCH_AFTER)) * LINE, hi - 1)
        l2_prefetch(a_ahead + lines)
        if OP >= 3:
            l2_prefetch(b_ahead + lines)

    offs = tl.arange(0, S_POW2)
    part = row.to(tl.int64) * S + offs
    if SYNC == "counter":
        pl = tl.load(ws_l_ptr + part, mask=offs < S, other=0.0, volatile=True)
        if OP < 3:
            pm = tl.load(ws_m_ptr + part, mask=offs < S, other=float("-inf"), volatile=True)
    else:
        w = tl.load(ws_m_ptr + part, mask=offs < S, other=_NEUTRAL, volatile=True)
        if OP != 2:  # logsumexp's last arrival sees every word through the counter's acquire
            while tl.sum((w == _EMPTY).to(tl.int32), 0) > 0:
                w = tl.load(ws_m_ptr + part, mask=offs < S, other=_NEUTRAL, volatile=True)
        pm, pl = _unpack(w)
    if OP == 2:
        m_row, l_row = tl.reduce((pm, pl), 0, _lse_merge)
    elif OP < 3:
        m_row, l_row = tl.reduce((pm, pl), 0, merge_ml_ln)
    else:
        m_row = 0.0
        l_row = tl.sum(pl, 0)
    m_row = m_row + tl.zeros([1], tl.float32)
    l_row = l_row + tl.zeros([1], tl.float32)

    if OP == 2:
        tl.store(out_ptr + rows, lse_of_ln(m_row, l_row), mask=writes_lse)
    else:
        out_row = out_ptr + rows.to(tl.int64)[:, None] * N
        if ONE_CHUNK and PHASE == 2:
            if HOLD != "f32":
                # 0 unless ℓ is NaN, and then every output of the row is NaN whatever the bits.
                zero = (l_row != l_row).to(tl.int32)[:, None]
                if HOLD == "raw":
                    b = _convert_again(b_raw, zero)
                else:  # "first": dy again, from L2
                    b = tl.load(b_row + lo + cols, mask=lo + cols < hi, other=0.0,
                                eviction_policy="evict_first").to(tl.float32)
                y = _map(_convert_again(a_raw, zero), b, m_row, l_row, OP)
            elif OP == 0:
                y = p * (tl.math.exp2((m - m_row) * 1.4426950408889634) * (1.0 / l_row))[:, None]
            else:
                y = _map(a, b, m_row, l_row, OP)
            # Streaming stores: the written row should not evict inputs still to be read.
            tl.store(out_row + lo + cols, y.to(out_ptr.dtype.element_ty), mask=lo + cols < hi, cache_modifier=".cs")
        else:
            for start in range(lo, hi, BLOCK):
                mask = start + cols < hi
                a, b = _load(a_row + start + cols, b_row + start + cols, mask, OP, "evict_first")
                y = _map(a, b, m_row, l_row, OP)
                tl.store(out_row + start + cols, y.to(out_ptr.dtype.element_ty), mask=mask, cache_modifier=".cs")


# ------------------------------------------------------------------ logsumexp backward (no reduction)

@launcher
@triton.jit
def _lse_bwd_kernel(x_ptr, dy_ptr, lse_ptr, dx_ptr, R, N, D1, D2, sx0, sx1, sx2,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    col_tile, row_tile = tile_and_slab(tl.cdiv(N, BLOCK_N))
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = row_tile * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    mask = row_ok[:, None] & (cols[None, :] < N)
    x = tl.load(x_ptr + _row_offsets(rows, D1, D2, sx0, sx1, sx2)[:, None] + cols[None, :], mask=mask,
                other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(dy_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    dx = dy[:, None] * tl.math.exp2((x - lse[:, None]) * 1.4426950408889634)
    tl.store(dx_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------ launchers

def _leading(shape: Sequence[int], tensors: Sequence[torch.Tensor]):
    """Merge the leading dims (all but the last) of same-shaped tensors into at most three
    (D0, D1, D2) with one stride triple per tensor, or None when more than three remain."""
    dims: list[tuple[int, list[int]]] = []
    for i, size in enumerate(shape):
        if size == 1:
            continue
        strides = [t.stride(i) for t in tensors]
        if dims and all(so == si * size for so, si in zip(dims[-1][1], strides)):
            dims[-1] = (dims[-1][0] * size, strides)
        else:
            dims.append((size, strides))
    if len(dims) > 3:
        return None
    dims = [(1, [0] * len(tensors))] * (3 - len(dims)) + dims
    sizes = [d[0] for d in dims]
    return sizes, [[d[1][k] for d in dims] for k in range(len(tensors))]


def _prepare(*tensors: torch.Tensor):
    """Leading-dim geometry for kernels reading ``tensors`` (..., N) with unit stride along N;
    copies only when more than three leading dims cannot be merged."""
    lead = tensors[0].shape[:-1]
    geo = _leading(lead, tensors)
    if geo is None:
        tensors = tuple(t.contiguous() for t in tensors)
        geo = _leading(lead, tensors)
    (_, d1, d2), strides = geo
    return tensors, d1, d2, strides


def _choose(strategy: str, R: int, N: int, t: torch.Tensor) -> str:
    if strategy != "auto":
        if strategy == "row" and N > ROW_LIMIT:
            raise ValueError(f"strategy='row' holds a row in registers, so N must be ≤ {ROW_LIMIT}, got {N}")
        return strategy
    if N <= ROW_MAX:
        return "row"
    if _spin_allowed(t) or R < 2 * device_sm_count(t):
        return "split"
    return "two_pass"


def _spin_allowed(t: torch.Tensor) -> bool:
    return _ALLOW_SPIN and t.is_cuda and not interpreter_active()


def _launch(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, strategy: str,
            settings: dict | None = None, emulate_wait: bool = False) -> None:
    """Run ``op`` over the rows of a (and b, backward): (..., N) with unit stride along N.
    ``out`` is contiguous: (R, N) (or (R,) for logsumexp). ``settings`` and ``emulate_wait``: the
    split kernel's experiment arguments (``_launch_split``)."""
    N = a.shape[-1]
    R = out.shape[0]
    (a, b), d1, d2, (sa, sb) = _prepare(a, b)
    geo = (d1, d2, *sa, *sb)
    kind = _choose(strategy, R, N, a)
    if kind == "row":
        block_n = next_pow2(N)
        grid = lambda meta: (cdiv(R, meta["ROWS"]),)
        _row_kernel[grid](a, b, out, R, N, *geo, OP=op, BLOCK_N=block_n)
    elif kind == "two_pass":
        _two_pass_kernel[(R,)](a, b, out, N, *geo, OP=op, BLOCK=_chunk("two_pass"), num_warps=8)
    else:
        _launch_split(op, a, b, out, R, N, geo, settings, emulate_wait)


# A Triton whose CUDA backend takes no register cap rejects ``maxnreg`` at launch: ``resident`` is
# then dropped and the compiler's register count decides how many programs share an SM.
try:
    from triton.backends.nvidia.compiler import CUDAOptions as _CUDAOptions
    _MAXNREG = "maxnreg" in getattr(_CUDAOptions, "__dataclass_fields__", {})
except ImportError:
    _MAXNREG = False


def _split_config(op: int, N: int, itemsize: int, sms: int) -> dict:
    """The split kernel's settings for ``op``'s direction (forward: softmax, log_softmax, logsumexp;
    backward: softmax, log_softmax), the input's itemsize and the row length N: ``block`` and
    ``warps`` (elements per chunk, num_warps), the kernel's switches ``ticket``, ``sync``, ``hold``,
    ``pad`` (see ``_split_kernel``), ``resident`` (programs per SM that a register cap makes room
    for, on one-chunk segments; 0 = no cap), ``segments`` (at most this many segments a row,
    so that each streams several chunks; 0 = as many as ``_split_layout`` allows) and
    ``prefetch`` / ``prefetch_after`` (L2 lines of each input of a later row asked for before /
    after the wait; see PREFETCH in the kernel).

    Measured on the H100 (``benchmarks/softmax_split_sweep.py``; benchmarks/NOTES.md, 2026-11-23
    14:20–18:03), × copy bandwidth at N = 2^16 / 2^20 / 2^21 / 2^22:
      forward fp32    .981 / .934 / .939 / .925: 8K chunks held raw at 5 per SM; past 8K × SMs
                      elements segments of two or more 16K chunks, read again from L2, and 256
                      lines prefetched
      forward 2-byte  .954 / .946 / .974 / .949: as fp32 but holding float32 without a cap, from 64
                      chunks on two chunks a segment (a 2-byte chunk moves too few bytes per
                      wait; 2^19: .975 against .890 with one), 512 lines prefetched past 8K × SMs
      backward fp32   1.00 / .961 / .928 / .853: y held alone (dy read again from L2) on 16K chunks
                      at 2 per SM while that is ≤ 2 × SMs chunks, with 128 lines prefetched before
                      the wait when two rows are in flight, 256 after it when one row fills the
                      GPU; longer rows 32K chunks of y and dy on 16 warps, one per SM (the fenced
                      counter: counter_flags lost up to 15% there)
      backward 2-byte 1.01 / .983 / .919 / .88–.90: y held alone on 8K chunks at 6 per SM up to 2^20,
                      past it segments of two or more 16K chunks on 16 warps (2 per SM, not 3: the
                      rows waiting at once, read twice, stay in L2) with 128 lines prefetched
    Every switch but that fp32 backward uses the relaxed ticket and counter_flags on padded lines.
    Past 2^20 a row's y and dy (8–32 MB) is a large part of what the GPU holds (registers 33 MB, L2
    50 MB), so one or two rows wait at once and DRAM would idle through each wait but for the
    prefetch."""
    fwd = op < 3
    n8 = cdiv(N, 8192)
    t = dict(block=8192, warps=8, ticket="relaxed", sync="counter_flags", pad=32, hold="f32", resident=0, segments=0,
             prefetch=0, prefetch_after=0)
    if fwd:
        if n8 > sms:
            t.update(block=16384, segments=min(sms, cdiv(cdiv(N, 16384), 2)), prefetch=256 if itemsize == 4 else 512)
        elif itemsize == 4:
            t.update(hold="raw", resident=5)
        elif n8 >= 64:
            t.update(segments=cdiv(n8, 2))
    elif itemsize == 4:
        n16 = cdiv(N, 16384)
        if n16 <= 2 * sms:
            t.update(block=16384, hold="first", resident=2)
            if n16 > sms:      # one row fills the GPU: prefetch once its own loads are done
                t.update(prefetch_after=256)
            elif 2 * n16 > sms:  # two rows in flight
                t.update(prefetch=128)
        else:
            t.update(block=32768, warps=16, ticket="acq_rel", sync="counter", pad=1)
    elif N <= 2 ** 20:
        t.update(hold="first", resident=6)
    else:
        t.update(block=16384, warps=16, segments=min(sms, cdiv(cdiv(N, 16384), 2)), prefetch=128)
    if interpreter_active():
        t.update(block=_chunk("split"), warps=4)
    return t


def _split_layout(op: int, N: int, itemsize: int, sms: int,
                  settings: dict | None = None) -> tuple[dict, int, int, int | None]:
    """(settings, chunks per segment, segments S, register cap or None) of the split kernel:
    ``_split_config``, with the keys ``settings`` names replaced (an experiment:
    benchmarks/softmax_split_sweep.py, tests).

    A row's S programs wait for each other, so all S must be able to be resident at once (the
    tickets then guarantee progress: see the kernel). One program per SM always fits, so S ≤ SM
    count is always safe; a register cap of ``resident`` programs per SM makes room for that many
    on every SM (registers are what limits these kernels: their shared memory is a few hundred
    bytes), so one-chunk segments under a cap may number up to ``resident`` × SMs — provided that
    many programs' warps fit an SM's 64 too; otherwise S stays ≤ SMs. The cap applies to one-chunk
    segments only (longer segments stream, holding nothing)."""
    t = _split_config(op, N, itemsize, sms)
    if settings:
        unknown = set(settings) - set(t)
        if unknown:
            raise ValueError(f"split settings must be among {sorted(t)}, got {sorted(unknown)}")
        t.update(settings)
    for key in ("prefetch", "prefetch_after"):
        lines = t[key]
        if type(lines) is not int or lines < 0 or lines & (lines - 1):
            raise ValueError(f"split settings[{key!r}] must be 0 or a power of two (L2 lines), got {lines!r}")
    if not _L2_PREFETCH or interpreter_active():
        t.update(prefetch=0, prefetch_after=0)  # PTX inline asm: not on ROCm, not in the interpreter
    n_chunks = cdiv(N, t["block"])
    capped = bool(t["resident"]) and _MAXNREG
    room = _resident_per_sm(t) * sms  # one-chunk segments that can wait together
    if t["segments"]:
        room = min(room, t["segments"])
    chunks = 1 if n_chunks <= room else cdiv(n_chunks, min(room, sms))  # longer segments: ≤ 1 per SM
    cap = None
    if capped and chunks == 1:
        # 64K registers per SM, allocated in multiples of 8 a thread (ptxas spills past the cap).
        cap = min(255, 65536 // (t["resident"] * t["warps"] * 32) // 8 * 8)
    return t, chunks, cdiv(N, chunks * t["block"]), cap


def _resident_per_sm(t: dict) -> int:
    """Programs per SM that the register cap of settings ``t`` makes room for: ``resident`` when
    there is a cap and that many programs' warps fit an SM's 64, else 1."""
    return t["resident"] if t["resident"] and _MAXNREG and t["resident"] * t["warps"] <= 64 else 1


def _launch_split(op, a, b, out, R, N, geo, settings: dict | None = None, emulate_wait: bool = False):
    """The split kernel over R rows. ``settings``: see ``_split_layout``. ``emulate_wait`` (tests):
    under the interpreter, run the one-launch form with its waits satisfied beforehand."""
    t, chunks, S, cap = _split_layout(op, N, a.element_size(), device_sm_count(a), settings)
    block, pad = t["block"], t["pad"]
    seg = chunks * block
    common = dict(OP=op, ONE_CHUNK=chunks == 1, BLOCK=block, S_POW2=next_pow2(S), TICKET=t["ticket"],
                  SYNC=t["sync"], HOLD=t["hold"], PAD=pad, PREFETCH=t["prefetch"],
                  PREFETCH_AFTER=t["prefetch_after"], LINE=128 // a.element_size(),
                  num_warps=t["warps"])
    # Rows that wait at once: the prefetch serves the first row whose programs are not yet resident.
    per_sm = _resident_per_sm(t) if cap is not None else 1
    ahead = max(1, per_sm * device_sm_count(a) // S)
    if cap is not None:
        common["maxnreg"] = cap
    if t["sync"] == "counter":
        ws = torch.empty((2, R * S), device=a.device, dtype=torch.float32)
        ws_m, ws_l = ws[0], ws[1]
    else:
        ws_m = ws_l = torch.full((R * S,), _EMPTY.value, device=a.device, dtype=torch.int64)
    emulate = emulate_wait and interpreter_active()
    if _spin_allowed(a) or emulate:
        sync = torch.zeros(pad * (1 + R), device=a.device, dtype=torch.int32)
        if emulate:
            # The interpreter runs programs one after another, so none may wait for a later one:
            # the partials are written first and every counter starts as if the row had arrived.
            # The one-launch kernel then runs all of its code but the waiting itself.
            _split_kernel[(S, R)](a, b, out, ws_m, ws_l, sync, N, seg, S, R, ahead, *geo, PHASE=0, **common)
            if op != LOGSUMEXP:
                sync[pad::pad] = S
        _split_kernel[(R * S,)](a, b, out, ws_m, ws_l, sync, N, seg, S, R, ahead, *geo, PHASE=2, **common)
    else:
        _split_kernel[(S, R)](a, b, out, ws_m, ws_l, ws_m, N, seg, S, R, ahead, *geo, PHASE=0, **common)
        _split_kernel[(1 if op == LOGSUMEXP else S, R)](a, b, out, ws_m, ws_l, ws_m, N, seg, S, R, ahead, *geo,
                                                         PHASE=1, **common)


def _forward(op: int, x: torch.Tensor, out_dtype: torch.dtype, strategy: str, settings: dict | None = None,
             emulate_wait: bool = False) -> torch.Tensor:
    """x (..., N), unit stride along N. Returns y (..., N) in out_dtype, or for logsumexp the
    float32 lse (...). ``settings``, ``emulate_wait``: see ``_launch_split``."""
    lead, N = x.shape[:-1], x.shape[-1]
    R = math.prod(lead)
    if op == LOGSUMEXP:
        out = torch.empty(lead, device=x.device, dtype=torch.float32)
        if N == 0:
            return out.fill_(float("-inf"))
    else:
        out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    if R == 0 or N == 0:
        return out
    if not runs_triton(x):
        xf = x.float()
        if op == SOFTMAX:
            return out.copy_(torch.softmax(xf, -1))
        if op == LOG_SOFTMAX:
            return out.copy_(torch.log_softmax(xf, -1))
        return out.copy_(torch.logsumexp(xf, -1))
    _launch(op, x, x, out.view(R, -1) if op != LOGSUMEXP else out.view(R), strategy, settings, emulate_wait)
    return out


def _backward(op: int, y: torch.Tensor, dy: torch.Tensor, dx_dtype: torch.dtype, strategy: str,
              settings: dict | None = None, emulate_wait: bool = False) -> torch.Tensor:
    """softmax / log_softmax backward from the saved output y (..., N) (contiguous).
    ``settings``, ``emulate_wait``: see ``_launch_split``."""
    if dy.shape[-1] > 1 and dy.stride(-1) != 1:
        dy = dy.contiguous()
    dx = torch.empty(y.shape, device=y.device, dtype=dx_dtype)
    R, N = math.prod(y.shape[:-1]), y.shape[-1]
    if R == 0 or N == 0:
        return dx
    if not runs_triton(y):
        yf, dyf = y.float(), dy.float()
        if op == SOFTMAX:
            return dx.copy_(yf * (dyf - (yf * dyf).sum(-1, keepdim=True)))
        return dx.copy_(dyf - torch.exp(yf) * dyf.sum(-1, keepdim=True))
    _launch(_BWD_OF[op], y, dy, dx.view(R, N), strategy, settings, emulate_wait)
    return dx


def _lse_backward(x: torch.Tensor, lse: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx = dy·exp(x − lse): x (..., N) unit stride along N, lse and dy (...)."""
    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    R, N = math.prod(x.shape[:-1]), x.shape[-1]
    if R == 0 or N == 0:
        return dx
    if not runs_triton(x):
        return dx.copy_(dy.float().unsqueeze(-1) * torch.exp(x.float() - lse.unsqueeze(-1)))
    (x,), d1, d2, (sx,) = _prepare(x)
    dy = dy.contiguous()
    block_n = min(next_pow2(N), 4096)
    rows = max(1, 4096 // block_n) if not interpreter_active() else 2
    grid = (cdiv(N, block_n) * cdiv(R, rows),)
    _lse_bwd_kernel[grid](x, dy, lse, dx, R, N, d1, d2, *sx, ROWS=rows, BLOCK_N=block_n,
                          num_warps=4 if interpreter_active() else 8)
    return dx


class _RowOpFn(torch.autograd.Function):
    """Autograd for one op over the last dim of x (..., N) with unit stride along N."""

    @staticmethod
    def forward(ctx, x, op, out_dtype, strategy):
        out = _forward(op, x, out_dtype, strategy)
        ctx.op, ctx.strategy, ctx.x_dtype = op, strategy, x.dtype
        if op == LOGSUMEXP:
            ctx.save_for_backward(x, out)
            return out.to(out_dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph=True: a gradient that is itself differentiable
            return _differentiable_backward(ctx, dy), None, None, None
        if ctx.op == LOGSUMEXP:
            x, lse = ctx.saved_tensors
            return _lse_backward(x, lse, dy), None, None, None
        (y,) = ctx.saved_tensors
        return _backward(ctx.op, y, dy, ctx.x_dtype, ctx.strategy), None, None, None


def _differentiable_backward(ctx, dy: torch.Tensor) -> torch.Tensor:
    """The backward in torch ops, for higher-order gradients (the kernels' gradients carry no graph).
    Softmax and log_softmax differentiate through their saved output, which is this Function's
    output, so a second derivative comes back through the kernels; logsumexp recomputes softmax(x)."""
    dy = dy.float()
    if ctx.op == LOGSUMEXP:
        x, _ = ctx.saved_tensors
        return (dy.unsqueeze(-1) * torch.softmax(x.float(), -1)).to(ctx.x_dtype)
    (y,) = ctx.saved_tensors
    y = y.float()
    if ctx.op == SOFTMAX:
        return (y * (dy - (dy * y).sum(-1, keepdim=True))).to(ctx.x_dtype)
    return (dy - torch.exp(y) * dy.sum(-1, keepdim=True)).to(ctx.x_dtype)


# ------------------------------------------------------------------ public functions

def _dims(dim, ndim: int, allow_many: bool) -> list[int]:
    if allow_many and isinstance(dim, (tuple, list)):
        dims = [_checks.normalize_dim(d, ndim) for d in dim]
        if not dims:
            raise ValueError("dim must name at least one dimension, got ()")
        if len(set(dims)) != len(dims):
            raise ValueError(f"dim must not repeat a dimension, got {tuple(dim)}")
        return dims
    return [_checks.normalize_dim(dim, ndim)]


def _apply(op: int, x: torch.Tensor, dim, *, dtype=None, keepdim: bool = False,
           strategy: str = "auto") -> torch.Tensor:
    """The one entry point: validation, moving the reduced dim(s) last, autograd, the way back.

    ``strategy`` ("auto", "row", "two_pass", "split") is private: tests force each kernel with it.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if dtype is not None:
        if dtype not in _checks.FLOAT_DTYPES:
            names = ", ".join(str(d).replace("torch.", "") for d in _checks.FLOAT_DTYPES)
            raise TypeError(f"dtype must be one of ({names}) or None, got {dtype}")
        # torch's order: cast, then compute. A float32 target changes nothing (the arithmetic is
        # float32), so only a 16-bit one, or a non-float input, is cast first.
        if x.dtype not in _checks.FLOAT_DTYPES or dtype != torch.float32:
            x = x.to(dtype)
    _checks.check_tensor("x", x)
    if x.layout != torch.strided:
        raise TypeError(f"x must be a dense (strided) tensor, got layout {x.layout}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    out_dtype = dtype or x.dtype
    dims = _dims(dim, x.dim(), allow_many=op == LOGSUMEXP)
    if x.dim() == 0:
        y = _RowOpFn.apply(x.reshape(1), op, out_dtype, strategy)
        return y.reshape(())
    k = len(dims)
    xm = x.movedim(dims, list(range(x.dim() - k, x.dim())))
    if k > 1:
        xm = xm.reshape(*xm.shape[:-k], math.prod(xm.shape[-k:]))  # not −1: the kept dims may be empty
    if xm.shape[-1] > 1 and xm.stride(-1) != 1:
        xm = xm.contiguous()
    y = _RowOpFn.apply(xm, op, out_dtype, strategy)
    if op != LOGSUMEXP:
        return y.movedim(-1, dims[0])
    if keepdim:
        for d in sorted(dims):
            y = y.unsqueeze(d)
    return y


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """exp(x) / Σ exp(x) along ``dim``, like ``torch.softmax``, differentiable.

    Args:
        x: any shape and strides; float16, bfloat16 or float32 (integer inputs need ``dtype``).
        dim: the reduced dim (default the last).
        dtype: output dtype (float16, bfloat16 or float32; default x's); a narrower one than x's casts x
            first, as torch does. Arithmetic is float32.

    Returns the same shape as x. A row of all −inf gives NaN (as torch does), a row holding +inf
    gives NaN; empty tensors give empty results. Reading and writing each element once for rows of
    up to 16K elements, and at any length on CUDA (longer rows are split across programs that
    merge their (m, ℓ) states); 2N bytes of traffic per row in the best case, O(chunk) memory.
    A split row's programs wait for each other on the GPU, which assumes the SMs are the kernel's
    own: where such kernels may run concurrently (several streams, MPS, green contexts), set
    ``FLASHATTN_LITE_SPLIT_WAIT=0`` before import to use the two-launch form, which never waits.
    If ``dim`` is not the innermost-stride dim, x is copied once to make it so and the result is a
    non-contiguous view (the reduced dim is stored innermost).

    >>> import torch, flashattn_lite
    >>> x = torch.tensor([[1.0, 2.0, 3.0], [-1e4, 0.0, 1e4]])
    >>> y = flashattn_lite.softmax(x)
    >>> torch.allclose(y, torch.softmax(x, dim=-1)), y.sum(-1).tolist()
    (True, [1.0, 1.0])
    """
    return _apply(SOFTMAX, x, dim, dtype=dtype)


def log_softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x − logsumexp(x) along ``dim``, like ``torch.log_softmax``; arguments and layout as
    :func:`softmax`. A row of all −inf (or holding +inf) gives NaN, as torch does.

    >>> import torch, flashattn_lite
    >>> x = torch.randn(4, 300)
    >>> torch.allclose(flashattn_lite.log_softmax(x, dim=0), torch.log_softmax(x, dim=0), atol=1e-6)
    True
    """
    return _apply(LOG_SOFTMAX, x, dim, dtype=dtype)


def logsumexp(x: torch.Tensor, dim: int | Sequence[int] = -1, keepdim: bool = False, *,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """log Σ exp(x) over ``dim`` (an int or a tuple of dims), like ``torch.logsumexp``.

    Returns x's shape without the reduced dims (kept as size 1 with ``keepdim``), in ``dtype``
    (default x's). A row of all −inf gives −inf, a row holding +inf gives +inf, a row holding NaN
    gives NaN (+inf too), as torch does; an empty reduced dim gives −inf. Reads x once (N bytes per
    row) and writes one value per row. Reducing several dims that cannot be viewed as one copies x
    once. The backward recomputes exp(x − lse) from x and the float32 lse (no N-sized tensor is
    saved besides x).

    >>> import torch, flashattn_lite
    >>> x = torch.tensor([[0.0, 0.0], [float("-inf"), float("-inf")]])
    >>> flashattn_lite.logsumexp(x, dim=-1)
    tensor([0.6931,   -inf])
    """
    _checks.check_bool("keepdim", keepdim)
    return _apply(LOGSUMEXP, x, dim, dtype=dtype, keepdim=keepdim)


__all__ = ["softmax", "log_softmax", "logsumexp"]
