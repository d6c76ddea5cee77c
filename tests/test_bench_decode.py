"""The decode benchmark's steady-state timing (several steps over distinct caches in one CUDA graph):
how many steps it captures, and that every step gets its own inputs, checked on CPU by running the
steps eagerly in place of the graph. Its harness (and first-call's eager decode): an untimed round,
then balanced rounds, recorded; SDPA's backend forced outside the timed calls; every implementation
checked against float64 (wrong: not timed); ours/sdpa only between timings of one kind."""
import contextlib
import json

import pytest
import torch

from conftest import run_cli
from flashattn_lite.bench import common
from flashattn_lite.bench import decode as decode_bench

TINY_DECODE = ["decode", "--batch", "2", "--lengths", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
               "--dtype", "fp32", "--block-sizes", "16", "--sweep-splits"]
MIB = 2 ** 20


@pytest.mark.parametrize("step_bytes, kwargs, expected", [
    (16 * MIB, {}, 8),                              # B 1, 4k, Hkv 8, d 128, bf16: 8 × 16 MiB ≥ 2.5 × 50 MiB
    (4 * MIB, {}, 32),                              # B 1, 1k
    (128 * MIB, {}, 2),                             # B 1, 32k: larger than the L2 alone, still 2 steps
    (128 * MIB, dict(min_copies=8), 8),             # the benchmark's floor (amortizes the replay's launch)
    (1024, {}, 64),                                 # capped
    (1024, dict(max_copies=16), 16),
    (10 * MIB, dict(l2_bytes=40 * MIB, l2_multiple=1.0), 4),
], ids=["4k", "1k", "32k", "32k-floor8", "tiny", "tiny-cap16", "other-l2"])
def test_steady_state_copies(step_bytes, kwargs, expected):
    copies = common.steady_state_copies(step_bytes, **kwargs)
    assert copies == expected
    if copies < kwargs.get("max_copies", 64) and copies > kwargs.get("min_copies", 2):
        assert copies * step_bytes >= kwargs.get("l2_multiple", 2.5) * kwargs.get("l2_bytes", common.H100_L2_BYTES)


@pytest.mark.parametrize("args, kwargs, needle", [((0,), {}, "step_bytes"), ((1,), dict(min_copies=0), "min_copies"),
                                                  ((1,), dict(min_copies=9, max_copies=8), "min_copies")])
def test_steady_state_copies_rejects_bad_arguments(args, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        common.steady_state_copies(*args, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback")
def test_steady_timing_is_none_without_cuda():
    made = []
    assert common.time_ms_graph_steady(lambda i: made.append(i) or (lambda: None), 4) is None
    assert not made
    with pytest.raises(ValueError, match="copies"):
        common.time_ms_graph_steady(lambda i: lambda: None, 0)


def test_decode_without_cuda_has_no_steady_columns(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU run")
    status, out, err = run_cli(TINY_DECODE + ["--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = json.loads(next(tmp_path.glob("decode-*.json")).read_text())["results"]
    assert {(r["impl"], r["layout"]) for r in rows} == {("sdpa", "dense"), ("ours", "contiguous"),
                                                         ("ours-splits1", "contiguous"), ("ours", "paged16")}
    assert not any(k.startswith("steady") for r in rows for k in r)
    assert "ours-contiguous TB/s" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the wiring is checked on CPU; a GPU adds SDPA peers' rows")
def test_decode_steady_steps_get_distinct_inputs(tmp_path, capsys, monkeypatch):
    """With the graph replaced by running the steps eagerly: every implementation gets 3 steps, each
    over its own cache slice / block table (decode checks block ids on CPU), with different results."""
    calls = []

    def eager_steps(make_step, copies):
        outs = [make_step(i)() for i in range(copies)]
        outs = [o[0] if isinstance(o, tuple) else o for o in outs]
        calls.append(copies)
        assert all(o.shape == outs[0].shape for o in outs)
        assert not any(torch.equal(outs[i], outs[j]) for i in range(copies) for j in range(i))
        return 0.5

    monkeypatch.setattr(decode_bench, "_steady_copies", lambda device, step_bytes, fraction, what: 3)
    monkeypatch.setattr(common, "time_ms_graph_steady", eager_steps)
    status, out, err = run_cli(TINY_DECODE + ["--rounds", "2", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = json.loads(next(tmp_path.glob("decode-*.json")).read_text())["results"]
    assert len(rows) == 4 and len(calls) == 4 * 3  # an untimed round and two timed ones
    for r in rows:
        assert r["steady_copies"] == 3 and r["steady_ms"] == 0.5 and r["rounds_steady_ms"] == [0.5, 0.5]
        assert r["steady_kv_tbps"] == pytest.approx(r["kv_bytes"] / 0.5e-3 / 1e12)
    assert "ours-paged16 steady" in out and "steady us" in out


# ------------------------------------------------------------------ the harness

ONE_POINT = ["decode", "--batch", "1", "--lengths", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
             "--dtype", "fp32", "--block-sizes", "16"]


def _results(tmp_path):
    return json.loads(next(tmp_path.glob("decode-*.json")).read_text())["results"]


@pytest.fixture
def counted_sdpa_kernel(monkeypatch):
    """``torch.nn.attention.sdpa_kernel`` counting its entries and how deep inside it the caller is;
    the decode benchmark's SDPA peer on CPU is the math backend, forced (as flash / cuDNN are on a GPU)."""
    import torch.nn.attention as attention
    real = attention.sdpa_kernel
    state = {"entries": 0, "depth": 0}

    @contextlib.contextmanager
    def counting(*args, **kwargs):
        state["entries"] += 1
        state["depth"] += 1
        try:
            with real(*args, **kwargs):
                yield
        finally:
            state["depth"] -= 1
    monkeypatch.setattr(attention, "sdpa_kernel", counting)
    monkeypatch.setattr(decode_bench, "_sdpa_peers", lambda device: [("sdpa-math", attention.SDPBackend.MATH)])
    return state


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU timing path")
def test_decode_forces_the_sdpa_backend_outside_the_timed_calls(tmp_path, capsys, monkeypatch, counted_sdpa_kernel):
    state, timed = counted_sdpa_kernel, []

    def fake_time_ms(fn, **kwargs):
        before = state["entries"]
        fn()
        timed.append((state["depth"], state["entries"] - before))
        return 1.0
    monkeypatch.setattr(common, "time_ms", fake_time_ms)
    status, out, err = run_cli(ONE_POINT + ["--out", str(tmp_path)], capsys)  # the default rounds (3)
    assert status == 0, err
    assert timed and all(entered == 0 for _, entered in timed), "sdpa_kernel entered inside a timed call"
    assert len(timed) == 3 * 4  # sdpa, ours, ours paged16: an untimed round and three timed ones
    assert [depth for depth, _ in timed].count(1) == 4, "SDPA timed with its backend forced, every round"
    assert state["depth"] == 0
    rows = {(r["impl"], r["layout"]): r for r in _results(tmp_path)}
    assert rows["sdpa-math", "dense"]["status"] == "ok" and rows["sdpa-math", "dense"]["eager_ms"] == 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU timing path")
def test_decode_rounds_are_balanced_and_recorded(tmp_path, capsys, monkeypatch):
    ticks = []

    def fake_time_ms(fn, **kwargs):  # the n-th timed call takes n ms
        ticks.append(fn)
        return float(len(ticks))
    monkeypatch.setattr(common, "time_ms", fake_time_ms)
    status, out, err = run_cli(ONE_POINT + ["--rounds", "3", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = _results(tmp_path)
    keys = [f"{r['impl']} {r['layout']}" for r in rows]
    assert keys == ["sdpa dense", "ours contiguous", "ours paged16"]
    orders = common.balanced_rounds(keys, 3)
    assert len(ticks) == 3 * (1 + 3)
    for key, r in zip(keys, rows):
        positions = [order.index(key) for order in orders]
        assert r["status"] == "ok" and r["check_err"] < 1e-4
        assert r["rounds_position"] == positions
        # Round 0 (ticks 1-3) is untimed; round r's call at position p is tick 3r + p + 1.
        assert r["rounds_eager_ms"] == [3 * rnd + p + 1 for rnd, p in enumerate(positions, start=1)]
        assert r["eager_ms"] == sorted(r["rounds_eager_ms"])[1] and r["timing"] == "eager"
    assert len({tuple(order) for order in orders}) == 3  # three different orders, each key first once


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU timing path")
def test_decode_off_the_reference_is_wrong_and_not_timed(tmp_path, capsys, monkeypatch):
    real = decode_bench._reference
    monkeypatch.setattr(decode_bench, "_reference", lambda q, k, v: real(q, k, v) * 1.5 + 0.1)
    monkeypatch.setattr(common, "time_ms", lambda fn, **kwargs: pytest.fail("a wrong result was timed"))
    status, out, err = run_cli(ONE_POINT + ["--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = _results(tmp_path)
    assert len(rows) == 3
    for r in rows:
        assert r["status"] == "wrong" and r["check_err"] > 0.03 and "kv_tbps" not in r
        assert r["note"].startswith("WRONG: not timed")
    assert "WRONG (not timed)" in out


def test_decode_check_sees_a_stale_output():
    """The check runs on a fresh query: an implementation returning an earlier call's output fails it."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 16, generator=g) for n in (1, 64, 64))
    k, v = k[:, :2], v[:, :2]
    stale = decode_bench._reference(q, k, v).float()
    fresh = torch.randn(q.shape, generator=g)
    err, _ = decode_bench._check(lambda: stale, q, fresh, decode_bench._reference(fresh, k, v))
    assert err > 0.1
    live = lambda: decode_bench._reference(q, k, v).float()  # noqa: E731  (reads q at call time)
    before = q.clone()
    err, _ = decode_bench._check(live, q, fresh, decode_bench._reference(fresh, k, v))
    assert err < 1e-6 and torch.equal(q, before)


def _timed_row(impl, layout, ms, timing):
    return dict(B=1, L=4096, impl=impl, layout=layout, ms=ms, kv_tbps=1.0, eager_ms=0.05, timing=timing,
                eager_kv_tbps=1.0)


@pytest.mark.parametrize("sdpa_timing, compared", [("cuda-graph", True), ("eager", False)])
def test_decode_ratio_compares_like_with_like(capsys, sdpa_timing, compared):
    rows = [_timed_row("sdpa-flash", "dense", 0.02, sdpa_timing), _timed_row("ours", "contiguous", 0.01, "cuda-graph")]
    decode_bench._print(rows, [], False)
    header = capsys.readouterr().out.splitlines()[0].split("  ")
    assert ("ours/sdpa" in [h.strip() for h in header]) is compared
    assert "ours/sdpa eager" in [h.strip() for h in header]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run of first-call's eager decode")
def test_first_call_decode_forces_the_backend_outside_the_timed_loops(monkeypatch, counted_sdpa_kernel):
    from flashattn_lite.bench import first_call
    state, timed = counted_sdpa_kernel, []
    real_timed = first_call._timed

    def watched(fn):
        before = state["entries"]
        seconds = real_timed(fn)
        timed.append((state["depth"], state["entries"] - before))
        return seconds
    monkeypatch.setattr(first_call, "_timed", watched)
    rows = first_call._decode_job({"what": "decode", "batch": 1, "length": 32, "calls": 2, "device": "cpu"})
    assert [r["impl"] for r in rows] == ["ours", "sdpa-math (native)"]
    rounds = first_call.DECODE_ROUNDS
    orders = common.balanced_rounds([r["impl"] for r in rows], rounds)
    for r in rows:
        assert len(r["rounds_us"]) == rounds and r["us_per_call"] == min(r["rounds_us"])
        assert r["rounds_position"] == [order.index(r["impl"]) for order in orders]
    assert len(timed) == 2 * (rounds + 1)
    assert all(entered == 0 for _, entered in timed), "sdpa_kernel entered inside a timed loop"
    assert [depth for depth, _ in timed].count(1) == rounds + 1


def test_first_call_creates_the_cuda_context_before_timing_either(monkeypatch):
    """torch's first SDPA and ours are both timed after the context exists (created and timed apart)."""
    from flashattn_lite.bench import first_call
    log = []
    monkeypatch.setattr(first_call, "_create_cuda_context", lambda device: log.append("context") or 0.25)
    real_timed = first_call._timed
    monkeypatch.setattr(first_call, "_timed", lambda fn: log.append("timed") or real_timed(fn))
    row = first_call._attention_job({"what": "attention", "length": 16, "new_length": False, "device": "cpu"})
    assert log[0] == "context" and log.count("context") == 1 and log.count("timed") == 3
    assert row["cuda_context_s"] == 0.25 and "cuda_context_s" in first_call.COLUMNS
