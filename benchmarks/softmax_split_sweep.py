"""Tuning data for the split softmax kernel: achieved bandwidth of each kernel variant, long rows.

The split strategy (``ops/softmax.py``) cuts each row into segments, one program each, that wait
for each other's partial (m, ℓ). Its knobs (``softmax._SPLIT_TUNING``): elements per chunk
(``block``), ``num_warps`` and placement by program id instead of atomic tickets (``pid_order``).
Session 3's sweeps (block and warps, streaming stores, volatile polling, a nanosleep back-off;
NOTES.md) chose ``_split_shape``. Each variant's output is checked on memory poisoned with NaN.
This times each variant on the same inputs as ``softmax_speed.py`` (R = total / (N · itemsize) rows,
forward = softmax, backward = its backward) and prints GB/s and the fraction of the device copy
bandwidth, with each variant's registers and spills. JSON under ``--out``.

    python benchmarks/softmax_split_sweep.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import softmax as sm  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# The shapes ``_split_shape`` chooses, and the same with programs placed by program id instead of
# an atomic ticket (one atomic fewer per program, trusting in-order dispatch).
VARIANTS = {"chosen": {}, "pid": dict(pid_order=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", default="20")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--directions", default="fwd")
    parser.add_argument("--total-mib", type=float, default=512)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--time-budget", type=float, default=240)
    parser.add_argument("--quick", action="store_true", help="accepted for gpu_check.sh (same as default)")
    args = parser.parse_args()
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad or any(d not in ("fwd", "bwd") for d in args.directions.split(",")):
        parser.error(f"--dtypes (from {', '.join(DTYPES)}) / --directions (fwd, bwd): got {args.dtypes!r} / "
                     f"{args.directions!r}")
    if not torch.cuda.is_available():
        parser.exit(2, "softmax_split_sweep.py times the GPU split kernel: it needs a CUDA device\n")
    t0 = time.perf_counter()
    total = int(args.total_mib * 2 ** 20)
    copy = common.device_copy_bandwidth(total) * 1e-9
    print(f"device copy bandwidth {copy:.0f} GB/s", flush=True)
    rows_out = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        item = torch.empty((), dtype=dtype).element_size()
        for k in (int(x) for x in args.log2n.split(",")):
            n = 2 ** k
            r = total // (n * item)
            x = torch.randn(r, n, device="cuda", dtype=dtype)
            y = torch.softmax(x, -1)
            dy = torch.randn_like(y)
            ref_f = y.float()
            ref_b = torch._softmax_backward_data(dy.float(), ref_f, -1, torch.float32)
            for direction in args.directions.split(","):
                for name, tuning in VARIANTS.items():
                    if time.perf_counter() - t0 > args.time_budget:
                        print("time budget spent", flush=True)
                        break
                    sm._SPLIT_TUNING.clear()
                    sm._SPLIT_TUNING.update(tuning)
                    sm._split_kernel.entries.clear()
                    if direction == "fwd":
                        fn = lambda: sm._forward(sm.SOFTMAX, x, dtype, "split")
                        ref, moved = ref_f, 2 * r * n * item
                    else:
                        fn = lambda: sm._backward(sm.SOFTMAX, y, dy, dtype, "split")
                        ref, moved = ref_b, 3 * r * n * item
                    poison = torch.full_like(y, float("nan"))  # the allocator hands this block to fn()
                    del poison
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    ms = common.time_ms(fn)
                    kern = next(iter(sm._split_kernel.entries.values()))[0]
                    row = dict(dtype=dname, N=n, rows=r, direction=direction, variant=name, **tuning,
                               gbps=moved / ms * 1e-6, frac_copy=moved / ms * 1e-6 / copy, rel_err=err,
                               n_regs=getattr(kern, "n_regs", None), n_spills=getattr(kern, "n_spills", None))
                    rows_out.append(row)
                    print(f"{dname} 2^{k} {direction:3s} {name:12s} {row['gbps']:6.0f} GB/s {row['frac_copy']:.3f} "
                          f"regs {row['n_regs']} spills {row['n_spills']} err {err:.1e}", flush=True)
            del x, y, dy, ref_f, ref_b
            torch.cuda.empty_cache()
    sm._SPLIT_TUNING.clear()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("wrote", common.write_json(out, "softmax_split_sweep", rows_out, copy_gbps=copy))


if __name__ == "__main__":
    main()
