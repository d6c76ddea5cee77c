"""Pieces every benchmark shares: timing, the environment record, result files."""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import os
import math
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
import triton


_FLUSH_BYTES = 256 * 2 ** 20     # several times any L2 this package targets (H100: 50 MB)
_flush_buffer: torch.Tensor | None = None


def _flush_l2(dirty: bool) -> None:
    """Evict the L2 cache before a timed run. ``dirty=False`` reads a large buffer: the L2 is left
    full of clean lines, so the timed kernel pays only for its own traffic (what it meets after the
    weight-reading kernels of a model step). ``dirty=True`` writes the buffer, as
    ``triton.testing.do_bench`` does: the timed kernel then also pays for writing back the dirty
    lines it evicts (measured on the H100: 11–18% slower decode at 32k keys, 7–11% at 4k)."""
    global _flush_buffer
    if _flush_buffer is None or _flush_buffer.device != torch.device("cuda", torch.cuda.current_device()):
        _flush_buffer = torch.ones(_FLUSH_BYTES // 4, device="cuda", dtype=torch.int32)
        _flush_buffer.amax()  # the fill's dirty lines are evicted (written back) here, untimed
    if dirty:
        _flush_buffer.fill_(1)
    else:
        _flush_buffer.amax()


def time_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100, l2: str = "clean") -> float:
    """Median time of ``fn`` in milliseconds: device events on CUDA, a host clock on CPU.

    On CUDA every timed run starts with a cold L2 (``l2="clean"``: evicted by a read, the default;
    ``l2="dirty"``: by a write, triton.testing.do_bench's method, kept to compare with numbers taken
    that way). Events bracket ``fn`` alone; the flush also gives the host a head start, so host
    overhead shorter than the flush (~0.1 ms) is hidden, as do_bench hides it."""
    if l2 not in ("clean", "dirty"):
        raise ValueError(f"l2 must be 'clean' or 'dirty', got {l2!r}")
    if torch.cuda.is_available():
        dirty = l2 == "dirty"
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 5, 1e-3)
        for _ in range(max(1, int(warmup_ms / estimate))):
            fn()
        n = min(max(1, int(rep_ms / estimate)), 2000)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            _flush_l2(dirty)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        return times[len(times) // 2]
    fn()
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 50:
            break
    times.sort()
    return times[len(times) // 2]


def time_ms_graph(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
                  l2: str = "clean") -> float | None:
    """Median device time of ``fn`` replayed from a CUDA graph, or None where it cannot be captured.

    What a serving engine sees: decode steps run as captured graphs, so the host's launch path
    (Python, argument binding) is not on the timeline and only the kernels' own time counts.
    ``fn`` must have run once already (compiled, autotuned) outside the capture."""
    if not torch.cuda.is_available():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):  # capture-safe warm-up, as torch.cuda.graphs documents
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # a peer that cannot be captured keeps its eager time only
        torch.cuda.synchronize()
        return None
    return time_ms(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms, l2=l2)


H100_L2_BYTES = 50 * 2 ** 20


def host_us(fn: Callable[[], object], calls: int) -> float:
    """µs of wall clock per call of ``calls`` back-to-back calls, synchronised before and after (on
    CUDA): a call's host path where it is longer than its kernels, as a serving loop sees it."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def profile_rows(fn: Callable[[], object], steps: int, top: int = 30) -> list[dict]:
    """cProfile of ``steps`` calls of ``fn``: the ``top`` functions by own time, µs per call
    (``benchmarks/host_breakdown.py``, ``benchmarks/decode_host.py``). cProfile's own cost inflates
    every function alike: read the ranking. From Python 3.12 it sees every thread (sys.monitoring),
    the autograd engine's included; before, only the calling thread."""
    import cProfile
    import pstats
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    prof = cProfile.Profile()
    sync()
    prof.enable()
    for _ in range(steps):
        fn()
    sync()
    prof.disable()
    ranked = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [dict(function=f"{Path(file).name}:{line}({name})", calls_per_step=nc / steps, own_us=tt / steps * 1e6,
                 cum_us=ct / steps * 1e6) for (file, line, name), (cc, nc, tt, ct, _) in ranked]


def kernel_times_us(fn: Callable[[], object], device: torch.device | str = "cuda") -> dict[str, float]:
    """Each kernel's device time (µs) over one call of ``fn``, after one warm call (torch.profiler),
    costliest first: where a call's time goes, kernel by kernel (launch gaps are not in it). Off
    the GPU, each op's CPU time."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        sync()
    times = {e.key: e.self_device_time_total if cuda else e.self_cpu_time_total for e in prof.key_averages()}
    return {k: round(t, 1) for k, t in sorted(times.items(), key=lambda kv: -kv[1]) if t > 0}


def l2_cache_bytes() -> int:
    """The current CUDA device's L2 size in bytes (the H100's without CUDA or where torch does not say)."""
    if torch.cuda.is_available():
        size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        if size:
            return int(size)
    return H100_L2_BYTES


def steady_state_copies(step_bytes: int, *, l2_bytes: int = H100_L2_BYTES, l2_multiple: float = 2.5,
                        min_copies: int = 2, max_copies: int = 64) -> int:
    """How many steps ``time_ms_graph_steady`` should capture: enough that the steps together touch
    ``l2_multiple`` × the L2 (no step finds another's data there, even without a flush), at least
    ``min_copies`` (which also divides the per-replay launch and event cost among the steps), at most
    ``max_copies``. The caller lowers it further when memory is short."""
    if step_bytes <= 0:
        raise ValueError(f"step_bytes must be positive, got {step_bytes}")
    if not 1 <= min_copies <= max_copies:
        raise ValueError(f"expected 1 <= min_copies <= max_copies, got {min_copies}, {max_copies}")
    return max(min_copies, min(max_copies, math.ceil(l2_multiple * l2_bytes / step_bytes)))


def time_ms_graph_steady(make_step: Callable[[int], Callable[[], object]], copies: int, *, warmup_ms: float = 25,
                         rep_ms: float = 100, l2: str = "clean") -> float | None:
    """Device time per step of ``copies`` steps captured back to back in ONE CUDA graph, or None
    without CUDA or where the steps cannot be captured.

    ``make_step(i)`` returns step i, which must work on its own inputs (step i's KV cache distinct
    from step j's), so each step reads its bytes from DRAM as consecutive decode steps (layers) of a
    serving loop do. Whole-graph replays are timed as ``time_ms_graph`` times one step (cold L2
    before each, median over replays) and divided by ``copies``: the per-replay launch and event
    cost is spread over the steps, while the gaps between the steps' kernels count, as in a serving
    engine's graph. Each step is warmed up once on a side stream before the capture."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    if not torch.cuda.is_available():
        return None
    steps = [make_step(i) for i in range(copies)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):  # capture-safe warm-up, as torch.cuda.graphs documents
            for step in steps:
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for step in steps:
                step()
    except Exception:  # a peer that cannot be captured has no steady-state time
        torch.cuda.synchronize()
        return None
    return time_ms(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms, l2=l2) / copies


def environment() -> dict:
    """What a reader needs to reproduce a number: device, driver and library versions (cuDNN's too:
    the SDPA peer's speed moves with it), the package's version and commit, the ``FLASHATTN_LITE_*``
    settings, the GPU's clock and power state at the start, date."""
    from .. import __version__
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "flashattn_lite": __version__,
        "commit": _commit(),
        "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLASHATTN_LITE_")},
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2 ** 30, 1), driver=_nvidia_smi("driver_version"),
                   gpu_state=gpu_state())
    else:
        env.update(gpu=None, cpu_count=os.cpu_count())
    return env


def _commit() -> str | None:
    """The package checkout's git commit (``+dirty`` with uncommitted changes), or None (installed
    from a wheel, or no git)."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        run = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=10)
        head = run("rev-parse", "HEAD")
        if head.returncode:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi(field: str) -> str | None:
    import shutil
    import subprocess
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--id={torch.cuda.current_device()}", f"--query-gpu={field}",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def resolve_device(device: str) -> str:
    """``--device`` as given ("auto", "cuda", "cpu") to the device a sweep runs on."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchArgumentError("--device cuda: no CUDA device is available")
    return device


class BenchArgumentError(ValueError):
    """A benchmark option that is invalid (alone or with the others); the CLI reports it as a usage
    error (exit status 2) instead of a traceback."""


def parse_size(text: str) -> int:
    """A token count such as 4096, 4k, 512K, 1M (k = 1024, M = 1024²); argparse ``type=``."""
    t = str(text).strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    elif t.endswith("m"):
        mult, t = 1024 ** 2, t[:-1]
    try:
        value = int(t) * mult
    except ValueError:
        raise ValueError(f"expected a count like 4096, 64k or 1M, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"expected a positive count, got {text!r}")
    return value


def size_list(text: str) -> list[int]:
    """Comma-separated token counts such as 2k,8k,16k (``parse_size`` each; at least one); argparse ``type=``."""
    sizes = [parse_size(t) for t in str(text).split(",") if t.strip()]
    if not sizes:
        raise ValueError(f"expected comma-separated lengths such as 2k,8k, got {text!r}")
    return sizes


def gpu_script_args(doc: str, out: str | os.PathLike, add_arguments: Callable, argv=None) -> argparse.Namespace:
    """The command line of a GPU benchmark script: ``--out`` (default ``out``), ``--rounds`` (>= 1,
    default 5), what ``add_arguments(parser)`` adds; a usage error without a CUDA device, before any
    GPU work."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=str(out))
    ap.add_argument("--rounds", type=round_count, default=5, help="rounds per point (>= 1)")
    add_arguments(ap)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    return args


def format_size(n: int) -> str:
    """1024 → '1k', 524288 → '512k', 1048576 → '1M'; other numbers as they are."""
    if n >= 1024 ** 2 and n % 1024 ** 2 == 0:
        return f"{n // 1024 ** 2}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def result_stem(out: str | os.PathLike, name: str) -> Path:
    """``out/name-YYYYmmdd-HHMMSS``: the JSON, CSV and PNG of one run share it."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}-{stamp}"


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a reader (or a
    run killed mid-write) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_csv(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Rows as CSV, one column per key seen in any row (first-seen order)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns)
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k) for k in columns})
    return write_text_atomic(path, buf.getvalue())


class Progress:
    """A progress bar on stderr when it is a terminal and tqdm is installed (nothing otherwise: the
    result lines on stdout show the progress); ``write`` prints a line on stdout without tearing it."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self._bar = None
        if not enabled or not sys.stderr.isatty():
            return
        try:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc=desc, unit="pt", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            pass

    def write(self, line: str) -> None:
        if self._bar is None:
            print(line, flush=True)
        else:
            self._bar.write(line, file=sys.stdout)
            sys.stdout.flush()

    def update(self, note: str = "") -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (benchmarks run on headless machines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def doubling(lo: int, hi: int) -> list[int]:
    """lo, 2·lo, 4·lo, … up to hi inclusive."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def split_list(text: str, allowed: Iterable[str], what: str) -> list[str]:
    """A comma-separated choice list, validated against ``allowed`` (order kept, duplicates dropped)."""
    allowed = list(allowed)
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise ValueError(f"{what}: expected a comma-separated list from {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(items))


def write_json(path: str | os.PathLike, name: str, rows: list[dict], **meta) -> Path:
    """Write ``{"benchmark", "environment", **meta, "results"}`` to path (a file or a folder)."""
    path = Path(path)
    if path.suffix != ".json":
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = path / f"{name}-{stamp}.json"
    doc = {"benchmark": name, "environment": meta.pop("environment", None) or environment(), **meta, "results": rows}
    return write_text_atomic(path, json.dumps(doc, indent=1, default=str))


def format_value(v) -> str:
    """A table cell: floats to 3 significant figures, None as nothing."""
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table of ``columns`` from ``rows`` (floats to 3 significant figures)."""
    cells = [[format_value(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


# ------------------------------------------------------------------ runs that may be cut off

def add_run_arguments(p) -> None:
    """The options every benchmark shares: ``--quick`` and ``--time-budget``."""
    p.add_argument("--quick", action="store_true",
                   help="a small preset answering the key questions in about two minutes on an H100 "
                        "(options given explicitly still win)")
    p.add_argument("--time-budget", type=seconds, default=None, metavar="SECONDS",
                   help="start no new point after SECONDS (the point running then finishes); the points "
                        "not started are listed under 'skipped' in the JSON (default: no limit)")


def add_value_dim_argument(group, head_dims: str, counts: str) -> None:
    """``--value-dim DV``, as the attention benchmarks share it: v's head dim beside q's and k's
    (``head_dims``: their option's name), ``counts`` saying what DV changes in that benchmark."""
    group.add_argument("--value-dim", type=int, metavar="DV",
                       help=f"v's head dimension where it is not q's and k's (e.g. 128 with {head_dims} 192: "
                            f"MLA); {counts}")


def value_dim(args) -> int | None:
    """``--value-dim`` checked: None (not given, or args built without it) or an integer in [1, 256]."""
    value = getattr(args, "value_dim", None)
    if value is not None and not 1 <= value <= 256:
        raise BenchArgumentError(f"--value-dim must be an integer in [1, 256], got {value}")
    return value


def round_count(text: str) -> int:
    """argparse type of a ``--rounds`` option: an int >= 1 (a usage error naming the option otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def settings(args, defaults: dict, quick: dict) -> dict:
    """Each option's value: as given on the command line, else the ``--quick`` preset's (with
    ``--quick``), else the default. Options that are not given are ``None`` in ``args``."""
    base = {**defaults, **(quick if getattr(args, "quick", False) else {})}
    return {k: getattr(args, k) if getattr(args, k, None) is not None else v for k, v in base.items()}


# The largest error a benchmarked method's output may have against float64, relative to the
# reference's largest value: a few units of the dtype's rounding, where every fused kernel lands; a
# wrong path (a tile, a split, a write missed) is O(1) off. Past it a point is "wrong", not timed.
CHECK_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-2}


def relative_error(got, ref) -> float:
    """The largest of max|x − r| / max|r| over the pairs of tensors: how the benchmarks check a
    method's outputs against float64 (``CHECK_TOLERANCE``); NaN where an output has a NaN the
    reference does not. Callers test ``not err <= tolerance``, which a NaN fails."""
    err = 0.0
    for x, r in zip(got, ref):
        e = ((x.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        if math.isnan(e):  # (max() would keep the earlier value: a NaN output must fail the check)
            return math.nan
        err = max(err, e)
    return err


def balanced_rounds(keys, rounds: int) -> list[list]:
    """The order of each of ``rounds`` rounds that time every key once: the rows of a Williams
    design: over one design (``len(keys)`` rows, twice that for an odd count, whose rows come with
    their reverses) every key runs first equally often and follows every other key equally often. So no
    key always follows the same one (a power-hungry case leaves the clock low for the next for a
    while), and a drift of the card's clocks over the run moves every key alike. Past one design the
    rows repeat."""
    keys = list(keys)
    n = len(keys)
    if not n:
        return []
    base = [0]  # 0, 1, n − 1, 2, n − 2, …: consecutive differences all distinct mod n
    for i in range(1, n):
        base.append((i + 1) // 2 if i % 2 else n - i // 2)
    rows = [[keys[(b + r) % n] for b in base] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [rows[r % len(rows)] for r in range(rounds)]


def in_rounds(keys, rounds: int, measure, *, untimed: bool = True, failed: dict | None = None,
              after_round=None) -> tuple[dict, list]:
    """({key: each timed round's measure(key)}, each timed round's order): every key measured once a
    round, ``rounds`` rounds in the orders of ``balanced_rounds``, after one ``untimed`` round in the
    first round's order whose values are dropped (no key gets the first run after the builds' or
    compiles' idle: that run read ~3.5% fast). ``failed``: a key whose measure raises is recorded
    there ({key: exception}) and left out of the later rounds (without it, the exception propagates).
    ``after_round(label)``: called after each round ("untimed round", "round 1/R", …)."""
    keys = list(keys)
    orders = balanced_rounds(keys, rounds)
    times: dict = {key: [] for key in keys}
    for r, order in enumerate(orders[:1] + orders if untimed else orders):
        for key in order:
            if failed is not None and key in failed:
                continue
            try:
                value = measure(key)
            except Exception as exc:
                if failed is None:
                    raise
                failed[key] = exc
                continue
            if r or not untimed:
                times[key].append(value)
        if after_round is not None:
            after_round("untimed round" if untimed and r == 0 else f"round {r + (not untimed)}/{rounds}")
    return times, orders


def gpu_state() -> str | None:
    """The GPU's SM clock, power draw, temperature and active clock-throttle reasons (nvidia-smi),
    or None where there is no nvidia-smi: printed between a benchmark's rounds, so a slower round
    can be told apart from a slower kernel."""
    if not torch.cuda.is_available():
        return None
    return _nvidia_smi("clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active")


SLOW_WARMUP_S = 2.0


def warm_up(fn: Callable[[], object], what: str) -> float:
    """Call ``fn`` once, outside any measurement (Triton compiles and autotunes on the first call at
    a new shape family, libraries build plans); say so when it took long. Returns the seconds."""
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if seconds > SLOW_WARMUP_S:
        print(f"  (warm-up {what}: {seconds:.1f} s, compiling / autotuning)", flush=True)
    return seconds


def recorded_command(argv: list[str], out) -> str:
    """The command line as results record it: the output folder written as $OUT (it is a path of
    the machine that ran it, which says nothing to a reader and should not end up in the repo), the
    package's console entry (``python -m flashattn_lite`` or ``flashattn-lite``, whose argv[0]
    is an absolute path) as ``flashattn-lite``, and any other absolute script path (torchrun
    passes one) relative to the working folder."""
    out_s = str(out)
    argv = list(argv)
    entry = Path(argv[0]) if argv else Path()
    if entry.name == "flashattn-lite" or (entry.name == "__main__.py" and entry.parent.name == "flashattn_lite"):
        argv[0] = "flashattn-lite"
    elif entry.is_absolute():  # a script torchrun started: its path from the working folder, else its name
        argv[0] = entry.relative_to(Path.cwd()).as_posix() if entry.is_relative_to(Path.cwd()) else entry.name
    return " ".join("$OUT" if a == out_s else "--out=$OUT" if a.startswith("--out=") else a for a in argv)


class ResultWriter:
    """A sweep's results as they come. Each point is printed as one line the moment it is measured,
    and ``<stem>.json`` + ``<stem>.csv`` are rewritten after every point (atomically), so a run that
    is killed leaves every finished point on stdout and on disk (``"complete": false`` until
    ``finish``). It also keeps the time budget: past it, ``start`` says no and records the point as
    skipped.

        writer = ResultWriter(out, "memory", columns=[...], meta={...}, budget_s=args.time_budget)
        with writer:                      # an exception still leaves the files, marked incomplete
            for point in grid:
                if writer.start(**point):
                    writer.add(measure(point))
        writer.finish(summary=...)        # the final files
    """

    def __init__(self, out: str | os.PathLike, name: str, *, columns: list[str], meta: dict | None = None,
                 budget_s: float | None = None, total: int = 0, progress: bool = False):
        out = Path(out)
        self.stem = out.with_suffix("") if out.suffix == ".json" else result_stem(out, name)
        self.name, self.columns, self.budget_s = name, columns, budget_s
        self.meta = dict(meta or {}, command=recorded_command(sys.argv, out), time_budget_s=budget_s)
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self._env = environment()
        self._t0 = time.perf_counter()
        self._bar = Progress(total, name, enabled=progress)
        self.save()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def time_left(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed()

    def start(self, **point) -> bool:
        """Whether to start this point; past the time budget it is recorded under 'skipped' instead."""
        if self.time_left() > 0:
            return True
        if not self.skipped:
            self._bar.write(f"[{self.name} {self.elapsed():.0f}s] time budget of {self.budget_s:g} s spent: "
                            "starting no more points")
        self.skipped.append(point)
        self._bar.update("skipped (time budget)")
        return False

    def add(self, row: dict) -> None:
        """Record a measured point: one line on stdout, the files rewritten."""
        self.rows.append(row)
        fields = "  ".join(f"{c}={format_value(row[c])}" for c in self.columns if row.get(c) not in (None, ""))
        self._bar.write(f"[{self.name} {self.elapsed():.0f}s] {fields}")
        self._bar.update(fields[:60])
        self.save()

    def save(self, complete: bool = False, **meta) -> list[Path]:
        self.meta.update(meta)
        json_path = write_json(self.path(".json"), self.name, self.rows, environment=self._env, **self.meta,
                               complete=complete, elapsed_s=round(self.elapsed(), 1), skipped=self.skipped)
        return [json_path, write_csv(self.path(".csv"), self.rows)]

    def finish(self, **meta) -> list[Path]:
        """The final files (with ``meta``, e.g. a summary); returns their paths."""
        self._bar.close()
        if self.skipped:
            print(f"\n{len(self.skipped)} point(s) not started: the time budget of {self.budget_s:g} s was spent "
                  f"(listed under 'skipped' in the JSON)", flush=True)
        return self.save(complete=True, **meta)

    def path(self, suffix: str) -> Path:
        """A sibling file of the results, e.g. ``path('.png')``."""
        return self.stem.with_name(self.stem.name + suffix)

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self._bar.close()
            self.save(stopped_by=exc_type.__name__)
        return False


def device_copy_bandwidth(nbytes: int = 2 ** 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)
