"""The attention backward with score options under ``torch.use_deterministic_algorithms(True)``:
the Gluon dK/dV kernel with the portable dQ kernel (``deterministic``) against the portable
backward alone (``portable``, what such calls took before) and the default, non-deterministic Gluon
backward with its fused dQ (``fused``).

    python benchmarks/deterministic_bwd.py [--out benchmarks/results] [--rounds 3]

bf16, hidden 2048, B·N 16k tokens: Gemma-like causal calls (softcap 30, a 4k sliding window) at
d 128 and 16k tokens, non-causal ALiBi at d 128 and 8k, causal softcap at d 64 and 8k, and a
packed varlen batch (eight sequences of 2k, causal, d 128). Each way times the backward alone on
the same saved o and lse (``common.time_ms``, eager, host time included), in rotated rounds;
the median round and the speedup of ``deterministic`` over ``portable`` per case.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import attention_bwd, attention_bwd_gluon, attention_fwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import SEQ_VARLEN, Variant  # noqa: E402

# (name, head dim, causal, tokens per sequence, Variant options)
CASES = [
    ("gemma-d128-causal-16k", 128, True, 16384, dict(left=4096, softcap=30.0)),
    ("alibi-d128-full-8k", 128, False, 8192, dict(alibi=True)),
    ("softcap-d64-causal-8k", 64, True, 8192, dict(softcap=30.0)),
    ("varlen-d128-causal-8x2k", 128, True, 2048, dict(varlen=8)),
]


def inputs(d: int, n: int, options: dict):
    """q, k, v, dO as the kernels take them and the call's Variant (16k tokens, hidden 2048)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    heads = 2048 // d
    options = dict(options)
    seqs = options.pop("varlen", 0)
    if seqs:
        total = seqs * n
        q, k, v, do = (torch.randn(total, heads, d, device="cuda", generator=g).to(torch.bfloat16)
                       .transpose(0, 1).unsqueeze(0) for _ in range(4))
        cu = torch.arange(0, total + 1, n, device="cuda", dtype=torch.int32)
        return q, k, v, do, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu, **options)
    batch = max(1, 16384 // n)
    q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    if options.pop("alibi", False):
        options["alibi"] = torch.rand(heads, device="cuda", generator=g) * 0.1
    return q, k, v, do, Variant(**options)


def parse_args(argv=None):
    return common.gpu_script_args(__doc__, Path(__file__).parent / "results", lambda ap: None, argv)


def main():
    args = parse_args()
    rows = []
    for name, d, causal, n, options in CASES:
        q, k, v, do, variant = inputs(d, n, options)
        scale = d ** -0.5
        o, lse = attention_fwd.attention_forward(q, k, v, scale=scale, causal=causal, causal_offset=0, mask=None,
                                                 dropout_p=0.0, seed=0, variant=variant)

        def gluon():
            return attention_bwd_gluon.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal,
                                                                variant=variant)

        def portable():
            with hopper_fwd.disabled():
                return attention_bwd.attention_backward(do, q, k, v, o, lse, None, scale=scale, causal=causal,
                                                        causal_offset=0, mask=None, dropout_p=0.0, seed=0,
                                                        variant=variant)

        ways = {"fused": (gluon, False), "deterministic": (gluon, True), "portable": (portable, True)}
        times = {way: [] for way in ways}
        try:
            for order in common.balanced_rounds(ways, args.rounds):
                for way in order:
                    fn, deterministic = ways[way]
                    torch.use_deterministic_algorithms(deterministic)
                    times[way].append(common.time_ms(fn, rep_ms=50))
        finally:
            torch.use_deterministic_algorithms(False)
        med = {way: sorted(t)[len(t) // 2] for way, t in times.items()}
        rows.append({"case": name, "d": d, "causal": causal, "n": n, "times_ms": times, "median_ms": med,
                     "deterministic_over_portable": med["portable"] / med["deterministic"]})
        print(f"{name:<26} fused {med['fused']:.3f}  deterministic {med['deterministic']:.3f}  "
              f"portable {med['portable']:.3f} ms  deterministic/portable speedup "
              f"{med['portable'] / med['deterministic']:.2f}x", flush=True)
        del q, k, v, do, o, lse
        torch.cuda.empty_cache()
    print(f"wrote {common.write_json(args.out, 'deterministic_bwd', rows)}")


if __name__ == "__main__":
    main()
