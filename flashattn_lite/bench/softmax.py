"""Softmax bandwidth sweep: ours against torch in the same run, with the device copy as the ceiling.

For each dtype and row length N = 2^lo … 2^hi, R = total_bytes / (N · itemsize) rows. Forward moves
x in and y out (2·R·N elements; logsumexp: R·N in, R out); backward moves y and dy in and dx out
(3·R·N elements). Achieved bandwidth = those bytes / median time; the fraction of the measured
device copy bandwidth is what the kernels are judged by. Times are kernels only: the backward calls
the backward launchers directly (ours and ``torch._softmax_backward_data``), not autograd.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .._runtime import runs_triton
from ..ops import softmax as sm
from .common import device_copy_bandwidth, format_table, time_ms, write_json

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_OPS = {"softmax": sm.SOFTMAX, "log_softmax": sm.LOG_SOFTMAX, "logsumexp": sm.LOGSUMEXP}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gpu = torch.cuda.is_available()
    parser.add_argument("--op", choices=list(_OPS), default="softmax")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--directions", default="fwd,bwd", help="comma-separated: fwd, bwd")
    parser.add_argument("--min-log2n", type=int, default=10)
    parser.add_argument("--max-log2n", type=int, default=22 if gpu else 14)
    parser.add_argument("--total-mib", type=float, default=1024 if gpu else 0.25,
                        help="size of x per measurement (1 GiB on the GPU, tiny on the CPU)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")


def _torch_fwd(op):
    return {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
            "logsumexp": lambda x: torch.logsumexp(x, -1)}[op]


def _measure(op: str, direction: str, dtype: torch.dtype, n: int, total_bytes: int, device: str) -> dict:
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, total_bytes // (n * itemsize))
    x = torch.randn(rows, n, device=device, dtype=dtype)
    code = _OPS[op]
    if direction == "fwd":
        moved = rows * n * itemsize + (rows * 4 if op == "logsumexp" else rows * n * itemsize)
        ours = lambda: sm._forward(code, x, dtype, "auto")
        theirs = lambda: _torch_fwd(op)(x)
    else:
        y = _torch_fwd(op)(x)
        dy = torch.randn_like(y)
        moved = 3 * rows * n * itemsize
        ours = lambda: sm._backward(code, y, dy, dtype, "auto")
        fn = torch._softmax_backward_data if op == "softmax" else torch._log_softmax_backward_data
        theirs = lambda: fn(dy, y, -1, dtype)
    ours()  # compile and autotune outside the timing
    t_ours, t_torch = time_ms(ours), time_ms(theirs)
    return {"op": op, "direction": direction, "dtype": str(dtype).replace("torch.", ""), "N": n, "rows": rows,
            "strategy": sm._choose("auto", rows, n, x) if runs_triton(x) else "cpu-twin", "bytes": moved,
            "ours_ms": t_ours, "torch_ms": t_torch,
            "ours_gbps": moved / t_ours * 1e-6, "torch_gbps": moved / t_torch * 1e-6,
            "speedup": t_torch / t_ours}


def _plot(rows: list[dict], copy_gbps: float, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = sorted({(r["direction"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (direction, dtype) in zip(axes[0], groups):
        sel = [r for r in rows if r["direction"] == direction and r["dtype"] == dtype]
        ns = [r["N"] for r in sel]
        ax.plot(ns, [r["ours_gbps"] for r in sel], "o-", label="flashattn_lite")
        ax.plot(ns, [r["torch_gbps"] for r in sel], "s--", label="torch")
        ax.axhline(copy_gbps, color="gray", linestyle=":", label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row length N")
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{sel[0]['op']} {direction} {dtype}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(args) -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    total = int(args.total_mib * 2 ** 20)
    copy_gbps = device_copy_bandwidth(min(total, 2 ** 30)) * 1e-9
    directions = [d for d in args.directions.split(",") if d]
    if args.op == "logsumexp":
        directions = [d for d in directions if d == "fwd"]
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = _DTYPES[dtype_name]
        for direction in directions:
            for k in range(args.min_log2n, args.max_log2n + 1):
                r = _measure(args.op, direction, dtype, 2 ** k, total, device)
                r["ours_frac_copy"] = r["ours_gbps"] / copy_gbps
                r["torch_frac_copy"] = r["torch_gbps"] / copy_gbps
                rows.append(r)
    out = Path(getattr(args, "out", None) or "benchmarks/results")
    path = write_json(out, f"{args.op}_bandwidth", rows, copy_gbps=copy_gbps, total_bytes=total)
    plot = None if args.no_plot else _plot(rows, copy_gbps, out / f"{args.op}_bandwidth.png")
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s (read + written)")
    print(format_table(rows, ["direction", "dtype", "N", "rows", "strategy", "ours_gbps", "torch_gbps",
                              "ours_frac_copy", "torch_frac_copy", "speedup"]))
    print(f"wrote {path}" + (f" and {plot}" if plot else ""))
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--out", default="benchmarks/results")
    return run(parser.parse_args(argv))


__all__ = ["add_arguments", "run", "main"]
