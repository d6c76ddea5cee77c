"""``flashattn-lite``: the package's benchmarks on the command line (also ``python -m flashattn_lite``).

Each subcommand is a module of ``flashattn_lite.bench`` with ``add_arguments(parser)`` and
``run(args)``; this file only wires them up, so the installed command and ``benchmarks/`` scripts
run the same code.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

DEFAULT_OUT = "flashattn_lite_results"

_COMMANDS = {
    "memory": ("flashattn_lite.bench.memory",
               "peak memory above the inputs vs sequence length, every method",
               "Sweep N (doubling) for naive attention, SDPA math/flash/cuDNN/efficient, FlexAttention and "
               "flashattn_lite, forward and forward+backward. Reports peak memory above the inputs "
               "(torch.cuda.max_memory_allocated on GPU; per-point process peak RSS on CPU) beside each "
               "method's theoretical memory, the time per call, and out-of-memory points. On a CPU-only "
               "machine it runs a small sweep that finishes in about a minute."),
    "speed": ("flashattn_lite.bench.attention",
              "attention TFLOP/s vs sequence length: forward, backward, forward+backward",
              "TFLOP/s of every available method in the same process: 4·B·H·N²·D FLOPs forward (halved "
              "when causal), backward 2.5× and forward+backward 3.5× that; bf16, d = 64 and 128, causal "
              "and not, N from 1k to 16k at B·N = 16k tokens and hidden size 2048."),
    "softmax": ("flashattn_lite.bench.softmax",
                "softmax bandwidth sweep (GB/s)",
                "Achieved memory bandwidth of the softmax kernels against torch."),
    "decode": ("flashattn_lite.bench.decode",
               "split-KV decode attention sweep",
               "Decode (one query token, long KV cache) attention time and bandwidth."),
}
_ALL = ("memory", "speed", "softmax", "decode")


class _MissingBenchmark(Exception):
    pass


def _load(name: str):
    module, _, _ = _COMMANDS[name]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise _MissingBenchmark(f"the '{name}' benchmark ({module}) is not part of this installation yet") from None
        raise


def _add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"folder for the JSON, CSV and PNG results (default: ./{DEFAULT_OUT}/)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashattn-lite",
        description="Benchmarks of flashattn_lite against PyTorch's attention backends and FlexAttention. "
                    "Every subcommand prints each point as one line the moment it is measured and rewrites its "
                    "JSON and CSV (with the environment: GPU, versions, date) after every point, so a run that is "
                    "cut off keeps what it measured; at the end it prints a table and writes PNG plots under --out. "
                    "Every subcommand takes --quick (a preset of about two minutes on an H100) and "
                    "--time-budget SECONDS (start no new point after that).",
        epilog="Run 'flashattn-lite SUBCOMMAND --help' for a subcommand's options.")
    sub = parser.add_subparsers(dest="command", metavar="{memory,speed,softmax,decode,all}")
    sub.required = True
    for name, (module, short, long) in _COMMANDS.items():
        p = sub.add_parser(name, help=short, description=long)
        _add_out(p)
        try:
            _load(name).add_arguments(p)
        except _MissingBenchmark as e:
            p.description = f"{long} (unavailable: {e})"
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p = sub.add_parser("all", help="memory, speed and softmax with their defaults (and decode on a GPU)",
                       description="Run memory, speed and softmax with their default options (and decode when a "
                                   "GPU is present), each writing its own files under --out.")
    _add_out(p)
    p.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    from .bench.common import add_run_arguments
    add_run_arguments(p)
    p.epilog = ("With 'all', --quick applies to every benchmark and --time-budget is the budget of the whole run: "
                "each benchmark gets what the ones before it left.")
    return parser


def _run_one(name: str, args: argparse.Namespace) -> int:
    try:
        module = _load(name)
    except _MissingBenchmark as e:
        print(f"flashattn-lite {name}: {e}.", file=sys.stderr)
        return 1
    from .bench.common import BenchArgumentError
    try:
        module.run(args)
    except BenchArgumentError as e:
        print(f"flashattn-lite {name}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _defaults_for(name: str, out: str, extra: argparse.Namespace) -> argparse.Namespace:
    """The namespace a subcommand gets with no options on the command line."""
    p = argparse.ArgumentParser()
    _add_out(p)
    _load(name).add_arguments(p)
    ns = p.parse_args([])
    ns.out = out
    for flag in ("no_plot", "no_progress", "quick", "time_budget"):
        if hasattr(ns, flag):
            setattr(ns, flag, getattr(extra, flag))
    return ns


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or DEFAULT_OUT
    if args.command != "all":
        args.out = out
        return _run_one(args.command, args)
    import torch
    names = [n for n in _ALL if n != "decode" or torch.cuda.is_available()]
    deadline = None if args.time_budget is None else time.monotonic() + args.time_budget
    status = 0
    for name in names:
        print(f"\n===== flashattn-lite {name} =====", flush=True)
        if deadline is not None:
            args.time_budget = max(0.0, deadline - time.monotonic())
        try:
            ns = _defaults_for(name, out, args)
        except _MissingBenchmark as e:
            print(f"skipped: {e}.", file=sys.stderr)
            continue
        status = max(status, _run_one(name, ns))
    return status


def run_script(command: str, default_out) -> int:
    """Entry point of the thin scripts in ``benchmarks/``: ``command`` with the script's arguments,
    results in ``default_out`` unless ``--out`` is given."""
    argv = sys.argv[1:]
    if "--out" not in argv and not any(a.startswith("--out=") for a in argv):
        argv += ["--out", str(default_out)]
    return main([command, *argv])


if __name__ == "__main__":
    sys.exit(main())
