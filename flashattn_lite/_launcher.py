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

Host TMA descriptors (the Gluon kernels' and the TMA kernels' ``TensorDescriptor`` arguments) are
keyed as Triton specializes them, by type: dtype, block shape, shared layout and padding. Their
shape, strides and address are runtime arguments, which Triton's own launcher encodes into a
tensor map at every launch.

Computing that key is itself a Python call per argument (≈ 11 µs for 45 arguments), so a second,
cheaper key sits in front of it: the arguments' exact values (tensors by dtype and 16-byte
alignment), built by C-level tuple operations in ≈ 4 µs. It is finer than the specialization (every
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
from typing import NamedTuple

import torch
from triton.runtime.interpreter import InterpretedFunction

from ._checks import env_flag
from ._log import Recorder, log_enabled, log_once

try:  # Triton ≥ 3.4 keeps launch hooks in knobs; older versions take the plain path.
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    _knobs = None


def _descriptor_types() -> tuple:
    """The host TMA descriptor classes this Triton has (the TMA kernels' and Gluon's)."""
    types = []
    for module in ("triton.tools.tensor_descriptor", "triton.experimental.gluon.nvidia.hopper"):
        try:
            types.append(__import__(module, fromlist=["TensorDescriptor"]).TensorDescriptor)
        except (ImportError, AttributeError):
            pass
    return tuple(types)


_DESCRIPTOR_TYPES = _descriptor_types()

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


def _spec_unspecialized(a):
    """An argument in the kernel's ``do_not_specialize``: Triton keys an int by its range only."""
    if type(a) is int:
        return "u", (_INT32_MIN <= a <= _INT32_MAX) + 2 * (a >= 2 ** 63)
    return _spec(a)


def _descriptor_spec(a) -> tuple:
    """A host TMA descriptor as Triton specializes it: its type string's parts (the base's dtype,
    the block shape, the shared layout of a Gluon descriptor) and its padding; the base address is
    16-byte aligned by the descriptor's own check."""
    return type(a), a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None), a.padding


_SPEC = {int: _int_spec, bool: lambda a: "b", float: lambda a: "f", type(None): lambda a: "n",
         **{t: _descriptor_spec for t in _DESCRIPTOR_TYPES}}


def _spec(a):
    """What Triton's specialization of one runtime argument depends on."""
    f = _SPEC.get(type(a))
    if f is not None:
        return f(a)
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    return type(a), a  # anything else: keyed by value (hashable or the launch fails loudly)


def _cannot_run_errors() -> tuple:
    """What Triton raises for a config that does not fit the GPU (resources, compile-time asserts)."""
    errors = []
    for module, name in (("triton.runtime.errors", "OutOfResources"), ("triton.runtime.errors", "PTXASError"),
                         ("triton.compiler.errors", "CompileTimeAssertionFailure")):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


_CANNOT_RUN = _cannot_run_errors()


class Launch(NamedTuple):
    """One kernel launch as explain() sees it."""
    kernel: str
    constexprs: dict
    choice: object  # configs.tuning.Choice, or None for a kernel without tuning
    path: str       # "triton" (compiled) or "interpreter"


_launches = Recorder()  # while explain() runs a call: every launch, appended
recording = _launches.recording  # the Launch of every kernel launched inside the block; bound launches step aside


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


# The current CUDA device's index: ``torch.cuda.current_device()`` without its Python wrapper (which
# was a third of a bound launch's Python on the H200's host); the C call initialises CUDA itself.
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def fast_launch_enabled() -> bool:
    return (env_flag("FLASHATTN_LITE_FAST_LAUNCH", True) and _knobs is not None
            and os.environ.get("TRITON_INTERPRET", "0") != "1")


class Launcher:
    """``kernel[grid](*args, **constexprs)`` like a Triton kernel, with a per-specialization cache.

    ``jit`` is a ``triton.jit`` function; ``tuning`` (a :class:`~flashattn_lite.configs.tuning.Tuning`,
    from ``_runtime.tuned``) picks its config once per tuning key, whose arguments' values (not
    just their specialization) are in the cache key (``tune_key`` names them for an untuned
    kernel's tests). The fast path needs runtime arguments positionally and constexprs by keyword,
    as at every call site here (a call passing a constexpr positionally always takes Triton's
    path); a callable grid sees the constexprs and the config (``meta["BLOCK_M"]``), not the
    runtime arguments. The first launch of a specialization goes through Triton (compiling) under
    a lock. Ints the kernel lists in ``do_not_specialize`` are keyed as Triton keys them: by range
    only, so a new length reuses the entry of its specialization."""

    def __init__(self, jit, tune_key=(), tuning=None):
        self.jit, self.tuning = jit, tuning
        if tuning is not None:
            tuning.attach(jit)
            tune_key = tuning.key
        fn = getattr(jit, "fn", None)
        self.name = getattr(fn, "__name__", None) or type(jit).__name__
        self.interpreted = isinstance(jit, InterpretedFunction)
        self.entries: dict = {}
        self.lock = threading.Lock()
        self.enabled = fast_launch_enabled() and not self.interpreted
        if self.enabled:
            self.n_runtime = min((p.num for p in jit.params if p.is_constexpr), default=len(jit.params))
            # Key arguments among the runtime ones (constexpr key arguments are in the kwargs key).
            self.tune_pos = tuple(i for i, n in enumerate(jit.arg_names[:self.n_runtime]) if n in tune_key)
            unspecialized = [getattr(p, "do_not_specialize", False) for p in jit.params[:self.n_runtime]]
            self.specs = (tuple(_spec_unspecialized if u else _spec for u in unspecialized)
                          if any(unspecialized) else None)
            self.exact: dict = {}    # exact-value key → entry (see the module docstring)
            self.layouts: dict = {}  # argument types → getters of the tensors and of the rest

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if not self.enabled or len(args) > self.n_runtime:
            return self._first(grid, args, kwargs)[0]
        device = _current_device()
        try:
            knobs = _knob_state()
        except AttributeError:  # a Triton whose knobs differ: its own launch path from now on
            self.enabled = False
            return self._first(grid, args, kwargs)[0]
        # Triton keys constexprs by str(value) (True, 1 and 1.0 differ): their types are in both keys.
        constexprs = (tuple(kwargs.items()), tuple(map(type, kwargs.values())))
        exact = self._exact_key(device, args, constexprs, knobs)
        entry = self.exact.get(exact)
        if entry is None:
            specs = tuple(map(_spec, args)) if self.specs is None else tuple(f(a) for f, a in zip(self.specs, args))
            key = (device, constexprs, specs, tuple(args[i] for i in self.tune_pos), knobs)
            entry = self.entries.get(key)
            if entry is None:
                with self.lock:
                    kernel, choice = self._first(grid, args, kwargs)
                    entry = self.entries[key] = self._entry(kernel, len(args), kwargs, choice)
                self._remember(exact, entry)
                return kernel
            if entry is _SLOW:
                return self._first(grid, args, kwargs)[0]
            self._remember(exact, entry)
        kernel, tail, meta, choice = entry
        if _launches.items is not None:
            _launches.items.append(Launch(self.name, kwargs, choice, "triton"))
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

    def _first(self, grid, args, kwargs):
        """Triton's own launch, with the config ``tuning`` picks: (what Triton returned, the Choice
        or None). Logs the first compile of each binary and records the launch for explain()."""
        choice = None
        config = {}
        if self.tuning is not None:
            named = {**dict(zip(self.jit.arg_names, args)), **kwargs}
            choice = self.tuning.choose(named, bench=lambda c: self._bench(grid, args, kwargs, c),
                                        interpreted=self.interpreted)
            config = choice.config.all_kwargs()
        kernel = self.jit[grid](*args, **kwargs, **config)
        path = "interpreter" if self.interpreted else "triton"
        if _launches.items is not None:
            _launches.items.append(Launch(self.name, kwargs, choice, path))
        if log_enabled():
            dtypes = ",".join(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor))
            spec = ", ".join(f"{k}={v}" for k, v in kwargs.items())
            how = f" with {config} ({choice.source})" if choice is not None else ""
            # A compiled binary is one object for as long as Triton caches it: its first sight is its compile.
            ident = id(kernel) if kernel is not None else (tuple(kwargs.items()), dtypes)
            log_once(("compile", self.name, ident), f"{'interpreting' if self.interpreted else 'compiled'} "
                                                    f"{self.name} [{dtypes}; {spec}]{how}")
        return kernel, choice

    def _bench(self, grid, args, kwargs, config) -> float:
        """Median ms of one config on the call's arguments (autotuning); inf when it cannot compile."""
        from triton.testing import do_bench
        try:
            return do_bench(lambda: self.jit[grid](*args, **kwargs, **config.all_kwargs()), return_mode="median")
        except _CANNOT_RUN:
            return float("inf")

    def bind(self, grid, args, kwargs, n_tensors: int):
        """After ``self[grid](*args, **kwargs)`` has run: ``launch(*tensors)``, which launches the
        same compiled kernel on the same grid with the same scalars and new tensors in the first
        ``n_tensors`` positions, skipping the key and the argument walk (a call site's cache of
        these, keyed by everything the other arguments and the tensors' dtypes depend on, makes a
        repeated small call cost little more than Triton's C launcher). ``launch`` returns False,
        launching nothing, where it does not apply: a tensor not 16-byte aligned in a position
        that was aligned here (the binary may assume it; a position that was not, such as a varlen
        call's ``cu_seqlens[1:]``, was compiled for any address), another current device, launch
        hooks or debug knobs set since, explain() recording. None where this launch has no fast
        entry."""
        if not self.enabled:
            return None
        device = _current_device()
        try:
            knobs = _knob_state()
        except AttributeError:
            return None
        constexprs = (tuple(kwargs.items()), tuple(map(type, kwargs.values())))
        exact = self._exact_key(device, args, constexprs, knobs)
        entry = self.exact.get(exact)
        if entry is None:
            return None
        # The positions whose addresses must stay 16-byte aligned (None: all of them).
        aligned = [i for i, a in enumerate(args[:n_tensors]) if a.data_ptr() % 16 == 0]
        kernel, tail, meta, _ = entry
        g = grid(meta) if callable(grid) else grid
        grid3 = (g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)
        return BoundLaunch(device, knobs, None if len(aligned) == n_tensors else _getter(aligned), grid3,
                           (*args[n_tensors:], *tail), kernel)

    def _remember(self, exact, entry):
        if entry is not _SLOW:
            if len(self.exact) >= _EXACT_ENTRIES:
                self.exact.clear()
            self.exact[exact] = entry

    def _exact_key(self, device, args, constexprs, knobs):
        """The arguments' exact values with tensors replaced by their dtypes, and, where a tensor
        is not 16-byte aligned, which ones are (the bounds of a varlen or ranges call, ``cu[1:]``,
        never are: without this they took the specialization key at every launch). Equal exact
        keys imply equal specializations: every int, float, bool and None is there by type and
        value, every tensor by dtype and alignment."""
        types = tuple(map(type, args))
        split = self.layouts.get(types)
        if split is None:
            split = self.layouts[types] = _splitter(types)
        tensors, descriptors, others = split[0](args), split[1](args), split[2](args)
        ptrs = tuple(map(_data_ptr, tensors))
        aligned = tuple(p & 15 == 0 for p in ptrs) if reduce(or_, ptrs, 0) & 15 else None
        return (device, types, others, tuple(map(_dtype_of, tensors)), tuple(map(_descriptor_spec, descriptors)),
                constexprs, knobs, aligned)

    def _entry(self, kernel, n_args, kwargs, choice):
        """(compiled kernel, the arguments after the positional ones, grid meta, Choice) or _SLOW."""
        config = choice.config if choice is not None else None
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
        return kernel, tuple(tail), meta, choice


class BoundLaunch:
    """A launch ``Launcher.bind`` made: ``launch(*tensors)`` runs the compiled kernel on its grid with
    its scalars and these tensors, or returns False, launching nothing, where a check fails.
    ``ready()`` is the checks that depend on no tensor and ``launch_ready(stream, tensors)`` the
    rest and the launch, for several bound launches after one ``ready()`` (``launch_bound``)."""
    __slots__ = ("device", "knobs", "pick", "grid", "rest", "run", "function", "packed")

    def __init__(self, device: int, knobs: tuple, pick, grid: tuple, rest: tuple, kernel):
        self.device, self.knobs, self.pick, self.grid, self.rest = device, knobs, pick, grid, rest
        self.run, self.function, self.packed = kernel.run, kernel.function, kernel.packed_metadata

    def ready(self) -> bool:
        """The device it was bound on is current, explain() is not recording, no launch hook is set
        and Triton's knobs are as they were."""
        runtime = _knobs.runtime
        return (_current_device() == self.device and _launches.items is None
                and not _hook_active(runtime.launch_enter_hook) and not _hook_active(runtime.launch_exit_hook)
                and _knob_state() == self.knobs)

    def same_checks(self, other: "BoundLaunch") -> bool:
        """Whether ``other.ready()`` is ``ready()``: bound on the same device with the same knobs."""
        return other.device == self.device and other.knobs == self.knobs

    def stream(self) -> int:
        """The current stream of its device, as Triton's launcher takes it."""
        return _raw_stream(self.device)

    def launch_ready(self, stream: int, tensors: tuple) -> bool:
        """After ``ready()``: the launch on ``stream``, unless a tensor's address is not 16-byte
        aligned in a position that was aligned at binding (the binary may assume it)."""
        # Addresses as ints: Triton's C launcher then skips its per-tensor data_ptr() call and
        # driver pointer query (the tensors are the call site's validated CUDA tensors).
        ptrs = tuple(map(_data_ptr, tensors))
        if reduce(or_, ptrs if self.pick is None else self.pick(ptrs), 0) & 15:
            return False
        self.run(*self.grid, stream, self.function, self.packed, None, None, None, *ptrs, *self.rest)
        return True

    def __call__(self, *tensors) -> bool:
        return self.ready() and self.launch_ready(_raw_stream(self.device), tensors)


def launch_bound(launches: tuple, tensors: tuple) -> int:
    """Bound launches (``Launcher.bind``) made one after another, ``launches[i]`` on ``tensors[i]``,
    after one ``ready()`` where they share it (``same_checks``; else each checks its own), on one
    stream: how many ran before the first that declined (0 where the check failed). The caller
    makes the rest its plain way."""
    first = launches[0]
    shared = all(first.same_checks(other) for other in launches[1:])
    if shared:
        if not first.ready():
            return 0
        stream = first.stream()
    for n, (bound, args) in enumerate(zip(launches, tensors)):
        if not (bound.launch_ready(stream, args) if shared else bound(*args)):
            return n
    return len(launches)


def _getter(positions):
    """positions → a function returning those items of a tuple, as a tuple."""
    if len(positions) == 1:
        i = positions[0]
        return lambda a: (a[i],)
    return itemgetter(*positions) if positions else (lambda a: ())


def _splitter(types):
    """(getter of the tensor arguments, of the TMA descriptors, of the others) for arguments of
    these types."""
    kinds = ["tensor" if issubclass(t, torch.Tensor) else "descriptor" if t in _DESCRIPTOR_TYPES else "other"
             for t in types]
    return tuple(_getter([i for i, k in enumerate(kinds) if k == kind]) for kind in ("tensor", "descriptor", "other"))


BOUND_ENTRIES = 256  # bound launches a call site keeps (``keep_bound``) before its table starts over


def keep_bound(table: dict, key, bound) -> None:
    """Keep a call site's bound launch (``Launcher.bind``) under its call signature; None (nothing
    could be bound) keeps nothing. A full table starts over, as the exact-value keys do."""
    if bound is None:
        return
    if len(table) >= BOUND_ENTRIES:
        table.clear()
    table[key] = bound


def launcher(fn):
    """Decorator: a ``triton.jit`` kernel launched through :class:`Launcher`."""
    return Launcher(fn)
