"""Is a short attention call's speed-table time the device's, or the host's launch path?

    python benchmarks/host_bound.py [--out benchmarks/results] [--rounds 5] [--profile]

At the speed table's short points (B·N 16k, hidden 2048, bf16, N 2k) each method, in turn for
``--rounds`` rounds, is timed three ways: ``eager_ms`` as the table times it (``common.time_ms``:
events around one call, L2 flushed before it), ``graph_ms`` the same call replayed from a CUDA
graph (device time alone; None where the call cannot be captured), and ``host_ms`` the host's wall
clock per call of 20 calls issued back to back without a synchronisation (the launch path: the
GPU runs behind). Where ``host_ms`` comes near the device time the table's number is the host's.
``--profile``: cProfile over 20 of our calls, the functions with the most cumulative time.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.bench.peers import PEERS, Problem, timed_callable  # noqa: E402

POINTS = [("bwd", 128, True), ("bwd", 64, True), ("fwd", 64, True), ("bwd", 128, False)]
METHODS = ("ours", "sdpa-cudnn")


def host_ms(fn, calls: int = 20) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / calls


def profile(fn, calls: int = 20, top: int = 30) -> str:
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def parse_args(argv=None):
    def add(ap):
        ap.add_argument("--n", type=common.parse_size, default=2048, help="sequence length (default 2k)")
        ap.add_argument("--profile", action="store_true", help="also cProfile our calls at each point")
    return common.gpu_script_args(__doc__, Path(__file__).parent / "results", add, argv)


def main():
    args = parse_args()
    rows = []
    for mode, d, causal in POINTS:
        problem = Problem(batch=max(1, 16384 // args.n), heads=2048 // d, kv_heads=2048 // d, seqlen=args.n,
                          head_dim=d, dtype=torch.bfloat16, causal=causal, device="cuda")
        q, k, v, do = problem.make_inputs(mode)
        fns = {}
        for name in METHODS:
            runner = PEERS[name].build(problem, "native")
            with runner.context():
                fns[name] = (runner, timed_callable(runner, q, k, v, do, mode))
                common.warm_up(fns[name][1], name)
        for r in range(args.rounds):
            for name, (runner, fn) in fns.items():
                with runner.context():
                    row = {"mode": mode, "d": d, "causal": causal, "n": args.n, "method": name, "round": r,
                           "eager_ms": common.time_ms(fn, rep_ms=50),
                           "graph_ms": common.time_ms_graph(fn, rep_ms=50),
                           "host_ms": host_ms(fn)}
                rows.append(row)
                print(f"{mode} d{d} {'causal' if causal else 'full'} {name:10s} round {r}: eager "
                      f"{row['eager_ms']:.3f}  graph {row['graph_ms'] or float('nan'):.3f}  host {row['host_ms']:.3f} ms",
                      flush=True)
        if args.profile:
            runner, fn = fns["ours"]
            with runner.context():
                print(profile(fn))
        del fns, q, k, v, do
        torch.cuda.empty_cache()
    print(f"wrote {common.write_json(args.out, 'host_bound', rows)}")


if __name__ == "__main__":
    main()
