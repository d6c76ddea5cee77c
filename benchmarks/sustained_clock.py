"""What clock and power does the GPU hold while a method runs back to back, and what rate is that per clock?

    python benchmarks/sustained_clock.py [--methods ours,sdpa-cudnn] [--head-dims 128,256] [--lengths 8192]
                                         [--causal no] [--modes fwd] [--seconds 4] [--out benchmarks/results]

Published attention figures are sustained rates on a GPU at its power cap, where the SM clock follows
the power drawn; a profiler's single launch runs near the top clock. This runs each (method, point)
without pauses for ``--seconds`` (the L2 not flushed: a steady stream of calls) while ``nvidia-smi``
samples the SM clock, the power and the active throttle reasons every 100 ms, and reports per point:
TFLOP/s, the median clock and power over the run's second half, and the tensor cores' share at that
clock (TFLOP/s over 132 SMs × 4096 dense 16-bit FLOPs a clock, the H100/H200 rate). Two methods at
the same share but different clocks differ in power, not in their kernels' schedules.
bf16, B·N tokens (default 16k) of width hidden (2048), as the speed table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.bench.peers import PEERS, Problem, parse_methods, timed_callable  # noqa: E402

DENSE_FLOPS_PER_CLOCK_SM = 4096  # 16-bit wgmma, dense, per SM per clock (H100 / H200)
QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


class Sampler:
    """``nvidia-smi`` every 100 ms in a thread; each sample stamped with the host's monotonic clock."""

    def __init__(self):
        self.samples: list[tuple[float, float, float, str]] = []
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                      "-i", str(torch.cuda.current_device()), "-lms", "100"],
                                     stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.monotonic(), float(parts[0]), float(parts[1]), parts[2]))
            except (ValueError, IndexError):
                continue

    def between(self, t0: float, t1: float):
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=5)


def run_point(sampler: Sampler, method: str, problem: Problem, mode: str, seconds: float) -> dict:
    row = {"method": method, "mode": mode, "head_dim": problem.head_dim, "causal": problem.causal,
           "N": problem.seqlen, "batch": problem.batch, "heads": problem.heads}
    reason, way = PEERS[method].check(problem)
    if reason is not None:
        return {**row, "status": f"skipped: {reason}"}
    runner = PEERS[method].build(problem, way)
    q, k, v, do = problem.make_inputs(mode)
    with runner.context():
        fn = timed_callable(runner, q, k, v, do, mode)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, t0 = 0, time.monotonic()
        start.record()
        while time.monotonic() - t0 < seconds:
            for _ in range(8):
                fn()
            calls += 8
            torch.cuda.synchronize()  # keeps the host within a few calls of the GPU
        end.record()
        torch.cuda.synchronize()
        t1 = time.monotonic()
    ms = start.elapsed_time(end) / calls
    tail = sampler.between(t0 + (t1 - t0) / 2, t1)
    clock = statistics.median(s[1] for s in tail) if tail else None
    power = statistics.median(s[2] for s in tail) if tail else None
    tflops = problem.flops(mode) / ms / 1e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    share = tflops * 1e12 / (sms * DENSE_FLOPS_PER_CLOCK_SM * clock * 1e6) if clock else None
    return {**row, "status": "ok", "time_ms": ms, "tflops": tflops, "calls": calls, "sm_clock_mhz": clock,
            "power_w": power, "tensor_share_at_clock": share,
            "throttle_reasons": sorted({s[3] for s in tail}), "samples": len(tail)}


def parse_args(argv=None):
    """The arguments, each checked before any GPU work: a usage error (exit 2) naming it otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ours,sdpa-cudnn", help="peers of the speed table, comma-separated")
    ap.add_argument("--head-dims", default="128,256")
    ap.add_argument("--lengths", default="8192")
    ap.add_argument("--causal", default="no", choices=["no", "yes", "both"])
    ap.add_argument("--modes", default="fwd", help="fwd, bwd, fwd+bwd, comma-separated")
    ap.add_argument("--seconds", type=float, default=4.0, help="how long each (method, point) runs")
    ap.add_argument("--tokens", type=int, default=16384, help="B·N")
    ap.add_argument("--hidden", type=int, default=2048, help="H = hidden / d")
    ap.add_argument("--out", default=None, help="a folder for sustained_clock-<stamp>.json")
    args = ap.parse_args(argv)
    try:
        args.methods = parse_methods(args.methods)
    except ValueError as exc:
        ap.error(f"--methods: {exc}")
    try:
        args.modes = common.split_list(args.modes, ("fwd", "bwd", "fwd+bwd"), "--modes")
    except ValueError as exc:
        ap.error(str(exc))
    for name in ("head_dims", "lengths"):
        try:
            values = [int(t) for t in getattr(args, name).split(",") if t.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive integers, comma-separated; "
                     f"got {getattr(args, name)!r}")
        setattr(args, name, values)
    if any(args.hidden % d for d in args.head_dims):
        ap.error(f"--hidden {args.hidden} must be a multiple of every --head-dims value")
    if any(args.tokens % n for n in args.lengths):
        ap.error(f"--tokens {args.tokens} must be a multiple of every --lengths value")
    if not args.seconds > 0:
        ap.error(f"--seconds must be > 0, got {args.seconds}")
    return args


def main(argv=None):
    args = parse_args(argv)
    assert torch.cuda.is_available(), "sustained_clock reads the GPU's clock: a GPU is needed"
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    sampler, rows = Sampler(), []
    try:
        for mode in args.modes:
            for d in args.head_dims:
                for causal in causals:
                    for n in args.lengths:
                        p = Problem(args.tokens // n, args.hidden // d, args.hidden // d, n, d, torch.bfloat16,
                                    causal, "cuda")
                        for m in args.methods:
                            r = run_point(sampler, m, p, mode, args.seconds)
                            rows.append(r)
                            if r["status"] == "ok":
                                print(f"{mode:7} d {d:3} {'causal' if causal else 'full  '} N {n:6} {m:12} "
                                      f"{r['tflops']:6.1f} TFLOP/s  {r['sm_clock_mhz']:6.0f} MHz  "
                                      f"{r['power_w']:5.0f} W  share {r['tensor_share_at_clock']:.3f}  "
                                      f"throttle {','.join(r['throttle_reasons'])}", flush=True)
                            else:
                                print(f"{mode:7} d {d:3} N {n} {m}: {r['status']}", flush=True)
    finally:
        sampler.stop()
    if args.out:
        print(common.write_json(args.out, "sustained_clock", rows, seconds=args.seconds,
                                command=common.recorded_command(sys.argv, args.out)))


if __name__ == "__main__":
    main()
