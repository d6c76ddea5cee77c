"""The order of heads in the Gluon kernels' varlen and ranges schedules, beside the dense kernels on
the same sequences.

    python benchmarks/varlen_heads.py [--out benchmarks/results] [--rounds 5]

Forward: one tile a program (``one_tile_per_program`` of the default config; the default at and
past 12k causal, 8k non-causal, d 128), varlen's slots one head's after another (``varlen_slot``),
ranges on the dense head-major grid; and where the default config is persistent, its work queue
(``queue``: one KV head's tiles after another, ``queue_tile``). Backward: the d ≤ 128 kernel's
varlen slots every KV head of a slot together (``heads_fastest``) or one KV head's after another
(``kv_head_major``); the default takes the latter from ``VARLEN_HEAD_MAJOR_FROM`` keys a sequence.
``dense``: the same sequences as a dense (B, H, N, D) batch at its default config (batches of equal
lengths). bf16, d 128, GQA as named (Hq, Hkv). Device time (``common.time_ms``) in balanced rounds
after an untimed one; medians. ``o_equal``: o bit-identical one tile a program and on the queue.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench.common import (add_run_arguments, format_table, gpu_script_args, in_rounds,  # noqa: E402
                                         time_ms, write_json)
from flashattn_lite.bench.variants import mixed_lengths  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import SEQ_RANGES, SEQ_VARLEN, Variant  # noqa: E402

D = 128
WAYS = {"fwd": ["one_tile", "queue", "dense"], "bwd": ["heads_fastest", "kv_head_major", "dense"]}


@contextlib.contextmanager
def slots(heads_fastest: bool):
    """Inside the block the backward's varlen slots every KV head of a slot together, or not."""
    launch = gluon_bwd._launch

    def patched(*a, **kw):
        grid, args, kwargs = launch(*a, **kw)
        if kwargs.get("SEQ") == SEQ_VARLEN:
            kwargs = {n: v for n, v in kwargs.items() if n != "HEADS_FASTEST"}
            if heads_fastest:
                kwargs["HEADS_FASTEST"] = True
        return grid, args, kwargs

    gluon_bwd._launch = patched
    try:
        yield
    finally:
        gluon_bwd._launch = launch


def with_slots(fn, heads_fastest: bool):
    def run():
        with slots(heads_fastest):
            return fn()
    return run


def packed(lens, hq, hkv, g):
    """q, k, v (1, H, total, D) views of (total, H, D), bf16, and their varlen Variant."""
    total = sum(lens)
    q, k, v = (torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1).unsqueeze(0)
               for h in (hq, hkv, hkv))
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).cuda()
    return q, k, v, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)


def as_dense(t, lens):
    """A (1, H, total, D) packed view of sequences of equal length as a (B, H, n, D) batch."""
    return t.squeeze(0).reshape(t.shape[1], len(lens), lens[0], D).transpose(0, 1).contiguous()


def add_cases(cases, label, q, k, v, causal, variant, n, dense=None):
    """``label``'s forward and backward ways (``WAYS``) into ``cases``; ``dense``: (q, k, v) of the
    same sequences as a dense batch."""
    scale, cfg = D ** -0.5, gluon_fwd.default_config(D, causal, n)

    def fwd(config):
        return lambda: gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, config=config, variant=variant)

    ways = {"one_tile": fwd(gluon_fwd.one_tile_per_program(cfg))}
    if cfg.persistent:
        ways["queue"] = fwd(cfg)
    if dense is not None:
        ways["dense"] = lambda: gluon_fwd.attention_forward_gluon(*dense, scale, causal)
    cases.update({(label, "fwd", way): fn for way, fn in ways.items()})
    if variant.seq != SEQ_VARLEN:
        return
    o, lse = ways["one_tile"]()
    do = torch.randn_like(o)

    def bwd():
        return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal, variant=variant)

    cases[(label, "bwd", "heads_fastest")] = with_slots(bwd, True)
    cases[(label, "bwd", "kv_head_major")] = with_slots(bwd, False)
    if dense is not None:
        od, lsed = gluon_fwd.attention_forward_gluon(*dense, scale, causal)
        dod = as_dense(do, [dense[0].shape[2]] * dense[0].shape[0])
        cases[(label, "bwd", "dense")] = lambda: gluon_bwd.attention_backward_gluon(dod, *dense, od, lsed, scale=scale,
                                                                                   causal=causal)


def main():
    args = gpu_script_args(__doc__, Path(__file__).parent / "results", add_run_arguments)
    rounds = args.rounds
    g = torch.Generator(device="cuda").manual_seed(0)
    cases, rows = {}, []
    batches = [([16384] * 2, 32, 8, True), ([16384] * 2, 32, 32, True), ([16384] * 2, 32, 8, False),
               ([8192] * 4, 32, 32, False), ([8192] * 4, 32, 32, True), ([4096] * 8, 32, 8, True),
               ([4096] * 8, 32, 8, False), ([4096] * 8, 32, 32, True), (mixed_lengths(32768), 16, 16, True)]
    for lens, hq, hkv, causal in batches:
        q, k, v, variant = packed(lens, hq, hkv, g)
        shape = f"{len(lens)} x {lens[0] // 1024}k" if len(set(lens)) == 1 else f"{len(lens)} mixed"
        label = f"varlen {shape} {'causal' if causal else 'non-causal'} Hq {hq} Hkv {hkv}"
        dense = tuple(as_dense(t, lens) for t in (q, k, v)) if len(set(lens)) == 1 else None
        add_cases(cases, label, q, k, v, causal, variant, sum(lens) // len(lens), dense)
    # Left-padded rows (HF's padded batch): 16 × 2k MHA 16, 4 × 8k MHA 32 (128 MiB of K and V a row).
    for B, N, h in ((16, 2048, 16), (4, 8192, 32)):
        pads = (torch.rand(B, generator=torch.Generator().manual_seed(1)) * 0.5 * N).long()
        ranges = torch.stack([pads, torch.full_like(pads, N)], 1).to(torch.int32).cuda()
        q, k, v = (torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        add_cases(cases, f"ranges {B} x {N // 1024}k padded causal Hq {h} Hkv {h}", q, k, v, True,
                  Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges), N)
    outputs = {key: fn()[0] for key, fn in cases.items() if key[1] == "fwd" and key[2] != "dense"}
    times, _ = in_rounds(list(cases), rounds, lambda key: time_ms(cases[key]))
    ms = {key: sorted(t)[rounds // 2] for key, t in times.items()}
    for label, pass_ in dict.fromkeys((key[0], key[1]) for key in cases):
        ways = WAYS[pass_]
        row = dict(case=label, pass_=pass_, **{way: ms.get((label, pass_, way)) for way in ways})
        if row["dense"]:
            row["dense_over_best"] = row["dense"] / min(row[way] for way in ways[:2] if row[way])
        if pass_ == "fwd" and row["queue"]:
            row["o_equal"] = torch.equal(outputs[(label, pass_, "queue")], outputs[(label, pass_, "one_tile")])
        rows.append(row)
    path = write_json(args.out, "varlen_heads", rows, dtype="bfloat16", head_dim=D, rounds=rounds,
                      timing="common.time_ms medians, balanced rounds after an untimed one")
    print(format_table(rows, ["case", "pass_", *WAYS["fwd"][:2], *WAYS["bwd"][:2], "dense", "dense_over_best",
                              "o_equal"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
