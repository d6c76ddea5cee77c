"""First derivatives only, said loudly: gradients whose own differentiation raises.

The attention backwards are kernels: the gradients they return carry no graph. Under
``create_graph=True`` such a gradient would look constant to autograd, and a loss built from it (a
gradient penalty, a Hessian-vector product) would silently lose every term through q, k and v.
``first_order_only`` gives those gradients a graph instead, whose backward raises, as torch's
flash and cuDNN SDPA backends do. Outside ``create_graph`` it returns the gradients unchanged.
"""
from __future__ import annotations

from typing import Sequence

import torch


class _NoSecondDerivative(torch.autograd.Function):
    """Copies of the gradients, differentiable in name only: their backward raises."""

    @staticmethod
    def forward(ctx, what: str, n: int, *tensors):
        ctx.what = what
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(f"{ctx.what} has no second derivative: its backward is a kernel (first "
                           "derivatives only). For higher derivatives use torch's math attention, e.g. "
                           "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.MATH)")


def first_order_only(grads: Sequence, inputs: Sequence, what: str) -> tuple:
    """``grads`` as they are, or, when the backward runs under ``create_graph=True`` with an input that
    requires grad, copies whose differentiation raises (None entries stay None)."""
    if not torch.is_grad_enabled():  # every plain backward: nothing to do
        return tuple(grads)
    inputs = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not inputs:
        return tuple(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    wrapped = _NoSecondDerivative.apply(what, len(present), *(grads[i] for i in present), *inputs)
    out = list(grads)
    for i, g in zip(present, wrapped):
        out[i] = g
    return tuple(out)
