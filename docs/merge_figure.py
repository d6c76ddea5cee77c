"""Draws docs/merge.png: one softmax row reduced in two halves, each to an (m, ℓ) state, merged.

    python docs/merge_figure.py            # CPU only, a second or two; needs matplotlib

The numbers in the figure are computed, not typed: the two halves' states are merged with
``flashattn_lite.merge.merge_ml_torch`` and the result is checked against the whole row's state.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from flashattn_lite.merge import lse_of_torch, merge_ml_torch, merge_states_torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "merge.png")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = torch.Generator().manual_seed(3)
    n, half = 16, 8
    x = (torch.randn(n, generator=g, dtype=torch.float64) * 1.5)
    x[11] += 2.5                                     # the row's maximum lies in the second half
    xa, xb = x[:half], x[half:]
    m_a, m_b = xa.max(), xb.max()
    l_a, l_b = torch.exp(xa - m_a).sum(), torch.exp(xb - m_b).sum()
    m, l = merge_ml_torch(m_a, l_a, m_b, l_b)
    assert torch.allclose(m, x.max()) and torch.allclose(l, torch.exp(x - x.max()).sum())
    p = torch.softmax(x, 0)

    # Attention: values of each key, partial outputs of each half, merged through their lse.
    v = torch.randn(n, 2, generator=g, dtype=torch.float64)
    o_a = torch.softmax(xa, 0) @ v[:half]
    o_b = torch.softmax(xb, 0) @ v[half:]
    lse_a, lse_b = lse_of_torch(m_a, l_a), lse_of_torch(m_b, l_b)
    o, lse = merge_states_torch(o_a[None], lse_a[None], o_b[None], lse_b[None])
    assert torch.allclose(o[0].double(), p @ v, atol=1e-6)

    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6), gridspec_kw={"width_ratios": [1.2, 1.2, 1]})
    keys = range(n)
    colors = ["C0"] * half + ["C1"] * half

    ax = axes[0]
    ax.bar(keys, x.numpy(), color=colors)
    ax.axhline(float(m_a), color="C0", ls="--", lw=1)
    ax.axhline(float(m_b), color="C1", ls="--", lw=1)
    ax.text(0, float(m_a) + 0.15, f"m_a = {float(m_a):.2f}", color="C0", fontsize=8)
    ax.text(half + 4.5, float(m_b) - 0.35, f"m_b = {float(m_b):.2f}", color="C1", fontsize=8)
    ax.set_title("1. scores of one row, in two blocks", fontsize=10)
    ax.set_xlabel("key j")

    ax = axes[1]
    ax.bar(list(keys)[:half], torch.exp(xa - m_a).numpy(), color="C0", alpha=0.45, label="exp(x − m_a)")
    ax.bar(list(keys)[half:], torch.exp(xb - m_b).numpy(), color="C1", alpha=0.45, label="exp(x − m_b)")
    ax.bar(keys, torch.exp(x - m).numpy(), fill=False, edgecolor="k", lw=1, label="rescaled: exp(x − m)")
    ax.set_title(f"2. states (m_a, ℓ_a = {float(l_a):.2f}), (m_b, ℓ_b = {float(l_b):.2f})", fontsize=10)
    ax.set_xlabel("key j")
    ax.legend(fontsize=7, loc="upper left")

    ax = axes[2]
    ax.axis("off")
    ax.text(0.0, 0.95, "3. merge (exact, any order, any grouping)", fontsize=10, va="top")
    lines = [
        "m = max(m_a, m_b)",
        "ℓ = ℓ_a·exp(m_a − m) + ℓ_b·exp(m_b − m)",
        f"   = {float(l):.4f}  (whole row: {float(torch.exp(x - x.max()).sum()):.4f})",
        "",
        "attention partials, lse = m + log ℓ:",
        "lse = log(exp(lse_a) + exp(lse_b))",
        "O = O_a·exp(lse_a − lse) + O_b·exp(lse_b − lse)",
        f"   = ({float(o[0, 0]):.4f}, {float(o[0, 1]):.4f})",
        f"softmax(x)·V = ({float((p @ v)[0]):.4f}, {float((p @ v)[1]):.4f})",
    ]
    for i, line in enumerate(lines):
        ax.text(0.0, 0.8 - i * 0.095, line, fontsize=9, va="top")

    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
