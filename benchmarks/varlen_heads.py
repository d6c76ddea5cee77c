"""The order of heads in the Gluon kernels' varlen and ranges schedules, beside the dense kernels on
the same sequences.

    python benchmarks/varlen_heads.py [--out benchmarks/results] [--rounds 5]

Forward: the work queue (``_loader_queue``) in bands (``queue_tile``) of ``QUEUE_BAND_UNITS`` units
of one KV head (``units 1``: every head of a tile together; ``units 1M``: one KV head's tiles after
another), at the default config of the batch's mean length forced persistent (``config=``), and its
one-tile form (``one_tile_per_program``). Backward: the d ≤ 128 kernel's varlen slots
(``varlen_slot``), every KV head of a slot together (``HEADS_FASTEST``) or one KV head's slots after
another (the default). ``dense``: the same sequences as a dense (B, H, N, D) batch at its default
config (batches of equal lengths). bf16, d 128, GQA as named (Hq, Hkv); a 2 × 16k left-padded batch
(ranges, forward only). Device time (``common.time_ms``) in balanced rounds after an untimed one;
medians. ``o_equal``: o bit-identical in every order (each tile is computed by the same code).
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
BANDS = {"units 1": 1, "units 32": 32, "units 128": 128, "units 1M": 1 << 20}


@contextlib.contextmanager
def order(units: int | None = None, heads_fastest: bool = False):
    """The forward queue's bands of ``units`` and the backward's varlen slots heads fastest, inside the block."""
    kept, bwd_launch = gluon_fwd.QUEUE_BAND_UNITS, gluon_bwd._launch

    def bwd(*a, **kw):
        grid, args, kwargs = bwd_launch(*a, **kw)
        return grid, args, dict(kwargs, HEADS_FASTEST=True) if kwargs.get("SEQ") == SEQ_VARLEN else kwargs

    gluon_fwd.QUEUE_BAND_UNITS = kept if units is None else units
    if heads_fastest:
        gluon_bwd._launch = bwd
    try:
        yield
    finally:
        gluon_fwd.QUEUE_BAND_UNITS, gluon_bwd._launch = kept, bwd_launch


def in_order(fn, **how):
    def run():
        with order(**how):
            return fn()
    return run


def packed(lens, hq, hkv, g):
    """q, k, v (1, H, total, D) views of (total, H, D), bf16, and their varlen Variant."""
    total = sum(lens)
    q, k, v = (torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1).unsqueeze(0)
               for h in (hq, hkv, hkv))
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).cuda()
    return q, k, v, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)


def main():
    args = gpu_script_args(__doc__, Path(__file__).parent / "results", add_run_arguments)
    rounds = args.rounds
    g = torch.Generator(device="cuda").manual_seed(0)
    cases, rows = {}, []
    batches = [("varlen 2 x 16k", [16384] * 2, 32, 8, True), ("varlen 2 x 16k MHA", [16384] * 2, 32, 32, True),
               ("varlen 2 x 16k", [16384] * 2, 32, 8, False), ("varlen 8 x 4k", [4096] * 8, 32, 8, True),
               ("varlen 22 mixed MHA", mixed_lengths(32768), 16, 16, True)]
    for name, lens, hq, hkv, causal in batches:
        q, k, v, variant = packed(lens, hq, hkv, g)
        n = sum(lens) // len(lens)
        cfg = gluon_fwd.default_config(D, causal, n)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, D ** -0.5, causal, config=cfg, variant=variant)
        do = torch.randn_like(o)
        fwd = {"one_tile": lambda q=q, k=k, v=v, c=causal, var=variant, cf=cfg: gluon_fwd.attention_forward_gluon(
                   q, k, v, D ** -0.5, c, config=gluon_fwd.one_tile_per_program(cf), variant=var)}
        run = (lambda q=q, k=k, v=v, c=causal, var=variant, cf=cfg:
               gluon_fwd.attention_forward_gluon(q, k, v, D ** -0.5, c, config=cf, variant=var))
        fwd.update({name: in_order(run, units=units) for name, units in BANDS.items()})
        bwd_run = (lambda q=q, k=k, v=v, o=o, lse=lse, do=do, c=causal, var=variant:
                   gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=D ** -0.5, causal=c, variant=var))
        bwd = {"heads_fastest": in_order(bwd_run, heads_fastest=True), "kv_head_major": bwd_run}
        if len(set(lens)) == 1:  # the dense batch of the same sequences
            qd, kd, vd = (t.squeeze(0).reshape(t.shape[1], len(lens), lens[0], D).transpose(0, 1).contiguous()
                          for t in (q, k, v))
            od, lsed = gluon_fwd.attention_forward_gluon(qd, kd, vd, D ** -0.5, causal)
            dod = torch.randn_like(od)
            fwd["dense"] = lambda qd=qd, kd=kd, vd=vd, c=causal: gluon_fwd.attention_forward_gluon(qd, kd, vd,
                                                                                                   D ** -0.5, c)
            bwd["dense"] = (lambda qd=qd, kd=kd, vd=vd, od=od, lsed=lsed, dod=dod, c=causal:
                            gluon_bwd.attention_backward_gluon(dod, qd, kd, vd, od, lsed, scale=D ** -0.5, causal=c))
        label = f"{name} {'causal' if causal else 'non-causal'} Hq {hq} Hkv {hkv}"
        for way, fn in fwd.items():
            cases[(label, "fwd", way)] = fn
        for way, fn in bwd.items():
            cases[(label, "bwd", way)] = fn
    # Left-padded rows of 16k (HF's padded batch), K and V 64 MiB a row.
    B, N, hq, hkv = 2, 16384, 32, 8
    ranges = torch.tensor([[N // 10, N], [3 * N // 10, N]], dtype=torch.int32).cuda()
    padded = Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    q = torch.randn(B, hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cfg = gluon_fwd.default_config(D, True, N)
    label = f"ranges 2 x 16k padded 10/30% causal Hq {hq} Hkv {hkv}"
    run = lambda: gluon_fwd.attention_forward_gluon(q, k, v, D ** -0.5, True, config=cfg, variant=padded)  # noqa: E731
    cases[(label, "fwd", "one_tile")] = lambda: gluon_fwd.attention_forward_gluon(
        q, k, v, D ** -0.5, True, config=gluon_fwd.one_tile_per_program(cfg), variant=padded)
    cases.update({(label, "fwd", name): in_order(run, units=units) for name, units in BANDS.items()})
    outputs = {key: fn() for key, fn in cases.items() if key[1] == "fwd" and key[2] != "dense"}
    times, _ = in_rounds(list(cases), rounds, lambda key: time_ms(cases[key]))
    ms = {key: sorted(t)[rounds // 2] for key, t in times.items()}
    ways = ["one_tile", *BANDS, "heads_fastest", "kv_head_major", "dense"]
    for label, pass_ in dict.fromkeys((key[0], key[1]) for key in cases):
        row = dict(case=label, pass_=pass_, **{way: ms.get((label, pass_, way)) for way in ways})
        best = min(t for way, t in row.items() if way in ways[:-1] and t)
        if row["dense"]:
            row["dense_over_best"] = row["dense"] / best
        if pass_ == "fwd":
            row["o_equal"] = all(torch.equal(outputs[(label, pass_, name)][0], outputs[(label, pass_, "one_tile")][0])
                                 for name in BANDS)
        rows.append(row)
    path = write_json(args.out, "varlen_heads", rows, dtype="bfloat16", head_dim=D, rounds=rounds,
                      timing="common.time_ms medians, balanced rounds after an untimed one")
    print(format_table(rows, ["case", "pass_", *ways, "dense_over_best", "o_equal"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
