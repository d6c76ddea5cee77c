"""Process-group plumbing for the sequence-parallel ops: who this rank is, arguments that every rank
agrees on before anything can hang, and the one communication pattern of a ring (each rank sends a
buffer to the next rank and receives the previous rank's).
"""
from __future__ import annotations

import functools
import hashlib
import json

import torch
import torch.distributed as dist

# The agreement's full record (only exchanged when something is wrong): a rank's error message and up
# to 12 argument descriptions, each cut to a bound, so that even escaped to JSON (≤ 12 bytes a
# character) the record fits.
_ERROR_CHARS, _FIELD_CHARS, _MAX_FIELDS = 400, 100, 12
_RECORD_BYTES = 12 * (_ERROR_CHARS + _MAX_FIELDS * (_FIELD_CHARS + 16)) + 64


class Group:
    """A resolved process group: this rank, the world size, the ring neighbours (as global ranks,
    which ``torch.distributed``'s point-to-point calls take) and the device its collectives use.

    Raises ValueError (on this rank, before any communication) when torch.distributed is not
    initialised, ``group`` is not a process group, or this process is not a member of it; the
    members of a group must be the ones that call, as for any collective."""

    def __init__(self, group):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialised (call "
                             "torch.distributed.init_process_group first, e.g. under torchrun)")
        # new_group hands processes outside the group a sentinel instead of a ProcessGroup.
        outside = type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER
        if group is not None and not outside and not isinstance(group, dist.ProcessGroup):
            raise ValueError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
        self.pg = dist.group.WORLD if group is None else group
        if outside or dist.get_rank(self.pg) < 0:
            raise ValueError(f"group: this process (global rank {dist.get_rank()}) is not a member of the group")
        self.rank = dist.get_rank(self.pg)
        self.world = dist.get_world_size(self.pg)
        self.next = dist.get_global_rank(self.pg, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(self.pg, (self.rank - 1) % self.world)
        backend = str(dist.get_backend(self.pg))
        # The device a backend's tensors must live on (None: a mixed or third-party backend, not checked).
        self.tensor_device = {"nccl": "cuda", "gloo": "cpu"}.get(backend)
        self.collective_device = (torch.device("cuda", torch.cuda.current_device())
                                  if "nccl" in backend and torch.cuda.is_available() else torch.device("cpu"))
        self.backend = backend

    def check_device(self, name: str, t: torch.Tensor) -> None:
        if self.tensor_device is not None and t.device.type != self.tensor_device:
            raise ValueError(f"{name} must be a {self.tensor_device.upper()} tensor for the {self.backend} backend, "
                             f"got one on {t.device}")

    def shift(self, tensor: torch.Tensor, tag: int = 0) -> "Shift":
        """Post: send ``tensor`` (contiguous) to the next rank, receive the previous rank's into a new
        buffer. Returns at once; ``wait()`` on the result gives the buffer.

        Both transfers go out in one ``batch_isend_irecv`` (one fused NCCL group: no ordering
        deadlock between the send and the receive). On NCCL they run on the backend's stream,
        which first waits for the work queued so far on the current stream (so ``tensor`` is
        ready); ``wait()`` makes the current stream wait for them without blocking the host."""
        buf = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, self.next, self.pg, tag),
               dist.P2POp(dist.irecv, buf, self.prev, self.pg, tag)]
        return Shift(dist.batch_isend_irecv(ops), buf)


class Shift:
    """A posted ring shift; ``wait()`` returns the received buffer."""

    def __init__(self, works, buf: torch.Tensor):
        self._works, self._buf = works, buf

    def wait(self) -> torch.Tensor:
        for w in self._works:
            w.wait()
        return self._buf


def describe(t) -> str:
    """What ranks must agree on about a tensor argument (not its device index: each rank has its own GPU)."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"shape {tuple(t.shape)}, {str(t.dtype).replace('torch.', '')}, {t.device.type}"


def _fingerprint(values: dict[str, torch.Tensor | None], device) -> torch.Tensor:
    """Two weighted sums of the values' bytes (int64; weights below 2^23 from a fixed seed, so no sum
    of fewer than 2^32 bytes overflows and any order gives the same print), computed where the values
    live: comparing them never reads the values back on their own. One byte that differs always
    changes both; more, both unchanged with odds about 2^-46."""
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in values.values() if t is not None]
    if not parts:
        return torch.zeros(2, dtype=torch.int64, device=device)
    data = torch.cat([p.to(device) for p in parts]).to(torch.int64)
    weights = _weights(data.numel(), device)
    return (data * weights).sum(dim=1)


@functools.lru_cache(maxsize=16)
def _weights(n: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0x5EED)
    return torch.randint(1, 2**23, (2, n), generator=g, dtype=torch.int64, device="cpu").to(device)


def _gather(group: Group, mine: torch.Tensor) -> torch.Tensor:
    """Every rank's ``mine`` (uint8, same size on every rank), as a (world, size) CPU tensor."""
    gathered = [torch.empty_like(mine) for _ in range(group.world)]
    dist.all_gather(gathered, mine, group=group.pg)
    return torch.stack(gathered).cpu()


def agree(group: Group, what: str, error: Exception | None, fields: dict[str, str],
          values: dict[str, torch.Tensor | None] | None = None) -> None:
    """Raise on every rank of ``group`` if any rank's arguments were invalid or differ between ranks.

    Each rank passes the error its own checks raised (or None), a description of each argument that
    must be equal on every rank, and ``values``: tensors (on the collective device, or None) whose
    contents must be equal too. One small all-gather carries an error flag, a digest of the
    descriptions and a fingerprint of the values computed on the device; only when a rank erred or
    they differ does a second one carry the full descriptions, so that every rank can say what. A
    bad argument on one rank so becomes an exception on all of them instead of a hang in the
    communication that would follow. The rank whose check failed re-raises its own error; the
    others raise ValueError quoting it; a mismatch raises the same ValueError on every rank.

    Cost: one host read of the gathered entries, which waits for the work queued so far on the
    device (the values are never read back on their own)."""
    assert len(fields) <= _MAX_FIELDS and all(len(name) <= 16 for name in fields)
    values = {} if values is None or error is not None else values
    fields = {name: text[:_FIELD_CHARS] for name, text in fields.items()}
    record = json.dumps({"error": None if error is None else str(error)[:_ERROR_CHARS], "fields": fields}).encode()
    head = bytes([error is not None]) + hashlib.sha1(record).digest()
    device = group.collective_device
    head = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    if device.type == "cuda":  # a pinned copy does not wait for the device's queue, as a pageable one does
        head = head.pin_memory().to(device, non_blocking=True)
    prints = _fingerprint(values, device).view(torch.uint8)
    entries = _gather(group, torch.cat([head, prints]))
    if not entries[:, 0].any() and (entries == entries[0]).all():
        return
    mine = torch.zeros(_RECORD_BYTES, dtype=torch.uint8)
    mine[:len(record)] = torch.frombuffer(bytearray(record), dtype=torch.uint8)
    records = [json.loads(bytes(row.tolist()).rstrip(b"\0")) for row in _gather(group, mine.to(device))]
    if error is not None:
        raise error
    for r, rec in enumerate(records):
        if rec["error"] is not None:
            raise ValueError(f"{what}: rank {r} of the group rejected its arguments: {rec['error']}")
    for name in fields:
        first = records[0]["fields"].get(name)
        for r, rec in enumerate(records[1:], 1):
            if rec["fields"].get(name) != first:
                raise ValueError(f"{what}: {name} must be the same on every rank of the group: rank 0 has {first}, "
                                 f"rank {r} has {rec['fields'].get(name)}")
    r = next(r for r in range(1, group.world) if not (entries[r] == entries[0]).all())
    raise ValueError(f"{what}: {', '.join(values)} must hold the same values on every rank of the group: "
                     f"rank {r}'s differ from rank 0's")
