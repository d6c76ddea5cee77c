"""Compare checkouts of this repository with ``gluon_checkout.py``, each run in its own process:

    python benchmarks/checkout_ab.py --pass forward --out results.json old=.snap new=.snapB old new new old

Names ``NAME=DIR`` the checkouts, then runs them in the order given (alternate them: the GPU's clock
drifts over a run), ``gluon_checkout.py`` from this file's checkout run inside each, and prints each
point's best time per checkout and its gain over the first named one, with whether the result hashes
match it. All runs go into one JSON file (``--out``), as the A/B files under ``benchmarks/results``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("gluon_checkout.py")


def summary(runs: list[tuple[str, dict]], names: list[str]) -> list[str]:
    """One line per point: the best ms of each checkout, its gain over the first, hashes equal."""
    first = names[0]
    points = next(r for n, r in runs if n == first)
    lines = []
    for point in points:
        best = {n: min((r[point]["ms"] for m, r in runs if m == n and "ms" in r.get(point, {})), default=None)
                for n in names}
        hashes = {n: {r[point]["hash"] for m, r in runs if m == n and point in r} for n in names}
        cols = []
        for n in names:
            same = "=" if hashes[n] == hashes[first] else "≠"
            if n == first and best[n] is None:
                cols.append(n)
            elif best[n] is None:
                cols.append(f"{n} {same}")
            elif n == first:
                cols.append(f"{n} {best[n]:.3f}")
            else:
                cols.append(f"{n} {best[n]:.3f} ({best[first] / best[n] - 1:+.1%}) {same}")
        lines.append(f"{point:28s} " + "  ".join(cols))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pass", dest="which", choices=("backward", "forward", "backward256"), default="backward")
    ap.add_argument("--out", required=True, help="the JSON file of every run")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run (> 0)")
    ap.add_argument("runs", nargs="+", help="NAME=DIR for each checkout, then the order of runs by NAME")
    args = ap.parse_args()
    dirs = dict(r.split("=", 1) for r in args.runs if "=" in r)
    order = [r for r in args.runs if "=" not in r]
    unknown = sorted(set(order) - set(dirs))
    if not dirs or not order or unknown:
        ap.error(f"runs: name each checkout NAME=DIR, then the order by NAME (unknown: {unknown})")
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0, got {args.timeout}")
    runs = []
    for name in order:
        t0 = time.time()
        proc = subprocess.run([sys.executable, str(SCRIPT), "--pass", args.which], cwd=dirs[name],
                              capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            print(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        runs.append((name, json.loads(proc.stdout)))
        print(f"{name} ({dirs[name]}): {time.time() - t0:.0f} s", flush=True)
        Path(args.out).write_text(json.dumps({"benchmark": "gluon_checkout", "pass": args.which, "checkouts": dirs,
                                              "runs": [{"checkout": n, "points": r} for n, r in runs]}, indent=1))
    names = list(dict.fromkeys(n for n in order if any(m == n for m, _ in runs)))
    if runs:
        print("\n".join(summary(runs, names)))


if __name__ == "__main__":
    main()
