"""Argument validation shared by every op: errors raised before launch, one wording.

Each check names the argument, what it got, and what was expected.
"""
from __future__ import annotations

import math
import operator
import os
from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(name: str, t, *, ndim: int | Sequence[int] | None = None, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_same(names: Sequence[str], tensors: Sequence[torch.Tensor], attr: str) -> None:
    """All tensors agree on ``attr`` ("dtype" or "device")."""
    values = [getattr(t, attr) for t in tensors]
    if any(v != values[0] for v in values[1:]):
        got = ", ".join(f"{n}={v}" for n, v in zip(names, values))
        raise ValueError(f"{', '.join(names)} must share one {attr}, got {got}")


def check_dim(name: str, what: str, got: int, expected: int, expected_from: str) -> None:
    if got != expected:
        raise ValueError(f"{name} {what} must equal {expected_from} ({expected}), got {got}")


# The kernels take scale·log2 e as a float32 (exp2 of scaled scores): past this bound it is inf.
_SCALE_MAX = torch.finfo(torch.float32).max / 1.4426950408889634


def check_scale(scale) -> float | None:
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale must be a float, got a tensor of shape {tuple(scale.shape)}")
        if scale.requires_grad:  # read as a number: it would get no gradient
            raise TypeError("scale must be a float, got a tensor that requires grad (scale takes no gradient)")
        scale = scale.item()
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if abs(scale) > _SCALE_MAX:
        raise ValueError(f"scale·log2(e) must fit in float32 (|scale| ≤ {_SCALE_MAX:.4g}), got {scale}")
    return float(scale)


def check_bool(name: str, value) -> bool:
    """A flag must be a bool (a truthy string or tensor passed by mistake is not taken as True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {_type_name(value)}")
    return value


def check_positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def check_parts(name: str, parts: Sequence, *, ndim: int, dtypes=FLOAT_DTYPES) -> None:
    """A non-empty sequence of tensors of one shape, dtype and device, about to be stacked (torch.stack
    raises a RuntimeError that names no argument, or silently promotes mixed dtypes)."""
    if len(parts) == 0:
        raise ValueError(f"{name} must hold at least one tensor, got an empty sequence")
    names = [f"{name}[{i}]" for i in range(len(parts))]
    for n, t in zip(names, parts):
        check_tensor(n, t, ndim=ndim, dtypes=dtypes)
    for n, t in zip(names[1:], parts[1:]):
        if t.shape != parts[0].shape:
            raise ValueError(f"{n} must have {name}[0]'s shape {tuple(parts[0].shape)}, got {tuple(t.shape)}")
    check_same(names, parts, "dtype")
    check_same(names, parts, "device")


def check_head_dim(name: str, d: int, lo: int = 1, hi: int = 256) -> None:
    if not lo <= d <= hi:
        raise ValueError(f"{name} head dim must be in [{lo}, {hi}], got {d}")


def _type_name(value) -> str:
    """A value's type as a user reads it: numpy's ``numpy.bool`` is not Python's ``bool``."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def as_int(name: str, value) -> int:
    """An int, or an integer like numpy's or a 0-d integer tensor (as torch takes them); never a bool,
    and a float is not truncated."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {_type_name(value)}") from None


def normalize_dim(dim, ndim: int, name: str = "dim") -> int:
    """``dim`` (``as_int``) in [0, ndim), with torch's IndexError wording when out of range."""
    dim = as_int(name, dim)
    if ndim == 0:
        if dim not in (0, -1):
            raise IndexError(f"{name} out of range (expected to be in range of [-1, 0], but got {dim})")
        return 0
    if not -ndim <= dim < ndim:
        raise IndexError(f"{name} out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dim})")
    return dim % ndim


def env_flag(name: str, default: bool) -> bool:
    """An on/off ``FLASHATTN_LITE_*`` setting: unset or empty is ``default``, ``0`` off, ``1`` on;
    anything else (``true``, ``off``, ``yes``) is a ``ValueError`` naming it, not a guess."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return default if value == "" else value == "1"
