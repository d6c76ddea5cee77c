"""Attention dropout as a pure function of (seed, position): the forward draws it, the backward
draws the same bits again, and the PyTorch twin below reproduces them bit for bit on the CPU.

Element (b, h, i, j) of a (B, H, Nq, Nk) probability matrix is kept when the low 31 bits of
Philox4x32-10 (Triton's ``tl.randint``) at counter ((b·H + h)·Nq + i)·Nk + j are ≥ p·2³¹.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def keep_threshold(p: float) -> int:
    """Integer threshold in [0, 2³¹] for dropout probability ``p``."""
    return min(int(round(p * 2.0 ** 31)), 2 ** 31)


@triton.jit
def dropout_keep(seed, offsets, threshold):
    """Bool block: True where the element at ``offsets`` (int64 counters) survives dropout."""
    bits = tl.randint(seed, offsets)
    return (bits & 0x7FFFFFFF) >= threshold


_M32 = 0xFFFFFFFF


def _umulhi(a: int, b: torch.Tensor) -> torch.Tensor:
    # b·a reaches 2⁶⁴ and would wrap in int64: multiply by a's 16-bit halves (each product < 2⁴⁸).
    return (b * (a >> 16) + ((b * (a & 0xFFFF)) >> 16)) >> 16


def philox_randint_torch(seed: int, offsets: torch.Tensor, n_rounds: int = 10) -> torch.Tensor:
    """Twin of ``tl.randint(seed, offsets)`` for int64 offsets: the first uint32 word, as int64."""
    offsets = offsets.to(torch.int64)
    c0 = offsets & _M32
    c1 = (offsets >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(n_rounds):
        _c0, _c2 = c0, c2
        c0 = _umulhi(0xCD9E8D57, _c2) ^ c1 ^ k0
        c2 = _umulhi(0xD2511F53, _c0) ^ c3 ^ k1
        c1 = (_c2 * 0xCD9E8D57) & _M32
        c3 = (_c0 * 0xD2511F53) & _M32
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return c0


def dropout_keep_torch(seed: int, b: int, h: int, nq: int, nk: int, p: float, device=None) -> torch.Tensor:
    """Bool (b, h, nq, nk) keep-mask identical to what the kernels draw for the same seed."""
    offsets = torch.arange(b * h * nq * nk, dtype=torch.int64, device=device).view(b, h, nq, nk)
    return (philox_randint_torch(seed, offsets) & 0x7FFFFFFF) >= keep_threshold(p)
