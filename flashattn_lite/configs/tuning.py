"""Which config a tuned kernel runs with, decided once per tuning key.

In order: under the interpreter, the kernel's one small interpreter config; with
``FLASHATTN_LITE_AUTOTUNE=1``, the user's disk cache (``configs.cache``), else every config the
prune function keeps is timed and the winner stored there; otherwise (the default: nothing is
timed at call time) the architecture's table row (``configs.lookup``), else the first config the
prune function keeps (its best guess first). A table config the prune function rejects for this
call (another GPU's limits, a stale row) is not used.
"""
from __future__ import annotations

import json
import threading
from typing import NamedTuple

import torch

from .._checks import env_flag
from . import arch_of, cache, config_from_dict, config_to_dict, lookup, same_config

TIE = 1.02  # timed configs within 2% of the fastest count as tied: the prune order's earliest wins


class Choice(NamedTuple):
    config: object   # triton.Config
    source: str      # where it came from, for explain() and the log
    fields: dict     # the tuning key: {"dtype": …, key argument: value}


def autotune_requested() -> bool:
    """``FLASHATTN_LITE_AUTOTUNE=1``: time the configs (once per key, then from the disk cache)."""
    return env_flag("FLASHATTN_LITE_AUTOTUNE", False)


class Tuning:
    """The configs of one kernel and how to pick among them (see the module docstring).

    ``key`` names the arguments whose values select a config; ``length`` is the key argument that
    is a length class (it selects the nearest table row and is never a reason to time again
    unless autotuning is on); ``prune(configs, named_args)`` keeps the configs that fit a call,
    best guess first."""

    def __init__(self, configs, key, interpreter_config, prune=None, length=None):
        if length is not None and length not in key:
            raise ValueError(f"length must be one of the key arguments {list(key)}, got {length!r}")
        self.configs, self.key, self.length = list(configs), list(key), length
        self.interpreter_config, self.prune = interpreter_config, prune
        self.name, self.jit = "", None
        self.chosen: dict = {}  # memo key → Choice, every key this process has decided
        self._lock = threading.Lock()

    def attach(self, jit) -> None:
        fn = getattr(jit, "fn", None)
        self.name = getattr(fn, "__name__", None) or type(jit).__name__
        self.jit = jit

    def fields(self, named: dict) -> dict:
        dtype = next((a.dtype for a in named.values() if isinstance(a, torch.Tensor)), None)
        return {"dtype": str(dtype).replace("torch.", ""), **{k: named[k] for k in self.key}}

    def choose(self, named: dict, bench=None, interpreted: bool = False) -> Choice:
        """The config for a call with arguments ``named`` ({name: value}, constexprs included).
        ``bench(config) → ms`` times one config on the call's arguments (autotuning only)."""
        fields = self.fields(named)
        if interpreted:
            return Choice(self.interpreter_config, "interpreter config", fields)
        dtypes = tuple(str(a.dtype) for a in named.values() if isinstance(a, torch.Tensor))
        # (the device too: two GPUs of different archs in one process each get their own table's row)
        memo = (tuple(fields.items()), dtypes, torch.cuda.current_device())
        choice = self.chosen.get(memo)
        if choice is None:
            with self._lock:
                choice = self.chosen.get(memo) or self._decide(named, fields, dtypes, bench)
                self.chosen[memo] = choice
        return choice

    def _decide(self, named, fields, dtypes, bench) -> Choice:
        kept = (self.prune(self.configs, named) if self.prune else self.configs) or self.configs[-1:]
        device = torch.cuda.current_device()
        if autotune_requested() and bench is not None and not torch.cuda.is_current_stream_capturing():
            return self._tuned(kept, fields, dtypes, bench, device)
        arch = arch_of(device)
        row = lookup(self.name, fields, arch, self.length)
        if row is not None:
            config = config_from_dict(row["config"])
            if any(same_config(config, c) for c in kept):
                return Choice(config, f"table {arch}: {row.get('source', 'row')}", fields)
            return Choice(kept[0], f"first fit (the table {arch} row does not fit this call)", fields)
        return Choice(kept[0], f"first fit (no table {arch} row)", fields)

    def _tuned(self, kept, fields, dtypes, bench, device) -> Choice:
        env = cache.environment(device)
        key = json.dumps([fields, dtypes], sort_keys=True)
        source = str(getattr(self.jit, "cache_key", ""))  # the kernel's source hash
        stored = cache.load(env, self.name, source).get(key)
        if stored is not None:
            return Choice(config_from_dict(stored), "tuned (disk cache)", fields)
        times = [bench(c) for c in kept]
        best = min(times)
        winner = next(c for c, t in zip(kept, times) if t <= best * TIE)
        cache.store(env, self.name, source, key, config_to_dict(winner))
        return Choice(winner, f"tuned ({len(kept)} configs timed, stored in {cache.cache_path(env)})", fields)
