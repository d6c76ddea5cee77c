"""Whether where the Gluon backward's buffers land in memory changes its time. The speed table's 2k
backward rounds fall into two modes from round to round (up to 40% apart) while cuDNN's stay within
5% (NOTES 2026-11-29 04:58); a round is a median over many calls on the same buffers, and the rounds
interleave the peers, whose allocations move ours. This tests that guess:

    python benchmarks/bwd_placement.py --out benchmarks/results
    python benchmarks/bwd_placement.py --trials 40 --points d128-causal-2048,d64-causal-2048-gqa4 --out DIR

Each trial allocates a padding buffer of a random size (a multiple of 512 bytes below 64 MiB,
seeded), then fresh copies of q, k, v, dO and o, and times the backward (median of ``--rep-ms``),
recording the addresses of those copies and of the kernel's buffers (the fp32 dQ buffer, the padded
lse₂ and δ rows, dK, dV). bf16, B·N 16k tokens, hidden 2048, as the speed table. Printed per point:
the trials' fastest and slowest time, the two modes (split at the widest gap between sorted times,
if over 5%), and the address bits (or bits of two buffers' distance) that separate the modes best.
One JSON file with every trial.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import peers  # noqa: E402
from flashattn_lite.bench.common import time_ms, write_json  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402

MODE_GAP = 0.05  # sorted times further apart than this split the trials into two modes
BITS = range(9, 27)  # address bits looked at: 512 B to 64 MiB
PAIRS = [("dq_acc", "q"), ("dq_acc", "do"), ("q", "do"), ("lse2_pad", "delta_pad"), ("dk", "k")]


def parse_point(text: str) -> tuple[int, bool, int, int]:
    """(d, causal, n, group) of ``d128-causal-2048`` or ``d64-full-8192-gqa4``."""
    parts = text.split("-")
    try:
        if len(parts) not in (3, 4) or parts[1] not in ("causal", "full") or not parts[0].startswith("d"):
            raise ValueError
        d, n = int(parts[0][1:]), int(parts[2])
        group = int(parts[3][3:]) if len(parts) == 4 and parts[3].startswith("gqa") else (1 if len(parts) == 3 else 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected points like d128-causal-2048 or d64-full-8192-gqa4, got {text!r}")
    if d not in gluon_bwd.HEAD_DIMS or n <= 0 or group <= 0 or (2048 // d) % group:
        raise argparse.ArgumentTypeError(f"point {text!r}: d in {gluon_bwd.HEAD_DIMS}, n > 0, a group dividing "
                                         f"the {2048 // max(d, 1)} heads")
    return d, parts[1] == "causal", n, group


def _points(text: str) -> list[tuple[int, bool, int, int]]:
    return [parse_point(p) for p in text.split(",") if p]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=_points, default=_points("d128-causal-2048,d64-causal-2048,d128-causal-2048-gqa4"),
                    help="comma-separated points (default d128-causal-2048,d64-causal-2048,d128-causal-2048-gqa4)")
    ap.add_argument("--trials", type=int, default=24, help="placements per point (≥ 4)")
    ap.add_argument("--rep-ms", type=float, default=40, help="timed milliseconds per trial (> 0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the padding sizes")
    ap.add_argument("--out", required=True, help="folder of the JSON result")
    args = ap.parse_args(argv)
    if args.trials < 4:
        ap.error(f"--trials must be ≥ 4, got {args.trials}")
    if not args.rep_ms > 0:
        ap.error(f"--rep-ms must be > 0, got {args.rep_ms}")
    return args


def modes(times: list[float]) -> float | None:
    """The time splitting ``times`` into a fast and a slow mode (the middle of the widest relative gap
    between consecutive sorted times), or None where no gap passes MODE_GAP."""
    s = sorted(times)
    gaps = [(s[i + 1] / s[i] - 1, i) for i in range(len(s) - 1)]
    if not gaps:
        return None
    gap, i = max(gaps)
    return (s[i] + s[i + 1]) / 2 if gap > MODE_GAP else None


def telling_bits(trials: list[dict], split: float, top: int = 3) -> list[dict]:
    """The address bits that separate the slow trials (ms > ``split``) from the fast ones best: for
    each buffer and each PAIRS distance, each bit's share set among slow trials minus among fast
    ones; the ``top`` largest by size."""
    slow = [t for t in trials if t["ms"] > split]
    fast = [t for t in trials if t["ms"] <= split]
    found = []
    values = {name: (lambda t, name=name: t["ptr"][name]) for name in trials[0]["ptr"]}
    values.update({f"{a}-{b}": (lambda t, a=a, b=b: t["ptr"][a] - t["ptr"][b])
                   for a, b in PAIRS if a in trials[0]["ptr"] and b in trials[0]["ptr"]})
    for name, value in values.items():
        for bit in BITS:
            share = [sum((value(t) >> bit) & 1 for t in group) / len(group) for group in (slow, fast)]
            found.append({"what": name, "bit": bit, "slow_share": share[0], "fast_share": share[1],
                          "separation": share[0] - share[1]})
    return sorted(found, key=lambda f: -abs(f["separation"]))[:top]


def run_point(d: int, causal: bool, n: int, group: int, trials: int, rep_ms: float, rng: random.Random) -> dict:
    B, H = max(1, 16384 // n), 2048 // d
    q, k, v, do = (t.detach() for t in peers.Problem(B, H, H // group, n, d, torch.bfloat16, causal,
                                                       "cuda").make_inputs("bwd"))
    scale = d ** -0.5
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal)
    seen = {}
    row_stats = gluon_bwd._row_stats

    def spy(do, o, lse, dlse, n_pad, dq_acc=None):  # the kernel's own buffers, as the call makes them
        out = row_stats(do, o, lse, dlse, n_pad, dq_acc)
        seen.update(dq_acc=dq_acc.data_ptr() if dq_acc is not None else 0,
                    delta_pad=out[0][0].data_ptr(), lse2_pad=out[0][1].data_ptr())
        return out

    runs = []
    gluon_bwd._row_stats = spy
    try:
        for _ in range(trials):
            pad = torch.empty(rng.randrange(512, 64 << 20, 512), dtype=torch.uint8, device="cuda")
            tq, tk, tv, tdo, to = (x.clone() for x in (q, k, v, do, o))

            def backward():
                return gluon_bwd.attention_backward_gluon(tdo, tq, tk, tv, to, lse, scale=scale, causal=causal)
            _, dk, dv = backward()
            ptr = {"q": tq.data_ptr(), "k": tk.data_ptr(), "v": tv.data_ptr(), "do": tdo.data_ptr(),
                   "o": to.data_ptr(), "dk": dk.data_ptr(), "dv": dv.data_ptr(), **seen}
            del dk, dv
            runs.append({"ms": time_ms(backward, rep_ms=rep_ms), "pad_bytes": pad.numel(), "ptr": ptr})
            del pad, tq, tk, tv, tdo, to
    finally:
        gluon_bwd._row_stats = row_stats
    times = [r["ms"] for r in runs]
    split = modes(times)
    return {"d": d, "causal": causal, "n": n, "group": group, "batch": B, "heads": H, "trials": runs,
            "fastest_ms": min(times), "slowest_ms": max(times), "mode_split_ms": split,
            "slow_trials": sum(t > split for t in times) if split else 0,
            "telling_bits": telling_bits(runs, split) if split else []}


def main(argv=None) -> int:
    args = parse_args(argv)
    assert torch.cuda.is_available(), "bwd_placement times the Gluon backward: a GPU is needed"
    rng = random.Random(args.seed)
    points = []
    for d, causal, n, group in args.points:
        p = run_point(d, causal, n, group, args.trials, args.rep_ms, rng)
        points.append(p)
        name = f"d{d}-{'causal' if causal else 'full'}-{n}" + (f"-gqa{group}" if group > 1 else "")
        line = f"{name:24} {p['fastest_ms']:.3f}–{p['slowest_ms']:.3f} ms"
        if p["mode_split_ms"]:
            bits = ", ".join(f"{b['what']} bit {b['bit']} ({b['slow_share']:.2f}/{b['fast_share']:.2f})"
                             for b in p["telling_bits"])
            line += f"  two modes at {p['mode_split_ms']:.3f} ({p['slow_trials']} slow of {args.trials}): {bits}"
        else:
            line += "  one mode"
        print(line, flush=True)
    path = write_json(args.out, "bwd_placement", points, command=" ".join(sys.argv))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
