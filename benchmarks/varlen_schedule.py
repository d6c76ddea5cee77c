"""The Gluon forward on a packed varlen batch and on a left-padded batch (per-row ranges): one tile a
program against the persistent schedule's work queue (``_loader_queue``), same batch, the default
config and its one-tile form (``one_tile_per_program``: one ring depth, the deeper, and one Q set).

    python benchmarks/varlen_schedule.py [--out benchmarks/results]

``variants.py``'s mixed batch (``mixed_lengths``: 32k tokens, H 16, bf16), d 128 and 64, causal and
not, at the default config of the batch's mean length (persistent at these lengths); and 16 rows
of 2048 tokens left-padded to 25–100% valid (seeded; HuggingFace's padded generation), d 128 causal,
at the default config of 2048; and 32k tokens as 512 sequences of 64 and as 2048 of 16, d 128 causal
(the loader's scan over many chunks of bounds), at the default config of their length: ``one_tile``
runs it as ``one_tile_per_program`` makes it, ``queue`` as it is. Device time (``common.time_ms``)
of ``attention_forward_gluon`` in balanced rounds after an untimed one; the row's ``speedup`` is
one_tile / queue. ``o_diff``: the largest |o_queue − o_one_tile| (each tile is computed by the same
code either way: 0 expected) and ``lse_equal``.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench.common import (add_run_arguments, format_table, gpu_script_args, in_rounds,  # noqa: E402
                                         time_ms, write_json)
from flashattn_lite.bench.variants import mixed_lengths  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import SEQ_RANGES, SEQ_VARLEN, Variant  # noqa: E402

TOKENS, HEADS = 32768, 16


def main():
    args = gpu_script_args(__doc__, Path(__file__).parent / "results", add_run_arguments)
    rounds = args.rounds
    lens = mixed_lengths(TOKENS)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).cuda()
    variant = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = {}
    for d in (128, 64):
        q, k, v = (torch.randn(TOKENS, HEADS, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   .transpose(0, 1).unsqueeze(0) for _ in range(3))
        for causal in (True, False):
            default = gluon_fwd.default_config(d, causal, TOKENS // len(lens))
            configs = {"one_tile": gluon_fwd.one_tile_per_program(default), "queue": default}
            for name, cfg in configs.items():
                cases[("varlen", d, causal, name)] = functools.partial(gluon_fwd.attention_forward_gluon, q, k, v,
                                                                       d ** -0.5, causal, config=cfg, variant=variant)
    # A left-padded batch: row b's valid queries and keys [pad_b, 2048).
    B, N = 16, 2048
    pads = (torch.rand(B, generator=torch.Generator().manual_seed(1)) * 0.75 * N).long()
    ranges = torch.stack([pads, torch.full_like(pads, N)], 1).to(torch.int32).cuda()
    padded = Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    q, k, v = (torch.randn(B, HEADS, N, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    default = gluon_fwd.default_config(128, True, N)
    for name, cfg in {"one_tile": gluon_fwd.one_tile_per_program(default), "queue": default}.items():
        cases[("ranges", 128, True, name)] = functools.partial(gluon_fwd.attention_forward_gluon, q, k, v, 128 ** -0.5,
                                                               True, config=cfg, variant=padded)
    many = {}
    for n_seq in (512, 2048):
        cu_many = torch.arange(0, TOKENS + 1, TOKENS // n_seq, dtype=torch.int32).cuda()
        many[n_seq] = Variant(seq=SEQ_VARLEN, seq_q=cu_many, seq_k=cu_many)
        q, k, v = (torch.randn(TOKENS, HEADS, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   .transpose(0, 1).unsqueeze(0) for _ in range(3))
        default = gluon_fwd.default_config(128, True, TOKENS // n_seq)
        for name, cfg in {"one_tile": gluon_fwd.one_tile_per_program(default), "queue": default}.items():
            cases[(f"varlen {n_seq}", 128, True, name)] = functools.partial(
                gluon_fwd.attention_forward_gluon, q, k, v, 128 ** -0.5, True, config=cfg, variant=many[n_seq])
    outputs = {key: fn() for key, fn in cases.items()}
    times, _ = in_rounds(list(cases), rounds, lambda key: time_ms(cases[key]))
    rows = []
    for layout, d, causal in [("varlen", d, causal) for d in (128, 64) for causal in (True, False)] + [
            ("ranges", 128, True), ("varlen 512", 128, True), ("varlen 2048", 128, True)]:
        one, queue = ((layout, d, causal, name) for name in ("one_tile", "queue"))
        ms = {key: sorted(times[key])[rounds // 2] for key in (one, queue)}
        n = {"varlen": TOKENS // len(lens), "ranges": N}.get(layout) or TOKENS // int(layout.split()[1])
        rows.append(dict(layout=layout, d=d, causal=causal, config=gluon_fwd.default_config(d, causal, n).name,
                         one_tile_ms=ms[one], queue_ms=ms[queue], speedup=ms[one] / ms[queue],
                         o_diff=(outputs[queue][0].float() - outputs[one][0].float()).abs().max().item(),
                         lse_equal=torch.equal(outputs[queue][1], outputs[one][1])))
    path = write_json(args.out, "varlen_schedule", rows, tokens=TOKENS, sequences=len(lens), lengths=lens,
                      padded_rows=B, padded_n=N, pads=pads.tolist(), heads=HEADS, dtype="bfloat16", rounds=rounds,
                      timing="common.time_ms medians, balanced rounds after an untimed one")
    print(format_table(rows, ["layout", "d", "causal", "config", "one_tile_ms", "queue_ms", "speedup", "o_diff",
                              "lse_equal"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
