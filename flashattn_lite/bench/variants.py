"""What the attention variants cost: sliding window, softcap, sinks, ALiBi and varlen batches.

Three groups of points, every column of a group measured in the same process on the same inputs:

- ``window``: causal attention at one long N, full against a window of W keys
  (``window=(W - 1, 0)``), and FlexAttention's sliding-window block mask where it runs. Speed-up
  over full causal, and TFLOP/s counted on the (query, key) pairs each actually computes, so a
  kernel that visits only the band scores the same TFLOP/s as the full one.
- ``options``: plain causal attention against each of softcap, sinks and ALiBi, and all of them
  together, at one N, and FlexAttention's causal attention without and with a softcap
  ``score_mod`` (its own cost of softcap, the peer's figure); the cost of each over its own plain
  case, forward and backward (cases timed in turn over
  ``--rounds`` rounds, default 3, the median of each; the GPU's SM clock, power and temperature are
  printed after each round, and each case's fastest and slowest round are kept in the JSON).
- ``varlen``: a packed batch of mixed lengths (seeded) against the dense kernel on a batch with the
  same number of tokens, TFLOP/s counted per sequence.

FLOPs: 4·H·d per visible (query, key) pair forward (two matmuls), the backward 2.5× that.
"""
from __future__ import annotations

import argparse

import torch

from . import common

GROUPS = ("window", "options", "varlen")
DEFAULTS = {
    "cuda": dict(n=32768, window=4096, options_n=8192, tokens=32768, head_dim=128, hidden=2048, rep_ms=100.0,
                 rounds=3),
    "cpu": dict(n=512, window=64, options_n=256, tokens=512, head_dim=32, hidden=128, rep_ms=20.0, rounds=3),
}
QUICK = {"cuda": dict(rep_ms=50.0), "cpu": dict()}
COLUMNS = ["group", "case", "mode", "ms", "tflops", "speedup", "cost"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shapes (defaults: GPU bf16, d 128, hidden 2048, N 32k with a 4k window, options "
                             "at 8k, varlen over 32k tokens)")
    g.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated from {', '.join(GROUPS)}")
    g.add_argument("--n", type=common.parse_size, help="sequence length of the window group")
    g.add_argument("--window", type=common.parse_size, help="window size W in keys (causal, W − 1 to the left)")
    g.add_argument("--options-n", type=common.parse_size, help="sequence length of the options group")
    g.add_argument("--tokens", type=common.parse_size, help="tokens of the varlen batch")
    g.add_argument("--head-dim", type=int, help="head dimension d")
    g.add_argument("--hidden", type=int, help="model width; H = hidden / d")
    g.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="GPU default bf16, CPU fp32")
    g.add_argument("--no-flex", action="store_true", help="skip FlexAttention's peers (window, softcap)")
    s = p.add_argument_group("run")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    s.add_argument("--rep-ms", type=float, help="timing repetitions per point, in ms")
    s.add_argument("--rounds", type=int, help="rounds of the options group's interleaved timing (default 3)")
    common.add_run_arguments(s)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _pairs_causal_window(n: int, w: int | None) -> int:
    """Visible (query, key) pairs of causal attention over n tokens with a window of w keys."""
    if w is None or w >= n:
        return n * (n + 1) // 2
    return w * (w + 1) // 2 + (n - w) * w


def _tflops(pairs: int, heads: int, d: int, ms: float, mode: str) -> float:
    flops = 4 * heads * d * pairs * (1.0 if mode == "fwd" else 3.5)
    return flops / (ms * 1e-3) / 1e12


def _timers(fn, leaves, rep_ms):
    """{mode: ms} for the forward alone and forward+backward."""
    return {mode: common.time_ms(step, rep_ms=rep_ms) for mode, step in _steps(fn, leaves).items()}


def _steps(fn, leaves):
    """{mode: callable}: the forward alone, and forward+backward (warmed up here)."""
    grad_out = None

    def step():
        nonlocal grad_out
        o = fn()
        if grad_out is None:
            grad_out = torch.randn_like(o)
        torch.autograd.grad(o, leaves, grad_out)

    common.warm_up(step, "fwd+bwd")
    return {"fwd": fn, "fwd+bwd": step}


def _interleaved(steps: dict, rep_ms: float, rounds: int = 3) -> dict:
    """{(case, mode): each round's ms} timing every case once per round, cases in turn: a drift of
    the card's clocks or temperature during the run then moves every case alike instead of the later
    ones (the options' costs are a few percent, the size of that drift). The rounds' orders are a
    balanced design (``common.balanced_rounds``), so no case always follows the same one: a power-hungry case (softcap) leaves the clock
    low for the next for a while, which read as a 12–13% cost of sinks over two runs in which sinks
    always came after softcap (interleaved directly, sinks cost 0.6%; NOTES, 2026-11-25)."""
    times = {key: [] for key in steps}
    for r, order in enumerate(common.balanced_rounds(steps, rounds)):
        for key in order:
            times[key].append(common.time_ms(steps[key], rep_ms=rep_ms))
        state = common.gpu_state()
        if state:
            print(f"  round {r + 1}/{rounds}: {state}", flush=True)
    return times


def _qkv(b, h, n, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3)]


def _flex_window(q, k, v, w):
    """FlexAttention with a causal sliding-window block mask, compiled (None where unavailable)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    n = q.shape[2]
    block_mask = create_block_mask(lambda b, h, qi, kv: (kv <= qi) & (qi - kv < w), None, None, n, n,
                                   device=q.device)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda: compiled(q, k, v, block_mask=block_mask)


def _flex_softcap(q, k, v, softcap: float | None):
    """FlexAttention, causal, with a softcap ``score_mod`` when ``softcap`` is given, compiled (None
    where unavailable)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    n = q.shape[2]
    block_mask = create_block_mask(lambda b, h, qi, kv: kv <= qi, None, None, n, n, device=q.device)
    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, qi, kv):
            return softcap * torch.tanh(score / softcap)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)


def _window_group(cfg, writer, dtype, device, use_flex):
    from ..ops.attention import attention
    n, w, d = cfg["n"], cfg["window"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    q, k, v = _qkv(1, h, n, d, dtype, device)
    cases = [("full causal", None, lambda: attention(q, k, v, causal=True)),
             (f"window {w}", w, lambda: attention(q, k, v, causal=True, window=(w - 1, 0)))]
    if use_flex and device == "cuda":
        flex = _flex_window(q, k, v, w)
        if flex is not None:
            cases.append((f"flex window {w}", w, flex))
    base = {}
    for name, width, fn in cases:
        if not writer.start(group="window", case=name):
            continue
        try:
            common.warm_up(fn, name)
            times = _timers(fn, (q, k, v), cfg["rep_ms"])
        except Exception as e:  # a peer that does not run here is reported, not fatal
            print(f"  {name}: not measured ({type(e).__name__}: {str(e)[:120]})", flush=True)
            continue
        for mode, ms in times.items():
            base.setdefault(mode, ms)
            writer.add(dict(group="window", case=name, mode=mode, n=n, window=width, heads=h, head_dim=d, ms=ms,
                            tflops=_tflops(_pairs_causal_window(n, width), h, d, ms, mode),
                            speedup=base[mode] / ms))


def _options_group(cfg, writer, dtype, device, use_flex):
    from ..ops.attention import attention
    n, d = cfg["options_n"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    b = max(1, cfg["tokens"] // n)
    q, k, v = _qkv(b, h, n, d, dtype, device, seed=1)
    g = torch.Generator(device=device).manual_seed(2)
    sinks = torch.randn(h, device=device, generator=g).requires_grad_()
    slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device) / h)  # ALiBi's geometric slopes
    cases = [("plain", {}), ("softcap 50", dict(softcap=50.0)), ("sinks", dict(sinks=sinks)),
             ("alibi", dict(alibi_slopes=slopes)),
             ("all three", dict(softcap=50.0, sinks=sinks, alibi_slopes=slopes))]
    steps = {}
    for name, opts in cases:
        if not writer.start(group="options", case=name):
            continue
        fn = lambda opts=opts: attention(q, k, v, causal=True, **opts)
        common.warm_up(fn, name)
        leaves = (q, k, v) + ((sinks,) if "sinks" in opts else ())
        steps.update({(name, mode): step for mode, step in _steps(fn, leaves).items()})
    if use_flex and device == "cuda":
        for name, softcap in (("flex plain", None), ("flex softcap 50", 50.0)):
            if not writer.start(group="options", case=name):
                continue
            try:
                fn = _flex_softcap(q, k, v, softcap)
                if fn is None:
                    continue
                common.warm_up(fn, name)
                steps.update({(name, mode): step for mode, step in _steps(fn, (q, k, v)).items()})
            except Exception as e:  # a peer that does not run here is reported, not fatal
                print(f"  {name}: not measured ({type(e).__name__}: {str(e)[:120]})", flush=True)
    times = _interleaved(steps, cfg["rep_ms"], cfg["rounds"])
    base = {}
    for (name, mode), rounds in times.items():
        ms = sorted(rounds)[len(rounds) // 2]
        if name == "flex plain":  # the peer's costs are over its own plain case
            base[mode, "flex"] = ms
        base.setdefault(mode, ms)
        writer.add(dict(group="options", case=name, mode=mode, n=n, batch=b, heads=h, head_dim=d, ms=ms,
                        ms_min=min(rounds), ms_max=max(rounds),
                        tflops=_tflops(b * _pairs_causal_window(n, None), h, d, ms, mode),
                        cost=ms / base[(mode, "flex") if name.startswith("flex") else mode] - 1.0))


def mixed_lengths(tokens: int, seed: int = 0, lo: int = 128) -> list[int]:
    """Sequence lengths drawn log-uniformly between ``lo`` and tokens/4, summing to ``tokens``."""
    g = torch.Generator().manual_seed(seed)
    lens, left = [], tokens
    hi = max(lo + 1, tokens // 4)
    while left > 0:
        x = int(torch.exp(torch.empty(()).uniform_(float(torch.log(torch.tensor(lo))),
                                                   float(torch.log(torch.tensor(hi))), generator=g)))
        x = min(x, left)
        lens.append(x)
        left -= x
    return lens


def _varlen_group(cfg, writer, dtype, device):
    from ..ops.attention import attention, attention_varlen
    tokens, d = cfg["tokens"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    lens = mixed_lengths(tokens)
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    g = torch.Generator(device=device).manual_seed(3)
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    pairs = sum(n * (n + 1) // 2 for n in lens)
    mean = tokens // len(lens)
    dense_n = 1 << max(0, (mean - 1).bit_length())  # the dense batch: same tokens, a power-of-two length
    dq, dk, dv = _qkv(max(1, tokens // dense_n), h, dense_n, d, dtype, device, seed=4)
    dense_pairs = dq.shape[0] * dense_n * (dense_n + 1) // 2
    cases = [(f"dense B{dq.shape[0]}×{dense_n}", dense_pairs, (dq, dk, dv),
              lambda: attention(dq, dk, dv, causal=True)),
             (f"varlen {len(lens)} seqs", pairs, (q, k, v), lambda: attention_varlen(q, k, v, cu, cu, causal=True))]
    base = {}
    for name, n_pairs, leaves, fn in cases:
        if not writer.start(group="varlen", case=name):
            continue
        common.warm_up(fn, name)
        for mode, ms in _timers(fn, leaves, cfg["rep_ms"]).items():
            tf = _tflops(n_pairs, h, d, ms, mode)
            base.setdefault(mode, tf)
            writer.add(dict(group="varlen", case=name, mode=mode, tokens=tokens, sequences=len(lens), heads=h,
                            head_dim=d, ms=ms, tflops=tf, speedup=tf / base[mode]))


def run(args) -> int:
    device = common.resolve_device(args.device)
    cfg = common.settings(args, DEFAULTS[device], QUICK[device])
    groups = common.split_list(args.groups, GROUPS, "--groups")
    dtype_name = args.dtype or ("bf16" if device == "cuda" else "fp32")
    dtype = _DTYPES[dtype_name]
    if cfg["window"] > cfg["n"] or cfg["head_dim"] < 1 or cfg["head_dim"] > 256:
        raise common.BenchArgumentError("--window must be ≤ --n and --head-dim in [1, 256]")
    if cfg["rounds"] < 1:
        raise common.BenchArgumentError(f"--rounds must be ≥ 1, got {cfg['rounds']}")
    writer = common.ResultWriter(args.out, "variants", columns=COLUMNS, budget_s=args.time_budget,
                                 meta=dict(settings=cfg, dtype=dtype_name, groups=groups))
    with writer:
        if "window" in groups:
            _window_group(cfg, writer, dtype, device, not args.no_flex)
        if "options" in groups:
            _options_group(cfg, writer, dtype, device, not args.no_flex)
        if "varlen" in groups:
            _varlen_group(cfg, writer, dtype, device)
    paths = writer.finish()
    print()
    print(common.format_table(writer.rows, COLUMNS))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0
