"""What one rank of ring attention computes, timed on one GPU: the ring's schedule with its transfers
left out (each step attends to the rank's own K/V, the shapes and pieces of the real ring), against
``attention`` at the rank's length n, in turn over rounds.

    PYTHONPATH=. python benchmarks/ring_compute.py --out benchmarks/results [--lengths 32k,128k,256k]
    PYTHONPATH=. python benchmarks/ring_compute.py --out benchmarks/results --lengths 32k --window 4095 --profile
    python benchmarks/ring_compute.py --out /tmp/r --lengths 64     # no GPU: a smoke run (CPU twin)

On two GPUs the ring's transfers hide under this compute (``flashattn-lite ring``: ``comm_hidden``),
so its time is the ring's, and ``efficiency`` = work · attention(n) / compute is the ring benchmark's
scaling efficiency without needing W GPUs (``work``: the rank's pairs over attention(n)'s, W
without a window). Defaults as the ring benchmark's: B 1, Hq 32, Hkv 8,
d 128, bf16, causal, zigzag, W 2, rank 0 (zigzag gives every rank the same work). ``--window L``:
a causal window of L + 1 keys (``window=(L, 0)``) for both methods. ``--profile``: after the
timing, each method's CUDA kernels over one call (torch.profiler), the 12 costliest printed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.bench.ring import _NoTransfer, _flops, _fwd_bwd, _inputs, pair_tflops, visible_pairs  # noqa: E402
from flashattn_lite.distributed import ring as ring_mod  # noqa: E402
from flashattn_lite.ops.attention import attention  # noqa: E402


def _ms(fn, device) -> float:
    """One call's time (seconds long on the GPU: no repetition needed), the device synced around it."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON")
    ap.add_argument("--lengths", default="32k,128k,256k", help="tokens per rank n, comma-separated")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--layout", default="zigzag", choices=("zigzag", "contiguous"))
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds, each method in turn")
    ap.add_argument("--window", type=int, default=-1, help="a causal window's left side L (default: none)")
    ap.add_argument("--profile", action="store_true", help="print each method's costliest CUDA kernels")
    args = ap.parse_args()
    if args.world < 1 or not 0 <= args.rank < args.world or args.rounds < 1:
        ap.error("need --world >= 1, 0 <= --rank < --world and --rounds >= 1")
    if args.window < -1:
        ap.error(f"--window must be a left side >= 0 (or -1: none), got {args.window}")
    b, hq, hkv, d, dtype = 1, 32, 8, 128, torch.bfloat16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # a smoke run of the script: the CPU twin at small sizes
        hq, hkv, d, dtype = 4, 2, 16, torch.float32
    scale = d ** -0.5
    window = (args.window, 0) if args.window >= 0 else None
    rows = []
    for n in (common.parse_size(t) for t in args.lengths.split(",")):
        every, hops = ring_mod.plan(args.layout, args.world, n, True, window or (-1, -1))
        steps = every[args.rank]
        inputs = _inputs(b, hq, hkv, n, d, dtype, device, seed=1)
        methods = {
            "ring_compute": _fwd_bwd(lambda q, k, v: ring_mod._RingAttentionFn.apply(
                q, k, v, None, scale, 0.0, _NoTransfer(args.rank, args.world), steps, hops)[0], inputs),
            "attention": _fwd_bwd(lambda q, k, v: attention(q, k, v, causal=True, window=window), inputs),
        }
        for fn in methods.values():  # compile, first-call allocations
            fn()
        times = {name: [] for name in methods}
        for r in range(args.rounds):
            order = list(methods.items())
            for name, fn in order[r % 2:] + order[:r % 2]:
                times[name].append(_ms(fn, device))
        ms = {name: median(t) for name, t in times.items()}
        # The rank's pairs against attention(n)'s: W without a window (causal work ∝ N²), counted
        # from the schedule with one.
        if window is None:
            work = args.world
            ring_tflops = _flops(b, hq, args.world * n, d, True) / args.world / (ms["ring_compute"] * 1e-3) * 1e-12
            attention_tflops = _flops(b, hq, n, d, True) / (ms["attention"] * 1e-3) * 1e-12
        else:
            pairs = visible_pairs(p for pieces in steps for p in pieces)
            local = visible_pairs([ring_mod.Piece(0, n, 0, n, True, 0, args.window, -1)])
            work = pairs / local
            ring_tflops = pair_tflops(b * pairs, hq, d, ms["ring_compute"], "fwd+bwd")
            attention_tflops = pair_tflops(b * local, hq, d, ms["attention"], "fwd+bwd")
        row = dict(n_local=n, n_global=args.world * n, world=args.world, rank=args.rank, layout=args.layout,
                   pieces=[[tuple(p) for p in s] for s in steps], ms=ms, rounds_ms=times, work_vs_local=work,
                   efficiency=work * ms["attention"] / ms["ring_compute"],
                   ring_tflops_per_gpu=ring_tflops, attention_tflops=attention_tflops)
        rows.append(row)
        print(f"n {n}: ring compute {ms['ring_compute']:.1f} ms ({row['ring_tflops_per_gpu']:.0f} TFLOP/s), "
              f"attention(n) {ms['attention']:.1f} ms ({row['attention_tflops']:.0f}); "
              f"efficiency {row['efficiency']:.3f}", flush=True)
        if args.profile:
            for name, fn in methods.items():  # one call's 12 costliest kernels
                top = list(common.kernel_times_us(fn, device).items())[:12]
                print(f"-- {name}: " + ", ".join(f"{k[:60]} {t:.0f} µs" for k, t in top), flush=True)
        del inputs, methods
    path = common.write_json(args.out, "ring_compute", rows, batch=b, heads=hq, kv_heads=hkv, head_dim=d,
                             dtype=str(dtype).replace("torch.", ""), causal=True, rounds=args.rounds,
                             window=window)
    print("wrote", path)


if __name__ == "__main__":
    main()
