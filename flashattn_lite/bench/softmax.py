"""Softmax bandwidth sweep: ours against torch in the same run, with the device copy as the ceiling.

For each dtype and row length N = 2^lo … 2^hi, R = total_bytes / (N · itemsize) rows. Forward moves
x in and y out (2·R·N elements; logsumexp: R·N in, R out); backward moves y and dy in and dx out
(3·R·N elements). Achieved bandwidth = those bytes / median time; the fraction of the measured
device copy bandwidth is what the kernels are judged by. Times are kernels only: the backward calls
the backward launchers directly (ours and ``torch._softmax_backward_data``), not autograd.

At every point ours, torch and the device copy of x (the ceiling, 2 · x's bytes: timed beside the
point, not once at start-up) are warmed up (ours compiles / autotunes there), ours and torch are
checked against torch's op in float64 on fresh inputs (``check_err``: max |error| / max |reference|;
ours past ``CHECK_TOLERANCE`` is ``status: wrong``, with no speed), then all three are timed once in
an untimed round (no one gets the first run after the warm-ups' idle, which runs fast) and in
``--rounds`` rounds in the orders of ``common.balanced_rounds``; each keeps its median round
(``common.time_ms``), and every round's times (``*_rounds_ms``) and the orders (``rounds_order``)
are recorded.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from .._runtime import runs_triton
from ..ops import softmax as sm
from . import common

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_OPS = {"softmax": sm.SOFTMAX, "log_softmax": sm.LOG_SOFTMAX, "logsumexp": sm.LOGSUMEXP}
DEFAULTS = {"cuda": dict(dtypes="fp32,bf16", directions="fwd,bwd", min_log2n=10, max_log2n=22, log2n=None,
                         total_mib=1024.0, rounds=3),
            "cpu": dict(dtypes="fp32,bf16", directions="fwd,bwd", min_log2n=10, max_log2n=14, log2n=None,
                        total_mib=0.25, rounds=3)}
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
    parser.add_argument("--rounds", type=common.round_count,
                        help="timed rounds per point, after an untimed one, in a balanced order (default 3)")
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
    return dtypes, directions, exps, int(val["total_mib"] * 2 ** 20), val["rounds"]


def _torch_fwd(op):
    return {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
            "logsumexp": lambda x: torch.logsumexp(x, -1)}[op]


# The benchmarks' tolerance (``common.CHECK_TOLERANCE``), tighter in float32: a softmax has no
# 16-bit matmul operands, so a float32 row is exact to a few float32 units.
CHECK_TOLERANCE = {**common.CHECK_TOLERANCE, torch.float32: 1e-3}
_CHECK_ELEMENTS = 2 ** 26   # elements of float64 reference computed at a time (rows in chunks)


def _reference(op: str, direction: str, inputs: tuple) -> torch.Tensor:
    """torch's own op in float64 on ``inputs`` (fwd: (x,); bwd: (y, dy)): the check's reference."""
    if direction == "fwd":
        return _torch_fwd(op)(inputs[0].double())
    y, dy = inputs
    fn = torch._softmax_backward_data if op == "softmax" else torch._log_softmax_backward_data
    return fn(dy.double(), y.double(), -1, torch.float64)


def check_error(got: torch.Tensor, op: str, direction: str, inputs: tuple) -> float:
    """max|got − ref| / max|ref| against ``_reference`` (float64), computed over row chunks so that
    the float64 copies stay small; NaN where ``got`` has a NaN."""
    rows, n = inputs[0].shape
    step = max(1, _CHECK_ELEMENTS // n)
    err, scale = 0.0, 0.0
    for r0 in range(0, rows, step):
        ref = _reference(op, direction, tuple(t[r0:r0 + step] for t in inputs))
        diff = (got[r0:r0 + step].double() - ref).abs().max().item()
        if math.isnan(diff):
            return diff
        err = max(err, diff)
        scale = max(scale, ref.abs().max().item())
    return err / max(scale, 1e-30)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _measure(op: str, direction: str, dtype: torch.dtype, n: int, total_bytes: int, device: str,
             rounds: int = 3) -> dict:
    """One point: ours, torch and the device copy of the same bytes (the ceiling), each warmed up,
    ours (and torch) checked against float64 on fresh inputs, then one untimed round and ``rounds``
    timed rounds in ``common.balanced_rounds`` orders; medians kept, every round's time recorded."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, total_bytes // (n * itemsize))
    x = torch.randn(rows, n, device=device, dtype=dtype)
    code = _OPS[op]
    dname = str(dtype).replace("torch.", "")
    if direction == "fwd":
        moved = rows * n * itemsize + (rows * 4 if op == "logsumexp" else rows * n * itemsize)
        ours_on = lambda x: sm._forward(code, x, dtype, "auto")  # noqa: E731
        torch_on = _torch_fwd(op)
        fresh = lambda: (torch.randn_like(x),)  # noqa: E731
        inputs = (x,)
    else:
        moved = 3 * rows * n * itemsize
        ours_on = lambda y, dy: sm._backward(code, y, dy, dtype, "auto")  # noqa: E731
        fn = torch._softmax_backward_data if op == "softmax" else torch._log_softmax_backward_data
        torch_on = lambda y, dy: fn(dy, y, -1, dtype)  # noqa: E731

        def fresh():
            xc = torch.randn_like(x)
            return _torch_fwd(op)(xc), torch.randn_like(xc)
        inputs = fresh()
    dst = torch.empty_like(x)
    copy_bytes = 2 * x.numel() * itemsize
    calls = {"ours": lambda: ours_on(*inputs), "torch": lambda: torch_on(*inputs), "copy": lambda: dst.copy_(x)}
    what = f"{op} {direction} {dname} N=2^{n.bit_length() - 1}"
    warmup_s = {name: common.warm_up(fn, f"{name} {what}") for name, fn in calls.items()}
    # Checked on inputs no earlier call saw: an output left in a reused block cannot pass for one.
    check_inputs = fresh()
    ours_err = check_error(ours_on(*check_inputs), op, direction, check_inputs)
    torch_err = check_error(torch_on(*check_inputs), op, direction, check_inputs)
    del check_inputs
    tol = CHECK_TOLERANCE.get(dtype, 1e-2)
    wrong = not ours_err <= tol  # NaN too
    if wrong:
        del calls["ours"]  # a wrong result gets no speed
    times, orders = common.in_rounds(calls, rounds, lambda name: common.time_ms(calls[name]))
    t_torch, t_copy = _median(times["torch"]), _median(times["copy"])
    copy_gbps = copy_bytes / t_copy * 1e-6
    row = {"op": op, "direction": direction, "dtype": dname, "N": n, "rows": rows,
           "strategy": sm._choose("auto", rows, n, x) if runs_triton(x) else "cpu-twin", "bytes": moved,
           "status": "wrong" if wrong else "ok", "ours_ms": None, "torch_ms": t_torch, "copy_ms": t_copy,
           "ours_gbps": None, "torch_gbps": moved / t_torch * 1e-6, "copy_gbps": copy_gbps,
           "ours_frac_copy": None, "torch_frac_copy": moved / t_torch * 1e-6 / copy_gbps, "speedup": None,
           "check_err": ours_err, "torch_check_err": torch_err, "warmup_s": warmup_s["ours"],
           "rounds_order": orders, **{f"{name}_rounds_ms": times[name] for name in times}}
    if wrong:
        row["note"] = (f"WRONG: not timed (off the float64 reference by {ours_err:.3g} relative to its largest "
                       f"value, tolerance {tol:g})")
    else:
        t_ours = _median(times["ours"])
        row.update(ours_ms=t_ours, ours_gbps=moved / t_ours * 1e-6, ours_frac_copy=moved / t_ours * 1e-6 / copy_gbps,
                   speedup=t_torch / t_ours,
                   rounds_won=sum(a <= b for a, b in zip(times["ours"], times["torch"])))
    return row


def _plot(rows: list[dict], path: Path) -> Path | None:
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
        ax.plot(ns, [r["ours_gbps"] if r["ours_gbps"] is not None else float("nan") for r in sel], "o-",
                label="flashattn_lite")
        ax.plot(ns, [r["torch_gbps"] for r in sel], "s--", label="torch")
        ax.plot(ns, [r["copy_gbps"] for r in sel], ":", color="gray", label="device copy (same bytes)")
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
    dtypes, directions, exps, total, rounds = _resolve(args, device)
    out = getattr(args, "out", None) or "benchmarks/results"
    meta = dict(total_bytes=total, rounds=rounds,
                timing="ours, torch and the device copy of x (copy_gbps: the ceiling) warmed up, one untimed "
                       "round, then rounds in common.balanced_rounds orders; medians",
                check="against torch's op in float64 on fresh inputs, max |error| / max |reference|; ours past "
                      + ", ".join(f"{str(k).replace('torch.', '')} {v:g}" for k, v in CHECK_TOLERANCE.items())
                      + " is wrong (not timed)")
    writer = common.ResultWriter(out, f"{args.op}_bandwidth", meta=meta, budget_s=args.time_budget,
                                 columns=["direction", "dtype", "N", "strategy", "status", "ours_gbps", "torch_gbps",
                                          "copy_gbps", "ours_frac_copy", "speedup", "note"])
    with writer:
        for dtype_name in dtypes:
            for direction in directions:
                for k in exps:
                    if not writer.start(direction=direction, dtype=dtype_name, N=2 ** k):
                        continue
                    writer.add(_measure(args.op, direction, _DTYPES[dtype_name], 2 ** k, total, device, rounds))
    rows = writer.rows
    print(common.format_table(rows, ["direction", "dtype", "N", "rows", "strategy", "status", "ours_gbps",
                                     "torch_gbps", "copy_gbps", "ours_frac_copy", "torch_frac_copy", "speedup"]))
    wrong = [r for r in rows if r["status"] == "wrong"]
    if wrong:
        print(f"\nWRONG (not timed): {len(wrong)} point(s) off the float64 reference: "
              + ", ".join(f"{r['direction']} {r['dtype']} N={r['N']}" for r in wrong))
    paths = writer.finish()
    if not args.no_plot and rows:
        plot = _plot(rows, writer.path(".png"))
        paths += [plot] if plot else []
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


__all__ = ["add_arguments", "run"]
