"""Integrations: the SDPA drop-in and ``replace_sdpa`` (here), HuggingFace transformers (``hf``,
optional extra)."""
from .sdpa import SDPAReplacement, SDPAUnsupportedError, replace_sdpa, scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention", "replace_sdpa", "SDPAReplacement", "SDPAUnsupportedError"]
