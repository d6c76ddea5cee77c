"""Short causal GQA backwards: walking the group against the group split over query heads
(``attention_bwd_gluon.group_split``), with cuDNN beside them.

    python benchmarks/gqa_split.py [--out benchmarks/results] [--rounds 5] [--lengths 2048,4096]

bf16, B·N 16k tokens, hidden 2048, causal, GQA 4 and 8, d 64 and 128. ``attention``'s backward as
``flashattn-lite speed`` times it (``autograd.grad`` of one kept forward graph), with
``attention_bwd_gluon.split_min_keys`` set so that the call walks its group (``walk``) or splits it
(``split``), and SDPA's cuDNN backend (``enable_gqa``), in turn over ``--rounds`` rounds; each is
timed eagerly (``eager_ms``, the table's way) and replayed from a CUDA graph (``graph_ms``, the
device's time alone; None where the capture fails).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.bench.peers import PEERS, Problem, timed_callable  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402

WAYS = {"walk": 1 << 62, "split": 0}  # the keys from which each way of ours splits


def parse_args(argv=None):
    def add(ap):
        ap.add_argument("--lengths", type=common.size_list, default=[2048, 4096],
                        help="comma-separated N (default 2k,4k)")
    return common.gpu_script_args(__doc__, Path(__file__).parent / "results", add, argv)


def main():
    args = parse_args()
    lengths = args.lengths
    default = gluon_bwd.split_min_keys
    rows = []
    for d in (64, 128):
        for group in (4, 8):
            for n in lengths:
                H = 2048 // d
                problem = Problem(batch=max(1, 16384 // n), heads=H, kv_heads=H // group, seqlen=n, head_dim=d,
                                  dtype=torch.bfloat16, causal=True, device="cuda")
                q, k, v, do = problem.make_inputs("bwd")
                ours, cudnn = (PEERS[name].build(problem, PEERS[name].check(problem)[1])
                               for name in ("ours", "sdpa-cudnn"))
                fns = {"walk": (ours, timed_callable(ours, q, k, v, do, "bwd")),
                       "split": (ours, timed_callable(ours, q, k, v, do, "bwd")),
                       "cudnn": (cudnn, timed_callable(cudnn, q, k, v, do, "bwd"))}
                times = {name: {"eager_ms": [], "graph_ms": []} for name in fns}
                try:
                    for r in range(args.rounds):
                        for name, (runner, fn) in fns.items():
                            gluon_bwd.split_min_keys = (default if name not in WAYS else
                                                        lambda group, d, keys=WAYS[name]: keys)
                            with runner.context():
                                if r == 0:
                                    fn()
                                times[name]["eager_ms"].append(common.time_ms(fn, rep_ms=50))
                                times[name]["graph_ms"].append(common.time_ms_graph(fn, rep_ms=50))
                finally:
                    gluon_bwd.split_min_keys = default
                row = {"d": d, "group": group, "n": n, "batch": problem.batch, "heads": H, **{
                    name: {**t, "eager_median_ms": sorted(t["eager_ms"])[len(t["eager_ms"]) // 2]}
                    for name, t in times.items()}}
                rows.append(row)
                med = {name: row[name]["eager_median_ms"] for name in fns}
                print(f"d{d} gqa{group} {n:>5}: walk {med['walk']:.3f}  split {med['split']:.3f} "
                      f"({med['walk'] / med['split'] - 1:+.1%})  cudnn {med['cudnn']:.3f}  "
                      f"split/cudnn {med['cudnn'] / med['split']:.3f}x", flush=True)
                del fns, q, k, v, do
                torch.cuda.empty_cache()
    print(f"wrote {common.write_json(args.out, 'gqa_split', rows)}")


if __name__ == "__main__":
    main()
