"""``flashattn-lite variants`` (flashattn_lite/bench/variants.py): each method's speed-up over its
own base, failed and wrong cases recorded as rows, every case checked against float64, varlen
against dense attention on the same sequences, an untimed round before the timed ones. CPU twin,
tiny sizes; the timings are faked where a test checks what is computed from them."""
import pytest
import torch

from flashattn_lite import reference
from flashattn_lite.bench import common, variants
from flashattn_lite.ops import attention as attention_ops

CFG = dict(n=64, window=16, options_n=32, tokens=256, head_dim=16, hidden=32, rep_ms=0.1, rounds=2)


class Writer:
    """What the groups use of ``common.ResultWriter``."""

    def __init__(self):
        self.rows = []

    def start(self, **point):
        return True

    def add(self, row):
        self.rows.append(row)

    def by(self, case, mode):
        found = [r for r in self.rows if (r["case"], r["mode"]) == (case, mode)]
        assert len(found) == 1, (case, mode, [(r["case"], r["mode"]) for r in self.rows])
        return found[0]


def fake_times(monkeypatch, ms):
    """Replace the interleaved timing: each step's rounds all take ``ms(case, mode)``; returns the
    calls' records (the keys timed, ``untimed``)."""
    calls = []

    def interleaved(steps, rep_ms, rounds=3, *, untimed=False, failed=None):
        calls.append(dict(keys=list(steps), untimed=untimed))
        return {key: [ms(*key)] * rounds for key in steps}
    monkeypatch.setattr(variants, "_interleaved", interleaved)
    return calls


@pytest.fixture
def cpu_flex(monkeypatch):
    """FlexAttention's window cases on the CPU: a stand-in that computes the same masks (ours' CPU twin)."""
    def flex_window(q, k, v, w):
        return lambda: attention_ops.attention(q, k, v, causal=True, window=None if w is None else (w - 1, 0))
    monkeypatch.setattr(variants, "_flex_runs", lambda device: True)
    monkeypatch.setattr(variants, "_flex_window", flex_window)


def test_flex_window_speedup_is_over_flex_full_causal(monkeypatch, torch_cpu_path, cpu_flex):
    # Before: FlexAttention's window "speed-up" was our full causal time over its window time, so it
    # moved with our kernel. Now each method's window is over its own full causal.
    w = CFG["window"]
    times = {"full causal": 10.0, f"window {w}": 4.0, "flex full causal": 30.0, f"flex window {w}": 10.0}
    calls = fake_times(monkeypatch, lambda case, mode: times[case] * (1 if mode == "fwd" else 3))
    writer = Writer()
    variants._window_group(CFG, writer, torch.float32, "cpu", use_flex=True)
    assert calls[0]["untimed"] and len(calls[0]["keys"]) == 8
    for mode in ("fwd", "fwd+bwd"):
        flex = writer.by(f"flex window {w}", mode)
        assert flex["status"] == "ok" and flex["base"] == "flex full causal"
        assert flex["speedup"] == pytest.approx(3.0)          # 30 / 10, not ours' 10 / 10
        assert flex["speed_vs_ours"] == pytest.approx(0.4)    # ours' window 4 / its 10
        assert writer.by("flex full causal", mode)["speedup"] == 1.0
        assert writer.by("flex full causal", mode)["speed_vs_ours"] == pytest.approx(1 / 3)
        assert writer.by(f"window {w}", mode)["speedup"] == pytest.approx(2.5)
        assert writer.by(f"window {w}", mode)["base"] == "full causal"
        assert 0 <= flex["check_err"] < 1e-5
    # Our full causal twice as slow: our speed-up doubles, FlexAttention's does not move.
    times["full causal"] = 20.0
    writer = Writer()
    variants._window_group(CFG, writer, torch.float32, "cpu", use_flex=True)
    assert writer.by(f"flex window {w}", "fwd")["speedup"] == pytest.approx(3.0)
    assert writer.by(f"window {w}", "fwd")["speedup"] == pytest.approx(5.0)


def test_compare_uses_each_case_own_base():
    ok = lambda ms: {"status": "ok", "ms": ms}  # noqa: E731
    cases = [variants.Case("a", inputs=(), do=None, pairs=1), variants.Case("b", inputs=(), do=None, pairs=1, base="a"),
             variants.Case("pa", inputs=(), do=None, pairs=1, ours="a"),
             variants.Case("pb", inputs=(), do=None, pairs=1, base="pa", ours="b"),
             variants.Case("lone", inputs=(), do=None, pairs=1)]
    results = {(name, mode): ok(ms) for name, ms in (("a", 8.0), ("b", 2.0), ("pa", 16.0), ("pb", 8.0), ("lone", 1.0))
               for mode in ("fwd", "fwd+bwd")}
    got = variants.compare(results, cases)
    assert got["b", "fwd"]["speedup"] == 4.0 and got["pb", "fwd"]["speedup"] == 2.0
    assert got["pb", "fwd"]["speed_vs_ours"] == 0.25 and got["pa", "fwd"]["speed_vs_ours"] == 0.5
    assert got["a", "fwd"]["speedup"] == 1.0 and got["lone", "fwd"]["speedup"] is None
    results["pa", "fwd"] = {"status": "error", "note": "RuntimeError: no"}
    got = variants.compare(results, cases)
    assert got["pb", "fwd"]["speedup"] is None and "'pa' is error" in got["pb", "fwd"]["base_note"]
    assert got["pb", "fwd+bwd"]["speedup"] == 2.0


def test_a_failing_case_is_an_error_row_and_never_a_base(monkeypatch, torch_cpu_path):
    real = attention_ops.attention

    def attention(q, k, v, **kw):
        if kw.get("window") is None:
            raise RuntimeError("full causal broke")
        return real(q, k, v, **kw)
    monkeypatch.setattr(attention_ops, "attention", attention)
    calls = fake_times(monkeypatch, lambda case, mode: 1.0)
    writer = Writer()
    variants._window_group(CFG, writer, torch.float32, "cpu", use_flex=False)
    w = CFG["window"]
    assert [(r["case"], r["mode"]) for r in writer.rows] == [
        ("full causal", "fwd"), ("full causal", "fwd+bwd"), (f"window {w}", "fwd"), (f"window {w}", "fwd+bwd")]
    for mode in ("fwd", "fwd+bwd"):
        full = writer.by("full causal", mode)
        assert full["status"] == "error" and "full causal broke" in full["note"] and full["ms"] is None
        win = writer.by(f"window {w}", mode)
        assert win["status"] == "ok" and win["ms"] == 1.0 and win["speedup"] is None
        assert "'full causal' is error" in win["note"]
    assert calls[0]["keys"] == [(f"window {w}", "fwd"), (f"window {w}", "fwd+bwd")]  # the failed case not timed


def test_interleaved_drops_the_untimed_round_and_records_failures(monkeypatch):
    calls, clock = [], iter(range(1, 100))

    def time_ms(step, rep_ms):
        calls.append(step())
        if calls[-1] == "b" and len(calls) > 3:
            raise torch.OutOfMemoryError("out of memory")
        return float(next(clock))
    monkeypatch.setattr(common, "time_ms", time_ms)
    monkeypatch.setattr(common, "gpu_state", lambda: None)
    steps = {name: (lambda name=name: name) for name in "abc"}
    failed = {}
    times = variants._interleaved(steps, rep_ms=1.0, rounds=2, untimed=True, failed=failed)
    assert calls == list("abc" "abc" "ca")  # untimed round in round 1's order, then abc, bca (b failed in round 1)
    assert times == {"a": [4.0, 7.0], "b": [], "c": [5.0, 6.0]} and list(failed) == ["b"]  # 1–3 dropped


def test_wrong_output_is_recorded_without_a_speed(monkeypatch, torch_cpu_path):
    # A reference perturbed for the softcap cases: those are 'wrong' (no time, no cost), the others ok.
    real = reference.attention_reference

    def perturbed(q, k, v, **kw):
        o, lse = real(q, k, v, **kw)
        return (o + 1.0 if kw.get("softcap") else o), lse
    monkeypatch.setattr(reference, "attention_reference", perturbed)
    calls = fake_times(monkeypatch, lambda case, mode: {"plain": 2.0}.get(case, 3.0))
    writer = Writer()
    variants._options_group(CFG, writer, torch.float32, "cpu", use_flex=False)
    assert calls[0]["untimed"]
    for mode in ("fwd", "fwd+bwd"):
        for case in ("softcap 50", "all three"):
            r = writer.by(case, mode)
            assert r["status"] == "wrong" and r["ms"] is None and r["tflops"] is None and r["cost"] is None
            assert r["check_err"] > 1e-2 and "float64 reference" in r["note"]
            assert (case, mode) not in calls[0]["keys"]
        for case in ("plain", "sinks", "alibi"):
            r = writer.by(case, mode)
            assert r["status"] == "ok" and 0 <= r["check_err"] < 1e-5
        assert writer.by("sinks", mode)["cost"] == pytest.approx(0.5)


@pytest.mark.parametrize("dtype, err", [(torch.bfloat16, 0.029), (torch.bfloat16, 0.031), (torch.float16, 0.011)])
def test_check_tolerance_is_the_speed_sweeps(monkeypatch, dtype, err):
    case = variants.Case("x", fn=lambda: torch.zeros(1, 1, 2, 2), inputs=(), do=None, pairs=1,
                         reference=lambda: [torch.zeros(1, 1, 2, 2)])
    monkeypatch.setattr(variants.common, "relative_error", lambda got, ref: err)
    monkeypatch.setattr(variants.torch.autograd, "grad", lambda *a, **k: ())
    _, facts = variants._prepare(case, dtype)
    limit = {torch.bfloat16: 3e-2, torch.float16: 1e-2}[dtype]
    assert facts["fwd"]["status"] == ("wrong" if err > limit else "ok") and facts["fwd"]["check_err"] == err


def test_reference_slice_matches_the_full_reference():
    # Computed a few queries at a time against the keys they see; the same as one call on the slice.
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 37, 8, generator=g) for _ in range(4))
    sinks, slopes = torch.randn(3, generator=g), torch.rand(3, generator=g)
    for opts in (dict(), dict(window=(5, 0)), dict(softcap=2.0, sinks=sinks, alibi_slopes=slopes, window=(9, 0))):
        got = variants.reference_slice(q, k, v, do, rows=6, **opts)
        leaves = [t[:1, :1].double().requires_grad_() for t in (q, k, v)]
        sliced = {key: val[:1].double() if key in ("sinks", "alibi_slopes") else val for key, val in opts.items()}
        o, _ = reference.attention_reference(*leaves, causal=True, **sliced)
        want = [o, *torch.autograd.grad(o, leaves, do[:1, :1].double())]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_dense_plan_does_the_varlen_batchs_work():
    assert variants.dense_plan([128, 200, 128], 512) == [(128, 4, 2), (200, 2, 1)]
    lens = variants.mixed_lengths(32768)
    plan = variants.dense_plan(lens, 32768)
    assert sum(n * count for n, _, count in plan) == 32768
    assert all(b * n <= 32768 < (b + 1) * n for n, b, _ in plan)
    # The default batch's FLOPs sit at ~4050 tokens, not at its mean (1489): a dense batch at the
    # mean length is not the same work.
    assert sum(n ** 3 for n in lens) / sum(n ** 2 for n in lens) == pytest.approx(4050, abs=1)


def test_varlen_is_compared_with_dense_on_the_same_sequences(monkeypatch, torch_cpu_path):
    cfg = dict(CFG, tokens=1024)
    lens = variants.mixed_lengths(1024)
    plan = variants.dense_plan(lens, 1024)
    assert len(plan) > 2  # several distinct lengths
    # A dense batch of b sequences of length n takes b·n²/1000 ms; the varlen call 7 ms.
    dense_ms = {f"dense B{b}×{n}": b * n * n / 1000 for n, b, _ in plan}
    calls = fake_times(monkeypatch, lambda case, mode: dense_ms.get(case, 7.0))
    writer = Writer()
    variants._varlen_group(cfg, writer, torch.float32, "cpu")
    assert calls[0]["untimed"]
    same_ms = sum(count * n * n / 1000 for n, _, count in plan)  # each sequence at its own length
    h, d = cfg["hidden"] // cfg["head_dim"], cfg["head_dim"]
    pairs = sum(n * (n + 1) // 2 for n in lens)
    for mode in ("fwd", "fwd+bwd"):
        same = writer.by("dense same sequences", mode)
        assert same["status"] == "ok" and same["ms"] == pytest.approx(same_ms)
        assert same["tflops"] == pytest.approx(variants._tflops(pairs, h, d, same_ms, mode))
        varlen = writer.by(f"varlen {len(lens)} seqs", mode)
        assert varlen["base"] == "dense same sequences" and varlen["speedup"] == pytest.approx(same_ms / 7.0)
        assert varlen["speedup"] == pytest.approx(varlen["tflops"] / same["tflops"])
        assert 0 <= varlen["check_err"] < 1e-5 and 0 <= same["check_err"] < 1e-5
        for n, b, _ in plan:
            assert writer.by(f"dense B{b}×{n}", mode)["status"] == "ok"
    # A length that fails leaves the comparison without a time, and the varlen row without a speed-up.
    results = {(f"dense B{b}×{n}", "fwd"): {"status": "ok", "ms": 1.0} for n, b, _ in plan}
    n0, b0, _ = plan[0]
    results[f"dense B{b0}×{n0}", "fwd"] = {"status": "OOM", "note": "OutOfMemoryError"}
    names = [f"dense B{b}×{n}" for n, b, _ in plan]
    got = variants.dense_same_work(results, plan, names, "fwd")
    assert got["status"] == "OOM" and "ms" not in got and names[0] in got["note"]


def test_window_group_runs_and_checks_for_real(torch_cpu_path):
    # Real timing on the CPU twin: every case ok, timed over the rounds, its outputs near float64.
    writer = Writer()
    variants._window_group(CFG, writer, torch.float32, "cpu", use_flex=False)
    assert len(writer.rows) == 4
    for r in writer.rows:
        assert r["status"] == "ok" and r["ms"] > 0 and len(r["rounds_ms"]) == CFG["rounds"]
        assert 0 <= r["check_err"] < 1e-5
