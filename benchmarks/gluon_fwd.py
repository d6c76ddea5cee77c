"""The Gluon forward (warp-specialized wgmma + TMA) against the Triton Hopper kernel and SDPA: TFLOP/s.

Problem as in ``hopper_fwd.py``: bf16, 16k tokens (B·N = 16384), hidden 2048 (H = 2048 / d),
d ∈ {64, 128, 256}, causal or not, N ∈ {2048, 8192, 16384}, Nq = Nk. At each point: the Triton
Hopper kernel at its default config (``attention_fwd_hopper.default_config``; its o and lse are
the reference; at d 256, which it does not take, the portable kernel, under ``"portable"``), every
Gluon config of the sweep (``attention_fwd_gluon.CONFIGS``; the best is reported with its config),
torch SDPA's cuDNN and flash backends. Each Gluon config's output is compared with the reference
kernel's first (max |Δo|, max |Δlse|): a config off by more than bf16 rounding is marked
wrong and never reported as the best; one that fails to compile is recorded and skipped. Timing:
``common.time_ms`` (median, cold clean L2). TFLOP/s = 4·B·H·N²·d / t, halved under causal.

JSON (with the environment) is rewritten after every point to ``--out/gluon_fwd-<timestamp>.json``;
``--time-budget`` (seconds from the script's start): a timing starts only if the longest one so far
would still end within it; the run then ends cleanly with what it has.

    PYTHONPATH=. python benchmarks/gluon_fwd.py --out benchmarks/results --time-budget 150
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # the budget counts from here: imports and CUDA start-up included

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hopper_fwd import (LSE_TOL, O_TOL, Budget, argument_parser, flops, inputs, max_diffs, measure,  # noqa: E402
                        sweep, time_configs, time_sdpa_forward)

from flashattn_lite.ops import attention_fwd_gluon as glu  # noqa: E402
from flashattn_lite.ops import attention_fwd_hopper as hopper  # noqa: E402
from flashattn_lite.ops.attention_fwd import attention_forward  # noqa: E402

CONFIG_WIDTH = 24


def run_point(d, causal, n, configs, budget, rep_ms) -> dict:
    """A new point: the Hopper kernel (reference and peer), the Gluon configs, the SDPA backends."""
    q, k, v = inputs(d, n)
    b, h = q.shape[:2]
    scale = d ** -0.5
    work = flops(b, h, n, d, causal)
    point = {"d": d, "causal": causal, "n": n, "batch": b, "heads": h, "gflop": round(work / 1e9, 1)}
    reason = glu.supported(q, k, v, causal=causal)
    if reason is not None:
        point["error"] = f"not covered by the Gluon kernel: {reason}"
        return point

    def hopper_default():
        return hopper.attention_forward_hopper(q, k, v, scale, causal)

    def portable():
        with hopper.disabled():
            return attention_forward(q, k, v, scale=scale, causal=causal, causal_offset=0, mask=None,
                                     dropout_p=0.0, seed=0)

    peer, name = (hopper_default, "hopper_default") if d in hopper.HEAD_DIMS else (portable, "portable")

    def time_peer():
        ref = peer()
        return ref, measure(peer, work, rep_ms)

    (o_ref, lse_ref), point[name] = budget.step(time_peer)
    if name == "hopper_default":
        point[name]["config"] = hopper.default_config(d, causal, n).name

    def run(cfg):
        return glu.attention_forward_gluon(q, k, v, scale, causal, config=cfg)

    def check(out):
        d_o, d_lse = max_diffs(*out, o_ref, lse_ref)
        return {"max_abs_diff_o": d_o, "max_abs_diff_lse": d_lse, "ok": bool(d_o <= O_TOL and d_lse <= LSE_TOL)}

    # time_configs files its rows under the Hopper benchmark's keys: renamed here.
    time_configs(point, configs, run, check, work, budget, rep_ms)
    point["gluon"] = point.pop("hopper", [])
    if "hopper_best" in point:
        point["gluon_best"] = point.pop("hopper_best")

    time_sdpa_forward(point, q, k, v, o_ref, work, budget, rep_ms)
    return point


def table_line(p, config_width: int = CONFIG_WIDTH) -> str:
    def tf(entry):
        return f"{entry['tflops']:7.1f}" if isinstance(entry, dict) and "tflops" in entry else "      -"
    best, hop = p.get("gluon_best"), p.get("hopper_default", p.get("portable"))
    ratio = f"{hop['ms'] / best['ms']:5.2f}x" if best and hop and "ms" in hop else "    -"
    cudnn = p.get("sdpa-cudnn")
    vs_cudnn = f"{cudnn['ms'] / best['ms']:5.2f}x" if best and cudnn and "ms" in cudnn else "    -"
    bad = [r["config"] for r in p.get("gluon", []) if r.get("ok") is False]
    failed = [r["config"] for r in p.get("gluon", []) if "error" in r]
    notes = (f" WRONG: {','.join(bad)}" if bad else "") + (f" failed: {','.join(failed)}" if failed else "")
    return (f"{p['d']:4d} {str(p['causal']):>6} {p['n']:6d} {tf(hop)} {tf(best)} "
            f"{(best or {}).get('config', '-'):>{config_width}} {ratio} {tf(cudnn)} {vs_cudnn} "
            f"{tf(p.get('sdpa-flash'))}" + notes + (f" {p['error']}" if "error" in p else ""))


def main(argv=None) -> int:
    args = argument_parser(__doc__, "the Gluon kernel's").parse_args(argv)
    budget = Budget(args.time_budget, _T0)
    if not torch.cuda.is_available():
        print("gluon_fwd: needs a CUDA GPU (an sm_90 one for the Gluon kernel)", file=sys.stderr)
        return 2
    header = (f"{'d':>4} {'causal':>6} {'N':>6} {'hopper':>7} {'gluon':>7} {'best config':>{CONFIG_WIDTH}} "
              f"{'vs hop':>6} {'cudnn':>7} {'vs cud':>6} {'flash':>7}")
    return sweep(args, budget, "gluon_fwd", glu,
                 lambda d, causal, n, cfgs: run_point(d, causal, n, cfgs, budget, args.rep_ms),
                 config_width=CONFIG_WIDTH, line=table_line, header=header)


if __name__ == "__main__":
    sys.exit(main())
