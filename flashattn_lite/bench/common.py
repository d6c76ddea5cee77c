"""Pieces every benchmark shares: timing, the environment record, result files."""
from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Callable, Iterable

import torch
import triton


def time_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn`` in milliseconds: device events on CUDA, a host clock on CPU."""
    if torch.cuda.is_available():
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    import time
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


def environment() -> dict:
    """What a reader needs to reproduce a number: device, versions, date."""
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2 ** 30, 1))
    else:
        env.update(gpu=None, cpu_count=os.cpu_count())
    return env


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


def write_csv(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Rows as CSV, one column per key seen in any row (first-seen order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in columns})
    return path


class _TextProgress:
    """What the progress bar falls back to without tqdm: one line per step on stderr."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n = total, desc, 0

    def update(self, n: int = 1, note: str = "") -> None:
        self.n += n
        print(f"[{self.desc} {self.n}/{self.total}] {note}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class Progress:
    """A progress bar on stderr (tqdm when installed), so stdout carries only the results."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self._bar = None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc=desc, unit="pt", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self._bar = _TextProgress(total, desc)

    def update(self, note: str = "") -> None:
        if self._bar is None:
            return
        if isinstance(self._bar, _TextProgress):
            self._bar.update(1, note)
        else:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": name, "environment": environment(), **meta, "results": rows},
                               indent=1, default=str))
    return path


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table of ``columns`` from ``rows`` (floats to 3 significant figures)."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return "" if v is None else str(v)
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def device_copy_bandwidth(nbytes: int = 2 ** 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)
