"""The Gluon backward (or ``--pass forward``: forward) of this checkout at the speed table's points: ms per
call and a hash of its result, one JSON object on stdout; also softcap, ALiBi and a 4k window timed at
d 128 causal 8k, ALiBi non-causal at 8k, and (the backward) a packed varlen batch of 16k tokens with
ALiBi, non-causal, with and without softcap. Run it in two checkouts, alternately, to compare a kernel change in separate
processes (one process cannot hold two versions of a kernel):

    for r in 1 2; do (cd old && python ../new/benchmarks/gluon_checkout.py) > old$r.json
                     (cd new && python benchmarks/gluon_checkout.py) > new$r.json; done

A change that should not alter the result must give the same hashes: dK and dV for the backward (dQ
is left out: its fp32 reduce-adds land in any order), O and the lse for the forward. bf16, B·N 16k
tokens, hidden 2048, random inputs (seeded); also fp16 and the options (softcap, ALiBi, a window,
sinks) on a GQA shape with odd lengths, hashed only. Both time all twelve points of the table (d 64 and 128,
causal or not, 2k/8k/16k), the forward also causal 4k, and both the 8k points with GQA 4:1 (``-gqa4``: a
quarter of the K/V heads, as Llama 3's). ``--pass backward256``: the head dim 256 backward instead
(its two kernels), at the same six lengths and modes, GQA 4:1 at causal 8k, and the options at d 256.
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
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_VARLEN, Variant  # noqa: E402

TABLE_POINTS = [(d, causal, n) for d in (64, 128) for causal in (False, True) for n in (2048, 8192, 16384)]
BACKWARD_POINTS = TABLE_POINTS
FORWARD_POINTS = TABLE_POINTS + [(64, True, 4096), (128, True, 4096)]
OPTIONS = [("fp16", torch.float16, {}), ("softcap", torch.bfloat16, {"softcap": 30.0}),
           ("alibi", torch.bfloat16, {"alibi": True}),
           ("window", torch.bfloat16, {"left": 300}), ("sinks", torch.bfloat16, {"sinks": True})]
GQA_POINTS = [(d, causal, 8192) for d in (64, 128) for causal in (False, True)]
GQA = 4  # query heads per K/V head at GQA_POINTS
WIDE_POINTS = [(256, causal, n) for causal in (False, True) for n in (2048, 8192, 16384)]  # --pass backward256
# the 8k point with each option, timed (causal, but for ALiBi's non-causal path, a step loop of its own)
TIMED_OPTIONS = [("softcap", {"softcap": 50.0}, True), ("alibi", {"alibi": True}, True),
                 ("window4k", {"left": 4096}, True), ("alibi", {"alibi": True}, False)]
VARLEN_TIMED = [("alibi", {"alibi": True}, False), ("softcap+alibi", {"softcap": 50.0, "alibi": True}, False)]


def make_variant(opts: dict, n_heads: int, g: torch.Generator) -> Variant:
    """The options in ``opts`` (softcap, alibi, sinks, left) as a Variant for ``n_heads`` heads."""
    return Variant(softcap=opts.get("softcap", 0.0),
                   alibi=torch.rand(n_heads, device="cuda", generator=g) * 0.05 if opts.get("alibi") else None,
                   sinks=torch.randn(n_heads, device="cuda", generator=g) if opts.get("sinks") else None,
                   left=opts.get("left", -1))


def grad_hash(*tensors) -> str:
    """The bytes of ``tensors`` (dK and dV, or O and the lse; as float32: numpy has no bf16), hashed."""
    return hashlib.sha1(b"".join(t.float().cpu().numpy().tobytes() for t in tensors)).hexdigest()[:12]


def _point(d: int, causal: bool, n: int, group: int, tensors: int):
    """The name of a timed point and its random bf16 inputs: q (and dO, ``tensors`` 4), then k and v with
    H / ``group`` heads; B·N 16k tokens, hidden 2048."""
    B, H = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(B, H, n, d), (B, H // group, n, d), (B, H // group, n, d), (B, H, n, d)][:tensors]
    name = f"d{d}-{'causal' if causal else 'full'}-{n}" + (f"-gqa{group}" if group > 1 else "")
    return name, [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes]


def forward_pass(rep_ms: float) -> dict:
    """``--pass forward``: the Gluon forward at FORWARD_POINTS, GQA_POINTS and with each option."""
    out = {}
    for d, causal, n, group in [p + (1,) for p in FORWARD_POINTS] + [p + (GQA,) for p in GQA_POINTS]:
        name, (q, k, v) = _point(d, causal, n, group, 3)

        def forward():
            return gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal)
        out[name] = {"ms": time_ms(forward, rep_ms=rep_ms), "hash": grad_hash(*forward())}
    for name, dtype, opts in OPTIONS:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, generator=g)
        k, v = (torch.randn(2, 4, 1037, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        variant = make_variant(opts, 8, g) if opts else PLAIN
        out[name] = {"hash": grad_hash(*gluon_fwd.attention_forward_gluon(q, k, v, 0.088, True, variant=variant))}
    for name, opts, causal in TIMED_OPTIONS:  # at d 128
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        variant = make_variant(opts, 16, g)

        def forward():
            return gluon_fwd.attention_forward_gluon(q, k, v, 0.088, causal, variant=variant)
        out[f"d128-{'causal' if causal else 'full'}-8192-{name}"] = {"ms": time_ms(forward, rep_ms=rep_ms),
                                                                      "hash": grad_hash(*forward())}
    return out


def backward_pass(rep_ms: float, d_options: int = 128, points=None) -> dict:
    """The Gluon backward at BACKWARD_POINTS, GQA_POINTS and with each option (``points``: those
    (d, causal, n, group) instead; ``d_options``: the options' head dim)."""
    out = {}
    if points is None:
        points = [p + (1,) for p in BACKWARD_POINTS] + [p + (GQA,) for p in GQA_POINTS]
    for d, causal, n, group in points:
        name, (q, k, v, do) = _point(d, causal, n, group, 4)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal)

        def backward():
            return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=d ** -0.5, causal=causal)
        dk, dv = backward()[1:3]
        out[name] = {"ms": time_ms(backward, rep_ms=rep_ms), "hash": grad_hash(dk, dv)}
    for name, dtype, opts in OPTIONS:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, do = (torch.randn(2, 8, 1000, d_options, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 4, 1037, d_options, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        variant = PLAIN
        if opts:
            variant = make_variant(opts, 8, g)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.088, True, variant=variant)
        dk, dv = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=True,
                                                    variant=None if variant is PLAIN else variant)[1:3]
        out[name] = {"hash": grad_hash(dk, dv)}
    for name, opts, causal in TIMED_OPTIONS:
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v, do = (torch.randn(2, 2048 // d_options, 8192, d_options, device="cuda", dtype=torch.bfloat16,
                                   generator=g) for _ in range(4))
        variant = make_variant(opts, q.shape[1], g)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.088, causal, variant=variant)

        def backward():
            return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=causal, variant=variant)
        out[f"d{d_options}-{'causal' if causal else 'full'}-8192-{name}"] = {
            "ms": time_ms(backward, rep_ms=rep_ms), "hash": grad_hash(*backward()[1:3])}
    for name, opts, causal in VARLEN_TIMED:
        out[f"d{d_options}-{'causal' if causal else 'full'}-varlen-{name}"] = varlen_backward(rep_ms, d_options, opts,
                                                                                             causal)
    return out


def varlen_backward(rep_ms: float, d: int, opts: dict, causal: bool) -> dict:
    """The backward over a packed batch of 8 sequences of 1–4k rows (16k tokens in all), hidden 2048."""
    g = torch.Generator(device="cuda").manual_seed(3)
    lens = [1000, 3000, 2048, 4097, 1, 2500, 1700]
    lens.append(16384 - sum(lens))
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    H = 2048 // d
    q, k, v, do = (torch.randn(16384, H, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1)[None]
                   for _ in range(4))
    variant = make_variant(opts, H, g)._replace(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.088, causal, variant=variant)

    def backward():
        return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=causal, variant=variant)
    return {"ms": time_ms(backward, rep_ms=rep_ms), "hash": grad_hash(*backward()[1:3])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep-ms", type=float, default=300, help="timed milliseconds per point (> 0)")
    ap.add_argument("--pass", dest="which", choices=("backward", "forward", "backward256"), default="backward",
                    help="which Gluon kernel to time (default: backward; backward256: the head dim 256 "
                    "backward at WIDE_POINTS, GQA 4 at causal 8k, and the options at d 256)")
    args = ap.parse_args()
    if not args.rep_ms > 0:
        ap.error(f"--rep-ms must be > 0, got {args.rep_ms}")
    assert torch.cuda.is_available(), "gluon_checkout times Gluon kernels: a GPU is needed"
    if args.which == "forward":
        out = forward_pass(args.rep_ms)
    elif args.which == "backward256":
        out = backward_pass(args.rep_ms, 256, [p + (1,) for p in WIDE_POINTS] + [(256, True, 8192, GQA)])
    else:
        out = backward_pass(args.rep_ms)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
