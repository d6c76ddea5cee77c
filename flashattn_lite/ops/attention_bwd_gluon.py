"""Attention backward for Hopper (sm_90) in Gluon: a warp-specialized schedule in the spirit of
FlashAttention-3's backward.

Same contract as ``attention_backward_hopper`` (ops/attention_bwd_hopper.py): plain attention,
causal (bottom-right, offset Nk − Nq) or not, GQA, fp16/bf16, D = Dv ∈ {64, 128} (and 256 over a
dense batch: ``attention_bwd_gluon_wide``'s two kernels, or its dK/dV kernel alone for plain causal
calls with v at most 128 wide, launched from here); returns (dq, dk,
dv), ``torch.empty_like`` of q, k, v (their strides) in the inputs' dtype, dk/dv summed over each
GQA group. Also the Gluon forward's options (a ``variant``: a sliding window, softcap, ALiBi slopes,
sinks; a dense batch), as the constexprs ``HAS_LEFT``, ``HAS_RIGHT``, ``SOFTCAP``, ``ALIBI``,
``FAST_TANH`` of the same kernel (the options' arguments are None otherwise, so a plain call's code
is what it was); sinks need nothing in the kernel (the saved lse has the sink in it) and their
gradient is the portable backward's reduction of δ (``attention_bwd.sinks_grad``).

The math is the portable backward's (``attention_bwd.py``): δ = rowsum(dO ∘ O) − dlse, lse₂ =
lse·log2 e (+inf on rows with no visible key, whose P is then 0), and per (key tile, query tile)
pair (plain attention; the options change Sᵀ's scores as ``score_tile`` does, and softcap
multiplies dSᵀ by 1 − tanh²)

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − lse₂),  dV += Pᵀ·dO,  dPᵀ = V·dOᵀ,
    dSᵀ = Pᵀ ∘ (dPᵀ − δ),  dK += dSᵀ·Q,  dQ += dS·K            (dK, dQ times scale at the end)

The schedule (one program = one key tile of 128 keys of one (batch, KV head)):

* ``gl.warp_specialize`` splits the warps into a **loader** (1 warp, 24 registers) and two
  **consumer warpgroups** (4 warps each, setmaxnreg 240); consumer c owns keys [64c, 64c + 64) of
  the tile and keeps its dK, dV accumulators (fp32, 128 registers a thread at D 128) in registers.
* The loader TMA-loads K and V once (one 64-row box per consumer), then streams, for every query
  head of the GQA group and every query tile the key tile is visible to, Q, dO (BLOCK_M rows) and the
  rows' lse₂ and δ into a ring of ``STAGES`` shared-memory slots: ``ready`` barriers count the TMA
  bytes, ``empty`` barriers one arrival per consumer once its last wgmma reading the slot retired.
* Each consumer issues Sᵀ and dPᵀ as two asynchronous wgmmas (K, V and Q, dO all in shared memory),
  computes Pᵀ while dPᵀ still runs, issues dV += Pᵀ·dO with Pᵀ from registers (the forward's
  register-A wgmma), then dSᵀ and dK += dSᵀ·Q the same way. Pᵀ is rounded to the input dtype once
  and that copy also feeds dSᵀ (the portable kernels multiply the fp32 Pᵀ): one more rounding of a
  factor that is rounded again before its GEMM, and no fp32 Pᵀ held across the dPᵀ wait.
* dQ (``fused_dq``): each consumer writes its dSᵀ block, transposed, to shared memory; once every
  consumer's block is there (an mbarrier, ``ds_ready``) dQ = dS·K is one more wgmma chain per 64
  columns of D, issued behind dV and dK (D 128: consumer c takes columns [64c, 64c + 64) at every
  step, but none past q's own, 64 / 128's; D 64: the consumers take turns by step), scaled, staged
  in shared memory and added to an fp32 dQ buffer by a TMA reduce-add
  (``cp.reduce.async.bulk.tensor``; Gluon 3.6 has the op in its IR builder but no Python name:
  ``_tma_reduce_add``). ``ds_bufs`` sets of dS buffers rotate by step, each reused once every
  consumer's dQ wgmma of its last use retired (``ds_free``); two sets let the consumers drift a
  step apart. A step's dQ block is retired in the next step, behind its
  Sᵀ and dPᵀ, and reduce-added there, so the tensor pipe goes on from dQ to Sᵀ without the
  reduce-add in between (D 64; D 128 where no step is masked: dense, non-causal, no window). A
  last pass turns the buffer into dq (``Tensor.copy_``).
  5 GEMMs per tile pair, as in FlashAttention; the fp32 adds arrive in any order, so dq is not
  bit-reproducible from run to run (dk and dv are, but for a split GQA launch).
* GQA: a program walks its KV head's group of query heads (its dK, dV the sums over the group),
  except a dense plain causal call from 4k keys (2k where group × d ≥ 1024) with the fused dQ
  (``group_split``): one program per query head's key tile, as MHA, K and V read at head h // G
  (``KV_SHARE``), and dK·scale, dV reduce-added in float32 into the KV head's sums through the dQ
  staging buffer, as FlashAttention-3 does (rounded once, after the kernel; in any order, so not
  bit-reproducible).
  Without ``fused_dq`` the kernel computes dK, dV only and dq comes from a kernel of its own, one
  program per query tile, each element written once (deterministic): the Triton TMA backward's
  (``attention_bwd_hopper._dq_hopper_kernel``) for plain scores over a dense batch, else the
  portable one (``attention_bwd.attention_dq``: softcap, ALiBi, windows, ranges, varlen).
* Causal: query tiles wholly above the diagonal are never loaded; the diagonal band (and, in the
  last key tile, keys past Nk, which TMA fills with zeros) is masked with a uniform branch per step.
  Query rows past Nq read as zeros with lse₂ = +inf (lse₂ and δ are padded to whole tiles), so P = 0.
  Without causal (or a window's right side) the query tiles are visited starting at a rotation by
  the key tile's index, so the programs of one head reduce-add into different dQ rows at a time.
* Launch order: a head's key tiles on consecutive programs, heaviest first (they share its Q, dO
  and dQ rows in L2). Under causal a key tile's steps fall linearly with its index, so in that order
  the last heads' heaviest tiles start late and run alone. A dense causal launch (no window's left
  side) has its last heads, as many as a list-schedule model with a cost for lost L2 reuse finds
  best, ordered in bands of 2 key tiles, each band's heads' heaviest tiles first (``launch_order``,
  ``banded_key_tile``); with programs walking a GQA group, every head where the model gains 8%.
* Sliding windows (FlashAttention-2's: key j visible to query i iff i + off − left ≤ j ≤
  i + off + right, off = Nk − Nq, a side −1 unbounded, causal capping right at 0; the forward's
  ``window_flags``): ``HAS_LEFT`` / ``HAS_RIGHT`` constexprs, the sides runtime ints (one binary for
  every width). ``query_tiles`` (the portable backward's ``query_range``, the transpose of the
  forward's ``key_tiles``) gives each key tile the query tiles whose rows see some of its keys, so a
  window of W keys costs O(N·W); the tiles crossing the band's edges are masked (``_masked``, bounds
  per key) and the rest run unmasked. Rows no key is visible to keep lse₂ = +inf (P = 0) as above.
* dK·scale and dV leave through shared memory (the consumer's own K, V boxes, dead by then) and one
  TMA store each (rows past Nk are dropped).
* Ranges and varlen batches (``Variant.seq`` ``SEQ_RANGES``: a padded (B, H, N, D) batch with one
  [start, end) range per row, how the HF integration passes padding; ``SEQ_VARLEN``: the packed
  (1, H, total, D) views of ``attention_varlen`` with cu_seqlens), the ``SEQ`` constexpr (a dense
  call compiles to the kernel it compiled to before; the bounds and the dk/dv pointers are None
  then). A program finds its sequence and key tile with ``seq_key_tile`` (ranges: the padded
  length's tiles per batch row; varlen: slots of a grid sized from the totals, a binary search over
  the starts, no device→host sync), then shifts the sequence's query tiles, ends and diagonal
  (bottom-right per sequence: off = Nk_b − Nq_b) by its first query and key row, so the partitions
  work in the tensors' rows with the masks as before. Boxes crossing a sequence's end read the next
  sequence's rows (finite Q, dO, lse₂, δ; zeros past the padded lse₂/δ rows): tiles crossing the
  query end are masked, rows past Nq_b too (Pᵀ = 0 there, so dSᵀ = 0 and the dQ reduce-add adds
  exact zeros to the next sequence's rows); a warpgroup holding the key end stores only its rows,
  by masked register stores (a TMA store of the box would overwrite the next sequence's dK/dV).
  The masks select, so the next rows' lse₂ (any value) cannot leak into Pᵀ; but a NaN or inf in
  the Q, K, V or dO rows next to a sequence (the next sequence's, or a padded batch's rows outside
  its ranges) would, as 0 · NaN in the wgmmas, where the portable kernels' masked loads read zeros
  (zeroing dSᵀ on masked tiles as well cost 50–80 bytes of spills at d 128 and still leaves the
  wgmmas' 0 · NaN). This holds under ``torch.use_deterministic_algorithms(True)`` too: dK and dV
  still come from this kernel there, only dq from the portable dQ kernel (``attention_bwd.attention_dq``).

The Gluon imports are guarded like the forward's (``attention_fwd_gluon``): on a triton without
Gluon, another triton than 3.6, or without CUDA the module imports and ``supported`` says why not.
Gluon kernels do not run in the Triton interpreter.
"""
from __future__ import annotations

import functools
import heapq
import warnings
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launcher import Launcher, launcher
from .._runtime import cdiv, interpreter_active, tile_and_slab
from ..merge import LOG2E
from .attention_bwd import query_range, row_stats_tile
from .attention_fwd import (PLAIN, SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN, Variant, fold_factor, head_base, score_args,
                            seq_args, seq_bounds, varlen_slot)
from .attention_fwd_gluon import (_is_plain, gpu_sm_count, padded_head_dim, padding_note, qk_width, tma_descriptor,
                                  window_flags)
from .attention_fwd_hopper import storable_like

try:  # Gluon's Hopper API as in triton 3.6 (it moves between releases: checked by TESTED_TRITON)
    from triton._C.libtriton import ir as _ir
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_init,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _HAS_GLUON = (hasattr(gl, "warp_specialize") and hasattr(tma, "async_copy_global_to_shared")
                  and hasattr(_ir, "DESCRIPTOR_REDUCE_KIND"))
except Exception:  # noqa: BLE001 - any import problem means: no Gluon path here
    _HAS_GLUON = False

HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
TESTED_TRITON = ("3.6.",)
LOADER_REGS = 24
MLA_QK, MLA_V = 192, 128  # MLA's q / k and v head dims: the widths of the 128-key programs (``Config.mla``)
DQ_COLS = 64  # dQ columns per wgmma (and per TMA reduce): one 128-byte swizzle span of bf16 K


# The head dim the backward's kernels run a call at: the forward's rule, the same function
# (``padded_head_dim``: one of HEAD_DIMS, or a multiple of 8 between 32 and 256 padded to the next,
# with v's head dim the wider one's). TMA reads the missing columns of q, k, v, dO as zeros, so Sᵀ,
# dPᵀ and the padded columns of dK, dV, dQ come out as with the real columns alone; the stores drop
# the padding (above 128 the head dim 256 kernels, whose stores are masked ones kept to the real
# columns). The head dim 256 kernels run V and dO at ``wide_value_width`` where v is narrower.
kernel_head_dim = padded_head_dim


def wide_value_width(value_dim: int) -> int:
    """V's and dO's width in the head dim 256 kernels (``attention_bwd_gluon_wide.launches``): v's
    own padded width, at least 128, so each consumer's half of dO for dV is 64 columns, one
    128-byte swizzle span (a 32-column half, 64 bytes into it, was never run)."""
    return max(kernel_head_dim(value_dim), 128)


class Config(NamedTuple):
    """One launch configuration: ``consumers`` warpgroups of 64 keys each (key tiles of
    ``64 · consumers``), query tiles of ``block_m`` rows streamed through ``stages`` slots,
    ``fused_dq`` (dQ by TMA reduce-add in this kernel; else a one-writer dQ kernel), ``ds_bufs``
    (fused dQ: sets of dS buffers, 2 lets a consumer write step i + 1's dS while another's dQ
    wgmma of step i still reads its set), ``consumer_regs`` (setmaxnreg for the consumers; the
    loader gets ``LOADER_REGS``). ``split_d``: the head dim 256 kernels
    (``attention_bwd_gluon_wide``), whose consumers share one tile of 64 keys, each computing the
    scores of half the query rows and dK, dV's columns of half the head dim (one P/dS set:
    ``ds_bufs`` 1), dq by their own dQ kernel (``fused_dq`` False) or, for the plain causal calls
    with v at most 128 wide that ``attention_bwd_gluon_wide.one_pass`` takes, reduce-added by the
    dK/dV kernel (``fused_dq``). ``mla`` (with ``split_d`` and ``fused_dq``): that one pass for MLA's
    192 / 128 as 128-key programs (``attention_bwd_gluon_wide.takes_mla_programs``), each consumer owning 64
    keys' dK and dV whole, ``ds_bufs`` dS sets as at d ≤ 128: ``split_d`` there says only that the
    call runs in ``attention_bwd_gluon_wide`` at head dim 256, not that the head dim is split."""
    consumers: int
    block_m: int
    stages: int
    fused_dq: bool
    ds_bufs: int = 2
    consumer_regs: int = 240
    split_d: bool = False
    mla: bool = False

    @property
    def block_n(self) -> int:
        return 64 if self.split_d and not self.mla else 64 * self.consumers

    @property
    def name(self) -> str:
        dq = f"fdq{self.ds_bufs}" if self.fused_dq else "wdq" if self.split_d else "tdq"  # wide: its dQ kernel
        return f"gb-n{self.block_n}-m{self.block_m}-s{self.stages}-{dq}-r{self.consumer_regs}" + (
            "-sd" if self.split_d else "") + ("-mla" if self.mla else "")


# The sweep, per head dim. Compiled offline for sm_90a with triton 3.6 (fp16 and bf16, causal or
# not, GQA group 1 and 2; 2026-11, ``ptxas -v``): shared memory d 64 s3-fdq2 146 KiB, s4-fdq2 162,
# s3-fdq1 130, s3-tdq 82; d 128 s2-fdq2 193 KiB, s2-tdq 129, s3-tdq 162. Consumers at most 238 of
# their 240 registers, the loader 16 of 24. Spills: none at d 64; d 128 fused 0–100 bytes (a few
# 32-bit scalars reloaded per step; bf16 causal GQA the most), d 128 tdq 0–20 bytes. Left
# out: d 128 with one dS set (230–440 bytes of spills: its loop-invariant wgmma descriptors), d 128
# fused with 3 stages (over 227 KiB with two dS sets), 128-row query tiles (registers).
# With the options (same compile, 2026-11-24; sinks alone compile to the plain kernel, PTX hash
# equal): d 64 spills 0–20 bytes (all three, causal), none otherwise; d 128 fused: ALiBi 28–76
# (plain 0–72), softcap 100–248, softcap + ALiBi 112–332 (the dSᵀ factor Pᵀ ∘ (1 − tanh²), 16
# registers, is live across the dPᵀ wait with Pᵀ for dV; bf16/fp16 causal GQA the most). Causal
# ALiBi in one add a score (2026-11-25, +2.1% measured) spills more: bf16 GQA 2 ALiBi 44 → 132,
# with softcap and sinks 312 → 364, a causal window with every option 328 → 396 (d 64 20 → 28).
# With windows (same compile, fp16/bf16, GQA 1 and 2; plain kernels' PTX hash unchanged): d 64 none
# (with every option too); d 128 fused 16–68 bytes (plain causal 16–72, non-causal 0–40), softcap +
# ALiBi 220–328, every option with a causal window 328. Non-causal windows with a right side skip
# the rotated start (40–80 bytes with it at bf16 GQA 2).
# Ranges and varlen (same compile, 2026-11-24; dense kernels' PTX hash unchanged), spill stores in
# bytes, the dense kernel's in brackets: d 64 none; d 128 fused varlen causal / non-causal bf16 GQA 2
# 100 / 60 (72 / 40), fp16 GQA 2 56 / 52 (20 / 0), bf16 GQA 1 56 / 28 (44 / 28), fp16 GQA 1
# 20 / 36 (16 / 0); ranges causal bf16 GQA 2 64, fp16 GQA 2 24; varlen causal window with every
# option 496 (328). (The one value the loop gains is the sequence's query end; moving the rest out
# of the partitions, or the edge test's form, changed the counts by ±10–40 bytes either way.)
DS_BUFS_MLA = 2  # the 128-key programs' dS sets (``Config.mla``; with two, 225 KB of shared memory)
# D 256's configs, by what they run: the dK/dV and dQ kernels; the dK/dV kernel alone reduce-adding dQ
# (``attention_bwd_gluon_wide.one_pass``); MLA's 128-key programs (``takes_mla_programs``).
WIDE_TWO_KERNELS = Config(2, 64, 2, False, 1, split_d=True)
WIDE_ONE_PASS = Config(2, 64, 2, True, 1, split_d=True)
WIDE_MLA = Config(2, 64, 2, True, DS_BUFS_MLA, split_d=True, mla=True)
CONFIGS = {
    64: [Config(2, 64, 3, True, 2), Config(2, 64, 4, True, 2), Config(2, 64, 3, True, 1), Config(2, 64, 3, False)],
    128: [Config(2, 64, 2, True, 2), Config(2, 64, 2, False), Config(2, 64, 3, False)],
    256: [WIDE_TWO_KERNELS, WIDE_ONE_PASS, WIDE_MLA],
}


def default_config(head_dim: int, causal: bool = False, n: int = 4096, deterministic: bool = False,
                   value_dim: int | None = None, variant: Variant | None = None, *,
                   qk_dim: int | None = None) -> Config:
    """The sweep's fastest config (``benchmarks/gluon_bwd.py`` on the H100, 2026-11-24, bf16, N 2k /
    8k / 16k with B·N 16k: ``gluon_bwd-20261124-131528.json``): fused dQ with two dS sets, 2 stages
    at d 128 (418–486 TFLOP/s), 4 at d 64 (286–399; 3 stages with one dS set ties at causal 2k).
    ``deterministic`` (``torch.use_deterministic_algorithms``): dq by a one-writer dQ kernel
    (``_tma_dq_covers``) instead of fp32 reduce-adds in any order, 3 stages (d 128: 323–441, d 64:
    268–330; 1.08–1.24× the Triton TMA pair). At head dim 256 the dK/dV and dQ kernels, or where
    ``attention_bwd_gluon_wide.one_pass`` takes the call (v's head dim ``value_dim``, the
    ``variant``), the dK/dV kernel alone with dQ fused: a caller picking the config by hand passes
    both, as ``attention_backward_gluon`` does (without them: the two kernels); with q's head dim
    ``qk_dim`` too, MLA's 192 / 128 takes the 128-key programs (``takes_mla_programs``). ``head_dim``
    is the kernel's (``kernel_head_dim``: 256 for every width run padded to it), ``qk_dim`` q's own."""
    if head_dim == 256:
        from .attention_bwd_gluon_wide import one_pass, takes_mla_programs
        if deterministic:
            return WIDE_TWO_KERNELS
        if qk_dim is not None and takes_mla_programs(qk_dim, value_dim or head_dim, variant, causal):
            return WIDE_MLA
        return WIDE_ONE_PASS if one_pass(value_dim or head_dim, variant, causal) else WIDE_TWO_KERNELS
    if deterministic:
        return Config(2, 64, 3, False)
    return Config(2, 64, 2, True, 2) if head_dim == 128 else Config(2, 64, 4, True, 2)


def defers_dq(head_dim: int, cfg: Config, causal: bool, variant: Variant = PLAIN) -> bool:
    """Whether the kernel retires and reduce-adds a step's dQ block in the next step, behind its Sᵀ
    and dPᵀ, so the tensor pipe does not wait through the reduce-add (D 64 +4.5%, D 128 non-causal
    +4%; staged in shared memory before Sᵀ and dPᵀ take their registers), and stages it in
    ``_spread_banks``' order (``_dq_from_buffer`` undoes it). D 128 with masked steps (causal,
    windows, ranges, varlen) retires it in its own step: deferred, those spill more (causal
    measured 3.5% slower; NOTES, 2026-11-25)."""
    if cfg.split_d:  # no dQ block here: the wide kernels' dQ kernel
        return False
    split_cols = head_dim // DQ_COLS == cfg.consumers  # D 128: each consumer its own 64 columns
    masked = causal or variant.seq != SEQ_DENSE or window_flags(variant, causal) != (False, False)
    return not (split_cols and masked)


def _pad_rows(n_q: int) -> int:
    """lse₂ and δ rows are padded to whole 128-row tiles (TMA-aligned, no masks on the loads)."""
    return cdiv(n_q, 128) * 128


@triton.jit
def query_tiles(start_n, n_q, off, win_left, win_right, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
                HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query tiles of the key tile [start_n, start_n + BLOCK_N): (lo, n_tiles, mid_lo, mid_hi).
    The program visits the ``n_tiles`` tiles of rows from ``lo`` (a multiple of BLOCK_M); rows
    outside them see no key of the tile. Of those, the tiles starting in [mid_lo, mid_hi) see every
    key of the tile (no mask; a tile holding keys past Nk is masked all the same); the others are
    masked. Without a window (``HAS_LEFT``/``HAS_RIGHT`` False): rows [lo, Nq rounded up to a tile),
    under causal (bottom-right, offset ``off`` = Nk − Nq) from the diagonal's first tile, the
    diagonal's tiles [lo, mid_lo) masked, as before windows existed. With one: the portable
    backward's ``query_range`` (the transpose of the forward's ``key_range``), causal as the right
    side at 0 (``win_right`` is then not read): a window of W keys visits O(W) rows per key. The
    forward's ``key_tiles`` transposed; called by the Gluon kernel and, in the interpreter, by the
    tests."""
    if HAS_LEFT or HAS_RIGHT:
        right = win_right
        if CAUSAL:
            right = 0
        lo, mid_lo, mid_hi, hi = query_range(start_n, n_q, off, win_left, right, HAS_LEFT, HAS_RIGHT or CAUSAL,
                                             BLOCK_M, BLOCK_N)
        n_tiles = tl.cdiv(hi, BLOCK_M) - lo // BLOCK_M
    else:
        q_end = tl.cdiv(n_q, BLOCK_M) * BLOCK_M
        lo = start_n * 0
        mid_lo = start_n * 0
        if CAUSAL:
            lo = tl.minimum((tl.maximum(start_n - off, 0) // BLOCK_M) * BLOCK_M, q_end)
            mid_lo = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M, q_end)
        n_tiles = (q_end - lo) // BLOCK_M
        mid_hi = q_end
    return lo, n_tiles, mid_lo, mid_hi


@triton.jit
def banded_key_tile(pid, n_programs, n_key_tiles, band, banded_heads):
    """(batch·KV head, key tile) of program ``pid`` of a dense causal grid (``launch_order``): the
    heads but the last ``banded_heads`` head by head (a head's tiles on consecutive programs, the
    heaviest first: they share its Q and dO in L2), then the last ``banded_heads`` in bands of
    ``band`` key tiles: band 0 (the heaviest tiles) of each of them first, then band 1, and so on. No
    banded heads, or a band as wide as the head, is the head-major order."""
    n_heads = n_programs // n_key_tiles
    plain = (n_heads - banded_heads) * n_key_tiles
    bh = pid // n_key_tiles
    tile = pid % n_key_tiles
    if pid >= plain:
        p = pid - plain
        per_band = band * banded_heads
        band_start = p // per_band * band
        width = tl.minimum(band, n_key_tiles - band_start)  # the last band may be narrower
        r = p % per_band
        bh = n_heads - banded_heads + r // width
        tile = band_start + r % width
    return bh, tile


@triton.jit
def seq_key_tile(pid_t, pid_b, q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, total_q, total_k,
                 BLOCK_N: tl.constexpr, SEQ: tl.constexpr):
    """The key tile of a ranges (``SEQ`` 1) or varlen (``SEQ`` 2) program: (b, start_n, q0, n_q, k0,
    n_k, off), sequence b's first query and key row, its lengths and bottom-right offset
    ``off`` = n_k − n_q, and the tile's first key inside the sequence. A program with no tile gets
    start_n = n_k = n_q = 0 (it loads no query and stores nothing); so does a ranges tile past its
    row's range.

    Ranges: ``pid_b`` is the batch row, ``pid_t`` the tile (the grid is the padded length's tiles).
    Varlen: ``pid_t`` is a slot of a grid of cdiv(total, BLOCK_N) + n_seq slots per KV head (sized
    from the totals, like the portable kernels' ``varlen_tile``, no device→host sync): sequence b's
    tiles are slots [S(b), S(b) + tiles(b)) with S(b) = k_starts[b] // BLOCK_N + b, which is
    strictly increasing and leaves no overlap (⌊(s + n)/B⌋ + 1 ≥ ⌊s/B⌋ + ⌈n/B⌉), so b is found by a
    binary search over the starts (log₂ n_seq scalar loads), each sequence's first (under causal
    heaviest) tile first; the slots in the gaps are empty programs. The bounds are clamped into the
    tensors' ``total_q``, ``total_k`` rows (``seq_bounds``), the search's starts too."""
    if SEQ == 2:
        lo = pid_t * 0
        hi = n_seq - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            first = tl.minimum(tl.maximum(tl.load(k_starts + mid * stride_seq), 0), total_k) // BLOCK_N + mid
            lo = tl.where(first <= pid_t, mid, lo)
            hi = tl.where(first <= pid_t, hi, mid - 1)
        b = lo
    else:
        b = pid_b
    q0, n_q = seq_bounds(tl.load(q_starts + b * stride_seq), tl.load(q_ends + b * stride_seq), total_q)
    k0, n_k = seq_bounds(tl.load(k_starts + b * stride_seq), tl.load(k_ends + b * stride_seq), total_k)
    tile = pid_t
    if SEQ == 2:
        tile = pid_t - (k0 // BLOCK_N + b)
    off = n_k - n_q
    start_n = tile * BLOCK_N
    dead = (tile < 0) | (start_n >= n_k)
    start_n = tl.where(dead, 0, start_n)
    n_k = tl.where(dead, 0, n_k)
    n_q = tl.where(dead, 0, n_q)
    return b, start_n, q0, n_q, k0, n_k, off


@triton.jit
def seq_rows(lo, mid_lo, mid_hi, start_n, n_k, n_q, off, q0, k0):
    """A ranges or varlen key tile's bounds as rows of the tensors: the sequence's query tiles
    (``lo``, ``mid_lo``, ``mid_hi``), key tile, key and query ends and diagonal moved by its first
    query row q0 and key row k0 (key j ≤ row i + off holds shifted by off + k0 − q0), so the
    partitions need neither (fewer live registers in the consumers' loop)."""
    return lo + q0, mid_lo + q0, mid_hi + q0, start_n + k0, n_k + k0, n_q + q0, off + (k0 - q0)


if _HAS_GLUON:
    from .attention_fwd_gluon import _qk, alibi_slope2

    _DQC = gl.constexpr(DQ_COLS)  # the kernels' name for it (globals must be constexpr there)

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """global[box at coord] += shared ``src`` (``cp.reduce.async.bulk.tensor .add``), tracked like
        a TMA store (``tma.store_wait``). Gluon 3.6 has the op in its IR builder but no Python name
        for it."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

    @gluon.jit
    def _query_tile(it, n_tiles, lo, rot, h_kv, GROUP: gl.constexpr, ROTATE: gl.constexpr, BLOCK_M: gl.constexpr):
        """Step ``it`` of a program's flat loop over (query head of the group, query tile): the head
        and the tile's first row. Loader and consumers walk the same sequence."""
        if ROTATE:
            # Non-negative operands: unsigned division. A warp-specialized partition receives rot and
            # n_tiles as plain values, without the knowledge that they come from a program id. (The
            # same assumptions under causal masks moved the step loops' spills: there they stay out.)
            gl.assume(it >= 0)
            gl.assume(rot >= 0)
            gl.assume(n_tiles > 0)
        if GROUP == 1:
            g = 0
            i = it
        else:
            g = it // n_tiles
            i = it % n_tiles
        if ROTATE:
            i = (i + rot) % n_tiles
        return h_kv * GROUP + g, lo + i * BLOCK_M

    @gluon.jit
    def _loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc,
                q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready, empty,
                b, h_kv, start_n, n_heads, lo, n_tiles, rot, row_shift,
                CONSUMERS: gl.constexpr, GROUP: gl.constexpr, ROTATE: gl.constexpr,
                BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SEQ: gl.constexpr, KV_SHARE: gl.constexpr):
        """The loader warp: K and V once, then Q, dO, lse₂, δ of step ``it`` into slot it % STAGES
        once every consumer freed it. Ranges and varlen (``SEQ``): ``start_n`` and ``lo`` are rows of
        the tensors (the kernel shifted them by the sequence's first key / query row); varlen's
        batch coordinate is 0, the packed tensors' only one, and lse₂/δ are re-laid so that each
        sequence's rows start at an aligned column: query row r at column r + ``row_shift``
        (``_aligned_rows``). ``KV_SHARE`` > 1: ``h_kv`` is a query head, its K and V those of KV head
        h_kv // KV_SHARE (``group_split``)."""
        bt = b
        if SEQ == 2:
            bt = 0
        mbarrier.expect(kv_bar, CONSUMERS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(k_desc, [bt, h_kv // KV_SHARE, start_n + 64 * c, 0], kv_bar,
                                            k_smem.index(c))
            tma.async_copy_global_to_shared(v_desc, [bt, h_kv // KV_SHARE, start_n + 64 * c, 0], kv_bar,
                                            v_smem.index(c))
        step_bytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                    + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        for it in range(GROUP * n_tiles):
            s = it % STAGES
            # A fresh barrier's "previous" phase counts as complete: the first round never waits.
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            h, start_m = _query_tile(it, n_tiles, lo, rot, h_kv, GROUP, ROTATE, BLOCK_M)
            bar = ready.index(s)
            mbarrier.expect(bar, step_bytes)
            tma.async_copy_global_to_shared(q_desc, [bt, h, start_m, 0], bar, q_smem.index(s))
            tma.async_copy_global_to_shared(do_desc, [bt, h, start_m, 0], bar, do_smem.index(s))
            col = start_m
            if SEQ != 0:
                col = start_m + row_shift
            tma.async_copy_global_to_shared(lse_desc, [bt * n_heads + h, col], bar, lse_smem.index(s))
            tma.async_copy_global_to_shared(delta_desc, [bt * n_heads + h, col], bar, delta_smem.index(s))

    @gluon.jit
    def _row(smem, s, BLOCK_M: gl.constexpr, st_layout: gl.constexpr):
        """Slot ``s``'s lse₂ or δ row as [1, BLOCK_M] in the score layout (one value per query
        column, broadcast over the keys)."""
        row = smem.index(s).reshape([BLOCK_M]).load(gl.SliceLayout(0, st_layout))
        return gl.expand_dims(row, 0)

    @gluon.jit
    def _masked(pt, keys, start_m, n_k, off, win_left, win_right, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                HAS_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr, st_layout: gl.constexpr, n_q=None,
                SEQ: gl.constexpr = 0):
        """Pᵀ with the pairs no query sees set to 0: keys past Nk (zero-filled by TMA) and keys
        outside the query's band: under causal right of the diagonal (key > query + Nk − Nq); with a
        window (``HAS_LEFT``/``HAS_RIGHT``, causal as the right side at 0) the queries of key j are
        [j − off − right, j − off + left], bounds made per key (the rows of Pᵀ, two a thread): a
        compare per side and score, as the forward's ``_band`` makes them per query. Ranges and
        varlen (``SEQ``): also queries past the sequence's ``n_q`` (its tiles read the next
        sequence's rows, whose lse₂ is finite)."""
        visible = gl.expand_dims(keys < n_k, 1)
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        if SEQ != 0:
            visible = visible & gl.expand_dims(rows < n_q, 0)
        if HAS_LEFT or HAS_RIGHT:
            rows = gl.expand_dims(rows, 0)
            if HAS_RIGHT or CAUSAL:
                first = keys - off
                if HAS_RIGHT:
                    first = keys - (off + win_right)
                visible = visible & (rows >= gl.expand_dims(first, 1))
            if HAS_LEFT:
                visible = visible & (rows <= gl.expand_dims(keys - (off - win_left), 1))
        elif CAUSAL:
            visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows + off, 0))
        return gl.where(visible, pt, 0.0)

    @gluon.jit
    def _step_barriers(STAGES: gl.constexpr, DS_BUFS: gl.constexpr, CONSUMERS: gl.constexpr):
        """The pipeline's mbarriers, initialised: K and V landed (``kv_bar``), a step's loads landed
        (``ready``) and read by every consumer (``empty``), a dS set written by every consumer
        (``ds_ready``) and read by every consumer's dQ wgmma (``ds_free``)."""
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
        for i in gl.static_range(DS_BUFS):
            mbarrier.init(ds_ready.index(i), count=CONSUMERS)
            mbarrier.init(ds_free.index(i), count=CONSUMERS)
        return kv_bar, ready, empty, ds_ready, ds_free

    @gluon.jit
    def _dq_zeros(BLOCK_M: gl.constexpr):
        """A zero dQ block (BLOCK_M × 64, fp32) in the layout of its wgmma."""
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, _DQC, 16])
        return gl.zeros([BLOCK_M, _DQC], gl.float32, layout=dq_layout)

    @gluon.jit
    def _dq_issue(ds_smem, ds_buf, k_smem, dq, COL: gl.constexpr, CONSUMERS: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr):
        """Issue dQ[:, COL:COL+64] = dS·K[:, COL:COL+64] over every consumer's 64 keys: one chained
        asynchronous wgmma (one commit group) per consumer, dS and K both from shared memory, into
        ``dq``'s registers (overwritten: the previous block, already reduced)."""
        for c in gl.static_range(CONSUMERS):
            k_cols = k_smem.index(c).reshape([64, HEAD_DIM])
            if HEAD_DIM != _DQC:
                k_cols = k_cols.slice(COL, _DQC, dim=1)
            dq = warpgroup_mma(ds_smem.index(ds_buf * CONSUMERS + c), k_cols, dq, use_acc=c > 0, is_async=True)
        return dq

    @gluon.jit
    def _dq_stage(dq, dq_stage, sm_scale, ME: gl.constexpr, BLOCK_M: gl.constexpr, SPREAD: gl.constexpr):
        """dQ·scale into this consumer's staging buffer (``_dq_send`` then reduce-adds it into the
        fp32 buffer; rows past Nq fall outside the descriptor), its chunks in ``_spread_banks``'
        order where ``SPREAD``."""
        # The buffer is free once the previous reduce read it; only the issuing threads can wait on
        # a TMA op, the barrier tells the rest of the warpgroup.
        tma.store_wait(0)
        gl.thread_barrier()
        if SPREAD:
            dq_stage.index(ME).reshape([BLOCK_M, _DQC]).store(_spread_banks(dq * sm_scale))
        else:
            dq_stage.index(ME).reshape([BLOCK_M, _DQC]).store(dq * sm_scale)

    @gluon.jit
    def _spread_banks(x):
        """``x`` (rows × 64, fp32, the wgmma layout) with the 16-byte chunks of each 128-byte span
        reordered as ``_dq_from_buffer`` undoes: chunk 2a + b goes to 4b + a. Why: a thread's 8-byte
        store covers half a chunk; a half-warp stores 4 rows × 2 adjacent chunks, and under the
        128-byte swizzle (chunk XOR row mod 8) rows r and r ^ 1 put their pair on the same banks
        (two wavefronts where one does). Spread 4 chunks apart, the 4 rows fill the 32 banks once.
        The registers only change names: the stores stay 8-byte ones. (Used where the dQ block is
        deferred, ``defers_dq``: there it measured 6% fewer cycles at d 128 non-causal 8k; in the
        causal kernel, whose consumers stage at the end of every step, 11% more: NOTES,
        2026-11-25.)"""
        M: gl.constexpr = x.shape[0]
        x = gl.reshape(x, [M, _DQC // 32, 4, 2, 4])
        return gl.reshape(gl.permute(x, [0, 1, 3, 2, 4]), [M, _DQC])

    @gluon.jit
    def _dq_send(dq_stage, dq_desc, b, h, start_m, COL: gl.constexpr, ME: gl.constexpr):
        """The staged dQ block reduce-added into the fp32 buffer by one TMA op."""
        fence_async_shared()
        _tma_reduce_add(dq_desc, [b, h, start_m, COL], dq_stage.index(ME))

    @gluon.jit
    def _reduce_rows(x, stage, desc, b, h, row, ME: gl.constexpr, HEAD_DIM: gl.constexpr, COL: gl.constexpr = 0,
                     DRAIN: gl.constexpr = True):
        """``x`` (64 rows × HEAD_DIM, fp32) reduce-added into ``desc``'s rows [row, row + 64) of head
        h, columns from ``COL``, 64 at a time through this consumer's dQ staging buffer (rows past the
        end fall outside the descriptor). ``DRAIN``: wait for the last reduce to have read the buffer
        (else the next call's first part does)."""
        if HEAD_DIM == _DQC:
            parts = (x,)
        else:  # columns j and j + 64 sit in the same thread of the wgmma layout: a register split
            parts = gl.split(gl.permute(gl.reshape(x, [64, 2, _DQC]), [0, 2, 1]))
        for i in gl.static_range(len(parts)):
            tma.store_wait(0)  # the buffer is free once the previous reduce read it
            gl.thread_barrier()
            stage.index(ME).reshape([64, _DQC]).store(parts[i])
            fence_async_shared()
            _tma_reduce_add(desc, [b, h, row, COL + i * _DQC], stage.index(ME))
        if DRAIN:
            tma.store_wait(0)

    @gluon.jit
    def _dq_start(dv, dk, pa, dsa, dq, ds_smem, ds_buf, use, k_smem, ds_ready, empty_s, COL: gl.constexpr,
                  DEFER: gl.constexpr, CONSUMERS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
        """The end of a step for a consumer computing dQ columns COL..COL+63: once every consumer's
        dS block is in, issue the dQ wgmmas (into ``dq``'s registers) behind dV and dK, retire dV
        and dK, and free the Q/dO slot. ``DEFER``: the dQ groups, the newest, stay in flight (dQ
        does not read the slot) for ``_dq_finish`` in the next step; else all three retire here."""
        mbarrier.wait(ds_ready.index(ds_buf), use & 1)
        dq = _dq_issue(ds_smem, ds_buf, k_smem, dq, COL, CONSUMERS, HEAD_DIM, BLOCK_M)
        if DEFER:
            dv, dk, pa, dsa = warpgroup_mma_wait(CONSUMERS, deps=[dv, dk, pa, dsa])
        else:
            dv, dk, pa, dsa, dq = warpgroup_mma_wait(0, deps=[dv, dk, pa, dsa, dq])
        mbarrier.arrive(empty_s)
        return dv, dk, dq

    @gluon.jit
    def _dq_finish(dq, dq_stage, dq_desc, ds_free, ds_buf, b, h, start_m, sm_scale, COL: gl.constexpr,
                   ME: gl.constexpr, BLOCK_M: gl.constexpr, SPREAD: gl.constexpr, STAGED: gl.constexpr = False):
        """After a dQ block issued by ``_dq_start`` retired: free its dS set and reduce-add it
        (``STAGED``: ``_dq_stage`` already put it in the staging buffer)."""
        mbarrier.arrive(ds_free.index(ds_buf))
        if not STAGED:
            _dq_stage(dq, dq_stage, sm_scale, ME, BLOCK_M, SPREAD)
        _dq_send(dq_stage, dq_desc, b, h, start_m, COL, ME)

    @gluon.jit
    def _store_dk(k_me, dk, DK_W: gl.constexpr):
        """dK (64 keys × ``DK_W``, 16-bit) into this warpgroup's K box for its TMA store: over its
        first DK_W columns where dK runs at q's width (``QK``), the rest past dk's columns."""
        if DK_W == k_me.shape[1]:
            k_me.store(dk)
        else:
            k_me.slice(0, DK_W, dim=1).store(dk)

    @gluon.jit
    def _store_rows(x, base, stride_n, first, end, COL: gl.constexpr, layout: gl.constexpr,
                    D_REAL: gl.constexpr = 0):
        """x (R × W float32 in ``layout``) in ``base``'s dtype into rows [first, first + R) of
        ``base`` (one (batch, head) plane, unit column stride) at columns [COL, COL + W); rows from
        ``end`` on (a row index, not a count) are dropped (dK, dV past Nk or a sequence's end; dQ past
        Nq), and columns from ``D_REAL`` on where the kernel runs a padded head dim (> 0;
        ``kernel_head_dim``)."""
        R: gl.constexpr = x.shape[0]
        W: gl.constexpr = x.shape[1]
        END: gl.constexpr = D_REAL if D_REAL > 0 else COL + W
        rows = first + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = COL + gl.arange(0, W, layout=gl.SliceLayout(0, layout))
        ok = gl.expand_dims(rows < end, 1) & gl.expand_dims(cols < END, 0)  # (the column test: 2-D)
        at = base + gl.expand_dims(rows.to(gl.int64) * stride_n, 1) + gl.expand_dims(cols, 0)
        gl.store(at, x.to(base.dtype.element_ty), mask=ok)

    @gluon.jit
    def _retire_step(dv, dk, pa, dsa, ds_free, ds_buf, empty_s, FUSED_DQ: gl.constexpr):
        """The end of a step without dQ work here: retire dV and dK, free the Q/dO slot (and the dS
        set, which this consumer does not read)."""
        dv, dk, pa, dsa = warpgroup_mma_wait(0, deps=[dv, dk, pa, dsa])
        mbarrier.arrive(empty_s)
        if FUSED_DQ:
            mbarrier.arrive(ds_free.index(ds_buf))
        return dv, dk

    @gluon.jit
    def _to_16bit(x, dtype: gl.constexpr, PACKED: gl.constexpr):
        """x (float32) rounded to ``dtype`` (bf16 or fp16, round to nearest even as ``.to`` does).
        ``PACKED``: two elements per ``cvt.rn.{bf16,f16}x2.f32``. Written with ``.to``, Pᵀ's and
        dSᵀ's conversions compiled to one ``F2F`` per element on sm_90 (the special-function pipe
        the exp2 needs; Pᵀ's 16-bit values are widened again for dSᵀ); packed they go to the FMA
        pipe and the plain d 128 kernel spills 20 bytes, not 72 (triton 3.6, ``ptx_hashes.py
        --ptxas``). Not under softcap, where the packed form spilled more (248 against 184)."""
        if PACKED:
            CVT: gl.constexpr = ("cvt.rn.bf16x2.f32 $0, $2, $1;" if dtype == gl.bfloat16
                                 else "cvt.rn.f16x2.f32 $0, $2, $1;")
            y = gl.inline_asm_elementwise(CVT, "=r,f,f", [x], dtype=dtype.value, is_pure=True, pack=2)
        else:
            y = x.to(dtype)
        return y

    @gluon.jit
    def _consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
                  kv_bar, ready, empty, ds_ready, ds_free, dq_desc, dk_desc, dv_desc,
                  b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left, win_right, qk_scale,
                  sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                  n_q, q0, dk_base, dv_base, stride_dkn, stride_dvn,
                  ME: gl.constexpr, CONSUMERS: gl.constexpr, GROUP: gl.constexpr, ROTATE: gl.constexpr,
                  CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                  ALIBI: gl.constexpr, FAST_TANH: gl.constexpr, FUSED_DQ: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DS_BUFS: gl.constexpr, SEQ: gl.constexpr,
                  DEFER_DQ: gl.constexpr, KV_SHARE: gl.constexpr, D_REAL: gl.constexpr, DV_REAL: gl.constexpr,
                  QK: gl.constexpr = 0):
        """One consumer warpgroup: keys [start_n + 64·ME, +64) against every streamed query tile.
        ``QK`` > 0: Sᵀ over q's first QK columns (its head dim rounded up to 64, where v's wider one
        sets the kernel's width: 64 / 128), the rest being TMA's zeros (``_qk``), and dK (q's width
        too) accumulated over those columns only.

        Options (constexprs; a plain call compiles to the code it compiled to without them): the
        scores are the portable backward's (``score_tile``): softcap c·tanh(s·scale/c)
        (``fold_factor``, ``tanh.approx.f32`` for 16-bit inputs) with its derivative 1 − tanh² in
        dSᵀ, ALiBi's slope·|i + off − j| subtracted over the exp2's factor as the Gluon forward
        does (no gradient to the slopes). Sinks change nothing here: the saved lse has the sink in
        it, so P = exp(S − lse) is the same formula (dsinks is a host-side reduction of δ).

        Ranges and varlen (``SEQ`` 1, 2): ``b`` is the sequence (ALiBi's row); rows and keys are
        the tensors' (the kernel shifted the sequence's tiles, its ends ``n_q``/``n_k`` and its
        offset ``off`` by its first query and key row, so every mask compares as before; ``q0`` is
        that first query row). Tiles crossing the sequence's query end are masked (their rows past
        ``n_q`` are the next sequence's, with finite lse₂, or zeros past the padded rows: Pᵀ and so
        dSᵀ are set to 0 there, and the reduce-add adds exact zeros to those dQ rows); dK, dV of a
        warpgroup holding the key end go through masked register stores from ``dk_base``/``dv_base``
        (the (b, KV head) planes; a TMA store of the whole box would overwrite the next sequence's
        rows)."""
        dtype: gl.constexpr = k_smem.dtype
        bt = b  # the TMA batch coordinate: varlen tensors are one packed batch
        if SEQ == 2:
            bt = 0
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        # dK = dSᵀ·Q over q's own columns (``QK``; Q's columns past them are zeros)
        DK_W: gl.constexpr = QK if QK > 0 else HEAD_DIM
        dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DK_W, 16])
        dk_a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout, k_width=2)
        # D 128: consumer c computes dQ columns [64c, 64c + 64) at every step; D 64 (one block of
        # columns): the consumers take turns by step.
        SPLIT_COLS: gl.constexpr = HEAD_DIM // _DQC == CONSUMERS

        k_me = k_smem.index(ME).reshape([64, HEAD_DIM])
        v_me = v_smem.index(ME).reshape([64, HEAD_DIM])
        keys = start_n + 64 * ME + gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout))
        tail = start_n + 64 * (ME + 1) > n_k  # this warpgroup holds zero-filled keys past Nk
        dk = gl.zeros([64, DK_W], gl.float32, layout=dk_layout)
        dv = gl.zeros([64, HEAD_DIM], gl.float32, layout=kv_layout)
        st_zero = gl.zeros([64, BLOCK_M], gl.float32, layout=st_layout)
        n_steps = GROUP * n_tiles
        keys_f = 0.0
        cols_f = 0.0
        if ALIBI:  # |i + off − j| = |query − (key − off)|: exact float differences below 2²⁴
            # Causal, and varlen with softcap (it spills less so): the key's offset in this
            # warpgroup's block (see below).
            if CAUSAL or (SEQ == 2 and SOFTCAP):
                keys_f = gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout)).to(gl.float32)
            elif SEQ == 2:  # packed rows run past 2²⁴: counted from the sequence's first, ``q0``
                keys_f = (keys - off - q0).to(gl.float32)
            else:  # (the host keeps calls past 2²⁴ rows off this kernel: ``supported``)
                keys_f = (keys - off).to(gl.float32)
            if SOFTCAP:  # the query columns 0 … BLOCK_M − 1 as floats, made once (see below)
                cols_f = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout)).to(gl.float32)
        # DEFER_DQ (``defers_dq``): a step's dQ block is retired and reduce-added in the next step,
        # behind its Sᵀ and dPᵀ (``_dq_start``; ``dq`` is the block in flight, a zero block at first).
        DQ_COL: gl.constexpr = ME * _DQC if SPLIT_COLS else 0
        # Columns past q's own (``QK``: 64 / 128's consumer 1) are dS times K's zeros: no dQ work here.
        DQ_HERE: gl.constexpr = not (SPLIT_COLS and QK > 0 and DQ_COL >= QK)
        dq = warpgroup_mma_init(_dq_zeros(BLOCK_M))
        mbarrier.wait(kv_bar, 0)

        for it in range(n_steps):
            s = it % STAGES
            h, start_m = _query_tile(it, n_tiles, lo, rot, h_kv, GROUP, ROTATE, BLOCK_M)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            q_t = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
            do_t = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
            if FUSED_DQ and DEFER_DQ:  # the previous step's dQ block, retired before Sᵀ is issued
                dq_done = warpgroup_mma_wait(0, deps=[dq])
                if SPLIT_COLS and DQ_HERE:  # D 128: staged first, so its registers are free for Sᵀ's and dPᵀ's
                    if it > 0:
                        _dq_stage(dq_done, dq_stage, sm_scale, ME, BLOCK_M, DEFER_DQ)
            st = _qk(k_me, q_t, st_zero, QK if QK > 0 else HEAD_DIM)
            dpt = warpgroup_mma(v_me, do_t.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            if FUSED_DQ and DEFER_DQ:
                # ... and reduce-added while Sᵀ and dPᵀ run, so the tensor pipe goes from dQ on to Sᵀ
                # after only the wait. (Retired first: ptxas serializes every wgmma of the kernel when
                # other instructions run between a wgmma in flight and its wait, as this would.)
                if (it > 0) & ((SPLIT_COLS and DQ_HERE) or (not SPLIT_COLS and (it - 1) % CONSUMERS == ME)):
                    h_prev, m_prev = _query_tile(it - 1, n_tiles, lo, rot, h_kv, GROUP, ROTATE, BLOCK_M)
                    _dq_finish(dq_done, dq_stage, dq_desc, ds_free, (it - 1) % DS_BUFS, bt, h_prev, m_prev,
                               sm_scale, DQ_COL, ME, BLOCK_M, DEFER_DQ, SPLIT_COLS)
            slope = 0.0
            if ALIBI:  # slope·log2 e of (b, h) over the exp2's factor, read while the wgmmas run
                slope = alibi_slope2(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP)
            lse2 = _row(lse_smem, s, BLOCK_M, st_layout)
            st = warpgroup_mma_wait(1, deps=[st])  # Sᵀ retired; dPᵀ may still run
            # Base-2 scores x·fold: Sᵀ and scale·log2 e, or tanh(Sᵀ·scale/c) and c·log2 e.
            x, fold = fold_factor(st, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
            t = x  # tanh(·) under softcap, for its derivative
            if ALIBI:
                # The query rows as floats: converted per step, or with softcap from columns made
                # once (16 registers across the loop). Whichever ptxas spilled less at d 128
                # (triton 3.6, sm_90a): ALiBi alone 28–76 bytes per step-converted against 16–136
                # kept; with softcap 112–332 kept against 360–464 per step-converted.
                # Causal: every query sees only keys at or left of its diagonal, so |i + off − j| =
                # d₀ + c − r for the step's d₀ = start_m + off − (the block's first key), query column
                # c and key row r: x gains slope·r (one add a score) and each column's slope·(d₀ + c)
                # joins its lse in the exponent's offset; offsets within the block keep the terms
                # that matter (d small) exact. (Pairs right of the diagonal get the wrong bias, and
                # Pᵀ = 0 from ``_masked``.)
                if CAUSAL or (SEQ == 2 and SOFTCAP):
                    first = start_m + off - (start_n + 64 * ME)
                elif SEQ == 2:  # the query row from the sequence's first, as ``keys_f``
                    first = start_m - q0
                else:
                    first = start_m
                if SOFTCAP:
                    rows_f = cols_f + first.to(gl.float32)
                else:
                    rows_f = (first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))).to(gl.float32)
                if CAUSAL:
                    x = x + gl.expand_dims(slope * keys_f, 1)
                    lse2 = lse2 + gl.expand_dims(slope * fold * rows_f, 0)
                else:
                    x = x - slope * gl.abs(gl.expand_dims(rows_f, 0) - gl.expand_dims(keys_f, 1))
            pt = gl.exp2(x * fold - lse2)
            # Masked: tiles before the rows seeing every key (``query_tiles``), after them under a
            # window's left side (without one they run to Nq), and a warpgroup holding keys past Nk.
            edge = start_m < mid_lo
            if HAS_LEFT:
                edge = edge | (start_m >= mid_hi)
            if SEQ != 0:
                edge = edge | (start_m + BLOCK_M > n_q)
            if edge | tail:
                pt = _masked(pt, keys, start_m, n_k, off, win_left, win_right, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_M,
                             st_layout, n_q, SEQ)
            # Pᵀ rounded once to the input dtype serves both dV (the A operand, same registers:
            # the conversion is trivial) and dSᵀ, so no fp32 copy stays live across the wait.
            p16 = _to_16bit(pt, dtype, not SOFTCAP)
            if SOFTCAP:  # Pᵀ ∘ (1 − tanh²), rounded once like Pᵀ: the factor of dSᵀ
                pd16 = (pt * (1.0 - t * t)).to(dtype)
            else:
                pd16 = p16
            pa = gl.convert_layout(p16, a_layout, assert_trivial=True)
            dv = warpgroup_mma(pa, do_t, dv, is_async=True)
            delta = _row(delta_smem, s, BLOCK_M, st_layout)
            dpt = warpgroup_mma_wait(1, deps=[dpt])  # dPᵀ retired; dV may still run
            dst = _to_16bit(pd16.to(gl.float32) * (dpt - delta), dtype, not SOFTCAP)
            dsa = gl.convert_layout(dst, dk_a_layout, assert_trivial=True)
            if DK_W == HEAD_DIM:
                dk = warpgroup_mma(dsa, q_t, dk, is_async=True)
            else:
                dk = warpgroup_mma(dsa, q_t.slice(0, DK_W, dim=1), dk, is_async=True)

            ds_buf = it % DS_BUFS
            use = it // DS_BUFS
            if FUSED_DQ:
                # Share dSᵀ through dS set ds_buf: once every consumer's dQ wgmmas of the set's
                # previous use retired, write this warpgroup's block (as dS, queries × keys) and
                # say so (the arrive is lowered after a warpgroup barrier: every part is written).
                mbarrier.wait(ds_free.index(ds_buf), (use & 1) ^ 1)
                ds_smem.index(ds_buf * CONSUMERS + ME).store(gl.permute(dst, (1, 0)))
                fence_async_shared()
                mbarrier.arrive(ds_ready.index(ds_buf))
                if SPLIT_COLS and not DQ_HERE:
                    dv, dk = _retire_step(dv, dk, pa, dsa, ds_free, ds_buf, empty.index(s), FUSED_DQ)
                elif SPLIT_COLS:  # every step, columns [64·ME, 64·ME + 64)
                    dv, dk, dq_step = _dq_start(dv, dk, pa, dsa, _dq_zeros(BLOCK_M), ds_smem, ds_buf, use, k_smem,
                                                ds_ready, empty.index(s), DQ_COL, DEFER_DQ, CONSUMERS, HEAD_DIM,
                                                BLOCK_M)
                    if DEFER_DQ:  # in flight into the next step
                        dq = dq_step
                    else:
                        _dq_finish(dq_step, dq_stage, dq_desc, ds_free, ds_buf, bt, h, start_m, sm_scale, DQ_COL, ME,
                                   BLOCK_M, DEFER_DQ)
                else:  # (new names: a runtime branch may not retype the accumulators it takes in)
                    if it % CONSUMERS == ME:
                        dv_out, dk_out, dq_out = _dq_start(dv, dk, pa, dsa, dq_done, ds_smem, ds_buf, use, k_smem,
                                                           ds_ready, empty.index(s), 0, True, CONSUMERS,
                                                           HEAD_DIM, BLOCK_M)
                    else:
                        dv_out, dk_out = _retire_step(dv, dk, pa, dsa, ds_free, ds_buf, empty.index(s), FUSED_DQ)
                        dq_out = warpgroup_mma_init(dq_done)
                    dv = dv_out
                    dk = dk_out
                    dq = dq_out
            else:
                dv, dk = _retire_step(dv, dk, pa, dsa, ds_free, ds_buf, empty.index(s), FUSED_DQ)

        if FUSED_DQ:
            if DEFER_DQ:  # the last step's dQ block
                if n_steps > 0:
                    dq_done = warpgroup_mma_wait(0, deps=[dq])
                    if (SPLIT_COLS and DQ_HERE) or (not SPLIT_COLS and (n_steps - 1) % CONSUMERS == ME):
                        h_last, m_last = _query_tile(n_steps - 1, n_tiles, lo, rot, h_kv, GROUP, ROTATE, BLOCK_M)
                        _dq_finish(dq_done, dq_stage, dq_desc, ds_free, (n_steps - 1) % DS_BUFS, bt, h_last, m_last,
                                   sm_scale, DQ_COL, ME, BLOCK_M, DEFER_DQ)
            tma.store_wait(0)
            if n_steps > 0:  # every consumer's dQ wgmmas read K: all retired before K is reused
                last = n_steps - 1
                mbarrier.wait(ds_free.index(last % DS_BUFS), (last // DS_BUFS) & 1)
        # dK·scale and dV through this warpgroup's own K and V boxes (every wgmma reading them has
        # retired) and one TMA store each; rows past Nk fall outside the descriptors.
        if KV_SHARE > 1:  # one query head of the group: dK·scale and dV added into the KV head's fp32 sums
            _reduce_rows(dk * sm_scale, dq_stage, dk_desc, b, h_kv // KV_SHARE, start_n + 64 * ME, ME, DK_W)
            _reduce_rows(dv, dq_stage, dv_desc, b, h_kv // KV_SHARE, start_n + 64 * ME, ME, HEAD_DIM)
        elif SEQ == 0:
            _store_dk(k_me, (dk * sm_scale).to(dtype), DK_W)
            v_me.store(dv.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [b, h_kv, start_n + 64 * ME, 0], k_smem.index(ME))
            tma.async_copy_shared_to_global(dv_desc, [b, h_kv, start_n + 64 * ME, 0], v_smem.index(ME))
            tma.store_wait(0)
        else:
            # A sequence's end inside the box: only its rows, by masked register stores (none when
            # the box starts past the end, or the program has no tile: n_k = 0).
            first = start_n + 64 * ME
            n_rows = n_k - first
            if n_rows >= 64:
                _store_dk(k_me, (dk * sm_scale).to(dtype), DK_W)
                v_me.store(dv.to(dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(dk_desc, [bt, h_kv, first, 0], k_smem.index(ME))
                tma.async_copy_shared_to_global(dv_desc, [bt, h_kv, first, 0], v_smem.index(ME))
                tma.store_wait(0)
            elif n_rows > 0:
                # dk's and dv's own columns where the kernel runs a padded head dim (D_REAL > 0;
                # DV_REAL > 0: dv's where v's head dim is not q's)
                COLS: gl.constexpr = D_REAL if D_REAL > 0 else HEAD_DIM
                COLS_V: gl.constexpr = DV_REAL if DV_REAL > 0 else COLS
                _store_rows(dk * sm_scale, dk_base, stride_dkn, first, n_k, 0, dk_layout, COLS)
                _store_rows(dv, dv_base, stride_dvn, first, n_k, 0, kv_layout, COLS_V)

    # Lengths and the GQA group's position change from call to call: one binary for all of them.
    # (Ranges and varlen: the sequence bounds and dk, dv as pointers for the masked stores at a
    # sequence's end; all None for a dense batch, whose launch and code are as before.)
    @gluon.jit(do_not_specialize=["n_heads", "n_kv_heads", "n_q", "n_k", "band", "banded_heads", "win_left",
                                  "win_right", "n_seq"])
    def _attn_bwd_gluon_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc,
                               n_heads, n_kv_heads, n_q, n_k, band, banded_heads, win_left, win_right, qk_scale,
                               sm_scale,
                               alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                               q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq,
                               dk_ptr, dv_ptr, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                               row_starts,
                               HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                               HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                               ALIBI: gl.constexpr, FAST_TANH: gl.constexpr, GROUP: gl.constexpr,
                               CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                               FUSED_DQ: gl.constexpr, DS_BUFS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                               LOADER_REGS: gl.constexpr, DEFER_DQ: gl.constexpr, SEQ: gl.constexpr = 0,
                               KV_SHARE: gl.constexpr = 1, D_REAL: gl.constexpr = 0, DV_REAL: gl.constexpr = 0,
                               QK: gl.constexpr = 0, HEADS_FASTEST: gl.constexpr = False):
        BLOCK_N: gl.constexpr = 64 * CONSUMERS
        # Rotated starts where every program's rows begin at 0 (no causal diagonal, no right side);
        # with one, the programs' ranges start apart already (and the rotation costs registers).
        ROTATE: gl.constexpr = not (CAUSAL or HAS_RIGHT)
        # Key tiles of one KV head on consecutive programs (they share its Q and dO in L2), the
        # first tiles (under causal the heaviest) first; causal, the last heads in bands (``banded_key_tile``).
        pid = gl.program_id(0)
        q0 = 0
        k0 = 0
        if SEQ == 2:  # varlen: slots of key tiles over the packed batch (``seq_key_tile``), per KV head
            h_kv, slot = varlen_slot(pid, gl.num_programs(0), n_kv_heads, HEADS_FASTEST)
            b, start_n, q0, n_q, k0, n_k, off = seq_key_tile(slot, 0, q_starts, q_ends, k_starts, k_ends, stride_seq,
                                                             n_seq, n_q, n_k, BLOCK_N, SEQ)
            tile = start_n // BLOCK_N
        else:
            n_key_tiles = gl.cdiv(n_k, BLOCK_N)
            if CAUSAL and SEQ == 0:
                bh_kv, tile = banded_key_tile(pid, gl.num_programs(0), n_key_tiles, band, banded_heads)
            else:
                tile = pid % n_key_tiles
                bh_kv = pid // n_key_tiles
            if KV_SHARE > 1:
                # A group's query heads far apart in the order, the member outermost: their float32
                # dK, dV adds go to the same KV head's sums, and programs adding at once contend.
                n_pairs = gl.num_programs(0) // n_key_tiles // KV_SHARE  # (batch, KV head) pairs
                pair = bh_kv % n_pairs
                b = pair // (n_kv_heads // KV_SHARE)
                h_kv = pair % (n_kv_heads // KV_SHARE) * KV_SHARE + bh_kv // n_pairs
            else:
                b = bh_kv // n_kv_heads
                h_kv = bh_kv % n_kv_heads
            start_n = tile * BLOCK_N
            if SEQ == 1:  # ranges: tiles of the padded length; those past the row's range idle
                b, start_n, q0, n_q, k0, n_k, off = seq_key_tile(tile, b, q_starts, q_ends, k_starts, k_ends,
                                                                 stride_seq, n_seq, n_q, n_k, BLOCK_N, SEQ)

        # The n_tiles query tiles from lo see some key of the tile; those in [mid_lo, mid_hi) every
        # key (bottom-right: query i sees key j ≤ i + Nk − Nq under causal, a band with a window;
        # ranges and varlen: the sequence's lengths and offset).
        seq_n_q = 0  # the consumers' row bound: only ranges and varlen tiles have one
        if SEQ == 0:
            off = n_k - n_q
        else:
            seq_n_q = n_q
        lo, n_tiles, mid_lo, mid_hi = query_tiles(start_n, n_q, off, win_left, win_right, CAUSAL, HAS_LEFT,
                                                  HAS_RIGHT, BLOCK_M, BLOCK_N)
        rot = start_n * 0
        if ROTATE:
            rot = tile
        row_shift = 0  # lse₂/δ column of query row r: r + row_shift (``_aligned_rows``)
        if SEQ == 1:
            row_shift = -q0
        elif SEQ == 2:
            row_shift = tl.load(row_starts + b) - q0
        if SEQ != 0:  # rows of the tensors from here on (``seq_rows``)
            lo, mid_lo, mid_hi, start_n, n_k, seq_n_q, off = seq_rows(lo, mid_lo, mid_hi, start_n, n_k, seq_n_q,
                                                                      off, q0, k0)
            # dk, dv: the (b, KV head) planes' starts for the masked stores (None for a dense batch)
            dk_ptr = dk_ptr + h_kv.to(gl.int64) * stride_dkh
            dv_ptr = dv_ptr + h_kv.to(gl.int64) * stride_dvh
            if SEQ == 1:  # (varlen: one packed batch)
                dk_ptr += b.to(gl.int64) * stride_dkb
                dv_ptr += b.to(gl.int64) * stride_dvb

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + v_desc.block_type.shape, v_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                               delta_desc.layout)
        if FUSED_DQ:
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], dtype)
            ds_smem = gl.allocate_shared_memory(dtype, [DS_BUFS * CONSUMERS, BLOCK_M, 64], ds_layout)
            dq_stage = gl.allocate_shared_memory(gl.float32, [CONSUMERS] + dq_desc.block_type.shape, dq_desc.layout)
        else:  # unused placeholders (the partitions take the same arguments either way)
            ds_smem = k_smem
            dq_stage = k_smem
        kv_bar, ready, empty, ds_ready, ds_free = _step_barriers(STAGES, DS_BUFS, CONSUMERS)
        fence_async_shared()

        # (The partitions' argument tuples are written out: Gluon takes no function values in
        # variables.) Consumer 0 is the default partition; the others and the loader are workers.
        gl.static_assert(CONSUMERS == 2, "two consumer warpgroups (the dQ split assumes it)")
        gl.warp_specialize([
            (_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
                         kv_bar, ready, empty, ds_ready, ds_free, dq_desc, dk_desc, dv_desc,
                         b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left, win_right,
                         qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                         seq_n_q, q0, dk_ptr, dv_ptr, stride_dkn, stride_dvn,
                         0, CONSUMERS, GROUP, ROTATE, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                         FUSED_DQ, HEAD_DIM, BLOCK_M, STAGES, DS_BUFS, SEQ, DEFER_DQ, KV_SHARE, D_REAL,
                         DV_REAL, QK)),
            (_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
                         kv_bar, ready, empty, ds_ready, ds_free, dq_desc, dk_desc, dv_desc,
                         b, h_kv, start_n, lo, mid_lo, mid_hi, n_tiles, rot, n_k, off, win_left, win_right,
                         qk_scale, sm_scale, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2,
                         seq_n_q, q0, dk_ptr, dv_ptr, stride_dkn, stride_dvn,
                         1, CONSUMERS, GROUP, ROTATE, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                         FUSED_DQ, HEAD_DIM, BLOCK_M, STAGES, DS_BUFS, SEQ, DEFER_DQ, KV_SHARE, D_REAL,
                         DV_REAL, QK)),
            (_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc,
                       q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready, empty,
                       b, h_kv, start_n, n_heads, lo, n_tiles, rot, row_shift,
                       CONSUMERS, GROUP, ROTATE, BLOCK_M, STAGES, SEQ, KV_SHARE)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    # Launched through the per-specialization cache: Triton's own launch path binds and keys the
    # kernel's 39 arguments in Python on every call (~0.1 ms of host time).
    _attn_bwd_gluon_launcher = Launcher(_attn_bwd_gluon_kernel)


EXACT_ROWS = 2 ** 24  # float32 holds every integer up to here


def supported(q, k, v, do, **options) -> str | None:
    """None when ``attention_backward_gluon`` covers this call, else the reason in words: plain
    attention or a dense-batch ``variant`` with a sliding window, softcap, ALiBi slopes, sinks
    (``_variant_reason``; the options' tensors and the window sides as the Hopper forward takes
    them, ``attention_fwd_hopper._reason_for_variant``), a triton whose Gluon this kernel was written
    for, and the Triton TMA backward's rules at this kernel's head dims (``attention_bwd_hopper.supported``:
    CUDA sm_90, shapes, fp16/bf16, the head dims ``kernel_head_dim`` covers (v's may differ from q's),
    TMA alignment of q, k, v and do, the other options); at a kernel width of 256 its own two kernels
    (``attention_bwd_gluon_wide``; the dK/dV one alone, in one pass, where ``one_pass``), every layout.
    Not taken: non-causal ALiBi on the D ≤ 128 kernel over dense or padded batches past ``EXACT_ROWS``
    rows."""
    options = dict(options)
    variant = options.pop("variant", None)
    reason = _variant_reason(variant)
    if reason is not None:
        return reason
    if not _HAS_GLUON:
        return "this triton has no Gluon Hopper API (triton.experimental.gluon) with TMA reduce"
    if not triton.__version__.startswith(TESTED_TRITON):
        return f"triton {triton.__version__}: the Gluon backward is written for triton {TESTED_TRITON[0]}x"
    from .attention_bwd_hopper import supported as hopper_supported
    from .attention_fwd_hopper import offset_reason
    seq = SEQ_DENSE if variant is None or variant is PLAIN else variant.seq
    if (seq != SEQ_VARLEN and variant is not None and variant.alibi is not None and not options.get("causal")
            and kernel_head_dim(q.shape[3], v.shape[3]) != 256 and max(q.shape[2], k.shape[2]) > EXACT_ROWS):
        # The non-causal step forms ALiBi's distances from rows as float32 (packed varlen rows are
        # counted from each sequence's first; the d 256 kernels, padded ones too, and causal calls use offsets)
        return f"non-causal ALiBi past {EXACT_ROWS} rows (this kernel's float32 distances are exact below)"
    if seq != SEQ_DENSE and "causal_offset" in options:  # each sequence's own offset, from its bounds
        options["causal_offset"] = k.shape[2] - q.shape[2]
    elif seq == SEQ_DENSE:  # the variant's window and ALiBi are placed by the offset too
        reason = offset_reason(q, k, options.get("causal_offset"), options.get("causal"), variant)
        if reason is not None:
            return reason
    if q.dim() == 4 and v.dim() == 4 and kernel_head_dim(q.shape[3], v.shape[3]) is None:
        d, dv = q.shape[3], v.shape[3]
        dims = f"head dim {d}" if dv == d else f"head dims {d} (q, k) and {dv} (v)"
        return (f"{dims} (only {', '.join(map(str, HEAD_DIMS))}, or multiples of 8 between 32 and 256, run "
                "padded to the next)")
    reason = hopper_supported(q, k, v, do, head_dims=(q.shape[3],) if q.dim() == 4 else HEAD_DIMS,
                              any_value_dim=True, **options)
    if reason is None and variant is not None and variant is not PLAIN:
        from .attention_fwd_hopper import _reason_for_variant
        if seq == SEQ_DENSE:
            reason = _reason_for_variant(q, variant)
        else:
            reason = _seq_reason(q, k, variant)
            alibi = variant.alibi
            n_seq = variant.seq_q.shape[0] - (1 if seq == SEQ_VARLEN else 0) if reason is None else 0
            if reason is None and alibi is not None and isinstance(alibi, torch.Tensor) and alibi.dim() == 2:
                # slopes per sequence (the portable kernels' row b); the dense check takes (Hq,)
                if tuple(alibi.shape) != (n_seq, q.shape[1]):
                    reason = "alibi slopes of a ranges/varlen batch are not (Hq,) or (sequences, Hq)"
                alibi = alibi[0]
            if reason is None:
                reason = _reason_for_variant(q, variant._replace(seq=SEQ_DENSE, seq_q=None, seq_k=None, alibi=alibi))
    return reason


PATH_NOTE = ("a plain fp16/bf16 call on sm_90: the Gluon warp-specialized backward (dQ by TMA reduce-add, "
             "or by the Triton dQ kernel under torch.use_deterministic_algorithms; at head dim 256 dK/dV and "
             "dQ kernels of their own; FLASHATTN_LITE_HOPPER=0 turns the Hopper paths off)")


def path_note(variant: Variant = PLAIN, head_dim: int = 128, deterministic: bool = False,
              causal: bool = False, value_dim: int | None = None) -> str:
    """What ``explain()`` says of a backward this kernel takes: ``PATH_NOTE`` for a plain call, else
    the Hopper forward's words for the options with this kernel's name (at head dim 256, and 136–248
    run padded to it, its dK/dV and dQ kernels, or the dK/dV kernel alone (``one_pass``); under
    ``deterministic``, its dK/dV with the one-writer dQ kernel ``_tma_dq_covers`` picks); at a head
    dim run padded (``kernel_head_dim``; ``value_dim``: v's where it is not q's), that said too."""
    padded = kernel_head_dim(head_dim, value_dim)
    padded_value = wide_value_width(value_dim) if value_dim is not None and padded == 256 else None
    pad = padding_note(head_dim, value_dim, padded, padded_value)
    cfg = default_config(256, causal, 0, deterministic, value_dim or head_dim, variant,
                         qk_dim=head_dim) if padded == 256 else None
    one = cfg is not None and cfg.fused_dq
    if (variant is None or variant is PLAIN) and not pad and not one:
        return PATH_NOTE
    variant = PLAIN if variant is None else variant
    from .attention_fwd_hopper import path_note as hopper_note
    if one and cfg.mla:
        name = (f"the Gluon warp-specialized backward's MLA kernel (q, k {MLA_QK} beside v {MLA_V}: 128-key "
                "programs, dQ by TMA reduce-add in one pass)")
    elif one:
        name = "the Gluon warp-specialized backward's head dim 256 dK/dV kernel (dQ by TMA reduce-add, one pass)"
    elif padded == 256:
        name = "the Gluon warp-specialized backward's head dim 256 dK/dV and dQ kernels"
    elif deterministic and not _tma_dq_covers(variant, causal, head_dim, value_dim):
        name = "the Gluon warp-specialized backward's dK/dV with the portable one-writer dQ kernel"
    elif deterministic:
        name = "the Gluon warp-specialized backward's dK/dV with the Triton TMA one-writer dQ kernel"
    else:
        name = "the Gluon warp-specialized backward (dQ by TMA reduce-add)"
    return hopper_note(variant, name + pad)  # (which names the batch layout: ranges, varlen)


def fast_path(do, q, k, v, causal: bool, causal_offset: int, scale: float, deterministic: bool = False,
              variant: Variant = PLAIN) -> bool:
    """Whether an attention backward (plain, or a window, softcap, ALiBi, sinks) takes this
    kernel (decided once per call signature, variant signature and determinism setting by
    ``attention_backward``; base-pointer alignment is checked on every call there): the Hopper
    paths' switches (``FLASHATTN_LITE_HOPPER``, ``MIN_WORK``), this module's triton, and its rules.
    Measured (``gluon_bwd-20261124-131528.json``): the default (fused dQ) configs 1.15–1.43× the TMA
    pair and faster than the portable backward everywhere; the deterministic configs 1.08–1.24× the
    TMA pair, but at d 64 non-causal 0.95–0.96× the portable backward from 8k tokens, so
    ``deterministic`` d 64 non-causal calls keep the portable kernels. Under ``deterministic``,
    calls with softcap, ALiBi, a window, ranges or varlen pair this kernel's dK/dV with the
    portable dQ kernel (``_tma_dq_covers``). Window calls take it from ``MIN_WORK`` on, at
    any length (the TMA pair has no window): a 4k causal window at 32k runs forward+backward at 0.90×
    the full-causal rate on visited pairs (2026-11-24, H100; 0.66× on the portable backward).
    A varlen call's work is estimated from the mean sequence's keys (no sync to read the
    lengths)."""
    from . import attention_fwd_hopper as hopper
    if not _HAS_GLUON or not hopper.enabled() or not triton.__version__.startswith(TESTED_TRITON):
        return False
    if deterministic and kernel_head_dim(q.shape[3], v.shape[3]) == 64 and not causal:
        return False
    options = dict(causal=causal, causal_offset=causal_offset, scale=scale)
    if variant is not PLAIN:
        options["variant"] = variant
    if supported(q, k, v, do, **options) is not None:
        return False
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    if variant is not PLAIN and variant.seq == SEQ_VARLEN:  # the mean sequence's keys, not the total's
        Nk = cdiv(Nk, max(variant.seq_k.shape[0] - 1, 1))
    return B * Hq * Nq * Nk * D >= hopper.MIN_WORK


def _variant_reason(variant) -> str | None:
    """Why this kernel cannot express ``variant`` at all (in words), or None: it takes sliding
    windows, softcap, ALiBi and sinks over a dense batch, a padded batch with per-row ranges
    (``SEQ_RANGES``) or a packed varlen batch (``SEQ_VARLEN``) (None and ``PLAIN`` are plain). (The
    options' tensors, the window sides' range and the sequence bounds are checked by
    ``supported``.)"""
    if variant is None or variant is PLAIN:
        return None
    if not isinstance(variant, Variant):
        return f"variant is a {type(variant).__name__}, not a Variant"
    if variant.seq not in (SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN):
        return f"batch layout {variant.seq!r} (dense, ranges or varlen)"
    return None


def _seq_reason(q, k, variant) -> str | None:
    """Why the sequence bounds of a ranges or varlen ``variant`` are not what the kernel reads, or
    None: int32 tensors on q's device, (B, 2) ranges or (n + 1,) cu_seqlens with unit element steps
    inside (``seq_args``' views), at least one sequence."""
    for name, t in (("seq_q", variant.seq_q), ("seq_k", variant.seq_k)):
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.device == q.device):
            return f"{name} is not an int32 tensor on q's device"
        if variant.seq == SEQ_RANGES:
            if tuple(t.shape) != (q.shape[0], 2) or t.stride(1) != 1 or (q.shape[0] > 1 and t.stride(0) != 2):
                return f"{name} is not a (B, 2) ranges tensor with unit inner stride"
        elif t.dim() != 1 or t.shape[0] < 2 or t.stride(0) != 1 or q.shape[0] != 1:
            return f"{name} is not unit-stride (n + 1,) cu_seqlens of a packed (1, H, total, D) batch"
    if variant.seq_q.shape != variant.seq_k.shape:
        return "seq_q and seq_k describe different numbers of sequences"
    return None


def _row_descriptor(t: torch.Tensor, block_m: int) -> "TensorDescriptor":
    """lse₂ or δ, (B·Hq, padded Nq) float32, in [1, block_m] boxes: unswizzled (a single row)."""
    return tma_descriptor(t, [1, block_m], _row_layout())


@functools.lru_cache(maxsize=None)
def _row_layout():
    """The row descriptors' layout, built once (a Gluon layout costs ~10 µs of Python to build)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@launcher
@triton.jit(do_not_specialize=["n_q", "n_pad", "n_heads"])
def _row_stats_kernel(o, do, lse, dlse, delta_pad, lse2_pad, dq_acc,
                      stride_ob, stride_oh, stride_om, stride_od,
                      stride_dob, stride_doh, stride_dom, stride_dod,
                      n_heads, n_q, n_pad, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                      ACC_W: tl.constexpr = 0):
    """The portable preprocess's row statistics (``attention_bwd.row_stats_tile``) written the way the
    Gluon kernel reads them: δ and lse₂ in (B·Hq, n_pad) rows, the padding rows δ = 0 and lse₂ = +inf, and with
    ``ZERO_DQ`` the fp32 dQ buffer's rows zeroed in the same pass (before, a fill kernel, two fills
    and two copies: ~0.1 ms a call at B·N 16k), its HEAD_DIM columns a row; ``ACC_W`` > 0: the rows are
    that many floats, fewer than HEAD_DIM (a power of two; the one pass's 192, ``dq_buffer_width``)."""
    tile, bh = tile_and_slab(tl.cdiv(n_pad, BLOCK_M))
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d, l2, row, row_ok = row_stats_tile(o, do, lse, dlse, bh, n_heads, offs_m, stride_ob, stride_oh, stride_om,
                                        stride_od, stride_dob, stride_doh, stride_dom, stride_dod, n_q,
                                        HEAD_DIM_V, BLOCK_DV, HAS_DLSE)
    out = bh.to(tl.int64) * n_pad + offs_m
    tl.store(delta_pad + out, d)  # 0 on the padding rows (zero tiles)
    tl.store(lse2_pad + out, tl.where(row_ok, l2, float("inf")))
    if ZERO_DQ:  # dq_acc (B, Hq, Nq, ACC_W or HEAD_DIM) contiguous
        cols = tl.arange(0, HEAD_DIM)
        width: tl.constexpr = ACC_W if ACC_W > 0 else HEAD_DIM
        ok = row_ok[:, None]
        if ACC_W > 0:
            ok = ok & (cols[None, :] < ACC_W)
        tl.store(dq_acc + row[:, None] * width + cols[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), mask=ok)


def _buffer_block(width: int) -> tuple[int, dict]:
    """The fp32 dQ buffer's row of ``width`` floats as the row statistics' and the conversion's kernels
    take it: their power-of-two block (``HEAD_DIM``) and, where the row is shorter, ``ACC_W``."""
    block = triton.next_power_of_2(width)
    return block, (dict(ACC_W=width) if block != width else {})


def _row_stats(do, o, lse, dlse, n_pad: int, dq_acc: torch.Tensor | None = None):
    """δ = rowsum(dO ∘ O) − dlse and lse₂ = lse·log2 e (+inf where lse = −inf) as (B·Hq, n_pad)
    float32 rows padded with δ = 0 and lse₂ = +inf (P = 0 on the padding rows), in one pass that also
    zeroes ``dq_acc`` (the fused dQ's fp32 buffer, allocated empty). Also returns the unpadded
    (B, Hq, Nq) pair (views of the padded rows)."""
    B, Hq, Nq, Dv = o.shape
    lse = lse.contiguous()  # the forward's lse already is: (B, Hq, Nq) rows N apart
    if dlse is not None:
        dlse = dlse.float().contiguous()
    delta_pad = torch.empty((B * Hq, n_pad), device=o.device, dtype=torch.float32)
    lse2_pad = torch.empty((B * Hq, n_pad), device=o.device, dtype=torch.float32)
    block_m = 16 if interpreter_active() else 64
    block, acc_w = _buffer_block(dq_acc.shape[3]) if dq_acc is not None else (Dv, {})
    _row_stats_kernel[(n_pad // block_m * B * Hq,)](
        o, do, lse, dlse if dlse is not None else lse, delta_pad, lse2_pad, dq_acc, *o.stride(), *do.stride(),
        Hq, Nq, n_pad, HEAD_DIM=block, HEAD_DIM_V=Dv, HAS_DLSE=dlse is not None, ZERO_DQ=dq_acc is not None,
        BLOCK_M=block_m, BLOCK_DV=triton.next_power_of_2(Dv), **acc_w)  # (a head dim run padded is no power of 2)
    delta, lse2 = (t.view(B, Hq, n_pad)[:, :, :Nq] for t in (delta_pad, lse2_pad))
    return (delta_pad, lse2_pad), (delta, lse2)


def nondecreasing_bounds(variant: Variant, total_q: int, total_k: int) -> Variant:
    """A varlen call's cu_seqlens as ``seq_key_tile``'s binary search needs them: clamped into the
    tensors and made non-decreasing (a running max). Valid bounds pass unchanged; so do bad ones the
    kernels' per-sequence clamp reads as a valid batch (past the total, below 0), and a zero-padded
    tail ([0, 1000, 0, 0]: its empty sequences), whose going back made the search lose key tiles (no
    dK / dV for them). Bounds that still overlap after the clamp read as the running max's batch.
    Device ops only (no sync): the backward's host work already holds ``_aligned_rows``' dozen."""
    def fix(cu, total):
        return torch.cummax(cu.clamp(0, total), 0).values
    return variant._replace(seq_q=fix(variant.seq_q, total_q), seq_k=fix(variant.seq_k, total_k))


def _aligned_rows(delta: torch.Tensor, lse2: torch.Tensor, variant: Variant):
    """δ and lse₂ (B, Hq, Nq) of a ranges or varlen batch laid out so that every sequence's first
    query row sits at a 16-byte-aligned column, as the kernel's TMA boxes of a row need (a box whose
    inner start is not aligned is an illegal instruction on the H100; a sequence may start at any
    row). Returns (delta_pad, lse2_pad, row_starts):
    - ranges: (B·Hq, padded Nq), batch row b's query row q0_b + i at column i; row_starts None;
    - varlen: (Hq, padded), sequence b's row q0_b + i at column row_starts[b] + i, the starts the
      sums of the lengths rounded up to 4 (int32 on the device); the bounds as
      ``attention_backward_gluon`` passes them, through ``nondecreasing_bounds``.
    Columns holding no row of their sequence have δ = 0 and lse₂ = +inf (P = 0; the consumers mask
    rows past a sequence's end anyway). Device-side gathers only: no sync, nothing sized by data."""
    B, Hq, Nq = delta.shape
    dev = delta.device
    if variant.seq == SEQ_RANGES:
        q0, q1 = variant.seq_q[:, 0].long().clamp(0, Nq), variant.seq_q[:, 1].long()
        cols = torch.arange(_pad_rows(Nq), device=dev)
        src = cols + q0[:, None]                      # (B, padded)
        valid = (src < q1[:, None]).unsqueeze(1)      # (B, 1, padded)
        idx = src.clamp(max=Nq - 1).unsqueeze(1).expand(B, Hq, -1)
        row_starts = None
    else:
        cu = variant.seq_q.long()                     # non-decreasing (``nondecreasing_bounds``)
        lens = cu[1:] - cu[:-1]
        aligned = (lens + 3) // 4 * 4
        starts = torch.cumsum(aligned, 0) - aligned   # (n_seq,): each sequence's first column
        cols = torch.arange(_pad_rows(Nq + 3 * lens.shape[0]), device=dev)
        seq = (torch.searchsorted(starts, cols, right=True) - 1).clamp(min=0)  # the last of equal starts
        within = cols - starts[seq]
        valid = (within < lens[seq]).view(1, 1, -1)
        idx = (cu[seq] + within).clamp(0, Nq - 1).view(1, 1, -1).expand(B, Hq, -1)
        row_starts = starts.to(torch.int32)
    delta_pad = delta.gather(2, idx).masked_fill(~valid, 0.0).view(B * Hq, -1)
    lse2_pad = lse2.gather(2, idx).masked_fill(~valid, float("inf")).view(B * Hq, -1)
    return delta_pad, lse2_pad, row_starts


def shared_memory_bytes(head_dim: int, cfg: Config, itemsize: int = 2) -> int:
    """The kernel's shared memory, barriers aside (the offline compile's figure less ~0.5 KB): the K
    and V boxes, the ring of Q, dO, lse₂, δ slots and, with ``fused_dq``, the dS sets and one fp32
    dQ staging buffer per consumer. ``split_d``: the dK/dV kernel's (one K and one V box, the ring,
    the P and dS buffers, all at ``head_dim``; its dQ kernel takes less). Not counted there: the one
    pass's 32 KB of dQ staging (``attention_bwd_gluon_wide.one_pass`` takes it only where V runs at
    most 128 wide, whose narrower V and dO boxes make the room)."""
    m, d, c = cfg.block_m, head_dim, cfg.consumers
    if cfg.mla:  # q and k at 192 columns, v and dO at 128, both consumers' dS halves, a staging buffer each
        qk, dv = MLA_QK, MLA_V
        return (c * 64 * (qk + dv) * itemsize + cfg.stages * (m * (qk + dv) * itemsize + 2 * m * 4)
                + cfg.ds_bufs * c * m * 64 * itemsize + c * m * DQ_COLS * 4)
    if cfg.split_d:
        return 2 * 64 * d * itemsize + cfg.stages * (2 * m * d * itemsize + 2 * m * 4) + 2 * m * 64 * itemsize
    total = 2 * c * 64 * d * itemsize + cfg.stages * (2 * m * d * itemsize + 2 * m * 4)
    if cfg.fused_dq:
        total += cfg.ds_bufs * c * m * 64 * itemsize + c * m * DQ_COLS * 4
    return total


SMEM_LIMIT = 227 * 1024  # shared memory a block may opt into on sm_90
SMEM_SLACK = 1024  # barriers and alignment on top of shared_memory_bytes


def config_reason(head_dim: int, cfg: Config, itemsize: int = 2) -> str | None:
    """Why the kernel cannot run ``cfg`` at ``head_dim``, or None: two consumer warpgroups, 64-row
    query tiles, 1 or 2 dS sets, and the shared memory within sm_90's limit."""
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim} (only {HEAD_DIMS})"
    if cfg.consumers != 2 or cfg.block_m != 64:
        return f"config {cfg.name}: the kernel takes two consumers of 64 keys and 64-row query tiles"
    if cfg.split_d != (head_dim == 256) or (cfg.split_d and cfg.ds_bufs != 1 and not cfg.mla):
        return (f"config {cfg.name} at head dim {head_dim}: head dim 256 takes the split-head-dim configs "
                "(one dS set; the MLA 128-key programs' two), and only it")
    if cfg.mla and not (cfg.split_d and cfg.fused_dq and cfg.ds_bufs == DS_BUFS_MLA):
        return (f"config {cfg.name}: the MLA 128-key programs run at head dim 256 (split_d) with dQ fused and "
                f"{DS_BUFS_MLA} dS sets")
    if cfg.stages < 1 or cfg.ds_bufs not in (1, 2):
        return f"config {cfg.name}: stages ≥ 1 and 1 or 2 dS sets"
    need = shared_memory_bytes(head_dim, cfg, itemsize) + SMEM_SLACK
    if need > SMEM_LIMIT:
        return f"config {cfg.name} at head dim {head_dim} needs {need} B of shared memory (limit {SMEM_LIMIT})"
    return None


# A causal key tile's steps fall linearly from the first tile's to the last's, so in the head-major
# order the last heads' heaviest tiles start late and run alone. Bands of NARROW_BAND tiles (each
# banded head's heaviest first) cut that tail, but spread the programs running at once over more
# heads, so fewer share a head's Q, dO and dQ rows in L2: with every head banded, measured (H200,
# ``bwd_band-20261129-030431.json``) 3–22% slower than the model's schedule says. So only the last
# heads are banded, as many as the model (``_modelled_end``) finds best with BAND_COST a banded
# program: the tail goes, the rest of the launch keeps its L2 reuse. Programs walking a GQA group
# are the exception: there every head banded measured best (the last heads only: GQA 4, 8k, 1.5–3%
# slower, ``gluon_checkout-20261129-0424.json``).
NARROW_BAND = 2
BAND_COST = 0.10  # a launch's time grows by BAND_COST × the fraction of its programs that are banded
BAND_GAIN = 1.08  # a launch walking GQA groups is banded whole where the model gains this
PROGRAM_STEPS = 2.3  # a program's fixed cost (K/V load, epilogue) in steps (fit of 2k and 16k, NOTES)


def _modelled_end(n_key_tiles: int, n_heads: int, group: int, band: int, sms: int, banded_heads: int = -1) -> float:
    """When a dense causal launch ends, in steps, if each SM takes the next program as it frees (a
    list schedule in launch order; the programs as ``banded_key_tile`` orders them, ``banded_heads``
    of them banded, −1 all; each costing its steps — GQA group × visible 64-row query tiles — plus
    PROGRAM_STEPS)."""
    banded = n_heads if banded_heads < 0 else banded_heads
    ends = [0.0] * sms

    def run(t):
        heapq.heapreplace(ends, ends[0] + PROGRAM_STEPS + group * 2 * (n_key_tiles - t))
    for _ in range(n_heads - banded):
        for t in range(n_key_tiles):
            run(t)
    for first in range(0, n_key_tiles, band):
        for _ in range(banded):
            for t in range(first, min(first + band, n_key_tiles)):
                run(t)
    return max(ends)


@functools.lru_cache(maxsize=256)
def launch_order(n_key_tiles: int, n_heads: int, group: int, sms: int = 132) -> tuple[int, int]:
    """(band, banded heads) of a dense causal launch (``banded_key_tile``) of ``n_heads`` (batch, KV
    head) pairs with ``group`` query heads each on ``sms`` SMs. One query head a program (MHA, a
    split group): of no banded heads, about one, two or four waves of banded programs, and every
    head, the one the model ends soonest with BAND_COST. A group walked: every head or none."""
    if n_key_tiles * n_heads > 32 * sms:  # a heaviest program under 1/16 of an SM's share: no tail to cut
        return n_key_tiles, 0
    if group > 1:  # programs walking a group: every head banded where that cuts BAND_GAIN (measured best)
        narrow = _modelled_end(n_key_tiles, n_heads, group, NARROW_BAND, sms)
        if _modelled_end(n_key_tiles, n_heads, group, n_key_tiles, sms) >= BAND_GAIN * narrow:
            return NARROW_BAND, n_heads
        return n_key_tiles, 0
    wave = -(-sms // n_key_tiles)  # heads a wave of programs holds
    best, choice = None, 0
    for banded in sorted({0, n_heads} | {min(n_heads, k * wave) for k in (1, 2, 4)}):
        end = _modelled_end(n_key_tiles, n_heads, group, NARROW_BAND, sms, banded) * (1 + BAND_COST * banded / n_heads)
        if best is None or end < best:
            best, choice = end, banded
    return NARROW_BAND, choice


def _triangular(causal: bool, variant) -> bool:
    """Whether a launch's key tiles cost what ``launch_order``'s model says: a dense causal batch
    without a window's left side (with one, every tile sees about the window's rows)."""
    return causal and (variant is None or (variant.seq == SEQ_DENSE and not window_flags(variant, causal)[0]))


# Keys from which a GQA causal launch is split (``split_min_keys``). Measured (H200): at 8k and 16k
# keys the split is 1–12% faster than walking the group (GQA 4 and 8, d 64 and 128; bwd tables of
# 2026-11-29 04:35–04:55 against those of 03:08–03:10); at 4k 0–11% (graph-replayed,
# ``gqa_split-20261129-063900.json``); at 2k 2–5% slower (a 2k program runs ~8 steps, and the split
# adds fixed costs: twice the epilogue's bytes as float32 reduce-adds, the sums zeroed and
# converted) but where the group's rows are wide, group × d ≥ 1024 (GQA 8 d 128: +10%), whose walk
# costs the most per step.
SPLIT_MIN_KEYS = 4096
SPLIT_MIN_KEYS_WIDE = 2048  # group × d ≥ 1024


def split_min_keys(group: int, head_dim: int) -> int:
    """Keys from which a causal GQA launch of this group and head dim is split over query heads."""
    return SPLIT_MIN_KEYS_WIDE if group * head_dim >= 1024 else SPLIT_MIN_KEYS


def group_split(q, k, causal: bool, variant, cfg: Config) -> int:
    """KV_SHARE of a launch: the GQA group where its programs take one query head each (their dK,
    dV reduce-added in float32 into the KV head's sums, as FlashAttention-3 does), else 1 (a program
    walks the group). Dense plain causal calls with a group, ``split_min_keys`` keys or more and the
    fused dQ (whose staging buffer the sums go through; the float32 adds land in any order, so not
    in deterministic mode): walking the group, a program's step cost grew with it (GQA 8, d 128,
    16k: +15% against MHA; L2 traffic of the group's Q, dO and dQ rows)."""
    plain = variant is None or variant is PLAIN
    group = q.shape[1] // k.shape[1]
    split = (causal and plain and cfg.fused_dq and not cfg.split_d and group > 1
             and k.shape[2] >= split_min_keys(group, q.shape[3]))
    return group if split else 1


# A varlen batch whose sequences hold this many keys on average takes its key-tile slots one KV head
# after another (``varlen_slot``): the programs running at once share one KV head's Q and dO in L2,
# 1–5% faster from 8k (2 × 16k, 4 × 8k, GQA and MHA, causal and not); shorter ones every KV head of
# a slot together, as before, where one KV head at a time measured 6% slower (8 × 4k GQA 32/8,
# causal: each (sequence, head)'s dQ rows take the adds of more programs at once) and level at MHA
# (NOTES 2026-12-02 18:25, ``benchmarks/varlen_heads.py``, d 128; the d 256 kernels take the same rule
# unmeasured). The mean, known without a sync: one long sequence among many short ones stays heads
# fastest.
VARLEN_HEAD_MAJOR_FROM = 8192


def launch_plan(q, k, cfg: Config, causal: bool, variant: Variant = PLAIN, kv_share: int = 1,
                value_dim: int | None = None) -> dict:
    """What the kernel launch is given, without launching (the CPU tests check it): the grid (one
    program per key tile of each (batch, KV head)), the constexprs (the option flags as the
    portable kernels set them, ``score_args``; all off for a plain call or sinks only), the padded
    lse₂/δ rows and the fp32 dQ buffer's shape (None without ``fused_dq``), and the launch order
    (band, banded heads) (``launch_order``; the head-major order, (a head's tile count, 0), for every
    launch but a dense causal one without a window's left side). ``value_dim``: v's head dim, if not q's."""
    B, Hq, Nq, D_real = q.shape
    D = kernel_head_dim(D_real, value_dim)
    Hkv, Nk = k.shape[1] * kv_share, k.shape[2]
    seq = SEQ_DENSE if variant is None else variant.seq
    if seq == SEQ_VARLEN:  # slots from the totals (``seq_key_tile``): no device→host sync
        grid = ((cdiv(Nk, cfg.block_n) + variant.seq_k.shape[0] - 1) * Hkv,)
    else:
        grid = (cdiv(Nk, cfg.block_n) * B * Hkv,)
    seq_ce = dict(SEQ=seq) if seq != SEQ_DENSE else {}
    if seq == SEQ_VARLEN and Nk < VARLEN_HEAD_MAJOR_FROM * (variant.seq_k.shape[0] - 1):
        seq_ce["HEADS_FASTEST"] = True  # (``varlen_slot``) short sequences
    if seq != SEQ_DENSE and D != D_real:  # the masked stores at a sequence's end keep to dk's, dv's columns
        seq_ce["D_REAL"] = D_real
    if seq != SEQ_DENSE and value_dim not in (None, D_real):  # and dv's to its own
        seq_ce["DV_REAL"] = value_dim
    if kv_share > 1:
        seq_ce["KV_SHARE"] = kv_share
    qk = qk_width(D_real)
    if qk < D:  # Sᵀ over q's own columns where v's wider ones set the kernel's (64 / 128)
        seq_ce["QK"] = qk
    return dict(
        grid=grid,
        order=(launch_order(cdiv(Nk, cfg.block_n), B * Hkv, Hq // Hkv, gpu_sm_count(q.device))
               if _triangular(causal, variant) else (cdiv(Nk, cfg.block_n), 0)),
        constexprs=dict(HEAD_DIM=D, CAUSAL=bool(causal), **_option_args(variant, q, 1.0, causal)[1], **seq_ce,
                        GROUP=Hq // Hkv,
                        CONSUMERS=cfg.consumers, BLOCK_M=cfg.block_m, STAGES=cfg.stages, FUSED_DQ=bool(cfg.fused_dq),
                        DS_BUFS=cfg.ds_bufs if cfg.fused_dq else 1, CONSUMER_REGS=cfg.consumer_regs,
                        LOADER_REGS=LOADER_REGS, DEFER_DQ=defers_dq(D, cfg, causal, variant)),
        row_stats_shape=(B * Hq, _pad_rows(Nq + 3 * (variant.seq_q.shape[0] - 1) if seq == SEQ_VARLEN else Nq)),
        dq_acc_shape=(B, Hq, Nq, dq_buffer_width(D_real, D)) if cfg.fused_dq else None,
    )


_PLAIN_ARGS = (None,) * 7
_PLAIN_FLAGS = dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, ALIBI=False, FAST_TANH=False)


def _option_args(variant, q: torch.Tensor, scale: float, causal: bool = False):
    """(win_left, win_right, alibi, stride_alibi_b, stride_alibi_h, softcap_scale, softcap2) and the
    option flags of a launch, as the portable kernels take them (``score_args``; the window as the
    Gluon forward's ``window_flags`` says: causal is the right side at 0, a causal call without a
    left side the plain causal kernel). What a call does not use is None: the launch drops it (a
    None argument is a constexpr), so a plain call, or one with sinks only (the kernel has nothing
    to do for them), compiles to the kernel it compiled to before the options existed, parameter
    list included, and a call without a window to the one before windows."""
    if _is_plain(variant, causal):
        return _PLAIN_ARGS, _PLAIN_FLAGS
    _, alibi_strides, softcap_scalars, constexprs = score_args(variant, q, scale)
    flags = {name: constexprs[name] for name in _PLAIN_FLAGS}
    flags["HAS_LEFT"], flags["HAS_RIGHT"] = window_flags(variant, causal)
    args = (variant.left if flags["HAS_LEFT"] else None, variant.right if flags["HAS_RIGHT"] else None,
            variant.alibi, *(alibi_strides if flags["ALIBI"] else (None, None)),
            *(softcap_scalars if flags["SOFTCAP"] else (None, None)))
    return args, flags


def _tma_dq_covers(variant, causal: bool, head_dim: int = 128, value_dim: int | None = None) -> bool:
    """Whether the Triton TMA dQ kernel (the one-writer configs' dQ at d 64 and 128) computes this
    call's dq: plain scores over a dense batch (sinks and a causal call's window without a left side,
    the diagonal, leave them plain) at a head dim it has tiles for. Softcap, ALiBi, other windows,
    ranges and varlen batches, head dims run padded (``kernel_head_dim``) and v's head dim other than
    q's (``value_dim``) take the portable dQ kernel (``attention_bwd.attention_dq``), one writer per
    element too."""
    if kernel_head_dim(head_dim) != head_dim or value_dim not in (None, head_dim):
        return False
    return variant is None or variant is PLAIN or _is_plain(variant._replace(sinks=None), causal)


def _launch(q, k, v, do, dq, dk, dv, lse2_pad, delta_pad, scale: float, causal: bool, cfg: Config,
            variant: Variant = PLAIN, dq_acc: torch.Tensor | None = None, row_starts: torch.Tensor | None = None,
            kv_share: int = 1):
    """(grid, args, keyword args) of the kernel launch (``attention_backward_gluon``'s; the PTX
    hashes, ``benchmarks/ptx_hashes.py``, compile from it without a GPU). ``dq_acc``: the fp32 dQ
    buffer with ``fused_dq``; else ``dq`` stands in for it (the kernel does not touch it).
    ``row_starts``: a varlen batch's lse₂/δ column of each sequence (``_aligned_rows``)."""
    B, Hq, Nq, _ = q.shape
    D = kernel_head_dim(q.shape[3], v.shape[3])  # the TMA boxes' width: past the columns they read zeros
    Hkv, Nk = k.shape[1] * kv_share, k.shape[2]
    plan = launch_plan(q, k, cfg, causal, variant, kv_share, v.shape[3])
    (win_left, win_right, *options), _ = _option_args(variant, q, scale, causal)
    seq_options = (None,) * 15  # a dense batch: none (constexprs), its launch as before
    if variant is not None and variant.seq != SEQ_DENSE:
        *bounds, stride_seq, n_seq = seq_args(variant, q)
        strides = [(0 if variant.seq == SEQ_VARLEN else t.stride(0), t.stride(1), t.stride(2)) for t in (dk, dv)]
        seq_options = (*bounds, stride_seq, n_seq, dk, dv, *strides[0], *strides[1],
                       row_starts if variant.seq == SEQ_VARLEN else None)
    m, box = cfg.block_m, [1, 1, 64, D]
    dq_desc = tma_descriptor(dq_acc, [1, 1, m, DQ_COLS]) if cfg.fused_dq else tma_descriptor(dq, [1, 1, m, D])
    args = (tma_descriptor(q, [1, 1, m, D]), tma_descriptor(k, box), tma_descriptor(v, box),
            tma_descriptor(do, [1, 1, m, D]), _row_descriptor(lse2_pad, m), _row_descriptor(delta_pad, m), dq_desc,
            *((tma_descriptor(dk, [1, 1, 64, DQ_COLS]), tma_descriptor(dv, [1, 1, 64, DQ_COLS])) if kv_share > 1
              else (tma_descriptor(dk, box), tma_descriptor(dv, box))),
            Hq, Hkv, Nq, Nk, *plan["order"], win_left, win_right, scale * LOG2E, scale, *options, *seq_options)
    return plan["grid"], args, dict(**plan["constexprs"], num_warps=4)


def writes_grads_into(out: tuple, q, k, v, causal: bool, variant: Variant | None = None) -> bool:
    """Whether ``attention_backward_gluon`` at its default config writes (dq, dk, dv) into ``out``
    (``_takes_out``)."""
    D = kernel_head_dim(q.shape[3], v.shape[3]) or q.shape[3]
    cfg = default_config(D, causal, max(q.shape[2], k.shape[2]), torch.are_deterministic_algorithms_enabled(),
                         v.shape[3], variant, qk_dim=q.shape[3])
    return _takes_out(out, q, k, v, cfg, variant)


def _takes_out(out: tuple, q, k, v, cfg: Config, variant: Variant | None) -> bool:
    """A dense batch, a config that fuses dQ (whose launches write views of a chunked call's
    gradients: ``dq_buffer_chunks``), and (dq, dk, dv) of q's, k's, v's shapes and dtype on their
    device that TMA descriptors can store into (``attention_fwd_hopper.storable_like``)."""
    if not cfg.fused_dq or (variant is not None and variant.seq != SEQ_DENSE):
        return False
    return all(storable_like(t, like) for t, like in zip(out, (q, k, v)))


def attention_backward_gluon(do, q, k, v, o, lse, *, scale: float, causal: bool, config: Config | None = None,
                             dlse: torch.Tensor | None = None, variant: Variant | None = None,
                             out: tuple | None = None):
    """(dq, dk, dv) of o = softmax(scale·q·kᵀ [causal, bottom-right, a window]) · v, given the
    forward's o and natural-log lse (B, Hq, Nq) float32 (−inf on rows with no visible key).

    The same result as ``attention_backward_hopper`` (and the portable ``attention_backward`` with
    causal_offset Nk − Nq): ``empty_like`` of q, k, v in their dtype, dk/dv summed over each GQA
    group. Call only where ``supported`` returned None (an sm_90 GPU; Gluon does not run in the
    interpreter). ``config``: one of ``CONFIGS`` (default: ``default_config``); ``dlse``: the lse's
    own gradient (B, Hq, Nq), or None. ``variant``: None, or a Variant as ``attention_backward``
    takes it (a sliding window, softcap, ALiBi slopes, sinks; a dense batch, a padded one with
    per-row ranges, zeros outside them, or a packed varlen one as (1, H, total, D) views, lse
    (1, Hq, total); ``causal`` caps the window's right side at 0, per sequence under ranges and
    varlen), the lse the forward saved with it (sinks included); then the
    portable backward's four gradients come back, (dq, dk, dv, dsinks), dsinks (Hq,) in the sinks'
    dtype or None. Query tiles that see no key of a key tile are never loaded (``query_tiles``):
    a window of W keys costs O(N·W). A config without ``fused_dq`` takes dq from a dQ kernel, one
    writer per element (``_tma_dq_covers``). A dense call whose fused dQ buffer (float32, twice q's bytes
    in 16 bits) would pass ``DQ_BUFFER_BYTES`` runs in launches over chunks of rows and KV heads
    (``dq_buffer_chunks``; a varlen batch, one row, over KV heads). ``out``: (dq, dk, dv) to write
    and return, views such as rows of larger gradients (ring attention's sums): ValueError where
    ``_takes_out`` refuses them with this config (``writes_grads_into`` asks first, at the default
    one). A config or variant the kernel does not take raises ValueError before anything runs."""
    reason = _variant_reason(variant)
    if reason is not None:
        raise ValueError(f"attention_backward_gluon: variant: {reason}")
    B, Hq, Nq, _ = q.shape
    D = kernel_head_dim(q.shape[3], v.shape[3]) or q.shape[3]  # a head dim run padded: the kernel's (``config_reason``)
    Hkv, Nk = k.shape[1], k.shape[2]
    deterministic = torch.are_deterministic_algorithms_enabled()
    cfg = config or default_config(D, causal, max(Nq, Nk), deterministic, v.shape[3], variant,
                                    qk_dim=q.shape[3])
    if deterministic and cfg.fused_dq:  # as torch does for an op without a deterministic version
        message = (f"attention_backward_gluon: config {cfg.name} adds dq by fp32 reduce-adds in any order, "
                   "which torch.use_deterministic_algorithms(True) forbids; pass a config with fused_dq=False")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError(message)
        warnings.warn(message)
    reason = config_reason(D, cfg, q.element_size())
    if reason is not None:
        raise ValueError(f"attention_backward_gluon: {reason}")
    if cfg.split_d and cfg.fused_dq:
        from .attention_bwd_gluon_wide import one_pass
        if not one_pass(v.shape[3], variant, causal):  # (its dQ staging fits beside V only up to 128)
            why = ("it is not causal" if not causal else f"v's head dim {v.shape[3]} pads above 128"
                   if wide_value_width(v.shape[3]) > 128 else "it has options (softcap, ALiBi, sinks, a window) "
                   "or a ranges or varlen batch")
            raise ValueError(f"attention_backward_gluon: config {cfg.name} (the head dim 256 one pass, dQ fused) "
                             "takes plain causal calls over dense batches whose v's head dim pads to at most 128, "
                             f"and {why}: pass config=WIDE_TWO_KERNELS (the dK/dV and dQ kernels) or None")
    if cfg.mla:
        from .attention_bwd_gluon_wide import takes_mla_programs
        if not takes_mla_programs(q.shape[3], v.shape[3], variant, causal):
            raise ValueError(f"attention_backward_gluon: config {cfg.name} (128-key programs) takes the one pass's "
                             f"calls at q, k {MLA_QK} and v {MLA_V} only; got {q.shape[3]} / {v.shape[3]}: pass "
                             "config=WIDE_ONE_PASS or None")
    if out is not None and not _takes_out(out, q, k, v, cfg, variant):
        raise ValueError("attention_backward_gluon: out must be (dq, dk, dv) of q's, k's, v's shapes and dtype that "
                         "TMA can store into (16-byte aligned base and strides, unit last stride, no broadcast dim), "
                         "for a dense batch and a config that fuses dQ")
    if variant is not None and variant.seq == SEQ_VARLEN:  # once a call, not a chunk
        variant = nondecreasing_bounds(variant, Nq, k.shape[2])
    chunks = (dq_buffer_chunks(B, Hq, Hkv, Nq, dq_buffer_width(q.shape[3], D)) if cfg.fused_dq
              else [(slice(None), slice(None))])
    if len(chunks) == 1:
        return _backward(do, q, k, v, o, lse, dlse, scale, causal, cfg, variant, out=out)
    # Long calls in chunks of (batch rows, KV heads), each with its own fp32 dQ buffer, into one
    # set of gradients: the buffer (twice q's bytes whole) stays within DQ_BUFFER_BYTES. A varlen
    # batch (B = 1) splits its heads only; a ranges batch takes its rows' ranges, and its dk, dv
    # start at 0 (rows outside every range are no program's).
    ranges = variant is not None and variant.seq == SEQ_RANGES
    alloc = torch.zeros_like if ranges else torch.empty_like
    dq, dk, dv = (torch.empty_like(q), alloc(k), alloc(v)) if out is None else out
    sinks = None if variant is None else variant.sinks
    dsinks = None if sinks is None else torch.zeros(Hq, device=q.device, dtype=torch.float32)
    group = Hq // Hkv
    for rows, kv_heads in chunks:
        heads = slice(kv_heads.start * group, kv_heads.stop * group)
        part = None
        if variant is not None:  # the chunk's slopes and sinks (float32: dsinks sums over chunks)
            alibi = variant.alibi
            alibi = None if alibi is None else alibi[heads] if alibi.dim() == 1 else alibi[rows, heads]
            part = variant._replace(alibi=alibi, sinks=None if sinks is None else sinks[heads].float())
            if ranges:
                part = part._replace(seq_q=variant.seq_q[rows], seq_k=variant.seq_k[rows])
        grads = _backward(do[rows, heads], q[rows, heads], k[rows, kv_heads], v[rows, kv_heads], o[rows, heads],
                          lse[rows, heads].contiguous(), None if dlse is None else dlse[rows, heads], scale, causal,
                          cfg, part, out=(dq[rows, heads], dk[rows, kv_heads], dv[rows, kv_heads]))
        if dsinks is not None:
            dsinks[heads] += grads[3]
    if variant is None:
        return dq, dk, dv
    return dq, dk, dv, None if dsinks is None else dsinks.to(sinks.dtype)


DQ_BUFFER_BYTES = 256 * 2 ** 20  # the fused dQ's fp32 buffer of one launch, at most (but for one head's)


def dq_buffer_width(head_dim: int, kernel_width: int) -> int:
    """The fp32 dQ buffer's columns: the ones the kernels reduce-add, q's ``qk_width`` within the
    kernel's width (``kernel_head_dim``): at d ≤ 128 the consumers' dQ columns stop at q's (64 of
    128 at 64 / 128: ``DQ_HERE``), the head dim 256 one pass's at q's too (192 at MLA)."""
    return min(kernel_width, qk_width(head_dim))


def dq_buffer_chunks(B: int, Hq: int, Hkv: int, Nq: int, D: int) -> list[tuple[slice, slice]]:
    """(batch rows, KV heads) of each launch of a backward with the fused dQ, so that its fp32
    dQ buffer (rows · heads · Nq · D · 4 bytes) stays within DQ_BUFFER_BYTES: one launch where the
    whole buffer fits; else as many KV heads (each with its query heads) of all rows as fit, or,
    where one KV head of all rows does not fit, as many rows as fit of one KV head at a time (at
    least one). The buffer is then a small part of the call's memory, as the leanest SDPA
    backends keep it, while a launch still has ≥ Nq / 64 key tiles of work per head."""
    head_bytes = (Hq // Hkv) * Nq * D * 4  # one KV head's query heads, one batch row
    if B * Hkv * head_bytes <= DQ_BUFFER_BYTES:
        return [(slice(None), slice(None))]
    if B * head_bytes <= DQ_BUFFER_BYTES:
        step = DQ_BUFFER_BYTES // (B * head_bytes)
        return [(slice(None), slice(h, min(h + step, Hkv))) for h in range(0, Hkv, step)]
    step = max(1, DQ_BUFFER_BYTES // head_bytes)
    return [(slice(b, min(b + step, B)), slice(h, h + 1)) for h in range(Hkv) for b in range(0, B, step)]


def _backward(do, q, k, v, o, lse, dlse, scale: float, causal: bool, cfg: Config, variant: Variant | None,
              out: tuple | None = None):
    """``attention_backward_gluon``'s work for one launch, checks done; ``out``: (dq, dk, dv) to
    write (views of a chunked call's gradients), else new tensors."""
    B, Hq, Nq, _ = q.shape
    dq_w = dq_buffer_width(q.shape[3], kernel_head_dim(q.shape[3], v.shape[3]))  # converted to q's below
    row_starts = None
    if variant is not None and variant.seq != SEQ_DENSE:
        from .attention_bwd import row_stats
        delta, lse2 = row_stats(do, o, lse, dlse)
        delta_pad, lse2_pad, row_starts = _aligned_rows(delta, lse2, variant)
        dq_acc = torch.zeros((B, Hq, Nq, dq_w), device=q.device, dtype=torch.float32) if cfg.fused_dq else None
    else:  # a dense batch: the dQ buffer zeroed by the row statistics' pass
        dq_acc = torch.empty((B, Hq, Nq, dq_w), device=q.device, dtype=torch.float32) if cfg.fused_dq else None
        (delta_pad, lse2_pad), (delta, lse2) = _row_stats(do, o, lse, dlse, _pad_rows(Nq), dq_acc)
    # Rows outside every range of a padded batch are no program's: their gradients are 0 (the
    # fp32 dQ buffer starts at 0 anyway).
    if out is not None:
        dq, dk, dv = out
    else:
        alloc = torch.zeros_like if variant is not None and variant.seq == SEQ_RANGES else torch.empty_like
        dk, dv = alloc(k), alloc(v)
        dq = None if cfg.fused_dq else alloc(q)
    share = group_split(q, k, causal, variant, cfg)
    dk_out, dv_out = dk, dv  # what the kernel writes: float32 sums over the group where it is split
    if share > 1:
        dk_out = torch.zeros(k.shape, device=k.device, dtype=torch.float32)
        dv_out = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
    if cfg.split_d:  # head dim 256: its dK/dV and dQ kernels (with ``fused_dq``, the dK/dV one alone)
        from .attention_bwd_gluon_wide import run
        run(q, k, v, do, dq, dk, dv, lse2_pad, delta_pad, scale, causal, cfg, PLAIN if variant is None else variant,
            row_starts, dq_acc)
        spread = False  # (the wide kernels stage dQ in plain order)
    else:
        grid, args, kwargs = _launch(q, k, v, do, dq, dk_out, dv_out, lse2_pad, delta_pad, scale, causal, cfg,
                                     PLAIN if variant is None else variant, dq_acc, row_starts, share)
        _attn_bwd_gluon_launcher[grid](*args, **kwargs)
        spread = kwargs["DEFER_DQ"]  # dQ staged in ``_spread_banks``' order
    if share > 1:  # the group's float32 sums, rounded once
        dk.copy_(dk_out)
        dv.copy_(dv_out)

    if cfg.fused_dq:
        dq = _dq_from_buffer(dq_acc, q, spread, dq)
    elif not cfg.split_d:  # a one-writer dQ kernel: the TMA one where it reaches, else the portable one
        lse2, delta = lse2.contiguous(), delta.contiguous()
        if _tma_dq_covers(variant, causal, q.shape[3], v.shape[3]):
            _triton_dq(do, q, k, v, dq, lse2, delta, scale, causal)
        else:
            from .attention_bwd import attention_dq
            attention_dq(do, q, k, v, dq, lse2, delta, scale=scale, causal=causal,
                         variant=PLAIN if variant is None else variant)  # (a plain call at a padded head dim)
    if variant is None:
        return dq, dk, dv
    dsinks = None
    if variant.sinks is not None:
        from .attention_bwd import sinks_grad
        dsinks = sinks_grad(variant.sinks, lse, delta)
    return dq, dk, dv, dsinks


@launcher
@triton.jit(do_not_specialize=["n_heads", "n_q"])
def _dq_convert_kernel(acc, dq, n_heads, n_q, stride_b, stride_h, stride_n, HEAD_DIM: tl.constexpr,
                       SPREAD: tl.constexpr, BLOCK_R: tl.constexpr, D_REAL: tl.constexpr = 0, ACC_W: tl.constexpr = 0):
    """BLOCK_R dq rows of one head (q's strides and dtype; grid: cdiv(Nq, BLOCK_R) tiles of each of
    the B·Hq heads, ``tile_and_slab``) from the fp32 buffer's (B, Hq, Nq, HEAD_DIM) contiguous rows,
    the chunk order of ``_spread_banks`` undone where ``SPREAD``: in each 32-column span, buffer
    chunk 4b + a (16 bytes) is dq chunk 2a + b. ``D_REAL`` > 0: dq has only that many columns (a
    head dim run padded), the buffer's others are dropped. ``ACC_W`` > 0: the buffer's rows are that
    many columns (the one pass's 192, ``dq_buffer_width``), fewer than HEAD_DIM (a power of two)."""
    tile, bh = tile_and_slab(tl.cdiv(n_q, BLOCK_R))
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows[:, None] < n_q
    width: tl.constexpr = ACC_W if ACC_W > 0 else HEAD_DIM
    in_row = ok
    if ACC_W > 0:
        in_row = ok & (cols[None, :] < ACC_W)
    x = tl.load(acc + (bh.to(tl.int64) * n_q + rows[:, None]) * width + cols[None, :], mask=in_row)
    if SPREAD:  # (span, b, a, 4 floats) -> (span, a, b, 4 floats)
        x = tl.permute(tl.reshape(x, [BLOCK_R, HEAD_DIM // 32, 2, 4, 4]), [0, 1, 3, 2, 4])
        x = tl.reshape(x, [BLOCK_R, HEAD_DIM])
    base = head_base(dq, bh // n_heads, bh % n_heads, stride_b, stride_h)
    if D_REAL > 0:
        ok = ok & (cols[None, :] < D_REAL)
    tl.store(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :], x.to(dq.dtype.element_ty), mask=ok)


def _dq_from_buffer(dq_acc: torch.Tensor, q: torch.Tensor, spread: bool, dq: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """dq as the portable backward returns it (``empty_like(q)``: q's strides and dtype; or into
    ``dq``, any strides) from the dense fp32 buffer the kernel reduce-added into (already times
    scale), staged in ``_spread_banks``' order where ``spread`` (``defers_dq``). One pass: a
    strided torch copy that undid the order took 0.101 ms against the plain copy's 0.069 at
    16k × 16 heads × 128 (H100)."""
    dq = torch.empty_like(q) if dq is None else dq
    B, Hq, Nq, W = dq_acc.shape
    D, acc_w = _buffer_block(W)  # (the one pass's 192-column buffer: ``dq_buffer_width``)
    block_r = 8192 // D
    padded = dict(D_REAL=dq.shape[3]) if dq.shape[3] != D else {}  # a head dim run padded: its own columns
    _dq_convert_kernel[(cdiv(Nq, block_r) * B * Hq,)](dq_acc, dq, Hq, Nq, *dq.stride()[:3], HEAD_DIM=D,
                                                      SPREAD=spread, BLOCK_R=block_r, **padded, **acc_w)
    return dq


def _triton_dq(do, q, k, v, dq, lse2, delta, scale, causal):
    """dq by the Triton TMA backward's dQ kernel at its default config (the non-fused configs)."""
    from . import attention_bwd_hopper as hop
    D, n = q.shape[3], max(q.shape[2], k.shape[2])
    hop.dq_into(dq, do, q, k, v, lse2, delta, scale, causal, hop.default_config(D, causal, n).dq)
