"""Where each token of a sequence lives across the W ranks of a group (sequence / context parallelism).

A layout maps a global sequence of W·n tokens onto W shards of n tokens, each shard a few *runs*
of consecutive global positions stored one after another:

- ``"contiguous"``: rank r holds tokens [r·n, (r+1)·n).
- ``"zigzag"``: the sequence is cut into 2W chunks of n/2; rank r holds chunk r, then chunk
  2W−1−r. Under a causal mask every rank then has the same amount of visible (query, key) work,
  where with contiguous shards the last rank has W times the first's.

``runs`` is the one definition of both layouts: sharding, unsharding and ring attention's
schedule all read it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _checks
from ._group import Group, agree, describe

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")


def runs(layout: str, rank: int, world: int, n_local: int) -> list[tuple[int, int, int]]:
    """Rank ``rank``'s shard as runs (local start, global start, length), in local order."""
    if layout == "contiguous":
        return [(0, rank * n_local, n_local)]
    c = n_local // 2
    return [(0, rank * c, c), (c, (2 * world - 1 - rank) * c, c)]


def _check_dim(x, dim) -> int:
    """TypeError for a non-tensor x or a non-int dim, IndexError for a dim out of range (torch's way)."""
    _checks.check_tensor("x", x, dtypes=None)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to shard along, got a 0-d tensor")
    return _checks.normalize_dim(dim, x.dim())


def _chunks(layout: str, world: int) -> int:
    """How many equal chunks a layout cuts the sequence into."""
    return 2 * world if layout == "zigzag" else world


def shard(x: torch.Tensor, dim: int, *, group=None, layout: str = "zigzag") -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim`` (a new tensor; no communication).

    ``x.shape[dim]`` must be a multiple of W (2W for zigzag), W the size of ``group`` (default: the
    whole world). Differentiable: the gradient flows back into the shard's positions of ``x``."""
    g = Group(group)
    check_layout(layout)
    d = _check_dim(x, dim)
    parts = _chunks(layout, g.world)
    if x.shape[d] % parts != 0:
        raise ValueError(f"x size along dim {dim} ({x.shape[d]}) must be a multiple of {parts} to shard it over "
                         f"{g.world} ranks with layout={layout!r}")
    n = x.shape[d] // g.world
    return torch.cat([x.narrow(d, start, length) for _, start, length in runs(layout, g.rank, g.world, n)], d)


def unshard(x: torch.Tensor, dim: int, *, group=None, layout: str = "zigzag") -> torch.Tensor:
    """The full tensor from every rank's shard ``x`` along ``dim``: one all-gather, then the shards'
    runs put back in global order. Every rank of ``group`` must call it with shards of one shape.

    Not differentiable (a gather for evaluation and checks; the result does not track gradients).
    Memory: the full tensor, on every rank."""
    g = Group(group)
    error = None
    try:
        check_layout(layout)
        d = _check_dim(x, dim)
        g.check_device("x", x)
        if layout == "zigzag" and x.shape[d] % 2 != 0:
            raise ValueError(f"x size along dim {dim} ({x.shape[d]}) must be even for layout='zigzag'")
    except Exception as e:  # noqa: BLE001 - raised on every rank by agree, not here alone
        error = e
    agree(g, "unshard", error, {"x": describe(x), "dim": repr(dim), "layout": repr(layout)})
    x = x.detach().contiguous()
    gathered = [torch.empty_like(x) for _ in range(g.world)]
    dist.all_gather(gathered, x, group=g.pg)
    n = x.shape[d]
    pieces = sorted(((start, part.narrow(d, local, length))
                     for r, part in enumerate(gathered) for local, start, length in runs(layout, r, g.world, n)),
                    key=lambda piece: piece[0])
    return torch.cat([p for _, p in pieces], d)
