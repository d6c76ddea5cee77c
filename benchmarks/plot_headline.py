"""The README's headline figure, drawn from measured results (no GPU needed).

Left: peak memory of forward+backward against sequence length, every method in one H100 run
(``results/memory-20261125-094215.json``, 2026-11-25 09:42). Right: attention TFLOP/s on the same kind
of H100, bf16, at N = 16k, forward and backward, d 64 and d 128, every bar from one run, the
methods timed in turn over three rounds (``results/attention_speed-20261125-082144.json``, 2026-11-25
08:21, ``speed --quick --rounds 3``; the table in docs/benchmarks.md).

    python benchmarks/plot_headline.py                 # writes docs/headline.png
    python benchmarks/plot_headline.py --out fig.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MEMORY = RESULTS / "memory-20261125-094215.json"
SPEED = {64: RESULTS / "attention_speed-20261125-082144.json", 128: RESULTS / "attention_speed-20261125-082144.json"}

MEMORY_METHODS = [("ours", "flashattn_lite", "C0", "o-"), ("flex", "FlexAttention", "C4", "x--"),
                  ("sdpa-cudnn", "SDPA cuDNN", "C2", "s-"), ("sdpa-flash", "SDPA flash (FA2)", "C1", "^-"),
                  ("sdpa-math", "SDPA math", "C7", "d:"), ("naive", "naive (float32 scores)", "C3", "v:")]
SPEED_METHODS = [("ours", "flashattn_lite", "C0"), ("sdpa-flash", "SDPA flash (FA2)", "C1"),
                 ("sdpa-cudnn", "SDPA cuDNN", "C2")]


def _load(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


def _memory_panel(ax) -> None:
    rows = [r for r in _load(MEMORY) if r["mode"] == "fwd+bwd"]
    for method, label, color, style in MEMORY_METHODS:
        pts = sorted((r["N"], r["peak_mib"] / 1024) for r in rows if r["method"] == method and r["status"] == "ok")
        if not pts:
            continue
        ax.plot([n for n, _ in pts], [g for _, g in pts], style, color=color, label=label, ms=4)
        oom = [r["N"] for r in rows if r["method"] == method and r["status"] == "OOM"]
        if oom:
            ax.annotate("OOM", (pts[-1][0], pts[-1][1]), textcoords="offset points", xytext=(4, 4), color=color,
                        fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak memory above inputs (GiB)")
    ax.set_title("memory, fwd+bwd (B 1, H 16, d 128, bf16)", fontsize=10)
    ticks = [2 ** k for k in range(10, 20, 2)]
    ax.set_xticks(ticks, [f"{t // 1024}k" for t in ticks])
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _speed_panel(ax) -> None:
    groups = []
    for d, path in SPEED.items():
        rows = _load(path)
        for mode in ("fwd", "bwd"):
            for causal in (False, True):
                vals = {}
                for r in rows:
                    if (r["head_dim"], r["mode"], r["causal"], r["N"], r["status"]) == (d, mode, causal, 16384, "ok"):
                        vals[r["method"]] = r["tflops"]
                groups.append((f"{mode}\nd{d}{' c' if causal else ''}", vals))
    width = 0.8 / len(SPEED_METHODS)
    for i, (method, label, color) in enumerate(SPEED_METHODS):
        xs = [g + (i - 1) * width for g in range(len(groups))]
        ax.bar(xs, [vals.get(method, 0.0) for _, vals in groups], width, color=color, label=label)
    ax.set_xticks(range(len(groups)), [name for name, _ in groups], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("speed, N 16k, bf16 (c = causal)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "headline.png")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.15]})
    _memory_panel(left)
    _speed_panel(right)
    fig.suptitle("flashattn_lite on an H100 (torch 2.11, triton 3.6): memory and speed 2026-11-25",
                 fontsize=11)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
