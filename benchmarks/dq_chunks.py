"""What the Gluon backward's dQ-buffer chunks cost a long call: the backward with the buffer capped
(``DQ_BUFFER_BYTES``, the default: launches over chunks of KV heads) against one launch with the
whole buffer, in one process, in turn over rounds (the GPU's clock drifts over a run).

    PYTHONPATH=. python benchmarks/dq_chunks.py --out benchmarks/results

bf16, B 1, 16 heads of 128 (hidden 2048), N 64k by default (a 512 MiB buffer whole: two launches of
256 MiB), causal and not; each case's median ms and its peak memory above the inputs.
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
from flashattn_lite.bench.common import time_ms  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON")
    ap.add_argument("--n", type=int, default=65536, help="sequence length")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1:
        ap.error("--n and --rounds must be ≥ 1")
    capped = gluon_bwd.DQ_BUFFER_BYTES
    whole = 4 * args.n * 16 * 128 * 4  # above the whole buffer
    results = []
    for causal in (True, False):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(1, 16, args.n, 128, device="cuda", generator=g, dtype=torch.bfloat16)
                       for _ in range(4))
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 128 ** -0.5, causal)
        launches = {name: len(gluon_bwd.dq_buffer_chunks(1, 16, 16, args.n, 128)) if cap == capped else 1
                    for name, cap in (("chunks", capped), ("one launch", whole))}

        def backward(cap):
            gluon_bwd.DQ_BUFFER_BYTES = cap
            try:
                return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=128 ** -0.5, causal=causal)
            finally:
                gluon_bwd.DQ_BUFFER_BYTES = capped

        times, peaks = {"chunks": [], "one launch": []}, {}
        for name, cap in (("chunks", capped), ("one launch", whole)):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            backward(cap)
            torch.cuda.synchronize()
            peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        for r in range(args.rounds):
            order = [("chunks", capped), ("one launch", whole)]
            for name, cap in order[r % 2:] + order[:r % 2]:
                times[name].append(time_ms(lambda: backward(cap), rep_ms=300))
        row = {"causal": causal, "N": args.n, "launches": launches, "ms": {n: median(t) for n, t in times.items()},
               "rounds_ms": times, "peak_mib": peaks}
        results.append(row)
        ms = row["ms"]
        print(f"{'causal' if causal else 'full'} {args.n}: chunks ({launches['chunks']} launches) "
              f"{ms['chunks']:.2f} ms, {peaks['chunks']:.0f} MiB; one launch {ms['one launch']:.2f} ms, "
              f"{peaks['one launch']:.0f} MiB; chunks cost {ms['chunks'] / ms['one launch'] - 1:+.1%}", flush=True)
        del q, k, v, do, o, lse
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"dq_chunks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"benchmark": "dq_chunks", "device": torch.cuda.get_device_name(),
                                "rounds": args.rounds, "results": results}, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
