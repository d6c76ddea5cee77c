"""Attention forward for Hopper (sm_90) in Gluon: an FA3-style warp-specialized schedule.

Same contract as ``attention_forward_hopper`` (ops/attention_fwd_hopper.py): causal (bottom-right
aligned) or not, GQA, fp16/bf16, D ∈ {64, 128, 256}, and the score options of a dense batch in
``variant``: a sliding window, softcap, ALiBi slopes, attention sinks; o (B, Hq, Nq, D) contiguous
in q's dtype, lse (B, Hq, Nq) float32 natural log (the sink term included), a row with no visible
key o = 0 and lse = −inf (the sink's logit, with sinks).

Where the Triton kernel leaves the schedule to the compiler, here it is written out (Gluon is
Triton's tile-level language with explicit layouts, shared memory, barriers and partitions):

* One program = one query tile of ``64 · CONSUMERS`` rows of one (batch, head). Its warps are split
  by ``gl.warp_specialize`` into a **loader** (1 warp, few registers) and ``CONSUMERS`` **consumer
  warpgroups** (4 warps, 64 query rows each, many registers: setmaxnreg through ``worker_num_regs``).
* The loader issues every TMA copy: the consumers' Q rows once, then K_j and V_j into a ring of
  ``STAGES`` shared-memory slots. Each slot has three mbarriers: ``k_ready``/``v_ready`` (TMA
  transaction counts: K and V are awaited separately so QKᵀ starts before V lands) and ``empty``
  (one arrival per consumer when its last wgmma reading the slot has retired).
* Each consumer runs asynchronous wgmma with FA3's intra-warpgroup overlap: in iteration j it issues
  S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} back to back, waits for S_j only (wgmma groups retire in
  order), and computes the softmax of S_j while the tensor cores still run P_{j-1}·V_{j-1}; then
  it waits for that, frees slot j−1 and rescales O. P stays in registers (the register-A wgmma), the
  softmax scale·log2 e is folded into one exp2 FMA per score. (ptxas gives the new P the registers
  the in-flight P·V reads and hoists that wait above the softmax; ``PV_OVERLAP`` holds it after
  the softmax, where that gains: d 128 plain calls one tile per program.)
* ``PINGPONG`` (two or three consumers): the warpgroups take turns issuing their GEMMs (a turn
  passed round the ring), so one's softmax runs while another's GEMMs keep the tensor cores busy
  (FA3's inter-warpgroup ping-pong). The turns are hardware named barriers, as FA3's: a consumer
  waits on its own (``bar.sync``), the one before it arrives without waiting (``bar.arrive``).
  The one-tile d 128 plain kernel (``PV_OVERLAP``) keeps mbarrier turns, where they measured
  faster (``_wait_turn``).
* The K and V slots are freed separately: K_j as soon as S_j has retired, V_j after P_j·V_j, so the
  loader refills K while the last P·V still runs.
* Masks: keys past Nk (the last partial tile reads TMA zero-fill) and, under causal, keys right of
  the diagonal (j > i + Nk − Nq) are set to −inf, only in the tiles that need it (a uniform branch
  per tile); keys no row of the program sees are never loaded.
* Sliding windows (FlashAttention-2's: key j visible to query i iff i + off − left ≤ j ≤
  i + off + right, off = Nk − Nq, a side −1 unbounded, causal capping right at 0): ``HAS_LEFT`` /
  ``HAS_RIGHT`` constexprs, the sides runtime ints (one binary for every width). ``key_tiles`` (the
  portable kernels' ``key_range``) gives each program its band of key tiles: the loader loads only
  those (from ``lo``), so a window of W keys costs O(N·W); the consumers mask the tiles crossing the
  band's edges (``_band``) and run the rest unmasked. A call without a window compiles to the kernel
  it compiled to before windows (``benchmarks/ptx_hashes.py``). O goes out through shared memory
  (Q's slot, dead by then) and one TMA store, which drops rows past Nq.
* Options (``SOFTCAP``, ``ALIBI``, ``SINKS``: constexprs, so a plain call compiles to the code it
  compiled to before they existed; their unused arguments are passed as None, which Triton makes
  constexprs, so its parameter list is unchanged too): the scores as the portable kernels make them,
  through their @triton.jit helpers (a Gluon function may call one whose ops are elementwise:
  ``fold_factor``'s tanh, ``add_sink``), in the consumers' softmax, which overlaps the wgmma.
* Batch layouts (``SEQ``, a constexpr: a dense call compiles to the kernel it compiled to before):
  per-row key ranges (SEQ_RANGES: one tile a program, the dense grid, each batch row's tiles from
  its range's start) and packed varlen batches (SEQ_VARLEN: tensors (1, H, total, D) viewed from
  (total, H, D); one tile a program, the grid cdiv(total, BLOCK_M) + sequences slots per head,
  mapped to (sequence, query tile) by the portable kernel's scan of cu_seqlens, ``varlen_scan``);
  persistent, both through a work queue (below). Rows are counted from the sequence's
  start, so the masks and windows above apply per sequence (its own Nk − Nq diagonal); a key tile
  crossing the sequence's end reads the next sequence's (or the padding's) rows, masked to −inf (with
  P = 0 their values still enter P·V: a non-finite value there reaches the output). The last,
  partial query tile of a sequence is stored by a masked store (a TMA store would overwrite the
  next sequence's rows), as is, one tile a program, every tile under ALiBi (the TMA store's
  coordinates spill its consumers); lse by a masked store always.
* Persistent schedule (``Config.persistent`` → ``PERSISTENT``, any batch layout; a config
  without it compiles to the kernel it compiled to before): min(tiles, SMs) programs, each looping
  over its units of the head-major tile order (``persistent_tile``: causal tiles paired heaviest with
  lightest, so units dealt round-robin balance); the tiles of ranges and varlen batches from a work
  queue (``_loader_queue``: their costs vary with every sequence's length, which no static deal
  balances). Loader and consumers walk the same tiles; the K/V ring's slots and phases, the
  ping-pong turns and Q's barriers run on across tiles (counted over the program), so the next
  tile's first K/V tiles load while the consumers finish this one. Q is double-buffered
  where shared memory allows (``Config.q_sets``): the next tile's Q loads while this tile's O is
  staged in the other set (released in the next tile, once its first scores retired: the wait for
  the store stays off the tile boundary); with one set it loads after the next tile's first STAGES
  K/V tiles, once the epilogue's TMA store has read the set. K's and V's rings may differ in depth
  (``Config.v_stages``, ``V_STAGES``: d 128's default, K 2 and V 3, makes room for two Q sets).
  The barrier invariants are written out in the kernel.

Measured on the H100 (``benchmarks/gluon_fwd.py``, ``gluon_fwd-20261124-235738.json``, bf16, B·N 16k
tokens, the default config per point, the head-major grid): d 128 612–653 TFLOP/s non-causal (N 2k
to 16k), 493–680 causal (1.14–1.30× the Triton Hopper kernel's default, 0.94–1.07× cuDNN); d 64
467–533 non-causal, 466–495 causal from 8k (1.05–1.20× cuDNN), causal 2k 315 (the TMA kernel, 355,
takes those calls). The grid's order matters as much as the kernel: with bh fastest the programs
running at once spanned dozens of heads and read K/V from DRAM (L2 hits 20%), 1–48% slower.

Descriptors are built on the host (4-D over the (B, H, N, D) tensors, strides as given), like the
Triton Hopper kernel's. The Gluon imports are guarded: on a triton without Gluon, another triton
than 3.6 (whose Gluon API this is written against) or without CUDA, the module imports and
``supported`` says why not.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launcher import Launcher
from .._runtime import cdiv, sm_count
from ..merge import LOG2E, add_sink

from .attention_fwd import (PLAIN, SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN, Variant, causal_window, fold_factor,
                            key_range, output_buffers, score_args, seq_args, seq_bounds, sequence, varlen_scan,
                            varlen_slot)
from .attention_fwd_hopper import storable_like

try:  # Gluon's Hopper API as in triton 3.6 (it moves between releases: checked by TESTED_TRITON)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _HAS_GLUON = hasattr(gl, "warp_specialize") and hasattr(tma, "async_copy_global_to_shared")
except Exception:  # noqa: BLE001 - any import problem means: no Gluon path here
    _HAS_GLUON = False

HEAD_DIMS = (64, 128, 256)  # 256: the forward only (the Triton TMA kernel and the backwards: 64, 128)
DTYPES = (torch.float16, torch.bfloat16)
# The Gluon API is experimental and changes between releases: the kernel is written for (and
# compiled against) triton 3.6.
TESTED_TRITON = ("3.6.",)


def qk_width(head_dim: int) -> int:
    """The columns Q·Kᵀ (and the backward's Sᵀ, S) reduce over: q's head dim rounded up to a 64-column
    swizzle span (192 for MLA's q in 256-wide boxes); the boxes' columns past it are TMA's zeros. The
    head dim 256 one pass reduce-adds dQ over as many (``dq_buffer_width`` sizes its buffer so). The
    kernels take it from their hosts as a constexpr: the forward's ``HEAD_DIM``, the backwards' ``QK``
    (set where it is below the kernel's width)."""
    return -(-head_dim // 64) * 64


def padded_head_dim(head_dim: int, value_dim: int | None = None) -> int | None:
    """The head dim the kernel runs a call of ``head_dim`` at: ``head_dim`` itself if it is one of
    ``HEAD_DIMS``; for another multiple of 8 between 32 and 256 (80, 96, 112, 192, …) the next of
    ``HEAD_DIMS`` above it, the TMA boxes that wide: their loads read Q's, K's and V's missing
    columns as zeros (adding nothing to the scores, giving O zero columns) and O's store drops
    them, so only the GEMMs pay for the padding (but Q·Kᵀ, which reduces over q's head dim rounded
    up to 64: ``_qk``); else None (not covered). With v's head dim
    ``value_dim`` other than q's and k's (MLA's 192 and 128), the wider of the two, each covered:
    the narrower one's columns read as zeros the same way (the width of Q's and K's boxes; the
    forward's V and O boxes take v's own, ``_launch``)."""
    if value_dim is not None and value_dim != head_dim:
        widths = (padded_head_dim(head_dim), padded_head_dim(value_dim))
        return None if None in widths else max(widths)
    if head_dim in HEAD_DIMS:
        return head_dim
    if head_dim % 8 or not 32 < head_dim < HEAD_DIMS[-1]:
        return None
    return next(d for d in HEAD_DIMS if d > head_dim)


# Shared memory per block on the H100 (227 KB), less a little for the mbarriers.
SMEM_BYTES = 227 * 1024 - 1024


class Config(NamedTuple):
    """One launch configuration: ``consumers`` warpgroups of 64 query rows each, key tiles of
    ``block_n``, ``stages`` K/V slots, ``pingpong`` (two consumers take turns issuing GEMMs),
    ``consumer_regs`` (setmaxnreg for the consumer warpgroups; the loader gets ``LOADER_REGS``),
    ``persistent`` (one program per SM looping over the query tiles: ``_attn_fwd_gluon_kernel``;
    any batch layout: ranges and varlen from a work queue)."""
    consumers: int
    block_n: int
    stages: int
    pingpong: bool
    consumer_regs: int = 240
    persistent: bool = False
    v_stages: int = 0  # persistent configs: V's ring depth where it differs from K's (``stages``)

    @property
    def block_m(self) -> int:
        return 64 * self.consumers

    @property
    def name(self) -> str:
        pp = "-pp" if self.pingpong else ""
        ps = "-ps" if self.persistent else ""
        v = f"v{self.v_stages}" if self.v_stages else ""
        return f"g-m{self.block_m}-n{self.block_n}-s{self.stages}{v}{pp}-r{self.consumer_regs}{ps}"

    def smem_bytes(self, head_dim: int, q_sets: int = 1, value_dim: int | None = None,
                   key_width: int | None = None) -> int:
        """Shared memory of Q (``q_sets`` sets of BLOCK_M rows, O staged there) and the K and V rings,
        16-bit (V's rows ``value_dim`` wide where they are not ``head_dim``, K's ``key_width`` where its
        ring holds q's columns only: ``k_chunks``)."""
        value_dim = head_dim if value_dim is None else value_dim
        key_width = head_dim if key_width is None else key_width
        return 2 * (head_dim * q_sets * self.block_m + key_width * self.stages * self.block_n
                    + value_dim * (self.v_stages or self.stages) * self.block_n)

    def q_sets(self, head_dim: int, value_dim: int | None = None, key_width: int | None = None) -> int:
        """Q buffers of a persistent launch: two where they fit (the next tile's Q loads while this
        tile's O is staged and stored from the other set), else one; 1 when not persistent."""
        return 2 if self.persistent and self.smem_bytes(head_dim, 2, value_dim, key_width) <= SMEM_BYTES else 1


LOADER_REGS = 24

# The sweep, per head dim. Shared memory: 2 bytes · (BLOCK_M·D for Q + stages·2·BLOCK_N·D for K/V)
# under the H100's 227 KB (d 128, m128 n128: 224 KB at 3 stages). Registers: 65536 per SM over
# 384 threads (2 consumers) or 512 (3): the consumers get 240 or 160, the loader 24; none spills
# (triton 3.6, sm_90), with softcap, ALiBi, sinks and windows too, but for ALiBi in the d 64
# three-consumer configs, and with a window's left side softcap in those and ALiBi in every
# three-consumer config (``default_config`` gives those calls two consumers;
# ``benchmarks/ptx_hashes.py --ptxas`` reports registers and spills).
# Measured and left out (H100, 2026-11-24): m128 with 64-key tiles (d 64 and 128) and m128 n128
# with 2 stages at d 128 (never the best, by 5–25%); n176 / n192 (TMA blocks are powers of two) and
# d 64 n256 (spills).
# Persistent configs (``Config.persistent``; the default below 8k): against the same
# configs one tile per program, head-major units (``gluon_fwd-20261125-002134.json``): d 128 m128
# n128 +1.6% / +5.1% at 2k (non-causal / causal), +1.9% / +2.6% at 8k, −1.8% / −9.8% at 16k; d 64
# −8.5% to +1.7% with one Q set; with two, d 64's three consumers non-causal +4 to +9.5% below 8k
# (H200, ``default_config``). (Walked bh-fastest, they lost up to 39%: K/V read from DRAM.) Two Q sets but
# for m128 n128 at d 128 (224 KB with one; ``Config.q_sets``). No spills in plain calls, causal or
# not, nor with softcap, sinks or a window alone (triton 3.6, sm_90); ALiBi, or every option at
# once, adds a few per tile outside the key loop (one register in it for m128 n128 with every
# option), but for the d 64 three-consumer config, which spills in its key loop with ALiBi (more
# than without persistence).
# D 64 with two consumers (128-row tiles), persistent: the default for causal calls below 8k
# (``default_config``), without turns; no spills with any option, with turns or without.
# D 128 m128 n128 persistent with rings of their own depth (``Config.v_stages``: K 2, V 3) fits two Q
# sets (224 KB): the default below 8k. No spills plain, causal or not, with softcap, sinks or a
# window; ALiBi 80 bytes, every option at once 104 (the 3-deep one-set config: 68 and 48).
CONFIGS = {
    64: [Config(3, 128, 3, True, 160), Config(3, 128, 2, False, 160), Config(2, 128, 3, False),
         Config(3, 128, 3, True, 160, persistent=True), Config(2, 128, 3, True),
         Config(2, 128, 3, True, persistent=True), Config(2, 128, 3, False, persistent=True)],
    128: [Config(2, 128, 3, True), Config(2, 128, 3, False), Config(3, 64, 3, True, 160),
          Config(3, 64, 4, False, 160), Config(3, 64, 3, True, 160, persistent=True),
          Config(2, 128, 3, True, persistent=True), Config(2, 128, 3, False, persistent=True),
          Config(2, 128, 2, True, persistent=True, v_stages=3)],
    # d 256: 64-key tiles in a 2-deep ring, the only K/V ring beside two consumers' Q that fits (192 KB).
    256: [Config(2, 64, 2, True), Config(2, 64, 2, False), Config(2, 64, 2, True, persistent=True),
          Config(2, 64, 2, False, persistent=True)],
}


# Kernel width 256 beside V at most 128 wide, plain dense calls: V's narrower ring leaves room for
# 128-key tiles with one K slot and a V ring of its own (192 and 224 KiB, one Q set; at q's 192, K in
# chunks, ``k_chunks``: 176 and 208 KiB). The default for q's 136–184 and 256 (K whole); at MLA's 192
# / 128, where they were measured, K 2 / V 2 below leads them.
# Measured (H200, 192 / 128, two runs, ``mla_fwd_configs-20261130-114743.json``, ``-114955.json``):
# with V's ring 3 deep, non-causal +2.7 / +3.7 / +4.2% at 4k / 8k / 16k against the d 256 default,
# −0.9% at 2k; causal −3.4 / −1.9% at 2k / 4k, +0.6 / +1.5% at 8k / 16k (within the runs' spread). With K
# chunked (q's 192) it measured +7 / +9% over itself unchunked at 8k / 16k (``-124729.json``; not run at 4k).
NARROW_V_CONFIGS = [Config(2, 128, 1, True, persistent=True, v_stages=2),
                    Config(2, 128, 1, True, persistent=True, v_stages=3)]
NARROW_V_MIN_N = 4096
# Where q's columns are fewer than the boxes' 256 too (MLA's 192), the 128-key configs hold K in
# 64-column chunks of q's columns (``k_chunks``: 48 KiB a slot), and K 2 / V 2 fits beside one Q set
# (224 KiB), persistent or one tile a program. Measured (H200, 192 / 128, bf16) against the d 256
# default: plain, +4.5 to +18% from 1k to 16k, causal or not, in two runs at 2k–16k and one at 1k
# (``mla_fwd_configs-20261130-124729.json``, ``-135201.json``, ``-135948.json``; 1.05–1.14 × cuDNN from
# 2k); with softcap, sinks, ALiBi or a window +4.3 to +18.7%, on varlen batches one tile a program
# +11 to +15% (``-140049.json``, ``-142035.json``, 4k / 8k; the work queue's form of it, now the
# default there, not timed). Below 1k: not measured.
NARROW_QK_CONFIG = Config(2, 128, 2, True, persistent=True)
NARROW_QK_MIN_N = 1024


def default_config(head_dim: int, causal: bool = False, n: int = 4096, alibi: bool = False, softcap: bool = False,
                   left: bool = False, value_dim: int | None = None, q_dim: int | None = None, *,
                   plain: bool = False) -> Config:
    """The sweep's fastest config at the nearest measured point (``benchmarks/gluon_fwd.py`` on the H100,
    bf16, N 2k / 8k / 16k with B·N 16k: ``gluon_fwd-20261124-235738.json``, the head-major grid). d 64:
    three ping-ponging consumers (192-row tiles; 467–533 TFLOP/s non-causal); with ALiBi (whose bias
    spills those consumers' 160 registers), or a window's left side with softcap (8 bytes), two; causal
    below N 8k, two consumers with 128-row tiles, persistent
    (``gluon_fwd-20261125-041948.json``: 386 / 412 TFLOP/s at 2k / 4k against 356 / 352 for the TMA
    kernel and 319 / 377 for three consumers; at 8k 442 against 457 for three consumers,
    ``gluon_fwd-20261125-041725.json``), with any option (no spills), and without turns: their softmax
    is longer than the other consumer's GEMMs, so the turns only add waits (H200, +0.9% / +1.0% at
    2k / 4k, outputs bit-identical: ``gluon_checkout-20261128-2342.json``); non-causal below N 8k,
    the three consumers persistent (H200, three sweeps: +5.6 to +9.5% at 2k, +4.0 / +4.5% at 4k
    against the same config one tile per program; at 8k −6.6 / +4.2%, at 16k ±0.6%:
    ``gluon_fwd-20261129-072237.json``, ``-072506.json``, ``-072605.json``). d 128: two ping-ponging consumers
    with 128-key tiles and three stages at every length, causal or not (612–653 non-causal, 493–680
    causal; three consumers with 64-key tiles, the choice below 8k before the grid went head-major, now
    trail by 5–9% there), persistent below N 8k (``gluon_fwd-20261125-002134.json``: +1.6% non-causal
    and +5.1% causal at 2k against the same config one tile per program; from 8k ±3% to −10%), there
    with a 2-deep K ring, a 3-deep V ring and two Q sets (the next tile's Q loads during this one:
    +4.8% non-causal and +7.2% causal at 2k against one Q set and two 3-deep rings,
    ``gluon_checkout-20261125-0812.json``; the best of the four 128-row configs at 2k, 3k and 4k,
    causal or not, in three runs each on the H200, ``gluon_fwd-20261129-074101.json``), and for
    causal calls without ALiBi below 12k (``CAUSAL_PERSISTENT_MAX_N``), midway between 8k, where it
    leads the one-tile config by 3.9–4.6% in three runs, and 16k, where it trails by 0.8% on average
    (``gluon_fwd-20261129-074213.json``, ``-074224.json``, ``-074232.json``). A persistent config
    takes dense batches, and ranges and varlen through a work queue (``_loader_queue``).
    d 256 (H200, three sweeps each, ``gluon_fwd-20261129-091536.json``, ``-091615.json``,
    ``-091655.json``): two consumers with 64-key tiles and a 2-deep ring, persistent with turns
    (causal 1k–8k +3 to +12% over the same config one tile per program; non-causal within ±3% of
    every other config, 580–669 TFLOP/s), and causal from 12k one tile per program without turns
    (659–660 against 646–647 persistent at 16k); beside V's boxes at most 128 wide (``value_dim``:
    v's head dim; MLA's 192 / 128), ``plain`` (``_is_plain``: no option, a dense batch) non-causal
    calls from ``NARROW_V_MIN_N`` take 128-key tiles with V's ring 3 deep (``NARROW_V_CONFIGS``:
    measured plain only), and where q's
    head dim (``q_dim``) lets K's ring hold its columns in 64-column chunks (``k_chunks``: 192), calls
    from ``NARROW_QK_MIN_N``, causal or not, with any option, take 128-key tiles with two slots for K
    and V (``NARROW_QK_CONFIG``).
    """
    if head_dim == 256:
        if value_dim is not None and padded_head_dim(value_dim) <= 128:  # V's narrow boxes leave room
            if q_dim is not None and k_chunks(NARROW_QK_CONFIG, 256, q_dim) > 1 and n >= NARROW_QK_MIN_N:
                return NARROW_QK_CONFIG
            if plain and not causal and n >= NARROW_V_MIN_N:
                return NARROW_V_CONFIGS[1]
        if causal and n >= CAUSAL_PERSISTENT_MAX_N:
            return Config(2, 64, 2, False)
        return Config(2, 64, 2, True, persistent=True)
    if head_dim == 64:
        if causal and n < 8192:
            return Config(2, 128, 3, False, persistent=True)
        if alibi or (left and softcap):
            return Config(2, 128, 3, False)
        return Config(3, 128, 3, True, 160, persistent=not causal and n < 8192)
    if n < (CAUSAL_PERSISTENT_MAX_N if causal and not alibi else 8192):
        return Config(2, 128, 2, True, persistent=True, v_stages=3)
    return Config(2, 128, 3, True)


# d 128's and d 256's causal calls run persistent below this length (``default_config``); d 128's with
# ALiBi below 8k, as before (the persistent config spills 88 bytes with it, the one-tile config none:
# ptx_hashes.py).
CAUSAL_PERSISTENT_MAX_N = 12288


@triton.jit
def key_tiles(start_m, n_k, off, win_left, win_right, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
              HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key tiles of the query tile [start_m, start_m + BLOCK_M): (lo, n_tiles, mid_lo, mid_hi).
    The program loads the ``n_tiles`` tiles of keys from ``lo`` (a multiple of BLOCK_N); keys
    outside them are visible to no row of the tile, so a window of W keys costs O(W) per row. Of
    those, the tiles of [mid_lo, mid_hi) are visible to every row (no mask); the others are masked.
    Without a window (``HAS_LEFT``/``HAS_RIGHT`` False): keys [0, hi), the causal diagonal
    bottom-right aligned (offset ``off`` = Nk − Nq) and the zero-padded tail masked, as before
    windows existed. With one: the portable kernels' ``key_range``, causal as the right side at 0
    (``win_right`` is then not read). Called by the Gluon kernel and, in the interpreter, by the
    tests."""
    if HAS_LEFT or HAS_RIGHT:
        right = win_right
        if CAUSAL:
            right = 0
        lo, mid_lo, mid_hi, hi = key_range(start_m, n_k, off, win_left, right, HAS_LEFT, HAS_RIGHT or CAUSAL,
                                           BLOCK_M, BLOCK_N)
        n_tiles = tl.cdiv(hi, BLOCK_N) - lo // BLOCK_N
    else:
        hi = n_k
        full_hi = n_k
        if CAUSAL:
            hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), n_k)
            full_hi = tl.minimum(tl.maximum(start_m + 1 + off, 0), n_k)
        lo = 0
        mid_lo = 0
        n_tiles = tl.cdiv(hi, BLOCK_N)
        mid_hi = (full_hi // BLOCK_N) * BLOCK_N
    return lo, n_tiles, mid_lo, mid_hi


@triton.jit
def persistent_units(n_bh, n_m, CAUSAL: tl.constexpr):
    """(units, paired) of a persistent launch over n_bh heads of n_m query tiles
    (``persistent_tile``): causal, each head's tiles paired heaviest with lightest (the first
    n_bh·(n_m // 2) units, two tiles each), then its middle tile alone when n_m is odd; otherwise
    one tile a unit (none paired)."""
    if CAUSAL:
        return n_bh * (n_m // 2 + n_m % 2), n_bh * (n_m // 2)
    return n_bh * n_m, 0


@triton.jit
def _share(pid, programs, count):
    """How many of units 0 … count − 1 program ``pid`` takes, dealt pid, pid + programs, …"""
    return count // programs + (pid < count % programs).to(tl.int32)


@triton.jit
def causal_deal(n_bh, n_m, programs):
    """(head_units, tail_units, singles) of a causal persistent launch with a sorted tail
    (``sorted_tail_slot``): the first head_units pairs, a multiple of ``programs`` (all but the
    last round or two), are dealt round-robin, every program the same number; the tiles of the
    tail_units after them and the singles (the middle tile of each head, n_m odd) one by one."""
    paired = n_bh * (n_m // 2)
    head_units = tl.maximum(paired // programs - 1, 0) * programs
    return head_units, paired - head_units, n_bh * (n_m % 2)


@triton.jit
def _snake(pid, programs, r):
    """Program ``pid``'s place in round r of a deal that runs forward in even rounds, backward in odd."""
    return tl.where(r % 2 == 0, pid, programs - 1 - pid)


@triton.jit
def persistent_count(pid, programs, n_bh, n_m, CAUSAL: tl.constexpr, SORTED_TAIL: tl.constexpr = False):
    """How many tiles program ``pid`` of ``programs`` walks (``persistent_unit``, ``sorted_tail_slot``)."""
    if CAUSAL and SORTED_TAIL:
        head_units, tail_units, singles = causal_deal(n_bh, n_m, programs)
        tail = 2 * tail_units + singles
        rounds = tail // programs
        return 2 * (head_units // programs) + rounds + (_snake(pid, programs, rounds) < tail % programs).to(tl.int32)
    units, paired = persistent_units(n_bh, n_m, CAUSAL)
    return _share(pid, programs, units) + _share(pid, programs, paired)  # a paired unit: two tiles


@triton.jit
def persistent_unit(j, pid, programs, n_bh, n_m, CAUSAL: tl.constexpr):
    """(u, i): program ``pid``'s ``j``-th tile is the i-th of unit u. Units are dealt round-robin
    (pid, pid + programs, …); the paired ones come first, so its first 2·(paired units) tiles go
    two a unit."""
    i = 0
    w = j
    if CAUSAL:
        _, paired = persistent_units(n_bh, n_m, CAUSAL)
        pairs = 2 * _share(pid, programs, paired)
        i = tl.where(j < pairs, j % 2, 0)
        w = tl.where(j < pairs, j // 2, j - pairs // 2)
    return w * programs + pid, i


@triton.jit
def pair_tile(u, i, n_m):
    """(bh, heavy) of tile i (0: the heavy one, 1: the light one) of causal pair unit u: head bh's
    k-th heaviest query tile (heavy k, counted from the head's last) or its k-th lightest."""
    pairs = tl.maximum(n_m // 2, 1)
    bh = u // pairs
    k = u % pairs
    return bh, tl.where(i == 0, k, n_m - 1 - k)


@triton.jit
def sorted_tail_slot(j, pid, programs, n_bh, n_m):
    """(bh, heavy) of program ``pid``'s ``j``-th tile in a causal launch with a sorted tail
    (``causal_deal``): head bh's query tile counted from the last (heavy 0: the heaviest). First
    the program's head units, pid, pid + programs, … (two tiles each, the heavy one first), as
    ``persistent_unit`` deals them; then the tail's tiles in a snake deal (round r: programs
    forward when r is even, backward when odd) of the tail sorted heaviest first: the heavy halves
    of the tail units (by pair index k, then head), the singles, the light halves (by k downwards,
    then head). Sorted and snaked, the tail evens out what whole pairs dealt round-robin leave
    over (up to one pair a program: 3% of a 16-round launch); its heads are few and consecutive."""
    pairs = tl.maximum(n_m // 2, 1)
    head_units, tail_units, singles = causal_deal(n_bh, n_m, programs)
    head = 2 * (head_units // programs)
    if j < head:  # a head unit, u = pid + programs · (j // 2): its heavy tile, then its light one
        bh, heavy = pair_tile((j // 2) * programs + pid, j % 2, n_m)
    else:  # the tail's g-th heaviest tile
        r = j - head
        g = r * programs + _snake(pid, programs, r)
        # The tail's first head h0 may have had pairs k < k0 in the head units: the tail's
        # heads h0 … n_bh − 1 hold n_tail tiles of each k ≥ k0, one fewer of each k below.
        h0 = head_units // pairs
        k0 = head_units % pairs
        n_tail = n_bh - h0
        fewer = tl.maximum(n_tail - 1, 1)
        if g < tail_units:  # a heavy half: by k upwards, then head
            below = k0 * (n_tail - 1)
            x = g - below
            heavy = tl.where(g < below, g // fewer, k0 + x // n_tail)
            bh = tl.where(g < below, h0 + 1 + g % fewer, h0 + x % n_tail)
        elif g < tail_units + singles:  # a head's middle tile (n_m odd)
            bh = g - tail_units
            heavy = n_m // 2
        else:  # a light half: by k downwards, then head
            y = g - tail_units - singles
            above = (pairs - k0) * n_tail
            z = y - above
            heavy = n_m - 1 - tl.where(y < above, pairs - 1 - y // n_tail, k0 - 1 - z // fewer)
            bh = tl.where(y < above, h0 + y % n_tail, h0 + 1 + z % fewer)
    return bh, heavy


@triton.jit
def persistent_tile(j, n_bh, n_heads, n_q, n_k, win_left, win_right, CAUSAL: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    SORTED_TAIL: tl.constexpr = False):
    """This persistent program's ``j``-th tile (dense batch): (bh, b, h, start_m, lo, n_tiles,
    mid_lo, mid_hi), ``key_tiles`` of it included. Units (``persistent_unit``) are head-major, as
    the one-tile grid's programs, so the programs running at once share few heads' K/V in L2 (bh
    fastest, they read K/V from DRAM: benchmarks/NOTES.md, 2026-11-24 23:52). Dealt round-robin, causal
    tiles balance as pairs: a head's k-th heaviest query tile with its k-th lightest, a pair costing
    about the same wherever it sits, then, after every head's pairs, the middle tiles of heads with
    an odd tile count (a light, single unit at the end); with ``SORTED_TAIL``, the last pairs as
    single tiles sorted by cost (``sorted_tail_slot``). Every partition of a persistent program
    walks its tiles j = 0 … ``persistent_count`` − 1 with it (``_loader_persistent``,
    ``_consumer_persistent``); the tests run it in the interpreter."""
    n_m = tl.cdiv(n_q, BLOCK_M)
    if CAUSAL and SORTED_TAIL:
        bh, heavy = sorted_tail_slot(j, tl.program_id(0), tl.num_programs(0), n_bh, n_m)
    else:
        u, i = persistent_unit(j, tl.program_id(0), tl.num_programs(0), n_bh, n_m, CAUSAL)
        if CAUSAL:
            paired = u < n_bh * (n_m // 2)
            bh, heavy = pair_tile(u, i, n_m)
            bh = tl.where(paired, bh, u - n_bh * (n_m // 2))
            heavy = tl.where(paired, heavy, n_m // 2)  # a head's middle tile (n_m odd), after every pair
        else:
            bh = u // n_m
            heavy = u % n_m
    start_m = (n_m - 1 - heavy) * BLOCK_M
    lo, n_tiles, mid_lo, mid_hi = key_tiles(start_m, n_k, n_k - n_q, win_left, win_right, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, BLOCK_M, BLOCK_N)
    return bh, bh // n_heads, bh % n_heads, start_m, lo, n_tiles, mid_lo, mid_hi


@triton.jit
def _chunk_tiles(starts, ends, n_seq, total, c, lanes, BLOCK: tl.constexpr, stride):
    """The query tiles of sequences c … c + len(lanes) − 1 (0 past the last), read as ``varlen_scan``
    reads them."""
    idx = c + lanes
    ok = idx < n_seq
    first, end = tl.load(starts + idx * stride, mask=ok, other=0), tl.load(ends + idx * stride, mask=ok, other=0)
    _, n = seq_bounds(first, end, total)
    return tl.where(ok, tl.cdiv(n, BLOCK), 0)


@triton.jit
def scan_from(starts, ends, n_seq, total, t, lanes, BLOCK: tl.constexpr, stride, c, seen, heads=1):
    """``varlen_scan`` for a program whose units only increase, sequence b holding tiles(b) · ``heads``
    units: the scan starts at chunk ``c`` (a multiple of len(lanes); ``seen``: the units of the
    sequences before it, t ≥ seen) and returns (b, u, n_b, c, seen): unit t's sequence, its index
    among b's units, b's tile count, and the chunk that holds unit t, for the next call. Over a
    program's units it reads each chunk of bounds about once, where ``varlen_scan`` reads them all
    for every tile. Unit t must exist (t < the batch's units)."""
    SCAN: tl.constexpr = lanes.shape[0]
    tiles = _chunk_tiles(starts, ends, n_seq, total, c, lanes, BLOCK, stride) * heads
    chunk = tl.sum(tiles, 0)
    while (seen + chunk <= t) & (c < n_seq):
        seen += chunk
        c += SCAN
        tiles = _chunk_tiles(starts, ends, n_seq, total, c, lanes, BLOCK, stride) * heads
        chunk = tl.sum(tiles, 0)
    ends_t = tl.cumsum(tiles, 0) + seen  # where each sequence's units end, over the whole batch
    done = ends_t <= t
    before = seen + tl.sum(tl.where(done, tiles, 0), 0)
    own = tl.sum(tl.where(~done & (ends_t - tiles <= t), tiles, 0), 0)
    return c + tl.sum(done.to(tl.int32), 0), t - before, own // heads, c, seen


@triton.jit
def queue_tile(u, n_b, group, BLOCK: tl.constexpr):
    """(h, start_m) of unit u of a sequence with n_b query tiles (``scan_from``): one KV head's tiles
    after another, each tile's ``group`` query heads together, its last (under causal heaviest) tile
    first. So the programs running at once read one KV head's K/V (L2 hits), as the dense grid's
    head-major order has them (heads fastest: 10% slower at 4 × 8k MHA, NOTES 2026-12-02 18:25)."""
    return u // (group * n_b) * group + u % group, (n_b - 1 - u // group % n_b) * BLOCK


@triton.jit
def varlen_tile_count(starts, ends, n_seq, total, lanes, BLOCK: tl.constexpr, stride=1):
    """The query tiles of one head of a packed batch (or of per-row ranges), Σ cdiv(n_b, BLOCK) over
    its sequences, read as ``varlen_scan`` reads them (clamped into the ``total`` rows; ``lanes``: its
    chunk's lanes; ``stride``: the bounds' step)."""
    count = 0
    for c in range(0, n_seq, lanes.shape[0]):
        count += tl.sum(_chunk_tiles(starts, ends, n_seq, total, c, lanes, BLOCK, stride), 0)
    return count


if _HAS_GLUON:
    # The ping-pong turns' named barriers: TURN_BARRIER − consumer (15, 14, 13). Triton's own
    # partition barriers take the low ids (0–3 in these kernels' PTX).
    TURN_BARRIER = gl.constexpr(15)

    @gluon.jit
    def _qk(q, k, s_zero, n: gl.constexpr):
        """S = q·kᵀ (q: 64 × W, k: BLOCK_N × W in shared memory) over their first ``n`` columns,
        issued async. ``n`` (the kernels' ``HEAD_DIM``) is q's head dim rounded up to 64, below W
        where the boxes are wider (192 in 256; 64 in 128 beside a wider v): the columns past it are
        TMA's zeros, which the reduction need not add. One wgmma, or for n = 192 two (Gluon's
        operands have power-of-two sides), over 128 and 64 columns, the second accumulating."""
        W: gl.constexpr = q.shape[1]
        if n == W:
            s = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        elif (n & (n - 1)) == 0:
            s = warpgroup_mma(q.slice(0, n, dim=1), k.slice(0, n, dim=1).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        else:
            gl.static_assert(n == 192, "Q·Kᵀ widths: 64, 128, 192 or the boxes' own")
            s = warpgroup_mma(q.slice(0, 128, dim=1), k.slice(0, 128, dim=1).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            s = warpgroup_mma(q.slice(128, n - 128, dim=1), k.slice(128, n - 128, dim=1).permute((1, 0)), s,
                              is_async=True)
        return s

    @gluon.jit
    def _qk_slot(q, k_smem, slot, s_zero, n: gl.constexpr, STAGES: gl.constexpr):
        """S = q·Kᵀ over n columns (``_qk``) with K in slot ``slot`` of its ring, whole or, where the
        ring holds K in 64-column chunks (``K_CHUNKS``: the chunks of q's ``n`` columns only, MLA's
        three of 192), one wgmma a chunk, accumulating."""
        KC: gl.constexpr = k_smem.shape[0] // STAGES
        BN: gl.constexpr = k_smem.shape[3]
        if KC == 1:
            s = _qk(q, k_smem.index(slot).reshape([BN, q.shape[1]]), s_zero, n)
        else:
            W: gl.constexpr = k_smem.shape[4]
            gl.static_assert(KC * W == n, "K's chunks cover Q·Kᵀ's columns exactly")
            s = warpgroup_mma(q.slice(0, W, dim=1), k_smem.index(slot * KC).reshape([BN, W]).permute((1, 0)),
                              s_zero, use_acc=False, is_async=True)
            for part in gl.static_range(1, KC):
                s = warpgroup_mma(q.slice(part * W, W, dim=1),
                                  k_smem.index(slot * KC + part).reshape([BN, W]).permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                b, h, h_kv, start_m, lo, n_tiles,
                CONSUMERS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
                q0=0, k0=0, SEQ: gl.constexpr = 0):
        """The loader warp: Q once, then K_j/V_j (keys from ``lo`` on under a window's left side, else
        from 0) into slot j % STAGES once the consumers freed it. Ranges and varlen (``SEQ``): ``b``
        is the tensor's batch row, rows counted from the sequence's first query ``q0`` and key ``k0``
        (a tile crossing the sequence's end reads rows of the padding or the next sequence: the
        consumers mask those keys and store no such query row)."""
        mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
        for c in gl.static_range(CONSUMERS):
            row = start_m + 64 * c
            if SEQ != 0:
                row = q0 + row
            tma.async_copy_global_to_shared(q_desc, [b, h, row, 0], q_bar, q_smem.index(c))
        for j in range(n_tiles):
            key = j * BLOCK_N
            if HAS_LEFT:
                key = lo + j * BLOCK_N
            if SEQ != 0:
                key = k0 + key
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, j, b, h_kv, key, STAGES,
                     STAGES)

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, c, b, h_kv, key,
                 STAGES: gl.constexpr, V_STAGES: gl.constexpr):
        """K and V of keys [key, key + BLOCK_N) of (b, h_kv), the ``c``-th K/V tile the program loads
        (the ``c``-th the consumers take): K into slot c % STAGES of its ring, V into slot
        c % V_STAGES of its own, each once the consumers freed it."""
        s = c % STAGES
        # A fresh barrier's "previous" phase counts as complete: the first round never waits.
        free = ((c // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(s), free)
        KC: gl.constexpr = k_smem.shape[0] // STAGES  # K's 64-column chunks a slot (``K_CHUNKS``), or 1
        mbarrier.expect(k_ready.index(s), KC * k_desc.block_type.nbytes)
        if KC == 1:
            tma.async_copy_global_to_shared(k_desc, [b, h_kv, key, 0], k_ready.index(s), k_smem.index(s))
        else:
            for part in gl.static_range(KC):
                tma.async_copy_global_to_shared(k_desc, [b, h_kv, key, part * k_desc.block_type.shape[3]],
                                                k_ready.index(s), k_smem.index(s * KC + part))
        if V_STAGES != STAGES:  # (equal depths reuse K's slot and parity: the code before V_STAGES)
            s = c % V_STAGES
            free = ((c // V_STAGES) & 1) ^ 1
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, key, 0], v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _load_q(q_desc, q_smem, q_ready, q_empty, qi, b, h, start_m, CONSUMERS: gl.constexpr,
                Q_SETS: gl.constexpr):
        """The Q rows of the program's ``qi``-th tile into set qi % Q_SETS (slots set·CONSUMERS + c),
        once every consumer released that set after tile qi − Q_SETS (its O store has read it)."""
        qs = qi % Q_SETS
        mbarrier.wait(q_empty.index(qs), ((qi // Q_SETS) & 1) ^ 1)  # a fresh barrier: no wait
        mbarrier.expect(q_ready.index(qs), CONSUMERS * q_desc.block_type.nbytes)
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(q_desc, [b, h, start_m + 64 * c, 0], q_ready.index(qs),
                                            q_smem.index(qs * CONSUMERS + c))

    @gluon.jit
    def _load_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv0, first, last, b, h_kv,
                       lo, HAS_LEFT: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       V_STAGES: gl.constexpr, k0=0, SEQ: gl.constexpr = 0):
        """K/V tiles j ∈ [first, last) of a tile whose first is the program's ``kv0``-th (keys from
        ``lo`` under a window's left side, else from 0, as ``_loader``; varlen: from the sequence's
        first key ``k0``)."""
        for j in range(first, last):
            key = j * BLOCK_N
            if HAS_LEFT:
                key = lo + j * BLOCK_N
            if SEQ != 0:
                key = k0 + key
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv0 + j, b, h_kv, key,
                     STAGES, V_STAGES)

    @gluon.jit
    def _loader_persistent(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                           k_empty, v_empty, n_bh, n_heads, group, n_q, n_k, win_left, win_right,
                           CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                           HAS_RIGHT: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                           V_STAGES: gl.constexpr, Q_SETS: gl.constexpr, SORTED_TAIL: gl.constexpr):
        """The loader warp of a persistent program: for each of its tiles (``persistent_tile``), Q and
        the K/V tiles as ``_loader`` loads them, the ring's slot and phase counted over the program
        (``kv``: K/V tiles loaded so far), so the next tile's first K/V tiles load while the
        consumers finish this one. Two Q sets: the tile's Q first (its set's previous tile, two
        back, is done by then unless the tile before had at most STAGES key tiles). One: Q after
        the tile's first min(n_tiles, STAGES, V_STAGES) K/V tiles, whose slots the consumers free
        during the previous tile, while the set is free only after that tile's epilogue; a K/V load
        past those would wait for this tile's consumers, who wait for its Q (a deadlock)."""
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        kv = 0
        qi = 0
        for j in range(persistent_count(gl.program_id(0), gl.num_programs(0), n_bh, gl.cdiv(n_q, BLOCK_M), CAUSAL,
                                        SORTED_TAIL)):
            bh, b, h, start_m, lo, n_tiles, mid_lo, mid_hi = persistent_tile(j, n_bh, n_heads, n_q, n_k, win_left,
                                                                             win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                                                             BLOCK_M, BLOCK_N, SORTED_TAIL)
            h_kv = h // group
            first = 0
            if Q_SETS == 1:
                FIRST: gl.constexpr = STAGES if STAGES < V_STAGES else V_STAGES
                first = gl.minimum(n_tiles, FIRST)
                _load_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv, 0, first, b,
                               h_kv, lo, HAS_LEFT, BLOCK_N, STAGES, V_STAGES)
            _load_q(q_desc, q_smem, q_ready, q_empty, qi, b, h, start_m, CONSUMERS, Q_SETS)
            _load_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv, first, n_tiles,
                           b, h_kv, lo, HAS_LEFT, BLOCK_N, STAGES, V_STAGES)
            kv += n_tiles
            qi += 1

    @gluon.jit
    def _band(cols, rows, n_k, off, win_left, win_right, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
        """Which keys ``cols`` ([1, BLOCK_N]) the query ``rows`` see under the window: keys
        [first, last] of row i, first = i + off − win_left, last = min(i + off + win_right, Nk − 1)
        (the portable kernels' ``mask_scores``, the window and the keys past Nk), with the bounds made
        per row: a compare per side and score, where that helper's three spilled the d 64
        three-consumer configs."""
        last = gl.full_like(rows, 0) + (n_k - 1)
        if HAS_RIGHT:
            last = gl.minimum(rows + (off + win_right), n_k - 1)
        visible = cols <= gl.expand_dims(last, 1)
        if HAS_LEFT:
            visible = visible & (cols >= gl.expand_dims(rows + (off - win_left), 1))
        return visible

    @gluon.jit
    def _scores(s, j, lo, rows, cols_f, n_k, off, win_left, win_right, mid_lo, mid_hi, qk_scale, softcap_scale,
                softcap2, slope,
                CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                ALIBI: gl.constexpr, FAST_TANH: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """(x, fold, r): the scores of the j-th loaded key tile (keys from ``key`` = j·BLOCK_N, + ``lo``
        under a window's left side) as base-2 scores (x + r)·fold, fold > 0 and r a per-row term for
        ``_softmax`` to fold into its exp2 (the portable kernels' ``fold_factor``: S and scale·log2 e,
        or with softcap c tanh(S·scale/c) and c·log2 e, ``tanh.approx.f32`` for 16-bit inputs), ALiBi's
        slope·log2 e·|i + off − j| subtracted from x over that fold (``slope``; causal: its key part
        added to x and its row part as r, one FMA a score), and the keys its rows
        cannot see set to −inf, only in the tiles outside [mid_lo, mid_hi) (``key_tiles``): without a
        window, keys past Nk and right of the causal diagonal; with one (``HAS_LEFT``/``HAS_RIGHT``,
        causal as the right side at 0), the keys outside the band (``_band``)."""
        s, fold = fold_factor(s, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
        r = 0.0
        key = j * BLOCK_N
        if HAS_LEFT:
            key = lo + j * BLOCK_N
        if ALIBI:
            # |i + off − j| as the difference of a per-row float and ``cols_f`` (0 … BLOCK_N − 1,
            # made once per consumer): exact below 2²⁴, one add per score and no int→float
            # conversion (the ALiBi helper of the portable kernels converts per score).
            rows_f = (rows + (off - key)).to(gl.float32)
            if CAUSAL:
                # Every key a row sees is at or left of its diagonal: |i + off − j| = rows_f − c, so
                # x gains slope·c (an FMA) and the row's −slope·rows_f goes to _softmax as r. (Keys
                # right of the diagonal get the wrong bias, and −inf below.)
                s = s + slope * gl.expand_dims(cols_f, 0)
                r = -slope * rows_f
            else:
                s = s - slope * gl.abs(gl.expand_dims(rows_f, 1) - gl.expand_dims(cols_f, 0))
        if HAS_LEFT or HAS_RIGHT:
            if (key < mid_lo) | (key >= mid_hi):
                right = win_right
                if CAUSAL:  # the diagonal: the right side at 0 (``win_right`` is None then)
                    right = 0
                cols = gl.expand_dims(key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
                s = gl.where(_band(cols, rows, n_k, off, win_left, right, HAS_LEFT, HAS_RIGHT or CAUSAL), s,
                             float("-inf"))
        else:
            if key >= mid_hi:
                cols = key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                if CAUSAL:
                    # A row i < Nq sees keys up to i + off ≤ Nk − 1: the diagonal also masks the keys
                    # past Nk, one compare a score. (Rows past Nq, never stored, may see them.)
                    visible = gl.expand_dims(cols, 0) <= gl.expand_dims(rows + off, 1)
                else:
                    visible = gl.expand_dims(cols < n_k, 0)
                s = gl.where(visible, s, float("-inf"))
        return s, fold, r

    @gluon.jit
    def _softmax(s, m_i, l_i, qk_scale, r, ROW_TERM: gl.constexpr):
        """Online softmax step in base 2 of the scores (s + r)·qk_scale (``r``: a per-row term from
        ``_scores`` where ``ROW_TERM``, else none), with the scale folded into the exponent: returns
        (m, ℓ, P in float32, α = exp2(m_old − m_new)); ``_as_operand`` makes P the P·V wgmma's A
        operand. (Softcap's scores cost a
        second MUFU op, the tanh; computing 3 of every 8 exp2s with FMAs instead, as
        FlashAttention-4 does, measured 4% slower under the H100's power cap: NOTES, 2026-11-25.)"""
        if ROW_TERM:
            m_new = gl.maximum(m_i, (gl.max(s, 1) + r) * qk_scale)
        else:
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        alpha = gl.exp2(m_i - m_ref)
        if ROW_TERM:
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref - r * qk_scale, 1))
        else:
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        return m_new, l_i, p, alpha

    @gluon.jit
    def _as_operand(p, p_layout: gl.constexpr, dtype: gl.constexpr):
        """P (float32) as the register-A operand of the P·V wgmma."""
        return gl.convert_layout(p.to(dtype), p_layout)

    @gluon.jit
    def alibi_slope2(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP: gl.constexpr):
        """ALiBi's slope of (b, h) times log2 e, as the portable kernels read it, over the exp2's
        fold (scale·log2 e, or c·log2 e under softcap): the Gluon forward's and backwards' one read."""
        slope = gl.load(alibi + b.to(gl.int64) * stride_alibi_b + h * stride_alibi_h).to(gl.float32)
        if SOFTCAP:
            slope = slope * 1.4426950408889634 / softcap2
        else:
            slope = slope * 1.4426950408889634 / qk_scale
        return slope

    @gluon.jit
    def _alibi_slope(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP: gl.constexpr,
                     BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """(slope, cols_f) of ALiBi for (b, h): ``alibi_slope2`` and the key offsets 0 … BLOCK_N − 1
        as floats."""
        slope = alibi_slope2(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP)
        cols_f = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)).to(gl.float32)
        return slope, cols_f

    @gluon.jit
    def _opaque_zero(x):
        """0, from an asm move the compiler can neither fold nor hoist (not pure); ``x``, any int32
        scalar, only gives it an operand."""
        return gl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _wait_turn(turn, c, ME: gl.constexpr, NAMED: gl.constexpr):
        """Consumer ME's c-th turn to issue its GEMMs (ping-pong). ``NAMED``: on hardware named barrier
        ``TURN_BARRIER − ME`` of 256 threads, as FlashAttention-3 takes its turns: ME's 128 threads
        wait there (``bar.sync``) for the previous consumer's 128 arrivals (``_pass_turn``). Else on
        the mbarrier ``turn[ME]``, phase c."""
        if NAMED:
            gl.inline_asm_elementwise("bar.sync $1, 256; mov.b32 $0, 0;", "=r,r", [c * 0 + (TURN_BARRIER - ME)],
                                      dtype=gl.int32, is_pure=False, pack=1)
        else:
            mbarrier.wait(turn.index(ME), c & 1)

    @gluon.jit
    def _pass_turn(turn, c, NEXT: gl.constexpr, NAMED: gl.constexpr):
        """Consumer NEXT's turn, once this one has issued its GEMMs. ``NAMED``: each warp arrives on
        NEXT's named barrier for itself and goes on (``bar.arrive``); an mbarrier arrive in triton
        3.6's Gluon is one thread's, behind a ``bar.sync`` of the warpgroup's four warps. ``c``, any
        int32 scalar, gives the asm an operand."""
        if NAMED:
            gl.inline_asm_elementwise("bar.arrive $1, 256; mov.b32 $0, 0;", "=r,r",
                                      [c * 0 + (TURN_BARRIER - NEXT)], dtype=gl.int32, is_pure=False, pack=1)
        else:
            mbarrier.arrive(turn.index(NEXT))

    @gluon.jit
    def _attend(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, kv0, rows, cols_f, slope,
                m_i, l_i, acc, p, s_zero, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi, qk_scale,
                softcap_scale, softcap2,
                ME: gl.constexpr, CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, CAUSAL: gl.constexpr,
                HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                FAST_TANH: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                V_STAGES: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
                j0=0, q_free=None, free_prev=None, DEFER_Q: gl.constexpr = False, PV_OVERLAP: gl.constexpr = False):
        """A consumer's online softmax of its rows ``q`` over the tile's ``n_tiles`` key tiles: (m, ℓ,
        unnormalised O). Key tile j of the tile is the ``kv0 + j``-th the program takes: the rings'
        slots ((kv0 + j) % STAGES for K, % V_STAGES for V) and their phases, and the mbarrier turns'
        phase, continue from the tiles before
        (kv0 = 0 for one tile per program). ``j0``: 0, the first key tile's index for its scores
        (the persistent consumer passes an opaque 0: ``_consumer_persistent``). ``DEFER_Q``: once S_0
        has retired, wait for the previous tile's O store to have read its Q slot and release that
        set (``q_free``, where ``free_prev``): off the tile boundary's path. ``PV_OVERLAP``: the wait
        for P_{j−1}·V_{j−1} held after the softmax of key tile j, so that GEMM runs under it (35 more
        instructions an iteration; ``_consumer``'s d 128 plain calls, where it gains). That kernel
        takes its turns on the mbarriers ``turn``, the others on named barriers (``_wait_turn``):
        named turns lost 1–2% there and gained ~1% elsewhere (H200, ``gluon_checkout-20261129-1838.json``,
        ``-1843.json``)."""
        dtype: gl.constexpr = q.dtype
        OTHER: gl.constexpr = (ME + 1) % CONSUMERS
        DV: gl.constexpr = v_smem.shape[4]  # V's (and O's) width: Q's box width, or v's own (``_launch``)
        if n_tiles > 0:
            # Tile 0: S_0 alone (nothing to overlap it with yet).
            mbarrier.wait(k_ready.index(kv0 % STAGES), (kv0 // STAGES) & 1)
            if PINGPONG:
                _wait_turn(turn, kv0, ME, not PV_OVERLAP)
            s = _qk_slot(q, k_smem, kv0 % STAGES, s_zero, HEAD_DIM, STAGES)
            if PINGPONG:
                _pass_turn(turn, kv0, OTHER, not PV_OVERLAP)
            s = warpgroup_mma_wait(0, deps=[s])
            mbarrier.arrive(k_empty.index(kv0 % STAGES))
            if DEFER_Q:
                tma.store_wait(0)
                mbarrier.arrive(q_free, pred=free_prev)
            s, fold, r = _scores(s, j0, lo, rows, cols_f, n_k, off, win_left, win_right, mid_lo, mid_hi,
                                 qk_scale, softcap_scale, softcap2, slope,
                                 CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, BLOCK_N, s_layout)
            m_i, l_i, p, alpha = _softmax(s, m_i, l_i, fold, r, ALIBI and CAUSAL)
            p = _as_operand(p, p_layout, dtype)

        if PV_OVERLAP:
            fence_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        for j in range(1, n_tiles):
            c = kv0 + j
            cur = c % STAGES
            prev = (c - 1) % V_STAGES
            mbarrier.wait(k_ready.index(cur), (c // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((c - 1) // V_STAGES) & 1)
            if PINGPONG:  # my turn to issue GEMMs: the other warpgroup is in its softmax
                _wait_turn(turn, c, ME, not PV_OVERLAP)
            s = _qk_slot(q, k_smem, cur, s_zero, HEAD_DIM, STAGES)
            acc = warpgroup_mma(p, v_smem.index(prev).reshape([BLOCK_N, DV]), acc, is_async=True)
            if PINGPONG:
                _pass_turn(turn, c, OTHER, not PV_OVERLAP)
            # S_j has retired once at most one group (P_{j-1}·V_{j-1}) is still in flight.
            s = warpgroup_mma_wait(1, deps=[s])
            mbarrier.arrive(k_empty.index(cur))  # K_j is no longer read: the loader may refill it
            s, fold, r = _scores(s, j, lo, rows, cols_f, n_k, off, win_left, win_right, mid_lo, mid_hi,
                                 qk_scale, softcap_scale, softcap2, slope,
                                 CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, BLOCK_N, s_layout)
            m_i, l_i, p_next, alpha = _softmax(s, m_i, l_i, fold, r, ALIBI and CAUSAL)
            if PV_OVERLAP:
                # ptxas places the new P in the registers the in-flight P·V reads, and would hoist
                # this wait above the whole softmax; it does not move it above a shared-memory store,
                # and this one needs every exp2 of the tile. P becomes an operand after the wait.
                fence_smem.store(l_i)
            else:
                p_next = _as_operand(p_next, p_layout, dtype)
            acc, p = warpgroup_mma_wait(0, deps=[acc, p])
            mbarrier.arrive(v_empty.index(prev))  # nor V_{j-1}
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            if PV_OVERLAP:
                p_next = _as_operand(p_next, p_layout, dtype)
            p = p_next

        if n_tiles > 0:
            last = (kv0 + n_tiles - 1) % V_STAGES
            mbarrier.wait(v_ready.index(last), ((kv0 + n_tiles - 1) // V_STAGES) & 1)
            acc = warpgroup_mma(p, v_smem.index(last).reshape([BLOCK_N, DV]), acc, is_async=True)
            acc, p = warpgroup_mma_wait(0, deps=[acc, p])
            mbarrier.arrive(v_empty.index(last))
        return m_i, l_i, acc

    @gluon.jit
    def _finish(acc, m_i, l_i, sinks, h, SINKS: gl.constexpr, o_layout: gl.constexpr, row_layout: gl.constexpr):
        """(O unnormalised, 1/ℓ, lse) of a consumer's rows: the sink term added (``SINKS``); an empty
        row gives 1/ℓ = 0 (O = 0) and lse = −inf."""
        if SINKS:  # one more term exp(sink) in the denominator, with no value (in the lse too)
            # ``add_sink`` scales acc by the rows' factor: it takes the rows in acc's layout.
            o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
            sink = gl.load(sinks + h).to(gl.float32) * 1.4426950408889634
            m_o, l_o, acc = add_sink(gl.convert_layout(m_i, o_rows), gl.convert_layout(l_i, o_rows), acc, sink)
            m_i = gl.convert_layout(m_o, row_layout)
            l_i = gl.convert_layout(l_o, row_layout)
        # O = acc / ℓ, lse = ln 2 · (m + log2 ℓ); an empty row gives O = 0, lse = −inf.
        empty_row = l_i == 0.0
        inv_l = gl.where(empty_row, 0.0, 1.0 / gl.where(empty_row, 1.0, l_i))
        lse_row = gl.where(empty_row, float("-inf"),
                           (m_i + gl.log2(gl.where(empty_row, 1.0, l_i))) * 0.6931471805599453)
        return acc, inv_l, lse_row

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                  bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi, qk_scale,
                  softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                  ME: gl.constexpr, CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, CAUSAL: gl.constexpr,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                  SINKS: gl.constexpr, FAST_TANH: gl.constexpr,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  o=None, stride_om=None, q0=0, SEQ: gl.constexpr = 0, D_REAL: gl.constexpr = 0):
        """One consumer warpgroup: query rows [start_m + 64·ME, +64) against every loaded key tile
        (``_attend``), then O and the lse out.

        The scores are the portable kernels' (scale, softcap, ALiBi, masks: ``_scores``), with the
        softmax's positive factor folded into the exp2's FMA even under ALiBi: its bias is
        subtracted divided by that factor (``slope``), where the portable kernels add it to the
        base-2 score (the same score up to float32 rounding; no multiply per score).

        Ranges and varlen (``SEQ``): rows, ``n_q``, ``n_k`` and ``off`` are the sequence's; ``lse`` and
        ``o`` point at its first row (of head h), ``q0`` is that row in the tensor (batch row ``b``
        for ranges, the one batch row 0 for varlen).
        A full tile of rows goes out by TMA as for a dense batch, a tile crossing the sequence's end
        by a masked store (a TMA store would overwrite the next sequence's rows), which keeps to o's
        ``D_REAL`` columns where the kernel runs a padded head dim (``padded_head_dim``; 0: none)."""
        dtype: gl.constexpr = q_smem.dtype
        DV: gl.constexpr = v_smem.shape[4]  # V's and O's width: Q's box width, or v's own (``_launch``)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DV, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        row0 = start_m + 64 * ME
        rows = row0 + gl.arange(0, 64, layout=row_layout)
        q = q_smem.index(ME).reshape([64, q_smem.shape[4]])
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.full([64], 0.0, gl.float32, layout=row_layout)
        acc = gl.zeros([64, DV], gl.float32, layout=o_layout)
        p = gl.zeros([64, BLOCK_N], dtype, layout=p_layout)
        s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
        slope = 0.0
        cols_f = 0.0
        if ALIBI:
            slope, cols_f = _alibi_slope(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2, SOFTCAP,
                                         BLOCK_N, s_layout)
        # P·V under the next tile's softmax: plain calls in 128-wide boxes, where it gains at d 128
        # (``_attend``). Keyed on the boxes, not on Q·Kᵀ's width (``HEAD_DIM``: 64 at 64 / 128).
        PV_OVERLAP: gl.constexpr = ((q_smem.shape[4] == 128) and (DV == 128) and (CONSUMERS == 2) and (not SOFTCAP)
                                    and (not ALIBI))
        if PINGPONG and (not PV_OVERLAP) and ME == CONSUMERS - 1:
            _pass_turn(turn, n_tiles, 0, True)  # consumer 0 issues first
        mbarrier.wait(q_bar, 0)
        m_i, l_i, acc = _attend(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, 0, rows, cols_f, slope,
                                m_i, l_i, acc, p, s_zero, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                qk_scale, softcap_scale, softcap2,
                                ME, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                                HEAD_DIM, BLOCK_N, STAGES, STAGES, s_layout, o_layout, p_layout,
                                PV_OVERLAP=PV_OVERLAP)
        acc, inv_l, lse_row = _finish(acc, m_i, l_i, sinks, h, SINKS, o_layout, row_layout)
        if SEQ == 0:
            gl.store(lse + bh.to(gl.int64) * n_q + rows, lse_row, mask=rows < n_q)
        else:
            gl.store(lse + rows, lse_row, mask=rows < n_q)
        out = acc * gl.expand_dims(gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout)), 1)
        # Q's slot is free once its last wgmma retired (above): O is staged there (as o's TMA boxes where
        # V's width is not Q's: a part of the slot).
        o_smem = q_smem.index(ME)
        if DV != q_smem.shape[4]:
            o_smem = o_smem._reinterpret(dtype, o_desc.block_type.shape, o_desc.layout)
        if SEQ == 0:
            # One TMA store, which drops the rows past Nq.
            o_smem.reshape([64, DV]).store(out.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], o_smem)
            tma.store_wait(0)
        else:
            # With ALiBi every tile takes the masked store: the TMA store's coordinates (two more
            # registers held through the loop) spill ALiBi's consumers (triton 3.6, sm_90).
            if (row0 + 64 <= n_q) and not ALIBI:
                o_smem.reshape([64, DV]).store(out.to(dtype))
                fence_async_shared()
                tb = b  # ranges: the batch row; varlen: the tensors' one batch row
                if SEQ == 2:
                    tb = 0
                tma.async_copy_shared_to_global(o_desc, [tb, h, q0 + row0, 0], o_smem)
                tma.store_wait(0)
            else:
                out_rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
                out_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
                ptrs = o + gl.expand_dims(out_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(out_cols, 0)
                if D_REAL == 0:
                    gl.store(ptrs, out.to(dtype), mask=gl.expand_dims(out_rows < n_q, 1))
                else:
                    gl.store(ptrs, out.to(dtype),
                             mask=gl.expand_dims(out_rows < n_q, 1) & gl.expand_dims(out_cols < D_REAL, 0))

    @gluon.jit
    def _consumer_persistent(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                             o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right, qk_scale, softcap_scale,
                             softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                             ME: gl.constexpr, CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr,
                             CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                             SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, SINKS: gl.constexpr,
                             FAST_TANH: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                             STAGES: gl.constexpr, V_STAGES: gl.constexpr, Q_SETS: gl.constexpr,
                             SORTED_TAIL: gl.constexpr):
        """One consumer warpgroup of a persistent program: ``_consumer``'s work (dense batch) for each
        of the program's tiles (``persistent_tile``), the ring and the turns continued over the program
        (``kv``: K/V tiles taken so far, the same count in every partition), Q's set and phase by
        the program's tile count ``qi``. O is staged in the tile's Q slot and stored by TMA; once
        the store has read it the consumer releases the set (``q_empty``) for the loader: with one
        set at once, with two inside the next tile, after its S_0 (``_attend``'s ``DEFER_Q``), so
        the wait for the store is not on the tile boundary's path."""
        dtype: gl.constexpr = q_smem.dtype
        DV: gl.constexpr = v_smem.shape[4]  # V's and O's width: Q's box width, or v's own (``_launch``)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DV, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        off = n_k - n_q
        kv = 0
        qi = 0
        if PINGPONG and ME == CONSUMERS - 1:
            _pass_turn(turn, n_bh, 0, True)  # consumer 0 issues first
        for j in range(persistent_count(gl.program_id(0), gl.num_programs(0), n_bh, gl.cdiv(n_q, BLOCK_M), CAUSAL,
                                        SORTED_TAIL)):
            bh, b, h, start_m, lo, n_tiles, mid_lo, mid_hi = persistent_tile(j, n_bh, n_heads, n_q, n_k, win_left,
                                                                             win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                                                             BLOCK_M, BLOCK_N, SORTED_TAIL)
            row0 = start_m + 64 * ME
            rows = row0 + gl.arange(0, 64, layout=row_layout)
            qs = qi % Q_SETS
            q_slot = q_smem.index(qs * CONSUMERS + ME)
            m_i = gl.full([64], float("-inf"), gl.float32, layout=row_layout)
            l_i = gl.full([64], 0.0, gl.float32, layout=row_layout)
            acc = gl.zeros([64, DV], gl.float32, layout=o_layout)
            p = gl.zeros([64, BLOCK_N], dtype, layout=p_layout)
            s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
            slope = 0.0
            cols_f = 0.0
            if ALIBI:
                slope, cols_f = _alibi_slope(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2,
                                             SOFTCAP, BLOCK_N, s_layout)
            # The first key tile's masks (key 0: ``cols < n_k``, the column offsets) are the same in
            # every query tile: with a literal 0 the compiler hoists them out of the tile loop, a
            # register per column held through it (400 bytes of spills at d 64); an opaque 0 keeps
            # them inside.
            j0 = _opaque_zero(j)
            mbarrier.wait(q_ready.index(qs), (qi // Q_SETS) & 1)
            # Two Q sets: the previous tile's set is released in this tile, once S_0 has retired
            # (``DEFER_Q``), or here for a tile without key tiles.
            prev_set = q_empty.index((qi + 1) % Q_SETS)
            q_tile = q_slot.reshape([64, q_smem.shape[4]])
            m_i, l_i, acc = _attend(q_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                                    turn, kv, rows, cols_f, slope, m_i, l_i, acc, p, s_zero, n_k, off, win_left,
                                    win_right, lo, n_tiles, mid_lo, mid_hi, qk_scale, softcap_scale, softcap2,
                                    ME, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                                    HEAD_DIM, BLOCK_N, STAGES, V_STAGES, s_layout, o_layout, p_layout, j0,
                                    prev_set, qi > 0, Q_SETS == 2)
            acc, inv_l, lse_row = _finish(acc, m_i, l_i, sinks, h, SINKS, o_layout, row_layout)
            out = acc * gl.expand_dims(gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout)), 1)
            if Q_SETS == 2:
                tma.store_wait(0)
                mbarrier.arrive(prev_set, pred=(qi > 0) & (n_tiles == 0))
            # The slot's last wgmma has retired (``_attend``): stage O there for one TMA store
            # (which drops the rows past Nq); the lse goes out while it runs.
            o_slot = q_slot
            if DV != q_smem.shape[4]:  # O as o's TMA boxes: a part of the slot
                o_slot = q_slot._reinterpret(dtype, o_desc.block_type.shape, o_desc.layout)
            o_slot.reshape([64, DV]).store(out.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], o_slot)
            gl.store(lse + bh.to(gl.int64) * n_q + rows, lse_row, mask=rows < n_q)
            if Q_SETS == 1:  # the loader reloads this set next: release it as soon as the store read it
                tma.store_wait(0)
                mbarrier.arrive(q_empty.index(qs))
            kv += n_tiles
            qi += 1
        tma.store_wait(0)  # the last O store has read its slot before the program ends

    # ---- Ranges and varlen batches on the persistent schedule: a work queue. A static deal of a packed batch's
    # tiles cannot balance them as the GPU's block scheduler does the one-tile grid (tile costs vary
    # with every sequence's length; 22 mixed sequences on 132 programs: the most loaded program 17%
    # over the mean dealt round-robin in the queue's order, 5% taken greedily in a model that prices a
    # tile by its key tiles: tests/test_attention_gluon_persistent.py).
    # The loader takes the next tile from a counter (``_next_unit``), maps it and hands its
    # coordinates to the consumers with its Q (``_put_tile``, ``_take_tile``); after the last tile it
    # hands them a -1.

    @gluon.jit
    def _next_unit(work, lanes):
        """The next unit of the queue ``work`` (an int32 counter, 0 at launch): lane 0 of the loader's
        warp adds 1; every lane reads the old count (a shuffle, no shared memory)."""
        old = gl.atomic_add(work + lanes * 0, gl.full(lanes.shape, 1, gl.int32, lanes.type.layout), mask=lanes == 0)
        return gl.sum(gl.where(lanes == 0, old, 0), axis=0)

    @gluon.jit
    def _put_tile(meta, qs, fields, t, h, b, start_m, q0, n_q, n_k):
        """Tile t's coordinates into Q set qs's slot of ``meta`` (before its Q's barrier arrival, whose
        release orders them for the consumers' wait)."""
        vals = gl.where(fields == 0, t, gl.where(fields == 1, h, gl.where(fields == 2, b, gl.where(
            fields == 3, start_m, gl.where(fields == 4, q0, gl.where(fields == 5, n_q, n_k))))))
        meta.index(qs).store(vals)

    @gluon.jit
    def _take_tile(meta, qs, layout: gl.constexpr):
        """(t, h, b, start_m, q0, n_q, n_k) of the tile in Q set qs (``_put_tile``; t = -1: no more),
        every thread reading all eight fields (the sums stay in the thread)."""
        fields = gl.arange(0, 8, layout=layout)
        vals = meta.index(qs).load(layout)
        return (gl.sum(gl.where(fields == 0, vals, 0), axis=0), gl.sum(gl.where(fields == 1, vals, 0), axis=0),
                gl.sum(gl.where(fields == 2, vals, 0), axis=0), gl.sum(gl.where(fields == 3, vals, 0), axis=0),
                gl.sum(gl.where(fields == 4, vals, 0), axis=0), gl.sum(gl.where(fields == 5, vals, 0), axis=0),
                gl.sum(gl.where(fields == 6, vals, 0), axis=0))

    @gluon.jit
    def _loader_queue(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                      v_empty, meta, work, q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq,
                      n_heads, group, n_q, n_k, win_left, win_right, CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr,
                      HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      V_STAGES: gl.constexpr, Q_SETS: gl.constexpr, SEQ: gl.constexpr):
        """The loader warp of a persistent program over a packed varlen batch or per-row ranges
        (``SEQ``): while the queue has units (the query tiles of every head of every sequence or
        range, sequence by sequence, in ``queue_tile``'s order: no empty slot, no tile past a range's
        end), maps the next (``scan_from``, ``queue_tile``, ``sequence``), loads its Q and K/V tiles as
        ``_loader_persistent`` does (rows from the sequence's first query and key, in batch row 0 of a
        varlen batch's tensors, row b of ranges'), and puts its coordinates in its Q set's slot of
        ``meta``; then puts t = -1 there."""
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        lanes = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
        fields = gl.arange(0, 8, layout=gl.BlockedLayout([8], [32], [1], [0]))
        units = varlen_tile_count(q_starts, q_ends, n_seq, n_q, lanes, BLOCK_M, stride_seq) * n_heads
        kv = 0
        qi = 0
        place = 0  # the scan's place (``scan_from``): this program's units only increase
        seen = 0
        t = _next_unit(work, lanes)
        while t < units:
            b, u, n_b, place, seen = scan_from(q_starts, q_ends, n_seq, n_q, t, lanes, BLOCK_M, stride_seq, place, seen,
                                               n_heads)
            h, start_m = queue_tile(u, n_b, group, BLOCK_M)
            q0, seq_q, k0, seq_k, off = sequence(b, n_q, n_k, q_starts, q_ends, k_starts, k_ends, stride_seq, 0, SEQ)
            tb = b  # the tensors' batch row: ranges' b, a varlen batch's 0
            if SEQ == 2:
                tb = 0
            lo, n_tiles, _, _ = key_tiles(start_m, seq_k, off, win_left, win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                          BLOCK_M, BLOCK_N)
            h_kv = h // group
            qs = qi % Q_SETS
            first = 0
            if Q_SETS == 1:  # (``_loader_persistent``: the first K/V tiles before Q, else a deadlock)
                FIRST: gl.constexpr = STAGES if STAGES < V_STAGES else V_STAGES
                first = gl.minimum(n_tiles, FIRST)
                _load_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv, 0, first, tb,
                               h_kv, lo, HAS_LEFT, BLOCK_N, STAGES, V_STAGES, k0, SEQ)
            mbarrier.wait(q_empty.index(qs), ((qi // Q_SETS) & 1) ^ 1)  # a fresh barrier: no wait
            _put_tile(meta, qs, fields, t, h, b, start_m, q0, seq_q, seq_k)
            mbarrier.expect(q_ready.index(qs), CONSUMERS * q_desc.block_type.nbytes)
            for c in gl.static_range(CONSUMERS):
                tma.async_copy_global_to_shared(q_desc, [tb, h, q0 + start_m + 64 * c, 0], q_ready.index(qs),
                                                q_smem.index(qs * CONSUMERS + c))
            _load_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv, first, n_tiles, tb,
                           h_kv, lo, HAS_LEFT, BLOCK_N, STAGES, V_STAGES, k0, SEQ)
            kv += n_tiles
            qi += 1
            t = _next_unit(work, lanes)
        qs = qi % Q_SETS
        mbarrier.wait(q_empty.index(qs), ((qi // Q_SETS) & 1) ^ 1)
        _put_tile(meta, qs, fields, -1, 0, 0, 0, 0, 0, 0)
        mbarrier.arrive(q_ready.index(qs))

    @gluon.jit
    def _consumer_queue(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn, meta,
                        o_desc, lse, o, stride_oh, stride_om, n_heads, n_q, win_left, win_right, qk_scale,
                        softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                        ME: gl.constexpr, CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, CAUSAL: gl.constexpr,
                        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                        SINKS: gl.constexpr, FAST_TANH: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, V_STAGES: gl.constexpr, Q_SETS: gl.constexpr, D_REAL: gl.constexpr,
                        SEQ: gl.constexpr):
        """One consumer warpgroup of a persistent program over a packed varlen batch or per-row
        ranges (``SEQ``): ``_consumer_persistent``'s tile loop over the tiles the loader hands over
        (``_take_tile``, after the wait for their Q), until t = -1; each tile's rows, lengths and
        diagonal its sequence's, O stored as ``_consumer`` stores such a tile (one crossing the
        sequence's end by a masked store, o's ``D_REAL`` columns), lse by a masked store (lse and o
        hold the (batch row, head) planes of ``output_buffers``: (1, Hq) for varlen, (B, Hq) for
        ranges)."""
        dtype: gl.constexpr = q_smem.dtype
        DV: gl.constexpr = v_smem.shape[4]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DV, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        meta_layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        kv = 0
        qi = 0
        if PINGPONG and ME == CONSUMERS - 1:
            _pass_turn(turn, n_q, 0, True)  # consumer 0 issues first
        mbarrier.wait(q_ready.index(0), 0)
        t, h, b, start_m, q0, seq_q, seq_k = _take_tile(meta, 0, meta_layout)
        while t >= 0:
            qs = qi % Q_SETS
            tb = b  # the tensors' batch row (``_loader_queue``) and the (row, head) plane of o and lse
            if SEQ == 2:
                tb = 0
            bh = tb * n_heads + h
            off = seq_k - seq_q
            lo, n_tiles, mid_lo, mid_hi = key_tiles(start_m, seq_k, off, win_left, win_right, CAUSAL, HAS_LEFT,
                                                    HAS_RIGHT, BLOCK_M, BLOCK_N)
            row0 = start_m + 64 * ME
            rows = row0 + gl.arange(0, 64, layout=row_layout)
            q_slot = q_smem.index(qs * CONSUMERS + ME)
            m_i = gl.full([64], float("-inf"), gl.float32, layout=row_layout)
            l_i = gl.full([64], 0.0, gl.float32, layout=row_layout)
            acc = gl.zeros([64, DV], gl.float32, layout=o_layout)
            p = gl.zeros([64, BLOCK_N], dtype, layout=p_layout)
            s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
            slope = 0.0
            cols_f = 0.0
            if ALIBI:
                slope, cols_f = _alibi_slope(alibi, b, h, stride_alibi_b, stride_alibi_h, qk_scale, softcap2,
                                             SOFTCAP, BLOCK_N, s_layout)
            j0 = _opaque_zero(qi)  # (``_consumer_persistent``: the first key tile's masks stay in the loop)
            prev_set = q_empty.index((qi + 1) % Q_SETS)
            q_tile = q_slot.reshape([64, q_smem.shape[4]])
            m_i, l_i, acc = _attend(q_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                                    turn, kv, rows, cols_f, slope, m_i, l_i, acc, p, s_zero, seq_k, off, win_left,
                                    win_right, lo, n_tiles, mid_lo, mid_hi, qk_scale, softcap_scale, softcap2,
                                    ME, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH,
                                    HEAD_DIM, BLOCK_N, STAGES, V_STAGES, s_layout, o_layout, p_layout, j0,
                                    prev_set, qi > 0, Q_SETS == 2)
            acc, inv_l, lse_row = _finish(acc, m_i, l_i, sinks, h, SINKS, o_layout, row_layout)
            out = acc * gl.expand_dims(gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout)), 1)
            if Q_SETS == 2:
                tma.store_wait(0)
                mbarrier.arrive(prev_set, pred=(qi > 0) & (n_tiles == 0))
            if row0 + 64 <= seq_q:  # staged in the Q slot (its last wgmma retired), one TMA store
                o_slot = q_slot
                if DV != q_smem.shape[4]:
                    o_slot = q_slot._reinterpret(dtype, o_desc.block_type.shape, o_desc.layout)
                o_slot.reshape([64, DV]).store(out.to(dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(o_desc, [tb, h, q0 + row0, 0], o_slot)
            else:  # a TMA store would overwrite the next sequence's rows
                out_rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
                out_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
                ptrs = (o + bh.to(gl.int64) * stride_oh + gl.expand_dims((q0 + out_rows).to(gl.int64) * stride_om, 1)
                        + gl.expand_dims(out_cols, 0))
                keep = gl.expand_dims(out_rows < seq_q, 1)
                if D_REAL != 0:
                    keep = keep & gl.expand_dims(out_cols < D_REAL, 0)
                gl.store(ptrs, out.to(dtype), mask=keep)
            gl.store(lse + bh.to(gl.int64) * n_q + q0 + rows, lse_row, mask=rows < seq_q)
            if Q_SETS == 1:  # the loader reloads this set next: release it once the store read it
                tma.store_wait(0)
                mbarrier.arrive(q_empty.index(qs))
            kv += n_tiles
            qi += 1
            qs = qi % Q_SETS
            mbarrier.wait(q_ready.index(qs), (qi // Q_SETS) & 1)
            t, h, b, start_m, q0, seq_q, seq_k = _take_tile(meta, qs, meta_layout)
        tma.store_wait(0)  # the last O store has read its slot before the program ends

    # Lengths, the GQA group and the head count change from call to call: one binary for all of them.
    # Window sides too (a side the call does not have is None: a constexpr, no parameter).
    # Ranges / varlen: the sequences' bounds, their count and the output's strides (None for a dense
    # batch: constexprs, no parameters); ``work``: a persistent ranges or varlen launch's queue (else None).
    @gluon.jit(do_not_specialize=["n_q", "n_k", "group", "n_heads", "win_left", "win_right", "n_seq"])
    def _attn_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, lse, sinks, alibi, stride_alibi_b, stride_alibi_h,
                               n_heads, group, n_q, n_k, win_left, win_right, qk_scale, softcap_scale, softcap2,
                               q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, o, stride_oh, stride_om, work,
                               HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
                               HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                               ALIBI: gl.constexpr, SINKS: gl.constexpr, FAST_TANH: gl.constexpr,
                               CONSUMERS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                               PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                               LOADER_REGS: gl.constexpr, SEQ: gl.constexpr = 0,
                               PERSISTENT: gl.constexpr = False, Q_SETS: gl.constexpr = 1,
                               V_STAGES: gl.constexpr = 0, D_REAL: gl.constexpr = 0, K_CHUNKS: gl.constexpr = 1):
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        if PERSISTENT:
            # One program per SM (``_launch``). Dense: each takes units pid, pid + programs, … of the
            # (B·Hq) × query-tile space (``persistent_units``, ``persistent_tile``), every partition
            # walking the same tiles and computing their coordinates itself. Ranges and varlen: the
            # loader takes them from a queue and hands them over (``_loader_queue``).
            #
            # Barrier invariants across tiles. Waits test a phase's parity, so a barrier must never
            # run two phases ahead of a waiter: every fill waits for the release of the previous
            # use of its buffer, and every release follows the wait for that use's fill.
            # * K/V rings: the k-th K/V tile of the program (k counted over all its tiles: ``kv``)
            #   goes to K slot k % STAGES and V slot k % V_STAGES (the same formulas below with
            #   V_STAGES for V); k_ready/v_ready complete once per fill, awaited with
            #   parity (k // STAGES) & 1; k_empty/v_empty (CONSUMERS arrivals) once per use, the
            #   loader awaiting use k − STAGES's with the opposite parity. All consumers take every
            #   K/V tile of every tile (a tile's n_tiles is the same for all), so k is the same
            #   count in every partition.
            # * Turns (ping-pong, named barriers): consumer ME waits on its barrier once per K/V
            #   tile, then arrives on the next consumer's; the last consumer arrives on consumer 0's
            #   once at its start. The order runs on unbroken across tiles. A barrier never gets a
            #   second arrival before its waiter took the first: consumer c's (k+1)-th arrival
            #   follows its k-th wait, which follows the k-th arrival of the one before it, which
            #   follows that one's own k-th wait. (The ``turn`` mbarriers are the one-tile
            #   ``PV_OVERLAP`` kernel's; here ``_attend`` takes them as an argument only. Without
            #   them triton puts the inits' closing bar.sync in consumer 0's tile loop, and d 128
            #   causal measured 0.2–2% slower: NOTES 2026-11-29 20:21, 20:28.)
            # * Q: the program's i-th tile uses set i % Q_SETS; q_ready completes once per load,
            #   awaited with parity (i // Q_SETS) & 1; q_empty (CONSUMERS arrivals, each after its
            #   O store has read the set) once per use, the loader awaiting tile i − Q_SETS's with
            #   the opposite parity. With two sets a consumer releases tile i's set in tile i + 1,
            #   once that tile's S_0 has retired (its store's wait off the tile boundary), or at
            #   tile i + 1's end if it has no key tiles; the program's last store is awaited last.
            # No deadlock: a load waits only for releases of earlier tiles (K/V tile k for the
            # release of k − STAGES, Q for tile i − Q_SETS's epilogue), except the K/V loads of
            # tile i past its first STAGES, which need tile i's consumers, hence its Q: issued
            # before them (``_loader_persistent``). tests/test_attention_gluon_persistent.py
            # models this bookkeeping.
            n_bh = q_desc.shape[0] * n_heads
            dtype: gl.constexpr = q_desc.dtype
            q_smem = gl.allocate_shared_memory(dtype, [Q_SETS * CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
            k_smem = gl.allocate_shared_memory(dtype, [STAGES * K_CHUNKS] + k_desc.block_type.shape, k_desc.layout)
            v_smem = gl.allocate_shared_memory(dtype, [V_STAGES] + v_desc.block_type.shape, v_desc.layout)
            q_ready = gl.allocate_shared_memory(gl.int64, [Q_SETS, 1], mbarrier.MBarrierLayout())
            q_empty = gl.allocate_shared_memory(gl.int64, [Q_SETS, 1], mbarrier.MBarrierLayout())
            k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
            k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
            turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(Q_SETS):
                mbarrier.init(q_ready.index(i), count=1)
                mbarrier.init(q_empty.index(i), count=CONSUMERS)
            # One loop in the order the barriers were always set up, so equal depths compile as before.
            RING: gl.constexpr = STAGES if STAGES > V_STAGES else V_STAGES
            for s in gl.static_range(RING):
                if s < STAGES:
                    mbarrier.init(k_ready.index(s), count=1)
                if s < V_STAGES:
                    mbarrier.init(v_ready.index(s), count=1)
                if s < STAGES:
                    mbarrier.init(k_empty.index(s), count=CONSUMERS)
                if s < V_STAGES:
                    mbarrier.init(v_empty.index(s), count=CONSUMERS)
            for c in gl.static_range(CONSUMERS):
                mbarrier.init(turn.index(c), count=1)
            fence_async_shared()
            # D 64's causal launches end with a sorted tail (``sorted_tail_slot``): +1.2 to +2.0% at
            # 2k / 4k in two A/Bs, where d 128's lost 0 to 2% with it, and 2 to 3% with a window's
            # left side, whose tiles' costs are not the triangle the sort assumes (H200,
            # ``gluon_checkout-20261129-2156.json``, ``-2203.json``).
            SORTED_TAIL: gl.constexpr = q_smem.shape[4] == 64 and not HAS_LEFT  # (the boxes' width: d 64's)
            if SEQ != 0:
                # A varlen batch or per-row ranges: the tiles from the queue ``work``, handed over in
                # ``meta`` (one slot of eight fields a Q set: ``_put_tile``).
                meta = gl.allocate_shared_memory(gl.int32, [Q_SETS, 8], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
                if CONSUMERS == 1:
                    gl.warp_specialize([
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_loader_queue, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, meta, work, q_starts, q_ends,
                                          k_starts, k_ends, stride_seq, n_seq, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES, V_STAGES,
                                          Q_SETS, SEQ)),
                    ], [1], [LOADER_REGS])
                elif CONSUMERS == 2:
                    gl.warp_specialize([
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_loader_queue, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, meta, work, q_starts, q_ends,
                                          k_starts, k_ends, stride_seq, n_seq, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES, V_STAGES,
                                          Q_SETS, SEQ)),
                    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
                else:
                    gl.warp_specialize([
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_consumer_queue, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, meta, o_desc, lse, o, stride_oh, stride_om, n_heads, n_q,
                                            win_left, win_right, qk_scale, softcap_scale, softcap2, sinks, alibi,
                                            stride_alibi_b, stride_alibi_h, 2, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT,
                                            HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES,
                                            V_STAGES, Q_SETS, D_REAL, SEQ)),
                        (_loader_queue, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, meta, work, q_starts, q_ends,
                                          k_starts, k_ends, stride_seq, n_seq, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES, V_STAGES,
                                          Q_SETS, SEQ)),
                    ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
            elif CONSUMERS == 1:
                gl.warp_specialize([
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, n_bh, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES,
                                          V_STAGES, Q_SETS, SORTED_TAIL)),
                ], [1], [LOADER_REGS])
            elif CONSUMERS == 2:
                gl.warp_specialize([
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, n_bh, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES,
                                          V_STAGES, Q_SETS, SORTED_TAIL)),
                ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_consumer_persistent, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                            v_empty, turn, o_desc, lse, n_bh, n_heads, n_q, n_k, win_left, win_right,
                                            qk_scale, softcap_scale, softcap2, sinks, alibi, stride_alibi_b,
                                            stride_alibi_h, 2, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                            SOFTCAP, ALIBI, SINKS, FAST_TANH, HEAD_DIM, BLOCK_N, STAGES, V_STAGES,
                                            Q_SETS, SORTED_TAIL)),
                    (_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                          v_ready, k_empty, v_empty, n_bh, n_heads, group, n_q, n_k, win_left,
                                          win_right, CONSUMERS, CAUSAL, HAS_LEFT, HAS_RIGHT, BLOCK_N, STAGES,
                                          V_STAGES, Q_SETS, SORTED_TAIL)),
                ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
        else:
            if SEQ == 2:
                # Varlen: (heads, tile slots) in one dim (``varlen_slot``), the slots sized from the totals
                # and mapped to (sequence, query tile) by a scan of cu_seqlens, each sequence's last tile
                # first (the portable kernel's ``varlen_tile``); a slot past the last tile is an empty
                # program.
                h, slot = varlen_slot(gl.program_id(0), gl.num_programs(0), n_heads)
                lanes = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
                b, start_m = varlen_scan(q_starts, q_ends, n_seq, n_q, slot, lanes, BLOCK_M)
                live = b < n_seq
                b = gl.minimum(b, n_seq - 1)
                bh = h  # the lse is (Hq, total): one plane for every sequence
                tb = 0  # the tensors' one batch row
            else:
                # Grid (query tiles · B·Hq), one head's tiles consecutive, its last (under causal,
                # heaviest) first: the programs running at once share their heads' K/V in L2. (With
                # bh fastest they spanned ~64 heads, 256 MB of K/V at 8k: 20% L2 hits, the DRAM at 86%
                # of its bandwidth, 1–48% slower: benchmarks/NOTES.md, 2026-11-24 23:52.)
                n_m = gl.cdiv(n_q, BLOCK_M)
                bh = gl.program_id(0) // n_m
                start_m = (n_m - 1 - gl.program_id(0) % n_m) * BLOCK_M
                b = bh // n_heads
                h = bh % n_heads
                tb = b
            h_kv = h // group

            # Key tiles [lo, lo + n_tiles·BLOCK_N) are loaded; outside [mid_lo, mid_hi) they are masked.
            off = n_k - n_q
            q0 = 0
            k0 = 0
            if SEQ != 0:
                # The sequence's rows and lengths, its diagonal bottom-right aligned (``sequence``); a
                # tile past its end (ranges) or an empty slot (varlen) loads no key and stores nothing.
                q0, n_q_seq, k0, n_k_seq, off = sequence(b, n_q, n_k, q_starts, q_ends, k_starts, k_ends,
                                                         stride_seq, off, SEQ)
                if SEQ == 2:
                    n_q_seq = gl.where(live, n_q_seq, 0)
                n_k_seq = gl.where(start_m < n_q_seq, n_k_seq, 0)
                lse = lse + bh.to(gl.int64) * n_q + q0
                o = o + bh.to(gl.int64) * stride_oh + q0.to(gl.int64) * stride_om
                n_q = n_q_seq
                n_k = n_k_seq
            lo, n_tiles, mid_lo, mid_hi = key_tiles(start_m, n_k, off, win_left, win_right, CAUSAL, HAS_LEFT, HAS_RIGHT,
                                                    BLOCK_M, BLOCK_N)

            dtype: gl.constexpr = q_desc.dtype
            q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
            k_smem = gl.allocate_shared_memory(dtype, [STAGES * K_CHUNKS] + k_desc.block_type.shape, k_desc.layout)
            v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
            q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
            mbarrier.init(q_bar, count=1)
            for s in gl.static_range(STAGES):
                mbarrier.init(k_ready.index(s), count=1)
                mbarrier.init(v_ready.index(s), count=1)
                mbarrier.init(k_empty.index(s), count=CONSUMERS)
                mbarrier.init(v_empty.index(s), count=CONSUMERS)
            for c in gl.static_range(CONSUMERS):
                mbarrier.init(turn.index(c), count=1)
            if PINGPONG:
                mbarrier.arrive(turn.index(0))  # consumer 0 issues first (PV_OVERLAP's mbarrier turns)
            fence_async_shared()

            # (The partitions' argument tuples are written out: Gluon takes no function values in
            # variables, and a tuple held in a variable turns its constexprs into tensors (tried).)
            # Consumer 0 is the default partition; the others and the loader are workers.
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                               v_empty, tb, h, h_kv, start_m, lo, n_tiles, CONSUMERS, BLOCK_N, STAGES, HAS_LEFT, q0,
                               k0, SEQ)),
                ], [1], [LOADER_REGS])
            elif CONSUMERS == 2:
                gl.warp_specialize([
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                               v_empty, tb, h, h_kv, start_m, lo, n_tiles, CONSUMERS, BLOCK_N, STAGES, HAS_LEFT, q0,
                               k0, SEQ)),
                ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 0, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 1, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse,
                                 bh, b, h, start_m, n_q, n_k, off, win_left, win_right, lo, n_tiles, mid_lo, mid_hi,
                                 qk_scale,
                                 softcap_scale, softcap2, sinks, alibi, stride_alibi_b, stride_alibi_h,
                                 2, CONSUMERS, PINGPONG, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, SINKS, FAST_TANH,
                                 HEAD_DIM, BLOCK_N, STAGES, o, stride_om, q0, SEQ, D_REAL)),
                    (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                               v_empty, tb, h, h_kv, start_m, lo, n_tiles, CONSUMERS, BLOCK_N, STAGES, HAS_LEFT, q0,
                               k0, SEQ)),
                ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])

    # Launched through the per-specialization cache: Triton's own launch path binds and keys the
    # kernel's 27 arguments in Python on every call (~0.1 ms of host time).
    _attn_fwd_gluon_launcher = Launcher(_attn_fwd_gluon_kernel)


def _variant_reason(variant) -> str | None:
    """Why this kernel cannot express ``variant`` at all, or None: it takes a sliding window,
    softcap, ALiBi and sinks, over a dense batch, per-row ranges (SEQ_RANGES) or a packed varlen
    batch (SEQ_VARLEN), the bounds int32 tensors as ``attention()``/``attention_varlen`` build
    them (contiguous). (The options' tensors and the window sides' range are checked by
    ``attention_fwd_hopper.supported``.)"""
    if variant is None or variant is PLAIN:
        return None
    if not isinstance(variant, Variant):
        return f"variant is a {type(variant).__name__}, not a Variant"
    if variant.seq not in (SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN):
        return f"batch layout {variant.seq} (dense, ranges or varlen only)"
    if variant.seq != SEQ_DENSE:
        shape = 2 if variant.seq == SEQ_RANGES else 1
        for t in (variant.seq_q, variant.seq_k):
            if not (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == shape
                    and t.is_contiguous() and (shape == 1 or t.shape[1] == 2)):
                return "sequence bounds are not contiguous int32 (B, 2) ranges or (B + 1,) cu_seqlens"
    return None


def _dense(variant):
    """``variant`` with a dense layout: what the TMA kernel's rules (``attention_fwd_hopper.supported``)
    check of a ranges or varlen call's options."""
    if not isinstance(variant, Variant) or variant.seq == SEQ_DENSE:
        return variant
    dense = variant._replace(seq=SEQ_DENSE, seq_q=None, seq_k=None)
    return PLAIN if dense == PLAIN else dense


def supported(q, k, v, **options) -> str | None:
    """None when ``attention_forward_gluon`` covers this call, else the reason in words: the Hopper
    TMA kernel's rules at this kernel's head dims (``attention_fwd_hopper.covered``, ``HEAD_DIMS``:
    d 256 too), as ``attention_fwd_hopper.supported`` applies them (a ``variant`` with a sliding window,
    softcap, ALiBi slopes, sinks; no mask, dropout or unknown option) on the tensors as given (for
    varlen the (1, H, total, D) views), ranges and varlen layouts besides (``_variant_reason``; their
    call's ``causal_offset`` unused), plus a triton whose Gluon this kernel was written for."""
    variant = options.get("variant")
    reason = _variant_reason(variant)
    if reason is not None:
        return reason
    if isinstance(variant, Variant) and variant.seq != SEQ_DENSE:
        # The sequences' diagonals are their own (bottom-right): the call's causal_offset is unused.
        options = {**options, "variant": _dense(variant)}
        options.pop("causal_offset", None)
        if variant.seq_q.device != q.device or variant.seq_k.device != q.device:
            return "sequence bounds are not on q's device"
    if not _HAS_GLUON:
        return "this triton has no Gluon Hopper API (triton.experimental.gluon)"
    if not triton.__version__.startswith(TESTED_TRITON):
        return f"triton {triton.__version__}: the Gluon kernel is written for triton {TESTED_TRITON[0]}x"
    from .attention_fwd_hopper import covered
    if q.dim() == 4 and v.dim() == 4:
        d, dv = q.shape[-1], v.shape[-1]
        padded = padded_head_dim(d, dv)
        dims = f"head dim {d}" if dv == d else f"head dims {d} (q, k) and {dv} (v)"
        if padded is None:
            return (f"{dims} (only {', '.join(map(str, HEAD_DIMS))}, or multiples of 8 between 32 and 256, "
                    f"run padded to the next)")
        out = padded_head_dim(dv)  # o's width in the kernel (``_launch``)
        if out != dv and out > 128 and isinstance(variant, Variant) and variant.seq != SEQ_DENSE:
            # Their sequence-end tiles' masked store, 256 columns kept to dv, spills 300+ bytes.
            return f"{dims} run padded to {padded} over a dense batch only, not per-row ranges or varlen"
    return covered(q, k, v, (q.shape[-1],) if q.dim() == 4 else HEAD_DIMS, options, any_value_dim=True)


# Where the Gluon kernel beats the Triton TMA kernel (``benchmarks/gluon_fwd.py``, H100, bf16, B·N
# 16k, ``gluon_fwd-20261124-235738.json``, its head-major grid): every non-causal point (d 128 at N
# 2k: 612 vs 507 TFLOP/s); causal from N 2k on (d 128 2k: 493 vs 432; d 64 2k with its short-causal
# config: 386 vs 356, ``gluon_fwd-20261125-041948.json``); shorter causal calls, not measured, keep
# the TMA kernel. Calls with softcap, ALiBi or sinks follow the same rule. A sliding-window call
# counts as causal for it whether or not it is causal (``_short``): its programs see a band of keys,
# not all of them, which is what made causal calls short; its length is the call's (max(Nq, Nk)),
# not the window's, so a causal 4k window at 32k is long. Windows are measured at 32k only
# (``flashattn-lite variants``).
# d 256: the TMA kernel does not take it, so the alternative is the portable kernel, 2.8 × slower at
# causal 1k (``gluon_fwd-20261129-091536.json``): every length.
CAUSAL_MIN_N = {64: 2048, 128: 2048, 256: 0}


def _short(causal: bool, variant: Variant, n_q: int, n_k: int, head_dim: int) -> bool:
    """Whether the call is below the Gluon kernel's crossover (``CAUSAL_MIN_N`` at its head dim):
    causal or windowed at max(Nq, Nk) below it. Never for ranges or varlen calls: the TMA kernel
    does not take them, so the alternative is the portable kernel, not the kernel the crossover was
    measured against."""
    if variant.seq != SEQ_DENSE or head_dim not in CAUSAL_MIN_N:  # padded head dims: no TMA kernel either
        return False
    banded = causal or variant.left >= 0 or variant.right >= 0
    return banded and max(n_q, n_k) < CAUSAL_MIN_N.get(head_dim, max(CAUSAL_MIN_N.values()))


def padding_note(head_dim: int | None, value_dim: int | None, padded: int | None,
                 padded_value: int | None = None) -> str:
    """`` (head dim 96 run at 128, …)`` where the kernels run a call padded (``padded_head_dim``),
    else ""; ``padded_value``: v's own width where the kernel has one (the forward's P·V); the Gluon
    backward says it in the same words."""
    value_dim = head_dim if value_dim is None else value_dim
    v_width = padded if padded_value is None else padded_value  # the width v runs at
    if padded is None or (padded == head_dim and v_width == value_dim):  # nothing padded
        return ""
    if value_dim == head_dim:
        return f" (head dim {head_dim} run at {padded}, the columns past {head_dim} zero)"
    widths = f"{padded} and {v_width}" if v_width != padded else f"{padded}"
    return f" (head dims {head_dim} (q, k) and {value_dim} (v) run at {widths}, the columns past each zero)"


def path_note(variant: Variant = PLAIN, head_dim: int | None = None, value_dim: int | None = None) -> str:
    """What ``explain()`` says of a call this kernel takes (``note_path``): the TMA kernel's words
    with this kernel's name, and the head dim it runs at where it pads the call's
    (``padded_head_dim``; ``value_dim``: v's, where it differs)."""
    from .attention_fwd_hopper import path_note as hopper_note
    padded = padded_head_dim(head_dim, value_dim) if head_dim is not None else None
    padded_value = padded_head_dim(value_dim) if value_dim is not None else None  # P·V's width (``_launch``)
    return hopper_note(variant, "the Gluon warp-specialized kernel"
                       + padding_note(head_dim, value_dim, padded, padded_value))


PATH_NOTE = path_note(PLAIN)


def fast_path(q, k, v, causal: bool, causal_offset: int, scale: float, variant: Variant = PLAIN) -> bool:
    """Whether an attention forward (plain, or a window, softcap, ALiBi, sinks; dense, ranges or
    varlen) takes this kernel rather than the Triton TMA one (for ranges and varlen, the portable
    one): the Triton Hopper kernel's switches (``FLASHATTN_LITE_HOPPER``, ``MIN_WORK``, on the
    tensors as given: a varlen call's work counted as one sequence of its total) and rules, this
    module's triton version and ``supported``, and the measured crossover (``CAUSAL_MIN_N``; a
    window counts as causal there; not for ranges or varlen: ``_short``)."""
    from . import attention_fwd_hopper as hopper
    if not _HAS_GLUON or not hopper.enabled() or not triton.__version__.startswith(TESTED_TRITON):
        return False
    if _short(causal, variant, q.shape[2], k.shape[2], q.shape[3] if v.shape[3] == q.shape[3] else 0):
        return False  # (v's head dim not q's: no TMA kernel for it, so no crossover)
    options = dict(causal=causal, causal_offset=causal_offset, scale=scale)
    if variant is not PLAIN:
        options["variant"] = variant
    if supported(q, k, v, **options) is not None:
        return False
    B, Hq, Nq, D = q.shape
    return B * Hq * Nq * k.shape[2] * D >= hopper.MIN_WORK


_GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def tma_descriptor(t: torch.Tensor, block: list, layout=None) -> "TensorDescriptor":
    """A Gluon TMA descriptor over ``t`` (its shape and strides) moving ``block`` tiles, in the
    default (largest) swizzle for the block unless ``layout`` says otherwise. The Gluon backward
    builds its descriptors with it too."""
    if layout is None:
        layout = default_layout(tuple(block), t.dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


@functools.lru_cache(maxsize=None)
def default_layout(block: tuple, dtype: torch.dtype):
    """The default shared layout of ``block`` tiles of ``dtype``, built once: Gluon builds a layout
    in ~10 µs of Python, and a backward call takes nine descriptors."""
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, _GL_DTYPES[dtype]))


def k_chunks(cfg: Config, box_width: int, q_dim: int) -> int:
    """K's 64-column chunks a ring slot (``K_CHUNKS``): where the boxes are 256 wide and q's head dim
    192 (MLA's; the one multiple of 64 between 128 and 256), the 128-key configs hold K's columns
    only, as three 64-column boxes (48 KiB a slot, not 64; none of them past k's columns), persistent
    or one tile a program; 1 (K whole, one box) elsewhere."""
    chunked = box_width == 256 and 128 < q_dim < box_width and q_dim % 64 == 0 and cfg.block_n == 128
    return q_dim // 64 if chunked else 1


def _descriptor(t: torch.Tensor, rows: int, width: int) -> "TensorDescriptor":
    """A 4-D TMA descriptor over (B, H, N, D) ``t`` moving [rows, width] tiles of one head (width ≥ D:
    the columns past D read as zeros and are not stored)."""
    return tma_descriptor(t, [1, 1, rows, width])


_PLAIN_ARGS = (None,) * 8
_DENSE_SEQ_ARGS = (None,) * 10
_PLAIN_FLAGS = dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, ALIBI=False, SINKS=False, FAST_TANH=False)


def window_flags(variant: Variant, causal: bool) -> tuple[bool, bool]:
    """(HAS_LEFT, HAS_RIGHT) of a launch: the window's sides after ``causal_window`` (causal caps
    the right side at 0), with a causal call's right side left to ``CAUSAL`` (the kernel's diagonal)
    and a causal call without a left side the plain causal kernel (its window is the diagonal)."""
    variant = causal_window(variant, causal)
    has_left = variant.left >= 0
    has_right = variant.right >= 0 and not causal
    return has_left, has_right


def _is_plain(variant, causal: bool = False) -> bool:
    """No option the kernels' constexprs would switch on (None, ``PLAIN`` or an empty Variant, or
    one whose window is only a causal call's diagonal: ``window_flags``) over a dense batch."""
    return variant is None or variant is PLAIN or (not variant.softcap and variant.alibi is None
                                                   and variant.sinks is None and variant.seq == SEQ_DENSE
                                                   and window_flags(variant, causal) == (False, False))


def _option_args(variant: Variant, q: torch.Tensor, scale: float, causal: bool = False):
    """(sinks, alibi, stride_alibi_b, stride_alibi_h, win_left, win_right, softcap_scale, softcap2)
    and the option flags of a launch, as the portable kernels take them (``score_args``; the window
    as ``window_flags`` says). What a call does not use is None: the launch drops it (a None
    argument is a constexpr), so a plain call compiles to the kernel it compiled to before the
    options existed, parameter list included, and a call without a window to the one before
    windows."""
    if variant is PLAIN:
        return _PLAIN_ARGS, _PLAIN_FLAGS
    _, alibi_strides, softcap_scalars, constexprs = score_args(variant, q, scale)
    flags = {name: constexprs[name] for name in _PLAIN_FLAGS}
    flags["HAS_LEFT"], flags["HAS_RIGHT"] = window_flags(variant, causal)
    args = (variant.sinks, variant.alibi, *(alibi_strides if flags["ALIBI"] else (None, None)),
            variant.left if flags["HAS_LEFT"] else None, variant.right if flags["HAS_RIGHT"] else None,
            *(softcap_scalars if flags["SOFTCAP"] else (None, None)))
    return args, flags


# SMs of the H100 SXM: a persistent launch's program count where q is not on a GPU (the CPU tests,
# ``benchmarks/ptx_hashes.py``).
DEFAULT_SMS = 132


def gpu_sm_count(device: torch.device) -> int:
    """SMs of ``device`` (``_runtime.sm_count``); off the GPU the H100's, where the launch rules then
    plan for it (the interpreter's small count is for the portable kernels' grids)."""
    if device.type != "cuda":
        return DEFAULT_SMS
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _launch(q, k, v, o, lse, scale: float, causal: bool, cfg: Config, variant: Variant = PLAIN,
            sms: int | None = None):
    """(grid, args, keyword args) of the kernel writing o and lse for this call
    (``attention_forward_gluon``'s launch; ``benchmarks/ptx_hashes.py`` compiles from it without a
    GPU). A persistent config: min(tiles, ``sms``) programs (default: q's device's SMs,
    ``DEFAULT_SMS`` off the GPU; ranges and varlen: of the one-tile grid's programs, a bound on their
    tiles, and ``work``, the queue's zeroed counter) and ``PERSISTENT``/``Q_SETS``
    (``Config.q_sets``)/``V_STAGES``, passed only then; ``K_CHUNKS`` where K's ring holds q's columns
    in 64-column boxes (``k_chunks``). ValueError for a ``v_stages`` config one tile per program, and
    for a config whose shared memory does not fit at these widths."""
    B, Hq, Nq, _ = q.shape
    Dv = v.shape[3]
    # Q, K boxes at the wider padded width; V, O boxes (P·V) at v's own, narrower or the same: O is
    # staged in Q's slot, which must hold it.
    D, W_v = padded_head_dim(q.shape[3], Dv), padded_head_dim(Dv)
    Hkv, Nk = k.shape[1], k.shape[2]
    options, flags = _option_args(_dense(variant), q, scale, causal)
    sinks, alibi, stride_alibi_b, stride_alibi_h, win_left, win_right, softcap_scale, softcap2 = options
    grid = (cdiv(Nq, cfg.block_m) * B * Hq,)  # head-major (the kernel's dense branch)
    seq = variant.seq
    if cfg.v_stages and not cfg.persistent:
        raise ValueError(f"attention_forward_gluon: config {cfg.name}: a V ring of its own depth (v_stages) "
                         "needs a persistent config")
    seq_args_ = _DENSE_SEQ_ARGS
    if seq != SEQ_DENSE:
        # Ranges: the dense grid, each batch row's tiles from its range's start. Varlen (tensors
        # (1, H, total, D)): cdiv(total, BLOCK_M) + sequences tile slots per head (``varlen_tile``).
        *bounds, stride_seq, n_seq = seq_args(variant, q)
        # (a persistent launch's work queue: a counter from 0, ``_loader_queue``; these arguments launch
        # once: a second launch would find the queue empty)
        work = torch.zeros(1, dtype=torch.int32, device=q.device) if cfg.persistent else None
        seq_args_ = (*bounds, stride_seq, n_seq, o, o.stride(1), o.stride(2), work)
        if seq == SEQ_VARLEN:
            grid = ((cdiv(Nq, cfg.block_m) + n_seq) * Hq,)
    qk = min(D, qk_width(q.shape[3]))  # Q·Kᵀ's reduction width (a quarter of that GEMM saved at MLA's 192)
    kc = k_chunks(cfg, D, q.shape[3])
    key_width = 64 * kc if kc > 1 else None  # K's ring at q's columns where it holds them in chunks
    q_sets = cfg.q_sets(D, W_v, key_width)
    need = cfg.smem_bytes(D, q_sets, W_v, key_width)
    if need > SMEM_BYTES:  # (an explicit config at widths it does not fit: say so before Triton's resource error)
        raise ValueError(f"attention_forward_gluon: config {cfg.name} needs {need} bytes of shared memory at head dims "
                         f"{q.shape[3]} (q, k) and {Dv} (v) (boxes {D} and {W_v} wide), more than {SMEM_BYTES}")
    args = (_descriptor(q, 64, D), _descriptor(k, cfg.block_n, D if kc == 1 else 64), _descriptor(v, cfg.block_n, W_v),
            _descriptor(o, 64, W_v),
            lse, sinks, alibi, stride_alibi_b, stride_alibi_h, Hq, Hq // Hkv, Nq, Nk, win_left, win_right,
            scale * LOG2E, softcap_scale, softcap2, *seq_args_)
    # HEAD_DIM: Q·Kᵀ's reduction width, within the boxes.
    kwargs = dict(HEAD_DIM=qk, CAUSAL=bool(causal), **flags,
                  CONSUMERS=cfg.consumers, BLOCK_N=cfg.block_n,
                  STAGES=cfg.stages, PINGPONG=bool(cfg.pingpong and cfg.consumers > 1),
                  CONSUMER_REGS=cfg.consumer_regs, LOADER_REGS=LOADER_REGS, num_warps=4)
    if seq != SEQ_DENSE:
        kwargs["SEQ"] = seq
        if W_v != Dv:  # the masked store at a sequence's end keeps to o's columns
            kwargs["D_REAL"] = Dv
    if cfg.persistent:
        # The grid above's tiles, in ``persistent_tile``'s order.
        grid = (min(grid[0], sms or gpu_sm_count(q.device)),)
        kwargs.update(PERSISTENT=True, Q_SETS=q_sets, V_STAGES=cfg.v_stages or cfg.stages)
    if kc > 1:
        kwargs["K_CHUNKS"] = kc
    return grid, args, kwargs


def writes_into(out: torch.Tensor, q: torch.Tensor, v: torch.Tensor, variant: Variant = PLAIN) -> bool:
    """Whether ``attention_forward_gluon`` can write o into ``out``: a dense batch with v's head dim
    q's, ``out`` of o's shape and dtype on q's device that a TMA descriptor can store into
    (``attention_fwd_hopper.storable_like``; its box stops at the view's rows)."""
    return variant.seq == SEQ_DENSE and v.shape[3] == q.shape[3] and storable_like(out, q)


def _queue_pays(q, cfg: Config, variant: Variant) -> bool:
    """Whether a ranges or varlen call whose default config is persistent takes it through the work
    queue: not where the one-tile grid has no more programs than the GPU has SMs (no program would
    take a second tile, and the queue's counter costs a fill: a padded generation step)."""
    B, Hq, Nq, _ = q.shape
    if variant.seq == SEQ_VARLEN:
        programs = (cdiv(Nq, cfg.block_m) + variant.seq_q.shape[0] - 1) * Hq
    else:
        programs = cdiv(Nq, cfg.block_m) * B * Hq
    return programs > gpu_sm_count(q.device)


def one_tile_per_program(cfg: Config) -> Config:
    """``cfg`` one tile per program, one ring depth for K and V (the deeper of the two): how ranges
    and varlen batches ran before the work queue (``benchmarks/varlen_schedule.py`` compares)."""
    return cfg._replace(persistent=False, stages=max(cfg.stages, cfg.v_stages), v_stages=0)


def attention_forward_gluon(q, k, v, scale: float, causal: bool, *, config: Config | None = None,
                            variant: Variant = PLAIN, out: torch.Tensor | None = None):
    """o, lse = softmax(scores) · v and its natural-log lse, the scores scale·q·kᵀ with
    ``variant``'s options (sliding window, softcap, ALiBi; sinks in the denominator), causal
    bottom-right (``causal`` caps the window's right side at 0).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv); call only where ``supported`` returned
    None. Returns o (B, Hq, Nq, Dv) in q's dtype (``dense_output``: q's layout) and lse (B, Hq, Nq)
    float32; a row with no visible key
    (causal with Nq > Nk, a window) has o = 0, lse = −inf (with sinks: the sink's logit). Key tiles
    outside a window are never loaded (``key_tiles``): O(N·W) work. ``config``: one of ``CONFIGS``, or
    beside v at most 128 wide ``NARROW_V_CONFIGS`` and (q's head dim 192) ``NARROW_QK_CONFIG``
    (default: ``default_config``, for varlen at the sequences' mean length). ``variant``: as
    ``attention_forward`` takes it; with per-row ranges o and lse are (B, Hq, Nq) buffers whose rows
    outside the ranges are 0 and −inf, with a varlen batch (q, k, v (1, H, total, D) views of
    (total, H, D)) o is a (1, Hq, total, D) view of a (total, Hq, D) tensor and lse (1, Hq, total):
    ``output_buffers``, as the portable kernel writes them; ranges and varlen take a persistent config
    through the work queue where it pays (``_queue_pays``). ValueError for what ``_variant_reason``
    refuses. ``out``: where
    given (a dense batch, v's head dim q's; ``writes_into``), o is written into it and returned: a
    (B, Hq, Nq, Dv) view in q's dtype, such as rows of a larger output (ring attention's sums)."""
    if variant is not PLAIN:
        reason = _variant_reason(variant)
        if reason is not None:
            raise ValueError(f"attention_forward_gluon: variant: {reason}")
    B, Hq, Nq, D = q.shape
    n = max(Nq, k.shape[2])
    if variant.seq == SEQ_VARLEN:  # the config rule's length: the sequences' mean
        n = max(Nq, k.shape[2]) // max(variant.seq_q.shape[0] - 1, 1)
    cfg = config
    if cfg is None:
        cfg = default_config(padded_head_dim(D, v.shape[3]), causal, n, variant.alibi is not None, variant.softcap > 0,
                             variant.left >= 0, v.shape[3], D, plain=_is_plain(variant, causal))
        if cfg.persistent and variant.seq != SEQ_DENSE and not _queue_pays(q, cfg, variant):
            cfg = one_tile_per_program(cfg)
    if out is not None:
        if not writes_into(out, q, v, variant):
            raise ValueError(f"attention_forward_gluon: out must be a (B, Hq, Nq, Dv) tensor in q's dtype that TMA can "
                             f"store into (16-byte aligned base and strides, unit last stride, no broadcast dim), for "
                             f"a dense batch with v's head dim q's; got {tuple(out.shape)}, strides {out.stride()}")
        o = out
        lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    else:  # the portable kernel's buffers: dense o in q's layout, varlen o over (total, Hq, Dv), ranges' 0 / −inf
        o, lse = output_buffers(q, v.shape[3], variant, True)
    grid, args, kwargs = _launch(q, k, v, o, lse, scale, causal, cfg, variant)
    _attn_fwd_gluon_launcher[grid](*args, **kwargs)
    return o, lse
