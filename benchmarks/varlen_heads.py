"""The order of heads in the Gluon kernels' varlen and ranges schedules, beside the dense kernels on
the same sequences.

    python benchmarks/varlen_heads.py [--out benchmarks/results] [--rounds 5]

Forward, one tile a program (``one_tile_per_program`` of the default config; the default at and past
12k causal, 8k non-causal, d 128): varlen's slots (``varlen_slot``) every head of a slot together
(``one_tile_hf``, ``HEADS_FASTEST``) or one head's slots after another (``one_tile``); ranges run the
dense head-major grid. Forward where the default config is persistent: its work queue
(``_loader_queue``) in bands (``queue_tile``) of ``QUEUE_BAND_UNITS`` units of one KV head (``u1``:
every head of a tile together; ``u1M``: one KV head's tiles after another). Backward: the d ≤ 128
kernel's varlen slots heads fastest (``one_tile_hf``) or one KV head's after another (``one_tile``).
``dense``: the same sequences as a dense (B, H, N, D) batch at its default config (batches of equal
lengths). bf16, d 128, GQA as named (Hq, Hkv). Device time (``common.time_ms``) in balanced rounds
after an untimed one; medians. ``o_equal``: o bit-identical in every order (each tile is computed by
the same code).
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
BANDS = {"u1": 1, "u32": 32, "u1M": 1 << 20}
WAYS = ["one_tile_hf", "one_tile", *BANDS, "dense"]


@contextlib.contextmanager
def order(units: int | None = None, heads_fastest: bool = False):
    """Inside the block: the forward queue's bands of ``units``; with ``heads_fastest`` both kernels'
    varlen slots every head of a slot together."""
    kept, launches = gluon_fwd.QUEUE_BAND_UNITS, (gluon_fwd._launch, gluon_bwd._launch)

    def fastest(launch):
        def patched(*a, **kw):
            grid, args, kwargs = launch(*a, **kw)
            if kwargs.get("SEQ") == SEQ_VARLEN and not kwargs.get("PERSISTENT"):
                kwargs = dict(kwargs, HEADS_FASTEST=True)
            return grid, args, kwargs
        return patched

    gluon_fwd.QUEUE_BAND_UNITS = kept if units is None else units
    if heads_fastest:
        gluon_fwd._launch, gluon_bwd._launch = (fastest(launch) for launch in launches)
    try:
        yield
    finally:
        gluon_fwd.QUEUE_BAND_UNITS, (gluon_fwd._launch, gluon_bwd._launch) = kept, launches


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


def as_dense(t, lens):
    """A (1, H, total, D) packed view of sequences of equal length as a (B, H, n, D) batch."""
    return t.squeeze(0).reshape(t.shape[1], len(lens), lens[0], D).transpose(0, 1).contiguous()


def add_cases(cases, label, q, k, v, causal, variant, n, dense=None):
    """``label``'s forward and backward ways (``WAYS``) into ``cases``; ``dense``: (q, k, v) of the
    same sequences as a dense batch."""
    scale, cfg = D ** -0.5, gluon_fwd.default_config(D, causal, n)

    def fwd(config):
        return lambda: gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, config=config, variant=variant)

    one_tile = fwd(gluon_fwd.one_tile_per_program(cfg))
    ways = {"one_tile": one_tile}
    if variant.seq == SEQ_VARLEN:
        ways["one_tile_hf"] = in_order(one_tile, heads_fastest=True)
    if cfg.persistent:
        ways.update({name: in_order(fwd(cfg), units=units) for name, units in BANDS.items()})
    if dense is not None:
        ways["dense"] = lambda: gluon_fwd.attention_forward_gluon(*dense, scale, causal)
    cases.update({(label, "fwd", way): fn for way, fn in ways.items()})
    if variant.seq != SEQ_VARLEN:
        return
    o, lse = one_tile()
    do = torch.randn_like(o)

    def bwd():
        return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal, variant=variant)

    cases[(label, "bwd", "one_tile")] = bwd
    cases[(label, "bwd", "one_tile_hf")] = in_order(bwd, heads_fastest=True)
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
               ([4096] * 8, 32, 32, True), (mixed_lengths(32768), 16, 16, True)]
    for lens, hq, hkv, causal in batches:
        q, k, v, variant = packed(lens, hq, hkv, g)
        shape = f"{len(lens)} x {lens[0] // 1024}k" if len(set(lens)) == 1 else f"{len(lens)} mixed"
        label = f"varlen {shape} {'causal' if causal else 'non-causal'} Hq {hq} Hkv {hkv}"
        dense = tuple(as_dense(t, lens) for t in (q, k, v)) if len(set(lens)) == 1 else None
        add_cases(cases, label, q, k, v, causal, variant, sum(lens) // len(lens), dense)
    # Left-padded rows (HF's padded batch): 16 × 2k MHA 16, 4 × 8k MHA 32 (64 MiB of K and V a row).
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
        row = dict(case=label, pass_=pass_, **{way: ms.get((label, pass_, way)) for way in WAYS})
        best = min(t for way, t in row.items() if way in WAYS[:-1] and t)
        if row["dense"]:
            row["dense_over_best"] = row["dense"] / best
        if pass_ == "fwd":
            row["o_equal"] = all(torch.equal(outputs[(label, pass_, way)], outputs[(label, pass_, "one_tile")])
                                 for way in WAYS[:-1] if (label, pass_, way) in outputs)
        rows.append(row)
    path = write_json(args.out, "varlen_heads", rows, dtype="bfloat16", head_dim=D, rounds=rounds,
                      timing="common.time_ms medians, balanced rounds after an untimed one")
    print(format_table(rows, ["case", "pass_", *WAYS, "dense_over_best", "o_equal"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
