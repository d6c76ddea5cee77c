"""A small paged KV cache for generation loops, on top of ``decode``'s paged layout.

K and V of every layer live in one pool of fixed-size blocks, (layers, num_blocks, Hkv, block_size, D);
each sequence owns a list of blocks, recorded in a block table. Blocks are handed out on demand and
returned when a sequence is freed, so sequences of very different lengths share memory without
reserving their maximum length up front (the PagedAttention idea).

One generation step, for a set of sequences each gaining the same number n of new tokens::

    step = cache.append(seq_ids, n)          # allocate blocks, advance lengths (host bookkeeping)
    for layer in range(num_layers):
        ...
        step.write(layer, k_new, v_new)      # (len(seq_ids), Hkv, n, D) into their cache slots
        o = step.attend(layer, q)            # decode() over the whole cached prefix, causal
    cache.free(seq_id)                       # when a sequence finishes

The allocator is host-side, so block ids and lengths are valid by construction and ``decode`` does
not need its (synchronising) value checks.

MLA's latent cache (DeepSeek-V2/V3 decoding with the projections absorbed) stores each token once:
``v_from_k=True`` keeps one tensor, v the first ``head_dim_v`` columns of k (a view). At MLA's widths
(576 / 512) ``decode`` then takes V from the K tile it loaded, and on sm_90 (16-bit, blocks of a
multiple of 64 rows, a scale > 0; ``decode_mla_gluon.reason``) runs its Gluon kernel::

    cache = PagedKVCache(layers, 1, 576, head_dim_v=512, v_from_k=True, block_size=64, ...)
    step.write(layer, latent_rows)           # (B, 1, num_new, 576): no v_new
    o = step.attend(layer, q, scale=(128 + 64) ** -0.5)  # the model's scale: not the default 576 ** -0.5
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from . import _checks
from .ops.decode import MLA_HEAD_DIMS, decode


def _index(name: str, value, stop: int) -> int:
    """An int in [0, stop): a float is not truncated, and a negative one does not count from the end
    (it would name another sequence's slot or another layer)."""
    i = _checks.as_int(name, value)
    if not 0 <= i < stop:
        raise ValueError(f"{name} must be in [0, {stop}), got {i}")
    return i


@dataclass
class PagedStep:
    """The slots and tables of one ``PagedKVCache.append`` call (a batch of the sequences)."""
    cache: "PagedKVCache"
    seq_ids: list[int]
    num_new: int
    block_table: torch.Tensor     # (B, max_blocks) int32, rows of the chosen sequences
    seqlens: torch.Tensor         # (B,) int32, lengths including the new tokens
    positions: torch.Tensor       # (B, num_new) int64, absolute positions of the new tokens
    slot_block: torch.Tensor      # (B, num_new) int64, block holding each new token
    slot_offset: torch.Tensor     # (B, num_new) int64, row inside that block
    lives: list[int]              # each sequence slot's lifetime at the append (``PagedKVCache.free`` ends one)

    def _check_live(self) -> None:
        """A step outlives a ``free`` of its sequences: its slots and table rows may belong to another
        sequence by then, so using it would write into or read that sequence's cache."""
        for s, life in zip(self.seq_ids, self.lives):
            if self.cache._lives[s] != life:
                raise RuntimeError(f"this step is stale: sequence {s} was freed after the step's append (its "
                                   "blocks may belong to another sequence now); append a new step")

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor | None = None) -> None:
        """Store the new tokens' keys/values: k_new (B, Hkv, num_new, D), v_new (B, Hkv, num_new, Dv);
        with ``v_from_k`` k_new alone (its first Dv columns are the values). The cache stores values
        (cast to its dtype), not autograd history: ``decode`` is inference only."""
        layer = _index("layer", layer, self.cache.num_layers)
        self._check_live()
        if self.cache.v_from_k != (v_new is None):
            raise ValueError("v_new must be None for a cache made with v_from_k=True (the values are k's first "
                             "head_dim_v columns)" if self.cache.v_from_k else "v_new is required (the cache "
                             "keeps values apart from keys; v_from_k=True makes them k's first columns)")
        want = (len(self.seq_ids), self.cache.num_kv_heads, self.num_new)
        for name, t, width in (("k_new", k_new, self.cache.k.shape[-1]), ("v_new", v_new, self.cache.v.shape[-1])):
            if t is None:
                continue
            _checks.check_tensor(name, t, dtypes=None)
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {str(t.dtype).replace('torch.', '')}")
            if tuple(t.shape) != want + (width,):
                raise ValueError(f"{name} must have shape (B, Hkv, num_new, D) = {want + (width,)}, "
                                 f"got {tuple(t.shape)}")
            if t.device != self.cache.device:
                raise ValueError(f"{name} must be on the cache's device {self.cache.device}, got {t.device}")
        # Advanced indexing on (block, offset) selects (B, num_new, Hkv, D) slots. Without no_grad, an input
        # that requires grad would make the whole pool part of its graph, kept alive step after step.
        with torch.no_grad():
            self._store(layer, k_new, v_new)

    def _store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor | None) -> None:
        self.cache.k[layer][self.slot_block, :, self.slot_offset] = k_new.transpose(1, 2).to(self.cache.dtype)
        if v_new is not None:
            self.cache.v[layer][self.slot_block, :, self.slot_offset] = v_new.transpose(1, 2).to(self.cache.dtype)

    def attend(self, layer: int, q: torch.Tensor, **kwargs):
        """``decode`` of q (B, Hq, n, D) against this layer's cache, causal: q's rows are the step's last
        n ≤ num_new new tokens (all of them, or e.g. only the last, whose logits a prefill needs)."""
        layer = _index("layer", layer, self.cache.num_layers)
        self._check_live()
        _checks.check_tensor("q", q, ndim=4, dtypes=None)
        if q.shape[0] != len(self.seq_ids) or not 1 <= q.shape[2] <= self.num_new:
            raise ValueError(f"q must have shape (B, Hq, n, D) with B = {len(self.seq_ids)} sequences and n in "
                             f"[1, num_new = {self.num_new}] (the step's last n new tokens), got {tuple(q.shape)}")
        if q.dtype != self.cache.dtype:  # (decode's own message would name k_cache, not the cache's dtype=)
            raise ValueError(f"q must have the cache's dtype ({str(self.cache.dtype).replace('torch.', '')}: "
                             f"PagedKVCache(dtype=...)), got {str(q.dtype).replace('torch.', '')}")
        return decode(q, self.cache.k[layer], self.cache.v[layer], self.seqlens, block_table=self.block_table,
                      **kwargs)


class PagedKVCache:
    """Paged K/V storage for ``num_layers`` layers and up to ``max_seqs`` live sequences.

    Args:
        num_layers, num_kv_heads, head_dim: model geometry (``head_dim_v`` defaults to head_dim).
        num_blocks: blocks in the pool, shared by all sequences and layers' tables.
        block_size: tokens per block (16 is vLLM's default; larger blocks mean fewer table lookups).
        max_seqs: sequence slots (ids 0 … max_seqs − 1).
        max_seq_len: longest sequence supported (sets the block-table width).
        v_from_k: values are the first ``head_dim_v`` columns of the keys, stored once (MLA's latent
            cache: ``v`` is a view of ``k``); ``PagedStep.write`` then takes no ``v_new``.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *, num_blocks: int,
                 block_size: int = 16, max_seqs: int, max_seq_len: int, dtype=torch.float16,
                 device="cpu", head_dim_v: int | None = None, v_from_k: bool = False):
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_blocks", num_blocks), ("block_size", block_size), ("max_seqs", max_seqs),
                            ("max_seq_len", max_seq_len)):
            _checks.check_positive_int(name, value)
        if dtype not in _checks.FLOAT_DTYPES:
            raise TypeError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype!r}")
        if not isinstance(v_from_k, bool):
            raise TypeError(f"v_from_k must be a bool, got {type(v_from_k).__name__}")
        if head_dim_v is not None and (not isinstance(head_dim_v, int) or isinstance(head_dim_v, bool)
                                       or head_dim_v < 1):
            raise ValueError(f"head_dim_v must be an int ≥ 1 or None, got {head_dim_v!r}")
        dv = head_dim if head_dim_v is None else head_dim_v
        if v_from_k and not 1 <= dv <= head_dim:
            raise ValueError(f"v_from_k=True takes the values from the keys' first head_dim_v columns: head_dim_v "
                             f"must be in [1, head_dim={head_dim}], got {dv}")
        if max(head_dim, dv) > 256 and (head_dim, dv) != MLA_HEAD_DIMS:  # what ``decode`` runs
            raise ValueError(f"head_dim and head_dim_v must be at most 256, or MLA's {MLA_HEAD_DIMS[0]} and "
                             f"{MLA_HEAD_DIMS[1]}; got {head_dim} and {dv}")
        if max(head_dim, dv) > 256 and dtype == torch.float32:
            raise TypeError(f"MLA's widths ({MLA_HEAD_DIMS[0]} / {MLA_HEAD_DIMS[1]}) are decoded in float16 or "
                            "bfloat16 only: dtype must be one of them, got torch.float32")
        self.num_layers, self.num_kv_heads, self.block_size = num_layers, num_kv_heads, block_size
        self.max_seq_len = max_seq_len
        self.dtype, self.v_from_k = dtype, v_from_k
        self.k = torch.zeros(num_layers, num_blocks, num_kv_heads, block_size, head_dim, dtype=dtype, device=device)
        self.device = self.k.device  # "cuda" names cuda:0 once allocated; inputs are compared with this
        self.v = self.k[..., :dv] if v_from_k else \
            torch.zeros(num_layers, num_blocks, num_kv_heads, block_size, dv, dtype=dtype, device=device)
        self.max_blocks = -(-max_seq_len // block_size)
        # Host copies are the truth; the device tables are refreshed with one copy per change.
        self._table_host = torch.full((max_seqs, self.max_blocks), -1, dtype=torch.int32)
        self._lens_host = torch.zeros(max_seqs, dtype=torch.int32)
        self.block_table = self._table_host.to(device)
        self.seqlens = self._lens_host.to(device)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._blocks: list[list[int]] = [[] for _ in range(max_seqs)]
        self._lens = [0] * max_seqs
        self._lives = [0] * max_seqs  # bumped by ``free``: a step of an earlier lifetime is stale

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def length(self, seq_id: int) -> int:
        return self._lens[_index("seq_id", seq_id, len(self._lens))]

    def append(self, seq_ids: Sequence[int], num_new: int) -> PagedStep:
        """Make room for ``num_new`` tokens at the end of each sequence in ``seq_ids`` and advance
        their lengths. Raises RuntimeError if the pool or a sequence's table would overflow
        (nothing is changed then)."""
        _checks.check_positive_int("num_new", num_new)
        seq_ids = list(seq_ids)
        if not seq_ids:
            raise ValueError("seq_ids must name at least one sequence")
        seq_ids = [_index(f"seq_ids[{i}]", s, len(self._lens)) for i, s in enumerate(seq_ids)]
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must be distinct, got {seq_ids}")
        bs = self.block_size
        need = [-(-(self._lens[s] + num_new) // bs) - len(self._blocks[s]) for s in seq_ids]
        if any(self._lens[s] + num_new > self.max_seq_len for s in seq_ids):
            raise RuntimeError(f"a sequence would exceed max_seq_len ({self.max_seq_len} tokens)")
        if sum(need) > len(self._free):
            raise RuntimeError(f"out of KV blocks: need {sum(need)}, {len(self._free)} free")
        positions, blocks, offsets = [], [], []
        for s, n in zip(seq_ids, need):
            for _ in range(n):
                blk = self._free.pop()
                self._table_host[s, len(self._blocks[s])] = blk
                self._blocks[s].append(blk)
            pos = list(range(self._lens[s], self._lens[s] + num_new))
            self._lens[s] += num_new
            self._lens_host[s] = self._lens[s]
            positions.append(pos)
            blocks.append([self._blocks[s][p // bs] for p in pos])
            offsets.append([p % bs for p in pos])
        self._sync()
        ids = torch.tensor(seq_ids, device=self.device)
        as_t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)  # noqa: E731
        return PagedStep(self, seq_ids, num_new, self.block_table[ids], self.seqlens[ids],
                         as_t(positions), as_t(blocks), as_t(offsets), [self._lives[s] for s in seq_ids])

    def free(self, seq_id: int) -> None:
        """Return a sequence's blocks to the pool; its slot can start a new sequence."""
        seq_id = _index("seq_id", seq_id, len(self._lens))
        self._free.extend(reversed(self._blocks[seq_id]))
        self._blocks[seq_id] = []
        self._lens[seq_id] = 0
        self._lives[seq_id] += 1
        self._table_host[seq_id] = -1
        self._lens_host[seq_id] = 0
        self._sync()

    def _sync(self) -> None:
        self.block_table.copy_(self._table_host)
        self.seqlens.copy_(self._lens_host)


__all__ = ["PagedKVCache", "PagedStep"]
