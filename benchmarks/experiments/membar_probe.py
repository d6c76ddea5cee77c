"""Where does triton's shared-memory barrier pass put a partition-wide ``bar.sync`` around Gluon mbarrier
operations? Compiles (no GPU: the CUDA backend of the tested triton, 3.6, sm_90) a 4-warp kernel whose
loop runs one pattern of ``mbarrier.wait`` / ``mbarrier.arrive`` on two barrier allocations ``a`` and
``b`` (two slots each, indexed by the iteration), and prints the loop's barriers and mbarrier operations
in order. ``python benchmarks/experiments/membar_probe.py``:

- ``wait b, arrive a`` (a consumer's wait for a filled slot, then its release of another barrier);
- ``wait a, arrive a`` (both on one allocation);
- ``wait a, wait b`` (two waits, as for a K and a V slot);
- ``wait a`` alone; ``arrive a`` alone; ``arrive a, arrive b``;
- ``wait a[0], wait a[1]`` (two slots of one allocation).

Read in benchmarks/NOTES.md (2026-11-29 20:36): a wait conflicts with earlier operations on its own
allocation only, an arrive with every earlier one, and each conflict costs a ``bar.sync`` of the
partition before the later operation."""
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

PATTERNS = ["wait b, arrive a", "wait a, arrive a", "wait a, wait b", "wait a", "arrive a", "arrive a, arrive b",
            "wait a[0], wait a[1]"]


@gluon.jit
def _probe(out, n, PATTERN: gl.constexpr):
    a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(a.index(s), count=1)
        mbarrier.init(b.index(s), count=1)
    fence_async_shared()
    acc = 0
    for i in range(n):
        if PATTERN == 0:
            mbarrier.wait(b.index(i % 2), i & 1)
            mbarrier.arrive(a.index(i % 2))
        elif PATTERN == 1:
            mbarrier.wait(a.index(i % 2), i & 1)
            mbarrier.arrive(a.index((i + 1) % 2))
        elif PATTERN == 2:
            mbarrier.wait(a.index(i % 2), i & 1)
            mbarrier.wait(b.index(i % 2), i & 1)
        elif PATTERN == 3:
            mbarrier.wait(a.index(i % 2), i & 1)
        elif PATTERN == 4:
            mbarrier.arrive(a.index(i % 2))
        elif PATTERN == 5:
            mbarrier.arrive(a.index(i % 2))
            mbarrier.arrive(b.index(i % 2))
        else:
            mbarrier.wait(a.index(0), i & 1)
            mbarrier.wait(a.index(1), i & 1)
        acc += i
    gl.store(out, acc)


def loop_ops(pattern: int) -> list:
    """The loop's ``bar.sync`` and mbarrier operations, in PTX order, for pattern ``pattern``."""
    target = GPUTarget("cuda", 90, 32)
    make_backend(target)
    src = GluonASTSource(_probe, {"out": "*i32", "n": "i32", "PATTERN": "constexpr"}, {(2,): pattern},
                         {(0,): [["tt.divisibility", 16]]})
    ptx = triton.compile(src, target=target, options={"num_warps": 4}).asm["ptx"]
    ops, in_loop = [], False
    for line in ptx.splitlines():
        line = line.strip()
        if re.match(r"\$L__BB0_\d+:", line):
            in_loop = in_loop or "lr.ph" in line or "Loop Header" in line
            if "crit_edge" in line:
                break
        elif in_loop and line.startswith("bar.sync"):
            ops.append("bar.sync")
        elif in_loop and "mbarrier.try_wait" in line:
            ops.append("wait")
        elif in_loop and "mbarrier.arrive" in line:
            ops.append("arrive")
    return ops


if __name__ == "__main__":
    for k, name in enumerate(PATTERNS):
        print(f"{name:22s} loop: {' '.join(loop_ops(k))}")
