"""The command line: help, argument errors (exit status 2, one line, no traceback), and the files a
run writes (JSON with the environment, CSV, PNG), on CPU with tiny sweeps."""
import collections
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from flashattn_lite import cli
from flashattn_lite.bench import common, memory

ROOT = Path(__file__).resolve().parents[1]
# The CLI's CPU sweep (what these tests check) also on a machine with a GPU.
TINY_MEMORY = ["memory", "--device", "cpu", "--methods", "naive,ours", "--min-n", "128", "--max-n", "256",
               "--heads", "2", "--head-dim", "16", "--no-progress"]
TINY_SPEED = ["speed", "--device", "cpu", "--methods", "ours,sdpa-math", "--modes", "fwd,bwd", "--head-dims", "16", "--hidden", "32",
              "--min-n", "64", "--max-n", "128", "--tokens", "128", "--causal", "yes", "--rep-ms", "5",
              "--no-progress"]


def one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {found}"
    return found[0]


@pytest.mark.parametrize("argv", [["--help"], ["memory", "--help"], ["speed", "--help"], ["all", "--help"]],
                         ids=lambda a: " ".join(a))
def test_help_exits_zero_and_explains(argv, capsys):
    status, out, _ = run_cli(argv, capsys)
    assert status == 0
    assert "usage: flashattn-lite" in out
    if argv == ["--help"]:
        for name in ("memory", "speed", "softmax", "decode", "all"):
            assert name in out
    if argv[0] == "memory":
        assert "--max-n" in out and "--gqa" in out and "--methods" in out


@pytest.mark.parametrize("argv, needle", [
    ([], "required"),
    (["nonsense"], "invalid choice"),
    (["memory", "--max-n", "lots"], "--max-n"),
    (["memory", "--methods", "naive,bogus"], "bogus"),
    (["memory", "--heads", "4", "--gqa", "3"], "--gqa"),
    (["memory", "--min-n", "4k", "--max-n", "1k"], "--min-n"),
    (["memory", "--dtype", "int8"], "dtype"),
    (["memory", "--modes", "bwd"], "--modes"),
    (["memory", "--value-dim", "0"], "--value-dim must be an integer in [1, 256], got 0"),
    (["memory", "--value-dim", "257"], "--value-dim must be an integer in [1, 256], got 257"),
    (["speed", "--modes", "sideways"], "--modes"),
    (["speed", "--hidden", "100", "--head-dims", "64"], "--hidden"),
    (["speed", "--value-dim", "0"], "--value-dim"),
    (["variants", "--rounds", "0"], "--rounds"),
    (["softmax", "--rounds", "0"], "--rounds"),
    (["decode", "--rounds", "two"], "--rounds"),
    (["ring", "--rounds", "0"], "--rounds"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_bad_arguments_are_usage_errors(argv, needle, capsys, tmp_path):
    status, out, err = run_cli(argv + ["--out", str(tmp_path)] if argv else argv, capsys)
    assert status == 2
    assert needle in err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("*.json")), "a rejected command must not write results"


def test_missing_benchmark_module_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setitem(cli._COMMANDS, "softmax", ("flashattn_lite.bench._no_such_module", "s", "s"))
    status, _, err = run_cli(["softmax"], capsys)
    assert status == 1
    assert "not part of this installation" in err


def test_memory_writes_table_json_csv_png(tmp_path, capsys, torch_cpu_path):
    status, out, err = run_cli(TINY_MEMORY + ["--out", str(tmp_path)], capsys)
    assert status == 0, err
    assert "GPU numbers" in out and "need a GPU" in out
    assert "peak_mib" in out and "theory_mib" in out

    data = json.loads(one(tmp_path, "memory-*.json").read_text())
    assert data["benchmark"] == "memory"
    for key in ("date", "torch", "triton", "python"):
        assert data["environment"][key]
    rows = data["results"]
    assert {(r["method"], r["mode"], r["N"]) for r in rows} == {
        (m, mode, n) for m in ("naive", "ours") for mode in ("fwd", "fwd+bwd") for n in (128, 256)}
    assert all(r["status"] == "ok" for r in rows), [r["note"] for r in rows if r["status"] != "ok"]
    for r in rows:
        assert r["time_ms"] > 0 and r["theory_mib"] > 0 and r["peak_mib"] is not None
    naive = {(r["mode"], r["N"]): r for r in rows if r["method"] == "naive"}
    # Naive holds two float32 N² tensors per head in its forward: 8·B·H·N² bytes = 1 MiB at N=256.
    assert naive["fwd", 256]["theory_mib"] == pytest.approx(1.0)
    assert 0.5 <= naive["fwd", 256]["peak_mib"] <= 4.0

    with one(tmp_path, "memory-*.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert one(tmp_path, "memory-*.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_writes_every_group(tmp_path, capsys, torch_cpu_path):
    argv = ["variants", "--device", "cpu", "--n", "128", "--window", "32", "--options-n", "64", "--tokens", "256",
            "--head-dim", "16", "--hidden", "32", "--dtype", "fp16", "--out", str(tmp_path)]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    doc = json.loads(one(tmp_path, "variants-*.json").read_text())
    assert doc["dtype"] == "fp16"
    cases = {(r["group"], r["case"].split(" ")[0], r["mode"]) for r in doc["results"]}
    for group, case in (("window", "full"), ("window", "window"), ("options", "plain"), ("options", "softcap"),
                        ("options", "sinks"), ("options", "alibi"), ("varlen", "dense"), ("varlen", "varlen")):
        assert {(group, case, "fwd"), (group, case, "fwd+bwd")} <= cases
    # TFLOP/s counts the pairs each computes: 128·129/2 for full causal, 32·33/2 + 96·32 with the window.
    full = next(r for r in doc["results"] if r["case"] == "full causal" and r["mode"] == "fwd")
    assert full["tflops"] == pytest.approx(4 * 2 * 16 * (128 * 129 // 2) / (full["ms"] * 1e-3) / 1e12)


def test_variants_rounds_start_one_case_later(monkeypatch):
    # The options group's rounds rotate the cases, so no case always runs right after the same one
    # (a power-hungry case slows the next for a while: a fixed order read sinks' cost as 13%).
    from flashattn_lite.bench import common, variants
    calls = []
    monkeypatch.setattr(common, "time_ms", lambda step, rep_ms: calls.append(step()) or 1.0)
    monkeypatch.setattr(common, "gpu_state", lambda: None)
    steps = {name: (lambda name=name: name) for name in "abc"}
    times = variants._interleaved(steps, rep_ms=1.0, rounds=4)
    assert calls == list("abc" "bca" "cab" "cba")  # balanced_rounds: three keys take six rows
    assert times == {name: [1.0] * 4 for name in "abc"}


def test_speed_rounds_time_the_methods_in_turn(tmp_path, capsys, torch_cpu_path, monkeypatch):
    # --rounds 3: per point every method is built, warmed up and checked, timed once in an untimed
    # round, then once a round in a balanced order; each keeps its median round and records all of them.
    from flashattn_lite.bench import common
    calls, clock = [], iter(range(1, 1000))
    real = common.time_ms

    def fake_time_ms(fn, rep_ms):
        real(fn, rep_ms=0.01)  # it still runs
        calls.append(fn)
        return float(next(clock))
    monkeypatch.setattr(common, "time_ms", fake_time_ms)
    status, out, err = run_cli(TINY_SPEED + ["--modes", "fwd", "--rounds", "3", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = json.loads(one(tmp_path, "attention_speed-*.json").read_text())["results"]
    assert [r["method"] for r in rows] == ["ours", "sdpa-math"] * 2 and all(r["status"] == "ok" for r in rows)
    # Point 1: the untimed round (ms 1, 2), then ours, math | math, ours | ours, math (ms 3..8); point 2: 9..16.
    assert [r["rounds_ms"] for r in rows] == [[3.0, 6.0, 7.0], [4.0, 5.0, 8.0], [11.0, 14.0, 15.0], [12.0, 13.0, 16.0]]
    assert [r["rounds_position"] for r in rows] == [[0, 1, 0], [1, 0, 1]] * 2
    assert [r["time_ms"] for r in rows] == [6.0, 5.0, 14.0, 13.0]
    assert calls[0] is calls[2] is calls[5] and calls[1] is calls[3] is calls[4]  # the same callables each round
    assert all(0 <= r["check_err"] < 1e-5 for r in rows)  # float32 on the CPU against float64
    assert common.balanced_rounds("ab", 3) == [list("ab"), list("ba"), list("ab")] and common.balanced_rounds("", 2) == []
    for n in range(1, 7):  # every key first, and after every other, equally often over a design
        rows = common.balanced_rounds(range(n), 2 * n)
        assert all(sorted(r) == list(range(n)) for r in rows)
        follows = collections.Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
        assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1
        assert set(collections.Counter(r[0] for r in rows).values()) == {2}
    status, _, err = run_cli(TINY_SPEED + ["--rounds", "0"], capsys)
    assert status == 2 and "--rounds" in err


def test_kernel_times_lists_one_calls_ops_costliest_first():
    # The benchmarks' profile of one call (gluon_bwd.py and ring_compute.py --profile): each op
    # of the call with its time, costliest first; the warm call before it is not counted.
    import torch
    calls = []

    def fn():
        calls.append(1)
        x = torch.randn(64, 64)
        return (x @ x).exp().sum()

    times = common.kernel_times_us(fn, "cpu")
    assert len(calls) == 2 and times and all(t > 0 for t in times.values())
    assert any("mm" in name for name in times)
    assert list(times.values()) == sorted(times.values(), reverse=True)


def test_speed_writes_tflops(tmp_path, capsys, torch_cpu_path):
    status, out, err = run_cli(TINY_SPEED + ["--out", str(tmp_path)], capsys)
    assert status == 0, err
    assert "TFLOP/s, fwd, d=16, causal" in out
    assert "ours against sdpa-math: fwd at or above at " in out and "; bwd at or above at " in out
    rows = json.loads(one(tmp_path, "attention_speed-*.json").read_text())["results"]
    assert len(rows) == 2 * 2 * 2  # methods × modes × lengths
    for r in rows:
        assert r["status"] == "ok", r["note"]
        # bwd counts 2.5× the forward's FLOPs; causal halves 4·B·H·N²·D.
        factor = 2.5 if r["mode"] == "bwd" else 1.0
        assert r["flops"] == 4 * r["batch"] * r["heads"] * r["N"] ** 2 * r["head_dim"] / 2 * factor
        assert r["tflops"] > 0
    assert one(tmp_path, "attention_speed-*.png").stat().st_size > 0
    assert one(tmp_path, "attention_speed-*.csv").stat().st_size > 0


def test_speed_with_a_value_dim_counts_its_flops(tmp_path, capsys, torch_cpu_path):
    # v's head dim other than q's (MLA's 192 / 128 on the GPU): v and dO are that wide, the FLOPs
    # are 2·B·H·N²·(D + Dv) forward, and every method that ran matched the reference's output shape.
    argv = TINY_SPEED + ["--lengths", "64", "--value-dim", "8", "--out", str(tmp_path)]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    assert "TFLOP/s, fwd, d=16, dv=8, causal" in out
    data = json.loads(one(tmp_path, "attention_speed-*.json").read_text())
    assert data["grid"]["value_dim"] == 8
    for r in data["results"]:
        assert r["status"] == "ok" and r["value_dim"] == 8, r["note"]
        width = 3 * 16 + 2 * 8 if r["mode"] == "bwd" else 16 + 8  # the backward's five GEMMs, three at D
        assert r["flops"] == 2 * r["batch"] * r["heads"] * r["N"] ** 2 * width / 2


def test_memory_with_a_value_dim_counts_o_at_its_width(tmp_path, capsys, torch_cpu_path):
    # v's head dim other than q's: v, o and dO are that wide. Ours' theory on CPU (the PyTorch twin)
    # grows by B·Hq·N·(Dv − D) float32s twice: forward o and its float32 accumulator, forward+backward
    # o and dv; here 1·2·128·16·4 bytes each, 32 KiB in all.
    argv = TINY_MEMORY + ["--methods", "ours", "--max-n", "128", "--no-plot"]
    theory = {}
    for value_dim in (None, 32):
        out_dir = tmp_path / str(value_dim)
        extra = [] if value_dim is None else ["--value-dim", str(value_dim)]
        status, out, err = run_cli(argv + extra + ["--out", str(out_dir)], capsys)
        assert status == 0, err
        data = json.loads(one(out_dir, "memory-*.json").read_text())
        assert data["problem"]["value_dim"] == value_dim
        rows = data["results"]
        assert [r["mode"] for r in rows] == ["fwd", "fwd+bwd"]
        for r in rows:
            assert r["status"] == "ok", r["note"]
            assert r.get("value_dim") == value_dim and ("value_dim" in r) == (value_dim is not None)
        theory[value_dim] = {r["mode"]: r["theory_mib"] for r in rows}
        assert ("d=16 dv=32 fp32" in out) == (value_dim is not None)
    for mode in ("fwd", "fwd+bwd"):
        assert theory[32][mode] - theory[None][mode] == pytest.approx(2 * 1 * 2 * 128 * 16 * 4 / 2 ** 20)
    from flashattn_lite.bench.peers import Problem
    title = memory._title(Problem(1, 2, 2, 128, 16, torch.float32, False, "cpu", 32), "cpu")
    assert "d=16, dv=32, fp32" in title and "dv=" not in memory._title(Problem(1, 2, 2, 128, 16, torch.float32,
                                                                                  False, "cpu"), "cpu")


def test_theory_counts_o_and_repeated_kv_at_vs_head_dim():
    # q (2, 4, 8, 16), k (2, 2, 8, 16), v (2, 2, 8, 8), fp16: o is (2, 4, 8, 8), 2·4·8·8·2 = 1024
    # bytes; K and V repeated to 4 heads, 2·4·8·16·2 + 2·4·8·8·2 = 2048 + 1024 bytes.
    from flashattn_lite.bench import peers
    p = peers.Problem(2, 4, 2, 8, 16, torch.float16, False, "cpu", value_dim=8)
    assert peers._out(p) == 1024
    assert peers._repeat_bytes(p, "repeat_kv") == 3072
    assert peers._repeat_bytes(p, "enable_gqa") == 0
    assert peers._repeat_bytes(peers.Problem(2, 4, 4, 8, 16, torch.float16, False, "cpu", 8), "repeat_kv") == 0
    # v wider than q: o (2, 4, 8, 40) is 5120 bytes, K and V repeated 2048 + 5120
    wide = peers.Problem(2, 4, 2, 8, 16, torch.float16, False, "cpu", value_dim=40)
    assert peers._out(wide) == 5120 and peers._repeat_bytes(wide, "repeat_kv") == 7168
    # SDPA flash's forward with repeated K/V: o + lse (2·4·8 float32s, 256 bytes) + the copies
    assert peers.PEERS["sdpa-flash"].theory_bytes(p, "fwd", "repeat_kv") == 1024 + 256 + 3072
    # the math backend's forward: its float32 buffers a (row, head) of 4 bytes per column, scaled q
    # and k (16 + 16), o (8), repeated K and V (16 + 8) = 64 columns; the rest as at v's width
    same = peers.Problem(2, 4, 2, 8, 16, torch.float16, False, "cpu", value_dim=16)
    assert (peers._math_theory(p, "fwd", "repeat_kv") - peers._math_theory(same, "fwd", "repeat_kv")
            == 2 * 4 * 8 * (64 - 80) * 4 + (p.kv_bytes - same.kv_bytes) * 2)


def test_gluon_dq_buffer_width(monkeypatch):
    # The Gluon backward's float32 dQ buffer, as if on an sm_90 GPU with the Gluon triton: q's head dim
    # rounded up to 64 within the kernel's width (kernel_head_dim); at width 256 only in the one pass
    # (plain causal, v at most 128 wide), else δ and lse₂ alone. B 1, Hq = Hkv = 16, bf16; δ and lse₂:
    # 2·N·4 bytes a head.
    from flashattn_lite.bench import peers
    from flashattn_lite.ops import attention_bwd_gluon as gluon
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(gluon, "_HAS_GLUON", True)
    monkeypatch.setattr(peers, "_triton_version", lambda: gluon.TESTED_TRITON[0] + "0")
    monkeypatch.delenv("FLASHATTN_LITE_HOPPER", raising=False)
    MiB = 2 ** 20

    def dq_bytes(n, d, dv=None, causal=True, dtype=torch.bfloat16):
        return peers._gluon_dq_bytes(peers.Problem(1, 16, 16, n, d, dtype, causal, "cuda", dv))

    # d 64, v 128: the d 128 kernel, its dQ buffer q's 64 columns: 16 heads · 16k rows · 64 · 4 bytes
    assert dq_bytes(16384, 64, 128) == 64 * MiB + 2 * MiB
    assert dq_bytes(16384, 128) == 128 * MiB + 2 * MiB
    # MLA 192 / 128, causal: the one pass, its buffer q's 192 columns of the kernel's 256; at 32k in
    # launches of 10 heads (24 MiB each, within 256 MiB); 256 / 128 keeps all 256
    assert dq_bytes(16384, 192, 128) == 192 * MiB + 2 * MiB
    assert dq_bytes(32768, 192, 128) == 10 * (32768 * 192 * 4 + 2 * 32768 * 4)
    assert dq_bytes(16384, 256, 128) == 256 * MiB + 2 * MiB
    # non-causal, or v 256 wide: the two kernels, no dQ buffer, one launch of all 16 heads
    assert dq_bytes(32768, 192, 128, causal=False) == 16 * 2 * 32768 * 4
    assert dq_bytes(16384, 256) == 16 * 2 * 16384 * 4
    # not taken: a v width no kernel covers, fp32, too little work, 2³¹ elements in q (16 · 1M · 128)
    assert dq_bytes(16384, 64, 20) == 0 and dq_bytes(16384, 64, 128, dtype=torch.float32) == 0
    assert dq_bytes(1024, 64, 128) == 0 and dq_bytes(2 ** 20, 128) == 0


def test_standing_counts_the_points_at_or_above_a_peer():
    from flashattn_lite.bench.attention import standing

    def row(method, mode, n, tflops, status="ok"):
        return {"method": method, "mode": mode, "head_dim": 64, "causal": n > 1024, "N": n, "tflops": tflops,
                "status": status}
    rows = [row("ours", "fwd", 1024, 10.0), row("peer", "fwd", 1024, 10.0),   # equal counts as at or above
            row("ours", "fwd", 2048, 9.0), row("peer", "fwd", 2048, 10.0),
            row("ours", "fwd", 4096, 12.0), row("peer", "fwd", 4096, 1.0, "error"),  # the peer failed: no point
            row("ours", "bwd", 1024, 5.0), row("peer", "bwd", 1024, 4.0)]
    rows += [row("ours", "fwd", 8192, 1.0, "wrong"), row("peer", "fwd", 8192, 10.0),  # counted, not dropped
             row("ours", "bwd", 8192, 1.0, "OOM"), row("peer", "bwd", 8192, 10.0)]
    rows[-4]["rounds_ms"], rows[-3]["rounds_ms"] = [1.0, 3.0], [2.0, 2.0]  # (a wrong point: no pairs)
    rows[0]["rounds_ms"], rows[1]["rounds_ms"] = [1.0, 3.0, 2.0], [2.0, 2.0, 2.0]
    assert standing(rows, "peer") == [
        {"mode": "fwd", "at_or_above": 1, "points": 2, "ours_failed": 1, "lowest": 0.9, "lowest_at": "d=64 causal 2k",
         "rounds_won": 2, "rounds": 3},
        {"mode": "bwd", "at_or_above": 1, "points": 1, "ours_failed": 1, "lowest": 1.25,
         "lowest_at": "d=64 non-causal 1k"}]
    assert standing(rows, "absent") == []


def test_memory_plot_marks_oom_and_comparison(tmp_path):
    base = {"batch": 1, "heads": 1, "theory_mib": 1.0, "note": ""}
    rows = [dict(base, method="naive", mode="fwd", N=1024, status="ok", peak_mib=8.0),
            dict(base, method="naive", mode="fwd", N=2048, status="OOM", peak_mib=None),
            dict(base, method="ours", mode="fwd", N=1024, status="ok", peak_mib=1.0),
            dict(base, method="ours", mode="fwd", N=2048, status="ok", peak_mib=2.0),
            dict(base, method="sdpa-flash", mode="fwd", N=2048, status="ok", peak_mib=2.5),
            dict(base, method="ours", mode="fwd", N=4096, status="OOM", peak_mib=None),
            dict(base, method="sdpa-cudnn", mode="fwd", N=4096, status="ok", peak_mib=5.0)]
    path = memory.plot(rows, tmp_path / "m.png", title="synthetic")
    assert Path(path).read_bytes()[:4] == b"\x89PNG"
    comp = memory.comparison(rows)
    assert comp == [{"mode": "fwd", "N": 2048, "ours_mib": 2.0, "best_sdpa": "sdpa-flash", "best_sdpa_mib": 2.5,
                     "ratio": 0.8},  # ours out of memory where a backend ran: a row, not a gap
                    {"mode": "fwd", "N": 4096, "ours_mib": "OOM", "best_sdpa": "sdpa-cudnn", "best_sdpa_mib": 5.0,
                     "ratio": None}]


@pytest.mark.parametrize("text, value", [("4096", 4096), ("4k", 4096), ("512K", 512 * 1024), ("1M", 2 ** 20)])
def test_sizes_parse_and_print(text, value):
    assert common.parse_size(text) == value
    assert common.parse_size(common.format_size(value)) == value


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "flashattn_lite", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "memory" in r.stdout


# ------------------------------------------------------------ streaming, --time-budget, --quick

def test_result_writer_streams_each_point(tmp_path, capsys):
    """Every point is a line on stdout and is on disk at once; a sweep that dies keeps its points."""
    writer = common.ResultWriter(tmp_path, "demo", columns=["x", "y"], meta={"grid": [1, 2]}, budget_s=1e9)
    json_path = writer.path(".json")
    assert json.loads(json_path.read_text())["results"] == []  # on disk before the first point
    with pytest.raises(RuntimeError):
        with writer:
            writer.add({"x": 1, "y": 0.5})
            assert "x=1  y=0.5" in capsys.readouterr().out
            data = json.loads(json_path.read_text())
            assert data["results"] == [{"x": 1, "y": 0.5}] and data["complete"] is False and data["grid"] == [1, 2]
            with writer.path(".csv").open() as f:
                assert list(csv.DictReader(f)) == [{"x": "1", "y": "0.5"}]
            raise RuntimeError("killed mid-sweep")
    data = json.loads(json_path.read_text())
    assert data["results"] == [{"x": 1, "y": 0.5}] and data["stopped_by"] == "RuntimeError"
    assert not list(tmp_path.glob("*.tmp")), "files are written to a temporary name and renamed"


def test_result_writer_budget_records_skipped_points(tmp_path, capsys):
    writer = common.ResultWriter(tmp_path, "demo", columns=["x"], budget_s=0.0)
    assert not writer.start(x=1) and not writer.start(x=2)
    writer.finish()
    data = json.loads(writer.path(".json").read_text())
    assert data["skipped"] == [{"x": 1}, {"x": 2}] and data["complete"] is True and data["time_budget_s"] == 0.0
    assert "2 point(s) not started" in capsys.readouterr().out


def test_time_budget_stops_a_sweep_and_lists_the_rest(tmp_path, capsys, torch_cpu_path, monkeypatch):
    # The budget runs out after two points, whatever the speed of this machine.
    monkeypatch.setattr(common.ResultWriter, "time_left", lambda self: 1.0 if len(self.rows) < 2 else -1.0)
    status, out, err = run_cli(TINY_SPEED + ["--time-budget", "60", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    data = json.loads(one(tmp_path, "attention_speed-*.json").read_text())
    assert data["complete"] is True and len(data["results"]) == 2
    assert len(data["skipped"]) == 2 * 2 * 2 - 2 and {"method", "mode", "N"} <= set(data["skipped"][0])
    assert out.count("[attention_speed ") >= 2  # a streamed line per point (and the budget notice)
    assert "point(s) not started" in out


def test_memory_sweeps_ascending_n_across_methods(tmp_path, capsys, torch_cpu_path):
    status, _, err = run_cli(TINY_MEMORY + ["--modes", "fwd", "--time-budget", "600", "--out", str(tmp_path)],
                             capsys)
    assert status == 0, err
    rows = json.loads(one(tmp_path, "memory-*.json").read_text())["results"]
    assert [(r["N"], r["method"]) for r in rows] == [(128, "naive"), (128, "ours"), (256, "naive"), (256, "ours")]


def test_all_shares_one_time_budget(tmp_path, capsys):
    status, out, err = run_cli(["all", "--quick", "--time-budget", "0", "--no-plot", "--no-progress",
                                "--out", str(tmp_path)], capsys)
    assert status == 0, err
    for stem in ("memory", "attention_speed", "softmax_bandwidth"):
        data = json.loads(one(tmp_path, f"{stem}-*.json").read_text())
        assert data["skipped"] and all(r["status"] == "unavailable" for r in data["results"])


def _parsed(argv):
    return cli.build_parser().parse_args(argv)


def test_quick_preset_and_explicit_options():
    from flashattn_lite.bench import attention, decode, softmax
    from flashattn_lite.bench.peers import parse_methods
    # --quick fills what is not given; what is given wins; without --quick the defaults hold.
    assert memory._resolve(_parsed(["memory", "--quick"]))[2] == ["fwd+bwd"]
    assert memory._resolve(_parsed(["memory", "--quick", "--modes", "fwd"]))[2] == ["fwd"]
    assert memory._resolve(_parsed(["memory"]))[2] == ["fwd", "fwd+bwd"]
    assert attention._resolve(_parsed(["speed", "--quick", "--lengths", "64,1k"]))[5] == [64, 1024]
    assert attention._resolve(_parsed(["speed", "--quick", "--min-n", "64", "--max-n", "128"]))[5] == [64, 128]
    assert softmax._resolve(_parsed(["softmax", "--quick"]), "cpu")[2] == [10, 14]
    assert softmax._resolve(_parsed(["softmax", "--quick", "--max-log2n", "11"]), "cpu")[2] == [10, 11]
    # The GPU presets are what the issue asks (and parse).
    assert parse_methods(memory.QUICK["cuda"]["methods"]) == ["ours", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient",
                                                              "naive", "sdpa-math"]
    assert [common.parse_size(n) for n in attention.QUICK["cuda"]["lengths"].split(",")] == [2048, 8192, 16384]
    assert softmax.QUICK["cuda"]["log2n"] == "10,14,16,20,22"
    assert decode.QUICK["cuda"] == dict(batch=[1, 8], lengths=[4096, 32768, 131072], block_sizes=[16])


@pytest.mark.parametrize("argv, needle", [
    (["memory", "--time-budget", "-1"], "--time-budget"),
    (["softmax", "--time-budget", "soon"], "--time-budget"),
    (["softmax", "--dtypes", "int8"], "--dtypes"),
    (["speed", "--lengths", "lots"], "--lengths"),
    (["speed", "--lengths", ","], "--lengths"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_bad_run_arguments_are_usage_errors(argv, needle, capsys, tmp_path):
    status, _, err = run_cli(argv + ["--out", str(tmp_path)], capsys)
    assert status == 2 and needle in err and "Traceback" not in err


def test_time_ms_names_a_bad_l2_mode():
    with pytest.raises(ValueError, match="l2 must be 'clean' or 'dirty'"):
        common.time_ms(lambda: None, l2="warm")


def test_results_record_the_output_folder_as_a_placeholder():
    argv = ["benchmarks/memory.py", "--out", "/some/machine/dir", "--quick"]
    assert common.recorded_command(argv, "/some/machine/dir") == "benchmarks/memory.py --out $OUT --quick"
    assert common.recorded_command(["x.py", "--out=/a/b"], "/a/b") == "x.py --out=$OUT"
    assert common.recorded_command(["bench.py", "--out", "."], ".") == "bench.py --out $OUT"
    entry = ["/some/env/site-packages/flashattn_lite/__main__.py", "memory", "--out", "/d"]
    assert common.recorded_command(entry, "/d") == "flashattn-lite memory --out $OUT"
    assert common.recorded_command(["/usr/local/bin/flashattn-lite", "speed"], "x") == "flashattn-lite speed"
    # torchrun hands a script its absolute path: the machine's folders stay out of the record.
    inside = str(Path.cwd() / "benchmarks" / "ring.py")
    assert common.recorded_command([inside, "--quick"], "x") == "benchmarks/ring.py --quick"
    assert common.recorded_command(["/elsewhere/ring.py", "--quick"], "x") == "ring.py --quick"


def load_benchmark(name: str):
    """The module of benchmarks/<name>.py (the scripts are files, not a package)."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, needle", [
    (["--out", ".", "--cache-dir", "/no/such/folder"], "--cache-dir"),
    (["--out", ".", "--cache-dir", ".", "--benchmarks", "speeds"], "--benchmarks"),
    (["--out", ".", "--cache-dir", ".", "--benchmarks", ""], "--benchmarks"),
    (["--out", ".", "--cache-dir", ".", "--time-budget", "soon"], "--time-budget"),
    (["--out", ".", "--cache-dir", ".", "--rounds", "0"], "--rounds"),
    (["--out", ".", "--cache-dir", ".", "--rounds", "two"], "--rounds"),
    (["--out", ".", "--cache-dir", ".", "--table", "/no/such/table.json"], "--table"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_table_check_argument_errors(argv, needle, capsys):
    # benchmarks/table_check.py (GPU): a bad argument is a usage error naming it, before any run.
    module = load_benchmark("table_check")
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


def test_hopper_benchmarks_configs_by_name(monkeypatch):
    # benchmarks/gluon_fwd.py / gluon_bwd.py --configs NAME,...: the named configs of the point's head
    # dim; a name in no head dim's sweep stops the run naming it (a typo would measure nothing).
    from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    module = load_benchmark("hopper_fwd")
    d64, d128 = gluon_bwd.CONFIGS[64][0], gluon_bwd.CONFIGS[128][0]
    assert module.chosen_configs(gluon_bwd, f"{d64.name},{d128.name}", 64, True, 2048) == [d64]
    assert module.chosen_configs(gluon_bwd, "all", 128, True, 2048) == gluon_bwd.CONFIGS[128]
    with pytest.raises(SystemExit, match="gb-typo"):
        module.chosen_configs(gluon_bwd, f"{d64.name},gb-typo", 64, True, 2048)


@pytest.mark.parametrize("argv, needle", [(["--rep-ms", "0"], "--rep-ms"), (["--pass", "sideways"], "--pass")],
                         ids=["rep-ms", "pass"])
def test_gluon_checkout_rejects_bad_arguments(argv, needle, monkeypatch, capsys):
    # benchmarks/gluon_checkout.py: a nonpositive --rep-ms or an unknown --pass is a usage error
    # naming it, before any GPU work.
    module = load_benchmark("gluon_checkout")
    monkeypatch.setattr(sys, "argv", ["gluon_checkout.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--out", "x.json", "a=.", "b"], ["--out", "x.json", "a=."],
                                  ["--out", "x.json", "--timeout", "0", "a=.", "a"]],
                         ids=["unknown-name", "no-runs", "timeout"])
def test_checkout_ab_rejects_bad_runs_before_running_any(argv, monkeypatch, capsys):
    # benchmarks/checkout_ab.py: a run order naming no checkout, an empty order or a nonpositive
    # timeout is a usage error (exit 2), before any checkout runs.
    module = load_benchmark("checkout_ab")
    monkeypatch.setattr(sys, "argv", ["checkout_ab.py", *argv])
    monkeypatch.setattr(module.subprocess, "run", lambda *a, **k: pytest.fail("a checkout ran"))
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    assert exit_info.value.code == 2 and "usage" in capsys.readouterr().err


def test_checkout_ab_summary_takes_each_checkouts_best_and_compares_hashes():
    module = load_benchmark("checkout_ab")
    runs = [("old", {"p": {"ms": 2.0, "hash": "a"}, "h": {"hash": "x"}}),
            ("new", {"p": {"ms": 1.6, "hash": "a"}, "h": {"hash": "y"}}),
            ("new", {"p": {"ms": 1.5, "hash": "a"}, "h": {"hash": "y"}}),
            ("old", {"p": {"ms": 1.8, "hash": "a"}, "h": {"hash": "x"}})]
    point, hashed = module.summary(runs, ["old", "new"])
    assert point.split() == ["p", "old", "1.800", "new", "1.500", "(+20.0%)", "="]
    assert hashed.split() == ["h", "old", "new", "≠"]


@pytest.mark.parametrize("argv, needle", [(["--n", "0"], "--n"), (["--tokens", "100", "--n", "200"], "--tokens"),
                                          (["--hidden", "100"], "--hidden"), (["--softcap", "-1"], "--softcap"),
                                          (["--peer", "cudnn", "--alibi"], "--peer"),
                                          (["--config", "g-typo"], "g-typo"),
                                          (["--head-dim", "36", "--hidden", "72"], "--head-dim 36"),
                                          (["--head-dim", "192", "--hidden", "3072", "--value-dim", "20"],
                                           "--value-dim 20")])
def test_ncu_profile_checks_its_arguments_before_any_gpu_work(argv, needle, capsys):
    # benchmarks/ncu_profile.py: each bad argument is a usage error naming it (exit 2), raised by
    # parse_args before the GPU is touched; a config of the sweep comes back by name.
    from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
    module = load_benchmark("ncu_profile")
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err
    name = gluon_bwd.CONFIGS[64][0].name
    args, config = module.parse_args(["--backward", "--head-dim", "64", "--config", name])
    assert config == gluon_bwd.CONFIGS[64][0] and args.backward
    assert module.parse_args([])[1] is None
    # MLA's widths: the sweep of the width the kernels run at (256)
    name = gluon_bwd.WIDE_TWO_KERNELS.name
    args, config = module.parse_args(["--backward", "--head-dim", "192", "--value-dim", "128", "--hidden", "3072",
                                      "--config", name])
    assert config == gluon_bwd.WIDE_TWO_KERNELS and args.value_dim == 128


def test_ours_portable_turns_the_hopper_paths_off_for_the_whole_measurement():
    # The benchmarks time the backward after the forward returned: the Hopper paths must stay off
    # for every call made inside the runner's context, not only inside the forward.
    import os

    import torch

    from flashattn_lite.bench.peers import PEERS, Problem
    problem = Problem(batch=1, heads=2, kv_heads=2, seqlen=16, head_dim=16, dtype=torch.float32, causal=True,
                      device="cpu")
    runner = PEERS["ours-portable"].build(problem, "-")
    with runner.context():
        assert os.environ.get("FLASHATTN_LITE_HOPPER") == "0"
    assert os.environ.get("FLASHATTN_LITE_HOPPER") != "0"


@pytest.mark.parametrize("argv, needle", [(["--out", ".", "--rep-ms", "0"], "--rep-ms"),
                                          (["--out", ".", "--bands", "4,x"], "--bands"),
                                          (["--out", ".", "--lengths", "0"], "--lengths"),
                                          (["--out", ".", "--head-dims", "96"], "--head-dims"), ([], "--out")],
                         ids=["rep-ms", "bands", "lengths", "head-dims", "no-out"])
def test_bwd_band_rejects_bad_arguments(argv, needle, capsys):
    # benchmarks/bwd_band.py (GPU): a bad argument is a usage error naming it, before any GPU work.
    module = load_benchmark("bwd_band")
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [(["--out", ".", "--trials", "2"], "--trials"),
                                          (["--out", ".", "--rep-ms", "-1"], "--rep-ms"),
                                          (["--out", ".", "--points", "d96-causal-2048"], "--points"),
                                          (["--out", ".", "--points", "d128-sideways-2048"], "--points"),
                                          (["--out", ".", "--points", "d128-causal-2048-gqa3"], "--points"),
                                          ([], "--out")],
                         ids=["trials", "rep-ms", "head-dim", "mask", "group", "no-out"])
def test_bwd_placement_rejects_bad_arguments(argv, needle, capsys):
    # benchmarks/bwd_placement.py (GPU): a bad argument is a usage error naming it, before any GPU work.
    module = load_benchmark("bwd_placement")
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("name, argv, needle", [("host_bound", ["--rounds", "0"], "--rounds"),
                                                ("host_bound", ["--rounds", "two"], "--rounds"),
                                                ("host_bound", ["--n", "2q"], "--n"),
                                                ("gqa_split", ["--rounds", "-1"], "--rounds"),
                                                ("gqa_split", ["--lengths", "2k,x"], "--lengths"),
                                                ("gqa_split", ["--lengths", ","], "--lengths"),
                                                ("deterministic_bwd", ["--rounds", "0"], "--rounds"),
                                                ("sustained_clock", ["--methods", "fa9"], "--methods"),
                                                ("sustained_clock", ["--modes", "both"], "--modes"),
                                                ("sustained_clock", ["--head-dims", "96"], "--head-dims"),
                                                ("sustained_clock", ["--lengths", "8k"], "--lengths"),
                                                ("sustained_clock", ["--lengths", "3000"], "--lengths"),
                                                ("sustained_clock", ["--seconds", "0"], "--seconds"),
                                                ("reduce_rate", ["--out", ".", "--n", "1000"], "--n"),
                                                ("reduce_rate", ["--out", ".", "--width", "0"], "--width"),
                                                ("reduce_rate", ["--out", ".", "--heads", "0"], "--heads"),
                                                ("reduce_rate", ["--out", ".", "--batch", "-1"], "--batch"),
                                                ("reduce_rate", ["--out", ".", "--n", "8q"], "--n"),
                                                ("reduce_rate", ["--out", ".", "--width", "96"], "--width"),
                                                ("reduce_rate", ["--out", ".", "--rounds", "0"], "--rounds"),
                                                ("experiments/cluster_probe", ["--timeout", "0"], "--timeout"),
                                                ("experiments/mla_fwd_configs", ["--lengths", "8q"], "--lengths"),
                                                ("experiments/mla_fwd_configs", ["--lengths", "0"], "--lengths"),
                                                ("experiments/mla_fwd_configs", ["--rounds", "0"], "--rounds"),
                                                ("experiments/mla_fwd_configs", ["--variants", "plain,gqa"], "gqa"),
                                                ("experiments/mla_decode", ["--cases", "0"], "--cases")],
                         ids=["host-rounds", "host-rounds-word", "host-n", "split-rounds", "split-lengths",
                              "split-no-lengths", "deterministic-rounds", "clock-methods", "clock-modes",
                              "clock-head-dims", "clock-lengths-word", "clock-lengths-divide", "clock-seconds",
                              "reduce-n", "reduce-width", "reduce-heads", "reduce-batch", "reduce-n-word",
                              "reduce-width-divide", "reduce-rounds", "cluster-probe-timeout", "mla-configs-lengths",
                              "mla-configs-lengths-zero", "mla-configs-rounds", "mla-configs-variants",
                              "mla-decode-cases"])
def test_gpu_benchmarks_reject_bad_arguments(name, argv, needle, capsys):
    # GPU benchmarks: a bad argument is a usage error naming it, before any GPU work.
    module = load_benchmark(name)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


def test_reduce_rate_reads_its_arguments(monkeypatch, capsys):
    # benchmarks/reduce_rate.py (GPU): without CUDA a usage error before any GPU work; with it, good
    # arguments as given (--n as a count such as 4k) and --rounds 3 by default.
    module = load_benchmark("reduce_rate")
    argv = ["--out", ".", "--n", "4k", "--width", "128", "--batch", "2", "--heads", "3"]
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_info:
            module.parse_args(argv)
        assert exit_info.value.code == 2 and "CUDA" in capsys.readouterr().err
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = module.parse_args(argv)
    assert (args.out, args.n, args.width, args.batch, args.heads, args.rounds) == (".", 4096, 128, 2, 3, 3)


def test_bwd_placement_finds_the_bit_that_splits_the_modes():
    # The analysis on made-up trials: slow exactly where bit 21 of the distance dQ buffer − q is set.
    module = load_benchmark("bwd_placement")
    assert module.parse_point("d64-full-8192-gqa4") == (64, False, 8192, 4)
    assert module.modes([1.0, 1.01, 1.02]) is None
    rng = random.Random(3)
    trials = []
    for _ in range(40):
        q, dq = rng.randrange(0, 1 << 34, 512), rng.randrange(0, 1 << 34, 512)
        slow = (dq - q) >> 21 & 1
        ms = (1.3 if slow else 1.0) + rng.random() * 0.02
        trials.append({"ms": ms, "ptr": {"q": q, "do": q + 4096, "dq_acc": dq}})
    split = module.modes([t["ms"] for t in trials])
    assert 1.02 < split < 1.3
    best = module.telling_bits(trials, split)[0]
    assert (best["what"], best["bit"], best["slow_share"], best["fast_share"]) == ("dq_acc-q", 21, 1.0, 0.0)


@pytest.mark.parametrize("argv", [["--out", ".", "--dtypes", "fp32"], ["--out", ".", "--dtypes", ","]],
                         ids=["fp32", "empty"])
def test_tolerance_margins_rejects_bad_dtypes(argv, capsys):
    # benchmarks/tolerance_margins.py: a dtype outside fp16/bf16 is a usage error naming --dtypes.
    module = load_benchmark("tolerance_margins")
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2 and "--dtypes" in capsys.readouterr().err


def test_tolerance_margins_measures_a_correct_kernel_inside_the_rule(monkeypatch):
    # The measurement on CPU tensors (the CPU twin, a correct kernel): its margin under the tests'
    # rule is above 1, and the reference's own error is above 0 (the rule is not vacuous).
    module = load_benchmark("tolerance_margins")
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = module.measure("t", (1, 2, 1, 40, 57, 32), dict(causal=True, alibi=True, softcap=4.0), torch.bfloat16)
    assert [r["tensor"] for r in rows] == ["o", "dq", "dk", "dv"]
    for r in rows:
        assert r["margin"] > 1 and r["err_ref"] > 0, r


def test_speed_records_a_wrong_output_as_wrong_not_as_a_speed(tmp_path, capsys, torch_cpu_path, monkeypatch):
    """Each method's outputs are checked against float64 once a point: one that is off (here the
    reference is made wrong for every method) is recorded as ``wrong``, with no TFLOP/s, named in
    the report and counted against ours in the standing."""
    from flashattn_lite.bench import attention as bench
    real = bench.reference_outputs
    monkeypatch.setattr(bench, "reference_outputs", lambda problem, mode: [t * 2 for t in real(problem, mode)])
    for rounds in ("1", "2"):
        status, out, err = run_cli(TINY_SPEED + ["--max-n", "64", "--rounds", rounds, "--out", str(tmp_path / rounds)],
                                   capsys)
        assert status == 0, err
        rows = json.loads(one(tmp_path / rounds, "attention_speed-*.json").read_text())["results"]
        assert rows and all(r["status"] == "wrong" and r["tflops"] is None and r["check_err"] > 0.3 for r in rows)
        assert "WRONG: ours fwd d=16 causal N=64" in out


def test_portable_theory_counts_no_hopper_buffer(monkeypatch):
    """ours-portable runs with the Hopper paths off: its theory has no Gluon dQ buffer even when the
    process has them on (the theory was computed outside the portable context)."""
    from flashattn_lite.bench import peers
    from flashattn_lite.ops import attention_fwd_hopper as hopper
    monkeypatch.setattr(peers, "_gluon_dq_bytes", lambda p: 1000 if hopper.enabled() else 0)
    p = peers.Problem(1, 2, 2, 64, 16, torch.float16, False, "cuda")
    ours = peers.PEERS["ours"].theory_bytes(p, "fwd+bwd")
    portable = peers.PEERS["ours-portable"].theory_bytes(p, "fwd+bwd")
    assert ours - portable == 1000 and hopper.enabled()


def test_a_nan_output_fails_the_benchmarks_check(tmp_path, capsys, torch_cpu_path, monkeypatch):
    """max() keeps its first argument against a NaN: the error of a NaN output must still be NaN,
    and a NaN error is ``wrong`` (``not err <= tolerance``); a point whose reference did not fit says so."""
    import math
    from flashattn_lite.bench import attention as bench, common
    ones = torch.ones(2, 3, dtype=torch.float64)
    assert math.isnan(common.relative_error([ones, ones * float("nan")], [ones, ones]))
    assert math.isnan(common.relative_error([ones * float("nan")], [ones]))
    problem = bench.Problem(1, 1, 1, 8, 16, torch.bfloat16, False, "cpu")
    assert bench._checked({"status": "ok", "check_err": math.nan}, problem)["status"] == "wrong"

    def no_room(problem, mode):
        raise torch.OutOfMemoryError("no room")
    monkeypatch.setattr(bench, "reference_outputs", no_room)
    status, out, err = run_cli(TINY_SPEED + ["--max-n", "64", "--modes", "fwd", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    rows = json.loads(one(tmp_path, "attention_speed-*.json").read_text())["results"]
    assert all(r["status"] == "ok" and r["check"].startswith("skipped") for r in rows)
    assert "not checked against float64" in out
