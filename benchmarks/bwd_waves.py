"""What a partial last wave costs the Gluon backward: its time against the number of programs.

    python benchmarks/bwd_waves.py [--out benchmarks/results] [--rounds 5]

The non-causal Gluon backward runs one program per 128-key tile, one program an SM (132 on an
H100 / H200). Where the programs do not fill the last wave, its few programs would run alone if
the waves ran in lockstep, and splitting those tiles' query loops over more programs would win
the idle SMs back (``experiments/bwd-tail-pieces.patch`` is that split). This times the backward (``attention_backward_gluon``: row statistics, the
kernel, dq's conversion) at N 2k, bf16, over B·H just below and just above a whole number of
waves (d 64: 3952 → 3968 programs crosses 30 waves, 4080 → 4096 crosses 31; d 128: 1968 → 1984
crosses 15, and 2048 is 15.5), each shape in turn for ``--rounds`` rounds (``common.time_ms``:
device events, cold L2, median). Per head, the time jumps where a wave starts partly empty by
the share of a round the last programs leave idle.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench.common import add_run_arguments, format_table, time_ms, write_json  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops.attention import attention_core  # noqa: E402

N = 2048
SHAPES = [(64, bh) for bh in (247, 248, 255, 256, 264)] + [(128, bh) for bh in (123, 124, 128, 132)]  # (d, B·H)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--rounds", type=int, default=5)
    add_run_arguments(ap)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "bwd_waves measures GPU time"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls = {}
    for d, bh in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(1, bh, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        o, lse = attention_core(q, k, v, return_lse=True)
        calls[d, bh] = (lambda q=q, k=k, v=v, do=do, o=o, lse=lse, d=d:
                        gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=d ** -0.5, causal=False))
        calls[d, bh]()
    times = {shape: [] for shape in SHAPES}
    for _ in range(args.rounds):  # each shape in turn, so drift falls on all alike
        for shape in SHAPES:
            times[shape].append(time_ms(calls[shape], rep_ms=150))
    rows = []
    for (d, bh), ms in times.items():
        ms = sorted(ms)
        t = ms[len(ms) // 2]
        programs = bh * math.ceil(N / 128)
        rows.append(dict(d=d, N=N, heads=bh, programs=programs, waves=programs / sms,
                         rounds=math.ceil(programs / sms), ms=t, us_per_head=1e3 * t / bh, rounds_ms=ms))
    path = write_json(args.out, "bwd_waves", rows, dtype="bfloat16", causal=False, sms=sms)
    print(format_table(rows, ["d", "N", "heads", "programs", "waves", "rounds", "ms", "us_per_head"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
