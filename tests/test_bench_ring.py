"""``flashattn-lite ring``'s harness (``flashattn_lite.bench.ring``) on the CPU: its peaks count the
gradients (none is kept in ``.grad`` between calls, so none sits in the baseline), and its cases are
warmed up, run in one untimed round, then timed in the orders of ``common.balanced_rounds``, each
round's time recorded.

The collective parts run in two worker processes over gloo (this file, run as a script, as
tests/test_distributed.py does): one spawn for the module, whose RESULT lines the tests read.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # a worker process: the repository's package, without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ranks  # noqa: E402 (tests/ranks.py)
from flashattn_lite.bench import common
from flashattn_lite.bench import ring as bench_ring

WORLD = 2
# Heads of d 256 over few tokens: dQ, dK and dV (fp32) outweigh the CPU twin's N × N scores, so a
# peak without them reads far below O + dQ + dK + dV.
HEADS, KV_HEADS, HEAD_DIM = 2, 2, 256
LENGTHS, SINGLE_MAX, ROUNDS, ITERS, WARMUP = (16, 32), 32, 5, 1, 1


def _grads_bytes(n: int, hq=HEADS, hkv=KV_HEADS, d=HEAD_DIM, itemsize=4) -> int:
    """Bytes of O + dQ + dK + dV of one fwd + bwd over n tokens (B 1)."""
    return itemsize * n * d * (2 * hq + 2 * hkv)


# ------------------------------------------------------------------ in this process (no ranks)

def _attention_inputs(n=32):
    g = torch.Generator().manual_seed(0)
    make = lambda h: torch.randn(1, h, n, HEAD_DIM, generator=g)  # noqa: E731
    return make(HEADS).requires_grad_(), make(KV_HEADS).requires_grad_(), make(KV_HEADS).requires_grad_(), \
        make(HEADS)


def test_step_keeps_no_gradients_and_its_peak_counts_them():
    """A bench step leaves nothing in ``.grad``; the CPU meter sees its dQ, dK, dV, and it sees a
    step that keeps them in ``.grad`` (the old harness) free the previous call's in the measured one."""
    # plain PyTorch attention (the package's kernels run in Triton's interpreter here, whose own
    # buffers the profiler does not see)
    call = lambda q, k, v: (q @ k.transpose(-1, -2)).softmax(-1) @ v  # noqa: E731
    inputs = _attention_inputs()
    step = bench_ring._fwd_bwd(call, inputs)
    step()
    assert all(t.grad is None for t in inputs[:3])
    need = _grads_bytes(32)
    assert bench_ring._cpu_peak_bytes(step) >= need

    q, k, v, do = inputs

    def kept():  # the old step: gradients into .grad, the previous call's dropped only inside the next
        q.grad = k.grad = v.grad = None
        call(q, k, v).backward(do)
    kept()
    assert bench_ring._cpu_peak_bytes(kept) < need  # the audit's symptom: below O + dQ + dK + dV


def test_rounds_option_is_checked_and_defaults_are_set():
    import argparse
    parser = argparse.ArgumentParser()
    bench_ring.add_arguments(parser)
    assert bench_ring._resolve(parser.parse_args([]), "cuda")["rounds"] >= 5
    assert bench_ring._resolve(parser.parse_args([]), "cpu")["rounds"] >= 1
    assert bench_ring._resolve(parser.parse_args(["--rounds", "7"]), "cpu")["rounds"] == 7
    strict = argparse.ArgumentParser(exit_on_error=False)  # refused as it is parsed, naming the option
    bench_ring.add_arguments(strict)
    with pytest.raises(argparse.ArgumentError, match="--rounds"):
        strict.parse_args(["--rounds", "0"])


def test_group_timeout_is_the_created_groups(monkeypatch):
    # A rank that fails inside a point's collectives leaves the others waiting for the group's
    # timeout: the run's own group takes --group-timeout (torch's default, 10 minutes, is a whole
    # device call); 0 is refused.
    import argparse
    parser = argparse.ArgumentParser()
    bench_ring.add_arguments(parser)
    seen = {}
    monkeypatch.setattr(bench_ring.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(bench_ring.dist, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend))
    monkeypatch.setenv("WORLD_SIZE", "2")
    bench_ring._init(parser.parse_args(["--backend", "gloo", "--group-timeout", "45"]))
    assert seen == dict(backend="gloo", timeout=datetime.timedelta(seconds=45))
    bench_ring._init(parser.parse_args(["--backend", "gloo"]))
    assert seen["timeout"] == datetime.timedelta(seconds=bench_ring.GROUP_TIMEOUT_S)
    with pytest.raises(common.BenchArgumentError, match="--group-timeout"):
        bench_ring._init(parser.parse_args(["--backend", "gloo", "--group-timeout", "0"]))
    monkeypatch.setattr(bench_ring.dist, "is_initialized", lambda: True)  # a group made by the caller
    with pytest.raises(common.BenchArgumentError, match="--group-timeout sets the timeout of the process group"):
        bench_ring._init(parser.parse_args(["--group-timeout", "45"]))


# ------------------------------------------------------------------ worker cases (two ranks, gloo)

def _case_timed_order(rank, world):
    """``_timed`` calls each case ``warmup`` times, then one untimed round, then the rounds in the
    orders ``balanced_rounds`` gives; it returns one time per case and timed round."""
    from flashattn_lite.distributed._group import Group
    group = Group(None)
    calls = []
    steps = {key: (lambda key=key: calls.append(key)) for key in bench_ring.CASES}
    times, orders = bench_ring._timed(steps, group, torch.device("cpu"), iters=2, warmup=3, rounds=ROUNDS)
    want = common.balanced_rounds(list(bench_ring.CASES), ROUNDS)
    assert orders == want
    expected = [key for key in bench_ring.CASES for _ in range(3)]
    expected += [key for order in want[:1] + want for key in order for _ in range(2)]
    assert calls == expected, calls
    assert all(len(times[key]) == ROUNDS and all(t >= 0 for t in times[key]) for key in bench_ring.CASES)
    return {}


def _case_sweep(rank, world):
    """The sweep itself: its rows, as rank 0 writes them to the JSON."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    bench_ring.add_arguments(parser)
    out = os.environ["RING_TEST_OUT"]
    argv = ["--lengths", ",".join(map(str, LENGTHS)), "--single-max", str(SINGLE_MAX), "--heads", str(HEADS),
            "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM), "--iters", str(ITERS), "--warmup",
            str(WARMUP), "--rounds", str(ROUNDS), "--no-plot", "--out", out]
    rows = bench_ring.run(parser.parse_args(argv))
    assert [r["n_local"] for r in rows] == list(LENGTHS)
    if rank:
        return {}
    docs = [json.loads(p.read_text()) for p in Path(out).glob("ring-*.json")]
    assert len(docs) == 1 and docs[0]["complete"]
    return {"rows": docs[0]["results"], "rounds": docs[0]["rounds"]}


_CASES = {"timed-order": _case_timed_order, "sweep": _case_sweep}


def _worker() -> None:
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    for name, case in _CASES.items():
        try:
            result = dict(case=name, rank=rank, ok=True, data=case(rank, world))
        except Exception:
            result = dict(case=name, rank=rank, ok=False, error=traceback.format_exc())
        ranks.report(result)
    dist.destroy_process_group()


# ------------------------------------------------------------------ test side

@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> dict:
    """{case: {rank: result}} of one spawn of two ranks running every worker case."""
    out = tmp_path_factory.mktemp("ring")
    return ranks.spawn(__file__, [], WORLD, {"TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "1", "RING_TEST_OUT": str(out),
                                             "FLASHATTN_LITE_AUTOTUNE": "0"})


def _ok(spawned, case) -> dict:
    per_rank = spawned.get(case, {})
    assert sorted(per_rank) == list(range(WORLD)), f"{case}: reported by ranks {sorted(per_rank)}\n{spawned['_log']}"
    failed = [f"rank {r['rank']}:\n{r['error']}" for r in per_rank.values() if not r["ok"]]
    assert not failed, f"{case}:\n" + "\n".join(failed)
    return per_rank[0]["data"]


def test_timed_runs_warmup_untimed_round_then_balanced_rounds(spawned):
    _ok(spawned, "timed-order")


def test_sweep_records_every_round_in_balanced_order(spawned):
    data = _ok(spawned, "sweep")
    rows = data["rows"]
    assert data["rounds"] == ROUNDS
    assert [r["n_local"] for r in rows] == list(LENGTHS)
    for row in rows:
        cases = [c for c in bench_ring.CASES if f"{c}_ms" in row]
        with_global = row["n_global"] <= SINGLE_MAX
        assert cases == list(bench_ring.CASES if with_global else bench_ring.CASES[:-1]), row
        assert row["rounds_order"] == common.balanced_rounds(cases, ROUNDS)
        for c in cases:
            rounds = row[f"{c}_rounds_ms"]
            assert len(rounds) == ROUNDS and all(t > 0 for t in rounds)
            assert row[f"{c}_ms"] == pytest.approx(statistics.median(rounds))
        assert row["efficiency"] == pytest.approx(row["work_vs_local"] * row["one_gpu_local_ms"] / row["ring_ms"])
        if with_global:
            assert row["speedup"] == pytest.approx(row["one_gpu_global_ms"] / row["ring_ms"])


def test_sweep_peaks_count_output_and_gradients(spawned):
    """Each fwd + bwd case's peak above its inputs holds at least O + dQ + dK + dV (fp32)."""
    rows = _ok(spawned, "sweep")["rows"]
    gib = 2 ** 30
    for row in rows:
        n, big_n = row["n_local"], row["n_global"]
        for c in ("ring", "compute", "one_gpu_local"):
            assert row[f"{c}_peak_gib"] * gib >= _grads_bytes(n), (c, row)
        assert row["comm_peak_gib"] > 0
        if "one_gpu_global_ms" in row:
            assert row["one_gpu_global_peak_gib"] * gib >= _grads_bytes(big_n), row


if __name__ == "__main__":
    _worker()
