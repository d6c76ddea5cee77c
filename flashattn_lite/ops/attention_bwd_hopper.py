"""Attention backward for Hopper (sm_90): the portable kernels' algorithm over TMA tensor descriptors.

``attention()``'s backward takes it for plain causal calls on sm_90 only where the Gluon backward
(``attention_bwd_gluon``, tried first) does not run (``fast_path``: where it measured faster than
the portable kernels); the Gluon backward also runs this module's dQ kernel under
``torch.use_deterministic_algorithms``. Plain attention only, the forward Hopper module's rules (causal or
not, bottom-right offset Nk − Nq, GQA, fp16/bf16, D = Dv ∈ {64, 128}, TMA-aligned tensors, and
``do`` too). ``attention_backward_hopper`` returns exactly what the portable ``attention_backward``
returns for such a call: (dq, dk, dv), ``torch.empty_like`` of q, k, v (their strides), in the
inputs' dtype, dk/dv summed over each GQA group.

The three steps of ``attention_bwd.py``, unchanged in their math:

1. ``_bwd_preprocess`` (the portable kernel itself, called as is): δ = rowsum(dO ∘ O) − dlse and
   lse₂ = lse·log2 e (+inf on rows with no visible key, whose P is then 0).
2. ``_dkdv_hopper_kernel``: one program per key tile of one KV head; K and V are TMA-loaded once,
   then every query head of the GQA group and every query tile it reaches (``query_range``: the
   causal diagonal band masked, the rest not) streams Q and dO through TMA. Pᵀ = exp2(S·scale·log2 e
   − lse₂) is recomputed (``score_tile``), dV += Pᵀ·dO, dK += (Pᵀ ∘ (dPᵀ − δ))·Q; dK·scale and dV are
   stored through TMA (rows past Nk are not written).
3. ``_dq_hopper_kernel``: one program per query tile; Q and dO TMA-loaded once, K/V tiles streamed
   through TMA over ``key_range`` (unmasked tiles, then the diagonal / last partial tile masked);
   dQ·scale stored through TMA.

What TMA moves: every K, V, Q, dO tile load and the dK, dV, dQ stores. δ and lse₂ (one float per
row, N·4-byte rows not 16-byte aligned in general) stay plain masked loads. No atomics: each
gradient element is written by one program, as in the portable backward (deterministic).

No warp specialization: triton 3.6's Hopper partitioner gave wrong results on the forward.
Measured on the H100 (``benchmarks/hopper_bwd.py``, 2026-11-24, bf16, B·N 16k): causal 1.05–1.11×
the portable backward (d 128: 281–346 TFLOP/s), non-causal 0.82–0.99×. Tried and left out: one
fused kernel adding dQ's share dS·K into an fp32 buffer by TMA reduce-add (5 GEMMs per tile pair
instead of 7, FlashAttention's layout): correct but 264–271 TFLOP/s at d 128, N 16k (the pair:
348–379): at 255 registers a thread only 16-query tiles fit, one program per SM, and without warp
specialization the extra GEMM, the dSᵀ staging and the reduce run in series (benchmarks/NOTES.md).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._runtime import cdiv, interpreter_active, tile_and_slab
from ..merge import LOG2E
from .attention_bwd import query_range, row_stats
from .attention_fwd import key_range, precision_for, query_tile, score_tile
from .attention_fwd_hopper import (_NOT_SPECIALIZED, DTYPES, HEAD_DIMS, MIN_WORK, TESTED_TRITON, TensorDescriptor,
                                   _load_rows, _reason_for_options, _tensor_reason)
from .attention_fwd_hopper import enabled as _forward_enabled
from .attention_fwd_hopper import Config as KernelConfig
from .attention_fwd_hopper import covered

__all__ = ["CONFIGS", "DTYPES", "HEAD_DIMS", "INTERPRETER_CONFIG", "Config", "KernelConfig",
           "PATH_NOTE", "attention_backward_hopper", "default_config", "dq_into", "fast_path", "supported"]

# KernelConfig: the forward's Config, the tiles and launch shape of one backward kernel. For dK/dV:
# ``block_n`` keys held per program, ``block_m`` queries streamed; for dQ: ``block_m`` queries held,
# ``block_n`` keys streamed.

class Config(NamedTuple):
    """One launch configuration of the Hopper backward: the dK/dV kernel's and the dQ kernel's."""
    dkdv: KernelConfig
    dq: KernelConfig

    @property
    def name(self) -> str:
        return f"kv:{self.dkdv.name}/q:{self.dq.name}"


K = KernelConfig
# The sweep, per head dim: (dK/dV, dQ) pairs, not a product (the benchmark times whole backwards).
# Every kernel of it compiles for sm_90 with triton 3.6 (fp16 and bf16, causal or not, GQA group 1
# and 2) without a register spill, in 41–161 KiB of shared memory (2026-11, offline ``ptxas -v``;
# max registers over those variants, shared memory in kB = 10³ bytes):
#   d 64  dK/dV m64-n128-w8-s2 ≤220 regs 66 KB, m64-n128-w8-s3 ≤224 84 KB, m32-n128-w8-s3 ≤155 58 KB,
#         m32-n64-w4-s3 ≤160 42 KB, m64-n64-w4-s3 ≤228 68 KB;
#         dQ m128-n64-w8-s2 ≤140 66 KB, m128-n64-w8-s3 ≤128 83 KB, m128-n32-w4-s3 ≤182 57 KB,
#         m64-n64-w4-s3 ≤128 67 KB, m128-n128-w8-s2 ≤225 99 KB;
#   d 128 dK/dV m32-n128-w8-s3 ≤245 115 KB, m32-n128-w8-s2 ≤231 99 KB, m64-n64-w8-s3 ≤255 133 KB,
#         m16-n128-w8-s3 ≤208 90 KB, m32-n64-w4-s3 ≤247 83 KB;
#         dQ m128-n64-w8-s3 ≤189 165 KB, m128-n32-w8-s3 ≤131 115 KB, m64-n64-w4-s3 ≤187 132 KB,
#         m64-n32-w4-s3 ≤141 83 KB, m64-n64-w4-s2 ≤185 99 KB.
# Left out for spilling: dK/dV d 128 m64-n128 (w8, s2/s3: FlashAttention's own tile) and m128-n64,
# m64-n64-w4; d 64 m128-n128-w8, m64-n128-w4, m32-n128-w4; dQ d 128 m128-n32-w4. dK/dV holds two
# fp32 [BLOCK_N, D] accumulators per program: at d 128 and BLOCK_N 128 that is 128 registers a
# thread at 8 warps before any score tile.
CONFIGS = {
    64: [Config(K(64, 128, 8, 2), K(128, 64, 8, 2)),
         Config(K(64, 128, 8, 3), K(128, 64, 8, 3)),
         Config(K(32, 128, 8, 3), K(128, 32, 4, 3)),
         Config(K(32, 64, 4, 3), K(64, 64, 4, 3)),
         Config(K(64, 64, 4, 3), K(128, 128, 8, 2))],
    128: [Config(K(32, 128, 8, 3), K(128, 64, 8, 3)),
          Config(K(32, 128, 8, 2), K(128, 32, 8, 3)),
          Config(K(64, 64, 8, 3), K(64, 64, 4, 3)),
          Config(K(16, 128, 8, 3), K(64, 32, 4, 3)),
          Config(K(32, 64, 4, 3), K(64, 64, 4, 2))],
}
del K
# The interpreter runs every element on the CPU: the smallest tiles tl.dot takes.
INTERPRETER_CONFIG = Config(KernelConfig(16, 16, 4, 1), KernelConfig(16, 16, 4, 1))


def default_config(head_dim: int, causal: bool = False, n: int = 4096) -> Config:
    """The sweep's fastest config (``benchmarks/hopper_bwd.py`` on the H100, 2026-11-24, bf16, N 2k /
    8k / 16k with B·N 16k: ``hopper_bwd-20261124-101042.json``), or the interpreter's tiny tiles.
    32 × 64 dK/dV tiles with 4 warps won 11 of the 12 points (d 128 causal 16k: 32 × 128 with 8
    warps, 2% ahead)."""
    if interpreter_active():
        return INTERPRETER_CONFIG
    return CONFIGS[head_dim][3 if head_dim == 64 else 4]


@triton.jit
def _dkdv_stage(dk, dv, k_t, v_t, q_desc, do_desc, lse2, delta, b, h_kv, n_heads, lo, hi, offs_n, n_q, n_k, off,
                qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Query tiles [lo, hi) of every query head of the GQA group against this program's key tile,
    transposed (the portable ``_dkdv_tile``): recompute Pᵀ [BLOCK_N, BLOCK_M], fold it into dV and
    dSᵀ into dK. MASKED: the causal diagonal band. Rows past n_q read as zeros with lse₂ = +inf:
    P = 0. The (head, tile) pairs run as one flat loop: a loop over the group around the tile loop
    made ptxas spill at GROUP 2 (sm_90, triton 3.6)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    n_tiles = tl.cdiv(hi - lo, BLOCK_M)
    for t in tl.range(0, GROUP * n_tiles):
        if GROUP == 1:
            h = h_kv
            start_m = lo + t * BLOCK_M
        else:
            h = h_kv * GROUP + t // n_tiles
            start_m = lo + (t % n_tiles) * BLOCK_M
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        row_ok = offs_m < n_q
        row = (b * n_heads + h).to(tl.int64) * n_q + offs_m  # the lse layout: dense (B, Hq, Nq)
        q_t = _load_rows(q_desc, b, h, start_m, BLOCK_M, HEAD_DIM)
        do_t = _load_rows(do_desc, b, h, start_m, BLOCK_M, HEAD_DIM)
        l2 = tl.load(lse2 + row, mask=row_ok, other=float("inf"))
        st, _ = score_tile(tl.dot(k_t, tl.trans(q_t), input_precision=PRECISION), offs_m[None, :],
                           offs_n[:, None], 0, 0, 0, n_q, n_k, off, 0, 0, qk_scale, 0.0, 0.0, 0.0,
                           MASKED, False, CAUSAL, 0, False, False, False)
        pt = tl.math.exp2(st - l2[None, :])
        d = tl.load(delta + row, mask=row_ok, other=0.0)
        dpt = tl.dot(v_t, tl.trans(do_t), input_precision=PRECISION)
        dv = tl.dot(pt.to(do_t.dtype), do_t, dv, input_precision=PRECISION)
        dst = pt * (dpt - d[None, :])
        dk = tl.dot(dst.to(q_t.dtype), q_t, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=_NOT_SPECIALIZED + ["n_kv_heads"])
def _dkdv_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse2, delta,
                        n_heads, n_kv_heads, n_q, n_k, qk_scale, sm_scale,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Key tiles in ascending order: under causal the first ones see the most queries (heaviest first).
    tile, bh_kv = tile_and_slab(tl.cdiv(n_k, BLOCK_N))
    start_n = tile * BLOCK_N
    b = bh_kv // n_kv_heads
    h_kv = bh_kv % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_t = _load_rows(k_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
    v_t = _load_rows(v_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Causal is the window's right side at 0: rows [lo, mid_lo) are the diagonal band (masked),
    # [mid_lo, mid_hi) see the whole tile. Without causal every row runs unmasked: the zero-padded
    # keys past n_k only reach dK/dV rows that are never stored.
    off = n_k - n_q
    lo, mid_lo, mid_hi, hi = query_range(start_n, n_q, off, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    if CAUSAL:
        dk, dv = _dkdv_stage(dk, dv, k_t, v_t, q_desc, do_desc, lse2, delta, b, h_kv, n_heads, lo, mid_lo, offs_n,
                             n_q, n_k, off, qk_scale, True, CAUSAL, GROUP, HEAD_DIM, BLOCK_M, PRECISION)
    dk, dv = _dkdv_stage(dk, dv, k_t, v_t, q_desc, do_desc, lse2, delta, b, h_kv, n_heads, mid_lo, mid_hi, offs_n,
                         n_q, n_k, off, qk_scale, False, CAUSAL, GROUP, HEAD_DIM, BLOCK_M, PRECISION)

    # Rows ≥ n_k fall outside the descriptors and are not written.
    dk_desc.store([b, h_kv, start_n, 0], (dk * sm_scale).to(k_t.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
    dv_desc.store([b, h_kv, start_n, 0], dv.to(v_t.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))


@triton.jit
def _dq_stage(dq, q_t, do_t, l2, d, k_desc, v_desc, b, h_kv, lo, hi, offs_m, n_q, n_k, off, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """Key tiles [lo, hi) folded into dQ (the portable ``_dq_tile``). MASKED: the causal diagonal
    and the last partial tile (its zero-padded keys get −inf, P = 0)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k_t = _load_rows(k_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
        v_t = _load_rows(v_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
        s, _ = score_tile(tl.dot(q_t, tl.trans(k_t), input_precision=PRECISION), offs_m[:, None],
                          start_n + offs_n0[None, :], 0, 0, 0, n_q, n_k, off, 0, 0, qk_scale, 0.0, 0.0, 0.0,
                          MASKED, False, CAUSAL, 0, False, False, False)
        p = tl.math.exp2(s - l2[:, None])
        dp = tl.dot(do_t, tl.trans(v_t), input_precision=PRECISION)
        ds = p * (dp - d[:, None])
        dq = tl.dot(ds.to(k_t.dtype), k_t, dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _dq_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse2, delta, n_heads, n_q, n_k, qk_scale, sm_scale,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh, b, h, h_kv = query_tile(n_q, n_heads, GROUP, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    q_t = _load_rows(q_desc, b, h, start_m, BLOCK_M, HEAD_DIM)
    do_t = _load_rows(do_desc, b, h, start_m, BLOCK_M, HEAD_DIM)
    row = bh.to(tl.int64) * n_q + offs_m
    l2 = tl.load(lse2 + row, mask=row_ok, other=float("inf"))
    d = tl.load(delta + row, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    off = n_k - n_q
    lo, mid_lo, mid_hi, hi = key_range(start_m, n_k, off, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_stage(dq, q_t, do_t, l2, d, k_desc, v_desc, b, h_kv, mid_lo, mid_hi, offs_m, n_q, n_k, off, qk_scale,
                   False, CAUSAL, HEAD_DIM, BLOCK_N, PRECISION)
    dq = _dq_stage(dq, q_t, do_t, l2, d, k_desc, v_desc, b, h_kv, mid_hi, hi, offs_m, n_q, n_k, off, qk_scale,
                   True, CAUSAL, HEAD_DIM, BLOCK_N, PRECISION)
    # Rows ≥ n_q fall outside the descriptor and are not written.
    dq_desc.store([b, h, start_m, 0], (dq * sm_scale).to(q_t.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))


def supported(q, k, v, do, head_dims: tuple = HEAD_DIMS, any_value_dim: bool = False, **options) -> str | None:
    """None when ``attention_backward_hopper`` covers this call, else the reason in words.

    The forward module's rules for q, k, v and the options (``attention_fwd_hopper.covered`` at
    ``head_dims``: the Gluon backward's rules are these at its own head dims, and with
    ``any_value_dim`` v's head dim may differ from q's),
    and for ``do``: o's shape (q's, v's head dim) and q's dtype, last stride 1, base and strides 16-byte aligned, no
    broadcast (stride-0) dim — autograd hands over such a ``do`` for e.g. ``o.sum()``; the caller
    makes it contiguous or takes the portable backward. Options also accepted: ``dlse`` (folded
    into δ by the portable preprocess), ``mask``/``dropout_p``/``variant`` only when inactive."""
    options = dict(options)
    options.pop("dlse", None)
    reason = covered(q, k, v, head_dims, {}, any_value_dim)
    if reason is not None:
        return reason
    if not isinstance(do, torch.Tensor) or tuple(do.shape) != (*q.shape[:3], v.shape[3]) or do.dtype != q.dtype:
        return "do is not a tensor of o's shape (q's, with v's head dim) and q's dtype"
    if do.device != q.device:
        return "do is not on q's device"
    return _tensor_reason("do", do) or _reason_for_options(q, k, options)


def _descriptor(t, rows):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


def attention_backward_hopper(do, q, k, v, o, lse, *, scale: float, causal: bool, config: Config | None = None,
                              dlse: torch.Tensor | None = None):
    """(dq, dk, dv) of o = softmax(scale·q·kᵀ [causal, bottom-right]) · v, given the forward's o and
    natural-log lse (B, Hq, Nq) float32 (−inf on rows with no visible key).

    Exactly the portable ``attention_backward(do, q, k, v, o, lse, dlse, scale=, causal=,
    causal_offset=Nk − Nq, mask=None, dropout_p=0, seed=0)``'s (dq, dk, dv): ``empty_like`` of q, k,
    v, dk/dv summed over each GQA group. Call only where ``supported`` returned None (the CPU
    interpreter runs it too, for tests). ``config``: one of ``CONFIGS`` (default:
    ``default_config``). ``dlse``: the lse's own gradient (B, Hq, Nq), or None."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = config or default_config(D, causal, max(Nq, Nk))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta, lse2 = row_stats(do, o, lse, dlse)
    kv = cfg.dkdv
    _dkdv_hopper_kernel[(cdiv(Nk, kv.block_n) * B * Hkv,)](
        _descriptor(q, kv.block_m), _descriptor(k, kv.block_n), _descriptor(v, kv.block_n),
        _descriptor(do, kv.block_m), _descriptor(dk, kv.block_n), _descriptor(dv, kv.block_n),
        lse2, delta, Hq, Hkv, Nq, Nk, scale * LOG2E, scale,
        GROUP=Hq // Hkv, HEAD_DIM=D, CAUSAL=bool(causal), PRECISION=precision_for(q.dtype),
        BLOCK_M=kv.block_m, BLOCK_N=kv.block_n, num_warps=kv.num_warps, num_stages=kv.num_stages)
    dq_into(dq, do, q, k, v, lse2, delta, scale, causal, cfg.dq)
    return dq, dk, dv


def dq_into(dq, do, q, k, v, lse2, delta, scale: float, causal: bool, qc: KernelConfig) -> None:
    """dq (one writer per element: deterministic) by ``_dq_hopper_kernel`` with tiles ``qc``; the
    Gluon backward's deterministic configs use it too."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _dq_hopper_kernel[(cdiv(Nq, qc.block_m) * B * Hq,)](
        _descriptor(q, qc.block_m), _descriptor(k, qc.block_n), _descriptor(v, qc.block_n),
        _descriptor(do, qc.block_m), _descriptor(dq, qc.block_m),
        lse2, delta, Hq, Nq, Nk, scale * LOG2E, scale,
        GROUP=Hq // Hkv, HEAD_DIM=D, CAUSAL=bool(causal), PRECISION=precision_for(q.dtype),
        BLOCK_M=qc.block_m, BLOCK_N=qc.block_n, num_warps=qc.num_warps, num_stages=qc.num_stages)


PATH_NOTE = "a plain causal fp16/bf16 call on sm_90: the TMA kernels (FLASHATTN_LITE_HOPPER=0 turns them off)"


def fast_path(do, q, k, v, causal: bool, causal_offset: int, scale: float) -> bool:
    """Whether a plain attention backward takes this kernel pair (decided once per call signature
    by ``attention_backward``; base-pointer alignment is checked on every call there): the forward
    fast path's switches (``FLASHATTN_LITE_HOPPER``, tested triton, ``MIN_WORK``), and causal only.
    Measured on the H100 (``hopper_bwd-20261124-101042.json``, bf16, B·N 16k): causal 1.05–1.11×
    the portable backward at d 64 and 128, non-causal 0.82–0.99× (the portable dQ kernel's 128 × 128
    tiles win there), so non-causal calls keep the portable kernels."""
    if not causal or not _forward_enabled() or not triton.__version__.startswith(TESTED_TRITON):
        return False
    if supported(q, k, v, do, causal=causal, causal_offset=causal_offset, scale=scale) is not None:
        return False
    B, Hq, Nq, D = q.shape
    return B * Hq * Nq * k.shape[2] * D >= MIN_WORK
