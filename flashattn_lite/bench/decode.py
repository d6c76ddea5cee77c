"""Decode bandwidth: KV-cache bytes read per second, ours (contiguous and paged) against SDPA.

One new token per sequence (Nq = 1) against a full cache of L positions. Decoding is memory-bound,
so the figure of merit is the KV read bandwidth: B·Hkv·L·(D + Dv)·element bytes / time (q and o
are negligible). SDPA runs its flash and cuDNN backends over the cache as dense (B, Hkv, L, D)
tensors with ``enable_gqa`` (if a backend refuses GQA the K/V are expanded to Hq heads outside
the timed region, noted in the ``gqa`` field; the bandwidth still counts the Hkv-head bytes, the
useful work). The paged cache uses randomly permuted blocks (a fragmented pool). Every
implementation runs in the same process on the same tensors. Points whose cache does not fit in
GPU memory are skipped.

Each implementation (SDPA's too) is checked against float64 attention, on a fresh query (an
output left by an earlier call cannot pass) after a block of NaN of the output's size is freed
(``check_err``: max |error| / max |reference|; ``max_abs_diff``): past ``CHECK_TOLERANCE`` it is
``status: wrong`` and not timed. Then every implementation of a point is timed every way below
once in an untimed round (no one gets the first run after the compiles' idle, which runs fast) and
in ``--rounds`` rounds in the orders of ``common.balanced_rounds``: each timing keeps its median
round, and every round's times (``rounds_ms``, ``rounds_eager_ms``, ``rounds_host_us``,
``rounds_steady_ms``) and the implementation's place in each round (``rounds_position``) are
recorded. An SDPA backend is forced (``sdpa_kernel``) around a round's timings, never inside a
timed call (entering it is ~8 µs of host time a call). The table's ``ours/sdpa`` compares ``ms`` of
the same ``timing`` only (graph with graph, eager with eager); ``ours/sdpa eager`` is always eager.

Timing: on a GPU every implementation is timed twice, eagerly (``eager_ms``: host launch path
included, which dominates short caches for everyone) and replayed from a captured CUDA graph
(``ms``, ``kv_tbps``: the kernels' own time, as serving engines run decode steps). ``host_us`` is
the wall clock per call of back-to-back eager calls (in each round the best of HOST_ROUNDS loops of
HOST_CALLS; the median round is kept): what a decode loop without graphs pays per step, the host's
launch path or the kernels, whichever is longer (``eager_ms`` hides host time shorter than its L2
flush; on CPU it is the host clock already, and ``host_us`` is not taken). ``timing`` says which one ``ms`` is (eager where a peer
cannot be captured). Each timed run starts from a cold L2 evicted by a read (``common.time_ms``);
``dirty_l2_ms`` / ``dirty_l2_kv_tbps`` repeat the graph timing after triton.testing.do_bench's
write flush, whose up to 50 MB of dirty lines the kernel must write back (the method behind the
numbers quoted in issue 7).

Steady state (``steady_ms``, ``steady_kv_tbps``, ``steady_copies``): ``ms`` carries the graph launch
and the events around a single replay, a cost of the measurement, not of decoding. A serving loop
runs its decode steps back to back inside one graph, each layer reading its own cache, so each
implementation is also timed as ``steady_copies`` steps in one graph over as many distinct caches
(``common.time_ms_graph_steady``: together ≥ 2.5 × L2, so every step reads from DRAM; at least
STEADY_MIN_COPIES when memory allows), per step; both numbers are kept.

``--sweep-splits`` also times ours (contiguous) at fixed num_splits values, the data behind the
``num_splits=None`` heuristic.
"""
from __future__ import annotations

import argparse
import contextlib
import gc

import torch
import torch.nn.functional as F

from . import common
from .common import format_table

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULTS = {"cuda": dict(batch=[1, 8, 64], lengths=[1 << i for i in range(10, 19)], heads=32, kv_heads=8,
                         head_dim=128, dtype="bf16", block_sizes=[16, 256], rounds=3),
            "cpu": dict(batch=[1, 2], lengths=[64, 256], heads=4, kv_heads=2, head_dim=32, dtype="fp32",
                        block_sizes=[16], rounds=3)}
# --quick: one and a few sequences, short / long / very long caches, contiguous and paged by 16.
# Ours autotunes per (layout, length bucket) on its first call there (printed when slow).
QUICK = {"cuda": dict(batch=[1, 8], lengths=[4096, 32768, 131072], block_sizes=[16]),
         "cpu": dict(batch=[1], lengths=[64, 256], block_sizes=[16])}
SWEEP_SPLITS = [1, 2, 4, 8, 16, 32, 64, 128]
# Steps per steady-state graph when memory allows, even for caches that alone exceed the L2: the
# per-replay launch and events (a few µs) then add under 1 µs to a step.
STEADY_MIN_COPIES = 8
_HEADROOM = 1 << 30     # outputs, split partials, graph pools, SDPA workspaces
HOST_CALLS, HOST_ROUNDS = 100, 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (GPU default 1 8 64)")
    parser.add_argument("--lengths", type=common.parse_size, nargs="+",
                        help="cache lengths L, e.g. 4k 32k (GPU default 1k … 256k)")
    parser.add_argument("--heads", type=int, help="query heads Hq (GPU default 32)")
    parser.add_argument("--kv-heads", type=int, help="KV heads Hkv (GPU default 8)")
    parser.add_argument("--head-dim", type=int, help="D = Dv (GPU default 128)")
    parser.add_argument("--dtype", choices=list(_DTYPES), help="GPU default bf16")
    parser.add_argument("--block-sizes", type=int, nargs="*", help="paged block sizes (default 16 256; none: skip)")
    parser.add_argument("--sweep-splits", action="store_true", help="also time fixed num_splits values")
    parser.add_argument("--rounds", type=common.round_count,
                        help="timed rounds per point, after an untimed one, in a balanced order (default 3)")
    parser.add_argument("--mem-fraction", type=float, default=0.85, help="skip points above this share of free memory")
    common.add_run_arguments(parser)


def _sdpa_peers(device: torch.device):
    if device.type != "cuda":
        return [("sdpa", None)]
    from torch.nn.attention import SDPBackend
    return [("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)]


def _backend_context(backend):
    """The context forcing SDPA's ``backend`` (``torch.nn.attention.sdpa_kernel``; nothing for None)."""
    if backend is None:
        return contextlib.nullcontext()
    import torch.nn.attention as attention
    return attention.sdpa_kernel(backend)


def _sdpa_call(q, k, v, backend, *, inner_context: bool = True):
    """A callable running SDPA on one backend, and how it handled GQA ('native' / 'expanded'),
    or (None, reason) when the backend cannot run this problem.

    With ``inner_context`` (the default) the callable enters ``_backend_context(backend)`` itself at
    every call; without it the callable is SDPA alone and the caller forces the backend around it
    (``with _backend_context(backend):``), once, outside what it times: entering the context is
    ~8 µs of host time a call, which a timed loop would otherwise charge to SDPA."""
    def under_backend(call):
        if not inner_context or backend is None:
            return call

        def run():
            with _backend_context(backend):
                return call()
        return run
    try:
        with _backend_context(backend):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return under_backend(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)), "native"
    except RuntimeError:
        pass
    rep = q.shape[1] // k.shape[1]
    try:
        k_e, v_e = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        with _backend_context(backend):
            F.scaled_dot_product_attention(q, k_e, v_e)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        return None, f"unsupported: {str(e).splitlines()[0][:80]}"
    return under_backend(lambda: F.scaled_dot_product_attention(q, k_e, v_e)), "expanded"


CHECK_TOLERANCE = common.CHECK_TOLERANCE


def _reference(q, k, v) -> torch.Tensor:
    """float64 attention of one new token per sequence over its whole dense cache (B, Hq, 1, Dv),
    GQA by head groups (query head h reads KV head h // (Hq / Hkv)), scale D^-0.5; one (sequence,
    KV head) at a time, so that the float64 copies stay small."""
    B, hq, _, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = torch.empty(B, hq, 1, v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(B):
        for h in range(hkv):
            s = q[b, h * g:(h + 1) * g, 0].double() @ k[b, h].double().T * d ** -0.5
            out[b, h * g:(h + 1) * g, 0] = torch.softmax(s, -1) @ v[b, h].double()
    return out


def _check(fn, q, fresh, ref) -> tuple[float, float]:
    """(max |error| / max |ref|, max |error|) of ``fn``'s output with ``q`` holding ``fresh`` (``ref``
    its float64 reference): an output left from an earlier call (a skipped write) cannot match, and a
    block of NaN of the output's size is freed first, so a kernel that reuses it unwritten shows NaN.
    ``q`` is restored after."""
    saved = q.clone()
    try:
        q.copy_(fresh)
        poison = torch.full(ref.shape, float("nan"), dtype=q.dtype, device=q.device)
        del poison
        o = fn()
        o = o[0] if isinstance(o, tuple) else o
        diff = (o.double() - ref).abs().max().item()
    finally:
        q.copy_(saved)
    return diff / max(ref.abs().max().item(), 1e-30), diff


def _fits(device, nbytes: int, fraction: float, what: str) -> bool:
    if device.type != "cuda":
        return True
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if nbytes > fraction * free:
        print(f"skip {what}: needs {nbytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        return False
    return True


def _steady_copies(device, step_bytes: int, fraction: float, what: str) -> int | None:
    """Steps for the steady-state timing: ``common.steady_state_copies``, lowered to what fits in
    memory beside what is allocated now (at least 2). None on CPU, or where two steps do not fit."""
    if device.type != "cuda":
        return None
    want = common.steady_state_copies(step_bytes, l2_bytes=common.l2_cache_bytes(), min_copies=STEADY_MIN_COPIES)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    copies = max(2, min(want, int((fraction * free - _HEADROOM) // step_bytes)))
    if not _fits(device, copies * step_bytes + _HEADROOM, fraction, f"{what} steady-state ({copies} steps)"):
        return None
    return copies


def _host_us(fn) -> float:
    """µs per call of back-to-back calls: the best of HOST_ROUNDS rounds (a slow spell of the
    host lands on one round, not on the result)."""
    return min(common.host_us(fn, HOST_CALLS) for _ in range(HOST_ROUNDS))


def _paged_copy(k, v, block_size: int):
    """The dense cache rewritten as a paged pool with shuffled blocks, and its block table."""
    B, H, L, D = k.shape
    per_seq = -(-L // block_size)
    perm = torch.randperm(B * per_seq, device=k.device)
    table = perm.view(B, per_seq).to(torch.int32)

    def pool(x):
        pad = per_seq * block_size - L
        x = F.pad(x, (0, 0, 0, pad)) if pad else x
        blocks = x.view(B, H, per_seq, block_size, x.shape[-1]).permute(0, 2, 1, 3, 4).reshape(-1, H, block_size,
                                                                                             x.shape[-1])
        out = torch.empty_like(blocks)
        out[perm] = blocks
        return out
    return pool(k), pool(v), table


def _check_grid(val, hq, hkv, dim, block_sizes, mem_fraction) -> None:
    """Bad options are usage errors naming the option, before any point runs."""
    positive = [("--batch", b) for b in val["batch"]] + [("--heads", hq), ("--kv-heads", hkv),
                                                           ("--head-dim", dim)]
    positive += [("--block-sizes", b) for b in block_sizes or ()]
    for option, value in positive:
        if value < 1:
            raise common.BenchArgumentError(f"{option} must be ≥ 1, got {value}")
    if hq % hkv:
        raise common.BenchArgumentError(f"--heads ({hq}) must be a multiple of --kv-heads ({hkv})")
    if dim > 256:
        raise common.BenchArgumentError(f"--head-dim must be ≤ 256, got {dim}")
    if not 0.0 < mem_fraction <= 1.0:
        raise common.BenchArgumentError(f"--mem-fraction must be in (0, 1], got {mem_fraction}")


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def _time_once(fn, steady, device) -> dict:
    """One round of ``fn``'s timings, every way (``steady`` = (make_step, copies) or None)."""
    t = {"eager_ms": common.time_ms(fn)}
    if device.type == "cuda":
        t["host_us"] = _host_us(fn)
    t["graph_ms"] = common.time_ms_graph(fn)
    t["dirty_ms"] = common.time_ms_graph(fn, l2="dirty")
    if steady is not None:
        t["steady_ms"] = common.time_ms_graph_steady(*steady)
    return t


def _summary(row: dict, times: list[dict], positions: list[int], kv_bytes: int, steady) -> dict:
    """``row`` with each timing's median over the rounds and every round's value (``rounds_*``)."""
    tbps = lambda ms: kv_bytes / (ms * 1e-3) / 1e12  # noqa: E731
    eager = [t["eager_ms"] for t in times]
    graph = [t["graph_ms"] for t in times]
    graphed = None not in graph
    ms = _median(graph if graphed else eager)
    row = dict(row, timing="cuda-graph" if graphed else "eager", ms=ms, kv_tbps=tbps(ms), eager_ms=_median(eager),
               eager_kv_tbps=tbps(_median(eager)), rounds_ms=graph if graphed else eager, rounds_eager_ms=eager,
               rounds_position=positions)
    host = [t["host_us"] for t in times if "host_us" in t]
    if host:
        row.update(host_us=_median(host), rounds_host_us=host)
    dirty = [t["dirty_ms"] for t in times]
    if None not in dirty:
        row.update(dirty_l2_ms=_median(dirty), dirty_l2_kv_tbps=tbps(_median(dirty)))
    if steady is not None:
        row["steady_copies"] = steady[1]
        st = [t["steady_ms"] for t in times]
        if None in st:
            row["steady_note"] = "could not be captured"
        else:
            row.update(steady_ms=_median(st), steady_kv_tbps=tbps(_median(st)), rounds_steady_ms=st)
    return row


def _measure_point(impls: list[dict], q, k, v, base: dict, kv_bytes: int, rounds: int, device) -> list[dict]:
    """The rows of one (B, L): every implementation (``impls``: dicts of impl, layout, fn, backend,
    steady, extra) warmed up and checked against float64 attention on a fresh query (past
    ``CHECK_TOLERANCE``: ``status: wrong``, not timed), then timed every way once in an untimed
    round and in ``rounds`` rounds in ``common.balanced_rounds`` orders: medians kept, every round's
    times and each one's place in the rounds' orders recorded. An SDPA backend is forced around its
    warm-up, check and each round's timings, never inside a timed call."""
    fresh = torch.randn_like(q)
    ref = _reference(fresh, k, v)
    tol = CHECK_TOLERANCE.get(q.dtype, 1e-2)
    rows, live = {}, {}
    for imp in impls:
        key = f"{imp['impl']} {imp['layout']}"
        with _backend_context(imp.get("backend")):
            warmup_s = common.warm_up(imp["fn"], f"{key} B={base['B']} L={base['L']}")
            err, diff = _check(imp["fn"], q, fresh, ref)
        row = dict(base, impl=imp["impl"], layout=imp["layout"], **imp.get("extra", {}), warmup_s=warmup_s,
                   check_err=err, max_abs_diff=diff)
        if err <= tol:  # NaN is not
            rows[key], live[key] = dict(row, status="ok"), imp
        else:
            rows[key] = dict(row, status="wrong", note=f"WRONG: not timed (off the float64 reference by {err:.3g} "
                                                        f"relative to its largest value, tolerance {tol:g})")
    del fresh, ref
    def measure(key):
        imp = live[key]
        with _backend_context(imp.get("backend")):
            return _time_once(imp["fn"], imp.get("steady"), device)
    times, orders = common.in_rounds(live, rounds, measure)
    for key, imp in live.items():
        rows[key] = _summary(rows[key], times[key], [order.index(key) for order in orders], kv_bytes,
                             imp.get("steady"))
    return list(rows.values())


def run(args) -> list[dict]:
    """Sweep (B, L), streaming each point's rows (lines on stdout, JSON + CSV rewritten under
    ``args.out``), then print the table."""
    from ..ops.decode import decode

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    val = common.settings(args, DEFAULTS[device.type], QUICK[device.type])
    hq, hkv, dim = val["heads"], val["kv_heads"], val["head_dim"]
    dtype = _DTYPES[val["dtype"]]
    block_sizes = val["block_sizes"]
    rounds = val["rounds"]
    _check_grid(val, hq, hkv, dim, block_sizes, args.mem_fraction)
    elem = torch.empty((), dtype=dtype).element_size()
    out = getattr(args, "out", None) or "benchmarks/results"
    writer = common.ResultWriter(out, "decode", budget_s=args.time_budget,
                                 meta=dict(config=dict(heads=hq, kv_heads=hkv, head_dim=dim, dtype=str(dtype),
                                                       block_sizes=block_sizes),
                                           rounds=rounds,
                                           timing="every implementation of a point warmed up and checked, one "
                                                  "untimed round, then rounds in common.balanced_rounds orders; "
                                                  "medians; SDPA's backend forced outside the timed calls",
                                           check="against float64 attention on a fresh query, max |error| / max "
                                                 "|reference|; past " + ", ".join(
                                                     f"{str(d).replace('torch.', '')} {t:g}"
                                                     for d, t in CHECK_TOLERANCE.items()) + " wrong (not timed)"),
                                 columns=["B", "L", "impl", "layout", "status", "timing", "ms", "kv_tbps", "eager_ms",
                                          "eager_kv_tbps", "host_us", "dirty_l2_kv_tbps", "steady_kv_tbps",
                                          "steady_copies", "check_err", "note"])
    def point(B: int, L: int) -> list[dict]:
        """The rows of one (B, L) (none where its cache does not fit); its tensors are freed on return."""
        kv_bytes = 2 * B * hkv * L * dim * elem
        if not _fits(device, kv_bytes + (1 << 30), args.mem_fraction, f"B={B} L={L}"):
            return []
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(B, hq, 1, dim, device=device, dtype=dtype, generator=g)
        k = torch.randn(B, hkv, L, dim, device=device, dtype=dtype, generator=g)
        v = torch.randn(B, hkv, L, dim, device=device, dtype=dtype, generator=g)
        seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
        base = dict(B=B, L=L, Hq=hq, Hkv=hkv, D=dim, dtype=str(dtype).replace("torch.", ""), kv_bytes=kv_bytes)
        notes = []  # rows of what is not measured (unsupported, no memory)
        # Every implementation of the point is timed in the same rounds, so all its inputs are held
        # at once: the paged pools first (each beside the dense cache: its size plus one tensor's
        # temporary), then the steady-state caches share what memory is left.
        paged = {}
        for bs in block_sizes:
            if not _fits(device, 3 * kv_bytes // 2 + (1 << 30), args.mem_fraction, f"B={B} L={L} paged{bs}"):
                notes.append(dict(base, impl="ours", layout=f"paged{bs}", note="skipped: memory"))
                continue
            paged[bs] = _paged_copy(k, v, bs)
        groups = 1 + len(paged)  # steady-state caches still to place
        impls = []

        # Steady state, contiguous: step i reads slice i of one (copies, B, Hkv, L, D) cache, each
        # slice laid out as k and v are (the same strides as the one-step timing).
        copies = _steady_copies(device, kv_bytes, args.mem_fraction / groups, f"B={B} L={L}")
        groups -= 1
        if copies:
            ks = torch.randn(copies, B, hkv, L, dim, device=device, dtype=dtype, generator=g)
            vs = torch.randn(copies, B, hkv, L, dim, device=device, dtype=dtype, generator=g)
            qs = torch.randn(copies, B, hq, 1, dim, device=device, dtype=dtype, generator=g)
        for name, backend in _sdpa_peers(device):
            call, how = _sdpa_call(q, k, v, backend, inner_context=False)
            if call is None:
                notes.append(dict(base, impl=name, layout="dense", note=how))
                continue
            # A backend that expands GQA would need copies × Hq/Hkv caches: one-step timing only.
            steady = ((lambda i, backend=backend: _sdpa_call(qs[i], ks[i], vs[i], backend, inner_context=False)[0],
                       copies) if copies and how == "native" else None)
            impls.append(dict(impl=name, layout="dense", fn=call, backend=backend, steady=steady, extra=dict(gqa=how)))
        impls.append(dict(impl="ours", layout="contiguous", fn=lambda: decode(q, k, v, seqlens),
                          steady=(lambda i: lambda: decode(qs[i], ks[i], vs[i], seqlens), copies) if copies else None))
        if args.sweep_splits:
            for s in SWEEP_SPLITS:
                if s * 64 <= L:
                    steady = ((lambda i, s=s: lambda: decode(qs[i], ks[i], vs[i], seqlens, num_splits=s), copies)
                              if copies else None)
                    impls.append(dict(impl=f"ours-splits{s}", layout="contiguous",
                                      fn=lambda s=s: decode(q, k, v, seqlens, num_splits=s), steady=steady))
        for bs, (kp, vp, table) in paged.items():
            # Steady state, paged: one pool of copies × the blocks, step i through its own block
            # table (a random permutation of the whole pool: fragmented, as above).
            blocks = table.numel()
            pcopies = _steady_copies(device, 2 * blocks * hkv * bs * dim * elem, args.mem_fraction / groups,
                                     f"B={B} L={L} paged{bs}")
            groups -= 1
            steady = None
            if pcopies:
                pool_k = torch.randn(pcopies * blocks, hkv, bs, dim, device=device, dtype=dtype, generator=g)
                pool_v = torch.randn(pcopies * blocks, hkv, bs, dim, device=device, dtype=dtype, generator=g)
                tables = torch.randperm(pcopies * blocks, device=device).view(pcopies, *table.shape).int()
                pqs = torch.randn(pcopies, B, hq, 1, dim, device=device, dtype=dtype, generator=g)
                steady = (lambda i, pk=pool_k, pv=pool_v, t=tables, pq=pqs:
                          lambda: decode(pq[i], pk, pv, seqlens, block_table=t[i]), pcopies)
            impls.append(dict(impl="ours", layout=f"paged{bs}", steady=steady,
                              fn=lambda kp=kp, vp=vp, table=table: decode(q, kp, vp, seqlens, block_table=table)))
        return notes + _measure_point(impls, q, k, v, base, kv_bytes, rounds, device)

    with writer:
        for B in val["batch"]:
            for L in val["lengths"]:
                if not writer.start(B=B, L=L):
                    continue
                for row in point(B, L):
                    writer.add(row)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    _print(writer.rows, block_sizes, args.sweep_splits)
    paths = writer.finish()
    print("wrote " + ", ".join(str(p) for p in paths))
    return writer.rows


def _print(rows, block_sizes, sweep):
    """One line per (B, L): KV TB/s of every implementation (one-step graph, eager, dirty L2, steady
    state) and its host µs per eager call, ours over SDPA flash, and ours' µs per step (one-step
    graph, steady state)."""
    keyed = {}
    for r in rows:
        if "kv_tbps" in r:
            keyed.setdefault((r["B"], r["L"]), {})[(r["impl"], r["layout"])] = r
    table = []
    for (B, L), got in keyed.items():
        line = {"B": B, "L": L}
        for (impl, layout), r in got.items():
            if impl.startswith("ours-splits"):
                continue
            col = impl if impl != "ours" else f"ours-{layout}"
            line[col + " TB/s"] = r["kv_tbps"]
            line[col + " eager"] = r.get("eager_kv_tbps")
            line[col + " dirtyL2"] = r.get("dirty_l2_kv_tbps")
            line[col + " steady"] = r.get("steady_kv_tbps")
            line[col + " host us"] = r.get("host_us")
        ours = got.get(("ours", "contiguous"))
        flash = got.get(("sdpa-flash", "dense")) or got.get(("sdpa", "dense"))
        if ours and flash:
            # Like with like only: a graph replay's time against another's, eager against eager.
            if ours["timing"] == flash["timing"]:
                line["ours/sdpa"] = flash["ms"] / ours["ms"]
            line["ours/sdpa eager"] = flash["eager_ms"] / ours["eager_ms"]
        if ours:
            line["us"] = ours["ms"] * 1e3
            if ours.get("steady_ms") is not None:
                line["steady us"] = ours["steady_ms"] * 1e3
            line["check_err"] = ours.get("check_err")
        table.append(line)
    columns = []
    for line in table:
        columns += [c for c in line if c not in columns]
    print(format_table(table, columns))
    if sweep:
        sweep_rows = []
        for (B, L), got in keyed.items():
            line = {"B": B, "L": L}
            for (impl, _), r in got.items():
                if impl.startswith("ours-splits"):
                    line[impl.removeprefix("ours-")] = r["kv_tbps"]
            line["auto"] = got.get(("ours", "contiguous"), {}).get("kv_tbps")
            sweep_rows.append(line)
        cols = []
        for line in sweep_rows:
            cols += [c for c in line if c not in cols]
        print("\nKV TB/s by num_splits (contiguous):")
        print(format_table(sweep_rows, cols))
    wrong = [r for r in rows if r.get("status") == "wrong"]
    if wrong:
        print("\nWRONG (not timed): " + ", ".join(f"B={r['B']} L={r['L']} {r['impl']} {r['layout']}" for r in wrong))


__all__ = ["add_arguments", "run"]
