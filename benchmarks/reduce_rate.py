"""How fast the L2 takes float32 TMA reduce-adds of dQ blocks, by the order the writers walk the rows.

A one-pass attention backward reduce-adds each step's dQ block (64 queries × the head dim, float32)
into a buffer; cuDNN's MLA backward is bound there (NOTES 2026-11-30 07:14). This times that traffic
alone: 132 persistent programs (one an SM), each taking key tiles j of (batch, head) units in turn
and, for each, reduce-adding a 64-row block at each query tile i of its walk, ``--width`` columns
in 64-column TMA boxes (``_tma_reduce_add``, as the Gluon backward does). Walks:

* ``lockstep``: i = 0, 1, …, n − 1 for every j (a non-causal walk: the key tiles of a head running
  at once write the same rows at once);
* ``rotated``: i = j, j + 1, …, wrapping (the same rows, spread);
* ``causal``: i = j, …, n − 1 (the causal band's rows; half the blocks).

``--wait`` waits for each step's reduces before the next (one staging buffer, as the kernels
have); without it the TMA unit queues them. No GPU work but the reduces, so the rates are ceilings.

    PYTHONPATH=. python benchmarks/reduce_rate.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.ops.attention_bwd_gluon import _HAS_GLUON  # noqa: E402

WALKS = {"lockstep": 0, "rotated": 1, "causal": 2}

if _HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

    from flashattn_lite.ops.attention_bwd_gluon import _tma_reduce_add
    from flashattn_lite.ops.attention_fwd_gluon import tma_descriptor

    @gluon.jit
    def _reduce_kernel(dq_desc, H, n_tiles, n_units, WALK: gl.constexpr, BOXES: gl.constexpr,
                       WAIT: gl.constexpr):
        """Program p takes units p, p + P, … (unit u: key tile u % n_tiles of (batch, head)
        u // n_tiles) and reduce-adds a block of ones at each query tile of the unit's walk."""
        layout: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 1, 2, 16], [1, 1, 4, 1], [3, 2, 1, 0])
        src = gl.allocate_shared_memory(gl.float32, [1, 1, 64, 64], dq_desc.layout)
        src.store(gl.full([1, 1, 64, 64], 1.0, gl.float32, layout))
        fence_async_shared()
        for u in range(gl.program_id(0), n_units, gl.num_programs(0)):
            j = u % n_tiles
            bh = u // n_tiles
            b = bh // H
            h = bh % H
            first = 0
            if WALK == 2:
                first = j
            for t in range(first, n_tiles):
                i = t
                if WALK == 1:
                    i = (j + t) % n_tiles
                for c in gl.static_range(BOXES):
                    _tma_reduce_add(dq_desc, [b, h, i * 64, c * 64], src)
                if WAIT:
                    tma.store_wait(0)
        tma.store_wait(0)


def run(buf, walk: str, wait: bool, programs: int) -> None:
    """One launch of the kernel over ``buf`` (B, H, N, width float32)."""
    B, H, N, W = buf.shape
    desc = tma_descriptor(buf, [1, 1, 64, 64])
    n_tiles = N // 64
    _reduce_kernel[(programs,)](desc, H, n_tiles, B * H * n_tiles, WALK=WALKS[walk], BOXES=W // 64,
                                WAIT=wait, num_warps=4)


def blocks(walk: str, B: int, H: int, n_tiles: int) -> int:
    """The 64-row blocks a launch reduce-adds (every box of one counted as one block)."""
    per_head = n_tiles * (n_tiles + 1) // 2 if walk == "causal" else n_tiles * n_tiles
    return B * H * per_head


def parse_args(argv=None):
    """The arguments, each checked (a usage error naming it) before any GPU work."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON")
    ap.add_argument("--n", type=int, default=8192, help="sequence length (a multiple of 64)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--width", type=int, default=192, help="dQ columns (a multiple of 64)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    for name in ("n", "width"):
        if getattr(args, name) < 64 or getattr(args, name) % 64:
            ap.error(f"--{name} must be a positive multiple of 64, got {getattr(args, name)}")
    for name in ("batch", "heads", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def main():
    args = parse_args()
    if not _HAS_GLUON or not torch.cuda.is_available():
        sys.exit("reduce_rate.py needs a CUDA GPU and a triton with Gluon")
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(args.batch, args.heads, args.n, args.width, device="cuda", dtype=torch.float32)
    cases = [(walk, wait) for walk in WALKS for wait in (True, False)]
    times = {case: [] for case in cases}
    for case in cases:
        run(buf, *case, programs)  # compile
    torch.cuda.synchronize()
    for _ in range(args.rounds):  # in turn: the clock drifts over a run
        for case in cases:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(buf, *case, programs)
            end.record()
            torch.cuda.synchronize()
            times[case].append(start.elapsed_time(end))
    rows = []
    print(f"B {args.batch} H {args.heads} N {args.n} width {args.width}, {programs} programs")
    print(f"{'walk':9} {'wait':5} {'ms':>8} {'TB/s':>6}")
    for walk, wait in cases:
        ms = median(times[(walk, wait)])
        n_bytes = blocks(walk, args.batch, args.heads, args.n // 64) * 64 * args.width * 4
        rows.append(dict(walk=walk, wait=wait, ms=ms, rounds_ms=times[(walk, wait)], bytes=n_bytes,
                         tb_per_s=n_bytes / ms / 1e9))
        print(f"{walk:9} {str(wait):5} {ms:8.3f} {rows[-1]['tb_per_s']:6.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"reduce_rate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), batch=args.batch, heads=args.heads,
                                    n=args.n, width=args.width, programs=programs, results=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
