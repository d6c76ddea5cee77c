"""Decode KV-read bandwidth, ours (contiguous and paged) vs SDPA flash / cuDNN; see flashattn_lite.bench.decode.

    python benchmarks/decode_speed.py --out benchmarks/results/
    python benchmarks/decode_speed.py --batch 1 --lengths 4k 32k --sweep-splits
    python benchmarks/decode_speed.py --quick --time-budget 90   # streams each point; stops starting new ones at 90 s
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flashattn_lite.bench.decode import main  # noqa: E402

if __name__ == "__main__":
    main()
