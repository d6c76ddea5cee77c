"""Where kernels run and how they are configured.

One rule for every op: CUDA tensors run the compiled Triton kernels; CPU tensors run the PyTorch
twin of the same algorithm, unless ``TRITON_INTERPRET=1`` is set, in which case the Triton kernels
themselves run on the CPU (this is how CI tests the kernels without a GPU).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ._launcher import Launcher
from .configs.tuning import Tuning


@triton.jit
def tile_and_slab(n_tiles):
    """Split a 1-D launch's program id into (tile, slab), tiles of one slab consecutive.

    Kernels launch ``n_tiles · n_slabs`` programs on grid axis 0 instead of a 2-D grid: CUDA caps
    axes 1 and 2 at 65,535 (B·H or a row count can exceed that), and consecutive programs still
    work on the same slab (e.g. one head, whose K/V they then share in L2)."""
    pid = tl.program_id(0)
    return pid % n_tiles, pid // n_tiles


@triton.jit
def l2_prefetch(ptrs):
    """Ask the L2 for the 128-byte lines holding ``ptrs`` (``prefetch.global.L2``): a hint, nothing
    comes back and nothing waits. Compiled kernels only: the interpreter runs no inline asm."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b). ``triton.cdiv`` is a constexpr-function wrapper costing microseconds
    per call, which adds up on the launch path of small problems."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Host-side smallest power of two ≥ n (1 for n ≤ 1); see :func:`cdiv` for why not Triton's."""
    return 1 << max(n - 1, 0).bit_length()


def interpreter_active() -> bool:
    """True when Triton kernels execute in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_triton(t: torch.Tensor) -> bool:
    """Whether an op on ``t`` should launch a Triton kernel (GPU, or CPU under the interpreter)."""
    return t.is_cuda or (t.device.type == "cpu" and interpreter_active())


def tuned(configs: list[triton.Config], key: list[str], interpreter_config: triton.Config, prune=None,
          length: str | None = None):
    """Decorator of a ``triton.jit`` kernel: launched through
    :class:`~flashattn_lite._launcher.Launcher` with a config chosen once per tuning key
    (``configs.tuning``): the GPU architecture's table (``flashattn_lite/configs/``), else the first
    config ``prune`` keeps; nothing is timed at call time unless ``FLASHATTN_LITE_AUTOTUNE=1``, which
    times the kept configs once per key and keeps the winners in a disk cache. Under the
    interpreter, ``interpreter_config`` always (timing there would run every config on the CPU).

    ``key``: the arguments whose values select a config (with the first tensor's dtype);
    ``length``: the one among them that is a length class (it selects the nearest table row).
    ``prune(configs, named_args)`` keeps the configs that fit a call (head dim, dtype), best guess
    first; ``named_args`` holds every argument, constexprs included.
    """
    return lambda fn: Launcher(fn, tuning=Tuning(configs, key, interpreter_config, prune=prune, length=length))


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors on a CUDA device (a fixed small number under the interpreter)."""
    if not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(t: torch.Tensor) -> int:
    return sm_count(t.device.index if t.is_cuda else -1) if t.is_cuda else 4


def allow_tf32() -> bool:
    """fp32 matmuls use TF32 only where torch's own CUDA matmuls may: ``allow_tf32``, or the
    newer ``fp32_precision == "tf32"`` (once that is set, torch ≥ 2.9 refuses to read the old flag)."""
    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return getattr(matmul, "fp32_precision", None) == "tf32"
