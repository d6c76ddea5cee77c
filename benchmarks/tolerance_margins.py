"""How much room the tests' tolerance rule leaves our attention on the GPU, under two 16-bit references.

The GPU tests hold a result to err(ours) ≤ 2·err(ref) + eps (``assert_close_to_ref`` in
tests/conftest.py; errors relative to float64), ref the reference run in the input's 16-bit dtype
("same"). ``docs/trust.md`` ("How tight the tolerances are") proposes a stricter ref, "mixed": the
reference in float32 from the 16-bit inputs, its outputs rounded to the 16-bit dtype. For fp16 and
bf16, at shapes and options the GPU tests use, this measures o, dq, dk and dv of ``attention`` (the
path it took, from ``explain``) and both refs' errors, and prints the margin (2·err(ref) + eps) /
err(ours) under each rule: a margin ≥ 1 passes, and a rule should leave a correct kernel a margin of a
few. Writes ``--out/tolerance_margins-<timestamp>.json``.

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
    same = outputs(lambda *t: attention_reference(*t, dtype=dtype, **opts)[0], q, k, v, do)
    # float32 from the 16-bit leaves: the gradients come back in the 16-bit dtype through the cast
    mixed = outputs(lambda *t: attention_reference(*t, dtype=torch.float32, **opts)[0].to(dtype), q, k, v, do)
    rows = []
    for i, tensor in enumerate(("o", "dq", "dk", "dv")):
        eps = EPS[dtype] * (1 if tensor == "o" else 2)
        e, e_same, e_mixed = (rel_err(x[i], exact[i]) for x in (ours, same, mixed))
        rows.append(dict(case=name, shape=list(shape), dtype=str(dtype).replace("torch.", ""), tensor=tensor,
                         path=path, err_ours=e, err_same=e_same, err_mixed=e_mixed, eps=eps,
                         margin_same=(2 * e_same + eps) / max(e, 1e-30),
                         margin_mixed=(2 * e_mixed + eps) / max(e, 1e-30)))
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
            print(format_table(rows[-4:], ["case", "dtype", "tensor", "err_ours", "err_same", "err_mixed",
                                           "margin_same", "margin_mixed"]), flush=True)
            torch.cuda.empty_cache()
    path = write_json(args.out, "tolerance_margins", rows)
    print(f"min margin, same: {min(r['margin_same'] for r in rows):.3g}; "
          f"mixed: {min(r['margin_mixed'] for r in rows):.3g}; wrote {path}")


if __name__ == "__main__":
    main()
