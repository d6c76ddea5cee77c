"""Attention on a model's head layout: q, k, v and dO as (B, N, H, D) storage seen as (B, H, N, D)
(what attention layers of HF-style models hand over: the projections' views and the output's
transposed gradient) against the same calls on contiguous (B, H, N, D) tensors, beside torch's SDPA
on its cuDNN backend on the same tensors (the peer: how much its calls pay for the layout).

    python benchmarks/head_layouts.py [--out benchmarks/results] [--rounds 5]

Times, bf16, d 128, causal, B·N = 16k tokens at hidden 2048 (16 heads, GQA none), each layout and
length in turn for ``--rounds`` rounds (``common.time_ms``: device events, cold L2, median):
``fwd``, ``flashattn_lite.attention`` and the output made (B, N, H·D) as a model's next projection
takes it (``o.transpose(1, 2).reshape(B, N, H·D)``: a copy unless o already lies that way); ``bwd``,
``torch.autograd.grad`` of the output with dO (the forward's graph kept). The kernels read every
layout through TMA descriptors with its strides; what can differ is a copy of a tensor some step
takes contiguous.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flashattn_lite  # noqa: E402
from flashattn_lite.bench.common import add_run_arguments, format_table, time_ms, write_json  # noqa: E402

TOKENS, HEADS, D = 16384, 16, 128
LENGTHS = (2048, 8192, 16384)


def _inputs(n: int, layout: str):
    """q, k, v (leaves needing grad) and dO, (B, H, N, D) views in ``layout``'s storage."""
    b = TOKENS // n
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand():
        if layout == "bnhd":
            return torch.randn(b, n, HEADS, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
        return torch.randn(b, HEADS, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = rand(), rand(), rand(), rand()
    return [t.requires_grad_() for t in (q, k, v)], do


def _cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


IMPLS = {"lite": lambda q, k, v: flashattn_lite.attention(q, k, v, causal=True), "cudnn": _cudnn}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--rounds", type=int, default=5)
    add_run_arguments(ap)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "head_layouts measures GPU time"
    points = [(mode, n, impl, layout) for mode in ("fwd", "bwd") for n in LENGTHS for impl in IMPLS
              for layout in ("bhnd", "bnhd")]
    calls = {}
    for mode, n, impl, layout in points:
        leaves, do = _inputs(n, layout)
        attn = IMPLS[impl]
        if mode == "fwd":
            calls[mode, n, impl, layout] = (lambda leaves=leaves, attn=attn: attn(*leaves)
                                            .transpose(1, 2).reshape(leaves[0].shape[0], -1, HEADS * D))
        else:
            o = attn(*leaves)
            calls[mode, n, impl, layout] = (lambda o=o, leaves=leaves, do=do:
                                            torch.autograd.grad(o, leaves, do, retain_graph=True))
        calls[mode, n, impl, layout]()
    times = {p: [] for p in points}
    for _ in range(args.rounds):  # each point in turn, so drift falls on all alike
        for p in points:
            times[p].append(time_ms(calls[p], rep_ms=150))
    rows = []
    for (mode, n, impl, layout), ms in times.items():
        ms = sorted(ms)
        rows.append(dict(mode=mode, N=n, batch=TOKENS // n, heads=HEADS, d=D, impl=impl, layout=layout,
                         ms=ms[len(ms) // 2], rounds_ms=ms))
    ms_of = {(r["mode"], r["N"], r["impl"], r["layout"]): r["ms"] for r in rows}
    for r in rows:
        r["vs_contiguous"] = r["ms"] / ms_of[r["mode"], r["N"], r["impl"], "bhnd"]
        r["cudnn_over_this"] = ms_of[r["mode"], r["N"], "cudnn", r["layout"]] / r["ms"]
    path = write_json(args.out, "head_layouts", rows, dtype="bfloat16", causal=True)
    print(format_table(rows, ["mode", "N", "batch", "impl", "layout", "ms", "vs_contiguous", "cudnn_over_this"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
