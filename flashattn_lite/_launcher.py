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
same specialization call the binary's own launcher directly.

Computing that key is itself a Python call per argument (≈ 11 µs for 45 arguments), so a second,
cheaper key sits in front of it: the arguments' exact values (tensors by dtype, all 16-byte
aligned), built by C-level tuple operations in ≈ 4 µs. It is finer than the specialization (every
new shape is a new exact key) and bounded; a miss falls back to the specialization key, which
still avoids Triton's own path. Any Triton whose compiled kernels do
not look as expected (or ``FLASHATTN_LITE_FAST_LAUNCH=0``) gets Triton's own launch path; so does
the interpreter, whose kernels are not compiled.
"""
from __future__ import annotations

import os
import threading
from functools import reduce
from operator import attrgetter, itemgetter, or_

import torch
from triton.runtime.autotuner import Autotuner

try:  # Triton ≥ 3.4 keeps launch hooks in knobs; older versions take the plain path.
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    _knobs = None

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_SLOW = object()  # cache entry: this specialization always takes Triton's own path
_EXACT_ENTRIES = 1024  # exact-value keys kept per kernel before the table starts over
_dtype_of = attrgetter("dtype")
_data_ptr = torch.Tensor.data_ptr


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


def _knob_state() -> tuple:
    """The knobs Triton's JIT puts in its kernel cache key at every launch (debug, instrumentation,
    fp sanitizer casts, a stages inspection hook): a change of any of them must not reuse a kernel
    compiled before it. Knobs this Triton does not have read as None."""
    runtime, compilation = _knobs.runtime, _knobs.compilation
    return (runtime.debug, getattr(compilation, "instrumentation_mode", None),
            getattr(compilation, "fpsan_homomorphic_casts", None),
            getattr(runtime, "add_stages_inspection_hook", None))


def _hook_active(hook) -> bool:
    """Whether a launch hook would do anything: Triton ≥ 3.5 keeps an always-present chain of hooks
    (``HookChain``, empty unless a profiler registered one); older versions keep None or a function.
    With no active hook the launch skips building Triton's launch metadata and calling the chain."""
    return hook is not None and bool(getattr(hook, "calls", True))


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
            self.exact: dict = {}    # exact-value key → entry (see the module docstring)
            self.layouts: dict = {}  # argument types → getters of the tensors and of the rest

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if not self.enabled or len(args) > self.n_runtime:
            return self.inner[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        try:
            knobs = _knob_state()
        except AttributeError:  # a Triton whose knobs differ: its own launch path from now on
            self.enabled = False
            return self.inner[grid](*args, **kwargs)
        # Triton keys constexprs by str(value) (True, 1 and 1.0 differ): their types are in both keys.
        constexprs = (tuple(kwargs.items()), tuple(map(type, kwargs.values())))
        exact = self._exact_key(device, args, constexprs, knobs)
        entry = self.exact.get(exact) if exact is not None else None
        if entry is None:
            key = (device, constexprs, tuple(map(_spec, args)), tuple(args[i] for i in self.tune_pos), knobs)
            entry = self.entries.get(key)
            if entry is None:
                with self.lock:
                    kernel = self.inner[grid](*args, **kwargs)
                    entry = self.entries[key] = self._entry(kernel, len(args), kwargs)
                self._remember(exact, entry)
                return kernel
            if entry is _SLOW:
                return self.inner[grid](*args, **kwargs)
            self._remember(exact, entry)
        kernel, tail, meta = entry
        g = grid(meta) if callable(grid) else grid
        g0, g1, g2 = g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1
        stream = _raw_stream(device)
        enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
        all_args = (*args, *tail)
        if _hook_active(enter) or _hook_active(leave):  # a profiler is listening: Triton's metadata
            metadata = kernel.launch_metadata(g, stream, *all_args)
        else:
            metadata = enter = leave = None
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, metadata, enter, leave, *all_args)
        return kernel

    def bind(self, grid, args, kwargs, n_tensors: int):
        """After ``self[grid](*args, **kwargs)`` has run: ``launch(*tensors)``, which launches the
        same compiled kernel on the same grid with the same scalars and new tensors in the first
        ``n_tensors`` positions, skipping the key and the argument walk (a call site's cache of
        these, keyed by everything the other arguments and the tensors' dtypes depend on, makes a
        repeated small call cost little more than Triton's C launcher). ``launch`` returns False,
        launching nothing, where it does not apply: a tensor not 16-byte aligned, another current
        device, launch hooks or debug knobs set since. None where this launch has no fast entry."""
        if not self.enabled:
            return None
        device = torch.cuda.current_device()
        try:
            knobs = _knob_state()
        except AttributeError:
            return None
        constexprs = (tuple(kwargs.items()), tuple(map(type, kwargs.values())))
        exact = self._exact_key(device, args, constexprs, knobs)
        entry = self.exact.get(exact) if exact is not None else None
        if entry is None:
            return None
        kernel, tail, meta = entry
        g = grid(meta) if callable(grid) else grid
        g0, g1, g2 = g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1
        rest = (*args[n_tensors:], *tail)
        run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        runtime = _knobs.runtime

        def launch(*tensors):
            # Addresses as ints: Triton's C launcher then skips its per-tensor data_ptr() call and
            # driver pointer query (the tensors are the call site's validated CUDA tensors).
            ptrs = tuple(map(_data_ptr, tensors))
            if (reduce(or_, ptrs, 0) & 15 or torch.cuda.current_device() != device
                    or _hook_active(runtime.launch_enter_hook) or _hook_active(runtime.launch_exit_hook)
                    or _knob_state() != knobs):
                return False
            run(g0, g1, g2, _raw_stream(device), function, packed, None, None, None, *ptrs, *rest)
            return True
        return launch

    def _remember(self, exact, entry):
        if exact is not None and entry is not _SLOW:
            if len(self.exact) >= _EXACT_ENTRIES:
                self.exact.clear()
            self.exact[exact] = entry

    def _exact_key(self, device, args, constexprs, knobs):
        """The arguments' exact values with tensors replaced by their dtypes, or None when a
        tensor is not 16-byte aligned (the specialization key handles those). Equal exact keys
        imply equal specializations: every int, float, bool and None is there by type and value."""
        types = tuple(map(type, args))
        split = self.layouts.get(types)
        if split is None:
            split = self.layouts[types] = _splitter(types)
        tensors, others = split[0](args), split[1](args)
        if reduce(or_, map(_data_ptr, tensors), 0) & 15:
            return None
        return device, types, others, tuple(map(_dtype_of, tensors)), constexprs, knobs

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


def _getter(positions):
    """positions → a function returning those items of a tuple, as a tuple."""
    if len(positions) == 1:
        i = positions[0]
        return lambda a: (a[i],)
    return itemgetter(*positions) if positions else (lambda a: ())


def _splitter(types):
    """(getter of the tensor arguments, getter of the others) for arguments of these types."""
    tensor = [issubclass(t, torch.Tensor) for t in types]
    return (_getter([i for i, is_t in enumerate(tensor) if is_t]),
            _getter([i for i, is_t in enumerate(tensor) if not is_t]))


def launcher(fn):
    """Decorator: a ``triton.jit`` kernel launched through :class:`Launcher`."""
    return Launcher(fn)
