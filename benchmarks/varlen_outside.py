"""What clearing a varlen batch's rows outside every sequence costs (``ops/outside_rows.py``).

    python benchmarks/varlen_outside.py [--out benchmarks/results]

Every varlen call on a GPU launches ``clear_outside_rows`` once in the forward (o and lse) and twice in
the backward (dq; dk and dv): each program reads the bounds and leaves unless its rows lie outside
them. Items, each timed with the clearing on and with it replaced by a no-op (``off``), in rotated
rounds:

- ``tiny_fwd`` / ``tiny_fwd_bwd``: host wall clock per call of back-to-back calls (synchronised once
  per block) of a tiny batch (4 sequences of 16 tokens, H 8, d 64, fp16, causal), where the host path
  is the call's time: the launches' own cost;
- ``long_fwd`` / ``long_fwd_bwd``: device time (``common.time_ms``) of ``variants.py``'s mixed batch
  (``mixed_lengths``: 32k tokens, H 16, d 128, bf16, causal);
- ``clear_covering`` / ``clear_tail``: the forward's clearing alone over that batch's o and lse,
  bounds covering every row (every program leaves at once) and bounds leaving 1000 rows out.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import attention_varlen  # noqa: E402
from flashattn_lite.bench.variants import mixed_lengths  # noqa: E402
from flashattn_lite.bench.common import (add_run_arguments, format_table, host_us, balanced_rounds,  # noqa: E402
                                         time_ms, write_json)
from flashattn_lite.ops import attention as attention_ops  # noqa: E402
from flashattn_lite.ops.outside_rows import clear_outside_rows  # noqa: E402

ROUNDS, CALLS = 7, 100


def _packed(lens, heads, d, dtype, grad):
    total = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=dtype, requires_grad=grad) for _ in range(3))
    return q, k, v, cu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    add_run_arguments(ap)  # accepted for benchmarks/gpu_check.sh; this run is short either way
    args = ap.parse_args()
    assert torch.cuda.is_available(), "varlen_outside measures the GPU"
    tiny = _packed([16] * 4, 8, 64, torch.float16, True)
    lens = mixed_lengths(32768)
    long = _packed(lens, 16, 128, torch.bfloat16, True)

    def fwd(batch):
        q, k, v, cu = batch
        with torch.no_grad():
            return attention_varlen(q, k, v, cu, cu, causal=True)

    def fwd_bwd(batch):
        q, k, v, cu = batch
        o = attention_varlen(q, k, v, cu, cu, causal=True)
        return torch.autograd.grad(o, (q, k, v), o.detach())

    o, lse = attention_varlen(*long[:3], long[3], long[3], causal=True, return_lse=True)
    o, lse = o.detach(), lse.detach()
    tail = long[3].clone()
    tail[-1] -= 1000
    items = {"tiny_fwd": ("host", lambda: fwd(tiny)), "tiny_fwd_bwd": ("host", lambda: fwd_bwd(tiny)),
             "long_fwd": ("device", lambda: fwd(long)), "long_fwd_bwd": ("device", lambda: fwd_bwd(long)),
             "clear_covering": ("device", lambda: clear_outside_rows(long[3], o, 0.0, lse, float("-inf"), b_rows_dim=1)),
             "clear_tail": ("device", lambda: clear_outside_rows(tail, o, 0.0, lse, float("-inf"), b_rows_dim=1))}

    def measure(name, clearing):
        kind, fn = items[name]
        attention_ops.clear_outside_rows = clear_outside_rows if clearing else (lambda *a, **kw: None)
        try:
            return host_us(fn, CALLS) if kind == "host" else time_ms(fn) * 1e3
        finally:
            attention_ops.clear_outside_rows = clear_outside_rows

    keys = [(name, clearing) for name in items for clearing in ((True, False) if not name.startswith("clear")
                                                                else (True,))]
    for key in keys:  # compile and warm every path
        measure(*key)
    times = {key: [] for key in keys}
    for order in balanced_rounds(keys, ROUNDS):
        for key in order:
            times[key].append(measure(*key))
    rows = []
    for name, (kind, _) in items.items():
        on = sorted(times[(name, True)])
        row = dict(item=name, unit="host us" if kind == "host" else "device us", on_median=on[ROUNDS // 2],
                   on_best=on[0])
        if (name, False) in times:
            off = sorted(times[(name, False)])
            row.update(off_median=off[ROUNDS // 2], off_best=off[0], change_pct=100 * (on[ROUNDS // 2] / off[ROUNDS // 2] - 1))
        rows.append(row)
    path = write_json(args.out, "varlen_outside", rows, tiny=dict(sequences=4, tokens=16, heads=8, d=64, dtype="float16"),
                      long=dict(tokens=32768, sequences=len(lens), heads=16, d=128, dtype="bfloat16"), causal=True,
                      rounds=ROUNDS)
    print(format_table(rows, ["item", "unit", "on_median", "off_median", "change_pct", "on_best", "off_best"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
