"""Tuning data for decode's stage 1 (issue 7): KV bandwidth of each kernel variant against SDPA.

Hypothesis under test: at B 1 the split kernel is latency-bound (one program per SM, few bytes in
flight). Each variant (``decode.decode_forward``'s launch settings, e.g. a fixed config, or a
``num_splits``) changes how many K/V bytes a program has requested ahead: cp.async pipeline depth
(``num_stages``: num_stages − 1 tiles in flight), tile size, and more programs per SM (more splits).
Fixed configs bypass the autotuner, so each variant measures what its name says; ``default`` is
``decode()`` as shipped (autotuned; its choice is recorded). The 15:56 sweep of 2026-11-23 also
timed unpipelined tiles with V loaded next to K, L2 prefetch ahead of the pipeline and loads issued
before the sequence length arrives: none beat the default (``benchmarks/NOTES.md``), and that code
is gone. The prefetch kept since 18:10 differs: one tile, asked for while stage 1 still waits for
the previous kernel (``decode.PREFETCH_TILES``).

Problem: Hq 32, Hkv 8, d 128, bf16, one new token, every sequence full; B 1 at 4k / 32k / 128k,
B 8 at 32k, contiguous, and B 1 32k paged by 256. Time: CUDA-graph replay, cold clean L2
(``common.time_ms_graph``), the same run as SDPA flash and cuDNN. Before timing, each variant
runs on a fresh query with its likely output blocks poisoned with NaN and is checked against a
float32 reference (o and lse). At B 1 4k two probes time the fixed part of a step: one tiny
kernel in a graph, and decode() over empty sequences. Every implementation and probe is also timed
in steady state (``steady_us``, ``steady_kv_tbps``: ``steady_copies`` steps over as many distinct
caches in one graph, per step, ``common.time_ms_graph_steady``; see ``flashattn_lite.bench.decode``),
which leaves out the per-replay launch and events that ``us`` includes. JSON under ``--out``. About
120 s on an H100 (compiles included; ``--time-budget`` stops starting new points).

    PYTHONPATH=. python benchmarks/decode_sweep.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashattn_lite.bench import common  # noqa: E402
from flashattn_lite.bench.decode import _paged_copy, _sdpa_call, _sdpa_peers, _steady_copies  # noqa: E402
from flashattn_lite.ops import decode as dec  # noqa: E402

HQ, HKV, DIM, DTYPE = 32, 8, 128, torch.bfloat16
# (name, B, L, page size or None, variants or None for all); the first cases matter most (the
# time budget cuts the tail). The paged case runs the variants that need no extra compile but one.
CASES = [("B1-4k", 1, 4096, None, None), ("B1-32k", 1, 32768, None, None), ("B8-32k", 8, 32768, None, None),
         ("B1-128k", 1, 131072, None, None),
         ("B1-32k-paged256", 1, 32768, 256, ("default", "bn64-s3", "bn128-s3", "pf0"))]
PROBE_CASE = "B1-4k"  # also times the fixed cost of a step (see _sweep_case)
PROBE_STEADY_COPIES = 64  # the probes read no cache: as many steps as common.steady_state_copies allows
# name: (decode_forward's launch settings, num_splits (None: the heuristic's; others run at B 1 only)). K/V tiles in
# flight per program in brackets (a 64-key tile of K + V is 32 KB; a B 1 4k split is 256 keys, 128 KB).
VARIANTS = {
    "default": ({}, None),                                              # autotuned, as shipped
    "no-pdl": (dict(no_pdl=True), None),                                # merge launched after stage 1 ends
    "bn64-s2": (dict(config=(64, 4, 2)), None),                         # [1 tile]
    "bn64-s3": (dict(config=(64, 4, 3)), None),                         # [2]
    "bn64-s4": (dict(config=(64, 4, 4)), None),                         # [3]
    "bn128-s3": (dict(config=(128, 4, 3)), None),                       # [2 × 64 keys: a 4k split at once]
    "s32-bn64-s2": (dict(config=(64, 4, 2)), 32),                       # [~2 programs per SM]
    "s64-bn64-s2": (dict(config=(64, 4, 2)), 64),                       # [~4 programs per SM]
    # More bytes in flight per SM at B 1 32k without losing pipeline depth.
    "s32-bn64-s3": (dict(config=(64, 4, 3)), 32),                       # [2 per program, 2 programs per SM]
    "bn64-s3-w8": (dict(config=(64, 8, 3)), None),                      # [2, twice the warps issuing]
    "bn32-s6": (dict(config=(32, 4, 6)), None),                         # [5 half tiles]
    # The fixed cost of a step. The default launches stage 1 as a programmatic dependent of the
    # previous kernel and the merge reads o beside lse; these restore the launch form of 16:23.
    "no-chain": (dict(no_chain=True), None),                            # stage 1 placed after the merge ends
    "masked-parts": (dict(masked_parts=True), None),                    # merge reads o after lse
    "plain-launch": (dict(no_chain=True, masked_parts=True, prefetch_tiles=0), None),
    # L2 prefetch of the split's first key tiles while stage 1 waits for the previous kernel
    # (the default prefetches decode.PREFETCH_TILES = 1).
    "pf0": (dict(prefetch_tiles=0), None),
    "pf2": (dict(prefetch_tiles=2), None),                               # lost, as did 4 (NOTES, 18:03)
}


def reference(q, kf, vf, scale):
    """float32 (o, lse) of one new token per sequence over its whole cache, GQA by head groups."""
    B, hq, _, d = q.shape
    qg = q.float().view(B, kf.shape[1], hq // kf.shape[1], d)
    s = torch.einsum("bhgd,bhld->bhgl", qg, kf) * scale
    o = torch.einsum("bhgl,bhld->bhgd", torch.softmax(s, -1), vf)
    return o.reshape(B, hq, 1, -1), torch.logsumexp(s, -1).reshape(B, hq, 1)


def poison_outputs(B, splits, device):
    """Allocate and free NaN blocks of the sizes decode allocates, so a kernel that skips a write
    leaves NaN (the caching allocator hands recently freed blocks of a size back first)."""
    blocks = [torch.full((B, HQ, 1, DIM), float("nan"), device=device, dtype=DTYPE),
              torch.full((B, HQ, 1), float("nan"), device=device),
              torch.full((B, HQ, 1, splits, DIM), float("nan"), device=device),
              torch.full((B, HQ, 1, splits), float("nan"), device=device)]
    del blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES),
                        help="comma-separated, from: " + ", ".join(c[0] for c in CASES))
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--time-budget", type=float, default=140, help="start no new point after this many seconds")
    args = parser.parse_args()
    try:
        variants = common.split_list(args.variants, VARIANTS, "--variants")
        cases = common.split_list(args.cases, [c[0] for c in CASES], "--cases")
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        parser.exit(2, "decode_sweep.py times the GPU decode kernels: it needs a CUDA device\n")
    rows, skipped = [], []
    try:
        sweep(cases, variants, args.time_budget, "cuda", rows, skipped)
    finally:
        _print(rows)
        print("\nsteady state (per step, several steps over distinct caches in one graph):", end="")
        _print(rows, "steady_")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        print("wrote", common.write_json(out, "decode_sweep", rows, config=dict(heads=HQ, kv_heads=HKV, head_dim=DIM,
                                                                                dtype=str(DTYPE)),
                                         variants={n: dict(tuning=t, splits_b1=s) for n, (t, s) in VARIANTS.items()},
                                         skipped=skipped))


def sweep(cases, variants, budget_s, device, rows, skipped):
    """Measure every (case, variant), appending result rows (and the points past the budget)."""
    t0 = time.perf_counter()
    for case in CASES:
        if case[0] in cases:
            _sweep_case(*case, variants, lambda: time.perf_counter() - t0 > budget_s, device, rows, skipped)
            if device == "cuda":
                torch.cuda.empty_cache()


def _sweep_case(case, B, L, page, only, variants, over_budget, device, rows, skipped):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, HQ, 1, DIM, device=device, dtype=DTYPE, generator=g)
    k = torch.randn(B, HKV, L, DIM, device=device, dtype=DTYPE, generator=g)
    v = torch.randn(B, HKV, L, DIM, device=device, dtype=DTYPE, generator=g)
    seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
    kv_bytes = 2 * B * HKV * L * DIM * k.element_size()
    base = dict(case=case, B=B, L=L, layout=f"paged{page}" if page else "contiguous", kv_bytes=kv_bytes)

    def timed(fn, make_step=None, copies=None):
        """One step replayed from a graph; with ``make_step``, also ``copies`` steps in one graph."""
        ms = common.time_ms_graph(fn)
        if ms is None:
            return dict(note="could not be captured")
        got = dict(us=ms * 1e3, kv_tbps=kv_bytes / (ms * 1e-3) / 1e12, timing="cuda-graph")
        if make_step is not None and copies:
            steady_ms = common.time_ms_graph_steady(make_step, copies)
            got["steady_copies"] = copies
            if steady_ms is not None:
                got.update(steady_us=steady_ms * 1e3, steady_kv_tbps=kv_bytes / (steady_ms * 1e-3) / 1e12)
        return got

    kf, vf = k.float(), v.float()
    kc, vc, table = _paged_copy(k, v, page) if page else (k, v, None)
    # Steady state: step i reads slice i of a (copies, B, Hkv, L, D) cache (dense, for the peers and
    # the contiguous variants), or its own block table into a pool of copies × the blocks (paged).
    copies = _steady_copies(q.device, kv_bytes, 0.85, case)
    if copies:
        qs = torch.randn(copies, *q.shape, device=device, dtype=DTYPE, generator=g)
        ks = torch.randn(copies, *k.shape, device=device, dtype=DTYPE, generator=g)
        vs = torch.randn(copies, *v.shape, device=device, dtype=DTYPE, generator=g)
    peers, steady_peers = {}, {}
    for name, backend in _sdpa_peers(q.device):
        call, how = _sdpa_call(q, k, v, backend)
        if call is None:
            rows.append(dict(base, impl=name, note=how))
            continue
        common.warm_up(call, f"{name} {case}")
        step = (lambda i, backend=backend: _sdpa_call(qs[i], ks[i], vs[i], backend)[0]) if how == "native" else None
        rows.append(dict(base, impl=name, gqa=how, **timed(call, step, copies)))
        peers[name], steady_peers[name] = rows[-1].get("us"), rows[-1].get("steady_us")
        _line(rows[-1])
    if copies and page:
        del ks, vs
        copies = _steady_copies(q.device, 2 * table.numel() * HKV * page * DIM * k.element_size(), 0.85, case)
        if copies:
            pool_k = torch.randn(copies * table.numel(), HKV, page, DIM, device=device, dtype=DTYPE, generator=g)
            pool_v = torch.randn(copies * table.numel(), HKV, page, DIM, device=device, dtype=DTYPE, generator=g)
            tables = torch.randperm(copies * table.numel(), device=device).view(copies, *table.shape).int()
            qs = torch.randn(copies, *q.shape, device=device, dtype=DTYPE, generator=g)

    def step_inputs(i):
        """Step i's (q, k_cache, v_cache, block_table) for the steady-state graph."""
        return (qs[i], pool_k, pool_v, tables[i]) if page else (qs[i], ks[i], vs[i], None)
    sms = dec.device_sm_count(q)
    for name in variants:
        tuning, splits = VARIANTS[name]
        if (only and name not in only) or (splits and B > 1):
            continue
        if over_budget():
            skipped.append(dict(case=case, impl=name))
            continue
        row = dict(base, impl=name, tuning=str(tuning), num_splits=splits or dec.choose_num_splits(B, HKV, 1, L, sms))
        fn = lambda qq=q: _decode(qq, kc, vc, seqlens, table, splits, tuning)  # noqa: E731
        try:
            row.update(_check(fn, q, kf, vf, row["num_splits"]))
            if name == "default":
                row["autotuned"] = str(next(iter(dec._decode_split_kernel.tuning.chosen.values())).config)
            if not (row["max_abs_diff"] <= 1e-2 and row["lse_diff"] <= 1e-2):   # NaN fails too
                row["note"] = "WRONG: not timed"
            else:
                common.warm_up(fn, f"{name} {case}")

                def make_step(i, splits=splits, tuning=tuning):
                    qi, ki, vi, ti = step_inputs(i)
                    return lambda: _decode(qi, ki, vi, seqlens, ti, splits, tuning)
                row.update(timed(fn, make_step, copies))
        except Exception as e:  # a variant that cannot run here (resources, compiler): recorded, not fatal
            if device == "cuda":
                torch.cuda.synchronize()
            row["note"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        for peer, us in peers.items():
            if us and "us" in row:
                row[f"x_{peer}"] = us / row["us"]
            if steady_peers.get(peer) and "steady_us" in row:
                row[f"steady_x_{peer}"] = steady_peers[peer] / row["steady_us"]
        rows.append(row)
        _line(row)
    if case == PROBE_CASE and "default" in variants:
        # The fixed part of a step: one tiny kernel in a graph (replay + events), and decode() with
        # every sequence empty (both launches, the length load, the partial stores, the merge).
        # After the variants: the empty call must not be the one that autotunes this length bucket.
        one, empty = torch.zeros(1, device=device), torch.zeros_like(seqlens)
        # In steady state the same call repeats (no cache is read, so nothing needs to differ).
        for name, fn in (("floor-1-kernel", lambda: one.add_(1)),
                         ("default-len0", lambda: dec.decode(q, kc, vc, empty, block_table=table))):
            common.warm_up(fn, name)
            got = timed(fn, lambda i, fn=fn: fn, PROBE_STEADY_COPIES if device == "cuda" else None)
            rows.append(dict(base, impl=name, us=got.get("us"), steady_us=got.get("steady_us"),
                             steady_copies=got.get("steady_copies")))
            _line(rows[-1])


def _decode(q, k, v, seqlens, table, splits, tuning):
    """(o, lse): ``decode()`` as shipped for no settings, else its launcher with the variant's."""
    if not tuning:
        return dec.decode(q, k, v, seqlens, block_table=table, num_splits=splits, return_lse=True)
    return dec.decode_forward(q, k, v, seqlens, table, scale=DIM ** -0.5, num_splits=splits, launch=tuning)


def _check(fn, q, kf, vf, splits):
    """Max |error| of o and lse on a fresh query (a result left by another call cannot match),
    with decode's output blocks poisoned first."""
    q_check = torch.randn_like(q)
    o_ref, lse_ref = reference(q_check, kf, vf, DIM ** -0.5)
    poison_outputs(q.shape[0], splits, q.device)
    o, lse = fn(q_check)
    return dict(max_abs_diff=(o.float() - o_ref).abs().max().item(), lse_diff=(lse - lse_ref).abs().max().item())


def _line(row):
    nan = float("nan")

    def get(key):
        return nan if row.get(key) is None else row[key]
    print(f"{row['case']:16s} {row['impl']:16s} {get('us'):8.2f} us {get('kv_tbps'):5.3f} TB/s"
          f"  x flash {get('x_sdpa-flash'):.3f}  steady {get('steady_us'):8.2f} us {get('steady_kv_tbps'):5.3f} TB/s"
          f" (x{row.get('steady_copies') or 0})  diff {get('max_abs_diff'):.1e}"
          f"  {row.get('autotuned', '')}{row.get('note', '')}", flush=True)


def _print(rows, prefix=""):
    """One line per implementation: µs and KV TB/s per case, and × SDPA flash at B 1 4k (probes:
    µs only); ``prefix="steady_"`` gives the same table in steady state."""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    table = {}
    for r in rows:
        line = table.setdefault(r["impl"], {"impl": r["impl"]})
        if r.get(prefix + "us") is not None:
            line[f"{r['case']} us"] = r[prefix + "us"]
            line[f"{r['case']} TB/s"] = r.get(prefix + "kv_tbps")
            if r["case"] == "B1-4k" and prefix + "x_sdpa-flash" in r:
                line["4k x flash"] = r[prefix + "x_sdpa-flash"]
        elif "note" in r:
            line[f"{r['case']} us"] = r["note"][:20]
    columns = ["impl"] + [f"{c} {u}" for c in cases for u in ("us", "TB/s")] + ["4k x flash"]
    print("\n" + common.format_table(list(table.values()), [c for c in columns
                                                              if any(c in line for line in table.values())]))


if __name__ == "__main__":
    main()
