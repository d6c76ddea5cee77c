"""Attention TFLOP/s (forward, backward, forward+backward) of flashattn_lite and its peers, same run.

    python benchmarks/attention_speed.py [--modes fwd] [--head-dims 128] [--causal yes] ...

A thin script over ``flashattn_lite.bench.attention`` (also ``flashattn-lite speed``); results
go to ``benchmarks/results/`` unless ``--out`` says otherwise.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("speed", Path(__file__).resolve().parent / "results"))
