"""Decoding against MLA's latent cache on Hopper (sm_90), in Gluon: stage 1 of ``decode`` for
DeepSeek-V2/V3 attention with the projections absorbed.

The call: q (B, Hq, Nq, 576), one cache tensor (…, 1, N, 576) whose rows are 512 latent and 64
rope columns, v its first 512 columns (a view of k: ``decode.v_from_k``). Every query head reads
the one KV head, so a key row carries 2·Hq·Nq·1088 FLOPs for its 1152 bytes: at 128 heads the step
is compute-bound, and the portable kernel, whose 512-column float32 accumulator leaves room for
16 query rows and mma.sync tiles, runs it at 47–63 TFLOP/s on an H200. This kernel runs it on wgmma.

* One program = 64 query rows (heads × new tokens, ``BLOCK_M``) of one sequence's split of the
  cache (the splits and the partial (o, lse) layout are the portable stage 1's: ``decode`` merges
  them the same way). Grid (row blocks, splits, B), row blocks fastest: the programs of one split
  run together and share its key tiles in the L2.
* Warps (``gl.warp_specialize``): a **loader** warp issues every TMA copy, Q once (nine 64-column
  boxes) and each 64-key tile of the cache as nine boxes into a ring of two slots (72 KiB each);
  the **softmax** warpgroup computes S = Q·Kᵀ over the 576 columns (nine wgmma chunks), the online
  softmax (the Gluon forward's ``_softmax`` and ``_finish``), and O[:, :256] += P·V with P in registers;
  the **value** warpgroup computes O[:, 256:] += P·V from the P and the rescale factor α the softmax
  warpgroup hands it through shared memory (``p_ready`` / ``p_empty``). V is the K tile already in
  shared memory (its first eight boxes): the cache is read once a program. Each warpgroup holds its 256
  columns of O as four 64 × 64 float32 accumulators.
* Masks: only the tiles that need them (the split's end, a new token's causal band) set scores
  to −inf, before the scale is folded into the exp2 (so the scale must be > 0: ``reason``). The
  tile reaching the sequence's end also holds rows past it (stale or uninitialised cache rows): P = 0
  there, but 0 · NaN is NaN, so each warpgroup zeroes those rows of its V boxes in shared memory
  before its P·V.
* Caches it takes (``reason``): contiguous (B, 1, Nmax, 576) or paged (blocks, 1, page, 576)
  with pages of a multiple of 64 rows (a tile lies in one page), 16-bit, the last dim contiguous,
  16-byte aligned rows, no zero strides; anything else runs the portable kernel, as does a call whose
  q or cache address is not 16-byte aligned (``MlaStage``: checked per call).

Shared memory: Q 72 KiB, the K/V ring 144 KiB, P 8 KiB: 224 KiB of the H100's 227.
"""
from __future__ import annotations

import threading

import torch
import triton

from .._launcher import Launcher
from .._log import note_path
from .._runtime import cdiv
from ..merge import LOG2E
from .decode import MLA_HEAD_DIMS, cache_capacity, cache_length, split_bounds, v_from_k

try:  # Gluon's Hopper API as in triton 3.6 (it moves between releases: checked by TESTED_TRITON)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _HAS_GLUON = hasattr(gl, "warp_specialize") and hasattr(tma, "async_copy_global_to_shared")
    if _HAS_GLUON:
        from .attention_fwd_gluon import _finish, _softmax
except Exception:  # noqa: BLE001 - any import problem means: no Gluon path here
    _HAS_GLUON = False

TESTED_TRITON = ("3.6.",)
HEAD_DIMS = MLA_HEAD_DIMS  # q / k and v: MLA's latent cache
DTYPES = (torch.float16, torch.bfloat16)
BLOCK_M = 64  # query rows a program (one wgmma's M)
BLOCK_N = 64  # keys a tile
BOX = 64      # columns a TMA box: 128 bytes, the widest swizzle
CHUNKS = HEAD_DIMS[0] // BOX  # 9 boxes a row of q or of the cache; v's are the first 8, 4 a warpgroup
STAGES = 2
CONSUMER_REGS, LOADER_REGS = 240, 24
PATH_NOTE = ("MLA's latent cache on sm_90 (576 / 512, v a view of k): the Gluon decode kernel "
             "(FLASHATTN_LITE_HOPPER=0 turns it off)")


if _HAS_GLUON:
    # The sizes above as constexprs (a Gluon function reads module globals only as such).
    _BLOCK_M = gl.constexpr(BLOCK_M)
    _BLOCK_N = gl.constexpr(BLOCK_N)
    _BOX = gl.constexpr(BOX)
    _CHUNKS = gl.constexpr(CHUNKS)
    _STAGES = gl.constexpr(STAGES)
    # Both warpgroups' layouts: a 64 × 64 wgmma accumulator (S, and each 64-column part of O), P as
    # the register-A operand of P·V, and the rows of either.
    _ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]))
    _P = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_ACC.value, k_width=2))
    _ROWS = gl.constexpr(gl.SliceLayout(1, _ACC.value))

    @gluon.jit
    def _split(seqlens, b, split, n_splits, min_chunk, n_q, capacity):
        """(seq_len, lo, hi, n_tiles, full) of this program's split, as the portable stage 1 cuts
        them (``decode.split_bounds``) but in 64-key tiles: keys [lo, hi), tiles from ``full`` on masked."""
        seq_len = cache_length(seqlens, b, capacity, False)
        lo, hi = split_bounds(seq_len, split, n_splits, min_chunk, _BLOCK_N)
        n_tiles = gl.cdiv(gl.maximum(hi - lo, 0), _BLOCK_N)
        full = lo + gl.maximum(gl.minimum(hi, seq_len - n_q + 1) - lo, 0) // _BLOCK_N * _BLOCK_N
        return seq_len, lo, hi, n_tiles, full

    @gluon.jit
    def _loader(q_desc, kv_desc, q_smem, kv_smem, q_bar, kv_ready, kv_empty, block_table, stride_btb, stride_bt,
                n_blocks, b, row0, lo, n_tiles, PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """The loader warp: Q's rows once, then key tile j into slot j % _STAGES once both warpgroups
        freed it. A paged tile lies in one page (pages of a multiple of 64 rows): one table read."""
        mbarrier.expect(q_bar, _CHUNKS * q_desc.block_type.nbytes)
        for c in gl.static_range(_CHUNKS):
            tma.async_copy_global_to_shared(q_desc, [b, row0, c * _BOX], q_bar, q_smem.index(c))
        for j in range(n_tiles):
            s = j % _STAGES
            mbarrier.wait(kv_empty.index(s), ((j // _STAGES) & 1) ^ 1)  # a fresh barrier: no wait
            key = lo + j * _BLOCK_N
            if PAGED:
                blk = gl.load(block_table + b.to(gl.int64) * stride_btb + (key // PAGE_SIZE) * stride_bt)
                # A bad id reads block n_blocks − 1, as the portable kernel's (``_kv_location``).
                blk = gl.minimum(blk.to(gl.uint32, bitcast=True), (n_blocks - 1).to(gl.uint32)).to(gl.int32)
                row = key % PAGE_SIZE
            else:
                blk = b
                row = key
            mbarrier.expect(kv_ready.index(s), _CHUNKS * kv_desc.block_type.nbytes)
            for c in gl.static_range(_CHUNKS):
                tma.async_copy_global_to_shared(kv_desc, [blk, row, c * _BOX], kv_ready.index(s),
                                                kv_smem.index(s * _CHUNKS + c))

    @gluon.jit
    def _zero_stale_rows(kv_smem, slot, key, seq_len, FIRST: gl.constexpr):
        """Zero rows at or past ``seq_len`` of V boxes FIRST … FIRST + 3 of slot ``slot`` (the tile of
        keys from ``key``), then make the writes visible to this warpgroup's wgmma. S = Q·Kᵀ read these
        boxes too: the softmax warpgroup zeroes its boxes after S retired, the value warpgroup its
        own after ``p_ready``, which comes after S retired as well."""
        zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        keep = gl.expand_dims(key + gl.arange(0, _BLOCK_N, layout=gl.SliceLayout(1, zl)) < seq_len, 1)
        for c in gl.static_range(FIRST, FIRST + 4):
            box = kv_smem.index(slot * _CHUNKS + c).reshape([_BLOCK_N, _BOX])
            x = box.load(zl)
            box.store(gl.where(keep, x, gl.zeros_like(x)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _pv(p, kv_smem, slot, a0, a1, a2, a3, FIRST: gl.constexpr):
        """O's four 64-column parts += P · V boxes FIRST … FIRST + 3 of slot ``slot`` (issued async;
        waited by the caller)."""
        a0 = warpgroup_mma(p, kv_smem.index(slot * _CHUNKS + FIRST).reshape([_BLOCK_N, _BOX]), a0, is_async=True)
        a1 = warpgroup_mma(p, kv_smem.index(slot * _CHUNKS + FIRST + 1).reshape([_BLOCK_N, _BOX]), a1, is_async=True)
        a2 = warpgroup_mma(p, kv_smem.index(slot * _CHUNKS + FIRST + 2).reshape([_BLOCK_N, _BOX]), a2, is_async=True)
        a3 = warpgroup_mma(p, kv_smem.index(slot * _CHUNKS + FIRST + 3).reshape([_BLOCK_N, _BOX]), a3, is_async=True)
        return warpgroup_mma_wait(0, deps=[a0, a1, a2, a3])

    @gluon.jit
    def _store(o, a0, a1, a2, a3, inv_l, split, b, row0, n_rows, n_q, stride_os, stride_ob, stride_oh, stride_on,
               stride_od, FIRST: gl.constexpr, layout: gl.constexpr):
        """O's four 64-column parts (columns from FIRST · 64), normalised by 1/ℓ, into o (or the
        split's partial) at rows (head, token) = divmod(row, n_q); rows past the heads dropped."""
        rows = row0 + gl.arange(0, _BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, _BOX, layout=gl.SliceLayout(0, layout))
        head = rows // n_q
        tok = rows % n_q
        base = (o + split.to(gl.int64) * stride_os + b.to(gl.int64) * stride_ob
                + gl.expand_dims(head.to(gl.int64) * stride_oh + tok.to(gl.int64) * stride_on, 1)
                + gl.expand_dims(cols.to(gl.int64) * stride_od, 0))
        mask = gl.expand_dims(rows < n_rows, 1)
        scale = gl.expand_dims(inv_l, 1)
        gl.store(base + (FIRST * _BOX) * stride_od, (a0 * scale).to(o.dtype.element_ty), mask=mask)
        gl.store(base + (FIRST * _BOX + _BOX) * stride_od, (a1 * scale).to(o.dtype.element_ty), mask=mask)
        gl.store(base + (FIRST * _BOX + 2 * _BOX) * stride_od, (a2 * scale).to(o.dtype.element_ty), mask=mask)
        gl.store(base + (FIRST * _BOX + 3 * _BOX) * stride_od, (a3 * scale).to(o.dtype.element_ty), mask=mask)

    @gluon.jit
    def _softmax_warpgroup(q_smem, kv_smem, p_smem, x_smem, q_bar, kv_ready, kv_empty, p_ready, p_empty, o, lse,
                           split, b, row0, n_rows, n_q, seq_len, lo, hi, n_tiles, full, qk_scale,
                           stride_os, stride_ob, stride_oh, stride_on, stride_od,
                           stride_ls, stride_lb, stride_lh, stride_ln):
        """S = Q·Kᵀ, the online softmax (base 2, the scale folded into the exp2), P and α handed to
        the value warpgroup, O[:, :256] += P·V; at the end 1/ℓ handed over, O's half and the lse out."""
        dtype: gl.constexpr = q_smem.dtype
        layout: gl.constexpr = _ACC
        row_layout: gl.constexpr = _ROWS
        rows = row0 + gl.arange(0, _BLOCK_M, layout=row_layout)
        last_key = gl.expand_dims(seq_len - n_q + rows % n_q, 1)  # new token t sees keys ≤ L − Nq + t
        m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.full([_BLOCK_M], 0.0, gl.float32, layout=row_layout)
        zero = gl.zeros([_BLOCK_M, _BOX], gl.float32, layout=layout)
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        p_buf = p_smem.index(0).reshape([_BLOCK_M, _BLOCK_N])
        mbarrier.wait(q_bar, 0)
        for j in range(n_tiles):
            slot = j % _STAGES
            key = lo + j * _BLOCK_N
            mbarrier.wait(kv_ready.index(slot), (j // _STAGES) & 1)
            s = warpgroup_mma(q_smem.index(0).reshape([_BLOCK_M, _BOX]),
                              kv_smem.index(slot * _CHUNKS).reshape([_BLOCK_N, _BOX]).permute((1, 0)), zero,
                              use_acc=False, is_async=True)
            for c in gl.static_range(1, _CHUNKS):
                s = warpgroup_mma(q_smem.index(c).reshape([_BLOCK_M, _BOX]),
                                  kv_smem.index(slot * _CHUNKS + c).reshape([_BLOCK_N, _BOX]).permute((1, 0)), s,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            if key + _BLOCK_N > full:  # the split's end or a new token's causal band crosses this tile
                cols = gl.expand_dims(key + gl.arange(0, _BLOCK_N, layout=gl.SliceLayout(0, layout)), 0)
                s = gl.where((cols < hi) & (cols <= last_key), s, float("-inf"))
            m_i, l_i, p, alpha = _softmax(s, m_i, l_i, qk_scale, 0.0, False)
            p = p.to(dtype)
            # Hand P and α over once the value warpgroup has taken the previous tile's (read with
            # ordinary shared loads: the mbarrier orders them, no proxy fence).
            mbarrier.wait(p_empty, (j & 1) ^ 1)  # a fresh barrier: no wait
            p_buf.store(p)
            x_smem.store(alpha)
            mbarrier.arrive(p_ready)
            if key + _BLOCK_N > seq_len:
                _zero_stale_rows(kv_smem, slot, key, seq_len, 0)
            a = gl.expand_dims(alpha, 1)
            a0, a1, a2, a3 = _pv(gl.convert_layout(p, _P), kv_smem, slot, a0 * a, a1 * a, a2 * a, a3 * a, 0)
            mbarrier.arrive(kv_empty.index(slot))
        # 1/ℓ and the lse; a row with no visible key gives O = 0, lse = −inf.
        a0, inv_l, lse_row = _finish(a0, m_i, l_i, None, 0, False, layout, row_layout)
        mbarrier.wait(p_empty, (n_tiles & 1) ^ 1)
        x_smem.store(inv_l)
        mbarrier.arrive(p_ready)
        _store(o, a0, a1, a2, a3, inv_l, split, b, row0, n_rows, n_q, stride_os, stride_ob, stride_oh, stride_on,
               stride_od, 0, layout)
        gl.store(lse + split.to(gl.int64) * stride_ls + b.to(gl.int64) * stride_lb
                 + (rows // n_q).to(gl.int64) * stride_lh + (rows % n_q).to(gl.int64) * stride_ln,
                 lse_row, mask=rows < n_rows)

    @gluon.jit
    def _value_warpgroup(kv_smem, p_smem, x_smem, kv_ready, kv_empty, p_ready, p_empty, o,
                         split, b, row0, n_rows, n_q, seq_len, lo, n_tiles,
                         stride_os, stride_ob, stride_oh, stride_on, stride_od):
        """O[:, 256:] += P·V with the softmax warpgroup's P and α; at the end its 1/ℓ, and O's half out."""
        layout: gl.constexpr = _ACC
        zero = gl.zeros([_BLOCK_M, _BOX], gl.float32, layout=layout)
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        p_buf = p_smem.index(0).reshape([_BLOCK_M, _BLOCK_N])
        for j in range(n_tiles):
            slot = j % _STAGES
            key = lo + j * _BLOCK_N
            mbarrier.wait(p_ready, j & 1)
            mbarrier.wait(kv_ready.index(slot), (j // _STAGES) & 1)  # (complete: the softmax waited for it)
            p = p_buf.load(_P)
            alpha = x_smem.load(_ROWS)
            mbarrier.arrive(p_empty)
            if key + _BLOCK_N > seq_len:
                _zero_stale_rows(kv_smem, slot, key, seq_len, 4)
            a = gl.expand_dims(alpha, 1)
            a0, a1, a2, a3 = _pv(p, kv_smem, slot, a0 * a, a1 * a, a2 * a, a3 * a, 4)
            mbarrier.arrive(kv_empty.index(slot))
        mbarrier.wait(p_ready, n_tiles & 1)
        inv_l = x_smem.load(_ROWS)
        _store(o, a0, a1, a2, a3, inv_l, split, b, row0, n_rows, n_q, stride_os, stride_ob, stride_oh, stride_on,
               stride_od, 4, layout)

    # The counts and the table's row stride vary from call to call: one binary for all their values
    # (Triton would specialise each on = 1 and on divisibility by 16; warmup compiles what remains).
    @gluon.jit(do_not_specialize=["n_rows", "n_splits", "min_chunk", "stride_btb", "capacity", "n_blocks"])
    def _mla_decode_kernel(q_desc, kv_desc, o, lse, seqlens, block_table,
                           stride_os, stride_ob, stride_oh, stride_on, stride_od,
                           stride_ls, stride_lb, stride_lh, stride_ln, stride_btb, stride_bt,
                           n_rows, n_q, n_splits, min_chunk, qk_scale, capacity, n_blocks,
                           PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr,
                           CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        row0 = gl.program_id(0) * _BLOCK_M
        split = gl.program_id(1)
        b = gl.program_id(2)
        seq_len, lo, hi, n_tiles, full = _split(seqlens, b, split, n_splits, min_chunk, n_q, capacity)

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [_CHUNKS] + q_desc.block_type.shape, q_desc.layout)
        kv_smem = gl.allocate_shared_memory(dtype, [_STAGES * _CHUNKS] + kv_desc.block_type.shape, kv_desc.layout)
        p_smem = gl.allocate_shared_memory(dtype, [1] + q_desc.block_type.shape, q_desc.layout)
        x_smem = gl.allocate_shared_memory(gl.float32, [_BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [_STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [_STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(_STAGES):
            mbarrier.init(kv_ready.index(s), count=1)
            mbarrier.init(kv_empty.index(s), count=2)  # both warpgroups read every slot
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_empty, count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_softmax_warpgroup, (q_smem, kv_smem, p_smem, x_smem, q_bar, kv_ready, kv_empty, p_ready, p_empty, o,
                                  lse, split, b, row0, n_rows, n_q, seq_len, lo, hi, n_tiles, full, qk_scale,
                                  stride_os, stride_ob, stride_oh, stride_on, stride_od,
                                  stride_ls, stride_lb, stride_lh, stride_ln)),
            (_value_warpgroup, (kv_smem, p_smem, x_smem, kv_ready, kv_empty, p_ready, p_empty, o,
                                split, b, row0, n_rows, n_q, seq_len, lo, n_tiles,
                                stride_os, stride_ob, stride_oh, stride_on, stride_od)),
            (_loader, (q_desc, kv_desc, q_smem, kv_smem, q_bar, kv_ready, kv_empty, block_table, stride_btb,
                       stride_bt, n_blocks, b, row0, lo, n_tiles, PAGED, PAGE_SIZE)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    _mla_decode_launcher = Launcher(_mla_decode_kernel)


def reason(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table, scale: float) -> str | None:
    """None when this kernel takes the decode call (validated: MLA's head dims), else why not, in
    words: CUDA sm_90 with the Hopper paths on, the triton its Gluon is written for, 16-bit, a scale
    > 0, v a view of k's first 512 columns, one KV head, a cache whose rows TMA can address
    (``_cache_rows``), pages of a multiple of 64 rows. (The addresses' alignment is checked per call.)"""
    from .attention_fwd_hopper import enabled
    if not _HAS_GLUON:
        return "this triton has no Gluon Hopper API (triton.experimental.gluon)"
    if not triton.__version__.startswith(TESTED_TRITON):
        return f"triton {triton.__version__}: the Gluon kernel is written for triton {TESTED_TRITON[0]}x"
    if q.device.type != "cuda" or torch.version.hip is not None or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "not a CUDA sm_90 device"
    if not enabled():
        return "FLASHATTN_LITE_HOPPER=0"
    if (q.shape[3], v_cache.shape[3]) != HEAD_DIMS or q.dtype not in DTYPES:
        return f"head dims {q.shape[3]} / {v_cache.shape[3]} in {q.dtype} (MLA's 576 / 512, 16-bit only)"
    if not scale > 0:
        return f"scale {scale} is not > 0 (the kernel folds it into the exp2 after masking)"
    if not v_from_k(k_cache, v_cache):
        return "v_cache is not a view of k_cache's first 512 columns"
    if k_cache.shape[1] != 1:
        return f"{k_cache.shape[1]} KV heads (MLA's latent cache has one)"
    if _cache_rows(k_cache) is None:
        return "the cache's last dim is not contiguous, or a stride is 0 or not a multiple of 16 bytes"
    if block_table is not None and k_cache.shape[2] % BLOCK_N:
        return f"pages of {k_cache.shape[2]} rows (the kernel takes multiples of {BLOCK_N})"
    return None


def _tma_strides(t: torch.Tensor, shape: list, strides: list) -> tuple[list, list] | None:
    """(shape, strides) for a TMA descriptor over ``t`` where they qualify: the last stride 1, the others
    positive multiples of 16 bytes (a dim of size 1 takes any: its index is always 0, so it gets the
    packed one), else None."""
    strides = list(strides)
    for i in range(len(shape) - 2, -1, -1):
        if shape[i] == 1:
            strides[i] = shape[i + 1] * strides[i + 1]
    if strides[-1] != 1 or any(x <= 0 or (x * t.element_size()) % 16 for x in strides[:-1]):
        return None
    return shape, strides


def _cache_rows(k_cache: torch.Tensor) -> tuple[list, list] | None:
    """(shape, strides) of the cache as (blocks or B, rows, 576) for TMA (its one KV head dropped)."""
    return _tma_strides(k_cache, [k_cache.shape[0], k_cache.shape[2], k_cache.shape[3]],
                        [k_cache.stride(0), k_cache.stride(2), k_cache.stride(3)])


def _q_rows(q: torch.Tensor) -> tuple[list, list] | None:
    """(shape, strides) of q as (B, Hq·Nq, 576) rows (row h·Nq + t: head h, new token t), or None where
    its strides do not allow it."""
    B, Hq, Nq, D = q.shape
    sb, sh, sn, sd = q.stride()
    if Nq > 1 and Hq > 1 and sh != Nq * sn:
        return None
    return _tma_strides(q, [B, Hq * Nq, D], [sb, sn if Nq > 1 else sh, sd])


class MlaStage:
    """Stage 1 of a decode plan on this kernel: the launch's grid and scalars fixed by the call's
    signature; the descriptors built at the first call this kernel takes and re-pointed at each later
    call's tensors, under a lock (plans are shared between threads). A call whose q or cache is not
    16-byte aligned takes ``fallback`` (the portable stage 1, same splits)."""

    def __init__(self, q, k_cache, block_table, splits: int, min_chunk: int, scale: float, o_part_strides: tuple,
                 lse_part_strides: tuple, fallback):
        B, Hq, Nq, D = q.shape
        self.fallback = fallback
        self.q_rows = _q_rows(q)
        self.copy_q = self.q_rows is None  # q is copied into rows first
        if self.copy_q:
            self.q_rows = [B, Hq * Nq, D], [Hq * Nq * D, D, 1]
        self.kv_rows = _cache_rows(k_cache)
        self.q_desc = self.kv_desc = None
        self.lock = threading.Lock()
        paged = block_table is not None
        bt_strides = block_table.stride() if paged else (0, 0)
        self.grid = (cdiv(Hq * Nq, BLOCK_M), splits, B)
        self.rest = (*o_part_strides, *lse_part_strides, *bt_strides, Hq * Nq, Nq, splits, min_chunk, scale * LOG2E,
                     cache_capacity(k_cache, block_table), k_cache.shape[0])
        self.constexprs = dict(PAGED=paged, PAGE_SIZE=k_cache.shape[2] if paged else 1, CONSUMER_REGS=CONSUMER_REGS,
                               LOADER_REGS=LOADER_REGS, num_warps=4)

    def __call__(self, q, k_cache, v_cache, o, lse, seqlens, bt) -> None:
        rows = q.contiguous() if self.copy_q else q
        if rows.data_ptr() % 16 or k_cache.data_ptr() % 16:
            return self.fallback(q, k_cache, v_cache, o, lse, seqlens, bt)
        with self.lock:
            if self.q_desc is None:
                from .attention_fwd_gluon import default_layout
                layout = default_layout((1, BLOCK_M, BOX), q.dtype)
                self.q_desc = TensorDescriptor(rows, *self.q_rows, [1, BLOCK_M, BOX], layout)
                self.kv_desc = TensorDescriptor(k_cache, *self.kv_rows, [1, BLOCK_N, BOX], layout)
            self.q_desc.base, self.kv_desc.base = rows, k_cache
            note_path("hopper", "decode", PATH_NOTE)
            _mla_decode_launcher[self.grid](self.q_desc, self.kv_desc, o, lse, seqlens, bt, *self.rest,
                                            **self.constexprs)
