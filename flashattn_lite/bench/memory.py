"""Long-sequence memory sweep: peak memory above the inputs, and time, as N doubles.

For every method (``peers.PEERS``) and mode (forward; forward+backward) the sequence length doubles
from ``--min-n`` to ``--max-n``. A method that runs out of memory gets one "OOM" point and is not
tried at longer lengths. Beside each measurement stands the method's theoretical memory (the
tensors its algorithm allocates, ``peers``), so a reader can check one against the other.

What is measured:
- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was
  allocated before the call (the inputs, and dO for a backward). Per-shape state a method builds
  (FlexAttention's BlockMask) is built inside the measured region and counted. Methods that
  compile or autotune per shape (ours, FlexAttention, cuDNN) get one unmeasured call at the same
  shape first; the others one at their first length.
- CPU: each point runs in its own process (forked from a clean server that has only imported
  torch), so one point's allocations cannot hide in another's. The peak resident set (VmHWM) is
  reset after the inputs exist and a warm-up call at a tiny length has run, and the increase over
  the resident set at that moment is reported (where the reset is not allowed, the peak since the
  process started, which the tiny warm-up barely raises). glibc's malloc is told to map every
  block above 64 KiB separately, so freed tensors leave the resident set and cannot be reused
  unseen. Resolution is about a MiB (code pages, thread stacks); numbers much above that are the
  method's own.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time

import torch

from . import common
from .peers import PEERS, Problem, dtype_name, parse_dtype, parse_methods, run_once

MODES = ("fwd", "fwd+bwd")
MIB = 2 ** 20
SDPA_FLASH_LIKE = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
# Defaults per device. GPU: the long-sequence problem; CPU: small enough for a minute.
DEFAULTS = {
    "cuda": dict(batch=1, heads=16, head_dim=128, dtype="bf16", min_n=1024, max_n=512 * 1024, methods="all",
                 modes="fwd,fwd+bwd"),
    "cpu": dict(batch=1, heads=4, head_dim=64, dtype="fp32", min_n=256, max_n=4096,
                methods="naive,sdpa-math,sdpa-flash,ours", modes="fwd,fwd+bwd"),
}
# --quick: the questions (ours to 512k with fwd+bwd, within 5% of the leanest SDPA backend;
# where naive and math run out of memory), about two minutes on an H100.
QUICK = {
    "cuda": dict(methods="ours,sdpa-flash,sdpa-cudnn,sdpa-efficient,naive,sdpa-math", modes="fwd+bwd"),
    "cpu": dict(methods="naive,sdpa-flash,ours", modes="fwd+bwd", max_n=1024),
}


def _warmup_key(name: str, problem: Problem):
    """What a method's compiled / autotuned state depends on: a new value means one unmeasured call
    first, so one-time allocations (autotuning buffers, plans) are not charged to the point. Ours
    autotunes per length bucket (capped at 8192), so above it no warm-up is needed (at 512k that
    saves a 20-second call); flex and cuDNN build per shape; the others need one warm-up only."""
    if name == "ours":
        from ..ops.attention_fwd import length_bucket
        return length_bucket(problem.seqlen, problem.seqlen)
    if name in ("flex", "sdpa-cudnn"):
        return problem.seqlen
    return "once"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("problem (defaults: GPU B=1 H=16 d=128 bf16, N 1k…512k; CPU B=1 H=4 d=64 fp32, N 256…4k)")
    g.add_argument("--batch", type=int, help="batch size B")
    g.add_argument("--heads", type=int, help="query heads Hq")
    g.add_argument("--head-dim", type=int, help="head dimension d")
    common.add_value_dim_argument(g, "--head-dim", "v, o, dO and dV are that wide, in the inputs and in the theory")
    g.add_argument("--dtype", help="fp16, bf16 or fp32")
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False,
                   help="causal attention (default: off)")
    g.add_argument("--gqa", type=int, default=1, metavar="RATIO",
                   help="query heads per K/V head (Hkv = Hq / RATIO; default 1, i.e. MHA)")
    g.add_argument("--min-n", type=common.parse_size, help="first sequence length (e.g. 1k)")
    g.add_argument("--max-n", type=common.parse_size, help="last sequence length (e.g. 512k, 1M)")
    s = p.add_argument_group("sweep")
    s.add_argument("--methods", help=f"comma-separated from {', '.join(PEERS)}, or 'all'")
    s.add_argument("--modes", help="comma-separated from fwd, fwd+bwd (default both)")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to run (default: cuda when available)")
    s.add_argument("--max-point-seconds", type=float, default=60.0, metavar="S",
                   help="skip a point whose single call is predicted (from the previous length, ×4 per "
                        "doubling) to take longer than S seconds (default 60; 0: no limit)")
    s.add_argument("--flex-compile", choices=("dynamic", "static"), default="dynamic",
                   help="FlexAttention compiled once with a symbolic N (dynamic, default) or once per N (static)")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    common.add_run_arguments(s)


def _resolve(args) -> tuple[Problem, list[str], list[str], list[int], str]:
    """Fill device-dependent defaults and check the options together."""
    device = common.resolve_device(args.device)
    val = common.settings(args, DEFAULTS[device], QUICK[device])
    for k in ("batch", "heads", "head_dim"):
        if val[k] <= 0:
            raise common.BenchArgumentError(f"--{k.replace('_', '-')} must be positive, got {val[k]}")
    if not 1 <= val["head_dim"] <= 256:
        raise common.BenchArgumentError(f"--head-dim must be in [1, 256], got {val['head_dim']}")
    value_dim = common.value_dim(args)
    if args.gqa <= 0 or val["heads"] % args.gqa:
        raise common.BenchArgumentError(f"--gqa {args.gqa} must divide --heads {val['heads']}")
    if not args.max_point_seconds >= 0:  # NaN fails too
        raise common.BenchArgumentError(f"--max-point-seconds must be >= 0 (0: no limit), "
                                        f"got {args.max_point_seconds}")
    if val["min_n"] > val["max_n"]:
        raise common.BenchArgumentError(f"--min-n ({val['min_n']}) is larger than --max-n ({val['max_n']})")
    try:
        dtype = parse_dtype(val["dtype"])
        methods = parse_methods(val["methods"])
        modes = common.split_list(val["modes"], MODES, "--modes")
    except ValueError as e:
        raise common.BenchArgumentError(str(e)) from None
    problem = Problem(val["batch"], val["heads"], val["heads"] // args.gqa, val["min_n"], val["head_dim"], dtype,
                      bool(args.causal), device, value_dim)
    return problem, methods, modes, common.doubling(val["min_n"], val["max_n"]), device


# ------------------------------------------------------------------------------------ CUDA points

def _free_cuda() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cudnn_status_alloc_failed" in text


def _fatal_cuda(exc: BaseException) -> bool:
    """Errors after which the CUDA context cannot be trusted for further points."""
    text = str(exc).lower()
    return any(s in text for s in ("illegal memory access", "device-side assert", "unspecified launch failure",
                                   "misaligned address"))


def _cuda_point(peer, way: str, problem: Problem, mode: str, warm: bool) -> dict:
    """Peak memory above the inputs and time of one (method, mode, N) on the GPU."""
    q = k = v = do = runner = None
    try:
        q, k, v, do = problem.make_inputs(mode)
        if warm:
            runner = peer.build(problem, way)
            with runner.context():
                common.warm_up(lambda: run_once(runner, q, k, v, do, mode),
                               f"{peer.name} {mode} N={common.format_size(problem.seqlen)}")
            runner = None
        _free_cuda()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        runner = peer.build(problem, way)
        with runner.context():
            start.record()
            run_once(runner, q, k, v, do, mode)
            end.record()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            first_ms = start.elapsed_time(end)
            reps = 1
            ms = first_ms
            if first_ms < 200:  # short calls: a proper median (common.time_ms); long ones: that one call is the time
                ms = common.time_ms(lambda: run_once(runner, q, k, v, do, mode))
                reps = 0  # time_ms chose the count
        return {"status": "ok", "peak_bytes": peak, "time_ms": ms, "time_reps": reps or "time_ms"}
    except Exception as exc:  # OOM becomes a point; anything else is recorded, not raised
        status = "OOM" if _is_oom(exc) else "error"
        note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        return {"status": status, "note": note, "fatal": _fatal_cuda(exc)}
    finally:
        del q, k, v, do, runner
        _free_cuda()


# ------------------------------------------------------------------------------------- CPU points

def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current resident set (Linux ≥ 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    hwm = _status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


def _current_rss() -> int:
    rss = _status_bytes("VmRSS")
    return rss if rss is not None else _peak_rss()


def _map_large_blocks(threshold: int = 64 * 1024) -> None:
    """Every malloc above ``threshold`` gets its own mapping, returned to the OS on free."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _cpu_child(conn, name: str, way: str, problem: Problem, mode: str, interpret: str) -> None:
    """One CPU point, in a fresh process. Sends back a result dict."""
    try:
        # The forkserver's environment is the one it started with; the caller's choice of CPU
        # path (PyTorch twin, or Triton's interpreter) is the one that counts.
        os.environ["TRITON_INTERPRET"] = interpret
        _map_large_blocks()
        peer = PEERS[name]
        q, k, v, do = problem.make_inputs(mode)
        runner = peer.build(problem, way)
        with runner.context():
            # The warm-up (library initialisation, thread pools) runs at a tiny length so that it
            # cannot leave pages behind that the measured call would then reuse unseen.
            tiny = problem.tiny()
            run_once(peer.build(tiny, way), *tiny.make_inputs(mode), mode)
            gc.collect()
            resettable = _reset_peak_rss()
            rss0 = _current_rss()
            t0 = time.perf_counter()
            run_once(runner, q, k, v, do, mode)
            times = [(time.perf_counter() - t0) * 1e3]
            peak = _peak_rss() - rss0
            if times[0] < 200:
                # Short calls are dominated by the page faults of per-block mappings: time them
                # again on the ordinary heap, after one call that lets it grow.
                _map_large_blocks(32 * 2 ** 20)
                run_once(runner, q, k, v, do, mode)
                times = []
                while len(times) < 5 and sum(times) < 300:
                    t0 = time.perf_counter()
                    run_once(runner, q, k, v, do, mode)
                    times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        conn.send({"status": "ok", "peak_bytes": peak, "time_ms": times[len(times) // 2], "time_reps": len(times),
                   "rss_reset": resettable})
    except BaseException as exc:  # noqa: BLE001 — reported to the parent, which decides
        conn.send({"status": "OOM" if _is_oom(exc) else "error",
                   "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"})
    finally:
        conn.close()


_CTX = None


def _cpu_context():
    """A forkserver whose server process has imported torch and this module and run nothing else:
    each point forks from it in milliseconds and starts clean (no thread pools, no freed heap)."""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp
        try:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["torch", "flashattn_lite.bench.memory"])
        except ValueError:  # platforms without fork: a full spawn per point (slower, same result)
            ctx = mp.get_context("spawn")
        _CTX = ctx
    return _CTX


def _cpu_point(name: str, way: str, problem: Problem, mode: str, timeout_s: float) -> dict:
    ctx = _cpu_context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_cpu_child, args=(child, name, way, problem, mode, os.environ.get("TRITON_INTERPRET", "0")), daemon=True)
    proc.start()
    child.close()
    result = None
    if parent.poll(timeout_s):
        try:
            result = parent.recv()
        except EOFError:
            result = None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"status": "error", "note": f"timed out after {timeout_s:.0f} s"}
    if result is None:
        # SIGKILL with no message is what the kernel's OOM killer does.
        status = "OOM" if proc.exitcode == -9 else "error"
        return {"status": status, "note": f"process ended with exit code {proc.exitcode}"}
    return result


def _available_ram() -> int | None:
    v = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    v = int(line.split()[1]) * 1024
    except OSError:
        pass
    return v


# ------------------------------------------------------------------------------------------ sweep

def run(args) -> list[dict]:
    """Run the sweep, streaming each point (a line on stdout, JSON + CSV rewritten under ``args.out``),
    then print the tables and plot; return the rows.

    Order: ascending N, and at each N every mode and method (ours first in the defaults), so a run
    cut short by ``--time-budget`` (or killed) still holds complete comparisons up to its last N.
    """
    problem0, methods, modes, lengths, device = _resolve(args)
    from . import peers
    peers.FLEX_COMPILE["dynamic"] = getattr(args, "flex_compile", "dynamic") == "dynamic"
    out = getattr(args, "out", None) or "flashattn_lite_results"
    if device == "cpu":
        print("memory: no CUDA device: running the small CPU sweep (process peak RSS per point). "
              "GPU numbers (torch.cuda.max_memory_allocated, up to 512k tokens) need a GPU.", flush=True)

    avail = {}
    for name in methods:
        explicit = getattr(args, "methods", None) not in (None, "all")
        avail[name] = PEERS[name].check(problem0, explicit=explicit)

    p = problem0
    meta = dict(problem=dict(batch=p.batch, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                             value_dim=p.value_dim, dtype=dtype_name(p.dtype), causal=p.causal, device=device),
                lengths=lengths, methods=methods, modes=modes,
                peers={n: {"summary": PEERS[n].summary, "memory_formula": PEERS[n].memory_formula} for n in methods},
                flex_compile=getattr(args, "flex_compile", "dynamic"))
    total = len(lengths) * len(modes) * sum(avail[n][0] is None for n in methods)
    writer = common.ResultWriter(out, "memory", meta=meta, budget_s=args.time_budget, total=total,
                                 progress=not args.no_progress,
                                 columns=["method", "mode", "N", "status", "peak_mib", "theory_mib", "time_ms", "note"])
    fatal = None
    with writer:
        for name in methods:
            reason, way = avail[name]
            if reason is not None:
                for mode in modes:
                    writer.add(_row(PEERS[name], problem0, mode, way, {"status": "unavailable", "note": reason}, device))
        # Per (method, mode): why it stopped (OOM, skipped), its last (N, ms), its last warm-up key.
        stop, last, warmed = {}, {}, {}
        for n in lengths:
            problem = problem0.with_seqlen(n)
            for mode in modes:
                for name in methods:
                    reason, way = avail[name]
                    key = (name, mode)
                    if reason is not None or key in stop:
                        continue
                    if not writer.start(method=name, mode=mode, N=n):
                        continue
                    if fatal:
                        result = {"status": "skipped", "note": "CUDA context lost earlier in the run"}
                    else:
                        warm = _warmup_key(name, problem)
                        limit = min(args.max_point_seconds or math.inf, writer.time_left())
                        result = _measure(PEERS[name], way, problem, mode, device, warm=warmed.get(key) != warm,
                                          last=last.get(key), max_seconds=limit)
                        warmed[key] = warm
                    writer.add(_row(PEERS[name], problem, mode, way, result, device))
                    if result["status"] == "ok":
                        last[key] = (n, result["time_ms"])
                    elif result["status"] in ("OOM", "skipped"):
                        stop[key] = result["status"]
                    if result.get("fatal"):
                        fatal = result["note"]
    _report(writer, problem0, device, args, fatal)
    return writer.rows


def _measure(peer, way, problem: Problem, mode: str, device: str, *, warm: bool, last, max_seconds: float) -> dict:
    if last is not None and max_seconds < math.inf:
        n0, ms0 = last
        predicted = ms0 * (problem.seqlen / n0) ** 2 / 1e3
        if predicted > max_seconds:
            return {"status": "skipped", "note": f"predicted {predicted:.0f} s > {max_seconds:.0f} s "
                                                 "(--max-point-seconds, or what is left of --time-budget)"}
    theory = peer.theory_bytes(problem, mode, way)
    if device == "cpu":
        ram = _available_ram()
        need = theory + problem.input_bytes(mode)
        if ram is not None and need > 0.8 * ram:
            return {"status": "skipped",
                    "note": f"needs ≈{need / 2 ** 30:.1f} GiB, {ram / 2 ** 30:.1f} GiB of RAM available"}
        return _cpu_point(peer.name, way, problem, mode, timeout_s=max(120.0, 4 * min(max_seconds, 3600)))
    return _cuda_point(peer, way, problem, mode, warm)


def _row(peer, problem: Problem, mode: str, way: str, result: dict, device: str) -> dict:
    theory = peer.theory_bytes(problem, mode, way or "native")
    peak = result.get("peak_bytes")
    ms = result.get("time_ms")
    value_dim = {"value_dim": problem.value_dim} if problem.value_dim is not None else {}
    return {
        "method": peer.name,
        "label": peer.label,
        "mode": mode,
        "N": problem.seqlen,
        "batch": problem.batch,
        "heads": problem.heads,
        "kv_heads": problem.kv_heads,
        "head_dim": problem.head_dim,
        **value_dim,
        "dtype": dtype_name(problem.dtype),
        "causal": problem.causal,
        "gqa": (way or "-") if problem.group > 1 else "-",
        "status": result["status"],
        "peak_mib": None if peak is None else peak / MIB,
        "theory_mib": theory / MIB,
        "peak_over_theory": None if peak is None or theory <= 0 else peak / theory,
        "input_mib": problem.input_bytes(mode) / MIB,
        "time_ms": ms,
        "tflops": None if not ms else problem.flops(mode) / (ms * 1e-3) / 1e12,
        "time_reps": result.get("time_reps"),
        "measure": "cuda max_memory_allocated" if device == "cuda" else "process peak RSS (VmHWM)",
        "note": result.get("note", ""),
    }


def comparison(rows: list[dict]) -> list[dict]:
    """Per (mode, N) where an SDPA backend among flash, cuDNN and efficient ran: our peak over the
    lowest of theirs, or ours' status where it did not run (out of memory, error: a row, not a gap)."""
    out = []
    keys = sorted({(r["mode"], r["N"]) for r in rows if r["method"] in SDPA_FLASH_LIKE and r["status"] == "ok"},
                  key=lambda t: (MODES.index(t[0]), t[1]))
    for mode, n in keys:
        ours = next((r for r in rows if r["method"] == "ours" and r["mode"] == mode and r["N"] == n), None)
        if ours is None:
            continue
        peers = [r for r in rows if r["method"] in SDPA_FLASH_LIKE and r["mode"] == mode and r["N"] == n
                 and r["status"] == "ok"]
        best = min(peers, key=lambda r: r["peak_mib"])
        mine = ours["peak_mib"] if ours["status"] == "ok" else None
        out.append({"mode": mode, "N": n, "ours_mib": mine if mine is not None else ours["status"],
                    "best_sdpa": best["method"], "best_sdpa_mib": best["peak_mib"],
                    "ratio": mine / best["peak_mib"] if mine is not None and best["peak_mib"] > 0 else None})
    return out


def _report(writer, problem0, device, args, fatal) -> None:
    rows = writer.rows
    table_rows = [dict(r, N=common.format_size(r["N"]) if r["status"] != "unavailable" else "-") for r in rows]
    cols = ["method", "mode", "N", "status", "peak_mib", "theory_mib", "peak_over_theory", "time_ms", "tflops", "gqa",
            "note"]
    p = problem0
    dv = f" dv={p.value_dim}" if p.value_dim is not None else ""
    print(f"\nPeak memory above inputs, {device}: B={p.batch} Hq={p.heads} Hkv={p.kv_heads} d={p.head_dim}{dv} "
          f"{dtype_name(p.dtype)} causal={p.causal}  ({rows[0]['measure'] if rows else ''})")
    print(common.format_table(table_rows, cols))
    comp = comparison(rows)
    if comp:
        what = ("the PyTorch CPU twin, not the Triton kernel" if device == "cpu" else "≤ 1.05 is the goal")
        print(f"\nours vs the leanest SDPA backend at each N (peak memory ratio; {what}):")
        print(common.format_table(comp, ["mode", "N", "ours_mib", "best_sdpa", "best_sdpa_mib", "ratio"]))
    if fatal:
        print(f"\nThe sweep stopped early: {fatal}")
    if device == "cpu":
        print("\nCPU numbers show the shape of the curves only; GPU numbers (the ones to publish) need a GPU.")
    paths = writer.finish(comparison=comp, stopped_early=fatal)
    if not args.no_plot:
        if common.have_matplotlib():
            paths.append(plot(rows, writer.path(".png"), title=_title(p, device)))
        else:
            print("(no PNG: matplotlib is not installed; pip install 'flashattn-lite[bench]')")
    print("\nwrote " + ", ".join(str(x) for x in paths))


def _title(p: Problem, device: str) -> str:
    where = common.environment().get("gpu") or "CPU"
    dv = f", dv={p.value_dim}" if p.value_dim is not None else ""
    return (f"Peak memory above inputs — B={p.batch}, Hq={p.heads}, Hkv={p.kv_heads}, d={p.head_dim}{dv}, "
            f"{dtype_name(p.dtype)}, {'causal' if p.causal else 'non-causal'} ({where})")


def plot(rows: list[dict], path, title: str = ""):
    """Memory vs N, log-log, one panel per mode: measured (solid), theory (dotted), OOM (×)."""
    plt = common.pyplot()
    from matplotlib.transforms import blended_transform_factory
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6.5 * max(1, len(modes)), 5), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in rows if r["status"] != "unavailable"))
    colors = {m: f"C{i}" for i, m in enumerate(PEERS)}
    for ax, mode in zip(axes[0], modes):
        tr = blended_transform_factory(ax.transData, ax.transAxes)
        for m in methods:
            rs = [r for r in rows if r["method"] == m and r["mode"] == mode]
            ok = [r for r in rs if r["status"] == "ok" and r["peak_mib"] and r["peak_mib"] > 0]
            label = PEERS[m].label
            if ok:
                ax.plot([r["N"] for r in ok], [r["peak_mib"] for r in ok], "o-", color=colors[m], label=label, lw=1.8)
            th = [r for r in rs if r["theory_mib"] > 0]
            if th:
                ax.plot([r["N"] for r in th], [r["theory_mib"] for r in th], ":", color=colors[m], lw=1, alpha=0.8)
            for r in rs:
                if r["status"] == "OOM":
                    ax.plot([r["N"]], [0.96], "x", color=colors[m], ms=11, mew=2.5, transform=tr, clip_on=False,
                            label=None if ok else label)
                    ax.annotate("OOM", (r["N"], 0.96), xycoords=tr, textcoords="offset points", xytext=(6, -4),
                                color=colors[m], fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_ylabel("peak memory above inputs (MiB)")
        ax.set_title({"fwd": "forward", "fwd+bwd": "forward + backward"}[mode])
        ax.grid(True, which="major", alpha=0.3)
        xs = sorted({r["N"] for r in rows if r["mode"] == mode})
        if xs:
            ax.set_xticks(xs, [common.format_size(x) for x in xs], rotation=45)
    if methods:
        axes[0][-1].plot([], [], ":", color="gray", label="theory")
        axes[0][-1].plot([], [], "x", color="gray", label="out of memory")
        axes[0][-1].legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
