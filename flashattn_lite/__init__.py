"""flashattn_lite: exact attention and softmax in Triton, fast and memory-lean at any length."""
from .ops.attention import attention

__all__ = ["attention"]
__version__ = "0.1.0"
