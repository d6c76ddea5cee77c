"""The Gluon backward (warp-specialized wgmma + TMA, dQ by TMA reduce-add) against the portable
backward, the Triton TMA backward and SDPA: TFLOP/s.

Problem as in ``hopper_bwd.py``: bf16, 16k tokens (B·N = 16384), hidden 2048 (H = 2048 / d),
d ∈ {64, 128}, causal or not, N ∈ {2048, 8192, 16384}, Nq = Nk. At each point the forward runs once
(the portable kernel, lse stored) outside every timing; then, on the same saved o and lse and one
dO: our portable backward (``attention_backward``; its gradients are the reference), the Triton TMA
backward at its default config (``attention_backward_hopper``), the Gluon backward at every config
of its sweep (``attention_bwd_gluon.CONFIGS``; the best is reported with its config), and torch
SDPA's cuDNN and flash backends' backward alone (one forward graph kept, ``autograd.grad`` rerun).
Each Gluon config's gradients are compared with the portable backward's first (‖Δ‖/‖ref‖ and max
|Δ| of dq, dk, dv): a config off by more than bf16 rounding is marked WRONG and never reported as
the best; one that fails to compile or launch is recorded and skipped. Timing: ``common.time_ms``
(median, cold clean L2). TFLOP/s = 2.5 × the forward's 4·B·H·N²·d / t, halved under causal.

JSON (with the environment) is rewritten after every point to ``--out/gluon_bwd-<timestamp>.json``;
``--time-budget`` (seconds from the script's start): a timing starts only if the longest one so far
would still end within it; the run then ends cleanly with what it has.

    PYTHONPATH=. python benchmarks/gluon_bwd.py --out benchmarks/results --time-budget 240
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # the budget counts from here: imports and CUDA start-up included

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The problem, the command line, the budget, timing and the sweep: the Hopper benchmarks'.
from hopper_bwd import flops, grad_diffs, portable_backward, time_sdpa  # noqa: E402
from hopper_fwd import Budget, argument_parser, inputs, measure, portable_forward, sweep, time_configs  # noqa: E402

from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as glu  # noqa: E402
from flashattn_lite.ops import attention_bwd_hopper as hopper  # noqa: E402

CONFIG_WIDTH = 26


def parse_args(argv=None):
    p = argument_parser(__doc__, "the Gluon backward's", sdpa_switch=True)
    p.add_argument("--profile", action="store_true",
                   help="also one call of the default config under torch.profiler: each kernel's device µs")
    return p.parse_args(argv)


def run_point(d, causal, n, configs, budget, rep_ms, sdpa, profile=False) -> dict:
    """A new point: the forward once, then the portable and TMA backwards, the Gluon configs, SDPA."""
    q, k, v, do = inputs(d, n, 4)
    b, h = q.shape[:2]
    scale = d ** -0.5
    work = flops(b, h, n, d, causal)
    point = {"d": d, "causal": causal, "n": n, "batch": b, "heads": h, "gflop": round(work / 1e9, 1)}
    reason = glu.supported(q, k, v, do, causal=causal)
    if reason is not None:
        point["error"] = f"not covered by the Gluon backward: {reason}"
        return point
    o, lse = portable_forward(q, k, v, causal)
    torch.cuda.synchronize()

    def portable():
        return portable_backward(do, q, k, v, o, lse, causal)

    def time_portable():
        refs = portable()  # autotunes on the first call
        return refs, measure(portable, work, rep_ms)

    refs, point["portable"] = budget.step(time_portable)

    def tma():
        return hopper.attention_backward_hopper(do, q, k, v, o, lse, scale=scale, causal=causal)

    def time_tma():
        point["tma_default"] = {"config": hopper.default_config(d, causal, n).name, **grad_diffs(tma(), refs)}
        point["tma_default"].update(measure(tma, work, rep_ms))

    if budget.allows() and d in hopper.HEAD_DIMS:  # (the Triton TMA backward has no d 256)
        budget.step(time_tma)

    def run(cfg):
        return glu.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal, config=cfg)

    # (v runs at q's width here: the head dim 256 one pass, for v at most 128 wide, does not apply)
    if any(cfg.split_d and cfg.fused_dq for cfg in configs):
        print("  (the head dim 256 one pass is left out: it takes v at most 128 wide, and v runs at q's width here)")
        configs = [cfg for cfg in configs if not (cfg.split_d and cfg.fused_dq)]
    # time_configs files its rows under the Hopper benchmark's keys: renamed here.
    time_configs(point, configs, run, lambda grads: grad_diffs(grads, refs), work, budget, rep_ms)
    point["gluon"] = point.pop("hopper", [])
    if "hopper_best" in point:
        point["gluon_best"] = point.pop("hopper_best")
    if sdpa:
        time_sdpa(point, q, k, v, do, refs, budget, rep_ms)
    if profile:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        point["profile_us"] = common.kernel_times_us(lambda: run(glu.default_config(d, causal, n)))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o_cudnn = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
        point["profile_cudnn_us"] = common.kernel_times_us(
            lambda: torch.autograd.grad(o_cudnn, leaves, do, retain_graph=True))
        print(f"  kernels, µs (one call): ours {point['profile_us']}; cuDNN {point['profile_cudnn_us']}", flush=True)
    return point


def table_line(p, config_width: int = CONFIG_WIDTH) -> str:
    def tf(entry):
        return f"{entry['tflops']:7.1f}" if isinstance(entry, dict) and "tflops" in entry else "      -"

    def ratio(best, other):
        return f"{other['ms'] / best['ms']:5.2f}x" if best and isinstance(other, dict) and "ms" in other else "    -"

    best, tma, cudnn = p.get("gluon_best"), p.get("tma_default"), p.get("sdpa-cudnn")
    bad = [r["config"] for r in p.get("gluon", []) if r.get("ok") is False]
    failed = [r["config"] for r in p.get("gluon", []) if "error" in r]
    notes = (f" WRONG: {','.join(bad)}" if bad else "") + (f" failed: {','.join(failed)}" if failed else "")
    return (f"{p['d']:4d} {str(p['causal']):>6} {p['n']:6d} {tf(p.get('portable'))} {tf(tma)} {tf(best)} "
            f"{(best or {}).get('config', '-'):>{config_width}} {ratio(best, tma)} {tf(cudnn)} {ratio(best, cudnn)} "
            f"{tf(p.get('sdpa-flash'))}" + notes + (f" {p['error']}" if "error" in p else ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    budget = Budget(args.time_budget, _T0)
    if not torch.cuda.is_available():
        print("gluon_bwd: needs a CUDA GPU (an sm_90 one for the Gluon backward)", file=sys.stderr)
        return 2
    header = (f"{'d':>4} {'causal':>6} {'N':>6} {'portbl':>7} {'tma':>7} {'gluon':>7} {'best config':>{CONFIG_WIDTH}} "
              f"{'vs tma':>6} {'cudnn':>7} {'vs cud':>6} {'flash':>7}")
    return sweep(args, budget, "gluon_bwd", glu,
                 lambda d, causal, n, cfgs: run_point(d, causal, n, cfgs, budget, args.rep_ms, not args.no_sdpa,
                                                           args.profile),
                 config_width=CONFIG_WIDTH, line=table_line, header=header,
                 unit="backward TFLOP/s", flops="2.5 x 4·B·H·N²·d (÷2 causal)")


if __name__ == "__main__":
    sys.exit(main())
