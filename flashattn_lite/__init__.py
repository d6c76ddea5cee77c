"""flashattn_lite: exact attention and softmax in Triton, fast and memory-lean at any length."""
from .ops.attention import attention, attention_varlen
from .ops.softmax import log_softmax, logsumexp, softmax
from . import nn  # noqa: F401
from .integrations.sdpa import replace_sdpa, scaled_dot_product_attention
from .ops.decode import decode
from .ops.merge_states import merge_attention_states, merge_attention_states_stacked
from .warmup import warmup
from .explain import explain
from ._log import fallback_counts

__all__ = ["attention", "attention_varlen", "scaled_dot_product_attention", "replace_sdpa", "nn", "softmax", "log_softmax",
           "logsumexp", "merge_attention_states", "merge_attention_states_stacked", "decode",
           "warmup", "explain", "fallback_counts"]
__version__ = "0.1.0"
