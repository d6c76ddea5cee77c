"""The user's tuning cache: winners of ``FLASHATTN_LITE_AUTOTUNE=1`` kept on disk across processes.

One JSON file per machine setup — GPU name, driver, torch and triton versions, hashed into the
file name — under ``$FLASHATTN_LITE_CACHE_DIR`` (default ``~/.cache/flashattn_lite``). Each entry
also carries the kernel's source hash, so an edited kernel never reuses an old winner. Writes
merge with what is on disk and replace the file atomically (several processes may tune at once).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading

_lock = threading.Lock()


def cache_dir() -> str:
    return os.environ.get("FLASHATTN_LITE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                      "flashattn_lite")


@functools.lru_cache(maxsize=None)
def environment(device_index: int) -> dict:
    """What a timing depends on besides the kernel: the GPU, its driver, torch and triton."""
    import torch
    import triton
    return {"gpu": torch.cuda.get_device_name(device_index), "driver": _driver_version(),
            "torch": torch.__version__, "triton": triton.__version__}


def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip()
    except OSError:
        return "unknown"


def cache_path(env: dict) -> str:
    digest = hashlib.sha1(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"tuning-{digest}.json")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data.get("entries", {}) if isinstance(data, dict) else {}


def load(env: dict, kernel: str, source_hash: str) -> dict:
    """{key string: config dict} of ``kernel`` at this source hash."""
    entries = _read(cache_path(env)).get(kernel, {})
    return entries.get("configs", {}) if entries.get("source") == source_hash else {}


def store(env: dict, kernel: str, source_hash: str, key: str, config: dict) -> None:
    path = cache_path(env)
    with _lock:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        entries = _read(path)
        mine = entries.get(kernel, {})
        if mine.get("source") != source_hash:
            mine = {"source": source_hash, "configs": {}}
        mine["configs"][key] = config
        entries[kernel] = mine
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"environment": env, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
