"""Attention speed sweep: TFLOP/s of every method, forward, backward and forward+backward.

FLOPs are counted, not measured: 4·B·H·N²·D for the forward (QKᵀ and PV, two FLOPs per
multiply-add), halved when causal; the backward as 2.5× the forward and forward+backward as 3.5×
(FlashAttention's convention). Every method runs in the same process, on the same inputs, one
point after another, each with a warm-up (compilation, autotuning) before ``common.time_ms`` takes
the median of timed calls, each from a cold L2. The default grid is the one FlashAttention's papers
use: B·N = 16k tokens at hidden size 2048 (H = 2048 / d), N from 1k to 16k, d = 64 and 128,
causal and not, bf16. With ``--rounds R`` (R > 1) the methods of a point are built and warmed up
together, timed once each in an untimed round (so that no method gets the first run after the idle
of the builds: it ran 3.5% faster than its median on average), then timed in turn R times in the
orders of a balanced design (``common.balanced_rounds``: every method first as often as any other,
and after every other as often), and each method's median round is kept: a drift of the card's
clock, which at the 700 W cap moves a kernel by a few percent between runs, then moves every method
of the point alike instead of the later ones.

Each method's outputs are checked once a point against float64 attention over the first query
head's group (o; with a backward dq, dk, dv too): a fast but wrong path is recorded as ``wrong``,
never as a speed (``check_err``: the largest error relative to that tensor's largest value).

``bwd`` times the backward alone: one forward graph is kept and its backward rerun
(``autograd.grad`` with ``retain_graph``, so no gradient accumulation is timed).
"""
from __future__ import annotations

import argparse
import gc

import torch

from . import common
from .peers import MODES, PEERS, Problem, dtype_name, parse_dtype, parse_methods, timed_callable

DEFAULTS = {
    "cuda": dict(dtype="bf16", min_n=1024, max_n=16384, lengths=None, tokens=16384, hidden=2048, head_dims="64,128",
                 rep_ms=100.0, methods="ours,ours-portable,sdpa-flash,sdpa-cudnn,sdpa-efficient,flex",
                 modes="fwd,bwd,fwd+bwd"),
    "cpu": dict(dtype="fp32", min_n=256, max_n=1024, lengths=None, tokens=1024, hidden=256, head_dims="64",
                rep_ms=20.0, methods="ours,sdpa-flash,sdpa-math", modes="fwd,bwd,fwd+bwd"),
}
# --quick: ours (as dispatched, and the portable kernels alone) against the two fused backends that
# matter, forward and backward, at short, length-class-cap (8k) and long N.
QUICK = {
    "cuda": dict(head_dims="64,128", lengths="2k,8k,16k", methods="ours,ours-portable,sdpa-flash,sdpa-cudnn",
                 modes="fwd,bwd", rep_ms=50.0),
    "cpu": dict(lengths="256,1k", methods="ours,sdpa-flash", modes="fwd,bwd", rep_ms=10.0),
}
_CAUSAL = {"both": (False, True), "yes": (True,), "no": (False,)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("grid (defaults: GPU bf16, d 64 and 128, N 1k…16k, B·N = 16k, hidden 2048; "
                             "CPU fp32, d 64, N 256…1k, B·N = 1k, hidden 256)")
    g.add_argument("--dtype", help="fp16, bf16 or fp32")
    g.add_argument("--head-dims", help="comma-separated head dimensions (GPU default 64,128)")
    common.add_value_dim_argument(g, "--head-dims", "FLOPs count 2·B·H·N²·(D + DV) forward, (3D + 2DV) backward")
    g.add_argument("--causal", choices=tuple(_CAUSAL), default="both", help="causal, non-causal or both (default both)")
    g.add_argument("--min-n", type=common.parse_size, help="first sequence length")
    g.add_argument("--max-n", type=common.parse_size, help="last sequence length")
    g.add_argument("--lengths", metavar="N,N,...", help="comma-separated sequence lengths (e.g. 2k,8k,16k), "
                                                        "instead of doubling from --min-n to --max-n")
    g.add_argument("--tokens", type=common.parse_size, help="B·N, kept constant (B = tokens / N, at least 1)")
    g.add_argument("--hidden", type=int, help="model width; H = hidden / d")
    g.add_argument("--gqa", type=int, default=1, metavar="RATIO", help="query heads per K/V head (default 1)")
    s = p.add_argument_group("sweep")
    s.add_argument("--methods", help=f"comma-separated from {', '.join(PEERS)}, or 'all' "
                                     "(default: ours and the fused backends available)")
    s.add_argument("--modes", help="comma-separated from fwd, bwd, fwd+bwd (default all three)")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where to run")
    s.add_argument("--rep-ms", type=float, help="timing repetitions per point, in ms (GPU default 100)")
    s.add_argument("--rounds", type=int, default=1,
                   help="time the methods of a point in turn this many times, each keeping its median (default 1); "
                        "above 1 every method's inputs stay allocated at once while a point is timed, so a point "
                        "that fits one method at a time may be recorded as OOM")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    common.add_run_arguments(s)


def _resolve(args):
    device = common.resolve_device(args.device)
    val = common.settings(args, DEFAULTS[device], QUICK[device])
    if args.min_n is not None or args.max_n is not None:  # an explicit range beats a preset's list
        val["lengths"] = args.lengths
    try:
        dtype = parse_dtype(val["dtype"])
        methods = parse_methods(val["methods"])
        modes = common.split_list(val["modes"], MODES, "--modes")
        head_dims = [int(x) for x in str(val["head_dims"]).split(",") if x.strip()]
        lengths = common.size_list(val["lengths"]) if val["lengths"] else common.doubling(val["min_n"], val["max_n"])
    except ValueError as e:
        raise common.BenchArgumentError(f"--head-dims / --lengths / --dtype / --methods / --modes: {e}") from None
    if not head_dims or any(not 1 <= h <= 256 for h in head_dims):
        raise common.BenchArgumentError(f"--head-dims must be integers in [1, 256], got {val['head_dims']!r}")
    val["value_dim"] = common.value_dim(args)
    if val["rep_ms"] <= 0:
        raise common.BenchArgumentError(f"--rep-ms must be positive, got {val['rep_ms']}")
    if args.rounds < 1:
        raise common.BenchArgumentError(f"--rounds must be ≥ 1, got {args.rounds}")
    if val["hidden"] <= 0 or any(val["hidden"] % h for h in head_dims):
        raise common.BenchArgumentError(f"--hidden {val['hidden']} must be a positive multiple of every head dim "
                                        f"({', '.join(map(str, head_dims))})")
    for h in head_dims:
        if args.gqa <= 0 or (val["hidden"] // h) % args.gqa:
            raise common.BenchArgumentError(f"--gqa {args.gqa} must divide the head count {val['hidden'] // h} (d={h})")
    if not lengths:  # an empty --lengths is size_list's error above
        raise common.BenchArgumentError(f"--min-n ({val['min_n']}) is larger than --max-n ({val['max_n']})")
    return device, dtype, methods, modes, head_dims, lengths, val


def _failure(exc: Exception) -> dict:
    """The result of a point that failed: recorded, and the sweep goes on."""
    text = str(exc)
    oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower()
    return {"status": "OOM" if oom else "error",
            "note": f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"}


def _free(problem: Problem) -> None:
    gc.collect()
    if problem.device == "cuda":
        torch.cuda.empty_cache()


CHECK_TOLERANCE = common.CHECK_TOLERANCE


def reference_outputs(problem: Problem, mode: str) -> list[torch.Tensor]:
    """Float64 attention over the first query head's group (query heads 0 … G − 1 and key/value
    head 0) of batch row 0, from the inputs every method gets (``make_inputs``' seed): [o] and, with
    a backward, [o, dq, dk, dv] of those heads."""
    from ..reference import attention_reference
    q, k, v, do = problem.make_inputs(mode)
    g = problem.group
    leaves = [t[:1, :h].detach().double().requires_grad_(mode != "fwd")
              for t, h in ((q, g), (k, 1), (v, 1))]
    o, _ = attention_reference(*leaves, causal=problem.causal)
    if mode == "fwd":
        return [o.detach()]
    return [o.detach(), *torch.autograd.grad(o, leaves, do[:1, :g].double())]


def check_error(runner, q, k, v, do, mode: str, reference: list[torch.Tensor]) -> float:
    """The largest of max|x − ref| / max|ref| over a method's outputs against ``reference_outputs``."""
    o = runner.fn(q, k, v)
    got = [o] if mode == "fwd" else [o, *torch.autograd.grad(o, (q, k, v), do)]
    return common.relative_error([x[:1, :ref.shape[1]] for x, ref in zip(got, reference)], reference)


def _prepare(peer, way, problem: Problem, mode: str, reference=None):
    """(runner, timed callable, facts) of a peer at a point, warmed up; the facts: ``warmup_s``, with
    ``reference_outputs`` the check's ``check_err``, and for our methods the ``path`` and ``kernels`` the
    call took (``explain``)."""
    q, k, v, do = problem.make_inputs(mode)
    runner = peer.build(problem, way)
    with runner.context():
        fn = timed_callable(runner, q, k, v, do, mode)
        facts = {"warmup_s": common.warm_up(fn, f"{peer.name} {mode} d={problem.head_dim} causal={problem.causal} "
                                                f"N={common.format_size(problem.seqlen)}")}
        if reference is not None:
            facts["check_err"] = check_error(runner, q, k, v, do, mode, reference)
        if peer.name.startswith("ours"):
            from ..explain import explain
            how = explain(q, k, v, causal=problem.causal, backward=mode != "fwd")
            facts.update(path=how.path, kernels=" ".join(dict.fromkeys(launch.name for launch in how.kernels)))
    return runner, fn, facts


def _checked(result: dict, problem: Problem) -> dict:
    """``result``, ``wrong`` (no speed) where its check's error is past the dtype's tolerance."""
    err = result.get("check_err")
    if err is not None and not err <= CHECK_TOLERANCE.get(problem.dtype, 1e-2):  # (NaN: wrong)
        result = dict(result, status="wrong", time_ms=None,
                      note=f"output off the float64 reference by {err:.3g} (relative to its largest value)")
    return result


def _point(peer, way, problem: Problem, mode: str, rep_ms: float, reference=None) -> dict:
    runner = fn = None
    try:
        runner, fn, facts = _prepare(peer, way, problem, mode, reference)
        with runner.context():
            ms = common.time_ms(fn, rep_ms=rep_ms)
        return _checked({"status": "ok", "time_ms": ms, **facts}, problem)
    except Exception as exc:
        return _failure(exc)
    finally:
        del runner, fn
        _free(problem)


def _points_in_turn(peers: dict, problem: Problem, mode: str, rep_ms: float, rounds: int, reference=None) -> dict:
    """{name: result} of the peers ({name: (peer, way)}) at one point: each built, warmed up and
    checked, timed once in an untimed round, then in turn over ``rounds`` rounds
    (``common.balanced_rounds``): each keeps its median round (``time_ms``), every round's time
    (``rounds_ms``) and its place in each round's order (``rounds_position``). A peer that fails to
    build, warm up or run is recorded as failed."""
    results, live = {}, {}
    try:
        for name, (peer, way) in peers.items():
            try:
                live[name] = _prepare(peer, way, problem, mode, reference)
            except Exception as exc:
                results[name] = _failure(exc)
        def measure(name):
            runner, fn = live[name][:2]
            with runner.context():
                return common.time_ms(fn, rep_ms=rep_ms)
        failed = {}
        times, orders = common.in_rounds(live, rounds, measure, failed=failed)
        results.update({name: _failure(exc) for name, exc in failed.items()})
        for name, (_, _, facts) in live.items():
            if name not in results:
                ms = sorted(times[name])[len(times[name]) // 2]
                results[name] = _checked({"status": "ok", "time_ms": ms, **facts, "rounds_ms": times[name],
                                          "rounds_position": [order.index(name) for order in orders]}, problem)
        return results
    finally:
        live.clear()
        _free(problem)


def _row(problem: Problem, mode: str, name: str, way, result: dict) -> dict:
    """The JSON row of one method at one point."""
    ms = result.get("time_ms")
    value_dim = {"value_dim": problem.value_dim} if problem.value_dim is not None else {}
    return {"method": name, "label": PEERS[name].label, "mode": mode, "head_dim": problem.head_dim, **value_dim,
            "causal": problem.causal, "N": problem.seqlen, "batch": problem.batch, "heads": problem.heads,
            "kv_heads": problem.kv_heads, "dtype": dtype_name(problem.dtype),
            "gqa": (way or "-") if problem.group > 1 else "-", "status": result["status"], "time_ms": ms,
            "tflops": problem.flops(mode) / (ms * 1e-3) / 1e12 if ms else None, "flops": problem.flops(mode),
            "warmup_s": result.get("warmup_s"), "note": result.get("note", ""),
            **{key: result[key] for key in ("check_err", "path", "kernels", "rounds_ms", "rounds_position") if key in result},
            **({"check": "skipped: its float64 reference did not fit"}
               if result["status"] == "ok" and "check_err" not in result else {})}


def run(args) -> list[dict]:
    """Run the grid, streaming each point (a line on stdout, JSON + CSV rewritten under ``args.out``),
    then print one TFLOP/s table per (d, causal, mode) and plot."""
    device, dtype, methods, modes, head_dims, lengths, val = _resolve(args)
    out = getattr(args, "out", None) or "flashattn_lite_results"
    if device == "cpu":
        print("speed: no CUDA device: a tiny CPU grid, to exercise the harness; TFLOP/s worth reporting "
              "need a GPU.", flush=True)
    explicit = args.methods not in (None, "all")
    causals = _CAUSAL[args.causal]
    grid = [(d, c, mode, n) for d in head_dims for c in causals for mode in modes for n in lengths]
    meta = dict(grid=dict(dtype=dtype_name(dtype), tokens=val["tokens"], hidden=val["hidden"], device=device,
                          lengths=lengths, head_dims=head_dims, modes=modes,
                          value_dim=val["value_dim"],
                          flops="2·B·H·N²·(D + Dv) forward, (3D + 2Dv) bwd, (4D + 3Dv) fwd+bwd (÷2 causal; "
                                "at Dv = D: 4·B·H·N²·D, 2.5×, 3.5×)"),
                methods=methods, peers={n: PEERS[n].summary for n in methods})
    writer = common.ResultWriter(out, "attention_speed", meta=meta, budget_s=args.time_budget,
                                 total=len(grid) * len(methods), progress=not args.no_progress,
                                 columns=["method", "mode", "head_dim", "causal", "N", "status", "time_ms", "tflops",
                                          "note"])
    unchecked = []  # points whose float64 reference did not fit
    with writer:
        for d, causal, mode, n in grid:
            heads = val["hidden"] // d
            problem = Problem(max(1, val["tokens"] // n), heads, heads // args.gqa, n, d, dtype, causal, device,
                              val["value_dim"])
            started = {}  # name -> its GQA way: the methods timed in turn (--rounds > 1)
            reference = _reference_or_none(problem, mode, unchecked)
            for name in methods:
                if not writer.start(method=name, mode=mode, head_dim=d, causal=causal, N=n):
                    continue
                reason, way = PEERS[name].check(problem, explicit=explicit)
                if reason is not None:
                    writer.add(_row(problem, mode, name, way, {"status": "unavailable", "note": reason}))
                elif args.rounds == 1:  # built, timed and freed one after the other
                    writer.add(_row(problem, mode, name, way, _point(PEERS[name], way, problem, mode, val["rep_ms"],
                                                                     reference)))
                else:
                    started[name] = way
            if started:
                timed = _points_in_turn({name: (PEERS[name], way) for name, way in started.items()}, problem, mode,
                                        val["rep_ms"], args.rounds, reference)
                for name, way in started.items():
                    writer.add(_row(problem, mode, name, way, timed[name]))
            del reference
    if unchecked:
        print(f"\nnot checked against float64 (its reference did not fit): {', '.join(unchecked)}")
    _report(writer, methods, dtype, args, val)
    return writer.rows


def _reference_or_none(problem: Problem, mode: str, unchecked: list):
    """``reference_outputs``, or None (the point named in ``unchecked``) where it does not fit."""
    try:
        return reference_outputs(problem, mode)
    except torch.OutOfMemoryError:
        unchecked.append(f"{mode} d={problem.head_dim} {'causal' if problem.causal else 'non-causal'} "
                         f"{common.format_size(problem.seqlen)}")
        return None
    finally:
        _free(problem)


def pivot(rows: list[dict], methods: list[str], d: int, causal: bool, mode: str) -> list[dict]:
    """One table: a row per N, a TFLOP/s column per method (or its status)."""
    table = []
    for n in sorted({r["N"] for r in rows}):
        line = {"N": common.format_size(n)}
        for m in methods:
            r = next((r for r in rows if (r["method"], r["head_dim"], r["causal"], r["mode"], r["N"]) ==
                      (m, d, causal, mode, n)), None)
            if r is not None:
                line[m] = r["tflops"] if r["status"] == "ok" else r["status"]
        table.append(line)
    return table


def standing(rows: list[dict], peer: str, ours: str = "ours") -> list[dict]:
    """Per mode, where ``ours`` stands against ``peer``: over the points both ran, how many it is at
    or above (TFLOP/s ≥ the peer's), of how many, and its lowest ratio with that point; how many of
    the peer's points ``ours`` did not run (failed, out of memory or wrong: never left out of the
    count silently); and, where the methods were timed in turn (``--rounds``), how many of the paired
    rounds (the same round of the same point) ``ours`` was at least as fast in."""
    by_point = {(r["method"], r["mode"], r["head_dim"], r["causal"], r["N"]): r for r in rows}
    result = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        ratios, failed, won, paired = [], 0, 0, 0
        for (m, *point), theirs in by_point.items():
            if m != peer or point[0] != mode or theirs["status"] != "ok":
                continue
            mine = by_point.get((ours, *point))
            if mine is None or mine["status"] == "unavailable":
                continue
            if mine["status"] != "ok":
                failed += 1
                continue
            ratios.append((mine["tflops"] / theirs["tflops"], point))
            for a, b in zip(mine.get("rounds_ms") or (), theirs.get("rounds_ms") or ()):
                paired += 1
                won += a <= b
        if ratios or failed:
            entry = {"mode": mode, "at_or_above": sum(r >= 1 for r, _ in ratios), "points": len(ratios),
                     "ours_failed": failed}
            if ratios:
                low, (_, d, causal, n) = min(ratios, key=lambda x: x[0])
                entry.update(lowest=low, lowest_at=f"d={d} {'causal' if causal else 'non-causal'} "
                                                   f"{common.format_size(n)}")
            if paired:
                entry.update(rounds_won=won, rounds=paired)
            result.append(entry)
    return result


def _report(writer, methods, dtype, args, val) -> None:
    rows = writer.rows
    combos = list(dict.fromkeys((r["head_dim"], r["causal"], r["mode"]) for r in rows))
    for d, causal, mode in combos:
        dv = f", dv={val['value_dim']}" if val["value_dim"] is not None else ""
        print(f"\nTFLOP/s, {mode}, d={d}{dv}, {'causal' if causal else 'non-causal'}, {dtype_name(dtype)}, "
              f"B·N={val['tokens']}, H={val['hidden'] // d}")
        print(common.format_table(pivot(rows, methods, d, causal, mode), ["N"] + methods))
    if "ours" in methods:
        print()
        for peer in (m for m in methods if m != "ours"):
            parts = [f"{s['mode']} at or above at {s['at_or_above']} of {s['points']} points"
                     + (f" (lowest {s['lowest']:.3g} ×: {s['lowest_at']})" if "lowest" in s else "")
                     + (f", faster in {s['rounds_won']} of {s['rounds']} paired rounds" if "rounds" in s else "")
                     + (f", ours failed at {s['ours_failed']} more" if s["ours_failed"] else "")
                     for s in standing(rows, peer)]
            if parts:
                print(f"ours against {peer}: " + "; ".join(parts))
    notes = {(r["method"], r["note"]) for r in rows if r["status"] in ("unavailable", "error") and r["note"]}
    for r in rows:
        if r["status"] == "wrong":
            print(f"WRONG: {r['method']} {r['mode']} d={r['head_dim']} "
                  f"{'causal' if r['causal'] else 'non-causal'} N={r['N']}: {r['note']}")
    for m, note in sorted(notes):
        print(f"  {m}: {note}")
    paths = writer.finish()
    if not args.no_plot and rows:
        if common.have_matplotlib():
            paths.append(plot(rows, writer.path(".png"), dtype_name(dtype)))
        else:
            print("(no PNG: matplotlib is not installed; pip install 'flashattn-lite[bench]')")
    print("\nwrote " + ", ".join(str(p) for p in paths))


def plot(rows: list[dict], path, dtype: str = ""):
    """TFLOP/s vs N per method; a panel per (d, causal) column and mode row."""
    plt = common.pyplot()
    cols = list(dict.fromkeys((r["head_dim"], r["causal"]) for r in rows))
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(len(modes), len(cols), figsize=(4.2 * len(cols), 3.4 * len(modes)), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(PEERS)}
    for i, mode in enumerate(modes):
        for j, (d, causal) in enumerate(cols):
            ax = axes[i][j]
            for m in dict.fromkeys(r["method"] for r in rows):
                ok = [r for r in rows if (r["method"], r["mode"], r["head_dim"], r["causal"]) == (m, mode, d, causal)
                      and r["status"] == "ok"]
                if ok:
                    ax.plot([r["N"] for r in ok], [r["tflops"] for r in ok], "o-", color=colors[m],
                            label=PEERS[m].label, lw=1.6, ms=4)
            ax.set_xscale("log", base=2)
            xs = sorted({r["N"] for r in rows})
            ax.set_xticks(xs, [common.format_size(x) for x in xs])
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{mode}, d={d}, {'causal' if causal else 'non-causal'}", fontsize=9)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == len(modes) - 1:
                ax.set_xlabel("sequence length N")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", ncol=len(handles), fontsize=8,
                   bbox_to_anchor=(0.5, 0.965), frameon=False)
    env = common.environment()
    fig.suptitle(f"Attention TFLOP/s ({dtype}, {env.get('gpu') or 'CPU'})", fontsize=10, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
