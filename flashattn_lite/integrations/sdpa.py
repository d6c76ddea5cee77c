"""A drop-in for ``torch.nn.functional.scaled_dot_product_attention``, and ``replace_sdpa``.

``scaled_dot_product_attention`` takes torch's arguments with torch's meaning and runs our kernel.
``replace_sdpa`` routes existing calls of torch's function to it, falling back to torch (with a
one-time warning naming the case, and a count in ``fallback_counts()``) where we do not apply.
"""
from __future__ import annotations

import math
import sys
from typing import Optional

import torch
import torch.nn.functional as F

from .. import _checks
from .._log import note_fallback
from .._runtime import interpreter_active
from ..ops.attention import _as_4d, _run

__all__ = ["scaled_dot_product_attention", "replace_sdpa", "SDPAReplacement", "SDPAUnsupportedError"]

# The builtin itself, whatever ``F.scaled_dot_product_attention`` points at when we are imported.
_TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


class SDPAUnsupportedError(NotImplementedError):
    """A valid call torch handles but our kernel does not (``replace_sdpa`` falls back to torch).

    ``case`` is a short stable name for the kind of call (one warning per case)."""

    def __init__(self, case: str, message: str):
        super().__init__(message)
        self.case = case


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on flashattn_lite's kernel.

    Same arguments, same meaning, same output:

    - query (…, L, E), key (…, S, E), value (…, S, Ev); leading dims broadcast as in torch (a
      broadcast dim is read with stride 0, not copied; more than two leading dims are flattened,
      which copies only when they cannot be merged as a view). Output (…, L, Ev), query's dtype.
    - ``attn_mask``: bool (True = take part) or float (added to the scaled scores), in float32 or
      query's dtype, broadcastable to (…, L, S); broadcast dims are read with stride 0.
    - ``is_causal``: top-left aligned as torch defines it (query i sees keys j ≤ i), also when
      L ≠ S. Combined with ``attn_mask`` it raises, as torch's documentation says torch does
      (recent releases' math path applies both instead; pass the causal part in the mask).
    - ``scale``: defaults to 1/√E. ``enable_gqa``: dim −3 of key/value may divide that of query;
      query head h reads key/value head h // (Hq / Hkv), as torch (read in place, no repeat).
    - ``dropout_p``: applied whenever > 0 (as torch's functional does, regardless of training),
      in the kernel with a Philox mask seeded from torch's default CPU generator; the backward
      regenerates the same mask. ``dropout_p == 1`` gives zeros.

    Differences from torch: a query row whose keys are all masked returns zeros (and zero
    gradients); torch's math and CPU backends agree, its CUDA fused kernels may give NaN there.
    Arithmetic is float32 inside the kernel for every input dtype.

    Raises what torch raises (``RuntimeError``) for invalid calls, and ``SDPAUnsupportedError``
    (a ``NotImplementedError``) for valid calls the kernel does not handle: dtypes other than
    fp16/bf16/fp32, head dims above 256, a mask that requires grad, empty inputs, key and value
    with different head counts under ``enable_gqa``, nested tensors.
    """
    # torch's own binding raises TypeError for a non-bool flag (an int or a 0-d tensor included).
    _checks.check_bool("is_causal", is_causal)
    _checks.check_bool("enable_gqa", enable_gqa)
    q, k, v, mask, out_shape = _to_bhld(query, key, value, attn_mask, is_causal, enable_gqa, dropout_p)
    scale = _checks.check_scale(scale)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    p = float(dropout_p)
    o, _ = _run(q, k, v, mask, scale, is_causal, 0, 0.0 if p == 1.0 else p, need_lse=False)
    if p == 1.0:
        o = o * 0.0
    return o if out_shape is None else o.reshape(out_shape)


def _fail(message: str):
    raise RuntimeError(f"scaled_dot_product_attention: {message}")


def _to_bhld(query, key, value, attn_mask, is_causal, enable_gqa, dropout_p):
    """Torch's argument rules → (q, k, v, mask) for the kernel, (B, H, L, ·), plus the output
    shape (None when the kernel's output already has it)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a Tensor, got {type(t).__name__}")
    qs, ks, vs = query.shape, key.shape, value.shape
    fast = (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and qs[0] == ks[0] == vs[0] and ks[1] == vs[1]
            and (qs[1] == ks[1] or ks[1] == 1 or (enable_gqa and ks[1] > 0 and qs[1] % ks[1] == 0))
            and ks[2] == vs[2] and ks[3] == qs[3])
    if fast:
        q, k, v, out_shape, full = query, key, value, None, (qs[0], qs[1], qs[2], ks[2])
    else:
        q, k, v, out_shape, full = _broadcast_general(query, key, value, enable_gqa)
    _check_supported(query, key, value, dropout_p)
    if attn_mask is not None:
        attn_mask = _mask_4d(attn_mask, query, is_causal, full, out_shape)
    return q, k, v, attn_mask, out_shape


def _broadcast_general(query, key, value, enable_gqa):
    """Any leading dims: broadcast batch dims (stride 0), apply GQA or head broadcasting, and
    flatten to (B, H, L, ·)."""
    if min(query.dim(), key.dim(), value.dim()) < 2:
        _fail(f"query, key and value must be at least 2-D, got {query.dim()}-D, {key.dim()}-D, {value.dim()}-D")
    L, E = query.shape[-2:]
    S, Ek = key.shape[-2:]
    if Ek != E:
        _fail(f"key's last dim ({Ek}) must equal query's ({E})")
    if value.shape[-2] != S:
        _fail(f"value's sequence length ({value.shape[-2]}) must equal key's ({S})")
    nd = max(query.dim(), key.dim(), value.dim(), 3)
    q, k, v = (t.reshape((1,) * (nd - t.dim()) + tuple(t.shape)) for t in (query, key, value))
    try:
        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except RuntimeError:
        _fail(f"leading dims of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
              f"{tuple(value.shape)} do not broadcast")
    Hq, Hk, Hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa and not (Hk == Hv == 1 or Hq == Hk == Hv):
        if Hk == 0 or Hv == 0 or Hq % Hk or Hq % Hv:
            _fail(f"with enable_gqa, the number of heads in key ({Hk}) and value ({Hv}) must divide "
                  f"the number of heads in query ({Hq})")
        if Hk != Hv:
            raise SDPAUnsupportedError("gqa-kv-heads", f"key and value with different head counts ({Hk}, {Hv})"
                                       " under enable_gqa are not supported by flashattn_lite")
        H, Hkv = Hq, Hk
    else:
        try:
            H = torch.broadcast_shapes((Hq,), (Hk,), (Hv,))[0]
        except RuntimeError:
            _fail(f"heads of query ({Hq}), key ({Hk}) and value ({Hv}) do not broadcast (pass enable_gqa=True "
                  "for grouped-query attention)")
        Hkv = 1 if Hk == Hv == 1 else H
    B = math.prod(batch)
    q = q.expand(batch + (H, L, E)).reshape(B, H, L, E)
    k = k.expand(batch + (Hkv, S, E)).reshape(B, Hkv, S, E)
    v = v.expand(batch + (Hkv, S, value.shape[-1])).reshape(B, Hkv, S, value.shape[-1])
    out_lead = (batch + (H,))[len(batch) + 1 - (max(query.dim(), key.dim(), value.dim()) - 2):]
    return q, k, v, out_lead + (L, value.shape[-1]), batch + (H, L, S)


def _check_supported(query, key, value, dropout_p):
    dt = query.dtype
    if key.dtype != dt or value.dtype != dt:
        _fail(f"query, key and value must have the same dtype, got {dt}, {key.dtype}, {value.dtype}")
    if key.device != query.device or value.device != query.device:
        _fail(f"query, key and value must be on one device, got {query.device}, {key.device}, {value.device}")
    if not (isinstance(dropout_p, (float, int)) and not isinstance(dropout_p, bool) and 0.0 <= dropout_p <= 1.0):
        _fail(f"dropout_p must be in [0, 1], got {dropout_p!r}")
    if dt not in _checks.FLOAT_DTYPES:
        raise SDPAUnsupportedError(f"dtype-{dt}", f"dtype {dt} is not supported by flashattn_lite "
                                   "(float16, bfloat16, float32)")
    if query.shape[-1] > 256 or value.shape[-1] > 256:
        raise SDPAUnsupportedError("head-dim>256", f"head dims above 256 are not supported by flashattn_lite "
                                   f"(query/key {query.shape[-1]}, value {value.shape[-1]})")
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        raise SDPAUnsupportedError("empty", "empty query, key or value is not supported by flashattn_lite")
    if query.is_nested or key.is_nested or value.is_nested:
        raise SDPAUnsupportedError("nested", "nested tensors are not supported by flashattn_lite")


def _mask_4d(mask, query, is_causal, full, out_shape):
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be a Tensor or None, got {type(mask).__name__}")
    if is_causal:
        _fail("an explicit attn_mask must not be set when is_causal=True")
    if mask.dtype != torch.bool and mask.dtype != torch.float32 and mask.dtype != query.dtype:
        _fail(f"attn_mask dtype must be bool, float32 or query's dtype ({query.dtype}), got {mask.dtype}")
    if mask.device != query.device:
        _fail(f"attn_mask must be on query's device ({query.device}), got {mask.device}")
    ms = mask.shape
    if len(ms) > len(full) or any(m != 1 and m != f for m, f in zip(ms[::-1], full[::-1])):
        _fail(f"attn_mask of shape {tuple(ms)} does not broadcast to {tuple(full)}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise SDPAUnsupportedError("mask-requires-grad", "a mask that requires grad is not supported by "
                                   "flashattn_lite (no gradient with respect to the mask)")
    if len(full) <= 4:
        return _as_4d(mask)
    # More than two leading dims: merge the batch dims of the mask into one, copying only if
    # they are broadcast (stride 0) in a way a view cannot express.
    mask = mask.reshape((1,) * (len(full) - mask.dim()) + tuple(ms))
    lead = mask.shape[:-3]
    if all(n == 1 for n in lead):
        return mask.reshape((1,) + tuple(mask.shape[-3:]))
    return mask.expand(full[:-3] + tuple(mask.shape[-3:])).reshape((-1,) + tuple(mask.shape[-3:]))


# ------------------------------------------------------------------ replace_sdpa

class _State:
    """Where the router is installed, and whether it routes right now (read on every call)."""
    installs = 0          # live handles; the router is installed while > 0
    global_on = 0         # live global handles
    depth = 0             # model forwards in progress (model-scoped handles)
    patched: list = []    # (namespace dict, name) holding the router


def _router(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if _State.global_on == 0 and _State.depth == 0:
        return _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    case = None
    if isinstance(query, torch.Tensor) and not query.is_cuda and not interpreter_active():
        case = SDPAUnsupportedError("cpu", "CPU tensors go to torch's SDPA (its CPU kernels are faster than "
                                    "flashattn_lite's PyTorch twin)")
    else:
        try:
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa)
        except SDPAUnsupportedError as e:
            case = e
    note_fallback("replace_sdpa", f"to torch's scaled_dot_product_attention: {case.case}", detail=str(case))
    return _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


_router.__name__ = _router.__qualname__ = "scaled_dot_product_attention"
_router.__doc__ = ("torch.nn.functional.scaled_dot_product_attention, routed to flashattn_lite by "
                   "replace_sdpa (torch's own function outside the scope that was replaced).")


def _install():
    """Point ``F.scaled_dot_product_attention`` and every module-level alias of torch's function
    (``from torch.nn.functional import scaled_dot_product_attention``) at the router."""
    if _State.installs == 0:
        # torch's private modules (``torch._C``, dynamo, inductor…) keep their references, and so
        # does this module (``_TORCH_SDPA`` is what the router falls back to).
        spaces = [vars(m) for name, m in list(sys.modules.items())
                  if m is not None and name != __name__ and not name.startswith("torch._")]
        for ns in spaces:
            try:
                names = [n for n, val in ns.items() if val is _TORCH_SDPA]
            except RuntimeError:  # a module dict changing under us (imports in other threads)
                continue
            for n in names:
                ns[n] = _router
                _State.patched.append((ns, n))
        if F.scaled_dot_product_attention is not _router:  # someone else's wrapper: wrap over it
            _State.patched.append((vars(F), "scaled_dot_product_attention", F.scaled_dot_product_attention))
            F.scaled_dot_product_attention = _router
    _State.installs += 1


def _uninstall():
    _State.installs -= 1
    if _State.installs == 0:
        for entry in _State.patched:
            ns, name = entry[0], entry[1]
            if ns.get(name) is _router:
                ns[name] = entry[2] if len(entry) == 3 else _TORCH_SDPA
        _State.patched = []


class SDPAReplacement:
    """Handle returned by ``replace_sdpa``: ``.restore()`` (idempotent), or use it as a context
    manager. ``model`` is the module the replacement is scoped to (None: global)."""

    def __init__(self, model: Optional[torch.nn.Module]):
        self.model = model
        self._hooks = []
        self.active = True
        _install()
        if model is None:
            _State.global_on += 1
        else:
            self._hooks = [model.register_forward_pre_hook(_enter),
                           model.register_forward_hook(_exit, always_call=True)]

    def restore(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.model is None:
            _State.global_on -= 1
        for h in self._hooks:
            h.remove()
        _uninstall()

    def __enter__(self) -> "SDPAReplacement":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def __repr__(self) -> str:
        scope = "global" if self.model is None else type(self.model).__name__
        return f"SDPAReplacement(scope={scope}, active={self.active})"


def _enter(module, args):
    _State.depth += 1


def _exit(module, args, output):
    _State.depth -= 1


def replace_sdpa(model: Optional[torch.nn.Module] = None) -> SDPAReplacement:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` calls to flashattn_lite.

    ``replace_sdpa()`` routes every call in the process; ``replace_sdpa(model)`` only the calls
    made while ``model`` runs its forward (other code keeps torch's kernel). Both cover calls
    through ``F.scaled_dot_product_attention`` (looked up at call time) and module-level aliases
    made by ``from torch.nn.functional import scaled_dot_product_attention`` in modules already
    imported (names imported later, or held in closures, keep torch's function).

    Use it as a call (``h = replace_sdpa(model)`` … ``h.restore()``) or as a context manager
    (``with replace_sdpa(model): …``). Handles nest; torch's function is back once all are restored.

    Calls we do not apply to go to torch's SDPA, with one warning per kind of case (each counted in
    ``flashattn_lite._log.fallback_counts()`` under "replace_sdpa"): CPU tensors
    (unless ``TRITON_INTERPRET=1``), dtypes other than fp16/bf16/fp32, head dims above 256, a mask
    that requires grad, empty inputs, nested tensors, key/value head counts that differ under
    ``enable_gqa``. Invalid calls raise as torch would.

    With ``torch.compile``, replace before compiling (the compiled graph keeps the function it
    traced). The model-scoped form counts forwards in progress, so it is not meant for one model
    run concurrently from several threads while other code calls torch's SDPA.
    """
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    return SDPAReplacement(model)
