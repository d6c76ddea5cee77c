"""Ring attention's W ranks as threads of one process on one device: the schedule, the pieces'
kernels, the merges and the gradient sums of a real ring, checked without a process group, so the
GPU's compiled kernels (the Hopper ones included) run a ring's calls on a one-GPU machine.

Each rank runs ``ring._forward`` then ``ring._backward`` (the autograd node's two halves) with a
ring whose ``shift`` puts a copy of the tensor in the next rank's queue. One thread runs at a
time (a baton lock, handed over while a thread waits for its queue): the GPU's kernels compile
and launch from one thread at a time. Outputs and gradients are compared as in
``test_distributed.py``: against a float64 reference and the package's own attention in the
same dtype over the whole sequence.
"""
from __future__ import annotations

import os
import queue
import sys
import threading

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import DEVICE, ON_GPU, assert_close_to_ref
import flashattn_lite
from flashattn_lite.distributed import ring as ring_mod
from flashattn_lite.distributed.sharding import runs
from flashattn_lite.reference import attention_reference

_WAIT_S = 300  # a rank that never receives fails the test instead of hanging it


class _ThreadRing:
    """``Group.shift`` between threads: one queue per (rank, tag)."""

    def __init__(self, rank: int, boxes: list, baton: threading.Lock, failed: threading.Event):
        self.rank, self.world, self.boxes, self.baton, self.failed = rank, len(boxes), boxes, baton, failed

    def shift(self, tensor, tag=0):
        self.boxes[(self.rank + 1) % len(self.boxes)][tag].put(tensor.clone())
        return self._Pending(self, tag)

    class _Pending:
        def __init__(self, ring, tag):
            self.ring, self.tag = ring, tag

        def wait(self):
            self.ring.baton.release()
            try:  # in short waits, so that a rank whose call raised stops the others at once
                for _ in range(int(_WAIT_S / 0.1)):
                    if self.ring.failed.is_set():
                        raise RuntimeError("another rank failed")
                    try:
                        return self.ring.boxes[self.ring.rank][self.tag].get(timeout=0.1)
                    except queue.Empty:
                        pass
                raise TimeoutError(f"rank {self.ring.rank} received nothing in {_WAIT_S} s")
            finally:
                self.ring.baton.acquire()


def _positions(layout, rank, world, n):
    return torch.tensor([g + i for _, g, length in runs(layout, rank, world, n) for i in range(length)])


def _ring_threads(q, k, v, do, dlse, sinks, *, world, layout, causal, window, softcap):
    """o, lse, dq, dk, dv (whole-sequence tensors gathered from the ranks' shards) and dsinks
    (summed over the ranks) of the ring on ``world`` threads."""
    n = q.shape[2] // world
    scale = q.shape[-1] ** -0.5
    window = ring_mod._check_window(window)
    boxes = [(queue.Queue(), queue.Queue()) for _ in range(world)]
    baton, failed = threading.Lock(), threading.Event()
    results, errors = [None] * world, []

    def rank_body(rank):
        baton.acquire()
        try:
            rows = _positions(layout, rank, world, n).to(q.device)
            local = [t.index_select(2, rows) for t in (q, k, v, do)] + [dlse.index_select(2, rows)]
            q_r, k_r, v_r, do_r, dlse_r = local
            ring = _ThreadRing(rank, boxes, baton, failed)
            every, hops = ring_mod.plan(layout, world, n, causal, window)
            args = dict(scale=scale, softcap=softcap or 0.0, ring=ring, steps=every[rank], hops=hops)
            o, lse = ring_mod._forward(q_r, k_r, v_r, sinks, **args)
            grads = ring_mod._backward(do_r, dlse_r, q_r, k_r, v_r, o, lse, sinks, **args)
            results[rank] = (rows, o, lse) + tuple(grads)
        except BaseException as e:  # noqa: BLE001 (reported by the test, with the rank)
            errors.append((rank, e))
            failed.set()
        finally:
            baton.release()

    threads = [threading.Thread(target=rank_body, args=(r,), name=f"rank-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:  # the first is the cause; the others' follow from it
        rank, e = errors[0]
        raise AssertionError(f"rank {rank} failed: {e!r}; then " + ", ".join(f"rank {r}: {x!r}" for r, x in errors[1:])) from e
    whole = []
    for i, like in enumerate((q, None, q, k, v)):  # o, lse, dq, dk, dv
        shape = (*q.shape[:3], v.shape[3]) if i == 0 else q.shape[:3] if i == 1 else like.shape
        dtype = torch.float32 if i == 1 else q.dtype
        out = torch.empty(shape, dtype=dtype, device=q.device)
        for r in results:
            out.index_copy_(2, r[0], r[1 + i])
        whole.append(out)
    dsinks = None if sinks is None else sum(r[6] for r in results)
    return whole, dsinks


def _compare(*, dtype, world, layout, causal, b=1, hq=2, hkv=2, n=8, d=16, dv=None, window=None, softcap=None,
             sinks=False, eps=None):
    gen = torch.Generator().manual_seed(0)
    N = world * n

    def rand(*shape, dtype=dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=DEVICE, dtype=dtype)

    dv = d if dv is None else dv
    q, k, v, do = rand(b, hq, N, d), rand(b, hkv, N, d), rand(b, hkv, N, dv), rand(b, hq, N, dv)
    dlse = rand(b, hq, N, dtype=torch.float32)
    sink = rand(hq, dtype=torch.float32) if sinks else None
    options = dict(causal=causal, window=window, softcap=softcap)

    def whole_sequence(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v) + ((sink,) if sinks else ())]
        o, lse = fn(*leaves[:3], sinks=leaves[3] if sinks else None)
        ((o.double() * do.double()).sum() + (lse.double() * dlse.double()).sum()).backward()
        return [o, lse] + [t.grad for t in leaves]

    ref = whole_sequence(lambda *t, sinks: attention_reference(*t, sinks=sinks, **options))
    base = whole_sequence(lambda *t, sinks: flashattn_lite.attention(*t, sinks=sinks, return_lse=True, **options))
    ours, dsinks = _ring_threads(q, k, v, do, dlse, sink, world=world, layout=layout, causal=causal,
                                 window=window, softcap=softcap)
    eps = eps if eps is not None else {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-5}[dtype]
    for what, mine, theirs, exact in zip(("o", "lse", "dq", "dk", "dv"), ours, base, ref):
        assert_close_to_ref(mine, theirs, exact, eps=eps, what=what)
    if sinks:
        assert_close_to_ref(dsinks, base[5], ref[5], eps=eps, what="dsinks")


def test_a_failing_rank_stops_the_others(monkeypatch, torch_cpu_path):
    """A rank whose call raises makes the waiting ranks stop at once, so the test fails with that
    rank's error instead of hanging until the others' waits run out."""
    monkeypatch.setattr(sys.modules[__name__], "_WAIT_S", 30)  # a hang bounded, should the stop fail
    forward = ring_mod._forward

    def failing_forward(q, *args, **kwargs):
        if threading.current_thread().name == "rank-1":
            raise ValueError("injected")
        return forward(q, *args, **kwargs)
    monkeypatch.setattr(ring_mod, "_forward", failing_forward)
    q = torch.randn(1, 2, 12, 16, device=DEVICE)
    with pytest.raises(AssertionError, match=r"rank 1 failed: ValueError\('injected'\); then (rank [02]: "
                                             r"RuntimeError\('another rank failed'\)(, )?){2}$"):
        _ring_threads(q, q, q, q, q[..., 0], None, world=3, layout="contiguous", causal=True, window=None,
                      softcap=None)


@pytest.mark.parametrize("world,layout,causal,window,softcap,sinks", [
    (2, "zigzag", True, None, None, False),
    (3, "contiguous", False, (2, 4), None, False),
    (2, "zigzag", True, (3, 0), 2.0, True),
    (4, "zigzag", True, (5, -1), None, True),
])
def test_ring_threads_match_one_device(world, layout, causal, window, softcap, sinks, torch_cpu_path):
    """Small shapes on the CPU twin (the kernels compiled on a GPU): the threads stand for ranks."""
    _compare(dtype=torch.float32, world=world, layout=layout, causal=causal, window=window, softcap=softcap,
             sinks=sinks)


@pytest.mark.skipif(not ON_GPU, reason="the Hopper kernels' lengths: compiled kernels only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout,causal,window,softcap,sinks", [
    ("zigzag", True, None, None, False),
    ("zigzag", True, (3000, 0), 30.0, True),   # the neighbour's strip: a window off the own diagonal
    ("contiguous", True, (1000, -1), None, False),
    ("zigzag", False, (700, 1500), None, True),
])
def test_ring_threads_long_on_gpu(dtype, layout, causal, window, softcap, sinks):
    """Two ranks of 4096 tokens, d 128, GQA: long enough for the Hopper kernels on sm_90."""
    _compare(dtype=dtype, world=2, layout=layout, causal=causal, hq=4, hkv=2, n=4096, d=128, window=window,
             softcap=softcap, sinks=sinks)


@st.composite
def _ring_cases(draw):
    """A ring's shape and options: W 1–5 ranks of a few tokens, both layouts, any window (one side
    or two, narrower or wider than a shard), softcap, sinks, GQA, v's head dim apart."""
    world, layout = draw(st.integers(1, 5)), draw(st.sampled_from(["zigzag", "contiguous"]))
    n = draw(st.integers(1, 4)) * 2 if layout == "zigzag" else draw(st.integers(1, 7))
    causal = draw(st.booleans())
    side = st.one_of(st.just(-1), st.integers(0, world * n))
    window = draw(st.one_of(st.none(), st.tuples(side, side)))
    hkv = draw(st.integers(1, 2))
    return dict(world=world, layout=layout, n=n, causal=causal, window=window,
                softcap=draw(st.sampled_from([None, 1.5])), sinks=draw(st.booleans()), b=draw(st.integers(1, 2)),
                hkv=hkv, hq=hkv * draw(st.integers(1, 2)), d=draw(st.sampled_from([4, 16])),
                dv=draw(st.sampled_from([None, 8])))


_EXAMPLES = int(os.environ.get("FLASHATTN_LITE_FUZZ_EXAMPLES", "0")) or (10 if ON_GPU else 150)


@settings(max_examples=_EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(case=_ring_cases())
def test_ring_threads_fuzz(case, torch_cpu_path):
    """Drawn rings on the CPU twin (compiled kernels on a GPU) against float64 and one device's
    attention: every piece, hop, merge, write of step 0 and accumulator sum the plan can make."""
    _compare(dtype=torch.float32, **case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("world,layout,causal,window", [
    (2, "zigzag", True, (3, 0)),       # the windowed ring: own block, then a neighbour's strip
    (2, "contiguous", True, None),     # step 0 one call over every row: the sum is its output
    (3, "zigzag", True, (5, 0)),
    (2, "zigzag", True, (9, 0)),       # rank 0's step 0 does not tile its keys: its own dK/dV stay float32
])
def test_ring_sums_in_the_inputs_dtype_are_the_float32_sums(dtype, sinks, world, layout, causal, window,
                                                            torch_cpu_path, monkeypatch):
    """Where every row has at most two terms the ring sums o and dq in the inputs' dtype (and its
    own dK/dV where step 0 tiles the keys): bit for bit what float32 sums rounded once give."""
    n = 8
    steps = ring_mod.plan(layout, world, n, causal, window if window else (-1, -1))[0]
    assert any(ring_mod._sum_dtype(s, n, dtype, torch.float32, rows=True) == dtype for s in steps), "a narrow case"
    gen = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, world * n, 16, generator=gen).to(DEVICE, dtype) for _ in range(4))
    dlse = torch.randn(1, 2, world * n, generator=gen).to(DEVICE)
    sink = torch.randn(2, generator=gen).to(DEVICE) if sinks else None
    args = dict(world=world, layout=layout, causal=causal, window=window, softcap=None)
    narrow = _ring_threads(q, k, v, do, dlse, sink, **args)
    monkeypatch.setattr(ring_mod, "_sum_dtype", lambda steps, n, dtype, wide, rows: wide)
    wide = _ring_threads(q, k, v, do, dlse, sink, **args)
    for what, a, b in zip(("o", "lse", "dq", "dk", "dv", "dsinks"), [*narrow[0], narrow[1]], [*wide[0], wide[1]]):
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), what


@settings(max_examples=max(_EXAMPLES // 3, 10), derandomize=True, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(case=_ring_cases(), dtype=st.sampled_from([torch.float16, torch.bfloat16]))
def test_ring_sums_fuzz_narrow_is_float32_bit_for_bit(case, dtype, torch_cpu_path):
    """Drawn rings in 16 bits on the CPU twin (compiled kernels on a GPU): wherever the plan lets a
    rank sum in the inputs' dtype, its o, lse, dq, dk, dv and dsinks are the float32 sums' bits."""
    world, n, dv = case["world"], case["n"], case["dv"] or case["d"]
    gen = torch.Generator().manual_seed(world * 100 + n)
    B, hq, hkv, d = case["b"], case["hq"], case["hkv"], case["d"]
    N = world * n
    q, do = (torch.randn(B, hq, N, x, generator=gen).to(DEVICE, dtype) for x in (d, dv))
    k, v = (torch.randn(B, hkv, N, x, generator=gen).to(DEVICE, dtype) for x in (d, dv))
    dlse = torch.randn(B, hq, N, generator=gen).to(DEVICE)
    sink = torch.randn(hq, generator=gen).to(DEVICE) if case["sinks"] else None
    args = {key: case[key] for key in ("world", "layout", "causal", "window", "softcap")}
    narrow = _ring_threads(q, k, v, do, dlse, sink, **args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ring_mod, "_sum_dtype", lambda steps, n, dtype, wide, rows: wide)
        wide = _ring_threads(q, k, v, do, dlse, sink, **args)
    for what, a, b in zip(("o", "lse", "dq", "dk", "dv", "dsinks"), [*narrow[0], narrow[1]], [*wide[0], wide[1]]):
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), what


@pytest.mark.skipif(not ON_GPU, reason="the Gluon kernels' lengths: compiled kernels only")
def test_ring_sums_written_by_the_kernels_match_float32_sums(monkeypatch):
    """Two ranks of 8192 tokens, a causal window: step 0's pieces take the Gluon kernels, which write
    into the sums' rows. o and lse as the float32 sums' bit for bit (the forward has no adds in any
    order), the gradients within the fused dQ's reordered float32 adds."""
    gen = torch.Generator().manual_seed(2)
    world, n = 2, 8192
    q, do = (torch.randn(1, 8, world * n, 128, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, world * n, 128, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    dlse = torch.randn(1, 8, world * n, generator=gen).to(DEVICE)
    args = dict(world=world, layout="zigzag", causal=True, window=(3000, 0), softcap=None)
    narrow, _ = _ring_threads(q, k, v, do, dlse, None, **args)
    monkeypatch.setattr(ring_mod, "_sum_dtype", lambda steps, n, dtype, wide, rows: wide)
    wide, _ = _ring_threads(q, k, v, do, dlse, None, **args)
    for what, a, b in zip(("o", "lse"), narrow[:2], wide[:2]):
        assert torch.equal(a, b), what
    for what, a, b in zip(("dq", "dk", "dv"), narrow[2:], wide[2:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3, msg=lambda m: f"{what}: {m}")


def test_ring_sums_more_than_two_terms_stay_float32():
    """A row with three terms (three ranks, no window) keeps float32 sums; keys that step 0 does
    not tile too; float64 inputs keep the float32 merges (a narrower dtype only)."""
    steps = ring_mod.plan("zigzag", 3, 8, False)[0]
    assert all(ring_mod._sum_dtype(s, 8, torch.bfloat16, torch.float32, rows=True) == torch.float32 for s in steps)
    untiled = [[ring_mod.Piece(0, 8, 0, 4, False, 0)], []]
    assert ring_mod._sum_dtype(untiled, 8, torch.bfloat16, torch.float32, rows=False) == torch.float32
    tiled = [[ring_mod.Piece(0, 8, 0, 8, True, 0)], []]
    assert ring_mod._sum_dtype(tiled, 8, torch.bfloat16, torch.float32, rows=True) == torch.bfloat16
    assert ring_mod._sum_dtype(tiled, 8, torch.float64, torch.float32, rows=True) == torch.float32
