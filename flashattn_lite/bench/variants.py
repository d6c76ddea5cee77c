"""What the attention variants cost: sliding window, softcap, sinks, ALiBi and varlen batches.

Three groups of points, every case of a group measured in the same process on the same inputs:

- ``window``: causal attention at one long N, full against a window of W keys
  (``window=(W - 1, 0)``), and FlexAttention's causal and sliding-window block masks where it
  runs. ``speedup``: a method's window time against ITS OWN full-causal time (ours' window over
  ours' full causal, FlexAttention's window over FlexAttention's full causal; ``base`` names the
  case); ``speed_vs_ours``: a peer's case against ours on the same mask (ours' ms / its ms, < 1:
  slower than ours). TFLOP/s are counted on the (query, key) pairs each actually computes, so a
  kernel that visits only the band scores the same TFLOP/s as the full one.
- ``options``: plain causal attention against each of softcap, sinks and ALiBi, and all of them
  together, at one N, and FlexAttention's causal attention without and with a softcap
  ``score_mod`` (its own cost of softcap, the peer's figure); ``cost``: each case over its own
  method's plain case, forward and forward+backward.
- ``varlen``: a packed batch of mixed lengths (seeded) against dense attention doing the same
  work: for each distinct length n of the batch, a dense batch of B = tokens // n sequences of
  length n (as many tokens as the varlen batch, so it fills the GPU as that does), and
  ``dense same sequences``, the sum over the varlen batch's sequences of their length's dense
  batch time ÷ its B: dense time for exactly the varlen batch's (query, key) pairs, each at its
  own length. The varlen row's ``speedup`` is that time over the varlen call's time (equally its
  TFLOP/s over the dense ones on the same pairs; > 1: the packed call is faster than dense calls
  on the same sequences). A dense batch at the mean length would not do the same work: TFLOP/s
  rise with length, and the varlen batch's FLOPs are at longer lengths than its mean
  (``flop_weighted_n``: Σn³ / Σn², about 4050 for the default batch, whose mean is 1489).

Timing: in each group every case is built, warmed up and checked first, then timed once each in an
untimed round (the first run after the builds' idle ran ~3.5% fast), then in turn over
``--rounds`` rounds (default 3) in the orders of a balanced design (``common.balanced_rounds``),
each keeping its median round (``ms``), its fastest and slowest (``ms_min``, ``ms_max``) and every
round (``rounds_ms``); the GPU's SM clock, power and temperature are printed after each round.

Checks: each case's outputs (o, and dq, dk, dv of the forward+backward it times) are compared once
against float64 attention (``reference.attention_reference``, with the case's window, softcap,
sinks, ALiBi or sequences) on batch row 0, query head 0 (the varlen batch: head 0 of every
sequence): ``check_err`` is the largest of max|x − ref| / max|ref| over those tensors (the forward
row: o alone). Past the dtype's tolerance (bf16 3e-2, fp16 and fp32 1e-2; ``attention.py``'s) the
case is recorded as ``wrong`` and not timed; a case that fails to build, run or check is recorded as
``error`` (or ``OOM``) with its note. No speed-up or cost is computed against a base that is not
``ok``.

FLOPs: 4·H·d per visible (query, key) pair forward (two matmuls), the backward 2.5× that.
"""
from __future__ import annotations

import argparse
import collections
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import common
from .attention import _failure

GROUPS = ("window", "options", "varlen")
MODES = ("fwd", "fwd+bwd")
DEFAULTS = {
    "cuda": dict(n=32768, window=4096, options_n=8192, tokens=32768, head_dim=128, hidden=2048, rep_ms=100.0,
                 rounds=3),
    "cpu": dict(n=512, window=64, options_n=256, tokens=512, head_dim=32, hidden=128, rep_ms=20.0, rounds=3),
}
QUICK = {"cuda": dict(rep_ms=50.0), "cpu": dict()}
COLUMNS = ["group", "case", "mode", "status", "ms", "tflops", "speedup", "cost", "base", "speed_vs_ours", "check_err"]


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
    s.add_argument("--rounds", type=int, help="timed rounds of each group's interleaved timing, after one "
                                              "untimed round (default 3)")
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


def _interleaved(steps: dict, rep_ms: float, rounds: int = 3, *, untimed: bool = False,
                 failed: dict | None = None) -> dict:
    """{key: each timed round's ms} timing every step once per round, keys in turn: a drift of the
    card's clocks or temperature during the run then moves every case alike instead of the later
    ones (the options' costs are a few percent, the size of that drift). The rounds' orders are a
    balanced design (``common.balanced_rounds``), so no case always follows the same one: a
    power-hungry case (softcap) leaves the clock low for the next for a while, which read as a
    12–13% cost of sinks over two runs in which sinks always came after softcap (interleaved
    directly, sinks cost 0.6%; NOTES, 2026-11-25). ``untimed``: one round first in the first
    round's order whose times are dropped (the first run after the builds' idle ran ~3.5% fast).
    ``failed``: a step that raises is recorded there ({key: exception}) and left out of the later
    rounds instead of stopping the group."""
    def report(label):
        state = common.gpu_state()
        if state:
            print(f"  {label}: {state}", flush=True)
    return common.in_rounds(steps, rounds, lambda key: common.time_ms(steps[key], rep_ms=rep_ms), untimed=untimed,
                            failed=failed, after_round=report)[0]


def _qkv(b, h, n, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3)]


def _grad_out(like: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded gradient of the output, shaped as ``like`` (every case's o has q's shape here)."""
    g = torch.Generator(device=like.device).manual_seed(seed)
    return torch.randn(like.shape, device=like.device, dtype=like.dtype, generator=g)


# ------------------------------------------------------------------ checks against float64

def reference_slice(q, k, v, do, *, window: tuple | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                    rows: int | None = None) -> list[torch.Tensor]:
    """Float64 [o, dq, dk, dv] of causal attention (bottom-right aligned) over batch row 0, head 0 of
    q, k, v (B, H, N, D), ``do`` the gradient of o, with the case's options (``sinks`` and
    ``alibi_slopes`` per head: their entry 0 is used). Computed ``rows`` queries at a time against
    the keys those queries can see, so a long N needs no N × N score matrix."""
    from .. import reference
    qd, kd, vd, dod = (t[:1, :1].detach().double() for t in (q, k, v, do))
    sinks = None if sinks is None else sinks[:1].detach().double()
    alibi_slopes = None if alibi_slopes is None else alibi_slopes[:1].detach().double()
    nq, nk = qd.shape[2], kd.shape[2]
    off = nk - nq
    left = None if window is None or window[0] is None or window[0] < 0 else window[0]
    rows = rows or max(16, 2 ** 24 // max(1, nk))
    o, dq, dk, dv = (torch.zeros_like(t) for t in (dod, qd, kd, vd))
    for s in range(0, nq, rows):
        e = min(nq, s + rows)
        k0 = 0 if left is None else min(nk, max(0, s + off - left))
        k1 = max(k0, min(nk, e + off))
        qc, kc, vc = (t[:, :, a:b].clone().requires_grad_() for t, a, b in ((qd, s, e), (kd, k0, k1), (vd, k0, k1)))
        oc, _ = reference.attention_reference(qc, kc, vc, causal=True, causal_offset=off + s - k0, window=window,
                                              softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
        gq, gk, gv = torch.autograd.grad(oc, (qc, kc, vc), dod[:, :, s:e])
        o[:, :, s:e] = oc.detach()
        dq[:, :, s:e] = gq
        dk[:, :, k0:k1] += gk
        dv[:, :, k0:k1] += gv
    return [o, dq, dk, dv]


# ------------------------------------------------------------------ cases, timed in turn

@dataclass
class Case:
    """One timed case of a group: ``fn`` runs the forward (or ``make()`` builds it, None where the
    method is unavailable); the forward+backward step differentiates o·``do`` by ``inputs`` and
    ``extra_leaves``; ``reference()`` gives the float64 [o, dq, dk, dv] that ``pick`` of o and of
    the gradients of ``inputs`` are compared with. ``base``: the case its speed-up or cost is
    over; ``ours``: for a peer's case, ours' case on the same mask."""
    name: str
    inputs: tuple
    do: torch.Tensor
    pairs: int
    fn: Callable[[], torch.Tensor] | None = None
    make: Callable[[], Callable | None] | None = None
    extra_leaves: tuple = ()
    reference: Callable[[], list] | None = None
    pick: Callable[[torch.Tensor], torch.Tensor] = lambda t: t[:1, :1]
    base: str | None = None
    ours: str | None = None
    fields: dict = field(default_factory=dict)


class _Unavailable(Exception):
    """A method this torch does not have (FlexAttention)."""


def _prepare(case: Case, dtype) -> tuple[dict, dict]:
    """({mode: timed callable}, {mode: facts}): the case built, warmed up (forward, then
    forward+backward) and checked against ``case.reference``."""
    fn = case.fn if case.fn is not None else case.make()
    if fn is None:
        raise _Unavailable("not available in this torch")
    warm = common.warm_up(fn, case.name)
    leaves = tuple(case.inputs) + tuple(case.extra_leaves)

    def step():
        torch.autograd.grad(fn(), leaves, case.do)

    warm += common.warm_up(step, f"{case.name} fwd+bwd")
    facts = {mode: {"status": "ok", "warmup_s": warm} for mode in MODES}
    if case.reference is not None:
        o = fn()
        got = [case.pick(t) for t in (o, *torch.autograd.grad(o, tuple(case.inputs), case.do))]
        ref = case.reference()
        errors = {"fwd": common.relative_error(got[:1], ref[:1]), "fwd+bwd": common.relative_error(got, ref)}
        del o, got
        for mode in MODES:
            facts[mode]["check_err"] = errors[mode]
            if not errors[mode] <= common.CHECK_TOLERANCE.get(dtype, 1e-2):  # (NaN: wrong)
                facts[mode].update(status="wrong", note=f"output off the float64 reference by {errors[mode]:.3g} "
                                                        "(relative to its largest value)")
    return {"fwd": fn, "fwd+bwd": step}, facts


def run_cases(cases: list[Case], writer, group: str, cfg: dict, dtype) -> dict:
    """{(case, mode): result} of the cases the time budget lets start: each built, warmed up and
    checked, then the ``ok`` ones timed in turn (``_interleaved``: an untimed round, then
    ``cfg["rounds"]`` in a balanced order). A result: ``status`` (ok, wrong, error, OOM,
    unavailable), ``ms`` (the median round, ok only), ``ms_min``, ``ms_max``, ``rounds_ms``,
    ``check_err``, ``warmup_s``, ``note``."""
    results, steps, facts = {}, {}, {}
    for case in cases:
        if not writer.start(group=group, case=case.name):
            continue
        try:
            case_steps, case_facts = _prepare(case, dtype)
        except _Unavailable as exc:
            results.update({(case.name, mode): {"status": "unavailable", "note": str(exc)} for mode in MODES})
            continue
        except Exception as exc:  # a case that does not run here is recorded, not fatal
            failure = _failure(exc)
            print(f"  {case.name}: not measured ({failure['note'][:140]})", flush=True)
            results.update({(case.name, mode): dict(failure) for mode in MODES})
            continue
        for mode in MODES:
            if case_facts[mode]["status"] == "ok":
                steps[case.name, mode] = case_steps[mode]
                facts[case.name, mode] = case_facts[mode]
            else:
                results[case.name, mode] = case_facts[mode]
    failed = {}
    times = _interleaved(steps, cfg["rep_ms"], cfg["rounds"], untimed=True, failed=failed)
    for key in steps:
        if key in failed:
            results[key] = {**facts[key], **_failure(failed[key])}
            continue
        rounds = times[key]
        results[key] = {**facts[key], "ms": sorted(rounds)[len(rounds) // 2], "ms_min": min(rounds),
                        "ms_max": max(rounds), "rounds_ms": rounds}
    return results


def compare(results: dict, cases: list[Case]) -> dict:
    """{(case, mode): {"speedup", "speed_vs_ours", "base_note"}}: ``speedup`` = the ms of the case's
    own base (``Case.base``: ours' full causal for ours' window, FlexAttention's full causal for its
    window) / its ms, 1 for a base itself, None for a case that neither has nor is a base;
    ``speed_vs_ours`` = ours' ms on the same mask / its ms (peers only). None where either side has
    no time (not ok, not run), and ``base_note`` then says why."""
    out = {}
    bases = {c.base for c in cases}
    for case in cases:
        for mode in MODES:
            mine = results.get((case.name, mode))
            if mine is None:
                continue
            ms = mine.get("ms") if mine.get("status") == "ok" else None
            entry = {"speedup": None, "speed_vs_ours": None, "base_note": ""}
            if ms is not None:
                if case.base is None:
                    entry["speedup"] = 1.0 if case.name in bases else None
                else:
                    base = results.get((case.base, mode))
                    if base is not None and base.get("status") == "ok" and base.get("ms"):
                        entry["speedup"] = base["ms"] / ms
                    else:
                        status = "not run" if base is None else base.get("status")
                        entry["base_note"] = f"no speed-up: its base {case.base!r} is {status}"
                if case.ours is not None:
                    theirs = results.get((case.ours, mode))
                    if theirs is not None and theirs.get("status") == "ok" and theirs.get("ms"):
                        entry["speed_vs_ours"] = theirs["ms"] / ms
            out[case.name, mode] = entry
    return out


def _rows(group: str, cases: list[Case], results: dict, heads: int, d: int, metric: str) -> list[dict]:
    """The JSON rows of a group's cases, in the cases' order; ``metric``: "speedup" or "cost"
    (ms / base's ms − 1)."""
    compared = compare(results, cases)
    rows = []
    for case in cases:
        for mode in MODES:
            res = results.get((case.name, mode))
            if res is None:
                continue
            rel = compared[case.name, mode]
            ms = res.get("ms") if res.get("status") == "ok" else None
            note = "; ".join(x for x in (res.get("note", ""), rel["base_note"]) if x)
            row = dict(group=group, case=case.name, mode=mode, status=res["status"], **case.fields, heads=heads,
                       head_dim=d, ms=ms, ms_min=res.get("ms_min"), ms_max=res.get("ms_max"),
                       tflops=_tflops(case.pairs, heads, d, ms, mode) if ms else None)
            if metric == "cost":
                row["cost"] = None if rel["speedup"] is None else 1.0 / rel["speedup"] - 1.0
            else:
                row["speedup"] = rel["speedup"]
            row.update(base=case.base, speed_vs_ours=rel["speed_vs_ours"], check_err=res.get("check_err"),
                       rounds_ms=res.get("rounds_ms"), warmup_s=res.get("warmup_s"), note=note)
            rows.append(row)
    return rows


class _References:
    """Float64 references computed once and shared by the cases with the same options."""

    def __init__(self):
        self._done, self._compute = {}, {}

    def __call__(self, key, compute: Callable[[], list] | None = None) -> Callable[[], list]:
        """The getter of ``key``'s reference: ``compute()`` on the first call of any getter of
        ``key`` (the first to name ``key`` gives ``compute``)."""
        if compute is not None:
            self._compute.setdefault(key, compute)

        def get():
            if key not in self._done:
                self._done[key] = self._compute[key]()
            return self._done[key]
        return get


# ------------------------------------------------------------------ FlexAttention

def _flex_runs(device: str) -> bool:
    """Whether FlexAttention's peers are tried on this device (compiled Triton: CUDA only)."""
    return device == "cuda"


def _flex_window(q, k, v, w: int | None):
    """FlexAttention with a causal (``w`` None) or causal sliding-window block mask of ``w`` keys,
    compiled (None where unavailable)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    n = q.shape[2]
    if w is None:
        mask = lambda b, h, qi, kv: kv <= qi  # noqa: E731
    else:
        mask = lambda b, h, qi, kv: (kv <= qi) & (qi - kv < w)  # noqa: E731
    block_mask = create_block_mask(mask, None, None, n, n, device=q.device)
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


# ------------------------------------------------------------------ the groups

def _window_group(cfg, writer, dtype, device, use_flex):
    from ..ops.attention import attention
    n, w, d = cfg["n"], cfg["window"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    q, k, v = _qkv(1, h, n, d, dtype, device)
    do = _grad_out(q, seed=5)
    refs = _References()
    full_ref = refs("full", lambda: reference_slice(q, k, v, do))
    window_ref = refs("window", lambda: reference_slice(q, k, v, do, window=(w - 1, 0)))
    full, win = "full causal", f"window {w}"
    common_args = dict(inputs=(q, k, v), do=do)
    cases = [Case(full, fn=lambda: attention(q, k, v, causal=True), pairs=_pairs_causal_window(n, None),
                  reference=full_ref, fields=dict(n=n, window=None), **common_args),
             Case(win, fn=lambda: attention(q, k, v, causal=True, window=(w - 1, 0)),
                  pairs=_pairs_causal_window(n, w), reference=window_ref, base=full, fields=dict(n=n, window=w),
                  **common_args)]
    if use_flex and _flex_runs(device):
        cases += [Case(f"flex {full}", make=lambda: _flex_window(q, k, v, None), pairs=_pairs_causal_window(n, None),
                       reference=full_ref, ours=full, fields=dict(n=n, window=None), **common_args),
                  Case(f"flex {win}", make=lambda: _flex_window(q, k, v, w), pairs=_pairs_causal_window(n, w),
                       reference=window_ref, base=f"flex {full}", ours=win, fields=dict(n=n, window=w),
                       **common_args)]
    results = run_cases(cases, writer, "window", cfg, dtype)
    for row in _rows("window", cases, results, h, d, "speedup"):
        writer.add(row)


def _options_group(cfg, writer, dtype, device, use_flex):
    from ..ops.attention import attention
    n, d = cfg["options_n"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    b = max(1, cfg["tokens"] // n)
    q, k, v = _qkv(b, h, n, d, dtype, device, seed=1)
    do = _grad_out(q, seed=6)
    g = torch.Generator(device=device).manual_seed(2)
    sinks = torch.randn(h, device=device, generator=g).requires_grad_()
    slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device) / h)  # ALiBi's geometric slopes
    refs = _References()
    options = [("plain", {}), ("softcap 50", dict(softcap=50.0)), ("sinks", dict(sinks=sinks)),
               ("alibi", dict(alibi_slopes=slopes)),
               ("all three", dict(softcap=50.0, sinks=sinks, alibi_slopes=slopes))]
    fields = dict(n=n, batch=b)
    pairs = b * _pairs_causal_window(n, None)
    cases = []
    for name, opts in options:
        cases.append(Case(name, fn=lambda opts=opts: attention(q, k, v, causal=True, **opts), inputs=(q, k, v),
                          do=do, pairs=pairs, extra_leaves=(sinks,) if "sinks" in opts else (),
                          reference=refs(name, lambda opts=opts: reference_slice(q, k, v, do, **opts)),
                          base=None if name == "plain" else "plain", fields=fields))
    if use_flex and _flex_runs(device):
        for name, softcap, ours in (("flex plain", None, "plain"), ("flex softcap 50", 50.0, "softcap 50")):
            cases.append(Case(name, make=lambda softcap=softcap: _flex_softcap(q, k, v, softcap), inputs=(q, k, v),
                              do=do, pairs=pairs, reference=refs(ours), base=None if softcap is None else "flex plain",
                              ours=ours, fields=fields))
    results = run_cases(cases, writer, "options", cfg, dtype)
    for row in _rows("options", cases, results, h, d, "cost"):
        writer.add(row)


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


def dense_plan(lens: list[int], tokens: int) -> list[tuple[int, int, int]]:
    """[(n, batch, count)] for each distinct length n of ``lens`` (ascending): the dense batch that
    times it, ``batch`` = tokens // n sequences (as many tokens as the varlen batch, at least one),
    and how many of the varlen batch's sequences have that length."""
    return [(n, max(1, tokens // n), count) for n, count in sorted(collections.Counter(lens).items())]


def dense_same_work(results: dict, plan: list[tuple[int, int, int]], names: list[str], mode: str) -> dict:
    """The result of ``dense same sequences`` in ``mode``: ms = Σ count × (dense batch ms / batch)
    over ``plan`` (the cases ``names``), the dense time of the varlen batch's own sequences; not ok
    (with the failed lengths in its note) where any length has no time."""
    parts = [results.get((name, mode)) for name in names]
    bad = [name for name, r in zip(names, parts) if r is None or r.get("status") != "ok"]
    errors = [r["check_err"] for r in parts if r is not None and r.get("check_err") is not None]
    check = {"check_err": max(errors)} if errors else {}
    if bad:
        statuses = {(results.get((name, mode)) or {}).get("status", "not run") for name in bad}
        status = "error" if "error" in statuses or "not run" in statuses else sorted(statuses)[0]
        return {"status": status, "note": "no time for " + ", ".join(bad), **check}
    ms = sum(count * r["ms"] / batch for (n, batch, count), r in zip(plan, parts))
    return {"status": "ok", "ms": ms, **check}


def _varlen_group(cfg, writer, dtype, device):
    from ..ops.attention import attention, attention_varlen
    tokens, d = cfg["tokens"], cfg["head_dim"]
    h = max(1, cfg["hidden"] // d)
    lens = mixed_lengths(tokens)
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    starts = cu.tolist()
    g = torch.Generator(device=device).manual_seed(3)
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    do = _grad_out(q, seed=7)
    pairs = sum(n * (n + 1) // 2 for n in lens)
    flop_n = sum(n ** 3 for n in lens) / sum(n ** 2 for n in lens)
    plan = dense_plan(lens, tokens)
    def per_seq(t):  # (total, H, D) → its head 0 as (1, 1, total, D)
        return t[:, :1].transpose(0, 1).unsqueeze(0)

    def varlen_reference():
        parts = [reference_slice(*(per_seq(t[a:b]) for t in (q, k, v, do))) for a, b in zip(starts, starts[1:])]
        return [torch.cat(ts, dim=2) for ts in zip(*parts)]

    cases, names = [], []
    for i, (n, b, count) in enumerate(plan):
        dq, dk, dv = _qkv(b, h, n, d, dtype, device, seed=10 + i)
        ddo = _grad_out(dq, seed=100 + i)
        names.append(f"dense B{b}×{n}")
        cases.append(Case(names[-1], fn=lambda dq=dq, dk=dk, dv=dv: attention(dq, dk, dv, causal=True),
                          inputs=(dq, dk, dv), do=ddo, pairs=b * n * (n + 1) // 2,
                          reference=lambda dq=dq, dk=dk, dv=dv, ddo=ddo: reference_slice(dq, dk, dv, ddo),
                          fields=dict(n=n, batch=b, sequences=count)))
    same = Case("dense same sequences", inputs=(), do=do, pairs=pairs,
                fields=dict(tokens=tokens, sequences=len(lens)))
    varlen = Case(f"varlen {len(lens)} seqs", fn=lambda: attention_varlen(q, k, v, cu, cu, causal=True),
                  inputs=(q, k, v), do=do, pairs=pairs, reference=varlen_reference, pick=per_seq, base=same.name,
                  fields=dict(tokens=tokens, sequences=len(lens), flop_weighted_n=round(flop_n, 1)))
    results = run_cases(cases + [varlen], writer, "varlen", cfg, dtype)
    if any(name in {key[0] for key in results} for name in names):
        results.update({(same.name, mode): dense_same_work(results, plan, names, mode) for mode in MODES})
    for row in _rows("varlen", cases + [same, varlen], results, h, d, "speedup"):
        writer.add(row)


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
    for r in writer.rows:
        if r["status"] != "ok" or r.get("note"):
            print(f"{r['status'].upper() if r['status'] != 'ok' else 'note'}: {r['group']} {r['case']} {r['mode']}: "
                  f"{r['note']}")
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0
