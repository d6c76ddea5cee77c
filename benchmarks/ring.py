"""Ring attention over W GPUs against one (tokens/s, scaling efficiency, communication hidden under
compute): a thin script over ``flashattn_lite.bench.ring``, one process per GPU.

    torchrun --nproc-per-node 2 benchmarks/ring.py [--quick] [--lengths 16k,64k]
    python benchmarks/ring.py [--quick]               # launches itself: one process per GPU (2 on CPU)
    python benchmarks/ring.py --backend gloo          # CPU smoke run, seconds

Results go to ``benchmarks/results/`` unless ``--out`` says otherwise (rank 0 writes them).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn_lite.cli import run_script  # noqa: E402

if __name__ == "__main__":
    if "WORLD_SIZE" not in os.environ:  # not under torchrun (e.g. gpu_check.sh's BENCH): become it
        import torch
        from torch.distributed.run import main as torchrun
        nproc = max(torch.cuda.device_count(), 2)
        sys.exit(torchrun(["--standalone", "--nproc-per-node", str(nproc), __file__, *sys.argv[1:]]))
    sys.exit(run_script("ring", Path(__file__).resolve().parent / "results"))
