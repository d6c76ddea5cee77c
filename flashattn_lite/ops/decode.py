"""Decoding against a KV cache: split-KV ("flash-decoding") over contiguous or paged caches.

Semantics. ``cache_seqlens[b]`` = L_b is the number of valid cache positions of sequence b
*including* the Nq new tokens, whose keys/values the caller has already written at positions
L_b − Nq … L_b − 1 (FlashAttention's ``flash_attn_with_kvcache`` convention when it is not asked to
append). New token i (0 ≤ i < Nq) sits at position L_b − Nq + i and attends to cache positions
j ≤ L_b − Nq + i: causal, bottom-right aligned, exactly ``attention(q, k[:, :, :L_b], v[:, :, :L_b],
causal=True)`` for each sequence. Rows that see no key (L_b − Nq + i < 0, e.g. L_b = 0) give
o = 0, lse = −inf.

Kernel. Stage 1: one program per (split, KV head, batch) — and per block of query rows when the GQA
group times Nq exceeds one tile — holds *all* Hq/Hkv query heads of its group and all Nq new tokens
as the rows of one tile (padded to ≥ 16 rows for ``tl.dot``), so every K/V tile is loaded once and
shared by the group. It walks its split of the cache in BLOCK_N tiles with
``merge.online_softmax_update`` (lean unmasked tiles first, masked tail last) and writes a partial
(o, lse). Each sequence splits its *own* length L_b (ragged batches stay balanced), in chunks that
are multiples of BLOCK_N. Stage 2 is ``merge_attention_states_stacked``'s kernel (the partial lse's
are a softmax over the partials); with one split stage 1 writes the final output and stage 2 is
skipped. On Hopper stage 1 is launched as a programmatic dependent of the stream's previous kernel:
its programs are placed while that kernel ends and ask the L2 for their first key tile (at
addresses from a length read early: only a hint), then wait for its writes (``gdc_wait``) before
any read whose value they use; the merge is in turn a dependent of stage 1
and reads each partial o beside its lse (stage 1 writes every partial, an empty one as 0).
The paged cache is addressed through the block table per tile when a page holds whole
tiles (page size a multiple of BLOCK_N), per key row otherwise; the contiguous cache is the same
code with "page" = sequence. MLA's latent cache on sm_90 takes a Gluon stage 1 instead
(``decode_mla_gluon``: 64 query rows a program on wgmma, same splits and partials), where its
rules allow (``decode_mla_gluon.reason``); the portable one stays its fallback.

Cost: reads each valid K/V element once a row block (one for a GQA group of at most 64 query rows;
MLA's 128 heads on its one KV head take eight of 16 rows here (four of 32 with v apart), two of 64 on
the Gluon kernel, compute-bound: 242 FLOPs a cache byte) plus the q tile; stage 2 reads/writes
B·Hq·Nq·num_splits·(Dv + 1) floats.

Host path. At short caches a step's time is mostly the host's, so everything a call launches that
its signature fixes (shapes, strides, dtype, device, table shape, split count, scale) is planned
once: the split count, the buffers' layouts and both launches, bound to their compiled binaries
(``Launcher.bind``). A repeated call validates (one compound test), allocates its output and makes
two bound launches after one check of what they depend on (``launch_bound``); the split
partials, and lse where the caller does not ask for it, are scratch the plan keeps per CUDA stream
and thread (``_Plan.kept_scratch``).
"""
from __future__ import annotations

import functools
import math
import threading
import warnings

import torch
import triton
import triton.language as tl

from .. import _checks
from .._launcher import _current_device, _raw_stream, launch_bound
from .._runtime import (allow_tf32, cdiv, device_sm_count, interpreter_active, l2_prefetch, next_pow2, runs_triton,
                        tuned)
from ..merge import LOG2E, finalize, lse_of_torch, online_softmax_update, online_softmax_update_torch
from .attention_fwd import precision_for
from .merge_states import (_merge_stacked_kernel, dependent_launch_supported, merge_attention_states,
                           merge_attention_states_stacked, merge_stacked_torch, stacked_tiles)

# Split heuristic (see ``choose_num_splits``).
MIN_SPLIT_LEN = 256     # a split shorter than this spends more on setup and the merge than it saves
MAX_SPLITS = 128
WAVES = 1               # target programs ≈ WAVES × SMs (H100 sweep: results/decode-20261123-142935.json)
MAX_BLOCK_M = 64        # query rows (GQA group × Nq) per program; more rows → more programs
# Head dims past 256: MLA's latent cache only (DeepSeek-V2/V3 decoding with the projections absorbed:
# q and the cache's rows 512 latent + 64 rope columns, v the latent 512, one KV head), fp16 / bf16: the
# widths and dtypes run on the GPU. Their float32 accumulator of 512 columns holds 16 query rows a
# program where V is read from K's tile (``_block_m``), whose 32-key tiles ran 4.5–28% faster than 32
# rows × 16 keys (H200, ``benchmarks/results/bench_ab-20261130-1649.json``); 32 rows where V is apart,
# at 16 keys (16 rows × 32 keys spill 504 bytes there; triton 3.6, sm_90).
MLA_HEAD_DIMS, WIDE_BLOCK_M, WIDE_BLOCK_M_V_APART = (576, 512), 16, 32
# Key tiles of its split that stage 1 asks the L2 for while it waits for the previous kernel
# (H100, B 1 steady state: 1 tile +6.7% at 4k and −0.6 µs at 32k; 2 and 4 tiles lost).
# The prefetch is PTX inline asm (``_runtime.l2_prefetch``): none on ROCm.
PREFETCH_TILES = 1 if torch.version.hip is None else 0
# Settings ``decode_forward``'s private ``launch`` takes (benchmarks/decode_sweep.py, tests):
# "config": (BLOCK_N, num_warps, num_stages) launches that config instead of the tuned one;
# "no_pdl": True launches the merge after stage 1 the ordinary way; "no_chain": True launches
# stage 1 the ordinary way after the stream's previous kernel; "masked_parts": True has the merge
# read each partial o only after its lse; "prefetch_tiles": n (0 or 2^k) replaces PREFETCH_TILES;
# "portable": True runs MLA's latent cache on the portable kernel where the Gluon one would take it.
LAUNCH_SETTINGS = ("config", "no_pdl", "no_chain", "masked_parts", "prefetch_tiles", "portable")


# ------------------------------------------------------------------ kernel

@triton.jit
def _kv_location(bt_row, stride_bt, n_blocks, b, start_n, cols, valid,
                 PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """(block, row-in-block) of key positions ``cols`` of sequence b, int64.

    Contiguous cache: block = b, row = position. Paged: block = block_table[b, pos // PAGE_SIZE];
    one table load per tile when the tile lies inside one page, one per key row otherwise. A block
    id outside [0, n_blocks) (an unchecked bad table entry) reads block n_blocks − 1, never past k:
    one unsigned 32-bit min (a signed clamp in 64 bits cost 5% at pages of 16, H200).
    """
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:
            blk = tl.load(bt_row + (start_n // PAGE_SIZE) * stride_bt)
        elif MASKED:
            blk = tl.load(bt_row + (cols // PAGE_SIZE) * stride_bt, mask=valid, other=0)
        else:
            blk = tl.load(bt_row + (cols // PAGE_SIZE) * stride_bt)
        blk = tl.minimum(blk.to(tl.uint32, bitcast=True), (n_blocks - 1).to(tl.uint32))
        return blk.to(tl.int64), (cols % PAGE_SIZE).to(tl.int64)
    else:
        return b.to(tl.int64), cols.to(tl.int64)


@triton.jit
def _decode_tile(acc, m_i, l_i, q, q_tail, k_base, v_base, bt_row, stride_bt, n_blocks, b, start_n, hi, last_key,
                 offs_n, offs_d, offs_t, offs_dv, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
                 qk_scale, MASKED: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr, D_TAIL: tl.constexpr,
                 BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, V_FROM_K: tl.constexpr):
    """Fold one key tile into the group's running state. MASKED: the tile reaches the split's end
    or the causal band of the new tokens (only the last tile or two of a split). D_TAIL: q and K
    columns past the first BLOCK_D (``q_tail``, ``offs_t``: MLA's 64 rope columns past its 512).
    V_FROM_K: V's rows are the first BLOCK_DV columns of K's (the cache holds one tensor, v a view
    of k's columns): V is the K tile already loaded, not read again."""
    cols = start_n + offs_n
    valid = cols < hi
    blk, row = _kv_location(bt_row, stride_bt, n_blocks, b, start_n, cols, valid, PAGED, PAGE_SIZE, BLOCK_N, MASKED)
    k_rows = (blk * stride_kb + row * stride_kn)[None, :]
    k_ptrs = k_base + k_rows + offs_d[:, None] * stride_kd
    v_ptrs = v_base + (blk * stride_vb + row * stride_vn)[:, None] + offs_dv[None, :] * stride_vd
    # Masked tiles may cover stale or uninitialised cache rows: K and V are zero-filled there
    # (0 · NaN would poison the accumulator), scores set to −inf.
    if MASKED:
        k = tl.load(k_ptrs, mask=valid[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
    elif HEAD_DIM >= BLOCK_D:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
    s = tl.dot(q, k, input_precision=PRECISION)
    if D_TAIL > 0:
        t_ptrs = k_base + k_rows + offs_t[:, None] * stride_kd
        if MASKED:
            k_tail = tl.load(t_ptrs, mask=valid[None, :] & (offs_t[:, None] < HEAD_DIM), other=0.0)
        else:
            k_tail = tl.load(t_ptrs, mask=offs_t[:, None] < HEAD_DIM, other=0.0)
        s = tl.dot(q_tail, k_tail, s, input_precision=PRECISION)
    s = s * qk_scale
    if MASKED:
        s = tl.where(valid[None, :] & (cols[None, :] <= last_key[:, None]), s, float("-inf"))
    m_i, l_i, p, alpha = online_softmax_update(m_i, l_i, s)
    if V_FROM_K:  # (columns past v's of the tile only reach accumulator columns never stored)
        v = tl.trans(k)
    elif MASKED:
        v = tl.load(v_ptrs, mask=valid[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    elif HEAD_DIM_V == BLOCK_DV:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_i, l_i


def cache_capacity(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """Positions a sequence's cache holds: Nmax, or the table's width × the block size."""
    return k_cache.shape[2] if block_table is None else block_table.shape[1] * k_cache.shape[2]


@triton.jit
def cache_length(seqlens, b, capacity, VOLATILE: tl.constexpr):
    """cache_seqlens[b] clamped into [0, capacity]: an unchecked bad length (``check_values=False``,
    the default on CUDA) reads the cache's positions, never past them."""
    return tl.minimum(tl.maximum(tl.load(seqlens + b, volatile=VOLATILE), 0), capacity)


@triton.jit
def split_bounds(seq_len, split, n_splits, min_chunk, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) of a sequence's split: ⌈L / n_splits⌉ keys, at least min_chunk, rounded up to
    whole BLOCK_N tiles (the Gluon MLA stage 1 cuts its splits with it too)."""
    chunk = tl.maximum(tl.cdiv(seq_len, n_splits), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    lo = split * chunk
    return lo, tl.minimum(lo + chunk, seq_len)


@triton.jit
def _prefetch_split_start(k, v, seqlens, block_table, stride_btb, stride_bt, capacity, n_blocks, b, h_kv, split,
                          n_splits, min_chunk,
                          stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                          TILES: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                          K_LINES: tl.constexpr, V_LINES: tl.constexpr, LINE: tl.constexpr):
    """L2 prefetch of the first TILES key tiles of this program's split (K_LINES / V_LINES lines
    of LINE elements a key row), computed as the kernel computes its split."""
    seq_len = cache_length(seqlens, b, capacity, True)
    lo, hi = split_bounds(seq_len, split, n_splits, min_chunk, BLOCK_N)
    cols = lo + tl.arange(0, TILES * BLOCK_N)
    cols = tl.minimum(cols, tl.maximum(hi - 1, 0))
    bt_row = block_table + b.to(tl.int64) * stride_btb
    # A split can start past its sequence's end (and past the block table's width): its table
    # lookup starts at the last key instead, like its columns.
    start = tl.minimum(lo, tl.maximum(hi - 1, 0))
    blk, row = _kv_location(bt_row, stride_bt, n_blocks, b, start, cols, cols < hi, PAGED, PAGE_SIZE,
                            TILES * BLOCK_N, True)
    if K_LINES > 0:
        offs = tl.arange(0, K_LINES) * LINE
        l2_prefetch(k + h_kv.to(tl.int64) * stride_kh + (blk * stride_kb + row * stride_kn)[:, None]
                     + offs[None, :] * stride_kd)
    if V_LINES > 0:
        offs = tl.arange(0, V_LINES) * LINE
        l2_prefetch(v + h_kv.to(tl.int64) * stride_vh + (blk * stride_vb + row * stride_vn)[:, None]
                     + offs[None, :] * stride_vd)


def _configs():
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bn, w, s in [(64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 4, 3),
                             (128, 8, 2), (128, 8, 3), (32, 4, 4), (32, 4, 6), (32, 4, 2)]]


def _wide_configs(block_m: int):
    # Head dims past 256 (MLA's 576 / 512): 8 warps share the tile's 512-column float32 accumulator.
    # No spills (triton 3.6, sm_90, ``benchmarks/ptx_hashes.py``) with V read from K's tile at 32
    # rows × 16 keys or 16 rows × 32 keys, V apart at 16 rows × 16 keys (4 bytes at 32 × 16, 504 at
    # 16 × 32); wider tiles spill 0.5–3 KB. ``_block_m`` gives V apart 32 rows, so 16-key tiles.
    widths = (16,) if block_m > 16 else (32, 16)
    return [triton.Config({"BLOCK_N": bn}, num_warps=8, num_stages=s) for bn in widths for s in (2, 3, 4)]


def _prune(configs, named_args):
    # K and V tiles of every pipeline stage must fit in shared memory (~227 KB on H100); V read from
    # K's tile (``V_FROM_K``) takes none of its own.
    if named_args["HEAD_DIM"] > 256 or named_args["HEAD_DIM_V"] > 256:
        configs = _wide_configs(named_args["BLOCK_M"])
    v_dim = 0 if named_args.get("V_FROM_K", False) else named_args["HEAD_DIM_V"]
    per_row = (named_args["HEAD_DIM"] + v_dim) * named_args["k"].element_size()
    kept = [c for c in configs if c.num_stages * c.kwargs["BLOCK_N"] * per_row <= 200 * 1024]
    # A 16-row tile gives 8 warps nothing to share but the syncs: at B 1 32k they lost 2% (2.610
    # against 2.655 TB/s, results/decode_sweep-20261123-165851.json), yet near-ties let the autotuner
    # pick them (results/decode_sweep-20261123-180311.json).
    if named_args["BLOCK_M"] <= 16:
        kept = [c for c in kept if c.num_warps == 4] or kept
    return kept or [min(configs, key=lambda c: c.num_stages * c.kwargs["BLOCK_N"])]


# Split counts, chunk floors and the length class vary with batch and cache length: unspecialized,
# so they never compile a new variant. n_q stays specialized: n_q == 1 (plain decoding) folds the
# row → (head, token) division away, which is where specializing on a length pays.
@tuned(_configs(), key=["HEAD_DIM", "HEAD_DIM_V", "BLOCK_M", "PAGED", "PAGE_SIZE", "V_FROM_K", "len_bucket"],
       interpreter_config=triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1),
       prune=_prune, length="len_bucket")
@triton.jit(do_not_specialize=["n_splits", "min_chunk", "len_bucket", "capacity", "n_blocks"])
def _decode_split_kernel(q, k, v, o, lse, seqlens, block_table,
                         stride_qb, stride_qh, stride_qn, stride_qd,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         stride_os, stride_ob, stride_oh, stride_on, stride_od,
                         stride_ls, stride_lb, stride_lh, stride_ln,
                         stride_btb, stride_bt,
                         n_q, n_splits, min_chunk, qk_scale, len_bucket, capacity, n_blocks,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                         PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, PRECISION: tl.constexpr,
                         WAIT_PRIOR: tl.constexpr, PREFETCH_TILES: tl.constexpr, K_LINES: tl.constexpr,
                         V_LINES: tl.constexpr, LINE: tl.constexpr, LAUNCH_MERGE: tl.constexpr,
                         BLOCK_N: tl.constexpr, D_TAIL: tl.constexpr = 0, V_FROM_K: tl.constexpr = False):
    split = tl.program_id(0)
    n_rows = GROUP * n_q
    row_blocks = tl.cdiv(n_rows, BLOCK_M)
    h_kv = tl.program_id(1) // row_blocks
    rows = (tl.program_id(1) % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    b = tl.program_id(2)
    if WAIT_PRIOR:
        # Launched as a programmatic dependent of whatever the stream ran before (the previous
        # step's merge, in a decode loop): the programs are placed while that kernel ends. Until
        # its writes are visible they only ask the L2 for their first key tiles, at addresses
        # from a length that may be stale (a hint: nothing read here is used after the wait).
        if PREFETCH_TILES > 0:
            _prefetch_split_start(k, v, seqlens, block_table, stride_btb, stride_bt, capacity, n_blocks, b, h_kv,
                                  split, n_splits, min_chunk, stride_kb, stride_kh, stride_kn, stride_kd, stride_vb,
                                  stride_vh, stride_vn, stride_vd, PREFETCH_TILES, PAGED, PAGE_SIZE, BLOCK_N,
                                  K_LINES, V_LINES, LINE)
        tl.extra.cuda.gdc_wait()
    if LAUNCH_MERGE:
        # The merge kernel may be scheduled now: it waits for this grid's writes before reading.
        tl.extra.cuda.gdc_launch_dependents()

    # This sequence's split: a multiple of BLOCK_N, at least min_chunk keys.
    seq_len = cache_length(seqlens, b, capacity, False)
    lo, hi = split_bounds(seq_len, split, n_splits, min_chunk, BLOCK_N)

    # Row r of the tile is query head h_kv·GROUP + r // n_q, new token r % n_q.
    row_ok = rows < n_rows
    head = h_kv * GROUP + rows // n_q
    tok = rows % n_q
    last_key = seq_len - n_q + tok
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_rows = (q + b.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
              + tok[:, None].to(tl.int64) * stride_qn)
    q_tile = tl.load(q_rows + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
                     other=0.0)
    offs_t = BLOCK_D + tl.arange(0, D_TAIL if D_TAIL > 0 else 16)  # q and K columns past BLOCK_D
    q_tail = q_tile  # (unused without a tail)
    if D_TAIL > 0:
        q_tail = tl.load(q_rows + offs_t[None, :] * stride_qd, mask=row_ok[:, None] & (offs_t[None, :] < HEAD_DIM),
                         other=0.0)
    k_base = k + h_kv.to(tl.int64) * stride_kh
    v_base = v + h_kv.to(tl.int64) * stride_vh
    bt_row = block_table + b.to(tl.int64) * stride_btb

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Keys [lo, full) are visible to every row (no causal band, no split end inside a tile).
    full = lo + tl.maximum(tl.minimum(hi, seq_len - n_q + 1) - lo, 0) // BLOCK_N * BLOCK_N
    for start_n in tl.range(lo, full, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q_tile, q_tail, k_base, v_base, bt_row, stride_bt, n_blocks, b,
                                     start_n, hi, last_key, offs_n, offs_d, offs_t, offs_dv, stride_kb, stride_kn,
                                     stride_kd, stride_vb, stride_vn, stride_vd, qk_scale, False, PAGED, PAGE_SIZE,
                                     HEAD_DIM, HEAD_DIM_V, BLOCK_D, D_TAIL, BLOCK_DV, BLOCK_N, PRECISION, V_FROM_K)
    for start_n in tl.range(full, hi, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q_tile, q_tail, k_base, v_base, bt_row, stride_bt, n_blocks, b,
                                     start_n, hi, last_key, offs_n, offs_d, offs_t, offs_dv, stride_kb, stride_kn,
                                     stride_kd, stride_vb, stride_vn, stride_vd, qk_scale, True, PAGED, PAGE_SIZE,
                                     HEAD_DIM, HEAD_DIM_V, BLOCK_D, D_TAIL, BLOCK_DV, BLOCK_N, PRECISION, V_FROM_K)

    out, lse_row = finalize(acc, m_i, l_i)
    o_ptrs = (o + split.to(tl.int64) * stride_os + b.to(tl.int64) * stride_ob
              + head[:, None].to(tl.int64) * stride_oh + tok[:, None].to(tl.int64) * stride_on
              + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    l_ptrs = (lse + split.to(tl.int64) * stride_ls + b.to(tl.int64) * stride_lb
              + head.to(tl.int64) * stride_lh + tok.to(tl.int64) * stride_ln)
    tl.store(l_ptrs, lse_row, mask=row_ok)


# ------------------------------------------------------------------ launcher

@functools.lru_cache(maxsize=4096)  # pure, and on every decode step's host path
def choose_num_splits(batch: int, kv_heads: int, row_blocks: int, max_len: int, sm_count: int) -> int:
    """Splits per sequence for stage 1: about WAVES waves of programs (one per SM), choosing within
    ±25% of that the count whose last wave is fullest (a part-empty last wave leaves SMs idle while
    the rest of the machine waits), preferring fewer splits on ties; never splits shorter than
    MIN_SPLIT_LEN keys (of the longest possible sequence), at most MAX_SPLITS. One wave, not two:
    on the H100 (B 1, Hkv 8) 16 splits beat 33 by 9% at 32k and tie at 4k. On 132 SMs with
    Hkv = 8: B=1 → 16, B=2 → 8, B=4 → 4, B=8 → 2, B ≥ 16 → 1 (no merge stage).
    """
    programs = batch * kv_heads * row_blocks
    cap = max(1, min(MAX_SPLITS, cdiv(max_len, MIN_SPLIT_LEN)))
    ideal = WAVES * sm_count / programs
    lo, hi = max(1, int(0.75 * ideal)), min(cap, math.ceil(1.25 * ideal))
    if cap < lo:
        return cap

    def last_wave_fill(s):
        waves = programs * s / sm_count
        return waves / math.ceil(waves)
    return max(range(lo, hi + 1), key=lambda s: (round(last_wave_fill(s), 2), -s))


@functools.lru_cache(maxsize=64)  # on every decode step's host path
def _lines(d: int, itemsize: int) -> int:
    """Whole 128-byte lines in a row of d elements, rounded down to a power of two (0 if none)."""
    n = d * itemsize // 128
    return 1 << (n.bit_length() - 1) if n else 0


def _row_block(rows: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, bool]:
    """(query rows a program, whether V is read from K's tile): the group's ``rows`` (GQA group × Nq)
    up to 64; for head dims past 256 up to ``WIDE_BLOCK_M`` where v is a view of k's first columns
    (MLA's one cache tensor: V from K's tile) or ``WIDE_BLOCK_M_V_APART``."""
    wide = max(k_cache.shape[3], v_cache.shape[3]) > 256
    shared = wide and v_from_k(k_cache, v_cache)
    cap = (WIDE_BLOCK_M if shared else WIDE_BLOCK_M_V_APART) if wide else MAX_BLOCK_M
    return max(16, min(cap, next_pow2(rows))), shared


def head_blocks(d: int) -> tuple[int, int]:
    """(BLOCK_D, D_TAIL) of a head dim: one power-of-two block to 256; past it, the largest power of
    two within d and the rest as a second block (MLA's 576: 512 and 64)."""
    if d <= 256:
        return max(16, next_pow2(d)), 0
    main = 1 << (d.bit_length() - 1)
    return main, (max(16, next_pow2(d - main)) if d > main else 0)


def v_from_k(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether v's rows are the first columns of k's (one cache tensor, v a view of k's columns, as
    MLA's latent cache) and V's block is K's main one: at head dims past 256 a program then takes V
    from the K tile it loaded (``V_FROM_K``), not from a second load."""
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride() == k_cache.stride()
            and v_cache.shape[3] <= k_cache.shape[3]
            and max(16, next_pow2(v_cache.shape[3])) == head_blocks(k_cache.shape[3])[0])


def _check_launch(launch: dict) -> None:
    unknown = set(launch) - set(LAUNCH_SETTINGS)
    if unknown:
        raise ValueError(f"launch settings must be among {list(LAUNCH_SETTINGS)}, got {sorted(unknown)}")
    tiles = launch.get("prefetch_tiles", 0)
    if type(tiles) is not int or tiles < 0 or tiles & (tiles - 1):  # tl.arange needs 2^k tiles
        raise ValueError(f"launch['prefetch_tiles'] must be 0 or a power of two (key tiles), got {tiles!r}")


class _Stage:
    """One kernel launch of a plan: its grid, constexprs and every argument after the tensors.
    Once it has run, ``Launcher.bind``'s launch repeats it on new tensors; where that declines
    (see ``bind``), or under the interpreter (no binding), the kernel's ordinary launch runs."""
    __slots__ = ("kernel", "grid", "rest", "constexprs", "bindable", "bound")

    def __init__(self, kernel, grid, rest: tuple, constexprs: dict, bindable: bool):
        self.kernel, self.grid, self.rest, self.constexprs = kernel, grid, rest, constexprs
        self.bindable, self.bound = bindable, None

    def __call__(self, *tensors) -> None:
        if self.bound is not None and self.bound(*tensors):
            return
        args = (*tensors, *self.rest)
        self.kernel[self.grid](*args, **self.constexprs)
        if self.bindable and self.bound is None:
            self.bound = self.kernel.bind(self.grid, args, self.constexprs, len(tensors))


class _Plan:
    """Everything a decode call launches that its signature (``_signature``) fixes: the output's
    and the partials' shapes and strides, and the two launches."""
    __slots__ = ("device", "dtype", "o_layout", "lse_layout", "o_part_layout", "lse_part_layout", "stage1", "merge",
                 "scratch_bytes", "kept")

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table, need_lse: bool = True):
        """(o, lse) of one call; without ``need_lse`` lse may be the plan's scratch, which the next
        call of this thread on this stream overwrites."""
        device = self.device
        o = torch.empty_strided(*self.o_layout, device=device, dtype=self.dtype)
        merge = self.merge
        kept = self.kept_scratch() if self.scratch_bytes and (merge is not None or not need_lse) else None
        if kept is not None:
            lse, o_part, lse_part = kept
        else:
            lse, (o_part, lse_part) = None, self.new_partials()
        if need_lse or lse is None:
            lse = torch.empty_strided(*self.lse_layout, device=device, dtype=torch.float32)
        bt = cache_seqlens if block_table is None else block_table  # never read when not paged
        stage1 = self.stage1
        if merge is None:
            # One split: stage 1 writes o and lse themselves (its partial strides are theirs).
            stage1(q, k_cache, v_cache, o, lse, cache_seqlens, bt)
            return o, lse
        stage1_args, merge_args = (q, k_cache, v_cache, o_part, lse_part, cache_seqlens, bt), (o_part, lse_part, o, lse)
        first = getattr(stage1, "bound", None)  # (the MLA Gluon stage binds nothing)
        done = 0 if first is None or merge.bound is None else launch_bound((first, merge.bound),
                                                                           (stage1_args, merge_args))
        if done < 1:
            stage1(*stage1_args)
        if done < 2:
            merge(*merge_args)
        return o, lse

    def kept_scratch(self) -> tuple | None:
        """(lse, o_part, lse_part) the plan keeps for the current stream and thread (the partials
        None with one split), made at their first call there, for the launches to write and no
        caller to keep: a later call of that thread on that stream runs after this one's kernels
        (two threads on one stream could interleave their launches: each has its own). The stream
        is the current device's, where the launches go. None while that stream is capturing a CUDA
        graph (the graph's are its own: a replay may run beside eager calls), inside a compiled
        graph (its tensors may live in a CUDA graph's memory), and past the plan's SCRATCH_COPIES
        (stream, thread) pairs or the package's SCRATCH_TOTAL_BYTES."""
        if self.device.type != "cuda":
            stream = None
        elif torch.compiler.is_compiling() or torch._C._cuda_isCurrentStreamCapturing():
            return None
        else:
            stream = _raw_stream(_current_device())
        key = (stream, threading.get_ident())
        kept = self.kept.get(key)
        if kept is None:
            if len(self.kept) >= SCRATCH_COPIES:  # a thread that ended leaves its pair: drop those
                alive = {t.ident for t in threading.enumerate()}
                for gone in [k for k in self.kept if k[1] not in alive]:
                    del self.kept[gone]
            if len(self.kept) >= SCRATCH_COPIES or kept_scratch_bytes() + self.scratch_bytes > SCRATCH_TOTAL_BYTES:
                return None
            lse = torch.empty_strided(*self.lse_layout, device=self.device, dtype=torch.float32)
            kept = self.kept[key] = (lse, *self.new_partials())
        return kept

    def new_partials(self) -> tuple:
        """(o_part, lse_part), new; (None, None) with one split."""
        if self.merge is None:
            return None, None
        device = self.device
        return (torch.empty_strided(*self.o_part_layout, device=device, dtype=torch.float32),
                torch.empty_strided(*self.lse_part_layout, device=device, dtype=torch.float32))


# Scratch (a call's partials, and lse when not returned) a plan keeps per stream and thread
# (``_Plan.kept_scratch``) up to SCRATCH_BYTES a copy; larger ones are allocated per call, where the
# kernels' time dwarfs the allocations' host time. All plans together keep at most
# SCRATCH_TOTAL_BYTES (a serving loop makes a plan per batch size); the plans' cache starting over
# lets theirs go.
SCRATCH_BYTES = 2 << 20
SCRATCH_COPIES = 8  # (stream, thread) pairs a plan keeps scratch for
SCRATCH_TOTAL_BYTES = 64 << 20


def kept_scratch_bytes() -> int:
    """The scratch the plans in ``_PLANS`` keep (counted when a plan would keep more)."""
    return sum(plan.scratch_bytes * len(plan.kept) for plan in _PLANS.values())


def _contiguous(shape) -> tuple:
    """(shape, row-major strides)."""
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(shape), tuple(reversed(strides))


def _make_plan(q, k_cache, v_cache, block_table, scale: float, num_splits: int | None, launch: dict,
               bindable: bool) -> _Plan:
    """The plan of a call (``launch``: experiment settings); ``bindable``: its stages bind their
    launches for the calls to come."""
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k_cache.shape[1], v_cache.shape[3]
    paged = block_table is not None
    capacity = cache_capacity(k_cache, block_table)
    block_m, shared = _row_block((Hq // Hkv) * Nq, k_cache, v_cache)
    row_blocks = cdiv((Hq // Hkv) * Nq, block_m)
    mla_gluon = False
    if D > 256 and "config" not in launch and not launch.get("portable", False):
        from . import decode_mla_gluon  # (it builds on this module; plans are made once a signature)
        mla_gluon = decode_mla_gluon.reason(q, k_cache, v_cache, block_table, scale) is None
    if mla_gluon:  # its programs hold 64 query rows: the split count sees its row blocks
        row_blocks = cdiv(Hq * Nq, decode_mla_gluon.BLOCK_M)
    if num_splits is None:
        splits = choose_num_splits(B, Hkv, row_blocks, capacity, device_sm_count(q))
        min_chunk = MIN_SPLIT_LEN
    else:  # (past one split a cache position, the rest are empty: not allocated)
        splits, min_chunk = min(num_splits, max(1, capacity)), 1
    plan = _Plan()
    plan.device, plan.dtype = q.device, q.dtype
    plan.o_layout, plan.lse_layout = _contiguous((B, Hq, Nq, Dv)), _contiguous((B, Hq, Nq))
    plan.o_part_layout = plan.lse_part_layout = None
    plan.kept = {}
    if splits == 1:
        o_part_strides, lse_part_strides = (0, *plan.o_layout[1]), (0, *plan.lse_layout[1])
    else:
        # Row-major over (B, Hq, Nq, S): each output row's partials are contiguous for stage 2.
        _, (sb, sh, sn, ss, sd) = _contiguous((B, Hq, Nq, splits, Dv))
        o_part_strides = (ss, sb, sh, sn, sd)
        _, (lb, lh, ln, ls) = _contiguous((B, Hq, Nq, splits))
        lse_part_strides = (ls, lb, lh, ln)
        plan.o_part_layout = ((splits, B, Hq, Nq, Dv), o_part_strides)
        plan.lse_part_layout = ((splits, B, Hq, Nq), lse_part_strides)
    scratch_bytes = 4 * B * Hq * Nq * (1 + (splits > 1) * splits * (Dv + 1))
    plan.scratch_bytes = scratch_bytes if bindable and scratch_bytes <= SCRATCH_BYTES else 0  # 0: none kept
    bt_strides = block_table.stride() if paged else (0, 0)
    len_bucket = 0 if interpreter_active() else next_pow2(max(1, cdiv(capacity, splits)))
    # The merge launched as a programmatic dependent of stage 1 (Hopper+): its launch and start
    # overlap stage 1's tail instead of following it.
    dependent = dependent_launch_supported(q)
    pdl = splits > 1 and dependent and not launch.get("no_pdl", False)
    wait_prior = dependent and not launch.get("no_chain", False)
    prefetch_tiles = launch.get("prefetch_tiles", PREFETCH_TILES) if wait_prior else 0
    itemsize = q.element_size()
    kernel, config = _decode_split_kernel, {}
    if "config" in launch:  # an experiment: one fixed config, no tuning
        kernel = _decode_split_kernel.jit
        config = dict(zip(("BLOCK_N", "num_warps", "num_stages"), launch["config"]))
    rest = (*q.stride(), *k_cache.stride(), *v_cache.stride(), *o_part_strides, *lse_part_strides, *bt_strides,
            Nq, splits, min_chunk, scale * LOG2E, len_bucket, capacity, k_cache.shape[0])
    block_d, d_tail = head_blocks(D)
    tail = dict(D_TAIL=d_tail) if d_tail else {}  # (past 256 only: the kernels below compile as before)
    constexprs = dict(GROUP=Hq // Hkv, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=block_d, BLOCK_DV=max(16, next_pow2(Dv)),
                      BLOCK_M=block_m, PAGED=paged, PAGE_SIZE=k_cache.shape[2] if paged else 1,
                      PRECISION=precision_for(q.dtype), WAIT_PRIOR=wait_prior, PREFETCH_TILES=prefetch_tiles,
                      K_LINES=_lines(D, itemsize), V_LINES=_lines(Dv, itemsize), LINE=128 // itemsize,
                      LAUNCH_MERGE=pdl, V_FROM_K=shared, **tail, **config,
                      **({"launch_pdl": True} if wait_prior else {}))
    plan.stage1 = _Stage(kernel, (splits, Hkv * cdiv((Hq // Hkv) * Nq, block_m), B), rest, constexprs, bindable)
    if mla_gluon:  # the Gluon kernel, the portable one kept for calls whose tensors it cannot take
        plan.stage1 = decode_mla_gluon.MlaStage(q, k_cache, block_table, splits, min_chunk, scale, o_part_strides,
                                                lse_part_strides, plan.stage1)
    plan.merge = None
    if splits > 1:
        # ``merge_stacked_launch``'s launch, kept as a stage. Stage 1 writes every partial, an
        # empty one as o = 0, lse = −inf: the merge may read o beside lse.
        rows = B * Hq * Nq
        block_s, block_r, block_d = stacked_tiles(rows, Dv, splits, q)
        rest = (*o_part_strides, *lse_part_strides, *plan.o_layout[1], *plan.lse_layout[1], Hq, Nq, rows, splits)
        constexprs = dict(HEAD_DIM=Dv, BLOCK_R=block_r, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4,
                          PARTS_FINITE=not launch.get("masked_parts", False),
                          **(dict(AFTER_PRODUCER=True, launch_pdl=True) if pdl else {}))
        plan.merge = _Stage(_merge_stacked_kernel, (cdiv(rows, block_r), cdiv(Dv, block_d)), rest, constexprs,
                            bindable)
    return plan


# Plans of recent calls by signature: a repeated call allocates and makes two bound launches.
_PLANS: dict = {}
_PLAN_ENTRIES = 256


def _signature(q, k_cache, v_cache, block_table, scale: float, num_splits: int | None) -> tuple:
    """Everything a plan depends on besides the tensors' addresses (the lengths and the table's
    entries are read by the kernels; ``return_lse`` changes nothing launched)."""
    return (q.shape, k_cache.shape, v_cache.shape, q.stride(), k_cache.stride(), v_cache.stride(), q.dtype,
            q.device, None if block_table is None else (block_table.shape, block_table.stride()), num_splits,
            scale, q.dtype == torch.float32 and allow_tf32(),
            k_cache.shape[3] > 256 and v_from_k(k_cache, v_cache))  # (MLA's only: off every other step's path)


def decode_forward(q, k_cache, v_cache, cache_seqlens, block_table, *, scale: float, num_splits: int | None,
                   launch: dict | None = None, need_lse: bool = True):
    """Launch stage 1 (and stage 2 when split). Inputs already validated; cache_seqlens
    contiguous. Returns (o, lse); without ``need_lse`` that lse is scratch the next call on the
    stream overwrites. ``launch``: experiment settings (``LAUNCH_SETTINGS``), planned afresh at
    every call; without them the plan of the call's signature is reused."""
    if launch is None:
        signature = _signature(q, k_cache, v_cache, block_table, scale, num_splits)
        plan = _PLANS.get(signature)
        if plan is None:
            plan = _make_plan(q, k_cache, v_cache, block_table, scale, num_splits, {}, True)
            if len(_PLANS) >= _PLAN_ENTRIES:
                _PLANS.clear()
            _PLANS[signature] = plan
    else:
        _check_launch(launch)
        plan = _make_plan(q, k_cache, v_cache, block_table, scale, num_splits, launch, False)
    return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, need_lse)


# ------------------------------------------------------------------ CPU twin

def _cpu_decode(q, k_cache, v_cache, cache_seqlens, block_table, *, scale: float, num_splits: int | None):
    """The same split-KV algorithm in PyTorch (float32): per sequence, per split partial states,
    merged with the stacked twin."""
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k_cache.shape[1], v_cache.shape[3]
    G = Hq // Hkv
    capacity = cache_capacity(k_cache, block_table)
    if num_splits is None:
        rows = _row_block(G * Nq, k_cache, v_cache)[0]
        splits = choose_num_splits(B, Hkv, cdiv(G * Nq, rows), capacity, device_sm_count(q))
        min_chunk = MIN_SPLIT_LEN
    else:
        splits, min_chunk = num_splits, 1
    o = torch.zeros((B, Hq, Nq, Dv), dtype=torch.float32)
    lse = torch.full((B, Hq, Nq), float("-inf"))
    for b, L in enumerate(cache_seqlens.tolist()):
        L = min(max(L, 0), capacity)  # as the kernels read an unchecked length (``cache_length``)
        if L == 0:
            continue
        if block_table is not None:
            pages = block_table[b, :cdiv(L, k_cache.shape[2])].long()
            n_blocks = k_cache.shape[0]  # a bad id reads the last block, as ``_kv_location`` does
            pages = torch.where((pages < 0) | (pages >= n_blocks), n_blocks - 1, pages)
            k = k_cache[pages].transpose(0, 1).reshape(Hkv, -1, D)[:, :L]
            v = v_cache[pages].transpose(0, 1).reshape(Hkv, -1, Dv)[:, :L]
        else:
            k, v = k_cache[b, :, :L], v_cache[b, :, :L]
        qg = q[b].float().reshape(Hkv, G, Nq, D)
        k, v = k.float().unsqueeze(1), v.float().unsqueeze(1)
        chunk = cdiv(max(cdiv(L, splits), min_chunk), 64) * 64
        last_key = (L - Nq + torch.arange(Nq))[:, None]
        parts_o, parts_lse = [], []
        for lo in range(0, L, chunk):
            hi = min(lo + chunk, L)
            s = torch.matmul(qg, k[:, :, lo:hi].transpose(-1, -2)) * scale
            s = s.masked_fill(torch.arange(lo, hi)[None, :] > last_key, float("-inf"))
            m0 = torch.full(s.shape[:-1], float("-inf"))
            m, l, p, _ = online_softmax_update_torch(m0, torch.zeros_like(m0), s)
            parts_o.append(torch.matmul(p, v[:, :, lo:hi]) / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1))
            parts_lse.append(lse_of_torch(m, l))
        ob, lb = merge_stacked_torch(torch.stack(parts_o), torch.stack(parts_lse))
        o[b], lse[b] = ob.reshape(Hq, Nq, Dv), lb.reshape(Hq, Nq)
    return o.to(q.dtype), lse


# ------------------------------------------------------------------ validation and public API

def _validate(q, k_cache, v_cache, cache_seqlens, block_table, num_splits):
    """Every check below, as one compound test for the valid call (this runs on every decode step,
    where host time is most of the step at short caches); a failing call walks the detailed
    checks, which name the culprit."""
    if not _looks_valid(q, k_cache, v_cache, cache_seqlens, block_table, num_splits):
        _explain_invalid(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)


def _looks_valid(q, k_cache, v_cache, cache_seqlens, block_table, num_splits) -> bool:
    try:
        qs, ks, vs = q.shape, k_cache.shape, v_cache.shape
        dev = q.device
        return (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and q.dtype in _checks.FLOAT_DTYPES
                and k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
                and k_cache.device == dev and v_cache.device == dev and cache_seqlens.device == dev
                and min(qs) > 0 and min(ks[:3]) > 0 and ks[:3] == vs[:3] and ks[3] == qs[3] and vs[3] > 0
                and ((qs[3] <= 256 and vs[3] <= 256) or ((qs[3], vs[3]) == MLA_HEAD_DIMS and q.dtype != torch.float32))
                and qs[1] % ks[1] == 0
                and cache_seqlens.dim() == 1 and cache_seqlens.dtype == torch.int32 and cache_seqlens.shape[0] == qs[0]
                and (ks[0] == qs[0] if block_table is None else
                     (block_table.dim() == 2 and block_table.dtype == torch.int32 and block_table.shape[0] == qs[0]
                      and block_table.shape[1] > 0 and block_table.device == dev))
                and (num_splits is None or (type(num_splits) is int and num_splits >= 1)))
    except (AttributeError, TypeError):
        return False


def _explain_invalid(q, k_cache, v_cache, cache_seqlens, block_table, num_splits):
    _checks.check_tensor("q", q, ndim=4)
    _checks.check_tensor("k_cache", k_cache, ndim=4)
    _checks.check_tensor("v_cache", v_cache, ndim=4)
    _checks.check_same(("q", "k_cache", "v_cache"), (q, k_cache, v_cache), "dtype")
    _checks.check_same(("q", "k_cache", "v_cache"), (q, k_cache, v_cache), "device")
    B, Hq, Nq, D = q.shape
    if min(B, Hq, Nq) == 0:
        raise ValueError(f"q must be non-empty, got shape {tuple(q.shape)}")
    layout = "(num_blocks, Hkv, block_size, D)" if block_table is not None else "(B, Hkv, Nmax, D)"
    if min(k_cache.shape[:3]) == 0:
        raise ValueError(f"k_cache {layout} must be non-empty, got shape {tuple(k_cache.shape)}")
    if block_table is None:
        _checks.check_dim("k_cache", "batch size (dim 0)", k_cache.shape[0], B, "q's")
    _checks.check_dim("v_cache", "dim 0", v_cache.shape[0], k_cache.shape[0], "k_cache's")
    _checks.check_dim("v_cache", "heads (dim 1)", v_cache.shape[1], k_cache.shape[1], "k_cache's")
    _checks.check_dim("v_cache", "dim 2", v_cache.shape[2], k_cache.shape[2], "k_cache's")
    _checks.check_dim("k_cache", "head dim (dim 3)", k_cache.shape[3], D, "q's")
    Hkv = k_cache.shape[1]
    if Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k_cache/v_cache heads ({Hkv}) for GQA/MQA")
    Dv = v_cache.shape[3]
    if max(D, Dv) > 256:  # MLA's latent cache only (``MLA_HEAD_DIMS``), 16-bit
        if (D, Dv) != MLA_HEAD_DIMS:
            raise ValueError(f"q/k_cache and v_cache head dims past 256 must be MLA's latent cache, "
                             f"{MLA_HEAD_DIMS[0]} and {MLA_HEAD_DIMS[1]}; got {D} and {Dv}")
        if q.dtype == torch.float32:
            raise ValueError(f"head dims {D} / {Dv} (MLA's latent cache) take float16 or bfloat16, got float32")
    _checks.check_head_dim("q/k_cache", D, 1, 256 if D != MLA_HEAD_DIMS[0] else D)
    _checks.check_head_dim("v_cache", Dv, 1, 256 if Dv != MLA_HEAD_DIMS[1] else Dv)
    _checks.check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    _checks.check_dim("cache_seqlens", "length", cache_seqlens.shape[0], B, "q's batch size")
    if cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens must be on q's device ({q.device}), got {cache_seqlens.device}")
    if block_table is not None:
        _checks.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
        _checks.check_dim("block_table", "batch size (dim 0)", block_table.shape[0], B, "q's")
        if block_table.shape[1] == 0:
            raise ValueError(f"block_table must have at least one column, got shape {tuple(block_table.shape)}")
        if block_table.device != q.device:
            raise ValueError(f"block_table must be on q's device ({q.device}), got {block_table.device}")
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int ≥ 1, got {num_splits!r}")


def _check_values(cache_seqlens, block_table, capacity: int, num_blocks: int, block_size: int) -> None:
    """Lengths within [0, capacity]; every block id a sequence uses within [0, num_blocks).
    One device→host transfer (a sync on CUDA); detail is computed only on failure."""
    bad_len = (cache_seqlens < 0) | (cache_seqlens > capacity)
    flags = [bad_len.any()]
    if block_table is not None:
        need = (cache_seqlens.clamp(0, capacity).long() + block_size - 1) // block_size
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < need[:, None]
        bad_blk = used & ((block_table < 0) | (block_table >= num_blocks))
        flags.append(bad_blk.any())
    flags = torch.stack(flags).tolist()
    if flags[0]:
        b = int(bad_len.nonzero()[0, 0])
        where = (f"block_table width {block_table.shape[1]} × block_size {block_size}" if block_table is not None
                 else "k_cache dim 2")
        raise ValueError(f"cache_seqlens[{b}] = {int(cache_seqlens[b])} is outside [0, {capacity}] "
                         f"(the cache holds {capacity} positions per sequence: {where})")
    if len(flags) > 1 and flags[1]:
        b, j = (int(x) for x in bad_blk.nonzero()[0])
        raise ValueError(f"block_table[{b}, {j}] = {int(block_table[b, j])} is not a block id in [0, {num_blocks}) "
                         f"(k_cache has {num_blocks} blocks; sequence {b} has cache_seqlens = "
                         f"{int(cache_seqlens[b])}, so it uses its first {int(need[b])} table entries)")


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
           block_table: torch.Tensor | None = None, scale: float | None = None, num_splits: int | None = None,
           return_lse: bool = False, check_values: bool | None = None):
    """Attention of a few new tokens per sequence against a KV cache (split-KV, GQA-shared loads).

    Args:
        q: (B, Hq, Nq, D) queries of the Nq new tokens of each sequence (Nq = 1 for plain decoding,
            > 1 for speculative / chunked steps). fp16, bf16 or fp32; any strides.
        k_cache, v_cache: contiguous layout (B, Hkv, Nmax, D) / (B, Hkv, Nmax, Dv), or, with
            ``block_table``, paged layout (num_blocks, Hkv, block_size, D) / (…, Dv). q's dtype and
            device; any strides (a (…, N, H, D) cache passed as ``.transpose(1, 2)`` is read in place).
            Hq must be a multiple of Hkv (query head h reads KV head h // (Hq / Hkv)); Dv may differ
            from D. D, Dv at most 256, or MLA's latent cache, 576 and 512 (512 latent + 64 rope
            columns; fp16 / bf16), where v_cache may be a view of k_cache's first 512 columns
            (``v_from_k``: a program takes V from the K tile it loaded; on sm_90 the Gluon kernel
            of ``decode_mla_gluon`` runs such calls).
        cache_seqlens: (B,) int32 on q's device: L_b = valid positions of sequence b *including* the
            new tokens, whose K/V must already be written at positions L_b − Nq … L_b − 1.
        block_table: (B, max_blocks) int32 on q's device: position j of sequence b lives in block
            ``block_table[b, j // block_size]``, row ``j % block_size``. Entries past
            ceil(L_b / block_size) are never read (pad with anything, e.g. −1).
        scale: multiplies q·k; defaults to D ** -0.5.
        num_splits: splits of each sequence's keys across programs (flash-decoding). None chooses
            (``choose_num_splits``: about one program per SM, ≥ 256 keys per split, each
            sequence splitting its own length). 1 = no split, no merge kernel. n > 1 cuts each
            sequence into n parts of ⌈L_b / n⌉ keys rounded up to whole key tiles (so a short
            sequence may fill fewer than n; the rest are empty partials the merge ignores).
        return_lse: also return lse (B, Hq, Nq) float32, natural log (for merging with other partial
            states, e.g. a prefix cache or another shard, via ``merge_attention_states``).
        check_values: check the *values* of cache_seqlens (0 ≤ L_b ≤ capacity, capacity = Nmax or
            max_blocks · block_size) and of the block-table entries in use (0 ≤ id < num_blocks).
            None (default): check when those tensors are on the CPU (free); on CUDA, checking costs
            one device→host sync, so it runs only with True (and never while capturing a CUDA
            graph). Shapes, dtypes and devices are always checked. Unchecked bad values are read
            clamped (a length into [0, capacity]; a block id outside [0, num_blocks) as the last
            block): the call gives what those values give and reads nothing outside the cache.

    Causal, bottom-right: new token i attends to positions j ≤ L_b − Nq + i (itself and everything
    before it). Rows with no visible key give o = 0, lse = −inf.

    Returns:
        o (B, Hq, Nq, Dv) in q's dtype (and lse). Inference only: no autograd.

    Memory-bound but for MLA's many heads on one KV head: reads Σ_b L_b·Hkv·(D + Dv) cache elements
    once per block of at most 64 query rows (past head dim 256 on the portable kernel 16, or 32 with
    v apart from k); two launches (one if num_splits = 1). CUDA tensors run Triton; CPU tensors run
    the same algorithm in PyTorch (or the Triton kernels under ``TRITON_INTERPRET=1``).

    Two sequences with 5 and 32 cached positions, one new token each, GQA 4:2:

    >>> import torch, flashattn_lite
    >>> q = torch.randn(2, 4, 1, 16)
    >>> k_cache, v_cache = torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    >>> o = flashattn_lite.decode(q, k_cache, v_cache, torch.tensor([5, 32], dtype=torch.int32))
    >>> o.shape
    torch.Size([2, 4, 1, 16])
    >>> ref = flashattn_lite.attention(q[:1], k_cache[:1, :, :5], v_cache[:1, :, :5], causal=True)
    >>> torch.allclose(o[:1], ref, atol=1e-5)
    True
    """
    _validate(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad):
        warnings.warn("decode is inference only: its output carries no gradient to q, k_cache or v_cache "
                      "(call it under torch.no_grad(), or use attention for training)", stacklevel=2)
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if return_lse is not True and return_lse is not False:
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    on_cpu = cache_seqlens.is_cpu
    if check_values is None:
        check_values = on_cpu
    elif not isinstance(check_values, bool):
        raise TypeError(f"check_values must be a bool or None, got {type(check_values).__name__}")
    if check_values and not (not on_cpu and torch.cuda.is_current_stream_capturing()):
        _check_values(cache_seqlens, block_table, cache_capacity(k_cache, block_table), k_cache.shape[0], k_cache.shape[2])
    if not cache_seqlens.is_contiguous():  # the kernels read length b at offset b
        cache_seqlens = cache_seqlens.contiguous()
    if runs_triton(q):  # kernels only: nothing for autograd to record
        o, lse = decode_forward(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale, num_splits=num_splits,
                                need_lse=return_lse)
    else:
        with torch.no_grad():
            o, lse = _cpu_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale, num_splits=num_splits)
    return (o, lse) if return_lse else o


__all__ = ["decode", "choose_num_splits", "merge_attention_states", "merge_attention_states_stacked"]
