"""Decode bandwidth: KV-cache bytes read per second, ours (contiguous and paged) against SDPA.

One new token per sequence (Nq = 1) against a full cache of L positions. Decoding is memory-bound,
so the figure of merit is the KV read bandwidth: B·Hkv·L·(D + Dv)·element bytes / time (q and o
are negligible). SDPA runs its flash and cuDNN backends over the cache as dense (B, Hkv, L, D)
tensors with ``enable_gqa`` (if a backend refuses GQA the K/V are expanded to Hq heads outside
the timed region, noted in the ``gqa`` field; the bandwidth still counts the Hkv-head bytes, the
useful work). The paged cache uses randomly permuted blocks (a fragmented pool). Every
implementation runs in the same process on the same tensors; each of ours is also checked against
SDPA's output (``max_abs_diff``). Points whose cache does not fit in GPU memory are skipped.

Timing: on a GPU every implementation is timed twice, eagerly (``eager_ms``: host launch path
included, which dominates short caches for everyone) and replayed from a captured CUDA graph
(``ms``, ``kv_tbps``: the kernels' own time, as serving engines run decode steps). ``host_us`` is
the wall clock per call of back-to-back eager calls (the best of HOST_ROUNDS rounds of HOST_CALLS):
what a decode loop without graphs pays per step, the host's launch path or the kernels, whichever
is longer (``eager_ms`` hides host time shorter than its L2 flush; on CPU it is the host clock
already, and ``host_us`` is not taken). ``timing`` says which one ``ms`` is (eager where a peer
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
from .common import format_table, time_ms

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULTS = {"cuda": dict(batch=[1, 8, 64], lengths=[1 << i for i in range(10, 19)], heads=32, kv_heads=8,
                         head_dim=128, dtype="bf16", block_sizes=[16, 256]),
            "cpu": dict(batch=[1, 2], lengths=[64, 256], heads=4, kv_heads=2, head_dim=32, dtype="fp32",
                        block_sizes=[16])}
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
    parser.add_argument("--mem-fraction", type=float, default=0.85, help="skip points above this share of free memory")
    common.add_run_arguments(parser)


def _sdpa_peers(device: torch.device):
    if device.type != "cuda":
        return [("sdpa", None)]
    from torch.nn.attention import SDPBackend
    return [("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)]


def _sdpa_call(q, k, v, backend):
    """A callable running SDPA on one backend, and how it handled GQA ('native' / 'expanded'),
    or (None, reason) when the backend cannot run this problem."""
    ctx = (lambda: contextlib.nullcontext()) if backend is None else (
        lambda: __import__("torch.nn.attention", fromlist=["sdpa_kernel"]).sdpa_kernel(backend))
    try:
        with ctx():
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        def run():
            with ctx():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return run, "native"
    except RuntimeError:
        pass
    rep = q.shape[1] // k.shape[1]
    try:
        k_e, v_e = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        with ctx():
            F.scaled_dot_product_attention(q, k_e, v_e)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        return None, f"unsupported: {str(e).splitlines()[0][:80]}"

    def run_expanded():
        with ctx():
            return F.scaled_dot_product_attention(q, k_e, v_e)
    return run_expanded, "expanded"


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


def run(args) -> list[dict]:
    """Sweep (B, L), streaming each measurement (a line on stdout, JSON + CSV rewritten under
    ``args.out``), then print the table."""
    from ..ops.decode import decode

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    val = common.settings(args, DEFAULTS[device.type], QUICK[device.type])
    hq, hkv, dim = val["heads"], val["kv_heads"], val["head_dim"]
    dtype = _DTYPES[val["dtype"]]
    block_sizes = val["block_sizes"]
    _check_grid(val, hq, hkv, dim, block_sizes, args.mem_fraction)
    elem = torch.empty((), dtype=dtype).element_size()
    out = getattr(args, "out", None) or "benchmarks/results"
    writer = common.ResultWriter(out, "decode", budget_s=args.time_budget,
                                 meta=dict(config=dict(heads=hq, kv_heads=hkv, head_dim=dim, dtype=str(dtype),
                                                       block_sizes=block_sizes)),
                                 columns=["B", "L", "impl", "layout", "timing", "ms", "kv_tbps", "eager_ms",
                                          "eager_kv_tbps", "host_us", "dirty_l2_kv_tbps", "steady_kv_tbps",
                                          "steady_copies", "max_abs_diff", "note"])
    with writer:
        for B in val["batch"]:
            for L in val["lengths"]:
                if not writer.start(B=B, L=L):
                    continue
                kv_bytes = 2 * B * hkv * L * dim * elem
                if not _fits(device, kv_bytes + (1 << 30), args.mem_fraction, f"B={B} L={L}"):
                    continue
                g = torch.Generator(device=device).manual_seed(0)
                q = torch.randn(B, hq, 1, dim, device=device, dtype=dtype, generator=g)
                k = torch.randn(B, hkv, L, dim, device=device, dtype=dtype, generator=g)
                v = torch.randn(B, hkv, L, dim, device=device, dtype=dtype, generator=g)
                seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
                base = dict(B=B, L=L, Hq=hq, Hkv=hkv, D=dim, dtype=str(dtype).replace("torch.", ""), kv_bytes=kv_bytes)

                def record(impl, layout, fn, ref=None, steady=None, **extra):
                    """Time ``fn`` every way; ``steady`` = (make_step, copies) for the steady-state
                    graph (None: not measured, e.g. on CPU)."""
                    warmup_s = common.warm_up(fn, f"{impl} {layout} B={B} L={L}")
                    eager_ms = time_ms(fn)
                    if device.type == "cuda":
                        extra = dict(extra, host_us=_host_us(fn))
                    graph_ms = common.time_ms_graph(fn)
                    dirty_ms = common.time_ms_graph(fn, l2="dirty")
                    if dirty_ms is not None:
                        extra = dict(extra, dirty_l2_ms=dirty_ms, dirty_l2_kv_tbps=kv_bytes / (dirty_ms * 1e-3) / 1e12)
                    if steady is not None:
                        steady_ms = common.time_ms_graph_steady(*steady)
                        extra = dict(extra, steady_copies=steady[1])
                        if steady_ms is None:
                            extra["steady_note"] = "could not be captured"
                        else:
                            extra.update(steady_ms=steady_ms, steady_kv_tbps=kv_bytes / (steady_ms * 1e-3) / 1e12)
                    ms = graph_ms if graph_ms is not None else eager_ms
                    row = dict(base, impl=impl, layout=layout, ms=ms, kv_tbps=kv_bytes / (ms * 1e-3) / 1e12,
                               timing="cuda-graph" if graph_ms is not None else "eager", eager_ms=eager_ms,
                               eager_kv_tbps=kv_bytes / (eager_ms * 1e-3) / 1e12, warmup_s=warmup_s, **extra)
                    if ref is not None:
                        row["max_abs_diff"] = (fn().float() - ref.float()).abs().max().item()
                    writer.add(row)
                    return row

                # Steady state, contiguous: step i reads slice i of one (copies, B, Hkv, L, D) cache,
                # each slice laid out as k and v are (the same strides as the one-step timing).
                copies = _steady_copies(device, kv_bytes, args.mem_fraction, f"B={B} L={L}")
                if copies:
                    ks = torch.randn(copies, B, hkv, L, dim, device=device, dtype=dtype, generator=g)
                    vs = torch.randn(copies, B, hkv, L, dim, device=device, dtype=dtype, generator=g)
                    qs = torch.randn(copies, B, hq, 1, dim, device=device, dtype=dtype, generator=g)

                ref = None
                for name, backend in _sdpa_peers(device):
                    call, how = _sdpa_call(q, k, v, backend)
                    if call is None:
                        writer.add(dict(base, impl=name, layout="dense", note=how))
                        continue
                    # A backend that expands GQA would need copies × Hq/Hkv caches: one-step timing only.
                    steady = ((lambda i, backend=backend: _sdpa_call(qs[i], ks[i], vs[i], backend)[0], copies)
                              if copies and how == "native" else None)
                    record(name, "dense", call, steady=steady, gqa=how)
                    ref = call() if ref is None else ref
                    del call            # frees expanded K/V, if any
                record("ours", "contiguous", lambda: decode(q, k, v, seqlens), ref,
                       steady=(lambda i: lambda: decode(qs[i], ks[i], vs[i], seqlens), copies) if copies else None)
                if args.sweep_splits:
                    for s in SWEEP_SPLITS:
                        if s * 64 <= L:
                            steady = ((lambda i, s=s: lambda: decode(qs[i], ks[i], vs[i], seqlens, num_splits=s),
                                       copies) if copies else None)
                            record(f"ours-splits{s}", "contiguous", lambda s=s: decode(q, k, v, seqlens, num_splits=s),
                                   ref, steady=steady)
                if copies:
                    del ks, vs, qs
                for bs in block_sizes:
                    # The pool is built beside the dense cache: its size plus one tensor's temporary.
                    if not _fits(device, 3 * kv_bytes // 2 + (1 << 30), args.mem_fraction, f"B={B} L={L} paged{bs}"):
                        writer.add(dict(base, impl="ours", layout=f"paged{bs}", note="skipped: memory"))
                        continue
                    kp, vp, table = _paged_copy(k, v, bs)
                    # Steady state, paged: one pool of copies × the blocks, step i through its own
                    # block table (a random permutation of the whole pool: fragmented, as above).
                    blocks = table.numel()
                    copies = _steady_copies(device, 2 * blocks * hkv * bs * dim * elem, args.mem_fraction,
                                            f"B={B} L={L} paged{bs}")
                    steady = None
                    if copies:
                        pool_k = torch.randn(copies * blocks, hkv, bs, dim, device=device, dtype=dtype, generator=g)
                        pool_v = torch.randn(copies * blocks, hkv, bs, dim, device=device, dtype=dtype, generator=g)
                        tables = torch.randperm(copies * blocks, device=device).view(copies, *table.shape).int()
                        qs = torch.randn(copies, B, hq, 1, dim, device=device, dtype=dtype, generator=g)
                        steady = (lambda i: lambda: decode(qs[i], pool_k, pool_v, seqlens, block_table=tables[i]),
                                  copies)
                    record("ours", f"paged{bs}", lambda: decode(q, kp, vp, seqlens, block_table=table), ref,
                           steady=steady)
                    del kp, vp, table, steady
                    if copies:
                        del pool_k, pool_v, tables, qs
                del q, k, v
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
            line["ours/sdpa"] = flash["ms"] / ours["ms"]
        if ours:
            line["us"] = ours["ms"] * 1e3
            if ours.get("steady_ms") is not None:
                line["steady us"] = ours["steady_ms"] * 1e3
            line["max_diff"] = ours.get("max_abs_diff")
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
            line["auto"] = got[("ours", "contiguous")]["kv_tbps"]
            sweep_rows.append(line)
        cols = []
        for line in sweep_rows:
            cols += [c for c in line if c not in cols]
        print("\nKV TB/s by num_splits (contiguous):")
        print(format_table(sweep_rows, cols))


__all__ = ["add_arguments", "run"]
