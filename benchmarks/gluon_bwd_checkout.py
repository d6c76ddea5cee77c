"""The Gluon backward of this checkout at the speed table's points: ms per call and a hash of its dK and
dV, one JSON object on stdout; also softcap, ALiBi and a 4k window timed at d 128 causal 8k. Run it
in two checkouts, alternately, to compare a kernel change in separate processes (one process cannot
hold two versions of a kernel):

    for r in 1 2; do (cd old && python benchmarks/gluon_bwd_checkout.py) > old$r.json
                     (cd new && python benchmarks/gluon_bwd_checkout.py) > new$r.json; done

A change that should not alter the result must give the same hashes (dQ is left out: its fp32
reduce-adds land in any order). bf16, B·N 16k tokens, hidden 2048, random inputs (seeded); also
fp16 and the options (softcap, ALiBi, a window, sinks) on a GQA shape with odd lengths, hashed only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))  # the checkout it runs in, not this file's
from flashattn_lite.bench.common import time_ms  # noqa: E402
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import PLAIN, Variant  # noqa: E402

POINTS = [(128, False, 2048), (128, False, 8192), (128, True, 2048), (128, True, 8192), (64, False, 8192),
          (64, True, 8192)]
OPTIONS = [("fp16", torch.float16, {}), ("softcap", torch.bfloat16, {"softcap": 30.0}),
           ("alibi", torch.bfloat16, {"alibi": True}),
           ("window", torch.bfloat16, {"left": 300}), ("sinks", torch.bfloat16, {"sinks": True})]
TIMED_OPTIONS = [("softcap", {"softcap": 50.0}), ("alibi", {"alibi": True}), ("window4k", {"left": 4096})]


def make_variant(opts: dict, n_heads: int, g: torch.Generator) -> Variant:
    """The options in ``opts`` (softcap, alibi, sinks, left) as a Variant for ``n_heads`` heads."""
    return Variant(softcap=opts.get("softcap", 0.0),
                   alibi=torch.rand(n_heads, device="cuda", generator=g) * 0.05 if opts.get("alibi") else None,
                   sinks=torch.randn(n_heads, device="cuda", generator=g) if opts.get("sinks") else None,
                   left=opts.get("left", -1))


def grad_hash(dk, dv) -> str:
    """The bytes of dK and dV (as float32: numpy has no bf16), hashed."""
    return hashlib.sha1(b"".join(t.float().cpu().numpy().tobytes() for t in (dk, dv))).hexdigest()[:12]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep-ms", type=float, default=300, help="timed milliseconds per point (> 0)")
    args = ap.parse_args()
    if not args.rep_ms > 0:
        ap.error(f"--rep-ms must be > 0, got {args.rep_ms}")
    assert torch.cuda.is_available(), "gluon_bwd_checkout times Gluon kernels: a GPU is needed"
    out = {}
    for d, causal, n in POINTS:
        B, H = 16384 // n, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal)

        def backward():
            return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=d ** -0.5, causal=causal)
        dk, dv = backward()[1:3]
        out[f"d{d}-{'causal' if causal else 'full'}-{n}"] = {"ms": time_ms(backward, rep_ms=args.rep_ms),
                                                             "hash": grad_hash(dk, dv)}
    for name, dtype, opts in OPTIONS:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, do = (torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 4, 1037, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        variant = PLAIN
        if opts:
            variant = make_variant(opts, 8, g)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.088, True, variant=variant)
        dk, dv = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=True,
                                                    variant=None if variant is PLAIN else variant)[1:3]
        out[name] = {"hash": grad_hash(dk, dv)}
    for name, opts in TIMED_OPTIONS:  # the d 128 causal 8k point with each option, timed
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v, do = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(4))
        variant = make_variant(opts, 16, g)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.088, True, variant=variant)

        def backward():
            return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=True, variant=variant)
        out[f"d128-causal-8192-{name}"] = {"ms": time_ms(backward, rep_ms=args.rep_ms),
                                           "hash": grad_hash(*backward()[1:3])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
