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
from . import common
from .common import device_copy_bandwidth, time_ms

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_OPS = {"softmax": sm.SOFTMAX, "log_softmax": sm.LOG_SOFTMAX, "logsumexp": sm.LOGSUMEXP}
DEFAULTS = {"cuda": dict(dtypes="fp32,bf16", directions="fwd,bwd", min_log2n=10, max_log2n=22, log2n=None,
                         total_mib=1024.0),
            "cpu": dict(dtypes="fp32,bf16", directions="fwd,bwd", min_log2n=10, max_log2n=14, log2n=None,
                        total_mib=0.25)}
# --quick: one row length per strategy regime (short rows, rows on chip, long rows chunked / split).
# Each N and dtype autotunes ours on its first call (printed when slow).
QUICK = {"cuda": dict(log2n="10,14,16,20,22", total_mib=512.0),
         "cpu": dict(log2n="10,14", dtypes="fp32")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", choices=list(_OPS), default="softmax")
    parser.add_argument("--dtypes", help="comma-separated: fp32, bf16, fp16 (default fp32,bf16)")
    parser.add_argument("--directions", help="comma-separated: fwd, bwd (default both)")
    parser.add_argument("--min-log2n", type=int, help="shortest row length 2^k (default 10)")
    parser.add_argument("--max-log2n", type=int, help="longest row length 2^k (default 22 on a GPU, 14 on CPU)")
    parser.add_argument("--log2n", metavar="K,K,...", help="comma-separated exponents (e.g. 10,14,20), instead "
                                                           "of every one from --min-log2n to --max-log2n")
    parser.add_argument("--total-mib", type=float,
                        help="size of x per measurement (default 1 GiB on the GPU, tiny on the CPU)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    common.add_run_arguments(parser)


def _resolve(args, device: str):
    val = common.settings(args, DEFAULTS[device], QUICK[device])
    if args.min_log2n is not None or args.max_log2n is not None:  # an explicit range beats a preset's list
        val["log2n"] = args.log2n
    try:
        dtypes = common.split_list(val["dtypes"], _DTYPES, "--dtypes")
        directions = common.split_list(val["directions"], ("fwd", "bwd"), "--directions")
    except ValueError as e:
        raise common.BenchArgumentError(str(e)) from None
    # Name the option the bad exponent came from: --log2n's list, else the range's bounds.
    if val["log2n"]:
        try:
            exps = [int(k) for k in str(val["log2n"]).split(",") if k.strip()]
        except ValueError:
            raise common.BenchArgumentError(f"--log2n must be comma-separated integers, "
                                            f"got {val['log2n']!r}") from None
        if not exps or any(not 0 <= k <= 30 for k in exps):
            raise common.BenchArgumentError(f"--log2n needs at least one exponent, each in [0, 30], got {exps}")
    else:
        for opt, key in (("--min-log2n", "min_log2n"), ("--max-log2n", "max_log2n")):
            if not 0 <= val[key] <= 30:
                raise common.BenchArgumentError(f"{opt} must be in [0, 30], got {val[key]}")
        exps = list(range(val["min_log2n"], val["max_log2n"] + 1))
        if not exps:
            raise common.BenchArgumentError(f"--min-log2n ({val['min_log2n']}) is larger than --max-log2n "
                                            f"({val['max_log2n']})")
    if not val["total_mib"] > 0:  # NaN fails too
        raise common.BenchArgumentError(f"--total-mib must be positive, got {val['total_mib']}")
    if args.op == "logsumexp":
        directions = [d for d in directions if d == "fwd"]
    return dtypes, directions, exps, int(val["total_mib"] * 2 ** 20)


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
    warmup_s = common.warm_up(ours, f"ours {op} {direction} {str(dtype).replace('torch.', '')} N=2^{n.bit_length() - 1}")
    t_ours, t_torch = time_ms(ours), time_ms(theirs)
    return {"op": op, "direction": direction, "dtype": str(dtype).replace("torch.", ""), "N": n, "rows": rows,
            "strategy": sm._choose("auto", rows, n, x) if runs_triton(x) else "cpu-twin", "bytes": moved,
            "ours_ms": t_ours, "torch_ms": t_torch,
            "ours_gbps": moved / t_ours * 1e-6, "torch_gbps": moved / t_torch * 1e-6,
            "speedup": t_torch / t_ours, "warmup_s": warmup_s}


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
    """Sweep, streaming each point (a line on stdout, JSON + CSV rewritten under ``args.out``), then
    print the table and plot."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes, directions, exps, total = _resolve(args, device)
    copy_gbps = device_copy_bandwidth(min(total, 2 ** 30)) * 1e-9
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s (read + written)", flush=True)
    out = getattr(args, "out", None) or "benchmarks/results"
    writer = common.ResultWriter(out, f"{args.op}_bandwidth", meta=dict(copy_gbps=copy_gbps, total_bytes=total),
                                 budget_s=args.time_budget,
                                 columns=["direction", "dtype", "N", "strategy", "ours_gbps", "torch_gbps", "speedup"])
    with writer:
        for dtype_name in dtypes:
            for direction in directions:
                for k in exps:
                    if not writer.start(direction=direction, dtype=dtype_name, N=2 ** k):
                        continue
                    r = _measure(args.op, direction, _DTYPES[dtype_name], 2 ** k, total, device)
                    r["ours_frac_copy"] = r["ours_gbps"] / copy_gbps
                    r["torch_frac_copy"] = r["torch_gbps"] / copy_gbps
                    writer.add(r)
    rows = writer.rows
    print(common.format_table(rows, ["direction", "dtype", "N", "rows", "strategy", "ours_gbps", "torch_gbps",
                                     "ours_frac_copy", "torch_frac_copy", "speedup"]))
    paths = writer.finish()
    if not args.no_plot and rows:
        plot = _plot(rows, copy_gbps, writer.path(".png"))
        paths += [plot] if plot else []
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


__all__ = ["add_arguments", "run"]
