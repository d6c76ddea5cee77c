"""Which path a call takes, which kernels it launches, with which configs, and why.

``explain(q, k, v, causal=True)`` runs the call itself (forward, and backward when an input
requires grad) while recording every kernel launch (``_launcher.recording``) and every fallback or
dispatch note (``_log.recording``), so what it reports is what ran, not a second guess of the
dispatch logic. The forward and the backward are recorded apart, so a call whose backward takes
another path than its forward (a Hopper forward, a portable backward) says so. Paths:

- ``triton``: the portable Triton kernels, compiled (CUDA tensors);
- ``interpreter``: the same kernels in Triton's CPU interpreter (CPU tensors, ``TRITON_INTERPRET=1``);
- ``cpu twin``: the PyTorch version of the same tiled algorithm (CPU tensors otherwise);
- ``torch fallback``: a wrapper handed the call to PyTorch (the reason says why);
- any path a dispatcher announces with ``_log.note_path`` (e.g. a Hopper fast path).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _launcher, _log
from ._runtime import interpreter_active


@dataclass(frozen=True)
class KernelLaunch:
    name: str
    path: str               # "triton" or "interpreter"
    config: dict | None     # {"BLOCK_M": …, "num_warps": …, "num_stages": …}; None: the kernel is not tuned
    source: str             # where the config came from (table row, first fit, tuned, interpreter)
    constexprs: dict        # the launch's compile-time arguments (its variant)

    def __str__(self) -> str:
        if self.config is None:
            return f"{self.name} (fixed launch settings)"
        config = " ".join(f"{k}={v}" for k, v in self.config.items())
        return f"{self.name} {config} ({self.source})"


@dataclass(frozen=True)
class Explanation:
    """``path``, ``reason``: the call's path and why; with a backward, the last path announced (the
    backward's where it announced one, else the forward's), else how the kernels ran. ``forward``,
    ``backward``: each direction's own (path, reason); ``backward`` is None without a backward.
    ``kernels``: each distinct launch, the forward's first."""
    op: str
    path: str
    reason: str
    kernels: tuple[KernelLaunch, ...]
    forward: tuple[str, str] | None = None
    backward: tuple[str, str] | None = None

    def __str__(self) -> str:
        lines = [f"{self.op}: {self.path} ({self.reason})"]
        if self.backward not in (None, self.forward):  # each direction its own line
            lines = [f"{self.op}:", "  forward: %s (%s)" % self.forward, "  backward: %s (%s)" % self.backward]
        lines += [f"  {k}" for k in self.kernels]
        return "\n".join(lines)


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None,
            backward: bool | None = None, show: bool = False, **options) -> Explanation:
    """Run ``attention(q, k, v, causal=causal, scale=scale, **options)`` and say how it ran.

    ``backward``: also run the backward (default: when grad mode is on and q, k, v or a tensor option
    such as ``sinks`` requires grad), on detached copies
    with an all-ones output gradient, so the caller's tensors and their ``.grad`` are untouched; the
    :class:`Explanation`'s ``forward`` and ``backward`` then say each one's path and why.
    ``show``: print the explanation too. Bad arguments raise what the call raises.
    """
    from .ops.attention import attention
    inputs = (q, k, v)
    if backward is None:  # as the call itself: a backward follows where autograd records one
        backward = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                   for t in (*inputs, *options.values()))

    def call():
        if not backward:
            return attention(q, k, v, causal=causal, scale=scale, **options)
        with torch.enable_grad():  # (asked for under no_grad too)
            copies = [t.detach().requires_grad_(True) for t in inputs]
            o = attention(*copies, causal=causal, scale=scale, **options)
        return (o[0] if isinstance(o, tuple) else o), copies
    return _explained("attention" + (" forward+backward" if backward else ""), q, call, show,
                      _grad if backward else None)


def explain_softmax(x: torch.Tensor, dim: int = -1, *, log: bool = False, backward: bool | None = None,
                    show: bool = False) -> Explanation:
    """:func:`explain` for ``softmax(x, dim)`` (``log_softmax`` with ``log=True``)."""
    from .ops.softmax import log_softmax, softmax
    fn = log_softmax if log else softmax
    if backward is None:
        backward = isinstance(x, torch.Tensor) and x.requires_grad

    def call():
        if not backward:
            return fn(x, dim)
        xc = x.detach().requires_grad_(True)
        return fn(xc, dim), xc
    name = "log_softmax" if log else "softmax"
    return _explained(name + (" forward+backward" if backward else ""), x, call, show, _grad if backward else None)


def explain_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
                   show: bool = False, **options) -> Explanation:
    """:func:`explain` for ``decode(q, k_cache, v_cache, cache_seqlens, **options)``."""
    from .ops.decode import decode
    return _explained("decode", q, lambda: decode(q, k_cache, v_cache, cache_seqlens, **options), show)


explain.softmax = explain_softmax
explain.decode = explain_decode


def _grad(run) -> None:
    """The backward of a forward that returned (output, inputs): an all-ones output gradient."""
    out, inputs = run
    torch.autograd.grad(out, inputs, torch.ones_like(out))


def _recorded(call, *args):
    with _launcher.recording() as launches, _log.recording() as notes:
        result = call(*args)
    return result, launches, notes


def _explained(op: str, t, call, show: bool, backward=None) -> Explanation:
    """Explain ``call()`` (the forward) and, where given, ``backward(what call returned)``, each
    recorded apart."""
    run, launches, notes = _recorded(call)
    directions = [_path(t, launches, notes)]
    if backward is not None:
        _, back_launches, back_notes = _recorded(backward, run)
        directions.append(_path(t, back_launches, back_notes))
        launches, notes = launches + back_launches, notes + back_notes
    kernels = tuple(dict.fromkeys(_kernel(launch) for launch in launches))
    result = Explanation(op, *_path(t, launches, notes), kernels, *directions)
    if show:
        print(result)
    return result


def _kernel(launch) -> KernelLaunch:
    choice = launch.choice
    config = None if choice is None else {**choice.config.kwargs, "num_warps": choice.config.num_warps,
                                          "num_stages": choice.config.num_stages}
    return KernelLaunch(launch.kernel, launch.path, _Frozen(config) if config is not None else None,
                        "" if choice is None else choice.source, _Frozen(launch.constexprs))


class _Frozen(dict):
    """A dict that can sit in a frozen dataclass used as a dict key (for de-duplication)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))


def _path(t, launches, notes) -> tuple[str, str]:
    if notes:
        path, where, reason = notes[-1]
        return path, f"{where}: {reason}"
    if launches:
        if launches[0].path == "interpreter":
            return "interpreter", "CPU tensors with TRITON_INTERPRET=1: the Triton kernels in Triton's CPU interpreter"
        return "triton", f"{t.device} tensors: the portable Triton kernels"
    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
        why = "without TRITON_INTERPRET=1" if not interpreter_active() else "of a dtype the kernels do not take"
        return "cpu twin", f"CPU tensors {why}: the PyTorch twin of the same algorithm"
    return "torch", "no kernel of this package ran"
