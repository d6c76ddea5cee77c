"""The Gluon forward's configs at MLA's head dims (q, k 192; v 128), beside cuDNN: TFLOP/s.

At 192 / 128 the forward runs the head dim 256 kernel with Q and K boxes 256 wide and V's 128
(``attention_fwd_gluon._launch``); the d 256 default config (64-key tiles, a 2-deep ring, two Q sets:
224 KiB) was chosen where V's boxes are 256 wide too. With V at 128 the shared memory also holds
128-key tiles with one K slot and V's own ring 2 or 3 deep (``NARROW_V_CONFIGS``: 192 and 224 KiB, one
Q set; with K in 64-column chunks of q's 192 columns, ``k_chunks``, 181 and 213 KB) and K 2 / V 2
(``NARROW_QK_CONFIG``, 230 KB, chunked K only); one tile a program with a 3-deep ring of 64-key tiles
(208 KiB) is timed beside them. (The
first run, ``mla_fwd_configs-20261130-114743.json``, also had the 3-deep 64-key ring with one Q set
and K 2 / V 3.) Each config of ``CONFIGS`` below runs at bf16, B·N 16k tokens, 16 heads, causal or
not, N from ``--lengths``, in rotated rounds with SDPA's cuDNN backend, after checking each config's
o against cuDNN's (max |Δ| ≤ 2⁻⁵: o is a softmax average of N(0, 1) values).

    PYTHONPATH=. python benchmarks/experiments/mla_fwd_configs.py --out benchmarks/results
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402

Config = gluon_fwd.Config
CONFIGS = [Config(2, 64, 2, True, persistent=True),  # the d 256 default (two Q sets)
           *gluon_fwd.NARROW_V_CONFIGS,  # 128-key tiles, one K slot, V's ring 2 or 3 deep
           gluon_fwd.NARROW_QK_CONFIG,  # 128-key tiles, K 2 / V 2 (K in 64-column chunks of q's 192)
           Config(2, 64, 3, True)]  # one tile a program, a 3-deep ring
D, DV, HEADS, TOKENS = 192, 128, 16, 16384


def parse_args(argv=None):
    def add(ap):
        ap.set_defaults(rounds=3)
        ap.add_argument("--lengths", type=common.size_list, default=[2048, 4096, 8192, 16384], help="comma-separated N")
    return common.gpu_script_args(__doc__, Path(__file__).resolve().parents[1] / "results", add, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for causal in (False, True):
        for n in args.lengths:
            b = max(1, TOKENS // n)
            g = torch.Generator().manual_seed(0)
            q, k = (torch.randn(b, HEADS, n, D, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
            v = torch.randn(b, HEADS, n, DV, generator=g).to("cuda", torch.bfloat16)
            scale = D ** -0.5
            flops = 2 * b * HEADS * n * n * (D + DV) / (2 if causal else 1)

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            want = cudnn()
            fns = {"sdpa-cudnn": cudnn}
            for cfg in CONFIGS:
                def run(cfg=cfg):
                    return gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, config=cfg)[0]
                try:
                    err = (run().float() - want.float()).abs().max().item()
                except Exception as e:  # a config that does not compile or launch: recorded, skipped
                    rows.append(dict(config=cfg.name, causal=causal, n=n, error=f"{type(e).__name__}: {e}"[:300]))
                    print(f"{cfg.name:32} causal={causal} N={n}: {rows[-1]['error']}", flush=True)
                    continue
                if not err <= 2 ** -5:
                    rows.append(dict(config=cfg.name, causal=causal, n=n, error=f"WRONG: max |o - cuDNN's| {err:.3g}"))
                    print(f"{cfg.name:32} causal={causal} N={n}: {rows[-1]['error']}", flush=True)
                    continue
                fns[cfg.name] = run
            times = {name: [] for name in fns}
            for order in common.rotated_rounds(list(fns), args.rounds):
                for name in order:
                    times[name].append(common.time_ms(fns[name]))
            for name, ts in times.items():
                ms = sorted(ts)[len(ts) // 2]
                rows.append(dict(config=name, causal=causal, n=n, batch=b, ms=ms, rounds_ms=ts,
                                 tflops=flops / ms / 1e9))
                print(f"{name:32} causal={causal!s:5} N={n:5} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
    path = common.write_json(args.out, "mla_fwd_configs", rows, head_dim=D, value_dim=DV, heads=HEADS, tokens=TOKENS,
                             rounds=args.rounds, command=common.recorded_command(sys.argv, args.out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
