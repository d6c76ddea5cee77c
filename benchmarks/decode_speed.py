"""Decode KV-read bandwidth, ours (contiguous and paged) vs SDPA flash / cuDNN; see flashattn_lite.bench.decode.

    python benchmarks/decode_speed.py --out benchmarks/results/
    python benchmarks/decode_speed.py --batch 1 --lengths 4k 32k --sweep-splits
    python benchmarks/decode_speed.py --quick --time-budget 90   # streams each point; stops starting new ones at 90 s
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("decode", Path(__file__).resolve().parent / "results"))
