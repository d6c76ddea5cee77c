"""The decode benchmark's steady-state timing (several steps over distinct caches in one CUDA graph):
how many steps it captures, and that every step gets its own inputs, checked on CPU by running the
steps eagerly in place of the graph."""
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
    status, out, err = run_cli(TINY_DECODE + ["--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = json.loads(next(tmp_path.glob("decode-*.json")).read_text())["results"]
    assert len(rows) == len(calls) == 4
    for r in rows:
        assert r["steady_copies"] == 3 and r["steady_ms"] == 0.5
        assert r["steady_kv_tbps"] == pytest.approx(r["kv_bytes"] / 0.5e-3 / 1e12)
    assert "ours-paged16 steady" in out and "steady us" in out
