"""Ring attention and sharding over real process groups: gloo on CPU, 2 and 4 processes on 127.0.0.1.

Each world is one spawn of worker processes (this file, run as a script) that runs every case of
that world in turn and prints one RESULT line per case; one test per world reads those lines and
names every case that failed on any rank. Outputs and gradients are compared with single-device
attention over the whole sequence (a float64 reference and the package's own attention in the
same dtype: ours may err at most twice as much as that, plus eps). Most cases run the PyTorch CPU
twin (TRITON_INTERPRET=0 in the workers); one world runs the Triton kernels in the interpreter.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # a worker process: the repository's package, without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ranks  # noqa: E402 (tests/ranks.py)
from flashattn_lite.distributed.ring import schedule
from flashattn_lite.distributed.sharding import runs



# ------------------------------------------------------------------ the schedule (no processes)

def _positions(layout, rank, world, n):
    return [g + i for _, g, length in runs(layout, rank, world, n) for i in range(length)]


def _piece_mask(p):
    """The (q1 − q0, k1 − k0) mask a piece's call applies (``attention_core``'s semantics)."""
    i = torch.arange(p.q1 - p.q0).view(-1, 1) + p.offset
    j = torch.arange(p.k1 - p.k0).view(1, -1)
    seen = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool)
    if p.left >= 0:
        seen &= j >= i - p.left
    if p.causal:
        seen &= j <= i
    elif p.right >= 0:
        seen &= j <= i + p.right
    return seen


def _check_schedule(layout, world, n, causal, window):
    """Every (query, key) pair of every rank and step is computed once if visible, never if not.
    Returns the pieces of each rank and its count of computed pairs."""
    left, right = window
    per_rank = []
    for rank in range(world):
        qpos, done = _positions(layout, rank, world, n), 0
        steps = schedule(layout, rank, world, n, causal, window)
        for step, pieces in enumerate(steps):
            kpos = torch.tensor(_positions(layout, (rank - step) % world, world, n)).view(1, -1)
            got = torch.zeros(n, n, dtype=torch.int64)
            for p in pieces:
                got[p.q0:p.q1, p.k0:p.k1] += _piece_mask(p).long()
                done += (p.q1 - p.q0) * (p.k1 - p.k0)
            i = torch.tensor(qpos).view(-1, 1)
            want = torch.ones(n, n, dtype=torch.bool)
            right_side = 0 if causal else right  # causal caps the right side at 0
            if left >= 0:
                want &= kpos >= i - left
            if right_side >= 0:
                want &= kpos <= i + right_side
            assert torch.equal(got, want.long()), (layout, world, n, causal, window, rank, step, pieces)
        per_rank.append((steps, done))
    return per_rank


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_schedule_covers_exactly_the_visible_pairs(layout):
    """Causal alone: zigzag needs one call per step, and every rank does the same causal work."""
    for world in (1, 2, 3, 4):
        for n in (2, 4, 6):
            per_rank = _check_schedule(layout, world, n, True, (-1, -1))
            if layout == "zigzag":
                assert all(len(pieces) == 1 for steps, _ in per_rank for pieces in steps)
                assert len({done for _, done in per_rank}) == 1, "unbalanced causal work over ranks"
    full = schedule(layout, 1, 3, 4, causal=False)
    assert [[(p.q0, p.q1, p.k0, p.k1, p.causal) for p in s] for s in full] == [[(0, 4, 0, 4, False)]] * 3


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_plan_sends_only_the_rows_later_ranks_use(layout):
    """``plan``'s hops: each K/V hop holds exactly the key rows that later steps use of the block it
    carries, each accumulator hop the rows touched so far, as sorted disjoint runs, in a buffer of
    the most rows any block needs; the owner's own block never travels as gradient. Without a window
    every hop is the whole block (W − 1 K/V hops, W − 1 accumulator hops); a window narrower than a
    shard's chunks cuts both to its left + right rows (zigzag: twice, a block's two chunks), and a
    contiguous causal one stops after the neighbour."""
    from flashattn_lite.distributed.ring import plan

    def rows_in(runs):
        return {i for lo, hi in runs for i in range(lo, hi)}

    for world in (1, 2, 3, 4, 5):
        for n in (4, 8, 16):
            for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (2, -1)), (False, (3, 2)),
                                   (True, (n + 1, 0)), (True, (1, 0))):
                every, hops = plan(layout, world, n, causal, window)
                assert len(hops.kv) == world - 1 and len(hops.grads) == world and hops.grads[0][0] == 0
                for b in range(world):
                    keys = [None] + [[(p.k0, p.k1) for p in every[(b + t) % world][t]] for t in range(1, world)]
                    # The K/V hop posted at step s: the rows steps s + 1 … W − 1 use; the accumulator
                    # hop posted at step s ≥ 1: the rows steps 1 … s touched.
                    cases = [(hops.kv[s], range(s + 1, world), "kv") for s in range(world - 1)]
                    cases += [(hops.grads[s], range(1, s + 1), "grads") for s in range(1, world)]
                    for (rows, spans), steps, what in cases:
                        wanted = rows_in(k for t in steps for k in keys[t])
                        runs = spans[b]
                        assert rows_in(runs) == wanted, (what, steps, b, runs)
                        assert list(runs) == sorted(runs) and all(lo < hi for lo, hi in runs)
                        assert all(runs[i][1] < runs[i + 1][0] for i in range(len(runs) - 1))
                        assert sum(hi - lo for lo, hi in runs) <= rows <= n
                for rows, spans in hops.kv + hops.grads:
                    assert rows == max(sum(hi - lo for lo, hi in runs) for runs in spans)
                if window == (-1, -1):
                    assert all(rows == n for rows, _ in hops.kv) and all(rows == n for rows, _ in hops.grads[1:])
                elif max(window) < n // 2 and world > 1:  # narrower than a chunk
                    # Each side reaches its own strip: left + right rows (right capped at 0 by
                    # causal); zigzag: a block's two chunks, twice that (once where causal on W = 2).
                    sides = window[0] + (0 if causal else max(window[1], 0))
                    twice = layout == "zigzag" and not (causal and world == 2)
                    assert all(rows <= (2 if twice else 1) * sides for rows, _ in hops.kv + hops.grads)
                    if layout == "contiguous" and causal:
                        assert all(rows == 0 for rows, _ in hops.kv[1:])


@pytest.mark.parametrize("args, error, needle", [
    (("diagonal", 2, 4, True), ValueError, "layout"), (("zigzag", 0, 4, True), ValueError, "world"),
    (("zigzag", 2.0, 4, True), ValueError, "world"), (("contiguous", 2, 0, True), ValueError, "n_local"),
    (("zigzag", 2, 3, True), ValueError, "n_local must be even"), (("zigzag", 2, 4, "yes"), TypeError, "causal"),
    (("zigzag", 2, 4, True, [2, 0]), ValueError, "window"), (("zigzag", 2, 4, True, (2,)), ValueError, "window"),
    (("zigzag", 2, 4, True, (-2, 0)), ValueError, "window")])
def test_plan_rejects_bad_arguments(args, error, needle):
    from flashattn_lite.distributed.ring import plan
    with pytest.raises(error, match=needle):
        plan(*args)


@pytest.mark.parametrize("argv, needle", [(["--window", "-1"], "--window"), (["--softcap", "0"], "--softcap"),
                                          (["--lengths", "6", "--layout", "zigzag", "--window", "2"], None)])
def test_ring_benchmark_checks_its_options(argv, needle):
    import argparse
    from flashattn_lite.bench import common
    from flashattn_lite.bench import ring as bench_ring
    parser = argparse.ArgumentParser()
    bench_ring.add_arguments(parser)
    args = parser.parse_args(argv)
    if needle is None:
        assert bench_ring._resolve(args, "cpu")["lengths"] == [6]
        return
    with pytest.raises(common.BenchArgumentError, match=needle):
        bench_ring._resolve(args, "cpu")


def test_ring_compute_script_checks_its_window():
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ring_compute.py"
    run = subprocess.run([sys.executable, str(script), "--out", "unused", "--lengths", "64", "--window", "-2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--window must be a left side >= 0" in run.stderr, run.stderr


def test_visible_pairs_counts_what_the_calls_attend_to():
    from flashattn_lite.bench.ring import visible_pairs
    from flashattn_lite.distributed.ring import Piece
    assert visible_pairs([Piece(0, 7, 0, 7, True, 0)]) == 28 and visible_pairs([Piece(0, 3, 0, 5, False, 2)]) == 15
    for layout in ("zigzag", "contiguous"):
        for causal, window in ((True, (-1, -1)), (True, (3, 0)), (False, (2, 5)), (False, (-1, 1))):
            for rank in range(3):
                pieces = [p for s in schedule(layout, rank, 3, 6, causal, window) for p in s]
                assert visible_pairs(pieces) == sum(int(_piece_mask(p).sum()) for p in pieces)


def test_fingerprint_sees_every_byte():
    """The agreement compares values by two weighted sums of their bytes: equal bytes give equal
    prints whatever the dtype's view, and changing any one byte changes both."""
    from flashattn_lite.distributed._group import _fingerprint
    x = torch.randn(37, generator=torch.Generator().manual_seed(3))
    base = _fingerprint({"a": x, "b": None}, torch.device("cpu"))
    assert torch.equal(base, _fingerprint({"a": x.clone()}, torch.device("cpu")))
    raw = x.view(torch.uint8)
    for i in range(raw.numel()):
        changed = raw.clone()
        changed[i] ^= 1 << (i % 8)
        print_ = _fingerprint({"a": changed.view(torch.float32)}, torch.device("cpu"))
        assert (print_ != base).all(), i
    assert torch.equal(_fingerprint({}, torch.device("cpu")), torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_schedule_with_a_window(layout):
    """Sliding windows over global positions, causal or not, one side or two, narrower and wider
    than a shard: exact cover; blocks outside every window have no call (O(N·W) work)."""
    for world in (1, 2, 3, 4):
        for n in (2, 4, 6, 8):
            for causal in (True, False):
                for window in ((0, 0), (1, -1), (3, 0), (5, 2), (-1, 3), (n, n // 2), (3 * n, -1)):
                    per_rank = _check_schedule(layout, world, n, causal, window)
                    for steps, _ in per_rank:
                        # its own block holds the diagonal; a window cuts a block into at most 4 calls
                        assert len(steps[0]) >= 1 and all(len(pieces) <= 4 for pieces in steps)
    # A window narrower than a chunk, zigzag: the own block is each chunk's causal diagonal, at
    # offset 0 (the Hopper kernels' diagonal); the neighbour's strip is cut to the rows and keys
    # that meet (2 × 2 for a window of 3) and its mask moved to the bottom-right offset.
    def calls(steps):
        return [[(p.q0, p.q1, p.k0, p.k1, p.causal, p.offset, p.left, p.right) for p in s] for s in steps]
    assert calls(schedule("zigzag", 0, 2, 16, True, (2, -1))) == [
        [(0, 8, 0, 8, True, 0, 2, -1), (8, 16, 8, 16, True, 0, 2, -1)], [(8, 10, 14, 16, False, 0, 0, -1)]]
    assert calls(schedule("zigzag", 1, 2, 16, True, (2, -1)))[1] == [(0, 2, 6, 8, False, 0, 0, -1)]
    # Every masked call of a windowed schedule sits at the bottom-right offset.
    for layout in ("zigzag", "contiguous"):
        for causal, window in ((True, (3, 0)), (True, (8, -1)), (False, (5, 2)), (False, (-1, 3))):
            for rank in range(4):
                for p in (p for s in schedule(layout, rank, 4, 16, causal, window) for p in s):
                    assert not (p.causal or p.left >= 0 or p.right >= 0) or p.offset == (p.k1 - p.k0) - (p.q1 - p.q0)
    # A window narrower than a shard: a contiguous rank computes only its own block and its left neighbour's.
    steps = schedule("contiguous", 2, 4, 8, True, (3, -1))
    assert [len(pieces) for pieces in steps] == [1, 1, 0, 0]
    assert steps[0][0].causal and steps[0][0].left == 3 and steps[0][0].offset == 0


# ------------------------------------------------------------------ worker side

_device = "cpu"  # the workers of the NCCL world use their GPU


def _seeded(seed, *shape, dtype):
    """The same random tensor on every rank."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.to(device=_device, dtype=dtype)


def _randn(*shape):
    return torch.randn(*shape, device=_device)


def _compare(rank, world, *, dtype, layout, causal, hq=2, hkv=2, n=4, d=8, dv=None, b=1, scale=None,
             with_lse=False, strided=False, group=None, eps=None, window=None, softcap=None, sinks=False):
    """Ring attention on this rank's shards against whole-sequence attention: o (and lse) and the
    gradients of ⟨o, do⟩ (+ ⟨lse, dlse⟩) with respect to q, k, v (and the sinks: each rank's share,
    summed over the group)."""
    import torch.distributed as dist
    import flashattn_lite
    from conftest import assert_close_to_ref
    from flashattn_lite.distributed import ring_attention, shard
    from flashattn_lite.reference import attention_reference

    dv = d if dv is None else dv
    N = world * n
    if strided:  # (B, N, H, D) storage seen as (B, H, N, D), as a model's projections give it
        q, k, v = (_seeded(s, b, N, h, e, dtype=dtype).transpose(1, 2)
                   for s, h, e in ((1, hq, d), (2, hkv, d), (3, hkv, dv)))
    else:
        q, k, v = (_seeded(s, b, h, N, e, dtype=dtype) for s, h, e in ((1, hq, d), (2, hkv, d), (3, hkv, dv)))
    do, dlse = _seeded(4, b, hq, N, dv, dtype=dtype), _seeded(5, b, hq, N, dtype=torch.float32)
    inputs = [q, k, v] + ([_seeded(6, hq, dtype=torch.float32)] if sinks else [])
    options = dict(causal=causal, scale=scale, window=window, softcap=softcap)

    def run(fn, tensors, cut):
        tensors = [x.detach().clone().requires_grad_() for x in tensors]
        o, lse = fn(*tensors)
        loss = (o.double() * cut(do).double()).sum()
        if with_lse:
            loss = loss + (lse.double() * cut(dlse).double()).sum()
        loss.backward()
        return [o, lse] + [x.grad for x in tensors]

    def split(fn):  # (q, k, v[, sinks]) positionally → the keyword the functions take
        return lambda q, k, v, *sink: fn(q, k, v, sinks=sink[0] if sink else None)

    whole = lambda x: x  # noqa: E731
    ref = run(split(lambda *t, sinks: attention_reference(*t, sinks=sinks, **options)), inputs, whole)
    base = run(split(lambda *t, sinks: flashattn_lite.attention(*t, sinks=sinks, return_lse=True, **options)),
               inputs, whole)
    cut = lambda x: shard(x, 2, group=group, layout=layout)  # noqa: E731
    shards = [shard(x.transpose(1, 2), 1, group=group, layout=layout).transpose(1, 2) if strided else cut(x)
              for x in (q, k, v)]
    assert strided != shards[0].is_contiguous()
    ours = run(split(lambda *t, sinks: ring_attention(*t, sinks=sinks, group=group, layout=layout, return_lse=True,
                                                      **options)), shards + inputs[3:], cut)
    assert ours[0].dtype == dtype and ours[0].shape == (b, hq, n, dv)
    eps = eps if eps is not None else {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-5,
                                       torch.float64: 1e-6}[dtype]
    for what, mine, theirs, exact in zip(("o", "lse", "dq", "dk", "dv"), ours, base, ref):
        if what == "lse" and not with_lse:
            continue
        assert_close_to_ref(mine, cut(theirs), cut(exact), eps=eps, what=what)
    if sinks:
        total = ours[5].clone()
        dist.all_reduce(total, group=group)
        assert_close_to_ref(total, base[5], ref[5], eps=eps, what="dsinks")


def _raises(fn, *needles, types=(ValueError,)):
    with pytest.raises(types) as info:
        fn()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {info.value}"


def _bad(rank, on_rank_1=None, **changes):
    """ring_attention on small valid inputs with ``changes`` on every rank, ``on_rank_1`` on rank 1 only."""
    from flashattn_lite.distributed import ring_attention
    args = dict(q=_randn(1, 2, 4, 8), k=_randn(1, 2, 4, 8), v=_randn(1, 2, 4, 8),
                causal=True, layout="zigzag")
    args.update(changes)
    args.update(on_rank_1 if rank == 1 and on_rank_1 else {})
    return lambda: ring_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def _case_shard_roundtrip(rank, world):
    from flashattn_lite.distributed import shard, unshard
    x = _seeded(7, 3, 4 * world, 5, dtype=torch.float32)
    for layout in ("zigzag", "contiguous"):
        part = shard(x, 1, layout=layout)
        assert part.shape == (3, 4, 5)
        assert torch.equal(unshard(part, -2, layout=layout), x)
    chunk = x.shape[1] // (2 * world)  # zigzag: chunk r, then chunk 2W - 1 - r
    assert torch.equal(shard(x, 1)[:, :chunk], x[:, rank * chunk:(rank + 1) * chunk])
    assert torch.equal(shard(x, 1)[:, chunk:], x[:, (2 * world - 1 - rank) * chunk:(2 * world - rank) * chunk])
    leaf = x.clone().requires_grad_()
    shard(leaf, 1).sum().backward()
    assert leaf.grad.sum().item() == x.numel() / world


def _case_errors(rank, world):
    """Bad arguments raise on every rank (the exchange that checks them does not hang), and the
    group still works afterwards (the next case)."""
    from flashattn_lite.distributed import shard, unshard
    odd = _randn(1, 2, 5, 8)
    _raises(_bad(rank, q=odd, k=odd, v=odd), "even", "zigzag")
    _raises(_bad(rank, layout="striped"), "layout", "striped")
    # Flags are bools, as everywhere in the package: TypeError (a truthy 1 or "no" is not taken as True).
    _raises(_bad(rank, causal=1), "causal must be a bool", types=(TypeError,))
    _raises(_bad(rank, causal="yes"), "causal must be a bool", types=(TypeError,))
    _raises(_bad(rank, return_lse="no"), "return_lse must be a bool", types=(TypeError,))
    # Rank 1's own check raises its TypeError; the other ranks quote it.
    _raises(_bad(rank, dict(return_lse=1)), "return_lse must be a bool",
            types=(TypeError if rank == 1 else ValueError,))
    _raises(_bad(rank, group="world"), "group")
    # Only rank 1 differs or is invalid: every rank must still raise.
    longer = _randn(1, 2, 6, 8)
    _raises(_bad(rank, dict(q=longer, k=longer, v=longer)), "q must be the same on every rank")
    _raises(_bad(rank, dict(k=_randn(1, 3, 4, 8), v=_randn(1, 3, 4, 8))), "multiple of k/v heads")
    _raises(_bad(rank, dict(v=longer)), "v local sequence length")
    half = _randn(1, 2, 4, 8).half()
    _raises(_bad(rank, dict(q=half, k=half, v=half)), "q must be the same")
    _raises(_bad(rank, dict(scale=0.5)), "scale must be the same")
    # A check that raises neither TypeError nor ValueError on rank 1 alone (.item() of a meta scale)
    # still reaches every rank (the others would otherwise pair this call with rank 1's next one).
    _raises(_bad(rank, dict(scale=torch.tensor(0.5, device="meta"))), "meta",
            types=(RuntimeError if rank == 1 else ValueError,))
    _raises(_bad(rank, dict(q=_randn(1, 2, 4, 8).requires_grad_())), "requires_grad must be the same")
    _raises(_bad(rank, window=(-3, 0)), "window left side")
    _raises(_bad(rank, window=(2, 1.5)), "window right side", types=(TypeError,))
    _raises(_bad(rank, softcap=-1.0), "softcap must be a finite float > 0")
    _raises(_bad(rank, sinks=_randn(3)), "sinks must have shape (2,)")
    _raises(_bad(rank, dict(softcap=2.0)), "softcap must be the same")
    _raises(_bad(rank, dict(window=(4, 0))), "window must be the same")
    _raises(_bad(rank, dict(sinks=torch.ones(2, device=_device)), sinks=torch.zeros(2, device=_device)),
            "sinks must hold the same values", "rank 1's differ")
    # One ulp apart in one value: still caught (compared by a fingerprint on the device).
    sinks = _seeded(8, 2, dtype=torch.float32)
    nudged = sinks.clone()
    nudged[1] = torch.nextafter(nudged[1], torch.tensor(float("inf"), device=_device))
    _raises(_bad(rank, dict(sinks=nudged), sinks=sinks), "sinks must hold the same values")
    _raises(_bad(rank, dict(sinks=sinks.double()), sinks=sinks), "sinks must be the same", "float64")
    _raises(lambda: unshard(_randn(2, 3 + rank), 1, layout="contiguous"), "x must be the same on every rank")
    _raises(lambda: unshard(_randn(2, 3), 1), "even")
    _raises(lambda: shard(_randn(2, 6), 1, layout="zigzag"), "multiple of")
    # TypeError for a wrong type, IndexError for a dim out of range (docs/api.md's rule, torch's too).
    _raises(lambda: shard(_randn(2, 8), 2), "dim out of range", types=(IndexError,))
    _raises(lambda: shard(_randn(2, 8), 1.0), "dim must be an int", types=(TypeError,))
    _raises(lambda: shard([[1.0] * 8] * 2, 1), "x must be a torch.Tensor", types=(TypeError,))
    _raises(lambda: unshard(_randn(2, 4), -3), "dim out of range", types=(IndexError,))
    _raises(lambda: unshard(_randn(2, 4), 1.0), "dim must be an int", types=(TypeError,))
    _raises(lambda: unshard([[1.0] * 4] * 2, 1), "x must be a torch.Tensor", types=(TypeError,))


def _case_bench_smoke(rank, world):
    """``flashattn-lite ring --backend gloo``'s sweep (here on the workers' own process group)."""
    import argparse
    from flashattn_lite.bench import ring as bench_ring
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    bench_ring.add_arguments(parser)
    out = os.environ["RING_TEST_OUT"]
    rows = bench_ring.run(parser.parse_args(["--lengths", "16", "--iters", "1", "--warmup", "0",
                                             "--no-plot", "--out", out]))
    assert [r["n_global"] for r in rows] == [16 * world]
    assert all(r["ring_ms"] > 0 and r["comm_ms"] > 0 and r["efficiency"] > 0 for r in rows)
    assert rows[0]["work_vs_local"] == world
    windowed = bench_ring.run(parser.parse_args(["--lengths", "16", "--iters", "1", "--warmup", "0", "--window", "5",
                                                 "--softcap", "3", "--sinks", "--no-plot", "--out", out + "/w"]))
    # a window of 6 keys: each rank does about the work of one GPU at n (plus a strip of its neighbour's)
    assert 1 < windowed[0]["work_vs_local"] < 1.5 and windowed[0]["efficiency"] > 0
    if rank == 0:
        docs = [json.loads(p.read_text()) for p in Path(out).glob("ring-*.json")]
        assert len(docs) == 1 and docs[0]["complete"] and docs[0]["world"] == world
        assert docs[0]["results"][0]["one_gpu_global_ms"] > 0


def _case_subgroups(rank, world):
    """Two rings of two ranks (global ranks 0,1 and 2,3), each over its own group; a process that is
    not a member of the group it passes is refused."""
    import torch.distributed as dist
    from flashattn_lite.distributed import ring_attention
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine, other = pairs[rank // 2], pairs[1 - rank // 2]
    _raises(lambda: ring_attention(_randn(1, 2, 4, 8), _randn(1, 2, 4, 8), _randn(1, 2, 4, 8),
                                   group=other), "not a member")
    _compare(dist.get_rank(mine), 2, dtype=torch.float32, layout="zigzag", causal=True, hq=4, hkv=2, group=mine)


def _case_cpu_tensors_on_nccl(rank, world):
    from flashattn_lite.distributed import ring_attention
    x = torch.randn(1, 2, 4, 8)
    _raises(lambda: ring_attention(x, x, x), "CUDA tensor")


F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
_CASES = {
    2: {
        "zigzag-causal-gqa-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=True, hq=4, hkv=2,
                                                        n=6),
        "contiguous-causal-fp32-odd-n": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous", causal=True, n=5),
        "zigzag-full-fp32-dv-scale": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=False, dv=12,
                                                           scale=0.3, b=2),
        "contiguous-full-fp16-mqa": lambda r, w: _compare(r, w, dtype=F16, layout="contiguous", causal=False,
                                                          hq=4, hkv=1),
        "zigzag-causal-fp16-odd-head-dim": lambda r, w: _compare(r, w, dtype=F16, layout="zigzag", causal=True,
                                                                 d=5, dv=3),
        "zigzag-causal-fp64-lse": lambda r, w: _compare(r, w, dtype=F64, layout="zigzag", causal=True, hq=4, hkv=2,
                                                        b=2, with_lse=True),
        "contiguous-causal-strided": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous", causal=True,
                                                           hq=4, hkv=2, strided=True, with_lse=True),
        "zigzag-causal-window-softcap-sinks-fp32": lambda r, w: _compare(
            r, w, dtype=F32, layout="zigzag", causal=True, hq=4, hkv=2, n=8, window=(3, None), softcap=2.0,
            sinks=True, with_lse=True),
        "contiguous-window-two-sides-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous", causal=False,
                                                                  n=6, window=(2, 4)),
        "zigzag-causal-sinks-fp16": lambda r, w: _compare(r, w, dtype=F16, layout="zigzag", causal=True, sinks=True),
        "shard-unshard": _case_shard_roundtrip,
        "bad-arguments-raise-on-every-rank": _case_errors,
        "after-errors-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=True),
        "bench-smoke": _case_bench_smoke,
    },
    4: {
        "zigzag-causal-gqa-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=True, hq=4, hkv=2,
                                                        with_lse=True),
        "contiguous-causal-fp32-odd-n": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous", causal=True, n=3,
                                                              dv=4),
        "zigzag-full-fp16": lambda r, w: _compare(r, w, dtype=F16, layout="zigzag", causal=False),
        # Rank 2's own block here is three pieces that overlap in rows and keys: its sums start from
        # zeros (the other ranks' pieces tile the block, and write them).
        "zigzag-causal-window-softcap-sinks-fp32": lambda r, w: _compare(
            r, w, dtype=F32, layout="zigzag", causal=True, hq=4, hkv=2, window=(5, 0), softcap=1.5, sinks=True),
        "contiguous-causal-window-fp32-odd-n": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous",
                                                                     causal=True, n=3, window=(2, -1)),
        # Windows narrower than a shard: trimmed hops, some of them empty (contiguous causal), and a
        # block carried past ranks that do not use it to the far neighbour (two sides, non-causal).
        "contiguous-causal-narrow-window-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous",
                                                                      causal=True, n=8, window=(2, -1)),
        "contiguous-two-sided-narrow-window-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="contiguous",
                                                                         causal=False, n=8, window=(3, 2)),
        "zigzag-causal-narrow-window-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=True,
                                                                  hq=4, hkv=2, n=8, window=(2, 0), with_lse=True),
        "shard-unshard": _case_shard_roundtrip,
        "bad-arguments-raise-on-every-rank": _case_errors,
        "subgroups": _case_subgroups,
    },
    # The Triton kernels in the interpreter (attention forward, backward and merge): one case.
    "interpreter": {
        "zigzag-causal-gqa-fp32": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=True, hq=4, hkv=2,
                                                        n=8, d=16, with_lse=True),
        "zigzag-causal-window-softcap-sinks-fp32": lambda r, w: _compare(
            r, w, dtype=F32, layout="zigzag", causal=True, n=8, d=16, window=(5, 0), softcap=2.0, sinks=True,
            with_lse=True),
    },
    # Two GPUs over NCCL (compiled kernels; skipped without two GPUs).
    "nccl": {
        "zigzag-causal-gqa-bf16": lambda r, w: _compare(r, w, dtype=BF16, layout="zigzag", causal=True, hq=8, hkv=2,
                                                        n=256, d=128, with_lse=True),
        "contiguous-causal-fp16": lambda r, w: _compare(r, w, dtype=F16, layout="contiguous", causal=True, n=200,
                                                        d=64, dv=32),
        "zigzag-full-fp32-strided": lambda r, w: _compare(r, w, dtype=F32, layout="zigzag", causal=False, hq=4,
                                                          hkv=1, n=128, d=80, strided=True),
        "shard-unshard": _case_shard_roundtrip,
        "bad-arguments-raise-on-every-rank": _case_errors,
        "cpu-tensors-refused": _case_cpu_tensors_on_nccl,
        "after-errors-bf16": lambda r, w: _compare(r, w, dtype=BF16, layout="zigzag", causal=True, n=64, d=64),
        # Long enough for the Hopper kernels (sm_90): the diagonal block causal, the other n/2 rows
        # against n keys non-causal with causal_offset 0.
        "zigzag-causal-hopper-bf16": lambda r, w: _compare(r, w, dtype=BF16, layout="zigzag", causal=True, hq=4,
                                                           hkv=2, n=4096, d=128, with_lse=True),
        # The options at those lengths: softcap and sinks on the Hopper kernels, the window's calls
        # off the bottom-right diagonal on the portable ones.
        "zigzag-causal-window-softcap-sinks-bf16": lambda r, w: _compare(
            r, w, dtype=BF16, layout="zigzag", causal=True, hq=4, hkv=2, n=4096, d=128, window=(3000, 0),
            softcap=30.0, sinks=True, with_lse=True),
        "bench-smoke": _case_bench_smoke,
    },
}


def _worker(world_key: str) -> None:
    import torch.distributed as dist
    global _device
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "gloo"
    if world_key == "nccl":
        backend, _device = "nccl", "cuda"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    for name, case in _CASES[int(world_key) if world_key.isdigit() else world_key].items():
        try:
            case(rank, world)
            result = dict(case=name, rank=rank, ok=True)
        except (Exception, pytest.fail.Exception):  # a failed pytest.raises is not an Exception
            result = dict(case=name, rank=rank, ok=False, error=traceback.format_exc())
        ranks.report(result)
    dist.destroy_process_group()


# ------------------------------------------------------------------ test side

def _spawn(world_key, world: int, interpret: bool, out: Path, timeout_s: float = 300) -> dict:
    return ranks.spawn(__file__, [str(world_key)], world,
                       {"TRITON_INTERPRET": "1" if interpret else "0", "OMP_NUM_THREADS": "1",
                        "RING_TEST_OUT": str(out), "FLASHATTN_LITE_AUTOTUNE": "0"}, timeout_s)


def _check_world(world_key, world: int, interpret: bool, out: Path) -> None:
    """Spawn one world, run all its cases, and fail naming every case that failed on any rank (one
    test per world, so that pytest-xdist never spawns a world twice)."""
    results = _spawn(world_key, world, interpret, out)
    problems = []
    for case in _CASES[world_key]:
        per_rank = results.get(case, {})
        if len(per_rank) != world:
            problems.append(f"{case}: reported by ranks {sorted(per_rank)} of {world}")
        problems += [f"{case} on rank {r['rank']}:\n{r['error']}" for r in per_rank.values() if not r["ok"]]
    assert not problems, "\n".join(problems) + f"\nworker output (end):\n{results['_log']}"


def test_two_ranks_gloo(tmp_path):
    _check_world(2, 2, False, tmp_path)


def test_four_ranks_gloo(tmp_path):
    _check_world(4, 4, False, tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only machines run the Triton kernels in the interpreter; "
                    "GPUs run them compiled (test_two_gpus_nccl)")
def test_two_ranks_triton_interpreter(tmp_path):
    _check_world("interpreter", 2, True, tmp_path)


def test_example_runs():
    """examples/ring_attention.py (it starts torchrun itself; two CPU processes without two GPUs)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "ring_attention.py"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    result = subprocess.run([sys.executable, str(example)], env={**env, "OMP_NUM_THREADS": "1"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert result.stdout.count("relative error against one device") >= 2, result.stdout[-4000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_nccl(tmp_path):
    _check_world("nccl", 2, False, tmp_path)


if __name__ == "__main__":
    _worker(sys.argv[1])
