"""Process-group plumbing for the sequence-parallel ops: who this rank is, arguments that every rank
agrees on before anything can hang, and the one communication pattern of a ring (each rank sends a
buffer to the next rank and receives the previous rank's).
"""
from __future__ import annotations

import json

import torch
import torch.distributed as dist

# One rank's record in the agreement exchange: its error message and up to 12 argument descriptions,
# each cut to a bound, so that even escaped to JSON (≤ 12 bytes a character) the record fits.
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


def agree(group: Group, what: str, error: Exception | None, fields: dict[str, str]) -> None:
    """Raise on every rank of ``group`` if any rank's arguments were invalid or differ between ranks.

    Each rank passes the error its own checks raised (or None) and a description of each argument
    that must be equal on every rank; one small all-gather carries both, so a bad argument on one
    rank becomes an exception on all of them instead of a hang in the communication that would
    follow. The rank whose check failed re-raises its own error; the others raise ValueError
    quoting it; a mismatch raises the same ValueError on every rank."""
    assert len(fields) <= _MAX_FIELDS and all(len(name) <= 16 for name in fields)
    fields = {name: text[:_FIELD_CHARS] for name, text in fields.items()}
    record = json.dumps({"error": None if error is None else str(error)[:_ERROR_CHARS], "fields": fields}).encode()
    mine = torch.zeros(_RECORD_BYTES, dtype=torch.uint8)
    mine[:len(record)] = torch.frombuffer(bytearray(record), dtype=torch.uint8)
    mine = mine.to(group.collective_device)
    gathered = [torch.empty_like(mine) for _ in range(group.world)]
    dist.all_gather(gathered, mine, group=group.pg)
    records = [json.loads(bytes(row).rstrip(b"\0")) for row in torch.stack(gathered).cpu().tolist()]
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
