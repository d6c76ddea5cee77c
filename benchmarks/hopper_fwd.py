"""The Hopper forward (TMA descriptors) against the portable forward and SDPA: TFLOP/s.

Problem: bf16, 16k tokens (B·N = 16384), hidden 2048 (H = 2048 / d), d ∈ {64, 128}, causal or not,
N ∈ {2048, 8192, 16384}, Nq = Nk. At each point: our portable forward (``attention_forward`` with
the lse stored, as training calls it; the Hopper kernel always stores it), the Hopper kernel at
every config of its sweep (``attention_fwd_hopper.CONFIGS``; the best is reported with its config),
torch SDPA's cuDNN and flash backends (a backend that errors is recorded and skipped). Each Hopper
config's output is first compared with the portable kernel's (max |Δo|, max |Δlse|): a config off
by more than bf16 rounding is marked wrong and never reported as the best. A config that fails to
compile is recorded and skipped. Timing: ``common.time_ms`` (median, cold clean L2).
TFLOP/s = 4·B·H·N²·d / t, halved under causal.

JSON (with the environment) is rewritten after every point to ``--out/hopper_fwd-<timestamp>.json``;
``--time-budget`` (seconds from the script's start): a timing starts only if the longest one so far
would still end within it; the run then ends cleanly with what it has.

    PYTHONPATH=. python benchmarks/hopper_fwd.py --out benchmarks/results --time-budget 200
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # the budget counts from here: imports and CUDA start-up included

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import attention_fwd_hopper as hopper  # noqa: E402
from flashattn_lite.ops.attention_fwd import attention_forward  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
DEVICE = "cuda"
DTYPE = torch.bfloat16
# bf16 rounding of o (|o| ≲ 1 here: a softmax average of N(0, 1) values) is 2⁻⁸ relative; two
# correct kernels summing in different orders differ by a few of those. The lse is float32.
O_TOL, LSE_TOL = 2e-2, 1e-2


def argument_parser(doc: str, kernel: str, *, sdpa_switch: bool = False) -> argparse.ArgumentParser:
    """The Hopper benchmarks' command line (``hopper_bwd.py`` too): ``doc``'s first paragraph as the
    description, ``kernel`` ("the Hopper kernel's") in ``--configs``' help, ``--no-sdpa`` if asked."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="directory for the JSON (default: benchmarks/results)")
    p.add_argument("--time-budget", type=float, default=240.0,
                   help="seconds for the whole run; no timing starts past it (default 240)")
    p.add_argument("--head-dims", default="64,128", help="comma-separated head dims the kernel takes (default 64,128)")
    p.add_argument("--lengths", default="2048,8192,16384", help="comma-separated N (B = 16384 // N)")
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--configs", default="all",
                   help=f"{kernel} whole sweep (all), the config it runs by default at each point (default), "
                        "or comma-separated config names of the sweep (those of another head dim are skipped)")
    if sdpa_switch:
        p.add_argument("--no-sdpa", action="store_true", help="skip the SDPA backends")
    p.add_argument("--rep-ms", type=float, default=60.0, help="timed milliseconds per measurement")
    return p


def parse_args(argv=None):
    return argument_parser(__doc__, "the Hopper kernel's").parse_args(argv)


class Budget:
    """The run's seconds. A step (one timing, with its compile) starts only if the longest step so far
    would still end within the budget, so the run ends inside it. ``start``: the script's own start
    (``time.monotonic()`` before its imports; this one's by default)."""

    def __init__(self, seconds: float, start: float = _T0):
        self.seconds = seconds
        self.start = start
        self.longest = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def allows(self) -> bool:
        return self.elapsed() + self.longest <= self.seconds

    def step(self, fn):
        t = time.monotonic()
        try:
            return fn()
        finally:
            self.longest = max(self.longest, time.monotonic() - t)


def flops(b, h, n, d, causal) -> float:
    return 4.0 * b * h * n * n * d / (2 if causal else 1)


def short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:300]


def measure(fn, work: float, rep_ms: float) -> dict:
    ms = common.time_ms(fn, warmup_ms=10, rep_ms=rep_ms)
    return {"ms": round(ms, 4), "tflops": round(work / (ms * 1e-3) / 1e12, 1)}


def max_diffs(o, lse, o_ref, lse_ref) -> tuple[float, float]:
    d_o = (o.float() - o_ref.float()).abs().max().item()
    finite = torch.isfinite(lse_ref)
    same_inf = torch.equal(torch.isfinite(lse), finite)
    d_lse = (lse[finite] - lse_ref[finite]).abs().max().item() if same_inf else float("inf")
    return d_o, d_lse


def sdpa_backends():
    from torch.nn.attention import SDPBackend
    return [("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)]


def inputs(d, n, count=3):
    """``count`` tensors (B, H, N, d) bf16: q, k, v (and the backward's dO)."""
    b, h = TOKENS // n, HIDDEN // d
    g = torch.Generator(device=DEVICE).manual_seed(0)
    return tuple(torch.randn(b, h, n, d, device=DEVICE, dtype=DTYPE, generator=g) for _ in range(count))


def time_configs(point, configs, run, check, work, budget, rep_ms) -> None:
    """Check and time each config into ``point["hopper"]``; update ``point["hopper_best"]``.
    ``run(cfg)``: one call at that config; ``check(out)``: the row's comparison of its output with the
    reference, ``ok`` among it (only ok rows can be the best)."""
    rows = point.setdefault("hopper", [])
    for cfg in configs:
        row = {"config": cfg.name}
        rows.append(row)
        if not budget.allows():
            row["skipped"] = "time budget"
            continue

        def fn(cfg=cfg):
            return run(cfg)

        def check_and_time(row=row, fn=fn):
            try:
                out = fn()  # compiles on the first call
                torch.cuda.synchronize()
            except Exception as e:  # a compile or launch failure of one config: record it, go on
                row["error"] = short(e)
                return
            row.update(check(out))
            del out
            row.update(measure(fn, work, rep_ms))

        budget.step(check_and_time)
    good = [r for r in rows if r.get("ok") and "ms" in r]
    if good:
        best = min(good, key=lambda r: r["ms"])
        point["hopper_best"] = {"config": best["config"], "ms": best["ms"], "tflops": best["tflops"]}


def time_hopper(point, q, k, v, o_ref, lse_ref, configs, budget, rep_ms) -> None:
    """Check and time each config against the portable forward's o and lse."""
    causal, scale = point["causal"], point["d"] ** -0.5
    work = flops(point["batch"], point["heads"], point["n"], point["d"], causal)

    def run(cfg):
        return hopper.attention_forward_hopper(q, k, v, scale, causal, config=cfg)

    def check(out):
        d_o, d_lse = max_diffs(*out, o_ref, lse_ref)
        return {"max_abs_diff_o": d_o, "max_abs_diff_lse": d_lse, "ok": bool(d_o <= O_TOL and d_lse <= LSE_TOL)}

    time_configs(point, configs, run, check, work, budget, rep_ms)


def portable_forward(q, k, v, causal):
    with hopper.disabled():  # attention_forward itself would send these calls to the Hopper kernel
        return attention_forward(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal, causal_offset=0, mask=None,
                                 dropout_p=0.0, seed=0, need_lse=True)


def run_point(d, causal, n, configs, budget, rep_ms) -> dict:
    """A new point: the portable forward, the Hopper configs, the SDPA backends."""
    q, k, v = inputs(d, n)
    b, h = q.shape[:2]
    work = flops(b, h, n, d, causal)
    point = {"d": d, "causal": causal, "n": n, "batch": b, "heads": h, "gflop": round(work / 1e9, 1)}
    reason = hopper.supported(q, k, v, causal=causal)
    if reason is not None:
        point["error"] = f"not covered by the Hopper kernel: {reason}"
        return point

    def portable():
        return portable_forward(q, k, v, causal)

    def time_portable():
        ref = portable()
        return ref, measure(portable, work, rep_ms)

    (o_ref, lse_ref), point["portable"] = budget.step(time_portable)
    time_hopper(point, q, k, v, o_ref, lse_ref, configs, budget, rep_ms)
    time_sdpa_forward(point, q, k, v, o_ref, work, budget, rep_ms)
    return point


def time_sdpa_forward(point, q, k, v, o_ref, work, budget, rep_ms) -> None:
    """torch SDPA's cuDNN and flash forwards on the point's inputs into ``point[name]``, each output
    compared with ``o_ref`` first (a backend that errors is recorded and skipped)."""
    from torch.nn.attention import sdpa_kernel
    causal, scale = point["causal"], point["d"] ** -0.5
    for name, backend in sdpa_backends():
        if not budget.allows():
            point[name] = {"skipped": "time budget"}
            continue

        def peer(backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        def check_and_time(name=name, peer=peer):
            try:
                o = peer()
                torch.cuda.synchronize()
            except Exception as e:  # the backend does not take this problem here
                point[name] = {"error": short(e)}
                return
            point[name] = {"max_abs_diff_o": (o.float() - o_ref.float()).abs().max().item(),
                           **measure(peer, work, rep_ms)}

        budget.step(check_and_time)


def table_line(p, config_width: int = 26) -> str:
    def tf(entry):
        return f"{entry['tflops']:7.1f}" if isinstance(entry, dict) and "tflops" in entry else "      -"
    best = p.get("hopper_best")
    speedup = f"{p['portable']['ms'] / best['ms']:5.2f}x" if best and "portable" in p else "    -"
    bad = [r["config"] for r in p.get("hopper", []) if r.get("ok") is False]
    failed = [r["config"] for r in p.get("hopper", []) if "error" in r]
    notes = (f" WRONG: {','.join(bad)}" if bad else "") + (f" failed: {','.join(failed)}" if failed else "")
    return (f"{p['d']:4d} {str(p['causal']):>6} {p['n']:6d} {tf(p.get('portable'))} {tf(best)} "
            f"{(best or {}).get('config', '-'):>{config_width}} {speedup} {tf(p.get('sdpa-cudnn'))} "
            f"{tf(p.get('sdpa-flash'))}"
            + notes + (f" {p['error']}" if "error" in p else ""))


def chosen_configs(kernels, choice: str, d: int, causal: bool, n: int) -> list:
    """``--configs``: the sweep of head dim d, its default at the point, or the named ones of the sweep."""
    if choice == "all":
        return kernels.CONFIGS[d]
    if choice == "default":
        return [kernels.default_config(d, causal, n)]
    names = choice.split(",")
    known = {c.name for configs in kernels.CONFIGS.values() for c in configs}
    unknown = [n for n in names if n not in known]
    if unknown:  # a typo would otherwise measure nothing and say nothing
        raise SystemExit(f"--configs: no config named {', '.join(unknown)} in the sweep (known: {', '.join(sorted(known))})")
    return [c for c in kernels.CONFIGS[d] if c.name in names]


def sweep(args, budget, name: str, kernels, run_point, *, config_width: int = 26, unit: str = "TFLOP/s",
          line=table_line, header: str | None = None, **extra) -> int:
    """The command line's points in order (``run_point(d, causal, n, configs)`` each, ``configs``
    from ``kernels.CONFIGS`` or ``kernels.default_config``), a table line printed (``line(point,
    config_width)`` under ``header``) and the JSON ``--out/<name>-<timestamp>.json`` rewritten after
    each; ``extra``: more top-level JSON keys."""
    head_dims = [int(x) for x in args.head_dims.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    path = common.result_stem(args.out, name).with_suffix(".json")
    result = {"benchmark": name, "command": common.recorded_command(sys.argv, args.out),
              "environment": common.environment(), "args": {k: v for k, v in vars(args).items() if k != "out"},
              "tokens": TOKENS, "hidden": HIDDEN, "dtype": "bfloat16", **extra, "points": [], "stopped_early": False}
    if header is None:
        header = (f"{'d':>4} {'causal':>6} {'N':>6} {'portbl':>7} {'hopper':>7} {'best config':>{config_width}} "
                  f"{'vs':>6} {'cudnn':>7} {'flash':>7}")
    print(f"{header}   ({unit})")

    def save():
        result["elapsed_s"] = round(budget.elapsed(), 1)
        common.write_text_atomic(path, json.dumps(result, indent=1))

    for d in head_dims:
        for causal in causals:
            for n in lengths:
                if not budget.allows():
                    result["stopped_early"] = True
                    continue
                cfgs = chosen_configs(kernels, args.configs, d, causal, n)
                try:
                    point = run_point(d, causal, n, cfgs)
                except Exception as e:  # the point's own setup failed (e.g. out of memory): record, go on
                    point = {"d": d, "causal": causal, "n": n, "error": short(e)}
                torch.cuda.empty_cache()
                result["points"].append(point)
                save()
                print(line(point, config_width), flush=True)
    save()
    if result["stopped_early"]:
        print(f"time budget of {args.time_budget:.0f} s spent: later points not run")
    print(f"wrote {path} ({result['elapsed_s']} s)")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    budget = Budget(args.time_budget)
    if not torch.cuda.is_available():
        print("hopper_fwd: needs a CUDA GPU (an sm_90 one for the Hopper kernel)", file=sys.stderr)
        return 2
    return sweep(args, budget, "hopper_fwd", hopper,
                 lambda d, causal, n, cfgs: run_point(d, causal, n, cfgs, budget, args.rep_ms))


if __name__ == "__main__":
    sys.exit(main())
