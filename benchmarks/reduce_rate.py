"""How fast the L2 takes float32 TMA reduce-adds of dQ blocks, by the order the writers walk the rows.

A one-pass attention backward reduce-adds each step's dQ block (64 queries × the head dim, float32)
into a buffer; cuDNN's MLA backward is bound there (NOTES 2026-11-30 07:14). This times that traffic
alone: 132 persistent programs (one an SM), each taking key tiles j of (batch, head) units in turn
and, for each, reduce-adding a 64-row block at each query tile i of its walk, ``--width`` columns
in 64-column TMA boxes (``_tma_reduce_add``, as the Gluon backward does). Walks:

* ``lockstep``: i = 0, 1, …, n − 1 for every j (a non-causal walk: the key tiles of a head running
  at once write the same rows at once);
* ``rotated``: i = j, j + 1, …, wrapping (the same rows, spread);
* ``causal``: i = j, …, n − 1 (the causal band's rows; half the blocks);
* ``paired``: the causal band, a program taking key tiles j and n − 1 − j in turn, so that every
  program's units are the same length (n + 1 steps) and the programs stay in step;
* ``grid-rotated``, ``grid-causal``: those walks as the Gluon backward's head dim 256 kernels launch
  them, one program a unit (a key tile), in unit order (head-major; causal, the heaviest tile of a
  head first), each program holding ~200 KB of shared memory so that one runs an SM at a time.

Each walk runs twice: with ``wait`` (each step's reduces waited for before the next: one staging
buffer, as the kernels have) and without (the TMA unit queues them). No GPU work but the reduces,
so the rates are ceilings. Every case is first run once on a zeroed buffer (compiling it) and its
sum checked (every block added once); then ``common.time_ms`` times each case (median launch, cold
L2) in ``--rounds`` rotated rounds; each row's ``ms`` is the median round, ``rounds_ms`` the rounds
in the order they ran.

    PYTHONPATH=. python benchmarks/reduce_rate.py --out benchmarks/results [--n 8k] [--batch 4]
        [--heads 16] [--width 192] [--rounds 3]
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops.attention_bwd_gluon import _HAS_GLUON  # noqa: E402

WALKS = {"lockstep": 0, "rotated": 1, "causal": 2, "paired": 3, "grid-rotated": 1, "grid-causal": 2}

if _HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

    from flashattn_lite.ops.attention_bwd_gluon import _tma_reduce_add
    from flashattn_lite.ops.attention_fwd_gluon import tma_descriptor

    @gluon.jit
    def _reduce_walk(dq_desc, src, b, h, j, n_tiles, WALK: gl.constexpr, BOXES: gl.constexpr, WAIT: gl.constexpr):
        """Key tile j's walk over the query tiles of head (b, h): ``src`` reduce-added at each."""
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

    @gluon.jit
    def _reduce_kernel(dq_desc, H, n_tiles, n_units, WALK: gl.constexpr, BOXES: gl.constexpr,
                       WAIT: gl.constexpr, GRID: gl.constexpr = False):
        """Program p takes units p, p + P, … (unit u: key tile u % n_tiles of (batch, head)
        u // n_tiles; ``paired``: key tiles u % (n / 2) and its mirror) and reduce-adds a block of
        ones at each query tile of the unit's walk."""
        layout: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 1, 2, 16], [1, 1, 4, 1], [3, 2, 1, 0])
        src = gl.allocate_shared_memory(gl.float32, [1, 1, 64, 64], dq_desc.layout)
        src.store(gl.full([1, 1, 64, 64], 1.0, gl.float32, layout))
        if GRID:  # one unit a program; the filler keeps one program an SM, as the kernels' 198 KB do
            filler = gl.allocate_shared_memory(gl.float32, [12, 64, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
            filler.index(0).store(gl.full([64, 64], 0.0, gl.float32, gl.BlockedLayout([1, 4], [2, 16], [4, 1],
                                                                                           [1, 0])))
        fence_async_shared()
        if GRID:
            u = gl.program_id(0)
            bh = u // n_tiles
            _reduce_walk(dq_desc, src, bh // H, bh % H, u % n_tiles, n_tiles, WALK, BOXES, WAIT)
        elif WALK == 3:
            half = n_tiles // 2
            for u in range(gl.program_id(0), n_units // 2, gl.num_programs(0)):
                bh = u // half
                for side in gl.static_range(2):
                    j = u % half
                    if side == 1:
                        j = n_tiles - 1 - j
                    _reduce_walk(dq_desc, src, bh // H, bh % H, j, n_tiles, 2, BOXES, WAIT)
        else:
            for u in range(gl.program_id(0), n_units, gl.num_programs(0)):
                bh = u // n_tiles
                _reduce_walk(dq_desc, src, bh // H, bh % H, u % n_tiles, n_tiles, WALK, BOXES, WAIT)
        tma.store_wait(0)


def run(buf, walk: str, wait: bool, programs: int) -> None:
    """One launch of the kernel over ``buf`` (B, H, N, width float32)."""
    B, H, N, W = buf.shape
    desc = tma_descriptor(buf, [1, 1, 64, 64])
    n_tiles = N // 64
    grid = walk.startswith("grid")
    _reduce_kernel[(B * H * n_tiles if grid else programs,)](desc, H, n_tiles, B * H * n_tiles, WALK=WALKS[walk],
                                                             BOXES=W // 64, WAIT=wait, GRID=grid, num_warps=4)


def blocks(walk: str, B: int, H: int, n_tiles: int) -> int:
    """The 64-row blocks a launch reduce-adds (every box of one counted as one block)."""
    per_head = n_tiles * (n_tiles + 1) // 2 if walk in ("causal", "paired", "grid-causal") else n_tiles * n_tiles
    return B * H * per_head


def multiple_of(step: int):
    """argparse type: a positive multiple of ``step``, written as ``common.parse_size`` reads counts (8192, 8k)."""
    def parse(text: str) -> int:
        try:
            value = common.parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value % step:
            raise argparse.ArgumentTypeError(f"expected a positive multiple of {step}, got {text!r}")
        return value
    return parse


def parse_args(argv=None):
    """The arguments, each checked (a usage error naming it) before any GPU work; a usage error without CUDA."""
    def add(ap):
        ap.set_defaults(rounds=3)
        ap.add_argument("--n", type=multiple_of(128), default=8192,
                        help="sequence length (a multiple of 128: paired takes key tiles two at a time)")
        ap.add_argument("--batch", type=common.round_count, default=4, help="batch (>= 1)")
        ap.add_argument("--heads", type=common.round_count, default=16, help="heads (>= 1)")
        ap.add_argument("--width", type=multiple_of(64), default=192, help="dQ columns (a multiple of 64)")
    return common.gpu_script_args(__doc__, Path(__file__).parent / "results", add, argv)


def main(argv=None):
    args = parse_args(argv)
    if not _HAS_GLUON:
        sys.exit("reduce_rate.py needs a triton with Gluon")
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(args.batch, args.heads, args.n, args.width, device="cuda", dtype=torch.float32)
    cases = [(walk, wait) for walk in WALKS for wait in (True, False)]
    launches = {case: functools.partial(run, buf, *case, programs) for case in cases}
    n_blocks = {walk: blocks(walk, args.batch, args.heads, args.n // 64) for walk in WALKS}
    for case, launch in launches.items():  # compile, and check that every block was added once
        buf.zero_()
        common.warm_up(launch, f"{case[0]} wait={case[1]}")
        got, want = buf.sum(dtype=torch.float64).item(), n_blocks[case[0]] * 64 * args.width
        if got != want:
            sys.exit(f"{case}: the buffer sums to {got:.0f}, not {want}")
    times = {case: [] for case in cases}
    for order in common.balanced_rounds(cases, args.rounds):  # in turn: the clock drifts over a run
        for case in order:
            times[case].append(common.time_ms(launches[case]))
    rows = []
    for walk, wait in cases:
        ms = median(times[(walk, wait)])
        n_bytes = n_blocks[walk] * 64 * args.width * 4
        rows.append(dict(walk=walk, wait=wait, ms=ms, rounds_ms=times[(walk, wait)], bytes=n_bytes,
                         tb_per_s=n_bytes / ms / 1e9))
    print(f"B {args.batch} H {args.heads} N {args.n} width {args.width}, {programs} programs")
    print(common.format_table(rows, ["walk", "wait", "ms", "tb_per_s"]))
    path = common.write_json(args.out, "reduce_rate", rows, device=torch.cuda.get_device_name(0), batch=args.batch,
                             heads=args.heads, n=args.n, width=args.width, programs=programs, rounds=args.rounds,
                             command=common.recorded_command(sys.argv, args.out))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
