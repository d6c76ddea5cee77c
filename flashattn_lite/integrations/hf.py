"""HuggingFace transformers: run any model that uses the attention interface on our kernel.

    import flashattn_lite.integrations.hf                 # registers "fa_lite"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_lite")

Why "fa_lite" and not "flashattn_lite": transformers treats every implementation name containing
"flash" as a FlashAttention kernel to fetch from the Hub (``is_flash_attention_requested`` is a
substring test; ``_check_and_adjust_attn_implementation`` then calls
``lazy_import_flash_attention(name)``, which raises "Could not find the currently requested flash
attention implementation" for a name that is not a Hub repo), and also skips building masks for
such names in places. So no name with "flash" in it can work; ``register`` refuses one.

The mask: a custom attention receives ``attention_mask=None`` unless a mask function is
registered under the same name in ``AttentionMaskInterface`` (padding would then be silently
ignored). We register the "sdpa" mask function: a bool (B, 1, L, S) mask, or None when the mask
is purely causal (then ``is_causal`` is used, exactly as transformers' SDPA path does).
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from .sdpa import SDPAUnsupportedError, scaled_dot_product_attention

ATTN_IMPLEMENTATION = "fa_lite"

__all__ = ["ATTN_IMPLEMENTATION", "register", "attention_forward"]

_warned: set = set()


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                      scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: query (B, Hq, L, D), key/value (B, Hkv, S, D)
    (grouped heads are read in place, never repeated); returns ((B, L, Hq, D), None).

    Follows transformers' ``sdpa_attention_forward`` decisions (causal only for L > 1 without a
    mask, top-left; keys past L are cropped for an empty static cache), and falls back to it, with
    one warning per case, for what our kernel does not do (e.g. float64, head dim > 256,
    ``position_bias``)."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{ATTN_IMPLEMENTATION} attention does not support `softcap`; use `eager` or `flex_attention`")
    if kwargs.get("output_attentions", False):
        warnings.warn(f"{ATTN_IMPLEMENTATION} attention does not return attention weights (output_attentions)")
    try:
        if kwargs.get("position_bias") is not None:
            raise SDPAUnsupportedError("position_bias", "position_bias (T5-style biases) is not supported")
        if kwargs.get("cache") is not None:
            raise SDPAUnsupportedError("paged-cache", "paged caches (continuous batching) are not supported")
        q_len = query.shape[2]
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        is_causal = q_len > 1 and attention_mask is None and is_causal
        if is_causal and key.shape[2] > q_len:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                           is_causal=bool(is_causal), scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    except SDPAUnsupportedError as e:
        if e.case not in _warned:
            _warned.add(e.case)
            warnings.warn(f"{ATTN_IMPLEMENTATION}: falling back to transformers' sdpa attention: {e}")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register ``attention_forward`` (and the SDPA mask function) under ``name``; idempotent.

    Returns the name to pass as ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(f"attn_implementation names containing 'flash' are taken by transformers for Hub "
                         f"FlashAttention kernels (and get no mask); use another name, e.g. {ATTN_IMPLEMENTATION!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


register()
