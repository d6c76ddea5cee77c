"""Pieces every benchmark shares: timing, the environment record, result files."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Callable

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
