"""The one-launch backward of short calls against the three-launch portable backward: device time.

    python benchmarks/short_backward.py [--out benchmarks/results]

Where every key of a (batch, KV head) fits one tile (``attention_bwd.SHORT_MAX_N`` keys), the
portable backward runs ``_bwd_short_kernel``, one program per (batch, KV head) looping over its
query tiles (dQ included), instead of a preprocess, a dK/dV kernel and a dQ kernel with a program
per query tile. Fewer launches help tiny calls' host time; this measures whether the single
program per (batch, KV head) costs device time where batches are large. At each shape both
paths run on the same saved o, lse and dO (the three-launch path by setting the short path's key
bound to 0); their gradients are compared (max |Δ|) and timed with ``common.time_ms`` (device
events, median, cold L2). fp16, causal, Nq = Nk; B·Hq from 8 to 4096 programs' worth of rows.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench.common import add_run_arguments, format_table, time_ms, write_json  # noqa: E402
from flashattn_lite.ops import attention_bwd as bwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import attention_forward  # noqa: E402

SHAPES = [  # (B, Hq, Hkv, N, d)
    (1, 8, 8, 16, 64), (8, 16, 16, 64, 64), (64, 16, 16, 64, 64), (256, 16, 16, 64, 64),
    (64, 32, 8, 64, 128), (256, 32, 8, 32, 128), (16, 16, 16, 256, 64),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    add_run_arguments(ap)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "short_backward measures GPU time"
    rows = []
    for B, Hq, Hkv, N, d in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, N, d, device="cuda", dtype=torch.float16, generator=g)
        k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
        do = torch.randn_like(q)
        scale = d ** -0.5
        with torch.no_grad():
            o, lse = attention_forward(q, k, v, scale=scale, causal=True, causal_offset=0, mask=None,
                                       dropout_p=0.0, seed=0)

        def backward():
            return bwd.attention_backward(do, q, k, v, o, lse, None, scale=scale, causal=True, causal_offset=0,
                                          mask=None, dropout_p=0.0, seed=0)
        short = backward()
        short_ms = time_ms(backward)
        saved = bwd.SHORT_MAX_N
        bwd.SHORT_MAX_N = 0  # every call takes the three launches
        bwd._BOUND.clear()
        try:
            three = backward()
            three_ms = time_ms(backward)
        finally:
            bwd.SHORT_MAX_N = saved
            bwd._BOUND.clear()
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(short[:3], three[:3]))
        rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, N=N, d=d, short_us=short_ms * 1e3, three_us=three_ms * 1e3,
                         short_vs_three=three_ms / short_ms, max_diff=diff))
        print(rows[-1], flush=True)
    path = write_json(args.out, "short_backward", rows, dtype="float16", causal=True)
    print(format_table(rows, ["B", "Hq", "Hkv", "N", "d", "short_us", "three_us", "short_vs_three", "max_diff"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
