"""First-call cost (cold / warm Triton cache, a new length) and eager decode per call, each first
call in a fresh process; see flashattn_lite.bench.first_call.

    python benchmarks/first_call.py --out benchmarks/results/
    python benchmarks/first_call.py --quick --autotune --time-budget 150
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("first-call", Path(__file__).resolve().parent / "results"))
