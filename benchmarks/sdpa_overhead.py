"""Per-call time at a tiny shape, where the CPU-side wrapper cost is all there is to see.

    python benchmarks/sdpa_overhead.py [--out benchmarks/results] [--mock]

Rows: torch's SDPA pinned to its flash backend (the baseline: ``sdpa_kernel`` is entered once
around the timed loop, not per call), torch's SDPA with its default backend choice,
flashattn_lite.scaled_dot_product_attention, and the same through the custom-op dispatcher (the
torch.compile path, called eagerly), forward and forward+backward, B=1, H=8, N=16, d=64, all in
one process. Before 2026-11-23 15:41 the flash row entered ``sdpa_kernel`` inside every call, which added
the context manager's cost to torch's time. Two clocks: ``*_us`` is do_bench's median (device
events around one call after an L2 flush, which hides up to ~0.1 ms of host time behind the
flush), ``*_host_us`` the host wall clock per call of back-to-back calls (what a loop of tiny
calls actually costs: the host's launch path is all there is): the best of 15 rounds of 200 calls
(forward+backward too; before 2026-11-24 22:30, 9 rounds with 50 forward+backward calls, whose
ratio moved by 0.2 between processes), the implementations interleaved round by round; the
medians are kept too (``*_host_median_us``). Before 2026-11-23 17:05 each ran
one 300-call block in turn, and the host's drift between blocks moved torch's own two rows apart
by up to 1.8 ×. ``--mock`` replaces our kernels by output allocation only, isolating the Python
wrapper on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

# Host overhead does not depend on the tile config; autotuning the three kernels would cost ~35 s of
# a device call before the first measurement. FLASHATTN_LITE_AUTOTUNE=1 overrides.
os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import scaled_dot_product_attention  # noqa: E402
from flashattn_lite.bench.common import add_run_arguments, format_table, host_us, time_ms, write_json  # noqa: E402
import flashattn_lite.ops.attention as attn_ops  # noqa: E402

HOST_ROUNDS, HOST_CALLS = 15, 200


def _mock_kernels():
    def fwd(q, k, v, **kw):
        B, H, N, _ = q.shape
        return q.new_empty((B, H, N, v.shape[3])), q.new_empty((B, H, N), dtype=torch.float32)

    def bwd(do, q, k, v, o, lse, dlse, **kw):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None
    for name in ("attention_forward", "cpu_forward"):
        assert hasattr(attn_ops, name), f"--mock: ops.attention has no {name} (renamed?)"
        setattr(attn_ops, name, fwd)
    for name in ("attention_backward", "cpu_backward"):
        assert hasattr(attn_ops, name), f"--mock: ops.attention has no {name} (renamed?)"
        setattr(attn_ops, name, bwd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--mock", action="store_true", help="our kernels replaced by allocation only")
    add_run_arguments(ap)  # accepted for benchmarks/gpu_check.sh; this run is short either way
    args = ap.parse_args()
    if args.mock:
        _mock_kernels()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    B, H, N, D = 1, 8, 16, 64
    q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def torch_sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def flash_backend():
        """torch's SDPA pinned to its flash backend for the whole timed loop (entering
        ``sdpa_kernel`` per call would add the context manager's own cost to torch's time)."""
        if dev != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def ours():
        return scaled_dot_product_attention(q, k, v, is_causal=True)

    def ours_dispatcher():
        # (q, k, v, mask, sinks, alibi, seq_q, seq_k, scale, causal, causal_offset, left, right, softcap,
        #  seq, dropout_p, seed): plain causal attention
        return torch.ops.flashattn_lite.attention_fwd(q, k, v, None, None, None, None, None, D ** -0.5, True, 0,
                                                      -1, -1, 0.0, 0, 0.0, None)[0]

    rows = []
    cases = [("torch_sdpa", torch_sdpa, flash_backend), ("torch_sdpa_default", torch_sdpa, contextlib.nullcontext),
             ("flashattn_lite", ours, contextlib.nullcontext),
             ("custom_op_dispatcher", ours_dispatcher, contextlib.nullcontext)]
    fwd_bwd_of = {name: (lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), do)) for name, fn, _ in cases}
    for name, fn, context in cases:
        with context():
            with torch.no_grad():
                fwd = time_ms(fn)
            fwd_bwd = time_ms(fwd_bwd_of[name])
        rows.append(dict(impl=name, fwd_us=fwd * 1e3, fwd_bwd_us=fwd_bwd * 1e3))
    # Host clock: rounds of back-to-back calls, the implementations interleaved round by round, the
    # best round of each kept, so that a slow spell of the host (other processes, clock changes)
    # does not land on one implementation only.
    host = {(name, what): [] for name, _, _ in cases for what in ("fwd", "fwd_bwd")}
    for _ in range(HOST_ROUNDS):
        for name, fn, context in cases:
            with context():
                with torch.no_grad():
                    host[name, "fwd"].append(host_us(fn, HOST_CALLS))
                host[name, "fwd_bwd"].append(host_us(fwd_bwd_of[name], HOST_CALLS))
    for r in rows:
        r["fwd_host_us"] = min(host[r["impl"], "fwd"])
        r["fwd_bwd_host_us"] = min(host[r["impl"], "fwd_bwd"])
        r["fwd_host_median_us"] = sorted(host[r["impl"], "fwd"])[HOST_ROUNDS // 2]
        r["fwd_bwd_host_median_us"] = sorted(host[r["impl"], "fwd_bwd"])[HOST_ROUNDS // 2]
    base = rows[0]
    for r in rows:
        r["fwd_vs_torch"] = r["fwd_us"] / base["fwd_us"]
        r["fwd_bwd_vs_torch"] = r["fwd_bwd_us"] / base["fwd_bwd_us"]
        r["fwd_host_vs_torch"] = r["fwd_host_us"] / base["fwd_host_us"]
        r["fwd_bwd_host_vs_torch"] = r["fwd_bwd_host_us"] / base["fwd_bwd_host_us"]
        r["fwd_bwd_host_median_vs_torch"] = r["fwd_bwd_host_median_us"] / base["fwd_bwd_host_median_us"]
    path = write_json(args.out, "sdpa_overhead", rows, shape=dict(B=B, H=H, N=N, D=D, causal=True),
                      dtype=str(dtype), mock=args.mock)
    print(format_table(rows, ["impl", "fwd_us", "fwd_bwd_us", "fwd_vs_torch", "fwd_bwd_vs_torch", "fwd_host_us",
                              "fwd_bwd_host_us", "fwd_host_vs_torch", "fwd_bwd_host_vs_torch",
                              "fwd_bwd_host_median_vs_torch"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
