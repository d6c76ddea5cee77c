"""How much room the tests' tolerance rule leaves our attention on the GPU.

The GPU tests hold a result to err(ours) ≤ 2·err(ref) + eps (``assert_close_to_ref`` in
tests/conftest.py; errors relative to float64), ref ``attention_reference`` in the input's 16-bit
dtype: float32 arithmetic from the 16-bit inputs, its outputs rounded to that dtype (``docs/trust.md``,
"How tight the tolerances are"). For fp16 and bf16, at shapes and options the GPU tests use, this
measures o, dq, dk and dv of ``attention`` (the path it took, from ``explain``) and the reference's
errors, and prints the margin (2·err(ref) + eps) / err(ours): a margin ≥ 1 passes, and the rule
should leave a correct kernel a margin of a few. Writes ``--out/tolerance_margins-<timestamp>.json``.
(Its first run, ``results/tolerance_margins-20261129-154950.json``, also measured the former
reference in 16-bit arithmetic: columns "same"; "mixed" is the rule since.)

    PYTHONPATH=. python benchmarks/tolerance_margins.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite import attention, explain  # noqa: E402
from flashattn_lite.bench.common import format_table, write_json  # noqa: E402
from flashattn_lite.reference import attention_reference, rel_err  # noqa: E402

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}  # the attention tests' eps for o (gradients: twice)
# (name, (B, Hq, Hkv, Nq, Nk, D), options); "alibi": slopes U(0, 0.3) per query head, as the tests draw
CASES = [
    ("plain-causal", (2, 8, 2, 1000, 1000, 64), dict(causal=True)),
    ("alibi-causal", (2, 8, 2, 1000, 1000, 64), dict(causal=True, alibi=True)),
    ("alibi-q257-k4097", (1, 4, 1, 257, 4097, 128), dict(alibi=True)),
    ("alibi-4097", (1, 8, 4, 4097, 4097, 128), dict(alibi=True)),
    ("softcap30-causal", (2, 8, 2, 1000, 1000, 64), dict(causal=True, softcap=30.0)),
    ("all-causal", (2, 8, 2, 1000, 1000, 64), dict(causal=True, window=(259, None), softcap=4.0, alibi=True)),
    ("alibi-d256", (1, 8, 4, 2048, 2048, 256), dict(alibi=True)),
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda"


def outputs(fn, q, k, v, do, dtype=None):
    """(o, dq, dk, dv) of ``fn`` on leaves made from q, k, v (in ``dtype``, default theirs)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]


def measure(name: str, shape, opts: dict, dtype: torch.dtype) -> list[dict]:
    B, Hq, Hkv, Nq, Nk, D = shape
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, do = (torch.randn(B, Hq, Nq, D, device=DEVICE, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Nk, D, device=DEVICE, generator=g).to(dtype) for _ in range(2))
    opts = dict(opts)
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = torch.rand(Hq, device=DEVICE, generator=g) * 0.3
    path = explain(q.requires_grad_(), k, v, **opts).path
    ours = outputs(lambda *t: attention(*t, **opts), q, k, v, do)
    exact = outputs(lambda *t: attention_reference(*t, **opts)[0], q, k, v, do, torch.float64)
    ref = outputs(lambda *t: attention_reference(*t, dtype=dtype, **opts)[0], q, k, v, do)
    rows = []
    for i, tensor in enumerate(("o", "dq", "dk", "dv")):
        eps = EPS[dtype] * (1 if tensor == "o" else 2)
        e, e_ref = rel_err(ours[i], exact[i]), rel_err(ref[i], exact[i])
        rows.append(dict(case=name, shape=list(shape), dtype=str(dtype).replace("torch.", ""), tensor=tensor,
                         path=path, err_ours=e, err_ref=e_ref, eps=eps, margin=(2 * e_ref + eps) / max(e, 1e-30)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder (or .json file) for the results")
    ap.add_argument("--dtypes", default="fp16,bf16", help="comma-separated from fp16, bf16")
    args = ap.parse_args(argv)
    dtypes = [t.strip() for t in args.dtypes.split(",") if t.strip()]
    if not dtypes or any(t not in DTYPES for t in dtypes):
        ap.error(f"--dtypes: expected a comma-separated list from fp16, bf16, got {args.dtypes!r}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the GPU tests' kernels are what it measures)")
    rows = []
    for name, shape, opts in CASES:
        for t in dtypes:
            rows += measure(name, shape, opts, DTYPES[t])
            print(format_table(rows[-4:], ["case", "dtype", "tensor", "err_ours", "err_ref", "margin"]), flush=True)
            torch.cuda.empty_cache()
    path = write_json(args.out, "tolerance_margins", rows)
    print(f"min margin: {min(r['margin'] for r in rows):.3g}; wrote {path}")


if __name__ == "__main__":
    main()
