"""Long-sequence peak memory (and time) of flashattn_lite and its peers, forward and forward+backward.

    python benchmarks/memory.py [--max-n 1M] [--causal] [--gqa 4] [--methods ours,sdpa-flash] ...

A thin script over ``flashattn_lite.bench.memory`` (also ``flashattn-lite memory``); results
go to ``benchmarks/results/`` unless ``--out`` says otherwise.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("memory", Path(__file__).resolve().parent / "results"))
