"""Tuning data for the split softmax kernel: achieved bandwidth of each kernel variant, long rows.

The split strategy (``ops/softmax.py``) cuts each row into segments, one program each, that wait
for each other's partial (m, ℓ). ``softmax._split_config`` chooses its settings per direction,
dtype and N: elements per chunk (``block``), ``warps``, the ticket's memory order (``ticket``),
how a row's programs meet (``sync``: fenced ``counter`` or ``counter_flags``, self-validating
64-bit partials behind a relaxed counter), what a one-chunk segment holds across the wait (``hold``:
float32 or the ``raw`` loaded values), the counters' spacing (``pad``) and programs per SM
(``resident``: a register cap). A variant replaces some of them (the split kernel's ``settings``,
passed to ``softmax._forward`` / ``_backward``).
The sweeps of 2026-11-23 (``results/softmax_split_sweep-*.json``, NOTES.md) chose the
current settings; the variants that lost there or relied on in-order dispatch went with their
kernel code. Each variant's output is checked on memory poisoned with NaN. This times each variant
on the same inputs as ``softmax_speed.py`` (R = total / (N · itemsize) rows, forward = softmax,
backward = its backward) and prints GB/s and the fraction of the device copy bandwidth, with each
variant's registers and spills. JSON under ``--out``, rewritten after every point (a cut run keeps
its points); points run in ``--log2n`` order, so the first N listed is measured first. A variant
equal to the chosen settings at a point is skipped there.

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


def _uncapped(op, itemsize, n, sms):
    """The settings chosen at 16:17 on 2026-11-23 (the defaults before the register cap)."""
    fwd = op < 3
    if fwd:
        block, warps = (8192, 8) if -(-n // 8192) <= sms else (16384, 8)
    elif (itemsize == 4 and -(-n // 8192) <= sms) or (itemsize < 4 and n <= 2 ** 20):
        block, warps = 8192, 8
    else:
        block, warps = 32768, 16
    t = dict(block=block, warps=warps, ticket="acq_rel", sync="counter", pad=1, hold="f32", resident=0)
    if fwd or itemsize < 4:
        t.update(sync="counter_flags", pad=32)
    if (fwd and itemsize == 4) or (not fwd and itemsize < 4):
        t.update(ticket="relaxed")
        if block == 8192:
            t.update(hold="raw", resident=5)
    return t


_FAST = dict(ticket="relaxed", sync="counter_flags", pad=32)  # the fp32 forward's switches


def _only(direction, itemsize=None, **t):
    """An override applied to one direction (and itemsize) only; elsewhere the chosen kernel."""
    def spec(op, item, n, sms):
        return t if (op < 3) == (direction == "fwd") and itemsize in (None, item) else {}
    return spec


# name → split settings, or a function (op, itemsize, N, SM count) → them.
# A register cap (since 17:15) lets one-chunk rows use up to resident × SMs segments (was SMs); the
# backward may hold y alone ("first"), reading dy again from L2; ``segments`` caps the segments
# of a row, so that they stream several chunks (read twice, the second time from L2).
VARIANTS = {
    "chosen": {},
    "uncapped": _uncapped,
    # Segments that stream instead of holding: 2-byte forward at 2^20 (16K, 2 chunks of 8K, or 8K
    # in 2 chunks of 4K) as the 2^22 forward does (.92 × copy at 16:58, softmax_split_sweep-20261123-165814).
    "fwd-seg64": _only("fwd", 2, block=8192, warps=8, hold="f32", resident=0, segments=64),
    "fwd-4k": _only("fwd", 2, block=4096, warps=4, hold="f32", resident=0),
    # The same for the backward past 2^20: 4 chunks of 8K per segment, or 2 of 16K.
    "bwd-stream8k": _only("bwd", None, block=8192, warps=8, hold="f32", resident=0, **_FAST),
    "bwd-stream16k": _only("bwd", None, block=16384, warps=8, hold="f32", resident=0, segments=128, **_FAST),
    # y alone held on 8K chunks past 2^20 (2^21: 256 segments, about three rows waiting at once).
    "first8k-r6": _only("bwd", None, block=8192, warps=8, hold="first", resident=6, **_FAST),
    "first8k-r4": _only("bwd", 4, block=8192, warps=8, hold="first", resident=4, **_FAST),
    # L2 prefetch (since 18:10): a waiting program asks the L2 for lines (128 B) of each input at the start of its
    # segment of a row not yet started (DRAM idles through a row's wait); ``aK``: K lines once the
    # wait is over. The defaults use 128 before (fp32 backward, two rows in flight), 256 after (one
    # row filling the GPU), 256 / 512 forward. Losers dropped: 256 backward, before + after
    # together, bf16 holds of 16K and 32K chunks (NOTES, 17:51–18:03).
    "no-prefetch": dict(prefetch=0, prefetch_after=0),
    "pf64": dict(prefetch=64, prefetch_after=0),
    "pf128": dict(prefetch=128, prefetch_after=0),
    "pf512": dict(prefetch=512, prefetch_after=0),
    "a256": dict(prefetch=0, prefetch_after=256),
    # 2-byte backward past 2^20 on 8 warps (3 streaming programs per SM, the default before 18:10).
    "half-w8": _only("bwd", 2, warps=8),
}


def tuning_at(name, op, itemsize, n, sms):
    """The override variant ``name`` applies at one point, or None where it is the chosen kernel."""
    spec = VARIANTS[name]
    t = spec(op, itemsize, n, sms) if callable(spec) else dict(spec)
    chosen = sm._split_config(op, n, itemsize, sms)
    if name != "chosen" and {**chosen, **t} == chosen:
        return None
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", default="20,22,16")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--total-mib", type=float, default=1024)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--time-budget", type=float, default=140)
    parser.add_argument("--quick", action="store_true", help="accepted for gpu_check.sh (same as default)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES] + [v for v in variants if v not in VARIANTS]
    if bad or any(d not in ("fwd", "bwd") for d in args.directions.split(",")):
        parser.error(f"--dtypes (from {', '.join(DTYPES)}) / --directions (fwd, bwd) / --variants (from "
                     f"{', '.join(VARIANTS)}): got {args.dtypes!r} / {args.directions!r} / {args.variants!r}")
    if not torch.cuda.is_available():
        parser.exit(2, "softmax_split_sweep.py times the GPU split kernel: it needs a CUDA device\n")
    t0 = time.perf_counter()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    total = int(args.total_mib * 2 ** 20)
    copy = common.device_copy_bandwidth(total) * 1e-9
    print(f"device copy bandwidth {copy:.0f} GB/s", flush=True)
    env = common.environment()
    path = common.result_stem(args.out, "softmax_split_sweep").with_suffix(".json")
    rows_out = []
    out_of_time = False
    for k in (int(x) for x in args.log2n.split(",")):
        for dname in args.dtypes.split(","):
            if out_of_time:
                break
            dtype = DTYPES[dname]
            item = torch.empty((), dtype=dtype).element_size()
            n = 2 ** k
            r = total // (n * item)
            x = torch.randn(r, n, device="cuda", dtype=dtype)
            y = torch.softmax(x, -1)
            dy = torch.randn_like(y)
            ref_f = y.float()
            ref_b = torch._softmax_backward_data(dy.float(), ref_f, -1, torch.float32)
            for direction in args.directions.split(","):
                for name in variants:
                    if time.perf_counter() - t0 > args.time_budget:
                        out_of_time = True
                        break
                    op = sm.SOFTMAX if direction == "fwd" else sm.SOFTMAX_BWD
                    tuning = tuning_at(name, op, item, n, sms)
                    if tuning is None:
                        continue
                    sm._split_kernel.entries.clear()
                    if direction == "fwd":
                        fn = lambda: sm._forward(sm.SOFTMAX, x, dtype, "split", settings=tuning)
                        ref, moved = ref_f, 2 * r * n * item
                    else:
                        fn = lambda: sm._backward(sm.SOFTMAX, y, dy, dtype, "split", settings=tuning)
                        ref, moved = ref_b, 3 * r * n * item
                    row = dict(dtype=dname, N=n, rows=r, direction=direction, variant=name,
                               tuning={**sm._split_config(op, n, item, sms), **tuning})
                    try:
                        poison = torch.full_like(y, float("nan"))  # the allocator hands this block to fn()
                        del poison
                        res = fn()
                        finite = bool(torch.isfinite(res).all())
                        err = ((res.float() - ref).norm() / ref.norm()).item()
                        del res
                        ms = common.time_ms(fn, warmup_ms=10, rep_ms=50)
                    except Exception as e:  # a variant this Triton cannot build: recorded, not fatal
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        print(f"{dname} 2^{k} {direction:3s} {name:9s} ERROR {row['error']}", flush=True)
                        rows_out.append(row)
                        continue
                    entry = next(iter(sm._split_kernel.entries.values()), None)
                    kern = entry[0] if isinstance(entry, tuple) else None
                    ok = finite and err < (1e-5 if dtype == torch.float32 else 1e-2)
                    row.update(gbps=moved / ms * 1e-6, frac_copy=moved / ms * 1e-6 / copy, rel_err=err, ok=ok,
                               n_regs=getattr(kern, "n_regs", None), n_spills=getattr(kern, "n_spills", None))
                    rows_out.append(row)
                    common.write_json(path, "softmax_split_sweep", rows_out, copy_gbps=copy, environment=env)
                    print(f"{dname} 2^{k} {direction:3s} {name:9s} {row['gbps']:6.0f} GB/s {row['frac_copy']:.3f} "
                          f"regs {row['n_regs']} spills {row['n_spills']} err {err:.1e}{'' if ok else ' WRONG'} "
                          f"[{time.perf_counter() - t0:.0f} s]", flush=True)
            del x, y, dy, ref_f, ref_b
            torch.cuda.empty_cache()
    if out_of_time:
        print("time budget spent", flush=True)
    print("wrote", common.write_json(path, "softmax_split_sweep", rows_out, copy_gbps=copy, environment=env))


if __name__ == "__main__":
    main()
