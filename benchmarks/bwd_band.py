"""The Gluon backward's causal launch order: ms per call for each band of key tiles and number of
banded heads (``attention_bwd_gluon.launch_order``: the last heads' band 0, then band 1, ...), MHA
and GQA, with cuDNN's backward (SDPA, ``enable_gqa``) timed beside it, and the default's pick.

    python benchmarks/bwd_band.py --out benchmarks/results
    python benchmarks/bwd_band.py --bands 2,4,8 --lengths 2048,8192 --groups 1,4 --out DIR

bf16, B·N 16k tokens, hidden 2048 (d 64: 32 query heads, d 128: 16), causal, random inputs. Each
``--bands`` width with every head banded, and bands of 2 on the last one, two and four waves' worth
of heads (``b2h<heads>``); ``head`` is the head-major order. Each band's gradients are
checked against the head-major order's (the same programs in another order: dK and dV bit-identical
but where a GQA launch is split over query heads, ``"split"``, whose dK, dV float32 sums, like dQ's,
take their adds in another order). The output is one JSON file and a table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from flashattn_lite.bench import peers  # noqa: E402
from flashattn_lite.bench.common import time_ms, write_json  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402

DEFAULT_ORDER = gluon_bwd.launch_order


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bands", type=_ints, default=[2, 4, 8, 16], help="band widths in key tiles (default 2,4,8,16)")
    ap.add_argument("--lengths", type=_ints, default=[2048, 4096, 8192, 16384], help="N (default 2k,4k,8k,16k)")
    ap.add_argument("--groups", type=_ints, default=[1, 4, 8], help="query heads per K/V head (default 1,4,8)")
    ap.add_argument("--head-dims", type=_ints, default=[64, 128], help="d (default 64,128)")
    ap.add_argument("--rep-ms", type=float, default=150, help="timed milliseconds per measurement (> 0)")
    ap.add_argument("--out", required=True, help="folder of the JSON result")
    args = ap.parse_args(argv)
    if not args.rep_ms > 0:
        ap.error(f"--rep-ms must be > 0, got {args.rep_ms}")
    if any(d not in gluon_bwd.HEAD_DIMS for d in args.head_dims):
        ap.error(f"--head-dims must be among {gluon_bwd.HEAD_DIMS}, got {args.head_dims}")
    return args


def cudnn_ms(q, k, v, do, rep_ms: float) -> float | None:
    """cuDNN's backward alone, as ``flashattn-lite speed`` times it (its ``sdpa-cudnn`` peer, GQA by
    ``enable_gqa`` where cuDNN takes it), or None where it does not run here."""
    B, H, n, d = q.shape
    problem = peers.Problem(B, H, k.shape[1], n, d, q.dtype, True, "cuda")
    peer = peers.PEERS["sdpa-cudnn"]
    reason, way = peer.check(problem)
    if reason is not None:
        return None
    runner = peer.build(problem, way)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with runner.context():
        return time_ms(peers.timed_callable(runner, *leaves, do, "bwd"), rep_ms=rep_ms)


def run_point(d: int, n: int, group: int, bands: list[int], rep_ms: float) -> dict:
    B, H = max(1, 16384 // n), 2048 // d
    q, k, v, do = (t.detach() for t in peers.Problem(B, H, H // group, n, d, torch.bfloat16, True,
                                                       "cuda").make_inputs("bwd"))
    scale = d ** -0.5
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, True)
    cfg = gluon_bwd.default_config(d, True, n)
    n_tiles = -(-n // cfg.block_n)

    def backward():
        return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=True)

    share = gluon_bwd.group_split(q, k, True, None, cfg)  # a split group: one program per query head
    heads, walked = B * H // group * share, group // share  # the launch's heads, the group a program walks
    point = {"d": d, "n": n, "group": group, "batch": B, "heads": H, "key_tiles": n_tiles, "split": share > 1,
             "default_order": DEFAULT_ORDER(n_tiles, heads, walked, gluon_bwd.gpu_sm_count(q.device)),
             "orders": {}}
    ref = None
    wave = -(-gluon_bwd.gpu_sm_count(q.device) // n_tiles)
    orders = [(n_tiles, 0)] + [(b, heads) for b in bands if b < n_tiles]
    orders += [(2, k * wave) for k in (1, 2, 4) if k * wave < heads]
    for band, banded in orders:
        gluon_bwd.launch_order = lambda *shape, order=(band, banded): order
        try:
            dq, dk, dv = backward()
            if ref is None:
                ref = (dq, dk, dv)
            same = bool(torch.equal(dk, ref[1]) and torch.equal(dv, ref[2]))
            dq_rel = ((dq.float() - ref[0].float()).norm() / ref[0].float().norm()).item()
            name = "head" if banded == 0 else f"b{band}h{banded}"
            point["orders"][name] = {"ms": time_ms(backward, rep_ms=rep_ms), "dkdv_equal": same, "dq_rel": dq_rel}
        finally:
            gluon_bwd.launch_order = DEFAULT_ORDER
    point["default_ms"] = time_ms(backward, rep_ms=rep_ms)
    point["cudnn_ms"] = cudnn_ms(q, k, v, do, rep_ms)
    return point


def main(argv=None) -> int:
    args = parse_args(argv)
    assert torch.cuda.is_available(), "bwd_band times the Gluon backward: a GPU is needed"
    points = []
    for d in args.head_dims:
        for group in args.groups:
            for n in args.lengths:
                p = run_point(d, n, group, args.bands, args.rep_ms)
                points.append(p)
                head = p["orders"]["head"]["ms"]
                cells = " ".join(f"{o}:{r['ms']:.3f}({head / r['ms'] - 1:+.1%}){'' if r['dkdv_equal'] else '!'}"
                                 for o, r in p["orders"].items() if o != "head")
                cud = f"{p['cudnn_ms']:.3f}" if p["cudnn_ms"] else "-"
                print(f"d{d} g{group} {n:>5}  head {head:.3f}  {cells}  default{tuple(p['default_order'])} "
                      f"{p['default_ms']:.3f}  cudnn {cud}", flush=True)
    path = write_json(args.out, "bwd_band", points, command=" ".join(sys.argv))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
