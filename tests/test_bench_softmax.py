"""The softmax bandwidth benchmark's harness, on CPU with tiny rows: ours, torch and the device copy
(the ceiling) timed beside each other at every point, in an untimed round then balanced rounds, each
round recorded; ours checked against float64 (on fresh inputs), a wrong result recorded as wrong with
no speed."""
import json
import math

import pytest
import torch

from conftest import run_cli
from flashattn_lite.bench import common
from flashattn_lite.bench import softmax as softmax_bench
from flashattn_lite.ops import softmax as sm

TINY = ["softmax", "--log2n", "6", "--dtypes", "fp32", "--directions", "fwd,bwd", "--total-mib", "0.01", "--no-plot"]
KEYS = ["ours", "torch", "copy"]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run (tiny rows, host timer)")


def _rows(tmp_path):
    return json.loads(next(tmp_path.glob("*_bandwidth-*.json")).read_text())["results"]


@pytest.fixture
def ticks(monkeypatch):
    """common.time_ms replaced: the n-th timed call takes n ms (each callable runs once)."""
    calls = []

    def fake_time_ms(fn, **kwargs):
        fn()
        calls.append(fn)
        return float(len(calls))
    monkeypatch.setattr(common, "time_ms", fake_time_ms)
    return calls


def test_softmax_times_ours_torch_and_copy_in_balanced_rounds(tmp_path, capsys, ticks):
    status, out, err = run_cli(TINY + ["--out", str(tmp_path)], capsys)  # the default rounds (3)
    assert status == 0, err
    rows = _rows(tmp_path)
    assert [r["direction"] for r in rows] == ["fwd", "bwd"]
    # Nothing timed at start-up: per point an untimed round and three timed ones of the three.
    assert len(ticks) == 2 * 3 * 4
    orders = common.balanced_rounds(KEYS, 3)
    for p, r in enumerate(rows):
        assert r["status"] == "ok" and r["check_err"] < 1e-5 and r["rounds_order"] == orders
        first = p * 12  # ticks before this point; its round 0 (3 ticks) is untimed
        for key in KEYS:
            expected = [first + 3 * rnd + order.index(key) + 1 for rnd, order in enumerate(orders, start=1)]
            assert r[f"{key}_rounds_ms"] == expected, key
            assert r[f"{key}_ms"] == sorted(expected)[1]
        copy_bytes = 2 * r["rows"] * r["N"] * 4
        assert r["copy_gbps"] == pytest.approx(copy_bytes / r["copy_ms"] * 1e-6)
        assert r["ours_frac_copy"] == pytest.approx(r["ours_gbps"] / r["copy_gbps"])
        assert r["torch_frac_copy"] == pytest.approx(r["torch_gbps"] / r["copy_gbps"])
        assert r["speedup"] == pytest.approx(r["torch_ms"] / r["ours_ms"])
        assert r["rounds_won"] == sum(a <= b for a, b in zip(r["ours_rounds_ms"], r["torch_rounds_ms"]))


def test_softmax_rounds_option(tmp_path, capsys, ticks):
    status, _, err = run_cli(TINY + ["--directions", "fwd", "--rounds", "1", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    (r,) = _rows(tmp_path)
    assert len(ticks) == 3 * 2 and r["rounds_order"] == [KEYS]
    assert [r[f"{k}_rounds_ms"] for k in KEYS] == [[4.0], [5.0], [6.0]]
    status, _, err = run_cli(TINY + ["--rounds", "0", "--out", str(tmp_path)], capsys)
    assert status == 2 and "--rounds" in err


@pytest.mark.parametrize("op, directions", [("softmax", "fwd,bwd"), ("log_softmax", "fwd,bwd"), ("logsumexp", "fwd")])
def test_softmax_off_the_reference_is_wrong_and_not_timed(tmp_path, capsys, ticks, monkeypatch, op, directions):
    real = softmax_bench._reference
    monkeypatch.setattr(softmax_bench, "_reference", lambda *a: real(*a) * 1.5 + 0.1)
    status, out, err = run_cli(TINY + ["--op", op, "--directions", directions, "--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = _rows(tmp_path)
    assert len(rows) == len(directions.split(","))
    assert len(ticks) == len(rows) * 2 * 4  # torch and the copy only
    for r in rows:
        assert r["status"] == "wrong" and r["check_err"] > 0.03
        assert r["ours_ms"] is None and r["ours_gbps"] is None and r["speedup"] is None
        assert r["ours_frac_copy"] is None and "ours_rounds_ms" not in r
        assert r["torch_gbps"] > 0 and r["copy_gbps"] > 0
        assert r["rounds_order"] == common.balanced_rounds(["torch", "copy"], 3)
        assert r["note"].startswith("WRONG: not timed")
    assert "WRONG (not timed)" in out


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_softmax_stale_or_wrong_output_of_ours_is_wrong(tmp_path, capsys, ticks, monkeypatch, direction):
    """Ours returning the first output it computed (a kernel that skips its writes) fails the check,
    which runs on inputs no earlier call saw; so does a result with its rows swapped."""
    name = "_forward" if direction == "fwd" else "_backward"
    real, first = getattr(sm, name), []

    def stale(*args, **kwargs):
        if not first:
            first.append(real(*args, **kwargs))
        return first[0]
    monkeypatch.setattr(sm, name, stale)
    status, _, err = run_cli(TINY + ["--directions", direction, "--out", str(tmp_path / "stale")], capsys)
    assert status == 0, err
    assert [r["status"] for r in _rows(tmp_path / "stale")] == ["wrong"]
    monkeypatch.setattr(sm, name, lambda *a, **k: real(*a, **k).flip(0))
    status, _, err = run_cli(TINY + ["--directions", direction, "--out", str(tmp_path / "flipped")], capsys)
    assert status == 0, err
    assert [r["status"] for r in _rows(tmp_path / "flipped")] == ["wrong"]


def test_softmax_check_error_is_relative_and_catches_nan():
    x = torch.randn(5, 32)
    y = torch.softmax(x, -1)
    assert softmax_bench.check_error(y, "softmax", "fwd", (x,)) < 1e-6
    assert softmax_bench.check_error(y * 1.1, "softmax", "fwd", (x,)) == pytest.approx(0.1, rel=1e-3)
    y[2, 3] = float("nan")
    assert math.isnan(softmax_bench.check_error(y, "softmax", "fwd", (x,)))
    monkey = softmax_bench._CHECK_ELEMENTS
    try:  # the reference computed a row at a time gives the same answer
        softmax_bench._CHECK_ELEMENTS = 32
        y = torch.log_softmax(x, -1) + 0.01
        assert softmax_bench.check_error(y, "log_softmax", "fwd", (x,)) == pytest.approx(
            0.01 / torch.log_softmax(x.double(), -1).abs().max().item(), rel=1e-4)
    finally:
        softmax_bench._CHECK_ELEMENTS = monkey
