"""Launching compiled Triton kernels for microseconds of host time instead of a hundred.

A plain Triton launch of one of our ~45-argument kernels walks every argument through the
autotuner's key (a list scan per argument name) and then through the JIT's binder, cache key and
global-value checks: 50–120 µs of Python per launch on the H100 host (``benchmarks/NOTES.md``),
far more than the kernel itself at decode and other small shapes, and paid four times per
attention forward+backward.

``Launcher`` does that walk once per *specialization* of a kernel and remembers the compiled
binary Triton picked. A specialization is everything Triton's compiled code depends on: the
constexpr keyword arguments, each tensor's dtype and 16-byte alignment, whether each int is 1,
divisible by 16, or beyond int32, and the values of the autotuning key. Later launches with the
same specialization call the binary's own launcher directly. Any Triton whose compiled kernels do
not look as expected (or ``FLASHATTN_LITE_FAST_LAUNCH=0``) gets Triton's own launch path; so does
the interpreter, whose kernels are not compiled.
"""
from __future__ import annotations

import os
import threading

import torch
from triton.runtime.autotuner import Autotuner

try:  # Triton ≥ 3.4 keeps launch hooks in knobs; older versions take the plain path.
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    _knobs = None

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_SLOW = object()  # cache entry: this specialization always takes Triton's own path


def _int_spec(a: int) -> int:
    """Triton's int specialization: 1 becomes a constant; otherwise i32 / i64 / u64 by range,
    and whether it is divisible by 16."""
    if a == 1:
        return 1
    return 2 + (a % 16 == 0) + 2 * (_INT32_MIN <= a <= _INT32_MAX) + 4 * (a >= 2 ** 63)


_SPEC = {int: _int_spec, bool: lambda a: "b", float: lambda a: "f", type(None): lambda a: "n"}


def _spec(a):
    """What Triton's specialization of one runtime argument depends on."""
    f = _SPEC.get(type(a))
    if f is not None:
        return f(a)
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    return type(a), a  # anything else: keyed by value (hashable or the launch fails loudly)


def _raw_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)  # what Triton's own launcher asks for


def fast_launch_enabled() -> bool:
    return (_knobs is not None and os.environ.get("FLASHATTN_LITE_FAST_LAUNCH", "1") != "0"
            and os.environ.get("TRITON_INTERPRET", "0") != "1")


class Launcher:
    """``kernel[grid](*args, **constexprs)`` like a Triton kernel, with a per-specialization cache.

    ``inner`` is a ``triton.jit`` function or a ``triton.autotune`` wrapper of one; ``tune_key``
    names the autotuning key's arguments (their values, not just their specialization, pick the
    config). The fast path needs runtime arguments positionally and constexprs by keyword, as at
    every call site here (a call passing a constexpr positionally always takes Triton's path); a
    callable grid sees the constexprs and the config (``meta["BLOCK_M"]``), not the runtime
    arguments. The first launch of a specialization goes through ``inner`` (tuning, compiling),
    under a lock: the autotuner reports its choice in a shared attribute."""

    def __init__(self, inner, tune_key=()):
        self.inner = inner
        self.entries: dict = {}
        self.enabled = fast_launch_enabled()
        if self.enabled:
            self.jit = inner.fn if isinstance(inner, Autotuner) else inner
            self.n_runtime = min((p.num for p in self.jit.params if p.is_constexpr), default=len(self.jit.params))
            # Key arguments among the runtime ones (constexpr key arguments are in the kwargs key).
            self.tune_pos = tuple(i for i, n in enumerate(self.jit.arg_names[:self.n_runtime]) if n in tune_key)
            self.lock = threading.Lock()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if not self.enabled or len(args) > self.n_runtime:
            return self.inner[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        try:
            # Triton keys constexprs by str(value) (True, 1 and 1.0 differ), and the compile options
            # it reads from knobs at every launch (debug, instrumentation) are in its cache key.
            key = (device, tuple(kwargs.items()), tuple(map(type, kwargs.values())), tuple(map(_spec, args)),
                   tuple(args[i] for i in self.tune_pos), _knobs.runtime.debug,
                   _knobs.compilation.instrumentation_mode)
        except AttributeError:  # a Triton whose knobs differ: its own launch path from now on
            self.enabled = False
            return self.inner[grid](*args, **kwargs)
        entry = self.entries.get(key)
        if entry is None or entry is _SLOW:
            if entry is _SLOW:
                return self.inner[grid](*args, **kwargs)
            with self.lock:
                kernel = self.inner[grid](*args, **kwargs)
                self.entries[key] = self._entry(kernel, len(args), kwargs)
            return kernel
        kernel, tail, meta = entry
        g = grid(meta) if callable(grid) else grid
        g0, g1, g2 = g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1
        stream = _raw_stream(device)
        hooks = _knobs.runtime
        all_args = (*args, *tail)
        metadata = kernel.launch_metadata(g, stream, *all_args) if hooks.launch_enter_hook is not None else None
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, metadata,
                   hooks.launch_enter_hook, hooks.launch_exit_hook, *all_args)
        return kernel

    def _entry(self, kernel, n_args, kwargs):
        """(compiled kernel, the arguments after the positional ones, grid meta) or _SLOW."""
        config = getattr(self.inner, "best_config", None)
        if config is not None and config.pre_hook is not None:
            return _SLOW
        if kernel is None:  # a cache hook made Triton skip the launch
            return _SLOW
        if hasattr(kernel, "result"):  # asynchronous compilation hands back a future
            kernel = kernel.result()
        if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
            return _SLOW
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            return _SLOW  # keyed by identity: would never hit
        meta = {**kwargs, **(config.kwargs if config is not None else {})}
        tail = []
        for param in self.jit.params[n_args:]:
            if param.name in meta:
                tail.append(meta[param.name])
            elif param.has_default:
                tail.append(param.default)
            else:
                return _SLOW
        return kernel, tuple(tail), meta


def launcher(fn):
    """Decorator: a ``triton.jit`` kernel launched through :class:`Launcher`."""
    return Launcher(fn)
