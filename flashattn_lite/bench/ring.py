"""Ring attention over W processes (launch with torchrun): how long a sequence W GPUs run forward +
backward, how fast against one GPU, and how much of the communication hides under compute.

    torchrun --nproc-per-node 2 -m flashattn_lite ring [--quick]
    torchrun --nproc-per-node 2 -m flashattn_lite ring --backend gloo     # CPU smoke run, seconds

For each per-GPU length n (global N = W·n; default B 1, Hq 32, Hkv 8, d 128, bf16, causal, zigzag):

- ``ring_ms``: ``ring_attention`` forward + backward, as a user calls it (argument agreement
  included); ``compute_ms``: the same schedule with the transfers left out (each rank reuses its
  own block); ``comm_ms``: the transfers alone (W − 1 K/V shifts forward, W − 1 K/V and W − 1 dK/dV
  shifts backward, each of the rows ``distributed.ring.plan`` sends). ``exposed_comm_ms`` = ring −
  compute; ``comm_hidden`` = 1 − exposed / comm.
- one GPU: ``attention`` forward + backward at n (``one_gpu_local_ms``) and, up to
  ``--single-max``, at the whole N (``one_gpu_global_ms``).
- ``efficiency`` = work · one_gpu_local / ring, ``work`` (``work_vs_local``) the mean rank's pairs
  over those of one GPU at n: W without a window (attention costs ∝ N²), counted from the
  schedules with ``--window``; 1.0 means the ring costs nothing beyond that work.
  ``speedup`` = one_gpu_global / ring (ideal W).
- ``--window``, ``--softcap``, ``--sinks``: the options (the same in the one-GPU runs).

Timing: each case (``ring``, ``compute``, ``comm``, ``one_gpu_local`` and, where it runs,
``one_gpu_global``) is first called ``--warmup`` times, then all are called in one untimed round (no
case gets the first run after the others' warm-up or compile idle), then timed in ``--rounds``
rounds, each case once a round, in the orders of ``common.balanced_rounds`` (a Williams design: each
case first, and after every other, equally often over a design). A case's time in a round is the
slowest rank's mean over ``--iters`` calls (host clock after a device sync; every rank runs the same
calls in the same order, as the cases are collective, so no adaptive repetition); ``<case>_ms`` is
its median over the rounds, ``<case>_rounds_ms`` every round's time and ``rounds_order`` the orders.

Memory: ``<case>_peak_gib`` (every case) is the most memory allocated at any moment of one call
of the case above what was allocated just before it, the largest over the ranks. Before the call only
inputs are allocated (q, k, v, dO of every case; ``comm``'s send buffers); the peak counts
everything the call allocates: its output, what autograd saves, the K/V blocks and float32 dK/dV
accumulators in flight (``comm``: its receive buffers), workspaces, and dQ, dK and dV, which
``torch.autograd.grad`` returns and the step drops (never kept in ``.grad``, where an earlier
call's gradients would sit in the baseline and be freed during the call). So at least
O + dQ + dK + dV for the fwd + bwd cases. CUDA: ``torch.cuda.max_memory_allocated``; CPU (the gloo
smoke run): the profiler's allocation events over the second of two calls (frees of memory the
first call left count, as on CUDA; buffers the Triton interpreter makes itself, TRITON_INTERPRET=1,
are not seen).

FLOPs as elsewhere: 3.5 × 4·B·Hq·N²·d, halved when causal; with a window, 3.5 × 4·B·Hq·d per
visible pair. Rank 0 prints and writes the files.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

from ..distributed import ring as ring_mod
from ..distributed._group import Group
from ..distributed.sharding import LAYOUTS
from ..ops.attention import attention
from . import common
from .peers import dtype_name, parse_dtype
from .variants import _tflops as pair_tflops

DEFAULTS = {"cuda": dict(dtype="bf16", heads=32, kv_heads=8, head_dim=128, lengths="8k,16k,32k,64k",
                         single_max=128 * 1024, iters=3, warmup=1, rounds=10),
            "cpu": dict(dtype="fp32", heads=4, kv_heads=2, head_dim=16, lengths="64,128", single_max=256,
                        iters=2, warmup=1, rounds=3)}
# --quick: a short and a long point (most of the time is autotuning on the first call of each shape).
QUICK = {"cuda": dict(lengths="16k,64k", iters=2, rounds=5), "cpu": dict(lengths="64")}
# The cases of a point, in the order they are keyed (the order balanced_rounds permutes).
CASES = ("ring", "compute", "comm", "one_gpu_local", "one_gpu_global")


GROUP_TIMEOUT_S = 300.0  # past a point's longest legitimate wait (its first compiles), within a device call


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("nccl", "gloo"),
                   help="process-group backend when this command creates it: nccl on GPUs (default with CUDA), "
                        "gloo on the CPU (a smoke run of seconds)")
    p.add_argument("--lengths", metavar="N,N,...",
                   help="tokens per GPU n, comma-separated (GPU default 8k,16k,32k,64k); the ring runs W·n")
    p.add_argument("--single-max", type=common.parse_size,
                   help="longest whole sequence also timed on one GPU (default 128k)")
    p.add_argument("--heads", type=int, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=int, help="K/V heads (default 8)")
    p.add_argument("--head-dim", type=int, help="head dim (default 128)")
    p.add_argument("--dtype", help="bf16, fp16 or fp32 (GPU default bf16)")
    p.add_argument("--layout", choices=LAYOUTS, default="zigzag")
    p.add_argument("--causal", choices=("yes", "no"), default="yes")
    p.add_argument("--window", type=int, metavar="LEFT",
                   help="a sliding window of LEFT + 1 keys: window=(LEFT, 0) causal, (LEFT, LEFT) otherwise")
    p.add_argument("--softcap", type=float, help="softcap c (scores c·tanh(s / c))")
    p.add_argument("--sinks", action="store_true", help="one sink logit per head (random, the same on every rank)")
    p.add_argument("--iters", type=int, help="calls per case in each timed round, their mean the round's time "
                                             "(GPU default 3)")
    p.add_argument("--warmup", type=int, help="untimed calls of each case first, before one untimed round of "
                                              "all cases (GPU default 1)")
    p.add_argument("--rounds", type=common.round_count, help="timed rounds, every case once a round in a balanced order; each "
                                              "case keeps its median round (GPU default 10)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--group-timeout", type=common.seconds, default=None, metavar="SECONDS",
                   help="the timeout of the process group this run creates: how long the other ranks wait in a "
                        "collective for a rank that failed before they stop too (default "
                        f"{GROUP_TIMEOUT_S:g}; torch's own is 10 minutes, a whole device call); refused where the "
                        "group exists already (its creator set its timeout)")
    common.add_run_arguments(p)


def _resolve(args, device: str) -> dict:
    val = common.settings(args, DEFAULTS[device], QUICK[device])
    try:
        val["dtype"] = parse_dtype(val["dtype"])
        val["lengths"] = common.size_list(val["lengths"])
    except ValueError as e:
        raise common.BenchArgumentError(f"--dtype / --lengths: {e}") from None
    if args.layout == "zigzag" and any(n % 2 for n in val["lengths"]):
        raise common.BenchArgumentError(f"--lengths: zigzag needs even per-GPU lengths, got {val['lengths']}")
    if val["heads"] < 1 or val["kv_heads"] < 1 or val["heads"] % val["kv_heads"]:
        raise common.BenchArgumentError(f"--heads ({val['heads']}) must be a positive multiple of --kv-heads "
                                        f"({val['kv_heads']})")
    if args.window is not None and args.window < 0:
        raise common.BenchArgumentError(f"--window must be >= 0, got {args.window}")
    if args.softcap is not None and not args.softcap > 0:
        raise common.BenchArgumentError(f"--softcap must be > 0, got {args.softcap}")
    if not 1 <= val["head_dim"] <= 256:
        raise common.BenchArgumentError(f"--head-dim must be in [1, 256], got {val['head_dim']}")
    if val["iters"] < 1 or val["warmup"] < 0:  # (--rounds: checked as it is parsed)
        raise common.BenchArgumentError("--iters must be >= 1 and --warmup >= 0")
    return val


def _init(args) -> tuple[torch.device, bool]:
    """The device this rank runs on, and whether this call created the process group."""
    timeout = getattr(args, "group_timeout", None)
    if dist.is_initialized():
        if timeout is not None:  # not applied: refused, not ignored
            raise common.BenchArgumentError("--group-timeout sets the timeout of the process group this run "
                                            "creates; one exists already (its creator set its timeout)")
        nccl = "nccl" in str(dist.get_backend())
        return (torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")), False
    if "WORLD_SIZE" not in os.environ:
        raise common.BenchArgumentError("launch it with torchrun, e.g. 'torchrun --nproc-per-node 2 -m flashattn_lite "
                                        "ring' (add --backend gloo on a machine without GPUs)")
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise common.BenchArgumentError("--backend nccl needs CUDA GPUs")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = GROUP_TIMEOUT_S if timeout is None else timeout
    if not timeout > 0:
        raise common.BenchArgumentError(f"--group-timeout must be > 0 seconds, got {timeout:g}")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")), True


class _NoTransfer:
    """A ring whose shifts keep each rank's own buffer: the compute of the schedule alone (rank
    ``rank`` of ``world``, whose pieces and hops it runs)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    class _Done:
        def __init__(self, t):
            self._t = t

        def wait(self):
            return self._t

    def shift(self, tensor, tag=0):
        return self._Done(tensor)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_max(group: Group, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=group.collective_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group.pg)
    return float(t.item())


def _time_ms(fn, group: Group, device, iters: int) -> float:
    """Mean ms per call over ``iters`` calls, the slowest rank's; every rank runs the same calls."""
    _sync(device)
    dist.barrier(group=group.pg)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return _all_max(group, (time.perf_counter() - t0) * 1e3 / iters)


def _timed(steps: dict, group: Group, device, iters: int, warmup: int, rounds: int) -> tuple[dict, list]:
    """({case: each timed round's ms}, each round's order) of the ``steps`` ({case: fn}): every case
    called ``warmup`` times, then one untimed round of all (the first of the orders), then ``rounds``
    timed rounds in the orders of ``common.balanced_rounds``. Every rank must pass the same cases in
    the same order (the design is deterministic, so every rank then runs the same sequence of
    collective calls)."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    return common.in_rounds(steps, rounds, lambda key: _time_ms(steps[key], group, device, iters))


_MARK = "flashattn_lite.bench.ring.peak"


def _cpu_peak_bytes(fn) -> int:
    """Peak bytes allocated on the CPU during a call of ``fn`` above what was allocated before it,
    from the profiler's allocation events. The profiler records no free of memory allocated before
    it started, so it watches two calls and counts the second: memory an earlier call left behind
    and the measured call frees (gradients kept in ``.grad``, say) lowers the peak, as it does in
    ``torch.cuda.max_memory_allocated`` − ``memory_allocated``."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
        with record_function(_MARK):
            fn()
    events = list(prof.profiler.kineto_results.events())
    mark = next(e for e in events if e.name() == _MARK)
    lo, hi = mark.start_ns(), mark.start_ns() + mark.duration_ns()
    memory = sorted((e for e in events if e.name() == "[memory]" and lo <= e.start_ns() <= hi),
                    key=lambda e: e.start_ns())  # stable: events of one instant keep their order
    live = peak = 0
    for e in memory:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def _peak_gib(fn, group: Group, device) -> float:
    """Peak memory of one call above what was allocated just before it, the largest over the ranks
    (GiB). ``fn`` must leave nothing allocated behind it (gradients returned, not kept in ``.grad``):
    what it left from an earlier call would sit in the baseline and be freed during the call."""
    _sync(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _cpu_peak_bytes(fn)
    return _all_max(group, peak / 2 ** 30)


def _fits(nbytes: int, group: Group, device) -> bool:
    """Whether every rank has ``nbytes`` free (a point that runs out of memory on one rank would leave
    the others waiting in a transfer)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return _all_max(group, float(nbytes) - 0.9 * free) <= 0


def _inputs(b, hq, hkv, n, d, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    make = lambda h, dim: torch.randn(b, h, n, dim, generator=g, device=device, dtype=dtype)  # noqa: E731
    q, k, v = make(hq, d).requires_grad_(), make(hkv, d).requires_grad_(), make(hkv, d).requires_grad_()
    return q, k, v, make(hq, d)


def _fwd_bwd(call, inputs):
    """One forward + backward of ``call`` on ``inputs`` (q, k, v, dO): dQ, dK and dV come back from
    ``torch.autograd.grad`` and are dropped with the output when the step returns, so a step starts
    with only its inputs allocated (nothing in ``.grad``) and its peak counts its gradients."""
    q, k, v, do = inputs

    def step():
        torch.autograd.grad(call(q, k, v), (q, k, v), do)
    return step


def _comm_only(group: Group, hops, row_numel: int, dtype, device):
    """The transfers of one forward + backward (``plan``'s hops; ``row_numel``: a K and V row's
    elements), posted and awaited in the ring's order, nothing else."""
    kv = [torch.zeros(rows * row_numel, dtype=dtype, device=device) for rows, _ in hops.kv]
    grads = [torch.zeros(rows * row_numel, dtype=torch.float32, device=device) for rows, _ in hops.grads]

    def step():
        for buf in kv:  # forward
            if buf.numel():
                group.shift(buf).wait()
        pending = None  # backward: the accumulator hop of step s goes out after step s's compute
        for s in range(group.world):
            incoming = group.shift(kv[s]) if s < len(kv) and kv[s].numel() else None
            if grads[s].numel():
                if pending is not None:
                    pending.wait()
                pending = group.shift(grads[s], tag=1)
            if incoming is not None:
                incoming.wait()
        if pending is not None:
            pending.wait()
    return step


def _bytes_ring(b, hq, hkv, n, d, itemsize) -> int:
    """Rough peak of one rank's forward + backward: inputs, outputs and gradients, K/V in flight, and
    the float32 accumulators."""
    q, kv = b * hq * n * d, 2 * b * hkv * n * d
    return int(1.3 * (itemsize * (4 * q + 4 * kv) + 4 * (2 * q + 2 * kv)))


def _bytes_single(b, hq, hkv, n, d, itemsize) -> int:
    q, kv = b * hq * n * d, 2 * b * hkv * n * d
    return int(1.3 * itemsize * (4 * q + 2 * kv))


def _flops(b, hq, n, d, causal) -> float:
    return 3.5 * 4 * b * hq * n * n * d / (2 if causal else 1)


def visible_pairs(pieces) -> int:
    """(query, key) pairs the calls ``pieces`` (``ring.Piece``) attend to, per (batch, head): the
    work a schedule asks of a rank, or of one ``attention`` call given as one piece."""
    total = 0
    for p in pieces:
        i = torch.arange(p.q1 - p.q0, dtype=torch.int64) + p.offset
        first = (i - p.left).clamp(min=0) if p.left >= 0 else torch.zeros_like(i)
        last = i if p.causal else (i + p.right if p.right >= 0 else torch.full_like(i, p.k1 - p.k0 - 1))
        total += int((last.clamp(max=p.k1 - p.k0 - 1) - first + 1).clamp(min=0).sum())
    return total


def _options(args, val, device) -> dict:
    """``window``, ``softcap`` and ``sinks`` of the runs (``attention``'s keywords)."""
    causal = args.causal == "yes"
    window = None if args.window is None else (args.window, 0 if causal else args.window)
    sinks = None
    if args.sinks:
        g = torch.Generator(device=device).manual_seed(7)
        sinks = torch.randn(val["heads"], generator=g, device=device, dtype=torch.float32)
    return dict(window=window, softcap=args.softcap, sinks=sinks)


def _point(val, args, group: Group, device, n: int) -> dict:
    b, hq, hkv, d, dtype = 1, val["heads"], val["kv_heads"], val["head_dim"], val["dtype"]
    causal, w = args.causal == "yes", group.world
    big_n = w * n
    row = dict(world=w, n_local=n, n_global=big_n, layout=args.layout, causal=causal)
    itemsize = torch.empty((), dtype=dtype).element_size()
    options = _options(args, val, device)
    side = (-1, -1) if options["window"] is None else options["window"]

    inputs = _inputs(b, hq, hkv, n, d, dtype, device, seed=1 + group.rank)
    ring_call = lambda q, k, v: ring_mod.ring_attention(q, k, v, causal=causal, layout=args.layout,  # noqa: E731
                                                        **options)
    every, hops = ring_mod.plan(args.layout, w, n, causal, side)
    scale = d ** -0.5
    local_call = lambda q, k, v: ring_mod._RingAttentionFn.apply(  # noqa: E731
        q, k, v, options["sinks"], scale, args.softcap or 0.0, _NoTransfer(group.rank, w), every[group.rank], hops)[0]
    one_gpu = lambda q, k, v: attention(q, k, v, causal=causal, **options)  # noqa: E731
    steps = dict(ring=_fwd_bwd(ring_call, inputs), compute=_fwd_bwd(local_call, inputs),
                 comm=_comm_only(group, hops, 2 * b * hkv * d, dtype, device), one_gpu_local=_fwd_bwd(one_gpu, inputs))
    # The whole sequence on one GPU is timed in the same rounds, so its inputs live beside the
    # ring's (and the ring's working memory beside them): every rank agrees whether that fits.
    if big_n <= val["single_max"] and _fits(_bytes_single(b, hq, hkv, big_n, d, itemsize)
                                            + _bytes_ring(b, hq, hkv, n, d, itemsize), group, device):
        steps["one_gpu_global"] = _fwd_bwd(one_gpu, _inputs(b, hq, hkv, big_n, d, dtype, device, seed=1))
    times, orders = _timed(steps, group, device, val["iters"], val["warmup"], val["rounds"])
    for key, fn in steps.items():
        row[f"{key}_ms"] = statistics.median(times[key])
        row[f"{key}_peak_gib"] = _peak_gib(fn, group, device)
    for key in steps:
        row[f"{key}_rounds_ms"] = times[key]
    row["rounds_order"] = orders
    del steps, inputs

    # A rank's mean share of the pairs against one GPU's call at n: W without a window (attention
    # costs ∝ N²); with one, counted from every rank's schedule.
    if options["window"] is None:
        work = w
        tflops = _flops(b, hq, big_n, d, causal) / w / (row["ring_ms"] * 1e-3) * 1e-12
    else:
        local = [ring_mod.Piece(0, n, 0, n, causal, 0, side[0], -1 if causal else side[1])]
        pairs = sum(visible_pairs(p for pieces in ring_mod.schedule(args.layout, r, w, n, causal, side)
                                  for p in pieces) for r in range(w)) / w
        work = pairs / visible_pairs(local)
        tflops = pair_tflops(b * pairs, hq, d, row["ring_ms"], "fwd+bwd")
    exposed = max(0.0, row["ring_ms"] - row["compute_ms"])
    row.update(exposed_comm_ms=exposed,
               comm_hidden=max(0.0, 1.0 - exposed / row["comm_ms"]) if row["comm_ms"] > 0 else None,
               ring_tokens_s=big_n / row["ring_ms"] * 1e3,
               one_gpu_local_tokens_s=n / row["one_gpu_local_ms"] * 1e3,
               work_vs_local=work,
               efficiency=work * row["one_gpu_local_ms"] / row["ring_ms"],
               ring_tflops_per_gpu=tflops)
    if "one_gpu_global_ms" in row:
        row.update(one_gpu_global_tokens_s=big_n / row["one_gpu_global_ms"] * 1e3,
                   speedup=row["one_gpu_global_ms"] / row["ring_ms"])
    return row


_COLUMNS = ["n_local", "n_global", "ring_ms", "compute_ms", "comm_ms", "comm_hidden", "one_gpu_local_ms",
            "one_gpu_global_ms", "work_vs_local", "efficiency", "speedup", "ring_tflops_per_gpu"]


def _plot(rows: list[dict], path, world: int):
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([r["n_global"] for r in rows], [r["ring_tokens_s"] for r in rows], "o-", label=f"ring, {world} GPUs")
    single = [r for r in rows if r.get("one_gpu_global_tokens_s")]
    if single:
        left.plot([r["n_global"] for r in single], [r["one_gpu_global_tokens_s"] for r in single], "s--",
                  label="one GPU, whole sequence")
    left.set_xscale("log", base=2)
    left.set_xlabel("global sequence length N")
    left.set_ylabel("tokens / s (forward + backward)")
    left.legend()
    right.plot([r["n_local"] for r in rows], [r["efficiency"] for r in rows], "o-", label="scaling efficiency")
    right.plot([r["n_local"] for r in rows], [r["comm_hidden"] for r in rows], "s--", label="communication hidden")
    right.set_xscale("log", base=2)
    right.set_ylim(0, max([1.1] + [1.05 * r["efficiency"] for r in rows]))
    right.set_xlabel("tokens per GPU n")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(args) -> list[dict]:
    """The sweep on every rank; rank 0 streams the points (stdout, JSON, CSV) and plots."""
    device, owned = _init(args)
    try:
        return _sweep(args, device)
    finally:
        if owned:
            dist.destroy_process_group()


def _sweep(args, device) -> list[dict]:
    val = _resolve(args, device.type)
    group = Group(None)
    lead = group.rank == 0
    meta = dict(world=group.world, backend=group.backend, batch=1, heads=val["heads"], kv_heads=val["kv_heads"],
                head_dim=val["head_dim"], dtype=dtype_name(val["dtype"]), layout=args.layout,
                causal=args.causal == "yes", window=args.window, softcap=args.softcap, sinks=args.sinks,
                iters=val["iters"], warmup=val["warmup"], rounds=val["rounds"])
    out = getattr(args, "out", None) or "benchmarks/results"
    writer = common.ResultWriter(out, "ring", columns=_COLUMNS, meta=meta, budget_s=args.time_budget) if lead else None
    itemsize = torch.empty((), dtype=val["dtype"]).element_size()
    rows = []
    # On rank 0 an exception leaves the files marked incomplete, with what stopped the run. (A rank
    # that fails inside a point's collectives leaves the others waiting until the process group's
    # timeout, ``--group-timeout``: the points' memory is agreed beforehand, ``_fits``, so that the
    # likely failure is not.)
    with writer if lead else contextlib.nullcontext():
        for n in val["lengths"]:
            # Rank 0 keeps the time budget; every rank follows its decision (the points are collective).
            if _all_max(group, float(lead and writer.start(n_local=n))) == 0:
                continue
            if not _fits(_bytes_ring(1, val["heads"], val["kv_heads"], n, val["head_dim"], itemsize), group, device):
                if lead:
                    print(f"n_local={n}: skipped, does not fit in GPU memory", flush=True)
                continue
            row = _point(val, args, group, device, n)
            rows.append(row)
            if lead:
                writer.add(row)
    if not lead:
        return rows
    longest = dict(ring_n_global=max((r["n_global"] for r in rows), default=None),
                   one_gpu_n=max((r["n_global"] for r in rows if "one_gpu_global_ms" in r), default=None))
    print(common.format_table(rows, _COLUMNS))
    print(f"longest forward+backward: {longest['ring_n_global']} tokens on {group.world} ranks, "
          f"{longest['one_gpu_n']} on one (this sweep)")
    paths = writer.finish(longest=longest)
    if not args.no_plot and rows and common.have_matplotlib():
        paths.append(_plot(rows, writer.path(".png"), group.world))
    print("wrote " + ", ".join(str(p) for p in paths))
    return rows


__all__ = ["add_arguments", "run"]
