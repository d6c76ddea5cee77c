"""Sequence (context) parallelism over ``torch.distributed``: ring attention and the sharding of a
sequence across the ranks of a process group."""
from .ring import ring_attention
from .sharding import LAYOUTS, shard, unshard

__all__ = ["ring_attention", "shard", "unshard", "LAYOUTS"]
