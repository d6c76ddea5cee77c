"""One Gluon forward or backward launch for Nsight Compute to read, after two warm-up launches.

    ncu --clock-control none --kernel-name regex:_attn_fwd_gluon --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        python benchmarks/ncu_profile.py --softcap 50
    ncu ... --kernel-name regex:_attn_bwd_gluon ... python benchmarks/ncu_profile.py --backward
    ncu ... --kernel-name regex:_attn_bwd_gluon_wide ... python benchmarks/ncu_profile.py --backward \
        --head-dim 192 --value-dim 128 --hidden 3072   # MLA's widths (the head dim 256 kernels)

``--peer cudnn``/``flash``: torch SDPA's backend instead, for its counters beside ours.
bf16, B·N tokens (default 32k) of width hidden (default 2048), random inputs. What a kernel is bound
by (the MUFU pipe, the tensor pipe, issue slots, a stall) is read from the counters, not guessed
from timings; ``benchmarks/NOTES.md`` keeps what was read. Run it without ncu to check the call.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd  # noqa: E402
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd  # noqa: E402
from flashattn_lite.ops.attention_fwd import PLAIN, Variant  # noqa: E402


def parse_args(argv=None):
    """The arguments and the sweep config they name (None: the default), every one checked before
    any GPU work: a usage error (exit 2) naming the argument otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192, help="sequence length")
    ap.add_argument("--head-dim", type=int, default=128,
                    help="q's and k's: 64, 128, 256, or a multiple of 8 between them (run padded)")
    ap.add_argument("--value-dim", type=int, default=None, help="v's head dim (default: --head-dim), e.g. MLA's 128")
    ap.add_argument("--tokens", type=int, default=32768, help="B·N")
    ap.add_argument("--hidden", type=int, default=2048, help="H = hidden / d")
    ap.add_argument("--full", action="store_true", help="non-causal (default causal)")
    ap.add_argument("--softcap", type=float, default=0.0, help="c > 0, or 0 for none")
    ap.add_argument("--alibi", action="store_true", help="ALiBi slopes (Hq,)")
    ap.add_argument("--sinks", action="store_true")
    ap.add_argument("--config", default=None, help="a config of the sweep by name (default: the default's)")
    ap.add_argument("--backward", action="store_true", help="the backward kernel (default: the forward)")
    ap.add_argument("--peer", choices=["cudnn", "flash"], default=None,
                    help="torch SDPA's cuDNN or flash backend instead (no options; its kernels' names vary: "
                         "give ncu a broad --kernel-name)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.tokens < args.n or args.hidden % args.head_dim:
        ap.error("--n must be ≥ 1 and ≤ --tokens, --hidden a multiple of --head-dim")
    if gluon_fwd.padded_head_dim(args.head_dim) is None:
        ap.error(f"--head-dim {args.head_dim}: the Gluon kernels take 64, 128, 256 or a multiple of 8 between 32 "
                 "and 256")
    if args.value_dim is not None and gluon_fwd.padded_head_dim(args.head_dim, args.value_dim) is None:
        ap.error(f"--value-dim {args.value_dim}: a multiple of 8 between 32 and 256, or 64, 128, 256")
    if not args.softcap >= 0:
        ap.error(f"--softcap must be > 0, or 0 for none; got {args.softcap}")
    if args.peer is not None and (args.softcap or args.alibi or args.sinks or args.config is not None):
        ap.error("--peer takes no options (--softcap, --alibi, --sinks) and no --config")
    config = None
    if args.config is not None:
        width = gluon_fwd.padded_head_dim(args.head_dim, args.value_dim)  # the kernels' (``kernel_head_dim``)
        sweep = (gluon_bwd.CONFIGS if args.backward else gluon_fwd.CONFIGS)[width]
        names = [c.name for c in sweep]
        if args.config not in names:
            ap.error(f"--config {args.config!r} is not in the d {width} sweep: {', '.join(names)}")
        config = sweep[names.index(args.config)]
    return args, config


def main(argv=None):
    args, config = parse_args(argv)
    assert torch.cuda.is_available(), "ncu_profile launches Gluon kernels: a GPU is needed"
    B, H, d = args.tokens // args.n, args.hidden // args.head_dim, args.head_dim
    dv = d if args.value_dim is None else args.value_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, args.n, w, device="cuda", dtype=torch.bfloat16, generator=g)
                   for w in (d, d, dv, dv))
    variant = PLAIN
    if args.softcap or args.alibi or args.sinks:
        variant = Variant(softcap=args.softcap,
                          alibi=torch.rand(H, device="cuda", generator=g) * 0.05 if args.alibi else None,
                          sinks=torch.randn(H, device="cuda", generator=g) if args.sinks else None)
    causal, scale = not args.full, d ** -0.5
    if args.peer is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = SDPBackend.CUDNN_ATTENTION if args.peer == "cudnn" else SDPBackend.FLASH_ATTENTION
        q.requires_grad_(args.backward)
        with sdpa_kernel(backend):
            for _ in range(3):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                if args.backward:
                    o.backward(do)
        torch.cuda.synchronize()
        print(f"B {B} H {H} N {args.n} d {d} dv {dv} causal {causal} SDPA {args.peer}")
        return
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, variant=variant,
                                               config=None if args.backward else config)
    for _ in range(3):  # two warm-up launches, then the one ncu reads
        if args.backward:
            gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal, config=config,
                                               variant=variant)
        else:
            gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, variant=variant, config=config)
    torch.cuda.synchronize()
    print(f"B {B} H {H} N {args.n} d {d} dv {dv} causal {causal} softcap {args.softcap} alibi {args.alibi} "
          f"sinks {args.sinks} {'backward' if args.backward else 'forward'} config {config.name if config else 'default'}")


if __name__ == "__main__":
    main()
