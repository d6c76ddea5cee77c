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

``--variants`` (default ``plain``) adds calls with an option or a packed layout (``VARIANTS``), where
cuDNN has no like call: the config such a call took before K 2 / V 2 took them (the d 256 default;
one tile a program on varlen) beside K 2 / V 2 (one tile a program on varlen), its o checked against
the former's. Varlen batches: sequences of N/2 and 3N/2 tokens in turn, B·N tokens in all (at
least one pair: 2N). FLOPs
are the dense call's (halved causal) under a window too: compare configs within a variant.

    PYTHONPATH=. python benchmarks/experiments/mla_fwd_configs.py --out benchmarks/results
    PYTHONPATH=. python benchmarks/experiments/mla_fwd_configs.py --variants varlen,alibi --lengths 4k,8k
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_VARLEN, Variant  # noqa: E402

Config = gluon_fwd.Config
CONFIGS = [Config(2, 64, 2, True, persistent=True),  # the d 256 default (two Q sets)
           *gluon_fwd.NARROW_V_CONFIGS,  # 128-key tiles, one K slot, V's ring 2 or 3 deep
           gluon_fwd.NARROW_QK_CONFIG,  # 128-key tiles, K 2 / V 2 (K in 64-column chunks of q's 192)
           Config(2, 64, 3, True)]  # one tile a program, a 3-deep ring
D, DV, HEADS, TOKENS = 192, 128, 16, 16384
# Options and layouts (``--variants``): Variant's fields; sinks' logits and ALiBi's slopes random (Hq,)
VARIANTS = {"plain": {}, "varlen": dict(seq=SEQ_VARLEN), "softcap": dict(softcap=30.0), "sinks": dict(sinks=True),
            "alibi": dict(alibi=True), "window": dict(left=1024), "window-both": dict(left=1024, right=1024)}


def variant_list(text: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")
    return names


def parse_args(argv=None):
    def add(ap):
        ap.set_defaults(rounds=3)
        ap.add_argument("--lengths", type=common.size_list, default=[2048, 4096, 8192, 16384], help="comma-separated N")
        ap.add_argument("--variants", type=variant_list, default=["plain"],
                        help="comma-separated, of " + ", ".join(VARIANTS))
    return common.gpu_script_args(__doc__, Path(__file__).resolve().parents[1] / "results", add, argv)


def make_call(name, causal, n, g):
    """(q, k, v, variant, FLOPs) of a ``VARIANTS`` call: bf16 on the GPU, B·N 16k tokens."""
    fields = dict(VARIANTS[name])
    if fields.pop("sinks", False):
        fields["sinks"] = torch.randn(HEADS, generator=g).cuda()
    if fields.pop("alibi", False):
        fields["alibi"] = (torch.rand(HEADS, generator=g) * 0.05).cuda()
    if fields.get("seq") == SEQ_VARLEN:
        lens = [n // 2, 3 * n // 2] * max(1, TOKENS // (2 * n))
        cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).cuda()
        fields.update(seq_q=cu, seq_k=cu)
        shapes = [(sum(lens), HEADS, w) for w in (D, D, DV)]  # (1, H, total, ·) views of (total, H, ·)
        q, k, v = (torch.randn(*s, generator=g).to("cuda", torch.bfloat16).transpose(0, 1)[None] for s in shapes)
        flops = sum(2 * HEADS * m * m * (D + DV) for m in lens)
    else:
        b = max(1, TOKENS // n)
        q, k, v = (torch.randn(b, HEADS, n, w, generator=g).to("cuda", torch.bfloat16) for w in (D, D, DV))
        flops = 2 * b * HEADS * n * n * (D + DV)
    return q, k, v, (Variant(**fields) if fields else PLAIN), flops / (2 if causal else 1)


def main(argv=None) -> int:
    args = parse_args(argv)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for variant_name in args.variants:
        for causal in (False, True):
            for n in args.lengths:
                q, k, v, variant, flops = make_call(variant_name, causal, n, torch.Generator().manual_seed(0))
                scale = D ** -0.5
                if variant_name == "plain":
                    def cudnn():
                        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                                    scale=scale)
                    fns, configs = {"sdpa-cudnn": cudnn}, CONFIGS
                else:  # what such a call took before (the d 256 default), then K 2 / V 2
                    fns = {}
                    configs = [gluon_fwd.default_config(256, causal, n, variant.alibi is not None, variant.softcap > 0,
                                                        variant.left >= 0), gluon_fwd.NARROW_QK_CONFIG]
                    if variant.seq == SEQ_VARLEN:
                        configs = [gluon_fwd.one_tile_per_program(c) for c in configs]
                want = None
                for cfg in configs:
                    def run(cfg=cfg):
                        return gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, config=cfg,
                                                                 variant=variant)[0]
                    try:
                        got = run().float()
                    except Exception as e:  # a config that does not compile or launch: recorded, skipped
                        rows.append(dict(variant=variant_name, config=cfg.name, causal=causal, n=n,
                                         error=f"{type(e).__name__}: {e}"[:300]))
                        print(f"{variant_name:12} {cfg.name:32} causal={causal} N={n}: {rows[-1]['error']}", flush=True)
                        continue
                    if want is None:  # the reference: cuDNN's o, or the first config's (the one before)
                        if variant_name != "plain" and cfg != configs[0]:
                            rows.append(dict(variant=variant_name, config=cfg.name, causal=causal, n=n,
                                             error="no reference: the config before failed"))
                            continue
                        want = cudnn().float() if variant_name == "plain" else got
                    err = (got - want).abs().max().item()
                    if not err <= 2 ** -5:
                        rows.append(dict(variant=variant_name, config=cfg.name, causal=causal, n=n,
                                         error=f"WRONG: max |o - the first's| {err:.3g}"))
                        print(f"{variant_name:12} {cfg.name:32} causal={causal} N={n}: {rows[-1]['error']}", flush=True)
                        continue
                    fns[cfg.name] = run
                times = {name: [] for name in fns}
                for order in common.balanced_rounds(list(fns), args.rounds):
                    for name in order:
                        times[name].append(common.time_ms(fns[name]))
                for name, ts in times.items():
                    ms = sorted(ts)[len(ts) // 2]
                    rows.append(dict(variant=variant_name, config=name, causal=causal, n=n, batch=q.shape[0], ms=ms,
                                     rounds_ms=ts, tflops=flops / ms / 1e9))
                    print(f"{variant_name:12} {name:32} causal={causal!s:5} N={n:5} {ms:7.3f} ms "
                          f"{flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
    path = common.write_json(args.out, "mla_fwd_configs", rows, head_dim=D, value_dim=DV, heads=HEADS, tokens=TOKENS,
                             rounds=args.rounds, command=common.recorded_command(sys.argv, args.out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
