"""Where an eager decode step spends its host time, beside SDPA's (a diagnostic for ``decode``).

    python benchmarks/decode_host.py [--out benchmarks/results]

At ``flashattn-lite decode``'s smallest point, B 1 × 4k positions (Hq 32, Hkv 8, d 128, bf16), the
step is host-bound: its kernels take ~15 µs under a CUDA graph, its eager call three times that.
Host wall clock per call of back-to-back calls (synchronised once per block, ``common.host_us``),
best of ``--rounds`` blocks (default 5), every item in balanced rounds. Items:

- ``sdpa_cudnn`` / ``sdpa_flash``: ``F.scaled_dot_product_attention`` (GQA) with its backend chosen
  once around the block, as ``flashattn-lite decode`` times it;
- ``decode``: ``flashattn_lite.decode`` (num_splits chosen); ``decode_unsplit``: num_splits = 1
  (one launch, no partials);
- ``decode_forward``: the same without the argument checks (``ops.decode.decode_forward``, lse
  not asked for, as ``decode``'s default);
- ``plan_run``: the call's cached plan alone (lse not asked for, as ``decode``'s default);
- ``stage1_bound`` / ``merge_bound``: each bound launch alone, on tensors made once;
- ``empty_strided_x4``: four allocations of the plan's layouts (o, lse and the two partials) alone;
- ``validate``: the shape / dtype / device checks alone (``ops.decode._validate``);
- ``signature``: the plan cache's key alone.

``--profile``: also cProfile ``decode`` (the functions with the most own time, µs per call).
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import decode  # noqa: E402
from flashattn_lite.bench.common import (add_run_arguments, format_table, gpu_script_args, host_us,  # noqa: E402
                                         in_rounds, profile_rows, write_json)
from flashattn_lite.ops import decode as decode_ops  # noqa: E402

CALLS = 200
B, HQ, HKV, L, D = 1, 32, 8, 4096, 128


def main():
    def add(ap):
        ap.add_argument("--profile", action="store_true", help="also cProfile decode")
        add_run_arguments(ap)  # accepted for benchmarks/gpu_check.sh; this run is short either way
    args = gpu_script_args(__doc__, Path(__file__).parent / "results", add)
    rounds = args.rounds
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    seqlens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    decode(q, k, v, seqlens)
    plan = decode_ops._PLANS[decode_ops._signature(q, k, v, None, scale, None)]
    split = plan.merge is not None
    parts = ((torch.empty_strided(*plan.o_part_layout, device="cuda", dtype=torch.float32),
              torch.empty_strided(*plan.lse_part_layout, device="cuda", dtype=torch.float32)) if split else ())
    o, lse = plan.run(q, k, v, seqlens, None)

    def empties():
        layouts = (plan.o_layout, plan.lse_layout) + ((plan.o_part_layout, plan.lse_part_layout) if split else ())
        return [torch.empty_strided(*lay, device="cuda", dtype=torch.float32) for lay in layouts]

    items = {
        "sdpa_cudnn": (SDPBackend.CUDNN_ATTENTION, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        "sdpa_flash": (SDPBackend.FLASH_ATTENTION, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        "decode": (None, lambda: decode(q, k, v, seqlens)),
        "decode_unsplit": (None, lambda: decode(q, k, v, seqlens, num_splits=1)),
        "decode_forward": (None, lambda: decode_ops.decode_forward(q, k, v, seqlens, None, scale=scale,
                                                                    num_splits=None, need_lse=False)),
        "plan_run": (None, lambda: plan.run(q, k, v, seqlens, None, False)),
        "stage1_bound": (None, (lambda: plan.stage1(q, k, v, *parts, seqlens, seqlens)) if split
                         else (lambda: plan.stage1(q, k, v, o, lse, seqlens, seqlens))),
        "merge_bound": (None, (lambda: plan.merge(*parts, o, lse)) if split else None),
        "empty_strided_x4": (None, empties),
        "validate": (None, lambda: decode_ops._validate(q, k, v, seqlens, None, None)),
        "signature": (None, lambda: decode_ops._signature(q, k, v, None, scale, None)),
    }
    items = {name: item for name, item in items.items() if item[1] is not None}

    def measure(name):
        backend, fn = items[name]
        with (sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()):
            return host_us(fn, CALLS)

    failed = {}
    times, _ = in_rounds(list(items), rounds, measure, failed=failed)
    rows = [dict(item=name, best_us=min(t), median_us=sorted(t)[len(t) // 2]) for name, t in times.items() if t]
    rows += [dict(item=name, note=f"{type(e).__name__}: {e}"[:120]) for name, e in failed.items()]
    extra = dict(splits=plan.o_part_layout[0][0] if split else 1,
                 stage1_path=type(plan.stage1).__name__, stage1_bound=getattr(plan.stage1, "bound", None) is not None,
                 merge_bound=split and plan.merge.bound is not None)
    profile = profile_rows(lambda: decode(q, k, v, seqlens), 2000) if args.profile else None
    path = write_json(args.out, "decode_host", rows, shape=dict(B=B, Hq=HQ, Hkv=HKV, L=L, D=D, dtype="bfloat16"),
                      rounds=rounds, calls=CALLS, profile=profile, **extra)
    print(extra)
    print(format_table(rows, ["item", "best_us", "median_us", "note"]))
    if profile:
        print(format_table(profile, ["function", "calls_per_step", "own_us", "cum_us"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
