"""GPU diagnostic for the 128-key MLA backward (``_attn_bwd_gluon_mla_kernel``).

For each suspect call of tests/test_attention_gluon_value_dim.py (192 / 128, causal), run the default
backward (the 128-key programs) REPEATS times and report:
  - whether dk and dv are bit-identical across repeats (they are one program's sums, in a fixed
    order: any difference means a race, not rounding);
  - the relative errors against float64 and against the 64-key one pass (WIDE_ONE_PASS);
  - non-finite values.
With --load, a second CUDA stream keeps the GPU busy with matmuls meanwhile (the 15-worker run's
contention, which the solo run of the new test did not have).

    PYTHONPATH=. python benchmarks/experiments/mla_128_diag.py [--repeats 20] [--load]
"""
import argparse
import sys

import torch

sys.path.insert(0, "tests")
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.reference import rel_err  # noqa: E402

SHAPES = [(2, 4, 2, 17, 17), (1, 4, 4, 4097, 4097), (1, 4, 2, 1000, 4097), (1, 2, 2, 4097, 1000),
          (1, 4, 4, 1000, 1000), (2, 2, 1, 4097, 4097), (2, 8, 8, 2048, 2048)]


def make(shape, dtype, seed=0):
    b, hq, hkv, nq, nk = shape
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to("cuda", dtype)  # noqa: E731
    return r(b, hq, nq, 192), r(b, hkv, nk, 192), r(b, hkv, nk, 128), r(b, hq, nq, 128)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--load", action="store_true")
    args = ap.parse_args()
    side = torch.cuda.Stream()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for dtype in (torch.float16, torch.bfloat16):
        for shape in SHAPES:
            q, k, v, do = make(shape, dtype)
            scale = 192 ** -0.5
            o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, True)
            assert gluon_bwd.default_config(256, True, max(shape[3:]), False, 128, None, qk_dim=192).mla
            first, diffs, nonfinite = None, 0, 0
            for _ in range(args.repeats):
                if args.load:
                    with torch.cuda.stream(side):
                        for _ in range(4):
                            big @ big
                g = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=True)
                nonfinite += sum(int(not torch.isfinite(t).all()) for t in g)
                if first is None:
                    first = g
                else:
                    diffs += int(not (torch.equal(g[1], first[1]) and torch.equal(g[2], first[2])))
            torch.cuda.synchronize()
            old = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=True,
                                                     config=gluon_bwd.WIDE_ONE_PASS)
            leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
            from flashattn_lite.reference import attention_reference
            ref = torch.autograd.grad(attention_reference(*leaves, causal=True, scale=scale)[0], leaves, do.double())
            errs = " ".join(f"{n} {rel_err(a, r):.2e}/{rel_err(b, r):.2e}"
                            for n, a, b, r in zip(("dq", "dk", "dv"), first, old, ref))
            print(f"{str(dtype):15} {shape}: dk/dv runs differing {diffs}/{args.repeats - 1}, non-finite {nonfinite}; "
                  f"err new/one-pass {errs}", flush=True)


if __name__ == "__main__":
    main()
