"""``flashattn-lite tune``: regenerate a GPU architecture's config table from measurements.

Runs the ops on a grid of shapes with ``FLASHATTN_LITE_AUTOTUNE=1`` against a fresh tuning cache
(a temporary folder, or ``--cache-dir``; every kernel times the configs its prune function keeps, per tuning key), then writes each
kernel's winners as table rows: JSON (try it with ``FLASHATTN_LITE_CONFIG_TABLE=table.json``) or,
for an ``--out`` ending in ``.py``, a module to ship as ``flashattn_lite/configs/<arch>.py``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import pprint
import tempfile
import time

import torch

from . import arch_of, config_to_dict

DEFAULTS = dict(head_dims=[64, 128], dtypes=["bf16", "fp16"], lengths=[1024, 4096, 16384])
QUICK = dict(head_dims=[128], dtypes=["bf16"], lengths=[4096])
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DECODE = [(1, 4096), (1, 32768), (1, 131072), (8, 32768)]  # (batch, cache length): Hq 32, Hkv 8
SOFTMAX_N = [1024, 2048, 4096, 8192, 16384]
OPS = ("attention", "decode", "softmax", "variants")
VARIANT_WINDOW = 4096  # keys of the sliding window tuned (W − 1 to the left, causal), as ``variants`` measures


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="FILE", help="the table to write (.json or .py)")
    parser.add_argument("--head-dims", default=None, metavar="D,...", help="attention head dims (default 64,128)")
    parser.add_argument("--dtypes", default=None, metavar="DTYPE,...",
                        help="from bf16, fp16, fp32 (default bf16,fp16); softmax tunes fp32 too, always "
                             "(logits are often float32)")
    parser.add_argument("--lengths", default=None, metavar="N,...",
                        help="attention lengths, B·N = 16k tokens (default 1024,4096,16384)")
    parser.add_argument("--ops", default="attention,decode,softmax", metavar="OP,...",
                        help="from attention, decode, softmax, variants (default: the first three; variants "
                             "tunes causal attention with each of softcap, ALiBi, sinks, all three, and a "
                             f"{VARIANT_WINDOW}-key window, at the attention grid's head dims, dtypes, lengths "
                             "and --gqa ratios)")
    parser.add_argument("--gqa", default="1", metavar="RATIO,...",
                        help="Hq/Hkv ratios the attention and variants grids are tuned at (default 1: no GQA; "
                             "e.g. 1,4,8 for Llama-style models), one after another: 2048/d query heads and "
                             "2048/d/RATIO KV heads, a ratio that does not divide the query heads skipped with a "
                             "note. The portable backward kernels' configs are keyed by the ratio (GROUP): a "
                             "backward at a ratio the table lacks takes the first config that fits; the "
                             "forward's are not (its rows are timed at the first ratio given). Decode keeps its "
                             "own grid (Hq 32, Hkv 8)")
    parser.add_argument("--quick", action="store_true",
                        help="the attention and variants grids at d 128, bf16, N 4096 only (decode and softmax "
                             "keep their fixed grids)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="tune into this tuning cache (kept: FLASHATTN_LITE_AUTOTUNE=1 with "
                             "FLASHATTN_LITE_CACHE_DIR=DIR reuses it) instead of a temporary one")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no new shape after SECONDS; the table holds what was tuned")


def run(args) -> dict:
    from ..bench.common import BenchArgumentError
    if not args.out.endswith((".json", ".py")):
        raise BenchArgumentError(f"--out must end in .json or .py, got {args.out!r}")
    ops = [o for o in args.ops.split(",") if o]
    if not ops or set(ops) - set(OPS):
        raise BenchArgumentError(f"--ops: expected names from {', '.join(OPS)}, got {args.ops!r}")
    base = {**DEFAULTS, **(QUICK if args.quick else {})}
    try:
        head_dims = [int(x) for x in args.head_dims.split(",")] if args.head_dims else base["head_dims"]
        lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else base["lengths"]
        dtypes = [_DTYPES[x] for x in (args.dtypes.split(",") if args.dtypes else base["dtypes"])]
    except (ValueError, KeyError) as e:
        raise BenchArgumentError(f"--head-dims/--lengths take ints, --dtypes names from bf16, fp16, fp32: {e}") from None
    gqa = gqa_ratios(args.gqa)
    if gqa != [1] and not {"attention", "variants"} & set(ops):  # (not applied: refused, not ignored)
        raise BenchArgumentError(f"--gqa applies to the attention and variants grids; --ops is {args.ops!r}")
    if args.cache_dir is not None and (not args.cache_dir or os.path.isfile(args.cache_dir)):
        raise BenchArgumentError(f"--cache-dir must be a folder (new or existing), got {args.cache_dir!r}")
    if not torch.cuda.is_available():
        raise BenchArgumentError("tune times kernels on the GPU: no CUDA device is available")
    deadline = None if args.time_budget is None else time.monotonic() + args.time_budget
    with tempfile.TemporaryDirectory() as tmp, \
            _env(FLASHATTN_LITE_AUTOTUNE="1", FLASHATTN_LITE_CACHE_DIR=args.cache_dir or tmp):
        for label, step in _grid(ops, head_dims, dtypes, lengths, gqa):
            if deadline is not None and time.monotonic() > deadline:
                print(f"time budget spent: not tuned {label}", flush=True)
                continue
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            print(f"tuned {label} ({time.perf_counter() - t0:.1f} s)", flush=True)
            # rewritten after every shape, so a run cut short by its caller keeps what it tuned
            table = table_of_tuned(arch_of(torch.cuda.current_device()))
            _write(args.out, table)
    table = table_of_tuned(arch_of(torch.cuda.current_device()))
    _write(args.out, table)
    print(f"wrote {sum(map(len, table['kernels'].values()))} rows to {args.out}")
    return table


def gqa_ratios(text: str) -> list:
    """``--gqa``'s ratios (Hq/Hkv), in the order given, each once; BenchArgumentError unless ints ≥ 1."""
    from ..bench.common import BenchArgumentError
    try:
        ratios = [int(x) for x in text.split(",")]
    except ValueError:
        ratios = []
    if not ratios or min(ratios) < 1:
        raise BenchArgumentError(f"--gqa takes Hq/Hkv ratios, ints >= 1 (e.g. 1,4,8), got {text!r}")
    return list(dict.fromkeys(ratios))


def tuned_kernels() -> dict:
    """{kernel name: Tuning} of every tuned kernel of the package."""
    from .._launcher import Launcher
    from ..ops import attention_bwd, attention_fwd, decode, softmax
    found = {}
    for module in (attention_fwd, attention_bwd, decode, softmax):
        for value in vars(module).values():
            if isinstance(value, Launcher) and value.tuning is not None:
                found[value.name] = value.tuning
    return found


def table_of_tuned(arch: str) -> dict:
    """The rows every tuned kernel has timed in this process, as a table for ``arch``."""
    import triton
    source = f"flashattn-lite tune on {torch.cuda.get_device_name()}, triton {triton.__version__}, " \
             f"{_dt.date.today().isoformat()}"
    kernels = {}
    for name, tuning in sorted(tuned_kernels().items()):
        rows = [{"key": dict(c.fields), "config": config_to_dict(c.config), "source": source}
                for c in tuning.chosen.values() if c.source.startswith("tuned")]
        if rows:
            kernels[name] = rows
    return {"arch": arch, "kernels": kernels}


def _write(path: str, table: dict) -> None:
    if path.endswith(".json"):
        text = json.dumps(table, indent=1)
    else:
        text = (f'"""Configs for {table["arch"]}: data for ``configs.lookup``, written by flashattn-lite tune."""\n\n'
                f"TABLE = {pprint.pformat(table, width=110, sort_dicts=False)}\n")
    with open(path, "w") as f:
        f.write(text)


class _env:
    """Environment variables set inside a ``with`` block, restored after."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _grid(ops, head_dims, dtypes, lengths, gqa=(1,), dev="cuda"):
    """(label, step) for every shape to tune: the speed benchmark's attention grid (B·N = 16k tokens,
    hidden 2048: 2048/d query heads, 2048/d/r KV heads at each GQA ratio r of ``gqa``, one ratio
    after another in its order, a ratio that does not divide the query heads skipped with a printed
    note), the decode sweep's cases, softmax rows kept on chip. Attention runs the portable kernels
    (the Hopper fast path off): the table serves them; the Hopper kernels take fixed configs.
    ``dev``: where the steps make their tensors (tests run them on CPU with a stand-in attention)."""
    from ..ops.attention import attention
    from ..ops.attention_fwd_hopper import disabled as hopper_disabled
    from ..ops.decode import decode
    from ..ops.softmax import softmax

    def qkv(b, h, h_kv, n, d, dt):
        return (torch.randn(b, heads, n, d, device=dev, dtype=dt, requires_grad=True) for heads in (h, h_kv, h_kv))

    shapes = []  # (ratio, d, query heads, KV heads): every shape of one ratio before the next (a time budget)
    if "attention" in ops or "variants" in ops:
        for r in gqa:
            for d in head_dims:
                h = max(1, 2048 // d)
                if h % r:
                    print(f"--gqa {r}: skipped at d {d} ({h} query heads are not a multiple of {r})", flush=True)
                else:
                    shapes.append((r, d, h, max(1, h // r)))
    if "attention" in ops:
        for r, d, h, h_kv in shapes:
            for dt in dtypes:
                for n in lengths:
                    for causal in (False, True):
                        def step(d=d, h=h, h_kv=h_kv, dt=dt, n=n, causal=causal):
                            q, k, v = qkv(max(1, 16384 // n), h, h_kv, n, d, dt)
                            with hopper_disabled():
                                o = attention(q, k, v, causal=causal)
                                torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
                        yield f"attention d{d} {dt} N{n}{' causal' if causal else ''} gqa{r}", step
    if "variants" in ops:
        for r, d, h, h_kv in shapes:
            for dt in dtypes:
                for n in lengths:
                    for name, options in _variant_options(h, dev):
                        def step(d=d, h=h, h_kv=h_kv, dt=dt, n=n, options=options):
                            q, k, v = qkv(max(1, 16384 // n), h, h_kv, n, d, dt)
                            with hopper_disabled():
                                o = attention(q, k, v, causal=True, **options())
                                torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
                        yield f"attention d{d} {dt} N{n} causal {name} gqa{r}", step
    if "decode" in ops:
        for dt in dtypes:
            for b, n in DECODE:
                def step(dt=dt, b=b, n=n):
                    q = torch.randn(b, 32, 1, 128, device=dev, dtype=dt)
                    k, v = (torch.randn(b, 8, n, 128, device=dev, dtype=dt) for _ in range(2))
                    decode(q, k, v, torch.full((b,), n, device=dev, dtype=torch.int32))
                yield f"decode {dt} B{b} L{n}", step
    if "softmax" in ops:
        for dt in [torch.float32, *[d for d in dtypes if d != torch.float32]]:
            for n in SOFTMAX_N:
                def step(dt=dt, n=n):
                    x = torch.randn(max(1, 2 ** 26 // n), n, device=dev, dtype=dt, requires_grad=True)
                    y = softmax(x)
                    torch.autograd.grad(y, x, torch.ones_like(y))
                yield f"softmax {dt} N{n}", step


def _variant_options(heads: int, dev: str = "cuda"):
    """(name, a function giving ``attention``'s keyword arguments) for each variant tuned: the
    options the variants benchmark measures (softcap 30 as Gemma 2, ALiBi's geometric slopes, sinks
    of a trained gpt-oss's magnitude), with their own tensors per call; ``heads``: query heads."""
    slopes = lambda: 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=dev) / heads)  # noqa: E731
    sinks = lambda: torch.randn(heads, device=dev)  # noqa: E731
    return [("softcap", lambda: dict(softcap=30.0)),
            ("alibi", lambda: dict(alibi_slopes=slopes())),
            ("sinks", lambda: dict(sinks=sinks())),
            ("softcap+alibi+sinks", lambda: dict(softcap=30.0, alibi_slopes=slopes(), sinks=sinks())),
            (f"window {VARIANT_WINDOW}", lambda: dict(window=(VARIANT_WINDOW - 1, 0)))]
