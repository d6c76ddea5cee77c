"""flashattn_lite: exact attention and softmax in Triton, fast and memory-lean at any length."""
from .ops.attention import attention
from .ops.softmax import log_softmax, logsumexp, softmax  # noqa: F401
from . import nn  # noqa: F401
from .integrations.sdpa import replace_sdpa, scaled_dot_product_attention
from .ops.decode import decode, merge_attention_states, merge_attention_states_stacked  # noqa: F401

__all__ = ["attention", "scaled_dot_product_attention", "replace_sdpa", "nn"]
__version__ = "0.1.0"
