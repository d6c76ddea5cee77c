"""Whether the order of a varlen batch's sequences changes its speed (the launch's tail).

    python benchmarks/varlen_order.py [--out benchmarks/results]

``variants.py``'s mixed batch (``mixed_lengths``: 32k tokens, H 16, d 128, bf16, causal) packed
three ways: as drawn, longest sequence first and shortest first. The same sequences, the same
work: a change of time is the schedule's (which tiles start last). Device time
(``common.time_ms``) of the forward and of forward+backward, in balanced rounds after an untimed
one. Each order's output, put back in the drawn order, must equal the drawn order's bit for bit
(each sequence is computed on its own): the row's ``o_equal``; its gradients may differ in the last
bits where the backward accumulates dQ with atomics (in no fixed order): ``grad_err``, the largest
relative difference from the drawn order's, beside ``grad_err_repeat``, the drawn order's against a
second run of itself.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import attention_varlen  # noqa: E402
from flashattn_lite.bench.common import (add_run_arguments, format_table, gpu_script_args, in_rounds,  # noqa: E402
                                         relative_error, time_ms, write_json)
from flashattn_lite.bench.variants import mixed_lengths  # noqa: E402

TOKENS, HEADS, D = 32768, 16, 128


def _packed(q, lens, order):
    """The rows of ``q`` (drawn order) repacked with its sequences in ``order``; their cu_seqlens."""
    starts = torch.tensor([0] + lens).cumsum(0).tolist()
    parts = [q[starts[i]:starts[i + 1]] for i in order]
    cu = torch.tensor([0] + [lens[i] for i in order]).cumsum(0).to(torch.int32).to(q.device)
    return torch.cat(parts).detach().requires_grad_(), cu


def _unpacked(x, lens, order):
    """Rows packed in ``order`` back in the drawn order."""
    starts = torch.tensor([0] + [lens[i] for i in order]).cumsum(0).tolist()
    where = {i: x[starts[j]:starts[j + 1]] for j, i in enumerate(order)}
    return torch.cat([where[i] for i in range(len(lens))])


def main():
    # (--quick and --time-budget are accepted for benchmarks/gpu_check.sh; this run is short either way)
    args = gpu_script_args(__doc__, Path(__file__).parent / "results", add_run_arguments)
    rounds = args.rounds
    lens = mixed_lengths(TOKENS)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(TOKENS, HEADS, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    orders = {"drawn": list(range(len(lens))),
              "longest_first": sorted(range(len(lens)), key=lambda i: -lens[i]),
              "shortest_first": sorted(range(len(lens)), key=lambda i: lens[i])}
    batches = {}
    for name, order in orders.items():
        (qo, cu), (ko, _), (vo, _), (doo, _) = (_packed(t, lens, order) for t in (q, k, v, do))
        batches[name] = (qo, ko, vo, doo.detach(), cu)

    def fwd(name):
        qo, ko, vo, _, cu = batches[name]
        with torch.no_grad():
            return attention_varlen(qo, ko, vo, cu, cu, causal=True)

    def fwd_bwd(name):
        qo, ko, vo, doo, cu = batches[name]
        o = attention_varlen(qo, ko, vo, cu, cu, causal=True)
        return (o, *torch.autograd.grad(o, (qo, ko, vo), doo))

    outputs = {name: [_unpacked(t, lens, orders[name]) for t in fwd_bwd(name)] for name in orders}
    repeat = fwd_bwd("drawn")

    def grad_err(grads):
        return relative_error(grads, outputs["drawn"][1:])
    keys = [(name, mode) for name in orders for mode in ("fwd", "fwd_bwd")]
    run = {"fwd": fwd, "fwd_bwd": fwd_bwd}
    times, _ = in_rounds(keys, rounds, lambda key: time_ms(lambda: run[key[1]](key[0])))
    rows = []
    for name in orders:
        row = dict(order=name, o_equal=torch.equal(outputs[name][0], outputs["drawn"][0]),
                   grad_err=grad_err(outputs[name][1:]), grad_err_repeat=grad_err(repeat[1:]))
        for mode in ("fwd", "fwd_bwd"):
            ms = sorted(times[(name, mode)])[rounds // 2]
            base = sorted(times[("drawn", mode)])[rounds // 2]
            row.update({f"{mode}_ms": ms, f"{mode}_speedup": base / ms})
        rows.append(row)
    path = write_json(args.out, "varlen_order", rows, tokens=TOKENS, sequences=len(lens), lengths=lens, heads=HEADS,
                      d=D, dtype="bfloat16", causal=True, rounds=rounds,
                      timing="common.time_ms medians, balanced rounds after an untimed one")
    print(format_table(rows, ["order", "o_equal", "grad_err", "grad_err_repeat", "fwd_ms", "fwd_speedup", "fwd_bwd_ms", "fwd_bwd_speedup"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
