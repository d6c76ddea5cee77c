"""The Hopper backward (TMA descriptors) against the portable backward and SDPA: TFLOP/s.

Problem: bf16, 16k tokens (B·N = 16384), hidden 2048 (H = 2048 / d), d ∈ {64, 128}, causal or not,
N ∈ {2048, 8192, 16384}, Nq = Nk. At each point the forward runs once (the portable kernel, lse
stored) outside every timing; then, on the same saved o and lse and one dO: our portable backward
(``attention_backward``), the Hopper backward at every config of its sweep
(``attention_bwd_hopper.CONFIGS``; the best is reported with its config), and torch SDPA's cuDNN
and flash backends' backward alone (one forward graph kept, ``autograd.grad`` with
``retain_graph`` rerun, as ``flashattn_lite.bench.peers`` times "bwd"; a backend that errors is
recorded and skipped). Each Hopper config's gradients are first compared with the portable
backward's (‖Δ‖/‖ref‖ and max |Δ| of dq, dk, dv): a config off by more than bf16 rounding is marked
wrong and never reported as the best; one that fails to compile is recorded and skipped. Timing:
``common.time_ms`` (median, cold clean L2). TFLOP/s = 2.5 × the forward's 4·B·H·N²·d / t (the
repo's convention for the backward), halved under causal.

JSON (with the environment) is rewritten after every point to ``--out/hopper_bwd-<timestamp>.json``;
``--time-budget`` (seconds from the script's start): a timing starts only if the longest one so far
would still end within it; the run then ends cleanly with what it has.

    PYTHONPATH=. python benchmarks/hopper_bwd.py --out benchmarks/results --time-budget 200
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # the budget counts from here: imports and CUDA start-up included

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # for hopper_fwd (there already when run as a script)
from flashattn_lite.ops import attention_bwd_hopper as hopper  # noqa: E402
from flashattn_lite.ops import attention_fwd_hopper  # noqa: E402
from flashattn_lite.ops.attention_bwd import attention_backward  # noqa: E402
# The problem (TOKENS, HIDDEN, bf16), the command line, the budget, timing and the sweep: the forward's.
from hopper_fwd import (Budget, argument_parser, inputs, measure, portable_forward, sdpa_backends,  # noqa: E402
                        short, sweep, time_configs)
from hopper_fwd import flops as forward_flops  # noqa: E402

# Two correct bf16 backwards summing in different orders differ by a few bf16 roundings (2⁻⁸
# relative) per element; over a whole gradient the relative norm of the difference stays well
# under 1e-2. A wrong mask or a missed tile moves it to O(1).
REL_TOL = 2e-2
BWD_FACTOR = 2.5  # backward FLOPs / forward FLOPs at Dv = D (flashattn_lite.bench.peers.MODE_GEMM_DIMS)


def parse_args(argv=None):
    return argument_parser(__doc__, "the Hopper backward's", sdpa_switch=True).parse_args(argv)


def flops(b, h, n, d, causal) -> float:
    """The backward's FLOPs: 2.5 × the forward's 4·B·H·N²·d (halved under causal)."""
    return BWD_FACTOR * forward_flops(b, h, n, d, causal)


def grad_diffs(grads, refs) -> dict:
    """Per gradient: ‖a − ref‖ / ‖ref‖ and max |a − ref|, and whether all are within REL_TOL."""
    out, ok = {}, True
    for name, a, r in zip(("dq", "dk", "dv"), grads, refs):
        a, r = a.float(), r.float()
        finite = bool(torch.isfinite(a).all())
        rel = ((a - r).norm() / r.norm().clamp_min(1e-30)).item() if finite else float("inf")
        out[f"rel_diff_{name}"] = rel
        out[f"max_abs_diff_{name}"] = (a - r).abs().max().item() if finite else float("inf")
        ok = ok and rel <= REL_TOL
    out["ok"] = ok
    return out


def portable_backward(do, q, k, v, o, lse, causal):
    with attention_fwd_hopper.disabled():  # attention_backward itself would take the Hopper kernels
        return attention_backward(do, q, k, v, o, lse, None, scale=q.shape[-1] ** -0.5, causal=causal, causal_offset=0,
                                  mask=None, dropout_p=0.0, seed=0)[:3]


def time_hopper(point, saved, refs, configs, budget, rep_ms) -> None:
    """Check and time each config against the portable backward's gradients."""
    do, q, k, v, o, lse = saved
    causal, scale = point["causal"], point["d"] ** -0.5
    work = flops(point["batch"], point["heads"], point["n"], point["d"], causal)

    def run(cfg):
        return hopper.attention_backward_hopper(do, q, k, v, o, lse, scale=scale, causal=causal, config=cfg)

    time_configs(point, configs, run, lambda grads: grad_diffs(grads, refs), work, budget, rep_ms)


def time_sdpa(point, q, k, v, do, refs, budget, rep_ms) -> None:
    """Each SDPA backend's backward alone: one forward graph, ``autograd.grad`` rerun on it."""
    from torch.nn.attention import sdpa_kernel
    causal, d = point["causal"], point["d"]
    work = flops(point["batch"], point["heads"], point["n"], d, causal)
    for name, backend in sdpa_backends():
        if not budget.allows():
            point[name] = {"skipped": "time budget"}
            continue

        def check_and_time(name=name, backend=backend):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            try:
                with sdpa_kernel([backend]):
                    o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=d ** -0.5)

                def bwd():
                    return torch.autograd.grad(o, leaves, do, retain_graph=True)

                grads = bwd()
                torch.cuda.synchronize()
            except Exception as e:  # the backend does not take this problem here
                point[name] = {"error": short(e)}
                return
            point[name] = {**grad_diffs(grads, refs)}
            del grads
            point[name].update(measure(bwd, work, rep_ms))

        budget.step(check_and_time)


def run_point(d, causal, n, configs, budget, rep_ms, sdpa) -> dict:
    """A new point: the forward once, then the portable backward, the Hopper configs, SDPA's backwards."""
    q, k, v, do = inputs(d, n, 4)
    b, h = q.shape[:2]
    work = flops(b, h, n, d, causal)
    point = {"d": d, "causal": causal, "n": n, "batch": b, "heads": h, "gflop": round(work / 1e9, 1)}
    reason = hopper.supported(q, k, v, do, causal=causal)
    if reason is not None:
        point["error"] = f"not covered by the Hopper backward: {reason}"
        return point
    o, lse = portable_forward(q, k, v, causal)
    torch.cuda.synchronize()

    def portable():
        return portable_backward(do, q, k, v, o, lse, causal)

    def time_portable():
        refs = portable()  # autotunes on the first call
        return refs, measure(portable, work, rep_ms)

    refs, point["portable"] = budget.step(time_portable)
    time_hopper(point, (do, q, k, v, o, lse), refs, configs, budget, rep_ms)
    if sdpa:
        time_sdpa(point, q, k, v, do, refs, budget, rep_ms)
    return point


def main(argv=None) -> int:
    args = parse_args(argv)
    budget = Budget(args.time_budget, _T0)
    if not torch.cuda.is_available():
        print("hopper_bwd: needs a CUDA GPU (an sm_90 one for the Hopper backward)", file=sys.stderr)
        return 2
    return sweep(args, budget, "hopper_bwd", hopper,
                 lambda d, causal, n, cfgs: run_point(d, causal, n, cfgs, budget, args.rep_ms, not args.no_sdpa),
                 config_width=40, unit="backward TFLOP/s", flops="2.5 x 4·B·H·N²·d (÷2 causal)")


if __name__ == "__main__":
    sys.exit(main())
