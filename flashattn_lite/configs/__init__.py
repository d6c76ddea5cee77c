"""Kernel configs as data: one table per GPU architecture, looked up by one function.

A table (``configs/sm90.py`` for the H100/H200) maps a kernel's tuning key — the values of the key
arguments its ``tuned(...)`` decorator names (dtype, head dims, causal and option flags, a length
class) — to the config that runs it. Rows are data written by ``flashattn-lite tune`` (or by hand
from recorded measurements), never code. :func:`lookup` answers one question: which row applies
to this call, if any.

Matching rules (the same for every kernel):

- every key field must equal the call's value, except that a field *missing from a row* matches
  only an option that is off (0, False, None): a table written before a kernel gained a flag
  keeps serving the calls that do not use it;
- the length field (``length`` in ``tuned``) picks the row nearest in log2 among rows that agree
  on everything else (exact first; a row without a length serves every length). It only selects
  a row: nothing is timed when a call brings a new length.

Where no row applies, the caller takes the first config its prune function keeps (see
``configs.tuning``). ``FLASHATTN_LITE_CONFIG_TABLE=path.json`` replaces the shipped table of
every architecture (to try a regenerated table without reinstalling).
"""
from __future__ import annotations

import functools
import importlib
import json
import math
import os

_OFF = (0, False, None)


def arch_of(device_index: int) -> str:
    """``"sm90"`` for compute capability 9.0 (H100, H200), ``"sm80"`` for an A100, …"""
    return _arch(device_index)


@functools.lru_cache(maxsize=None)
def _arch(device_index: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm{major}{minor}"


@functools.lru_cache(maxsize=None)
def load_table(arch: str) -> dict:
    """{kernel name: [row, …]} for ``arch`` ({} when none is shipped). A row is
    ``{"key": {field: value}, "config": {...}, "source": "…"}``; see :func:`config_from_dict`."""
    override = os.environ.get("FLASHATTN_LITE_CONFIG_TABLE")
    if override:  # JSON, or the Python module ``flashattn-lite tune`` writes (``TABLE = {…}``)
        if override.endswith(".py"):
            import runpy
            table = runpy.run_path(override)["TABLE"]
        else:
            with open(override) as f:
                table = json.load(f)
        if table.get("arch", arch) != arch:  # another GPU's configs: refused, not served as this one's
            raise ValueError(f"FLASHATTN_LITE_CONFIG_TABLE ({override}) holds the configs of {table['arch']}; "
                             f"this GPU is {arch}")
        return table["kernels"]
    try:
        module = importlib.import_module(f"{__name__}.{arch}")
    except ModuleNotFoundError:
        return {}
    return module.TABLE["kernels"]


def lookup(kernel: str, key: dict, arch: str, length: str | None = None) -> dict | None:
    """The table row of ``arch`` for ``kernel`` at ``key`` ({field: value}, with "dtype"), or None.
    ``length`` names the key's length-class field."""
    best, best_distance = None, math.inf
    for row in load_table(arch).get(kernel, ()):
        fields = row["key"]
        if any(f != length and f not in key for f in fields):
            continue  # a row for a field this kernel no longer has
        if not all(fields[f] == v if f in fields else v in _OFF for f, v in key.items() if f != length):
            continue
        if length is None or length not in fields:
            distance = 1e9 if length is not None else 0  # serves every length, after any row with one
        else:
            distance = abs(math.log2(max(fields[length], 1)) - math.log2(max(key[length], 1)))
        if distance < best_distance:
            best, best_distance = row, distance
    return best


def config_to_dict(config) -> dict:
    """A ``triton.Config`` as table data."""
    d = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages}
    if getattr(config, "maxnreg", None) is not None:
        d["maxnreg"] = config.maxnreg
    return d


def config_from_dict(d: dict):
    import triton
    return triton.Config(dict(d["kwargs"]), num_warps=d["num_warps"], num_stages=d["num_stages"],
                         maxnreg=d.get("maxnreg"))


def same_config(a, b) -> bool:
    return config_to_dict(a) == config_to_dict(b)
