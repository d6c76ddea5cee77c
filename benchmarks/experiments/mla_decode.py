"""Decoding against MLA's latent cache (DeepSeek-V2/V3 with the projections absorbed): ``decode`` (on
sm_90 the Gluon kernel, ``ops/decode_mla_gluon.py``), on a contiguous and on a paged cache, the
portable kernel and its configs, beside PyTorch's absorbed attention, on the GPU.

One KV head whose rows are 512 latent + 64 rope columns (576), v the first 512 columns of the same
tensor (``decode.v_from_k``: V taken from the K tile a program loaded), 128 query heads, one new
token, bf16, every sequence full. "decode-paged64" is the same cache in 64-row pages, handed out in
a shuffled order. "portable" is ``decode_forward``'s ``launch["portable"]``; the "m…" rows run the
portable stage 1 at other configs (query rows a program, ``WIDE_BLOCK_M``; BLOCK_N, warps, stages:
``launch["config"]``). Each is checked first against a float32 reference (max |Δo| ≤ 2⁻⁶). The peers:
"einsum", the absorbed attention DeepSeek's reference inference code runs as einsums (scores = q·cacheᵀ,
softmax, · cache[..., :512]), here as batched matmuls; "sdpa", whichever backend
``scaled_dot_product_attention`` picks for these head dims (math, on torch 2.11). TB/s: cache bytes
(B·L·576·2) over the step's time (CUDA graph, cold L2: ``common.time_ms_graph``); TFLOP/s:
2·B·128·L·(576 + 512) FLOPs over it (242 FLOPs a cache byte).

    PYTHONPATH=. python benchmarks/experiments/mla_decode.py --out benchmarks/results
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from flashattn_lite import decode  # noqa: E402
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import decode as dec  # noqa: E402

HQ, D, DV = 128, 576, 512
# (query rows a program, (BLOCK_N, warps, stages)); None: as shipped
CONFIGS = [None, "paged64", "portable", (32, (16, 8, 2)), (16, (32, 8, 2)), (16, (32, 8, 3))]


def parse_args(argv=None):
    def add(ap):
        ap.set_defaults(rounds=3)
        ap.add_argument("--cases", type=common.size_list, default=[1, 8, 32],
                        help="batch sizes (cache length: 32k / B, at least 1k)")
        ap.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help="comma-separated names to time (e.g. decode,decode-paged64); default: all")
    return common.gpu_script_args(__doc__, Path(__file__).resolve().parents[1] / "results", add, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    for b in args.cases:
        n = max(1024, 32768 // b)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(b, HQ, 1, D, generator=g).to("cuda", torch.bfloat16)
        cache = torch.randn(b, 1, n, D, generator=g).to("cuda", torch.bfloat16)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        scale = D ** -0.5
        ref = torch.softmax((q.float() @ cache.float().transpose(-1, -2)) * scale, -1) @ cache[..., :DV].float()
        # the peer: one (128, 576) × (576, L) product a sequence (the head dim squeezed: broadcasting it
        # would copy the cache 128 times), a float32 softmax, then · the latent 512
        latent = cache[:, 0]
        fns = {"einsum": lambda: (torch.softmax((q[:, :, 0] @ latent.transpose(-1, -2)).float() * scale, -1)
                                  .to(q.dtype) @ latent[..., :DV]).unsqueeze(2),
               # whichever SDPA backend takes head dims 576 / 512 with one KV head
               "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, cache, cache[..., :DV], scale=scale,
                                                                                 enable_gqa=True)}
        for name in [n for n in fns if args.only is not None and n not in args.only]:
            del fns[name]
        try:
            if "sdpa" in fns:
                fns["sdpa"]()
        except Exception as e:  # noqa: BLE001 - no backend for these shapes: recorded, not timed
            rows.append(dict(b=b, n=n, impl="sdpa", error=f"{type(e).__name__}: {e}"[:300]))
            del fns["sdpa"]
        # the same rows in 64-row pages, in a shuffled order
        pages = n // 64
        order = torch.randperm(b * pages, generator=g).to("cuda")
        paged = torch.empty(b * pages, 1, 64, D, dtype=cache.dtype, device="cuda")
        paged[order] = cache.reshape(b * pages, 64, D).unsqueeze(1)
        table = order.view(b, pages).to(torch.int32)
        for cfg in CONFIGS:
            name = {None: "decode", "paged64": "decode-paged64", "portable": "portable"}.get(cfg) or \
                f"m{cfg[0]}-bn{cfg[1][0]}-w{cfg[1][1]}-s{cfg[1][2]}"
            if args.only is not None and name not in args.only:
                continue

            def run(cfg=cfg):
                if cfg is None:
                    return decode(q, cache, cache[..., :DV], lens, scale=scale)
                if cfg == "paged64":
                    return decode(q, paged, paged[..., :DV], lens, block_table=table, scale=scale)
                if cfg == "portable":
                    return dec.decode_forward(q, cache, cache[..., :DV], lens, None, scale=scale, num_splits=None,
                                              launch=dict(portable=True))[0]
                wide, dec.WIDE_BLOCK_M = dec.WIDE_BLOCK_M, cfg[0]
                try:
                    return dec.decode_forward(q, cache, cache[..., :DV], lens, None, scale=scale, num_splits=None,
                                              launch=dict(config=cfg[1]))[0]
                finally:
                    dec.WIDE_BLOCK_M = wide
            try:
                err = (run().float() - ref).abs().max().item()
            except Exception as e:  # a config that does not compile or launch: recorded, skipped
                rows.append(dict(b=b, n=n, impl=name, error=f"{type(e).__name__}: {e}"[:300]))
                print(f"B {b} L {n} {name}: {rows[-1]['error']}", flush=True)
                continue
            if not err <= 2 ** -6:
                rows.append(dict(b=b, n=n, impl=name, error=f"WRONG: max |o - reference| {err:.3g}"))
                print(f"B {b} L {n} {name}: {rows[-1]['error']}", flush=True)
                continue
            fns[name] = run
        times = {name: [] for name in fns}
        for order in common.balanced_rounds(list(fns), args.rounds):
            for name in order:
                times[name].append(common.time_ms_graph(fns[name]))
        for name, ts in times.items():
            if None in ts:  # not capturable in a CUDA graph
                rows.append(dict(b=b, n=n, impl=name, error="not timed: no CUDA graph"))
                continue
            ms = sorted(ts)[len(ts) // 2]
            tbps = b * n * D * 2 / ms / 1e9
            tflops = 2 * b * HQ * n * (D + DV) / ms / 1e9
            rows.append(dict(b=b, n=n, impl=name, ms=ms, rounds_ms=ts, kv_tbps=tbps, tflops=tflops))
            print(f"B {b:3} L {n:6} {name:22} {ms * 1e3:8.1f} us {tbps:6.2f} TB/s {tflops:6.1f} TFLOP/s", flush=True)
    path = common.write_json(args.out, "mla_decode", rows, heads=HQ, head_dim=D, value_dim=DV, rounds=args.rounds,
                             command=common.recorded_command(sys.argv, args.out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
