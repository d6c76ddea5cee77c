"""The Gluon attention backward at head dim 256 (Gemma's) and the widths run padded to it: two
kernels, dK/dV and dQ; for plain causal calls with v at most 128 wide, the dK/dV kernel alone in one
pass; for plain causal MLA (q, k 192; v 128), a third kernel of 128-key programs.

``attention_bwd_gluon`` keeps each consumer's 64 keys' dK and dV in registers: at D 128 that is
128 registers a thread, at D 256 it would be 256, more than a thread has. So at D 256:

* **The dK/dV kernel** (``_attn_bwd_gluon_wide_kernel``): a program takes one tile of 64 keys of
  one (batch, KV head), and its two consumer warpgroups split the work by role. For each streamed
  tile of 64 queries, consumer 0 computes Sᵀ and Pᵀ and writes P (queries × keys, rounded to the
  input dtype) to shared memory (``p_ready``); consumer 1 computes dPᵀ, reads P and writes
  dS = P ∘ (dP − δ) (``ds_ready``). Both score wgmmas are 64 × 64 (split by query halves they were
  64 × 32, bound by their shared-memory reads). Consumer c then owns dK and dV's columns
  [128c, 128c + 128): dV += Pᵀ·dO[:, cols], dK += dSᵀ·Q[:, cols] (P and dS read transposed from
  shared memory; 128 registers a thread for both, as at D 128), and says when its wgmmas reading P
  and dS retired (``p_free``). Where v's head dim is narrower than q's (MLA's 192 / 128), V and dO
  are loaded at v's own padded width, at least 128 (``wide_value_width``): dPᵀ runs over it, and
  consumer c owns dV's columns [64c, 64c + 64) of 128. The loader warp, the steps' order (GQA
  group, the query tiles of the causal band or window, the rotated start) and the masks are the
  D ≤ 128 kernel's (``_loader``, ``_query_tile``, ``query_tiles``, ``_masked``). dK·scale and dV
  leave by masked register stores (rows past Nk dropped).
* **The dQ kernel** (``_attn_bwd_gluon_wide_dq_kernel``): a program takes one tile of 64 queries of
  one (batch, query head), Q, dO, lse₂ and δ loaded once, and its key tiles (the forward's
  ``key_tiles``: the causal band or window only) streamed through a ring of two slots. Consumer c
  takes the key tiles j ≡ c (mod 2) on its own: S = Q·Kᵀ and dP = dO·Vᵀ (64 × 64; over v's own
  width, as above), P and dS as the dK/dV kernel makes them, dQ += dS·K with dS from registers
  into a 64 × 256 float32 partial. The consumers share only the ring, so one's softmax runs while
  the other's wgmmas do; at the end consumer 1 leaves its partial in the idle ring and consumer 0
  adds it and stores dQ·scale.

**One pass** (``one_pass``: plain causal calls over dense batches whose V runs at most 128 wide,
MLA's 192 / 128): the dK/dV kernel alone, each step's dQ = dS·K computed there too (consumer 1 over
columns 0–127, consumer 0 over the rest of q's width rounded up to 64, so the two carry equal
GEMMs) and reduce-added into a float32 buffer of q's columns (``dq_buffer_width``: 192, not 256)
through a 16 KB staging buffer a consumer, as the D ≤ 128 kernel does; its dQ is then not
bit-reproducible. There, at N 2k and 8k on an H200, 1.08–1.09 ×
the pair (non-causal 0.97–0.99 ×, so those calls keep the pair; ``benchmarks/NOTES.md``,
2026-11-30). The reductions walk the head-major causal order, heaviest tiles first.

**128-key programs** (``takes_mla_programs``: the one pass's calls at MLA's 192 / 128 exactly; the
config with ``mla``; the one pass stays for the other widths, as 256 / 128 or 192 / 64): ``_attn_bwd_gluon_mla_kernel``, one program per 128-key tile as cuDNN runs it, each
consumer owning 64 keys' dK (64 × 192) and dV (64 × 128) in registers, Q and K in 64-column chunks.
Each step's Q, dO loads and its dQ reduce-adds (dS over the 128 keys times K, three 64-column blocks
dealt alternately to the consumers) serve 128 keys, half the L2 bytes of the 64-key one pass.

Seven GEMMs a (key tile, query tile) pair instead of the fused five, and no float32 reduce-adds:
with dQ fused (the first form, measured in ``benchmarks/NOTES.md``, 2026-11-29), a 64-key tile
reduce-adds 64 KB of dQ a step, half the FLOPs per reduced byte of D 128's 128-key tiles, and the
L2's reduction rate bound the kernel at 0.7–0.77 × cuDNN; the pair measured 0.99–1.12 × cuDNN. In the
pair each gradient element has one writer, so the result is bit-reproducible: deterministic mode
(``torch.use_deterministic_algorithms``) keeps this path (its default never picks the one pass; the one
pass's config passed by hand raises there, or warns in warn-only mode, as any fused-dQ config does).

Covers what ``attention_bwd_gluon.supported`` allows at D 256: causal (bottom-right) or not, GQA
(a dK/dV program walks its group), sliding windows, softcap, ALiBi, sinks (the saved lse has
them), dense batches, padded ones with per-row ranges and packed varlen ones (``SEQ`` 1, 2: a
dK/dV program finds its sequence's key tile, by ``seq_key_tile``, and shifts its rows as the
D ≤ 128 kernel does; a dQ program finds its sequence's query tile, varlen by the forward's scan of
cu_seqlens, counts its rows and keys from the sequence's first and stores only its queries). The
GQA group split stays at D ≤ 128; the host side (``attention_bwd_gluon.attention_backward_gluon``)
is shared: the row statistics, the dk/dv/dq allocation, the sinks' gradient.
"""
from __future__ import annotations

from ..merge import LOG2E
from .attention_bwd_gluon import _HAS_GLUON, MLA_QK, MLA_V
from .attention_fwd import SEQ_DENSE, SEQ_VARLEN, fold_factor, seq_args, sequence, varlen_scan, varlen_slot


if _HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)

    from .._launcher import Launcher
    from .attention_bwd_gluon import (_dq_stage, _dq_zeros, _loader, _masked, _query_tile, _reduce_rows, _row,
                                      _step_barriers, _store_rows, _tma_reduce_add, _to_16bit, banded_key_tile,
                                      query_tiles, seq_key_tile, seq_rows)
    from .attention_fwd_gluon import _band, _qk, alibi_slope2, key_tiles

    @gluon.jit
    def _wide_consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, p_smem, ds_smem,
                       kv_bar, ready, empty, p_ready, ds_ready, p_free, dk_base, dv_base, stride_dkn, stride_dvn,
                       b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left, win_right, qk_scale,
                       sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2, n_q,
                       ME: gl.constexpr, GROUP: gl.constexpr, ROTATE: gl.constexpr, CAUSAL: gl.constexpr,
                       HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                       FAST_TANH: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       STAGES: gl.constexpr, SEQ: gl.constexpr, D_REAL: gl.constexpr, DV_REAL: gl.constexpr,
                       dq_desc, dq_stage, FUSED_DQ: gl.constexpr, QK: gl.constexpr = 0):
        """Consumer ``ME`` of a wide-head program, by role: consumer 0 computes Sᵀ (64 keys × the
        step's 64 queries) and Pᵀ, writes P (and under softcap P ∘ (1 − tanh²) to the dS buffer)
        and issues its dV at once; consumer 1 computes dPᵀ, reads P once it is in (``p_ready``) and
        writes dS (``ds_ready``). Each then owns dK's columns [HEAD_DIM/2 · ME, +HEAD_DIM/2) and
        dV's [DV/2 · ME, +DV/2) (DV: V's width, ``launches``).
        Both score wgmmas are N = 64 (query halves made them N = 32, bound by their shared-memory
        reads). The scores' options and a ranges or varlen sequence's row bound ``n_q`` (``SEQ`` 1,
        2) as the D ≤ 128 consumer makes them. ``FUSED_DQ`` (dense batches, V at most 128 wide):
        each step's dQ = dS·K too, consumer 1 over columns 0–127, consumer 0 over the rest of Sᵀ's
        width (which balances the two: Sᵀ is consumer 0's), reduce-added into ``dq_desc``'s float32
        buffer through the consumer's staging buffer. ``QK`` > 0 (the host's, ``launches``): Sᵀ over
        q's first QK columns (its head dim rounded up to 64: MLA's 192 of the 256), the rest being
        TMA's zeros (``_qk``); 0: over all HEAD_DIM."""
        dtype: gl.constexpr = k_smem.dtype
        HALF_D: gl.constexpr = HEAD_DIM // 2
        DV: gl.constexpr = v_smem.shape[4]  # V's and dO's width: HEAD_DIM, or v's own (``launches``)
        HALF_DV: gl.constexpr = DV // 2
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        S_K: gl.constexpr = QK if QK > 0 else HEAD_DIM  # the columns Sᵀ reduces over (``QK``)
        # dK's columns here: this consumer's half, to q's (``QK``) where it ends inside it (MLA's 192:
        # consumer 1 over 128–191), at least one 64-column block (q's 128 in the 256-wide boxes)
        DK_W: gl.constexpr = min(HALF_D, max(S_K - ME * HALF_D, 64))
        dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DK_W, 16])
        dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HALF_DV, 16])
        k_all = k_smem.index(0).reshape([64, HEAD_DIM])
        v_all = v_smem.index(0).reshape([64, DV])
        keys = start_n + gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout))
        tail = start_n + 64 > n_k  # the tile holds zero-filled keys past Nk
        dk = gl.zeros([64, DK_W], gl.float32, layout=dk_layout)
        dv = gl.zeros([64, HALF_DV], gl.float32, layout=dv_layout)
        st_zero = gl.zeros([64, BLOCK_M], gl.float32, layout=st_layout)
        # ALiBi: |i + off − j| = |(start_m + off − start_n) + c − r| for query column c and key row r,
        # integers small within a sequence: exact in float32 however far into a packed batch
        keys_f = gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout)).to(gl.float32)
        DQ_COL: gl.constexpr = 0 if ME == 1 else 128  # this consumer's dQ columns (``FUSED_DQ``)
        DQ_W: gl.constexpr = 128 if ME == 1 else S_K - 128
        gl.static_assert((not FUSED_DQ) or DQ_W > 0, "FUSED_DQ: q's head dim above 128 (``one_pass``)")
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DQ_W, 16])
        mbarrier.wait(kv_bar, 0)

        for it in range(GROUP * n_tiles):
            s = it % STAGES
            h, start_m = _query_tile(it, n_tiles, lo, rot, h_kv, GROUP, ROTATE, BLOCK_M)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            q_t = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
            do_t = do_smem.index(s).reshape([BLOCK_M, DV])
            if ME == 0:
                st = _qk(k_all, q_t, st_zero, S_K)
                slope = 0.0
                if ALIBI:  # slope·log2 e of (b, h) over the exp2's factor, read while the wgmma runs
                    slope = alibi_slope2(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP)
                lse2 = _row(lse_smem, s, BLOCK_M, st_layout)
                st = warpgroup_mma_wait(0, deps=[st])
                x, fold = fold_factor(st, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
                t = x  # tanh(·) under softcap, for its derivative
                if ALIBI:
                    rows_f = ((start_m + off - start_n)
                              + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))).to(gl.float32)
                    x = x - slope * gl.abs(gl.expand_dims(rows_f, 0) - gl.expand_dims(keys_f, 1))
                pt = gl.exp2(x * fold - lse2)
                # Masked: the steps outside the rows that see every key (``query_tiles``) and a tile
                # holding keys past Nk.
                edge = start_m < mid_lo
                if HAS_LEFT:
                    edge = edge | (start_m >= mid_hi)
                if SEQ != 0:  # a tile crossing the row's query end (its rows past it: the padding's)
                    edge = edge | (start_m + BLOCK_M > n_q)
                if edge | tail:
                    pt = _masked(pt, keys, start_m, n_k, off, win_left, win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                 BLOCK_M, st_layout, n_q, SEQ)
                p16 = _to_16bit(pt, dtype, not SOFTCAP)
                # P (and dS's factor under softcap) out once the previous step's wgmmas reading them retired.
                mbarrier.wait(p_free, (it & 1) ^ 1)
                p_smem.store(gl.permute(p16, (1, 0)))
                if SOFTCAP:  # Pᵀ ∘ (1 − tanh²), rounded once like Pᵀ; consumer 1 turns it into dS in place
                    ds_smem.store(gl.permute((pt * (1.0 - t * t)).to(dtype), (1, 0)))
                fence_async_shared()
                mbarrier.arrive(p_ready)
                dv = warpgroup_mma(p_smem.permute((1, 0)), do_t.slice(0, HALF_DV, dim=1), dv, is_async=True)
                mbarrier.wait(ds_ready, it & 1)
            else:
                dpt = warpgroup_mma(v_all, do_t.permute((1, 0)), st_zero, use_acc=False, is_async=True)
                delta = _row(delta_smem, s, BLOCK_M, st_layout)
                dpt = warpgroup_mma_wait(0, deps=[dpt])
                mbarrier.wait(p_ready, it & 1)
                if SOFTCAP:
                    pd = ds_smem.permute((1, 0)).load(st_layout).to(gl.float32)
                else:
                    pd = p_smem.permute((1, 0)).load(st_layout).to(gl.float32)
                ds16 = _to_16bit(pd * (dpt - delta), dtype, not SOFTCAP)
                ds_smem.store(gl.permute(ds16, (1, 0)))
                fence_async_shared()
                mbarrier.arrive(ds_ready)
                dv = warpgroup_mma(p_smem.permute((1, 0)), do_t.slice(HALF_DV, HALF_DV, dim=1), dv, is_async=True)
            dk = warpgroup_mma(ds_smem.permute((1, 0)), q_t.slice(ME * HALF_D, DK_W, dim=1), dk, is_async=True)
            if FUSED_DQ:
                dq = warpgroup_mma(ds_smem, k_all.slice(DQ_COL, DQ_W, dim=1),
                                   gl.zeros([BLOCK_M, DQ_W], gl.float32, layout=dq_layout), use_acc=False,
                                   is_async=True)
                dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
            else:
                dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
            mbarrier.arrive(empty.index(s))
            mbarrier.arrive(p_free)
            if FUSED_DQ:
                _reduce_rows(dq * sm_scale, dq_stage, dq_desc, b, h, start_m, ME, DQ_W, DQ_COL, False)
        if FUSED_DQ:
            tma.store_wait(0)
        _store_rows(dk * sm_scale, dk_base, stride_dkn, start_n, n_k, ME * HALF_D, dk_layout, D_REAL)
        COLS_V: gl.constexpr = DV_REAL if DV_REAL > 0 else D_REAL  # dv's own columns where v's head dim is not q's
        _store_rows(dv, dv_base, stride_dvn, start_n, n_k, ME * HALF_DV, dv_layout, COLS_V)

    @gluon.jit(do_not_specialize=["n_heads", "n_kv_heads", "n_q", "n_k", "band", "banded_heads", "win_left",
                                  "win_right", "n_seq"])
    def _attn_bwd_gluon_wide_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dk, dv,
                                    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                    n_heads, n_kv_heads, n_q, n_k, band, banded_heads, win_left, win_right,
                                    qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale,
                                    softcap2, q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, row_starts,
                                    dq_desc, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                                    HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                                    FAST_TANH: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
                                    STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                                    SEQ: gl.constexpr = 0, D_REAL: gl.constexpr = 0, DV_REAL: gl.constexpr = 0,
                                    FUSED_DQ: gl.constexpr = False, QK: gl.constexpr = 0,
                                    HEADS_FASTEST: gl.constexpr = False):
        ROTATE: gl.constexpr = not (CAUSAL or HAS_RIGHT)  # as the D ≤ 128 kernel (its comment)
        pid = gl.program_id(0)
        q0 = 0
        if SEQ == 2:  # varlen: slots of key tiles over the packed batch (``seq_key_tile``), per KV head
            h_kv, slot = varlen_slot(pid, gl.num_programs(0), n_kv_heads, HEADS_FASTEST)
            b, start_n, q0, n_q, k0, n_k, off = seq_key_tile(slot, 0, q_starts, q_ends, k_starts, k_ends, stride_seq,
                                                             n_seq, n_q, n_k, 64, SEQ)
            tile = start_n // 64
        else:
            n_key_tiles = gl.cdiv(n_k, 64)
            if CAUSAL and SEQ == 0:
                bh_kv, tile = banded_key_tile(pid, gl.num_programs(0), n_key_tiles, band, banded_heads)
            else:
                tile = pid % n_key_tiles
                bh_kv = pid // n_key_tiles
            b = bh_kv // n_kv_heads
            h_kv = bh_kv % n_kv_heads
            start_n = tile * 64
            if SEQ == 1:  # per-row ranges: the padded length's tiles; those past the row's range idle
                b, start_n, q0, n_q, k0, n_k, off = seq_key_tile(tile, b, q_starts, q_ends, k_starts, k_ends,
                                                                 stride_seq, 1, n_q, n_k, 64, SEQ)
        seq_n_q = 0  # the consumers' row bound: only ranges and varlen tiles have one
        if SEQ == 0:
            off = n_k - n_q
        else:
            seq_n_q = n_q
        lo, n_tiles, mid_lo, mid_hi = query_tiles(start_n, n_q, off, win_left, win_right, CAUSAL, HAS_LEFT,
                                                  HAS_RIGHT, BLOCK_M, 64)
        rot = start_n * 0
        if ROTATE:
            rot = tile
        if SEQ != 0:  # rows of the tensors from here on (``seq_rows``, as the D ≤ 128 kernel)
            lo, mid_lo, mid_hi, start_n, n_k, seq_n_q, off = seq_rows(lo, mid_lo, mid_hi, start_n, n_k, seq_n_q,
                                                                      off, q0, k0)
        # (varlen: the host passes batch strides 0, the packed tensors having one batch row)
        dk_base = dk + b.to(gl.int64) * stride_dkb + h_kv.to(gl.int64) * stride_dkh
        dv_base = dv + b.to(gl.int64) * stride_dvb + h_kv.to(gl.int64) * stride_dvh

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [1] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1] + v_desc.block_type.shape, v_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                               delta_desc.layout)
        pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], dtype)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, 64], pds_layout)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, 64], pds_layout)
        if FUSED_DQ:  # one float32 staging buffer a consumer
            dq_stage = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)
        else:
            dq_stage = k_smem
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)
        mbarrier.init(p_ready, count=1)  # consumer 0: P is in
        mbarrier.init(ds_ready, count=1)  # consumer 1: dS is in
        mbarrier.init(p_free, count=2)
        fence_async_shared()

        row_shift = -q0  # lse₂/δ column of query row r: r + row_shift (``_aligned_rows``)
        if SEQ == 2:
            row_shift = gl.load(row_starts + b) - q0
        # (The two consumers' argument tuples are written out: a tuple built once and concatenated
        # with each consumer's index loses its constexprs in triton 3.6's Gluon.)
        gl.warp_specialize([
            (_wide_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, p_smem, ds_smem,
                              kv_bar, ready, empty, p_ready, ds_ready, p_free, dk_base, dv_base, stride_dkn,
                              stride_dvn, b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left,
                              win_right, qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale,
                              softcap2, seq_n_q, 0, GROUP, ROTATE, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI,
                              FAST_TANH, HEAD_DIM, BLOCK_M, STAGES, SEQ, D_REAL, DV_REAL, dq_desc, dq_stage,
                              FUSED_DQ, QK)),
            (_wide_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, p_smem, ds_smem,
                              kv_bar, ready, empty, p_ready, ds_ready, p_free, dk_base, dv_base, stride_dkn,
                              stride_dvn, b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left,
                              win_right, qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale,
                              softcap2, seq_n_q, 1, GROUP, ROTATE, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI,
                              FAST_TANH, HEAD_DIM, BLOCK_M, STAGES, SEQ, D_REAL, DV_REAL, dq_desc, dq_stage,
                              FUSED_DQ, QK)),
            (_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc,
                       q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready, empty,
                       b, h_kv, start_n, n_heads, lo, n_tiles, rot, row_shift,
                       1, GROUP, ROTATE, BLOCK_M, STAGES, SEQ, 1)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    _attn_bwd_gluon_wide_launcher = Launcher(_attn_bwd_gluon_wide_kernel)

    # ----------------------------------------------------------------------------- the dQ kernel

    @gluon.jit
    def _dq_loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                   lse_smem, delta_smem, q_bar, ready, empty, b, h, start_m, n_heads, lo, n_tiles, q0, k0, col,
                   GROUP: gl.constexpr, STAGES: gl.constexpr):
        """The dQ kernel's loader warp: the query tile's Q, dO, lse₂ and δ once, then K and V of each
        of its key tiles into slot j % STAGES once both consumers freed it. ``b`` is the tensors'
        batch row; rows count from the sequence's first query ``q0`` and key ``k0`` (ranges and
        varlen; else 0); ``col`` is the tile's lse₂/δ column (``_aligned_rows``)."""
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + lse_desc.block_type.nbytes
                        + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, q0 + start_m, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [b, h, q0 + start_m, 0], q_bar, do_smem)
        tma.async_copy_global_to_shared(lse_desc, [b * n_heads + h, col], q_bar, lse_smem)
        tma.async_copy_global_to_shared(delta_desc, [b * n_heads + h, col], q_bar, delta_smem)
        for j in range(n_tiles):
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)  # a fresh barrier passes
            bar = ready.index(s)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, h // GROUP, k0 + lo + j * 64, 0], bar, k_smem.index(s))
            tma.async_copy_global_to_shared(v_desc, [b, h // GROUP, k0 + lo + j * 64, 0], bar, v_smem.index(s))

    @gluon.jit
    def _dq_consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, q_bar, ready, empty, done, dq_base,
                     stride_dqm, b, h, start_m, lo, n_tiles, mid_lo, mid_hi, n_q, n_k, off, win_left, win_right,
                     qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                     ME: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, FAST_TANH: gl.constexpr, HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, STAGES: gl.constexpr, D_REAL: gl.constexpr, QK: gl.constexpr = 0):
        """Consumer ``ME`` of a dQ program: the key tiles j ≡ ME (mod 2) of the query tile, on its own
        (the two consumers share only the loader's ring, so one's softmax runs while the other's
        wgmmas do): S = Q·Kᵀ and dP = dO·Vᵀ (64 × 64), P and dS as the dK/dV kernel makes them, and
        dQ += dS·K with dS from registers, a 64 × HEAD_DIM float32 partial in registers. At the end
        consumer 1 leaves its partial in the (then idle) K ring and consumer 0 adds it and stores
        dQ·scale (rows past Nq dropped). ``QK``: S's columns, as ``_wide_consumer``'s."""
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 64, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        DV: gl.constexpr = v_smem.shape[4]  # V's and dO's width: HEAD_DIM, or v's own (``launches``)
        q_all = q_smem.reshape([BLOCK_M, HEAD_DIM])
        S_K: gl.constexpr = QK if QK > 0 else HEAD_DIM  # the columns S reduces over (``_wide_consumer``)
        do_all = do_smem.reshape([BLOCK_M, DV])
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        s_zero = gl.zeros([BLOCK_M, 64], gl.float32, layout=s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
        right = win_right
        if CAUSAL:
            right = 0
        slope = 0.0
        rows_f = (rows + off).to(gl.float32)  # ALiBi: |i + off − j|, exact below 2²⁴
        if ALIBI:  # slope·log2 e of (b, h) over the exp2's factor
            slope = alibi_slope2(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP)
        mbarrier.wait(q_bar, 0)
        lse2 = gl.expand_dims(lse_smem.reshape([BLOCK_M]).load(gl.SliceLayout(1, s_layout)), 1)
        delta = gl.expand_dims(delta_smem.reshape([BLOCK_M]).load(gl.SliceLayout(1, s_layout)), 1)

        for j in range(ME, n_tiles, 2):
            s = j % STAGES
            start_n = lo + j * 64
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            k_t = k_smem.index(s).reshape([64, HEAD_DIM])
            v_t = v_smem.index(s).reshape([64, DV])
            st = _qk(q_all, k_t, s_zero, S_K)
            st = warpgroup_mma_wait(0, deps=[st])
            x, fold = fold_factor(st, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
            t = x
            cols = start_n + gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
            if ALIBI:
                x = x - slope * gl.abs(gl.expand_dims(rows_f, 1) - gl.expand_dims(cols.to(gl.float32), 0))
            p = gl.exp2(x * fold - lse2)
            if (start_n < mid_lo) | (start_n >= mid_hi):  # the band's edges, keys past Nk (``key_tiles``)
                p = gl.where(_band(gl.expand_dims(cols, 0), rows, n_k, off, win_left, right, HAS_LEFT,
                                   HAS_RIGHT or CAUSAL), p, 0.0)
            if SOFTCAP:
                pd = (p * (1.0 - t * t)).to(dtype)
            else:
                pd = _to_16bit(p, dtype, True)
            # dP issued once S is dead (registers); the other consumer's wgmmas fill the wait.
            dpt = warpgroup_mma(do_all, v_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dpt = warpgroup_mma_wait(0, deps=[dpt])
            pd = pd.to(gl.float32)
            ds = gl.convert_layout(_to_16bit(pd * (dpt - delta), dtype, not SOFTCAP), a_layout, assert_trivial=True)
            dq = warpgroup_mma(ds, k_t, dq, is_async=True)
            # Retired before this consumer's next tile is awaited: each consumer has one slot of
            # the ring (tiles alternate), which the loader refills only once it is free.
            dq = warpgroup_mma_wait(0, deps=[dq])
            mbarrier.arrive(empty.index(s))
        # Both consumers past their last wgmma: the ring is idle (every load was awaited), so its K
        # half holds consumer 1's partial.
        mbarrier.arrive(done)
        mbarrier.wait(done, 0)
        part_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        part = k_smem._reinterpret(gl.float32, [BLOCK_M, HEAD_DIM], part_layout)
        if ME == 1:
            part.store(dq)
        mbarrier.arrive(done)  # (its second phase: consumer 1's partial is in)
        if ME == 0:
            mbarrier.wait(done, 1)
            dq = dq + part.load(dq_layout)
            _store_rows(dq * sm_scale, dq_base, stride_dqm, start_m, n_q, 0, dq_layout, D_REAL)

    @gluon.jit(do_not_specialize=["n_heads", "n_q", "n_k", "win_left", "win_right", "n_seq"])
    def _attn_bwd_gluon_wide_dq_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq, stride_dqb,
                                       stride_dqh, stride_dqm, n_heads, n_q, n_k, win_left, win_right, qk_scale,
                                       sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                                       q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, row_starts,
                                       HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                                       HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                                       FAST_TANH: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
                                       STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                       LOADER_REGS: gl.constexpr, SEQ: gl.constexpr = 0, D_REAL: gl.constexpr = 0,
                                       QK: gl.constexpr = 0, HEADS_FASTEST: gl.constexpr = False):
        pid = gl.program_id(0)
        if SEQ == 2:
            # Varlen: (heads, tile slots) in one dim (``varlen_slot``), the slots sized from the totals
            # and mapped to (sequence, query tile) by the forward's scan of cu_seqlens, each sequence's
            # last tile first; a slot past the last tile is an empty program.
            h, slot = varlen_slot(pid, gl.num_programs(0), n_heads, HEADS_FASTEST)
            lanes = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
            b, start_m = varlen_scan(q_starts, q_ends, n_seq, n_q, slot, lanes, BLOCK_M)
            live = b < n_seq
            b = gl.minimum(b, n_seq - 1)
        else:
            # One program per 64-query tile of one (batch, query head), a head's tiles on consecutive
            # programs, under causal the heaviest (last) tiles first.
            n_q_tiles = gl.cdiv(n_q, BLOCK_M)
            tile = pid % n_q_tiles
            if CAUSAL:
                tile = n_q_tiles - 1 - tile
            bh = pid // n_q_tiles
            b = bh // n_heads
            h = bh % n_heads
            start_m = tile * BLOCK_M
        # Ranges, varlen: rows and keys counted from the sequence's first (the forward's ``sequence``).
        q0, n_q, k0, n_k, off = sequence(b, n_q, n_k, q_starts, q_ends, k_starts, k_ends, stride_seq, n_k - n_q, SEQ)
        if SEQ == 1 and CAUSAL:  # the heaviest of the row's own tiles first (its tiles past the end idle)
            start_m = (gl.cdiv(n_q, BLOCK_M) - 1 - pid % n_q_tiles) * BLOCK_M
        lo, n_tiles, mid_lo, mid_hi = key_tiles(start_m, n_k, off, win_left, win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                                BLOCK_M, 64)
        col = start_m  # the tile's lse₂/δ column (``_aligned_rows``)
        tb = b  # the tensors' batch row
        if SEQ == 1:  # a program past the row's tiles loads no key and stores no row
            dead = (start_m < 0) | (start_m >= n_q)
            n_tiles = gl.where(dead, 0, n_tiles)
            n_q = gl.where(dead, 0, n_q)
            start_m = gl.maximum(start_m, 0)
            col = start_m
        elif SEQ == 2:  # an empty slot likewise; the packed tensors have one batch row
            n_tiles = gl.where(live, n_tiles, 0)
            n_q = gl.where(live, n_q, 0)
            col = gl.load(row_starts + b) + start_m
            tb = b * 0
        dq_base = dq + tb.to(gl.int64) * stride_dqb + h.to(gl.int64) * stride_dqh
        if SEQ != 0:  # 64-bit: q0 · stride passes 2³¹ in long packed batches (512k tokens at Hq·D = 4096)
            dq_base += q0.to(gl.int64) * stride_dqm

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, delta_desc.block_type.shape, delta_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)  # a tile is one consumer's
        mbarrier.init(done, count=2)
        fence_async_shared()

        gl.warp_specialize([
            (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, q_bar, ready, empty, done,
                            dq_base, stride_dqm, b, h, start_m, lo, n_tiles, mid_lo, mid_hi, n_q, n_k, off,
                            win_left, win_right, qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h,
                            softcap_scale, softcap2,
                            0, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, HEAD_DIM, BLOCK_M, STAGES,
                            D_REAL, QK)),
            (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, q_bar, ready, empty, done,
                            dq_base, stride_dqm, b, h, start_m, lo, n_tiles, mid_lo, mid_hi, n_q, n_k, off,
                            win_left, win_right, qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h,
                            softcap_scale, softcap2,
                            1, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, HEAD_DIM, BLOCK_M, STAGES,
                            D_REAL, QK)),
            (_dq_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                          lse_smem, delta_smem, q_bar, ready, empty, tb, h, start_m, n_heads, lo, n_tiles, q0, k0,
                          col, GROUP, STAGES)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    _attn_bwd_gluon_wide_dq_launcher = Launcher(_attn_bwd_gluon_wide_dq_kernel)


    # ----------------------------------------------------------------------------- MLA's 128-key programs

    @gluon.jit
    def _mla_loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                    lse_smem, delta_smem, kv_bar, ready, empty, b, h_kv, start_n, n_heads, lo, n_tiles,
                    GROUP: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, KC: gl.constexpr):
        """``_attn_bwd_gluon_mla_kernel``'s loader warp: each consumer's 64 keys of K (``KC`` 64-column chunks) and V
        once, then each step's Q (in chunks), dO, lse₂ and δ once for both consumers."""
        CH: gl.constexpr = k_desc.block_type.shape[3]
        mbarrier.expect(kv_bar, 2 * (KC * k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(2):
            for j in gl.static_range(KC):
                tma.async_copy_global_to_shared(k_desc, [b, h_kv, start_n + 64 * c, CH * j], kv_bar,
                                                k_smem.index(c * KC + j))
            tma.async_copy_global_to_shared(v_desc, [b, h_kv, start_n + 64 * c, 0], kv_bar, v_smem.index(c))
        step_bytes: gl.constexpr = (KC * q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                    + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        for it in range(GROUP * n_tiles):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # a fresh barrier passes
            h, start_m = _query_tile(it, n_tiles, lo, 0, h_kv, GROUP, False, BLOCK_M)
            bar = ready.index(s)
            mbarrier.expect(bar, step_bytes)
            for j in gl.static_range(KC):
                tma.async_copy_global_to_shared(q_desc, [b, h, start_m, CH * j], bar, q_smem.index(s * KC + j))
            tma.async_copy_global_to_shared(do_desc, [b, h, start_m, 0], bar, do_smem.index(s))
            tma.async_copy_global_to_shared(lse_desc, [b * n_heads + h, start_m], bar, lse_smem.index(s))
            tma.async_copy_global_to_shared(delta_desc, [b * n_heads + h, start_m], bar, delta_smem.index(s))

    @gluon.jit
    def _mla_dq_block(ds_smem, ds_buf, k_smem, j, dq_zero, dq_stage, dq_desc, b, h, start_m, sm_scale,
                      ME: gl.constexpr, KC: gl.constexpr):
        """dQ's 64-column block ``j`` of the step, dS (both consumers' halves of set ``ds_buf``) times
        K's chunk j over all 128 keys, reduce-added (·scale) through this consumer's staging buffer."""
        CH: gl.constexpr = k_smem.shape[4]
        dq = warpgroup_mma(ds_smem.index(ds_buf * 2), k_smem.index(j).reshape([64, CH]), dq_zero, use_acc=False,
                           is_async=True)
        dq = warpgroup_mma(ds_smem.index(ds_buf * 2 + 1), k_smem.index(KC + j).reshape([64, CH]), dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq])
        _dq_stage(dq, dq_stage, sm_scale, ME, 64, False)
        fence_async_shared()  # (``_dq_send`` wants the column as a constexpr; here it follows the step)
        _tma_reduce_add(dq_desc, [b, h, start_m, CH * j], dq_stage.index(ME))

    @gluon.jit
    def _mla_consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_bar, ready,
                      empty, ds_ready, ds_free, dq_desc, dk_base, dv_base, stride_dkn, stride_dvn, b, h_kv, start_n,
                      lo, mid_lo, n_tiles, n_k, off, qk_scale, sm_scale, ME: gl.constexpr, GROUP: gl.constexpr,
                      BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DS_BUFS: gl.constexpr, KC: gl.constexpr):
        """Consumer ``ME`` of a 128-key program: keys [start_n + 64·ME, +64) against every query tile,
        dK (64 × 192, three 64-column accumulators: register tensors have power-of-two sides) and dV
        (64 × 128) in registers, 160 a thread. A step: Sᵀ over q's three chunks, Pᵀ; dPᵀ − δ (its
        accumulator starts at −δ, so δ holds no registers across the wgmma) and dV += Pᵀ·dO with Pᵀ
        read from shared memory; dSᵀ, dK += dSᵀ·Q; dS out to this consumer's half of the step's dS set. Then
        dQ = dS·K over all 128 keys, by 64-column blocks, the three a step dealt alternately (block j
        of step it is consumer (it + j) mod 2's: 2 and 1 blocks, 1 and 2 the next step), each block
        reduce-added through the consumer's staging buffer as soon as it retired."""
        dtype: gl.constexpr = k_smem.dtype
        CH: gl.constexpr = k_smem.shape[4]  # a chunk's columns (64)
        DV: gl.constexpr = v_smem.shape[4]
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        c_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, CH, 16])
        dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DV, 16])
        dsa_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=c_layout, k_width=2)
        gl.static_assert(KC == 3, "q's and k's 192 columns as three chunks")
        v_me = v_smem.index(ME).reshape([64, DV])
        keys = start_n + 64 * ME + gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout))
        tail = start_n + 64 * (ME + 1) > n_k  # this consumer holds zero-filled keys past Nk
        dk0 = gl.zeros([64, CH], gl.float32, layout=c_layout)
        dk1 = gl.zeros([64, CH], gl.float32, layout=c_layout)
        dk2 = gl.zeros([64, CH], gl.float32, layout=c_layout)
        dv = gl.zeros([64, DV], gl.float32, layout=dv_layout)
        st_zero = gl.zeros([64, BLOCK_M], gl.float32, layout=st_layout)
        dq_zero = _dq_zeros(BLOCK_M)
        mbarrier.wait(kv_bar, 0)

        for it in range(GROUP * n_tiles):
            s = it % STAGES
            h, start_m = _query_tile(it, n_tiles, lo, 0, h_kv, GROUP, False, BLOCK_M)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            q0 = q_smem.index(s * KC).reshape([BLOCK_M, CH])
            q1 = q_smem.index(s * KC + 1).reshape([BLOCK_M, CH])
            q2 = q_smem.index(s * KC + 2).reshape([BLOCK_M, CH])
            do_t = do_smem.index(s).reshape([BLOCK_M, DV])
            st = warpgroup_mma(k_smem.index(ME * KC).reshape([64, CH]), q0.permute((1, 0)), st_zero, use_acc=False,
                               is_async=True)
            st = warpgroup_mma(k_smem.index(ME * KC + 1).reshape([64, CH]), q1.permute((1, 0)), st, is_async=True)
            st = warpgroup_mma(k_smem.index(ME * KC + 2).reshape([64, CH]), q2.permute((1, 0)), st, is_async=True)
            lse2 = _row(lse_smem, s, BLOCK_M, st_layout)
            st = warpgroup_mma_wait(0, deps=[st])
            pt = gl.exp2(st * qk_scale - lse2)
            # Masked: the diagonal's tiles (a consumer whose keys all lie past a tile's rows gets zeros)
            # and a consumer holding keys past Nk.
            if (start_m < mid_lo) | tail:
                pt = _masked(pt, keys, start_m, n_k, off, 0, 0, True, False, False, BLOCK_M, st_layout)
            # Pᵀ leaves the registers: as P (queries × keys) into this consumer's half of dS set
            # ds_buf (free once both consumers' dQ wgmmas of its previous use retired), which dV reads
            # and dS then overwrites. Held in registers across dPᵀ, it spilled beside dK and dV.
            ds_buf = it % DS_BUFS
            use = it // DS_BUFS
            ds_me = ds_smem.index(ds_buf * 2 + ME)
            mbarrier.wait(ds_free.index(ds_buf), (use & 1) ^ 1)
            ds_me.store(gl.permute(_to_16bit(pt, dtype, True), (1, 0)))
            fence_async_shared()
            # dPᵀ − δ (its accumulator starts at −δ: δ holds no registers across the wgmma), then dV.
            dpt = warpgroup_mma(v_me, do_t.permute((1, 0)), st_zero - _row(delta_smem, s, BLOCK_M, st_layout),
                                is_async=True)
            dv = warpgroup_mma(ds_me.permute((1, 0)), do_t, dv, is_async=True)
            dpt = warpgroup_mma_wait(1, deps=[dpt])  # dPᵀ − δ retired; dV may still run
            dst = _to_16bit(ds_me.permute((1, 0)).load(st_layout).to(gl.float32) * dpt, dtype, True)
            dsa = gl.convert_layout(dst, dsa_layout, assert_trivial=True)
            dk0 = warpgroup_mma(dsa, q0, dk0, is_async=True)
            dk1 = warpgroup_mma(dsa, q1, dk1, is_async=True)
            dk2 = warpgroup_mma(dsa, q2, dk2, is_async=True)
            # dS over P once dV (the oldest group) read it; both consumers' halves in, dQ may start.
            dv = warpgroup_mma_wait(3, deps=[dv])
            ds_me.store(gl.permute(dst, (1, 0)))
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(ds_buf))
            dk0, dk1, dk2, dsa = warpgroup_mma_wait(0, deps=[dk0, dk1, dk2, dsa])
            mbarrier.arrive(empty.index(s))  # dQ reads no Q or dO
            mbarrier.wait(ds_ready.index(ds_buf), use & 1)
            # Block j of the step is consumer (it + j) mod 2's: here block j1 (0 or 1) and, with
            # block 0, block 2. The K chunks' index follows the step, so their wgmma descriptors
            # are made per step, not held (and spilled) across the loop.
            j1 = (it + ME) % 2
            _mla_dq_block(ds_smem, ds_buf, k_smem, j1, dq_zero, dq_stage, dq_desc, b, h, start_m, sm_scale, ME, KC)
            if j1 == 0:
                _mla_dq_block(ds_smem, ds_buf, k_smem, j1 + 2, dq_zero, dq_stage, dq_desc, b, h, start_m, sm_scale, ME,
                              KC)
            mbarrier.arrive(ds_free.index(ds_buf))
        tma.store_wait(0)
        first = start_n + 64 * ME
        _store_rows(dk0 * sm_scale, dk_base, stride_dkn, first, n_k, 0, c_layout)
        _store_rows(dk1 * sm_scale, dk_base, stride_dkn, first, n_k, CH, c_layout)
        _store_rows(dk2 * sm_scale, dk_base, stride_dkn, first, n_k, 2 * CH, c_layout)
        _store_rows(dv, dv_base, stride_dvn, first, n_k, 0, dv_layout)

    @gluon.jit(do_not_specialize=["n_heads", "n_kv_heads", "n_q", "n_k", "band", "banded_heads"])
    def _attn_bwd_gluon_mla_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk, dv,
                                   stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                   n_heads, n_kv_heads, n_q, n_k, band, banded_heads, qk_scale, sm_scale,
                                   GROUP: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                                   DS_BUFS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        """Plain causal MLA (q, k 192; v 128) over a dense batch in one pass, one program per 128-key
        tile of one (batch, KV head), as cuDNN runs it (``takes_mla_programs``): two consumers of 64 keys each
        (``_mla_consumer``) share each step's Q and dO loads and its dQ reduce-adds, half the L2
        bytes of the 64-key one pass a (key, query) pair. The order is the causal one pass's
        (``banded_key_tile``, ``query_tiles`` over 128 keys)."""
        KC: gl.constexpr = 3
        pid = gl.program_id(0)
        n_key_tiles = gl.cdiv(n_k, 128)
        bh_kv, tile = banded_key_tile(pid, gl.num_programs(0), n_key_tiles, band, banded_heads)
        b = bh_kv // n_kv_heads
        h_kv = bh_kv % n_kv_heads
        start_n = tile * 128
        off = n_k - n_q
        lo, n_tiles, mid_lo, mid_hi = query_tiles(start_n, n_q, off, 0, 0, True, False, False, BLOCK_M, 128)
        dk_base = dk + b.to(gl.int64) * stride_dkb + h_kv.to(gl.int64) * stride_dkh
        dv_base = dv + b.to(gl.int64) * stride_dvb + h_kv.to(gl.int64) * stride_dvh

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [STAGES * KC] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [2 * KC] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                               delta_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [DS_BUFS * 2, BLOCK_M, 64], ds_layout)
        dq_stage = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)
        kv_bar, ready, empty, ds_ready, ds_free = _step_barriers(STAGES, DS_BUFS, 2)
        fence_async_shared()

        gl.warp_specialize([
            (_mla_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_bar,
                             ready, empty, ds_ready, ds_free, dq_desc, dk_base, dv_base, stride_dkn, stride_dvn, b,
                             h_kv, start_n, lo, mid_lo, n_tiles, n_k, off, qk_scale, sm_scale,
                             0, GROUP, BLOCK_M, STAGES, DS_BUFS, KC)),
            (_mla_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_bar,
                             ready, empty, ds_ready, ds_free, dq_desc, dk_base, dv_base, stride_dkn, stride_dvn, b,
                             h_kv, start_n, lo, mid_lo, n_tiles, n_k, off, qk_scale, sm_scale,
                             1, GROUP, BLOCK_M, STAGES, DS_BUFS, KC)),
            (_mla_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                           lse_smem, delta_smem, kv_bar, ready, empty, b, h_kv, start_n, n_heads, lo, n_tiles,
                           GROUP, BLOCK_M, STAGES, KC)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    _attn_bwd_gluon_mla_launcher = Launcher(_attn_bwd_gluon_mla_kernel)


_KERNEL_CONSTEXPRS = ("HEAD_DIM", "CAUSAL", "HAS_LEFT", "HAS_RIGHT", "SOFTCAP", "ALIBI", "FAST_TANH", "GROUP",
                      "BLOCK_M", "STAGES", "CONSUMER_REGS", "LOADER_REGS")
DQ_STAGES = 2  # K/V slots of the dQ kernel (one a consumer): Q and dO 64 KB, two slots 128 KB (at v's 256)


def one_pass(value_dim: int, variant, causal: bool) -> bool:
    """Whether the dK/dV kernel also reduce-adds dQ (``FUSED_DQ``; no dQ kernel): plain causal calls
    over dense batches whose V (v's head dim ``value_dim``) runs at most 128 wide (MLA's 192 / 128:
    the float32 staging then fits beside the ring). There it measured 1.08–1.09 × the two kernels,
    non-causal 0.97–0.99 ×, so those keep the pair (H200, ``bench_ab-20261130-0744.json``). Options
    (softcap, ALiBi, windows, sinks) keep the pair too: the one pass is built and tested for plain
    calls only. Its config is ``attention_bwd_gluon.WIDE_ONE_PASS`` (``fused_dq``), which
    ``default_config`` picks for such calls but MLA's 192 / 128 (``takes_mla_programs``), and
    ``attention_backward_gluon`` refuses for any other. A v head dim no kernel runs: False."""
    from .attention_bwd_gluon import _is_plain, kernel_head_dim
    width = kernel_head_dim(value_dim)
    return causal and _is_plain(variant, causal) and width is not None and width <= 128


def takes_mla_programs(head_dim: int, value_dim: int, variant, causal: bool) -> bool:
    """Whether the call can run as 128-key programs (``_attn_bwd_gluon_mla_kernel``, the config with
    ``mla``): the one pass's calls (``one_pass``) at MLA's widths exactly, q and k 192, v 128. There a
    program shares each step's Q and dO loads and dQ reduce-adds over 128 keys, where the 64-key one
    pass moves twice cuDNN's L2 bytes (``benchmarks/NOTES.md``, 2026-11-30 09:26)."""
    return head_dim == MLA_QK and value_dim == MLA_V and one_pass(value_dim, variant, causal)


def mla_launch(q, k, v, do, dk, dv, lse2_pad, delta_pad, scale: float, cfg, dq_acc, causal: bool = True,
               variant=None, row_starts=None):
    """(grid, args, keyword args) of the 128-key programs' launch (``takes_mla_programs``): one program per
    128-key tile of each (batch, KV head) in the causal one pass's order (``launch_plan``), Q and K
    in 64-column boxes (three a row: Gluon's shared tiles have power-of-two sides), V and dO at 128,
    dQ·scale reduce-added into ``dq_acc`` (float32, q's 192 columns) in 64-column boxes. The kernel
    has no column masks, options or ranges: any other call raises."""
    from .attention_bwd_gluon import _row_descriptor, launch_plan
    from .attention_fwd_gluon import tma_descriptor
    if not cfg.mla or dq_acc is None:
        raise ValueError(f"mla_launch: an mla config and a float32 dQ buffer; got {cfg.name}")
    if row_starts is not None or not takes_mla_programs(q.shape[3], v.shape[3], variant, causal):
        raise ValueError(f"mla_launch: plain causal calls over dense batches at q, k {MLA_QK} and v {MLA_V} only; "
                         f"got {q.shape[3]} / {v.shape[3]}, causal={causal}, variant={variant}")
    B, Hq, Nq, _ = q.shape
    plan = launch_plan(q, k, cfg, True, None, value_dim=v.shape[3])
    m = cfg.block_m
    args = (tma_descriptor(q, [1, 1, m, 64]), tma_descriptor(k, [1, 1, 64, 64]), tma_descriptor(v, [1, 1, 64, MLA_V]),
            tma_descriptor(do, [1, 1, m, MLA_V]), _row_descriptor(lse2_pad, m), _row_descriptor(delta_pad, m),
            tma_descriptor(dq_acc, [1, 1, m, 64]), dk, dv, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0),
            dv.stride(1), dv.stride(2), Hq, k.shape[1], Nq, k.shape[2], *plan["order"], scale * LOG2E, scale)
    ce = plan["constexprs"]
    constexprs = dict(GROUP=ce["GROUP"], BLOCK_M=m, STAGES=cfg.stages, DS_BUFS=cfg.ds_bufs,
                      CONSUMER_REGS=cfg.consumer_regs, LOADER_REGS=ce["LOADER_REGS"], num_warps=4)
    return plan["grid"], args, constexprs


def launches(q, k, v, do, dq, dk, dv, lse2_pad, delta_pad, scale: float, causal: bool, cfg, variant,
             row_starts=None, dq_acc=None):
    """(grid, args, keyword args) of the dK/dV kernel's launch (one program per 64-key tile of each
    (batch, KV head)) and of the dQ kernel's (one per 64-query tile of each (batch, query head); dq in
    q's dtype and strides), sharing one plan (``attention_bwd_gluon.launch_plan``: grid, launch order,
    option constexprs) and one set of descriptors; a ranges or varlen batch's bounds (``seq_args``;
    varlen: with its count and ``row_starts``, ``_aligned_rows``) follow the options. Varlen grids
    are slots sized from the totals (no sync), as the D ≤ 128 kernel's and the forward's. The PTX
    hashes (``benchmarks/ptx_hashes.py``) compile from it without a GPU."""
    from .attention_bwd_gluon import _option_args, _row_descriptor, kernel_head_dim, launch_plan, wide_value_width
    from .attention_fwd_gluon import tma_descriptor
    B, Hq, Nq, _ = q.shape
    D = kernel_head_dim(q.shape[3], v.shape[3])  # 256 (a head dim run padded: the boxes read zeros past the columns)
    # V and dO at v's own padded width where it is narrower (MLA's 192 / 128: 128): dPᵀ = V·dOᵀ and
    # dV += Pᵀ·dO run at it (the kernels read the width off V's buffer).
    W_v = wide_value_width(v.shape[3])
    plan = launch_plan(q, k, cfg, causal, variant, value_dim=v.shape[3])
    m = cfg.block_m
    descriptors = (tma_descriptor(q, [1, 1, m, D]), tma_descriptor(k, [1, 1, 64, D]),
                   tma_descriptor(v, [1, 1, 64, W_v]), tma_descriptor(do, [1, 1, m, W_v]),
                   _row_descriptor(lse2_pad, m), _row_descriptor(delta_pad, m))
    (win_left, win_right, *options), _ = _option_args(variant, q, scale, causal)
    scalars = (win_left, win_right, scale * LOG2E, scale, *options)
    constexprs = {name: plan["constexprs"][name] for name in _KERNEL_CONSTEXPRS}
    if D != q.shape[3]:  # every store is a masked one here: kept to the real columns
        constexprs["D_REAL"] = q.shape[3]
    if "QK" in plan["constexprs"]:  # S, Sᵀ over q's columns rounded up to 64 (MLA's 192 of 256: ``_qk``)
        constexprs["QK"] = plan["constexprs"]["QK"]
    dv_cols = dict(DV_REAL=v.shape[3]) if v.shape[3] != q.shape[3] else {}  # v's head dim not q's: dv's own
    seq = SEQ_DENSE if variant is None else variant.seq
    bounds = (None,) * 7  # the rows' bounds after the options; a dense batch: none (constexprs)
    dq_grid = (-(-Nq // m) * B * Hq,)
    if seq != SEQ_DENSE:
        *bounds, n_seq = seq_args(variant, q)  # q_starts, q_ends, k_starts, k_ends, stride_seq
        bounds = (*bounds, *((n_seq, row_starts) if seq == SEQ_VARLEN else (None, None)))
        constexprs["SEQ"] = seq
        if seq == SEQ_VARLEN:
            dq_grid = ((-(-Nq // m) + n_seq) * Hq,)
            if "HEADS_FASTEST" in plan["constexprs"]:  # (``varlen_slot``: the plan's order, both kernels)
                constexprs["HEADS_FASTEST"] = True
    scalars = (*scalars, *bounds)

    def strides(t):  # varlen: batch stride 0 (its programs' b is the sequence; the tensors have one row)
        return (0 if seq == SEQ_VARLEN else t.stride(0), t.stride(1), t.stride(2))
    # one pass (``dq_acc``): the float32 dQ buffer's descriptor, else None (a constexpr: not in the PTX)
    if (dq_acc is not None) != bool(cfg.fused_dq):
        raise ValueError(f"dq_acc: a float32 dQ buffer goes with a fused_dq config (the one pass) and only "
                         f"with one; got {'a buffer' if dq_acc is not None else 'none'} with {cfg.name}")
    dq_desc = None if dq_acc is None else tma_descriptor(dq_acc, [1, 1, m, 64])
    fused = {} if dq_acc is None else dict(FUSED_DQ=True)
    dkdv = (plan["grid"], (*descriptors, dk, dv, *strides(dk), *strides(dv), Hq, k.shape[1], Nq, k.shape[2],
                           *plan["order"], *scalars, dq_desc), dict(constexprs, **dv_cols, **fused, num_warps=4))
    dq_launch = None  # one pass (``dq_acc``): no dQ kernel
    if dq_acc is None:
        dq_launch = (dq_grid, (*descriptors, dq, *strides(dq), Hq, Nq, k.shape[2], *scalars),
                     dict(constexprs, STAGES=DQ_STAGES, num_warps=4))
    return dkdv, dq_launch


def run(q, k, v, do, dq, dk, dv, lse2_pad, delta_pad, scale: float, causal: bool, cfg, variant, row_starts=None,
        dq_acc=None):
    """The d 256 backward's two launches (``attention_bwd_gluon._backward`` prepared the row
    statistics and the gradients' tensors), or with ``dq_acc`` (``one_pass``) the dK/dV kernel's
    alone, reduce-adding dQ·scale into that zeroed float32 buffer; with an ``mla`` config, the
    128-key programs (``mla_launch``) instead."""
    if cfg.mla:
        grid, args, kwargs = mla_launch(q, k, v, do, dk, dv, lse2_pad, delta_pad, scale, cfg, dq_acc, causal, variant,
                                        row_starts)
        _attn_bwd_gluon_mla_launcher[grid](*args, **kwargs)
        return
    (grid, args, kwargs), dq_launch = launches(q, k, v, do, dq, dk, dv, lse2_pad, delta_pad, scale, causal, cfg,
                                               variant, row_starts, dq_acc)
    _attn_bwd_gluon_wide_launcher[grid](*args, **kwargs)
    if dq_launch is not None:
        dq_grid, dq_args, dq_kwargs = dq_launch
        _attn_bwd_gluon_wide_dq_launcher[dq_grid](*dq_args, **dq_kwargs)
