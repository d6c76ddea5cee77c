"""Where a tiny attention forward+backward spends its host time (a diagnostic for sdpa_overhead).

    python benchmarks/host_breakdown.py [--out benchmarks/results]

Host wall clock per call of back-to-back calls (synchronised once per block), best of ROUNDS
blocks, every item interleaved round by round, at sdpa_overhead's shape (B 1, H 8, N 16, d 64,
causal, fp16). Items:

- ``torch_fwd_bwd`` / ``ours_fwd_bwd``: ``autograd.grad`` of SDPA (flash backend, entered once
  around each block: before 2026-11-24 20:50 it was entered per call, which added the context
  manager's cost to torch's row) and of ours;
- ``ours_fwd_graph``: our forward with inputs that need a gradient (autograd node built, no backward);
- ``ours_bwd_direct``: ``attention_backward`` called on the main thread (no autograd engine; at
  this shape one bound launch of the short-call backward, ``attention_bwd._bwd_short_kernel``);
- ``engine_python`` / ``engine_cpp``: ``autograd.grad`` through a Python ``autograd.Function`` whose
  backward returns preallocated gradients, and through a C++ op (``q * 1``): the autograd engine's
  own cost, and what a Python backward adds to it (the worker thread takes the GIL);
- ``empty_like_x5``: five ``torch.empty_like`` of the inputs;
- ``ours_fwd_nograd``: our forward of the same tensors without autograd (inference);
- ``varlen_fwd_nograd`` / ``varlen_fwd_bwd``: ``attention_varlen`` over a packed batch of four
  sequences of 16 tokens (same H, d, dtype, causal), without autograd and forward+backward.

``--profile [ITEM ...]``: then cProfile over those items (default ``ours_fwd_bwd``), the functions
with the most own time, µs per call (cProfile's own cost inflates every function's time alike; read
the ranking).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import attention, attention_varlen, scaled_dot_product_attention  # noqa: E402
from flashattn_lite.bench.common import add_run_arguments, format_table, host_us, profile_rows, write_json  # noqa: E402
from flashattn_lite.ops import attention_bwd as bwd_ops  # noqa: E402

ROUNDS, CALLS = 11, 100


def _nograd(fn, *args, **kwargs):
    with torch.no_grad():
        return fn(*args, **kwargs)


class _Preallocated(torch.autograd.Function):
    """Identity whose backward hands back tensors made ahead: the engine's cost for a Python node."""
    grads = None

    @staticmethod
    def forward(ctx, q, k, v):
        return q.clone()

    @staticmethod
    def backward(ctx, do):
        return _Preallocated.grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--profile", nargs="*", metavar="ITEM",
                    help="also cProfile these items (no ITEM: ours_fwd_bwd)")
    add_run_arguments(ap)  # accepted for benchmarks/gpu_check.sh; this run is short either way
    args = ap.parse_args()
    assert torch.cuda.is_available(), "host_breakdown measures the GPU host path"
    B, H, N, D = 1, 8, 16, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    lens = (16, 16, 16, 16)
    cu = torch.tensor([0, 16, 32, 48, 64], device="cuda", dtype=torch.int32)
    qp, kp, vp = (torch.randn(sum(lens), H, D, device="cuda", dtype=torch.float16, requires_grad=True)
                  for _ in range(3))
    dop = torch.randn_like(qp)
    _Preallocated.grads = tuple(torch.empty_like(t) for t in (q, k, v))
    with torch.no_grad():
        o, lse = torch.ops.flashattn_lite.attention_fwd(q, k, v, None, None, None, None, None, D ** -0.5, True, 0,
                                                        -1, -1, 0.0, 0, 0.0, None)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def torch_fwd_bwd():
        return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    def bwd_direct():
        return bwd_ops.attention_backward(do, q, k, v, o, lse, None, scale=D ** -0.5, causal=True, causal_offset=0,
                                          mask=None, dropout_p=0.0, seed=0)

    items = {
        "torch_fwd_bwd": torch_fwd_bwd,
        "ours_fwd_bwd": lambda: torch.autograd.grad(scaled_dot_product_attention(q, k, v, is_causal=True),
                                                    (q, k, v), do),
        "ours_fwd_graph": lambda: scaled_dot_product_attention(q, k, v, is_causal=True),
        "ours_bwd_direct": bwd_direct,
        "engine_python": lambda: torch.autograd.grad(_Preallocated.apply(q, k, v), (q, k, v), do),
        "engine_cpp": lambda: torch.autograd.grad(q * 1.0, (q,), do),
        "empty_like_x5": lambda: [torch.empty_like(t) for t in (q, k, v, q, k)],
        "ours_fwd_nograd": lambda: _nograd(attention, q, k, v, causal=True),
        "varlen_fwd_nograd": lambda: _nograd(attention_varlen, qp, kp, vp, cu, cu, causal=True),
        "varlen_fwd_bwd": lambda: torch.autograd.grad(attention_varlen(qp, kp, vp, cu, cu, causal=True),
                                                      (qp, kp, vp), dop),
    }

    def timed(name, fn):
        context = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name.startswith("torch") else contextlib.nullcontext()
        with context:
            return host_us(fn, CALLS)

    for name, fn in items.items():  # compile and warm every path
        timed(name, fn)
    times = {name: [] for name in items}
    for _ in range(ROUNDS):
        for name, fn in items.items():
            times[name].append(timed(name, fn))
    rows = [dict(item=name, best_us=min(t), median_us=sorted(t)[ROUNDS // 2]) for name, t in times.items()]
    extra = {}
    profiled = (args.profile or ["ours_fwd_bwd"]) if args.profile is not None else []
    for name in profiled:
        extra[f"profile_{name}"] = profile_rows(items[name], ROUNDS * CALLS)
    path = write_json(args.out, "host_breakdown", rows, shape=dict(B=B, H=H, N=N, D=D, causal=True), dtype="float16",
                      **extra)
    print(format_table(rows, ["item", "best_us", "median_us"]))
    for name in profiled:
        print(f"cProfile of {name}, per call:")
        print(format_table(extra[f"profile_{name}"], ["function", "calls_per_step", "own_us", "cum_us"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
