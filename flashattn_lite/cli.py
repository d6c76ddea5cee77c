"""``flashattn-lite``: the package's benchmarks and tools on the command line (also ``python -m flashattn_lite``).

Each subcommand is a module with ``add_arguments(parser)`` and ``run(args)``: benchmarks
(``_COMMANDS``, modules of ``flashattn_lite.bench``, each writing results under ``--out DIR``) and
tools (``_TOOLS``, which take their own options). This file only wires them up, so the installed
command and ``benchmarks/`` scripts run the same code. A new subcommand is one entry in either table.
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
               "machine it runs a small sweep (about 1-2 minutes on 2 cores) in which 'ours' is the PyTorch "
               "twin, not the Triton kernels: the GPU numbers are the ones to report."),
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
    "variants": ("flashattn_lite.bench.variants",
                 "cost of the attention variants: sliding window, softcap / sinks / ALiBi, varlen batches",
                 "Causal attention at N = 32k with a 4k sliding window against full causal (and FlexAttention's "
                 "block mask), softcap, sinks and ALiBi against plain attention at 8k, and a packed varlen batch "
                 "of mixed lengths against the dense kernel on the same tokens: ms, TFLOP/s on the pairs "
                 "computed, speed-up or cost, forward and forward+backward."),
    "ring": ("flashattn_lite.bench.ring",
             "ring attention over the GPUs of a torchrun launch vs one GPU",
             "Ring (context-parallel) attention forward+backward over the W processes of a torchrun launch "
             "('torchrun --nproc-per-node 2 -m flashattn_lite ring'): tokens/s and scaling efficiency against one "
             "GPU at the same per-GPU length, one GPU on the whole sequence, and how much of the communication "
             "hides under compute. --backend gloo runs a CPU smoke test in seconds."),
    "first-call": ("flashattn_lite.bench.first_call",
                   "first-call cost (cold / warm Triton cache, new length) and eager decode per call",
                   "Each first call in a fresh process: attention forward and backward with an empty Triton "
                   "cache, with a warm one, then at a new length; eager decode per call against SDPA flash and "
                   "cuDNN. Needs a GPU."),
}
# Tools: no results folder; the module adds every option it takes.
_TOOLS = {
    "warmup": ("flashattn_lite.warmup",
               "compile the kernels a model needs ahead of its first step",
               "Compile (or load from Triton's cache) the attention kernels for the given head dims, dtypes, GQA "
               "groups and causal settings, or for a HuggingFace model's config (--model NAME, needs "
               "transformers)."),
    "tune": ("flashattn_lite.configs.tune",
             "time every config on a grid of shapes and write the config table",
             "Autotune the kernels on a grid of shapes (FLASHATTN_LITE_AUTOTUNE=1 against a fresh tuning cache) "
             "and write the winners as this GPU architecture's config table (--out table.json, or a .py module "
             "like flashattn_lite/configs/sm90.py). Needs a GPU."),
}
_ALL = ("memory", "speed", "softmax", "decode")


class _MissingBenchmark(Exception):
    pass


def _load(name: str):
    module, _, _ = _COMMANDS[name] if name in _COMMANDS else _TOOLS[name]
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
        description="Benchmarks of flashattn_lite against PyTorch's attention backends and FlexAttention, and "
                    "two tools: warmup (compile kernels ahead of time) and tune (write a config table). "
                    "Every benchmark prints each point as one line the moment it is measured and rewrites its "
                    "JSON and CSV (with the environment: GPU, versions, date) after every point, so a run that is "
                    "cut off keeps what it measured; at the end it prints a table and writes PNG plots under --out. "
                    "Every benchmark takes --quick (a preset of about two minutes on an H100) and "
                    "--time-budget SECONDS (start no new point after that); tune has its own --quick and "
                    "--time-budget, warmup neither.",
        epilog="Run 'flashattn-lite SUBCOMMAND --help' for a subcommand's options.")
    names = [*_COMMANDS, "all", *_TOOLS]
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}")
    sub.required = True
    for name, (module, short, long) in {**_COMMANDS, **_TOOLS}.items():
        p = sub.add_parser(name, help=short, description=long)
        if name in _COMMANDS:
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
    if args.command in _TOOLS:
        return _run_one(args.command, args)
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
