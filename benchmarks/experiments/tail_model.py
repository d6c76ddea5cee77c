"""The key-tile cost model behind NOTES' causal tail entries (2026-11-29 21:53, 22:34, 22:44): the
most loaded of 132 programs against the mean, for the pairs dealt round-robin, the sorted tail
(``sorted_tail_slot``, through the CPU tests' reference) and the sorted tail in groups of heads.
A tile costs its key tiles plus ``ovh``. No GPU, no triton kernel:

    python benchmarks/experiments/tail_model.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_attention_gluon_persistent import sorted_tail_reference  # noqa: E402

PROGRAMS = 132
SHAPES = [("d64 2k", 256, 16), ("d64 4k", 128, 32), ("d128 2k", 128, 16), ("d128 4k", 64, 32), ("d128 8k", 32, 64)]


def pairs_deal(n_bh, n_m):
    deal = [[] for _ in range(PROGRAMS)]
    units = [[(bh, k), (bh, n_m - 1 - k)] for bh in range(n_bh) for k in range(n_m // 2)]
    for u, tiles in enumerate(units):
        deal[u % PROGRAMS] += tiles
    return deal


def grouped_tail_deal(n_bh, n_m, groups):
    """The sorted tail with its heads split into ``groups`` runs, each sorted on its own."""
    pairs = n_m // 2
    units = [(bh, k) for bh in range(n_bh) for k in range(pairs)]
    head_units = max(len(units) // PROGRAMS - 1, 0) * PROGRAMS
    deal = [[] for _ in range(PROGRAMS)]
    for u, (bh, k) in enumerate(units[:head_units]):
        deal[u % PROGRAMS] += [(bh, k), (bh, n_m - 1 - k)]
    tail = units[head_units:]
    heads = sorted({bh for bh, _ in tail})
    per = -(-len(heads) // groups)
    order = []
    for g in range(groups):
        part = [t for t in tail if t[0] in set(heads[g * per:(g + 1) * per])]
        order += ([(bh, k) for bh, k in sorted(part, key=lambda t: (t[1], t[0]))]
                  + [(bh, n_m - 1 - k) for bh, k in sorted(part, key=lambda t: (-t[1], t[0]))])
    for g, tile in enumerate(order):
        r, place = divmod(g, PROGRAMS)
        deal[place if r % 2 == 0 else PROGRAMS - 1 - place].append(tile)
    return deal


def imbalance(deal, n_m, ovh):
    loads = [sum(n_m - heavy + ovh for _, heavy in tiles) for tiles in deal]
    return max(loads) / (sum(loads) / PROGRAMS)


if __name__ == "__main__":
    for name, n_bh, n_m in SHAPES:
        row = [f"{name:8s}"]
        for ovh in (0, 1, 2, 4, 8):
            row.append(f"ovh {ovh}: pairs {imbalance(pairs_deal(n_bh, n_m), n_m, ovh):.4f} "
                       f"sorted {imbalance(sorted_tail_reference(n_bh, n_m, PROGRAMS), n_m, ovh):.4f}")
        row.append("groups 2/3 (ovh 1): " + " / ".join(
            f"{imbalance(grouped_tail_deal(n_bh, n_m, g), n_m, 1):.4f}" for g in (2, 3)))
        print("  ".join(row))
