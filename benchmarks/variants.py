"""Cost of the attention variants (sliding window, softcap / sinks / ALiBi, varlen), same run.

    python benchmarks/variants.py [--groups window,options,varlen] [--n 32k] [--window 4k] ...

A thin script over ``flashattn_lite.bench.variants`` (also ``flashattn-lite variants``); results
go to ``benchmarks/results/`` unless ``--out`` says otherwise.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script("variants", Path(__file__).resolve().parent / "results"))
