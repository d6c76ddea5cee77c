"""Softmax bandwidth sweep (ours vs torch, device copy as the ceiling): a thin script over
``flashattn_lite.bench.softmax``. Example: ``python benchmarks/softmax_speed.py --out $OUT``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("softmax", Path(__file__).resolve().parent / "results"))
