"""HuggingFace transformers: run any model that uses the attention interface on our kernel.

    import flashattn_lite.integrations.hf                 # registers "fa_lite"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_lite")

Why "fa_lite" and not "flashattn_lite": transformers treats every implementation name containing
"flash" as a FlashAttention kernel to fetch from the Hub (``is_flash_attention_requested`` is a
substring test; ``_check_and_adjust_attn_implementation`` then calls
``lazy_import_flash_attention(name)``, which raises for a name that is not a Hub repo), and also
skips building masks for such names in places. So no name with "flash" in it can work; ``register``
refuses one.

What reaches the kernel. transformers builds one mask per forward and mask type through the mask
function registered under the implementation's name, and hands it to every layer. Ours,
``range_mask``, builds no (L, S) mask: it recognises the mask pattern (causal, causal sliding
window, bidirectional) and turns the 2-D padding mask into per-row ``[start, end)`` ranges of
valid queries and keys (a ``RangeMask``, O(B)), with the one device sync of the forward spent on
checking that each row's valid tokens are one contiguous run (left or right padding, prefill,
generation with a dynamic, static or sliding-window cache, decode steps). ``attention_forward`` then
calls ``attention_core`` with those ranges and the layer's options:

- ``sliding_window`` W (transformers shows query i the keys i − W < j ≤ i): ``window=(W − 1, 0)``;
- ``softcap`` (Gemma 2): the kernel's softcap; ``s_aux`` (gpt-oss sinks): the kernel's ``sinks``;
- ``scaling``, ``dropout`` and grouped key/value heads (read in place, never repeated).

Keywords known to change nothing here (``position_ids``, cache bookkeeping, output flags; see
``_HARMLESS``) are ignored, and so is any keyword set to None (off). Everything else falls back to
transformers' own attention, announced through ``flashattn_lite._log.note_fallback("hf", reason)``
(a warning the first time, a counter always, ``fallback_counts()``): any other keyword with a value
(named in the reason), padding that is not one run per row, mask patterns other than the three
above (chunked attention, packed sequences, image-token overlays), attention dropout in a padded
batch, dtypes other than fp16/bf16/fp32 and head dims above 256. The fallback is transformers'
``sdpa``, or the model's ``eager`` attention, whichever takes the layer's keywords (``_fallback``),
with the dense mask transformers would have built (built then, for the layers that fall back); a
keyword neither takes by name raises instead of being dropped.

A 4-D mask the caller built runs on our kernel as given (bool, or float added to the scores; the
mask alone says what is visible, as in eager and sdpa); without any mask we follow transformers'
sdpa (causal for L > 1, top-left), and apply a ``sliding_window`` as its flash_attention_2 path
does (sdpa and eager would drop it there). Query rows that are padding give zeros (eager gives left pads a
mean over masked keys and right pads the valid prefix): their outputs never reach a valid position,
but a loss must not read them.
"""
from __future__ import annotations

import inspect
import sys
import warnings
from typing import Optional

import torch

from .. import _checks
from .._log import note_fallback
from ..ops import attention as _attention

ATTN_IMPLEMENTATION = "fa_lite"

__all__ = ["ATTN_IMPLEMENTATION", "register", "attention_forward", "range_mask", "RangeMask"]

# Keywords models pass to the attention function that do not change its result: positions are
# already in q and k (rotary), and the mask carries padding and packing; the rest is bookkeeping
# for caches and outputs (read from the attention calls of transformers' models and TransformersKwargs).
_HARMLESS = frozenset({"position_ids", "cache_position", "use_cache", "past_key_values", "output_attentions",
                       "output_hidden_states", "output_router_logits", "num_items_in_batch", "deterministic"})
# Keywords of packed sequences whose content transformers also puts into the dense mask it builds
# for a fallback (from position_ids), so the fallback may leave them unread.
_IN_THE_MASK = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"})
# The call's own settings, which every fallback takes (sliding_window through the dense mask).
_SETTINGS = frozenset({"dropout", "scaling", "is_causal", "sliding_window"})


class RangeMask:
    """What ``range_mask`` returns in place of a (B, 1, L, S) mask: the pattern (causal, sliding
    window) as Python values and the valid positions of each row as int32 (B, 2) ``[start, end)``
    ranges on the model's device (None when every position is valid and queries end where keys
    do). ``fallback`` says why the mask cannot run as ranges (then ``dense`` builds transformers'
    mask, once per kind, only for the layers that need it)."""

    def __init__(self, mask_args: dict, causal: bool = True, window: Optional[int] = None,
                 q_ranges: Optional[torch.Tensor] = None, k_ranges: Optional[torch.Tensor] = None,
                 fallback: Optional[str] = None):
        self.causal, self.window, self.fallback = causal, window, fallback
        self.q_ranges, self.k_ranges = q_ranges, k_ranges
        self.q_length, self.kv_length = mask_args["q_length"], mask_args["kv_length"]
        self._mask_args = mask_args
        self._dense: dict = {}

    # generate() builds the masks of compileable (static) caches ahead of the forward and calls
    # ``.contiguous()`` on them; the model's mask creation then passes on a mask that is not 2-D.
    ndim = 4

    def contiguous(self) -> "RangeMask":
        return self

    def dense(self, kind: str) -> Optional[torch.Tensor]:
        """transformers' own mask for ``kind`` ("sdpa": bool or None, "eager": float additive)."""
        if kind not in self._dense:
            from transformers.masking_utils import eager_mask, sdpa_mask
            self._dense[kind] = (sdpa_mask if kind == "sdpa" else eager_mask)(**self._mask_args)
        return self._dense[kind]

    def __repr__(self) -> str:
        return (f"RangeMask(causal={self.causal}, window={self.window}, q_length={self.q_length}, "
                f"kv_length={self.kv_length}, ranges={self.k_ranges is not None}, fallback={self.fallback!r})")


def _captured(fn, factory) -> dict:
    """The variables ``fn`` captured, if it is a closure defined in ``factory`` (its code object is
    one of ``factory``'s constants); else {}."""
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__ or not any(c is code for c in factory.__code__.co_consts):
        return {}
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in fn.__closure__)))


def _pattern(mask_function) -> Optional[tuple[bool, Optional[int]]]:
    """(causal, sliding window) of the mask functions we run as ranges; None for any other."""
    from transformers import masking_utils as mu
    if mask_function is mu.causal_mask_function:
        return True, None
    if mask_function is mu.bidirectional_mask_function:
        return False, None
    parts = _captured(mask_function, mu.and_masks).get("mask_functions", ())
    if len(parts) == 2 and parts[1] is mu.causal_mask_function:
        window = _captured(parts[0], mu.sliding_window_overlay).get("sliding_window")
        if isinstance(window, int) and window > 0:
            return True, window
    return None


def _span(valid: torch.Tensor):
    """Per row of a bool (B, n): start and end of the valid run, and whether the valid positions
    are exactly that one non-empty run."""
    count = valid.sum(1)
    as_int = valid.to(torch.int32)
    start = as_int.argmax(1)  # first True
    end = valid.shape[1] - as_int.flip(1).argmax(1)
    return start, end, (end - start == count) & (count > 0)


def range_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
               mask_function=None, attention_mask: Optional[torch.Tensor] = None, **kwargs) -> RangeMask:
    """The mask function registered with ``AttentionMaskInterface`` (called once per forward and
    mask type). ``attention_mask`` is the 2-D padding mask (B, past + L), True = valid; query row r
    is position ``q_offset + r``, key column c position ``kv_offset + c``."""
    if isinstance(attention_mask, RangeMask):  # prepared by generate() for this step
        return attention_mask
    mask_args = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)
    pattern = _pattern(mask_function)
    if pattern is None:
        name = getattr(mask_function, "__qualname__", type(mask_function).__name__)
        return RangeMask(mask_args, fallback=f"mask pattern {name} (not causal, sliding-window causal or "
                                             "bidirectional)")
    causal, window = pattern
    device = kwargs.get("device", "cpu") if attention_mask is None else attention_mask.device

    def ranges(start, end):
        r = torch.stack([torch.as_tensor(start, device=device), torch.as_tensor(end, device=device)], -1)
        return r.to(torch.int32).expand(batch_size, 2) if r.dim() == 1 else r.to(torch.int32)

    if attention_mask is None:
        if not causal or (isinstance(q_offset, int) and q_offset + q_length == kv_offset + kv_length):
            return RangeMask(mask_args, causal, window)
        # A static cache: keys past the last query are empty slots (q_offset may be a tensor there,
        # so the end stays on the device).
        k_end = q_offset + q_length - kv_offset
        if isinstance(k_end, int) and not 0 < k_end <= kv_length:
            return RangeMask(mask_args, fallback=f"queries at {q_offset}… past the keys (kv_offset {kv_offset}, "
                                                 f"kv_length {kv_length})")
        return RangeMask(mask_args, causal, window, ranges(0, q_length), ranges(0, k_end))

    from transformers.masking_utils import prepare_padding_mask
    pad = prepare_padding_mask(attention_mask, kv_length, kv_offset).to(torch.bool)
    q0 = int(q_offset)  # a tensor only with static caches; the check below syncs anyway
    k_start, k_end, k_ok = _span(pad[:, kv_offset:kv_offset + kv_length])
    if causal:
        q_start, q_end, q_ok = _span(pad[:, q0:q0 + q_length])
        # Each row's last valid query must sit on its last valid key (bottom-right per sequence).
        ok = k_ok & q_ok & (q0 + q_end == kv_offset + k_end)
        full = (q_end - q_start == q_length) & (k_end - k_start == kv_length)
    else:
        q_start, q_end, ok, full = 0, q_length, k_ok, k_end - k_start == kv_length
    ok, full = torch.stack([ok.all(), full.all()]).tolist()  # the one device sync of a forward
    if not ok:
        return RangeMask(mask_args, fallback="a padding mask whose valid tokens are not one contiguous run per row")
    if full and (not causal or q0 + q_length == kv_offset + kv_length):
        return RangeMask(mask_args, causal, window)
    return RangeMask(mask_args, causal, window, ranges(q_start, q_end), ranges(k_start, k_end))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: query (B, Hq, L, D), key/value (B, Hkv, S, D);
    returns ((B, L, Hq, Dv), None). ``attention_mask`` is a ``RangeMask`` (from ``range_mask``), a
    4-D mask built by the caller, or None. What runs here and what falls back: the module docstring."""
    if kwargs.get("output_attentions", False):
        warnings.warn(f"{ATTN_IMPLEMENTATION} attention does not return attention weights (output_attentions)")
    options = dict(dropout=dropout, scaling=scaling, is_causal=is_causal, sliding_window=sliding_window,
                   softcap=softcap, s_aux=s_aux, **kwargs)
    reason = _unsupported(query, key, value, kwargs)
    if reason is None and isinstance(attention_mask, RangeMask):
        reason = attention_mask.fallback or _mismatch(attention_mask, query, key, sliding_window, dropout)
    elif reason is None and attention_mask is not None and (
            not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4):
        reason = f"an attention_mask of type {type(attention_mask).__name__} and shape " \
                 f"{tuple(getattr(attention_mask, 'shape', ()))} (a RangeMask, a 4-D mask or None is expected)"
    if reason is not None:
        return _fallback(module, query, key, value, attention_mask, reason, options)

    core = dict(scale=scaling, dropout_p=float(dropout), softcap=softcap, sinks=s_aux)
    if isinstance(attention_mask, RangeMask):
        m = attention_mask
        q_ranges, k_ranges = m.q_ranges, m.k_ranges
        if k_ranges is not None and k_ranges.device != query.device:  # a model split across devices
            q_ranges, k_ranges = q_ranges.to(query.device), k_ranges.to(query.device)
        out = _attention.attention_core(query, key, value, causal=m.causal,
                                        window=None if m.window is None else (m.window - 1, 0),
                                        q_ranges=q_ranges, k_ranges=k_ranges, **core)
    elif attention_mask is not None:
        out = _attention.attention_core(query, key, value, attn_mask=attention_mask, **core)
    else:
        # No mask: transformers' sdpa semantics (causal for L > 1, top-left, so keys past L are
        # the empty slots of a static cache). A sliding window as its flash_attention_2 path reads
        # it: W keys up to the query's own under causal, |i − j| < W otherwise (sdpa and eager drop
        # it without a mask).
        q_len = query.shape[2]
        causal = q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
        window = None
        if sliding_window is not None:
            w = _checks.check_positive_int("sliding_window", sliding_window) - 1
            window = (w, 0 if causal else w)
        out = _attention.attention_core(query, key, value, causal=bool(causal),
                                        causal_offset=0 if causal else None, window=window, **core)
    return out.transpose(1, 2).contiguous(), None


def _unsupported(query, key, value, kwargs) -> Optional[str]:
    """Why the call cannot run on our kernel whatever its mask (None if it can)."""
    for name, val in kwargs.items():
        # (None is off: an encoder's encoder_hidden_states=None, a cache-less call's cache=None)
        if val is not None and name not in _HARMLESS:
            return f"attention keyword {name!r} (not supported by {ATTN_IMPLEMENTATION})"
    if query.dtype not in _checks.FLOAT_DTYPES:
        return f"dtype {query.dtype} (the kernel takes float16, bfloat16, float32)"
    if query.shape[-1] > 256 or value.shape[-1] > 256:
        return f"head dims above 256 (query {query.shape[-1]}, value {value.shape[-1]})"
    return None


def _mismatch(m: RangeMask, query, key, sliding_window, dropout) -> Optional[str]:
    """Why a RangeMask does not fit this layer's call (None if it does)."""
    if key.shape[2] != m.kv_length or query.shape[2] != m.q_length:
        return f"query/key lengths ({query.shape[2]}, {key.shape[2]}) differ from the mask's " \
               f"({m.q_length}, {m.kv_length})"
    if sliding_window is not None and sliding_window != m.window:
        return f"sliding_window={sliding_window} with a mask of window {m.window}"
    if dropout > 0 and m.k_ranges is not None:
        return "attention dropout with padding (the kernel's ranges do not take dropout)"
    return None


def _fallback(module, query, key, value, attention_mask, reason: str, options: dict):
    """transformers' sdpa, or the model's eager attention, with the mask transformers would have
    built: sdpa where it takes every keyword the layer passes with a value (by name: position_bias),
    else the model's eager where it does (softcap and s_aux it applies in its own way, as gpt-oss's
    reads its sinks from the module; others by name, as a model's sinks=). Neither: an error naming the
    keywords (both functions take **kwargs and would drop them without a word)."""
    note_fallback("hf", reason)
    asked = {n for n, v in options.items() if v is not None and n not in _SETTINGS | _HARMLESS | _IN_THE_MASK}
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    eager_fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    for name, fn, applied in (("sdpa", sdpa_attention_forward, set()), ("eager", eager_fn, {"softcap", "s_aux"})):
        if fn is not None and asked - applied <= set(inspect.signature(fn).parameters):
            break
    else:
        raise NotImplementedError(
            f"{ATTN_IMPLEMENTATION}: {type(module).__name__} passes {', '.join(sorted(asked))} to its attention, "
            f"which neither this kernel nor a fallback ({'sdpa or its eager attention' if eager_fn else 'sdpa'}) "
            f"takes by name ({reason}); use attn_implementation='eager' or 'sdpa', where the model handles them itself")
    if isinstance(attention_mask, RangeMask):
        attention_mask = attention_mask.dense(name)
    elif name == "eager" and isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    dropout, scaling = options.pop("dropout"), options.pop("scaling")
    return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **options)


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register ``attention_forward`` and ``range_mask`` under ``name``; idempotent.

    Returns the name to pass as ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(f"attn_implementation names containing 'flash' are taken by transformers for Hub "
                         f"FlashAttention kernels (and get no mask); use another name, e.g. {ATTN_IMPLEMENTATION!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, range_mask)
    return name


register()
