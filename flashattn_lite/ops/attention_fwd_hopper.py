"""Attention forward for Hopper (sm_90): the portable kernel's algorithm over TMA tensor descriptors.

Causal or not, GQA, fp16/bf16, D = Dv ∈ {64, 128}, q/k/v (B, H, N, D) with unit last stride and
16-byte-aligned base and strides, and the score variants of a dense batch (``Variant``: softcap,
ALiBi slopes, attention sinks, a sliding window). ``supported`` says whether a call is covered (and
why not); the caller runs the portable kernel otherwise (masks, dropout, ranges/varlen layouts,
Dv ≠ D, a causal_offset other than Nk − Nq). The result is exactly ``attention_forward``'s: o (B,
Hq, Nq, D) contiguous in q's dtype, lse (B, Hq, Nq) float32 in natural log (the sink term
included), a row with no visible key o = 0 and lse = −inf (the sink's logit, with sinks); the
portable backward consumes it.

What differs from ``attention_fwd.py`` is only how tiles move: every q/k/v/o tile is one TMA copy
through a tensor descriptor, so the compiler pipelines K/V with mbarriers and feeds wgmma from
shared memory, and rows past a head's end read as zeros (and are not written) without a mask.
The math is the same helpers: ``key_range`` splits the keys into unmasked tiles and masked ones
(the window's edges — under causal the diagonal, bottom-right aligned with offset Nk − Nq — and
the last partial tile, whose zero-padded keys are masked to −inf; tiles outside the window are
never visited), ``tanh``/``mask_scores`` (or ``score_tile`` with ALiBi) make the scores,
``online_softmax_update_scaled`` folds the last positive factor (scale·log2 e, or the softcap's
c·log2 e) into the exp2, ``add_sink`` adds the sink term and ``finalize`` writes the natural-log
lse. Each option is a constexpr, as in the portable kernel: a plain call compiles to the code it
compiled to before the options existed.

Descriptors are built on the host (``TensorDescriptor`` over the whole (B, H, N, D) tensor, 4-D,
strides as given: no per-program setup, a few µs of host time per call).

Measured on the H100 (``benchmarks/hopper_fwd.py``, 2026-11-24, bf16, B·N 16k tokens): 1.20–1.28×
the portable kernel's TFLOP/s at d 128 (493–527 TFLOP/s, 0.80–0.96× cuDNN), 1.01–1.06× at d 64.
Tried and left out: per-program (device-side) descriptors (never the fastest config) and
``tl.range(..., warp_specialize=True)``: triton 3.6's Hopper pass partitions only 4-warp kernels
with one branch-free loop, and the kernels it produced gave wrong results on the H100.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _checks
from .._runtime import cdiv, interpreter_active
from ..merge import LOG2E, add_sink, finalize, online_softmax_update_scaled
from .attention_fwd import (PLAIN, SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN, Variant, causal_window, fold_factor,
                            key_range, mask_scores, output_buffers, query_tile, score_args, score_tile)

try:  # triton ≥ 3.4: TMA descriptors in the language and on the host
    from triton.tools.tensor_descriptor import TensorDescriptor
    _HAS_TMA = hasattr(tl, "make_tensor_descriptor")
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None
    _HAS_TMA = False

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


class Config(NamedTuple):
    """One launch configuration of the Hopper kernel."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return f"m{self.block_m}-n{self.block_n}-w{self.num_warps}-s{self.num_stages}"


# The sweep, per head dim. Shared memory: stages·BLOCK_N·2D·2 bytes of K/V plus the Q tile stay
# under the H100's 227 KB (d 128, 128 × 128 × 3 stages: 225 KB); 8 warps split 128 rows into two
# warpgroups of 64. None spills when compiled for sm_90 with triton 3.6 (d 128 at 128 × 64 with 4
# warps did: left out).
CONFIGS = {
    64: [Config(128, 128, 8, 3), Config(128, 64, 8, 3), Config(128, 128, 8, 4), Config(128, 128, 8, 2),
         Config(128, 64, 4, 3), Config(64, 64, 4, 3)],
    128: [Config(128, 64, 8, 3), Config(128, 128, 8, 2), Config(128, 128, 8, 3), Config(128, 64, 8, 2),
          Config(128, 64, 8, 4), Config(64, 64, 4, 3), Config(64, 128, 4, 2)],
}
# The interpreter runs every element on the CPU: the smallest tiles tl.dot takes.
INTERPRETER_CONFIG = Config(16, 16, 4, 1)


def default_config(head_dim: int, causal: bool = False, n: int = 4096) -> Config:
    """The sweep's fastest config at the nearest measured point (``benchmarks/hopper_fwd.py`` on the
    H100, 2026-11-24, bf16, N 2k / 8k / 16k with B·N 16k), or the interpreter's tiny tiles.
    Small tiles win short sequences (more programs to fill 132 SMs), 128 × 128 long ones at d 128."""
    if interpreter_active():
        return INTERPRETER_CONFIG
    if head_dim == 128:
        long = n >= (16384 if causal else 8192)
        return Config(128, 128, 8, 3) if long else Config(64, 64, 4, 3)
    if n < 8192:
        return Config(64, 64, 4, 3)
    return Config(128, 64, 4 if causal else 8, 3)


@triton.jit
def _load_rows(desc, b, h, row, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [row, row + ROWS) of head (b, h) of the 4-D (B, H, N, D) descriptor as a
    [ROWS, HEAD_DIM] tile: one TMA copy; rows past the head's end are zeros."""
    return desc.load([b, h, row, 0]).reshape(ROWS, HEAD_DIM)


@triton.jit
def _kv_stage(acc, m_i, l_i, q_tile, k_desc, v_desc, b, h_kv, lo, hi, offs_m, n_q, n_k, off, win_left, win_right,
              qk_scale, softcap_scale, softcap2, slope2,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
              ALIBI: tl.constexpr, FAST_TANH: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key tiles [lo, hi) into (acc, m, ℓ). MASKED: the tiles some row cannot fully see (the
    window's edges, the causal diagonal, the last partial tile); the rest run without a compare.
    The scores as the portable kernel's ``_fwd_tile`` makes them: with ALiBi (a bias) the whole
    base-2 score by ``score_tile``; otherwise masks only, which −inf survives, so the score's last
    positive factor (scale·log2 e, or the softcap's c·log2 e) folds into the exp2."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(k_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
        qk = tl.dot(q_tile, k.T)
        rows = offs_m[:, None]
        cols = start_n + offs_n[None, :]
        if ALIBI:
            s, _ = score_tile(qk, rows, cols, 0, 0, 0, n_q, n_k, off, win_left, win_right, qk_scale, softcap_scale,
                              softcap2, slope2, MASKED, HAS_LEFT, HAS_RIGHT, 0, SOFTCAP, ALIBI, FAST_TANH)
            m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, s, 1.0)
        else:
            x, fold = fold_factor(qk, qk_scale, softcap_scale, softcap2, SOFTCAP, FAST_TANH)
            if MASKED:
                x = mask_scores(x, rows, cols, 0, 0, 0, n_q, n_k, off, win_left, win_right,
                                True, HAS_LEFT, HAS_RIGHT, 0)
            m_i, l_i, p, alpha = online_softmax_update_scaled(m_i, l_i, x, fold)
        acc = acc * alpha[:, None]
        v = _load_rows(v_desc, b, h_kv, start_n, BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_i, l_i


# Lengths and head counts change from call to call: specialising on them would compile a binary per
# length class or head count (the backward's kernels share this list). Window sides too.
_NOT_SPECIALIZED = ["n_q", "n_k", "n_heads"]


@triton.jit(do_not_specialize=_NOT_SPECIALIZED + ["win_left", "win_right"])
def _attn_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, lse, sinks, alibi, stride_alibi_b, stride_alibi_h,
                            n_heads, n_q, n_k, win_left, win_right, qk_scale, softcap_scale, softcap2,
                            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                            ALIBI: tl.constexpr, SINKS: tl.constexpr, FAST_TANH: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh, b, h, h_kv = query_tile(n_q, n_heads, GROUP, BLOCK_M)
    q_tile = _load_rows(q_desc, b, h, start_m, BLOCK_M, HEAD_DIM)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    slope2 = 0.0
    if ALIBI:  # as the portable kernel reads it: slope·log2 e of (b, h)
        slope = tl.load(alibi + b.to(tl.int64) * stride_alibi_b + h * stride_alibi_h).to(tl.float32)
        slope2 = slope * 1.4426950408889634

    # Causal is the window's right side at 0 (``causal_window``; HAS_RIGHT is set with it), a
    # constant here. Without a left side lo = mid_lo = 0 and its stage has no code; without causal
    # or a right side the last masked stage is the last partial tile alone (its zero-padded keys
    # must not count).
    if CAUSAL:
        win_right = 0
    off = n_k - n_q
    lo, mid_lo, mid_hi, hi = key_range(start_m, n_k, off, win_left, win_right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    if HAS_LEFT:
        acc, m_i, l_i = _kv_stage(acc, m_i, l_i, q_tile, k_desc, v_desc, b, h_kv, lo, mid_lo, offs_m, n_q, n_k, off,
                                  win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                                  True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, HEAD_DIM, BLOCK_N)
    acc, m_i, l_i = _kv_stage(acc, m_i, l_i, q_tile, k_desc, v_desc, b, h_kv, mid_lo, mid_hi, offs_m, n_q, n_k, off,
                              win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                              False, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, HEAD_DIM, BLOCK_N)
    acc, m_i, l_i = _kv_stage(acc, m_i, l_i, q_tile, k_desc, v_desc, b, h_kv, mid_hi, hi, offs_m, n_q, n_k, off,
                              win_left, win_right, qk_scale, softcap_scale, softcap2, slope2,
                              True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, FAST_TANH, HEAD_DIM, BLOCK_N)

    if SINKS:  # one more term exp(sink) in the denominator, with no value (in the lse too)
        m_i, l_i, acc = add_sink(m_i, l_i, acc, tl.load(sinks + h).to(tl.float32) * 1.4426950408889634)
    out, lse_row = finalize(acc, m_i, l_i)
    # Rows ≥ n_q fall outside the descriptor and are not written.
    o_desc.store([b, h, start_m, 0], out.to(q_tile.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    tl.store(lse + bh.to(tl.int64) * n_q + offs_m, lse_row, mask=offs_m < n_q)


def _tensor_reason(name: str, t: torch.Tensor) -> str | None:
    """Why a TMA descriptor cannot take the 4-D tensor ``t`` (called ``name`` in the reason), or None:
    last stride 1, base and other strides 16-byte aligned, no broadcast (stride-0) dim."""
    if t.stride(3) != 1:
        return f"{name}'s last dim is strided"
    if t.data_ptr() % 16 or any(s * t.element_size() % 16 for s in t.stride()[:3]):
        return f"{name}'s base or strides are not 16-byte aligned (TMA)"
    if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
        return f"{name} is broadcast (a stride-0 dim), which a TMA descriptor does not describe"
    return None


def storable_like(t: torch.Tensor, like: torch.Tensor) -> bool:
    """Whether ``t`` has ``like``'s shape, dtype and device and a TMA descriptor can store into it
    (``_tensor_reason``): an ``out`` the Gluon kernels write themselves."""
    return (t.shape == like.shape and t.dtype == like.dtype and t.device == like.device
            and _tensor_reason("out", t) is None)


def _reason_for_variant(q, variant) -> str | None:
    """Why the forward kernel cannot take ``variant``, or None: a dense batch, window sides in
    [−1, 2³⁰) (−1 unbounded), a finite softcap ≥ 0, ALiBi slopes float32/float64 (Hq,) or (B, Hq)
    and sinks a unit-stride float (Hq,), both on q's device — what ``attention()`` builds."""
    if not isinstance(variant, Variant):
        return f"variant is a {type(variant).__name__}, not a Variant"
    if variant.seq != SEQ_DENSE:
        return "a ranges or varlen batch layout"
    if not all(isinstance(side, int) and -1 <= side < 2 ** 30 for side in (variant.left, variant.right)):
        return f"window sides {variant.left, variant.right} are not ints in [−1, 2³⁰)"
    if not (isinstance(variant.softcap, (int, float)) and 0 <= variant.softcap < float("inf")):
        return f"softcap {variant.softcap} is not a finite number ≥ 0"
    (B, Hq), alibi, sinks = q.shape[:2], variant.alibi, variant.sinks
    if alibi is not None and not (isinstance(alibi, torch.Tensor) and alibi.device == q.device
                                  and alibi.dtype in (torch.float32, torch.float64)
                                  and tuple(alibi.shape) in ((Hq,), (B, Hq))):
        return "alibi slopes are not a float32/float64 (Hq,) or (B, Hq) tensor on q's device"
    if sinks is not None and not (isinstance(sinks, torch.Tensor) and sinks.device == q.device
                                  and sinks.is_floating_point() and tuple(sinks.shape) == (Hq,)
                                  and (Hq == 1 or sinks.stride(0) == 1)):
        return "sinks are not a unit-stride float (Hq,) tensor on q's device"
    return None


def offset_reason(q, k, offset, causal, variant) -> str | None:
    """Why a call's ``causal_offset`` keeps it off these kernels, which place the diagonal
    bottom-right (Nk − Nq), or None. The offset places the causal diagonal, the window's sides and
    ALiBi's distances; a call with none of them (ring attention's unmasked blocks, say) ignores it.
    The Gluon backward asks too, with the ``variant`` it takes apart from the other options."""
    if offset is None or offset == k.shape[2] - q.shape[2]:
        return None
    banded = isinstance(variant, Variant) and (variant.left >= 0 or variant.right >= 0 or variant.alibi is not None)
    if causal or banded:
        return f"causal_offset {offset} is not the bottom-right default Nk − Nq = {k.shape[2] - q.shape[2]}"
    return None


def _reason_for_options(q, k, options, variants: bool = False) -> str | None:
    """Why the options ask for more than the kernel does, or None. ``variants``: the forward's
    ``variant`` options (``_reason_for_variant``) are covered; without it (the backward) only plain
    attention is."""
    for name, value in options.items():
        if name in ("causal", "need_lse", "seed"):  # the seed only matters with dropout
            continue
        if name == "scale":
            if value is not None and not value > 0:
                return f"scale {value} is not > 0 (the scale is folded into the exp2)"
        elif name == "causal_offset":
            reason = offset_reason(q, k, value, options.get("causal"), options.get("variant"))
            if reason is not None:
                return reason
        elif name == "dropout_p":
            if value:
                return "dropout"
        elif name == "variant":
            if value is None or value is PLAIN:
                continue
            if variants:
                reason = _reason_for_variant(q, value)
                if reason is not None:
                    return reason
            elif value.left >= 0 or value.right >= 0:
                return "a sliding window"
            elif value.softcap or value.alibi is not None or value.sinks is not None:
                return "softcap, ALiBi or sinks"
            elif value.seq != SEQ_DENSE:
                return "a ranges or varlen batch layout"
        elif name in ("softcap", "mask", "attn_mask", "window", "sinks", "alibi_slopes"):
            if value is not None and (name != "softcap" or value):
                if variants and name not in ("mask", "attn_mask"):
                    return f"{name} is given by name: the kernel takes it in variant= (a Variant)"
                return "softcap" if name == "softcap" else f"{name} is set"
        else:
            return f"option {name!r} is not handled by the Hopper kernel"
    return None


# The fast path is on only for the triton releases it was verified with on the H100 (a newer
# triton may lower descriptors differently); FLASHATTN_LITE_HOPPER=0 turns it off.
TESTED_TRITON = ("3.6.",)
# Below this much work (B·Hq·Nq·Nk·D; 2³² is ~17 GFLOP, ~35 µs on the H100) the call is short
# enough that Triton's own launch path (the descriptors are built per call) costs more than the
# faster kernel saves: the portable kernel's bound launch takes it.
MIN_WORK = 2 ** 32


def enabled() -> bool:
    """``FLASHATTN_LITE_HOPPER``: unset or 1 (default) on, 0 off; anything else is an error, not
    a guess."""
    return _checks.env_flag("FLASHATTN_LITE_HOPPER", True)


@contextlib.contextmanager
def disabled():
    """Inside the block, attention calls (forward and backward) and MLA decoding take the portable
    kernels (to compare both paths)."""
    from . import attention_bwd, attention_fwd, decode
    saved = os.environ.get("FLASHATTN_LITE_HOPPER")
    os.environ["FLASHATTN_LITE_HOPPER"] = "0"
    attention_fwd._HOPPER.clear()
    attention_bwd._HOPPER.clear()
    decode._PLANS.clear()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FLASHATTN_LITE_HOPPER")
        else:
            os.environ["FLASHATTN_LITE_HOPPER"] = saved
        attention_fwd._HOPPER.clear()
        attention_bwd._HOPPER.clear()
        decode._PLANS.clear()


_warned_untested: list = []


def triton_tested(q) -> bool:
    """Whether this triton is one the Hopper kernels were tested on. On an sm_90 device with another
    one every call runs the portable kernels, well below the Hopper ones: said once, in a warning."""
    if triton.__version__.startswith(TESTED_TRITON):
        return True
    if not _warned_untested and _device_reason(q, q, q) is None:
        _warned_untested.append(triton.__version__)
        warnings.warn(f"flashattn_lite: triton {triton.__version__} on an sm_90 GPU: the Hopper kernels are "
                      f"tested on triton {TESTED_TRITON[0]}x only, so the portable kernels run "
                      f"(0.3-0.9 x as fast, by head dim); install triton {TESTED_TRITON[0]}x for them",
                      stacklevel=2)
    return False


def fast_path(q, k, v, causal: bool, causal_offset: int, scale: float, variant: Variant = PLAIN) -> bool:
    """Whether an attention forward without mask or dropout takes this kernel (decided once per call
    signature by ``attention_forward``; the base pointers' alignment is checked on every call there)."""
    if not enabled() or not triton_tested(q):
        return False
    if supported(q, k, v, causal=causal, causal_offset=causal_offset, scale=scale, variant=variant) is not None:
        return False
    B, Hq, Nq, D = q.shape
    return B * Hq * Nq * k.shape[2] * D >= MIN_WORK


def path_note(variant: Variant = PLAIN, kernel: str = "the Triton TMA kernel") -> str:
    """What ``explain()`` says of a call a Hopper forward takes (``note_path``): its options, then
    ``kernel`` (the Gluon module passes its own name)."""
    options = [name for name, on in (("softcap", variant.softcap > 0), ("ALiBi", variant.alibi is not None),
                                     ("sinks", variant.sinks is not None),
                                     ("a sliding window", variant.left >= 0 or variant.right >= 0),
                                     ("per-row key ranges", variant.seq == SEQ_RANGES),
                                     ("a packed varlen batch", variant.seq == SEQ_VARLEN)) if on]
    call = f"an fp16/bf16 call with {', '.join(options)}" if options else "a plain fp16/bf16 call"
    return f"{call} on sm_90: {kernel} (FLASHATTN_LITE_HOPPER=0 turns the Hopper paths off)"


def _device_reason(q, k, v) -> str | None:
    """Why q, k, v are not on a device this kernel runs on (CUDA, sm_90), or None."""
    if not (q.is_cuda and k.device == q.device and v.device == q.device):
        return "not CUDA tensors on one device"
    if torch.version.hip is not None or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "not an sm_90 (Hopper) device"
    return None


def supported(q, k, v, **options) -> str | None:
    """None when ``attention_forward_hopper`` covers this call, else the reason in words
    (``covered`` at this kernel's head dims).

    Covered: CUDA tensors on an sm_90 device, fp16/bf16, q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D) with
    Hq a multiple of Hkv and D ∈ {64, 128}, last stride 1, base and other strides 16-byte aligned
    (TMA's rules), and options no more than ``causal``, a positive ``scale``, the default
    ``causal_offset`` (Nk − Nq; any offset where it changes nothing: ``offset_reason``), ``need_lse``
    and a dense-batch ``variant`` (softcap, ALiBi, sinks,
    a window: ``_reason_for_variant``); masks, dropout and ranges/varlen layouts are not, nor the
    variant options given by name. CPU tensors are never covered, even under the interpreter (the
    tests call ``attention_forward_hopper`` directly)."""
    return covered(q, k, v, HEAD_DIMS, options)


def covered(q, k, v, head_dims: tuple, options: dict, any_value_dim: bool = False) -> str | None:
    """``supported``'s rules with the head dims ``head_dims``: the Gluon forward's rules are these at
    its own head dims, and with ``any_value_dim`` v's head dim may differ from q's (the Gluon
    kernels check it themselves)."""
    if not _HAS_TMA:
        return f"triton {triton.__version__} has no tensor descriptors"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "q, k, v are not 4-D tensors"
    reason = _device_reason(q, k, v)
    if reason is not None:
        return reason
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (fp16/bf16 only, one dtype for q, k, v)"
    (B, Hq, Nq, D), (Bk, Hkv, Nk, Dk) = q.shape, k.shape
    Dv = v.shape[3] if any_value_dim else D
    if tuple(v.shape) != (Bk, Hkv, Nk, Dv) or Bk != B or Dk != D or Hkv == 0 or Hq % Hkv != 0:
        if any_value_dim:
            return "shapes are not q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv) with Hkv dividing Hq"
        return "shapes are not q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D) with Hkv dividing Hq"
    if D not in head_dims:
        return f"head dim {D} (only {head_dims}" + (")" if any_value_dim else ", and Dv == D)")
    if min(B, Hq, Nq, Nk) == 0:
        return "an empty tensor"
    if max(Nq, Nk) >= 2 ** 31 - 2 ** 16:
        return "a sequence too long for int32 TMA coordinates"
    if max(q.numel(), k.numel(), v.numel(), q.numel() // D * Dv) >= 2 ** 31:  # (the last: o's, dO's)
        return "2³¹ elements or more (the > 2³¹ tests have not run on this kernel yet)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _tensor_reason(name, t)
        if reason is not None:
            return reason
    return _reason_for_options(q, k, options, variants=True)


def attention_forward_hopper(q, k, v, scale: float, causal: bool, *, variant: Variant = PLAIN,
                             config: Config | None = None):
    """o, lse = softmax(scores) · v and its natural-log lse, the scores scale·q·kᵀ with
    ``variant``'s options (softcap, ALiBi, window; sinks in the denominator), causal bottom-right.

    q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D); call only where ``supported`` returned None (the CPU
    interpreter runs it too, for tests). ``variant``: as ``attention_forward`` takes it (a dense
    batch; ``causal`` caps its right side at 0 here). Returns o (B, Hq, Nq, D) in q's dtype and
    layout (``output_buffers``) and lse (B, Hq, Nq) float32; a row with no visible key (causal with Nq > Nk, a window)
    has o = 0, lse = −inf (with sinks: the sink's logit). ``config``: one of ``CONFIGS`` (default:
    ``default_config``). Cost: like the portable kernel, one pass over the visible K/V tiles per
    query tile, O(N·D) memory."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = config or default_config(D, causal, max(Nq, Nk))
    o, lse = output_buffers(q, v.shape[3], variant, True)  # a dense batch: o in q's layout
    q_block, kv_block = [1, 1, cfg.block_m, D], [1, 1, cfg.block_n, D]
    descriptors = (TensorDescriptor(q, list(q.shape), list(q.stride()), q_block),
                   TensorDescriptor(k, list(k.shape), list(k.stride()), kv_block),
                   TensorDescriptor(v, list(v.shape), list(v.stride()), kv_block),
                   TensorDescriptor(o, list(o.shape), list(o.stride()), q_block))
    if variant is PLAIN:  # the common call: no walk over the options
        tensors, alibi_strides, scalars, sides = (q, q), (0, 0), (0.0, 0.0), (-1, -1)
        flags = dict(HAS_LEFT=False, HAS_RIGHT=bool(causal), SOFTCAP=False, ALIBI=False, SINKS=False, FAST_TANH=False)
    else:  # the options as the portable kernel takes them
        variant = causal_window(variant, causal)
        tensors, alibi_strides, scalars, constexprs = score_args(variant, q, scale)
        sides = (variant.left, variant.right)
        flags = {name: constexprs[name] for name in ("HAS_LEFT", "HAS_RIGHT", "SOFTCAP", "ALIBI", "SINKS", "FAST_TANH")}
    grid = (cdiv(Nq, cfg.block_m) * B * Hq,)
    _attn_fwd_hopper_kernel[grid](
        *descriptors, lse, *tensors, *alibi_strides, Hq, Nq, Nk, *sides, scale * LOG2E, *scalars,
        GROUP=Hq // Hkv, HEAD_DIM=D, CAUSAL=bool(causal), **flags, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse
