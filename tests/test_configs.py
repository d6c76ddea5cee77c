"""Config tables and tuning: table lookups (hits, misses, the option and length rules), the
first-fit rule, the disk cache of tuned winners across processes, and that a new length never
makes a launch take Triton's path again. CPU only: the GPU is faked where a device is asked."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import triton

from flashattn_lite import configs
from flashattn_lite.configs import cache, tuning
from flashattn_lite.configs.tuning import Tuning

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=2) for b, w in [(128, 8), (64, 4), (32, 4)]]
ROWS = {"k": [
    {"key": {"dtype": "bfloat16", "D": 128, "n": 1024}, "config": {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 2}},
    {"key": {"dtype": "bfloat16", "D": 128, "n": 8192}, "config": {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 2}},
    {"key": {"dtype": "bfloat16", "D": 64}, "config": {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 2}},
    {"key": {"dtype": "bfloat16", "D": 256, "GONE": 1}, "config": {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 2}},
]}


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"arch": "sm90", "kernels": ROWS}))
    monkeypatch.setenv("FLASHATTN_LITE_CONFIG_TABLE", str(path))
    configs.load_table.cache_clear()
    yield
    configs.load_table.cache_clear()


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tuning, "arch_of", lambda device: "sm90")
    monkeypatch.setattr(cache, "environment", lambda device: {"gpu": "fake", "driver": "1", "torch": "t", "triton": "3"})
    monkeypatch.setenv("FLASHATTN_LITE_CACHE_DIR", str(tmp_path / "cache"))


def key(d=128, n=1024, **extra):
    return {"dtype": "bfloat16", "D": d, "FLAG": False, "n": n, **extra}


@pytest.mark.parametrize("call, block", [
    (key(), 64),                    # exact
    (key(n=2048), 64),              # nearest length in log2 (1 from 1024, 2 from 8192)
    (key(n=65536), 32),
    (key(d=64, n=3), 32),           # a row without a length serves every length
    (key(FLAG=True), None),         # an option a row leaves out must be off
    (key(d=96), None),              # no row
    (key(d=256), None),             # a row naming a field the kernel no longer has
    ({**key(), "dtype": "float16"}, None),
], ids=["exact", "nearest-length", "far-length", "any-length", "option-on", "miss", "stale-field", "dtype"])
def test_lookup(table, call, block):
    row = configs.lookup("k", call, "sm90", length="n")
    assert (row["config"]["kwargs"]["BLOCK"] if row else None) == block


def test_other_architectures_have_no_rows(table, monkeypatch):
    monkeypatch.delenv("FLASHATTN_LITE_CONFIG_TABLE")
    configs.load_table.cache_clear()
    assert configs.load_table("sm0") == {}


def _tuning(prune=None):
    t = Tuning(CONFIGS, ["D", "FLAG", "n"], CONFIGS[-1], prune=prune, length="n")
    t.name = "k"
    return t


def _named(d=128, n=1024, flag=False):
    return {"x": torch.empty(1, dtype=torch.bfloat16), "D": d, "FLAG": flag, "n": n}


def test_table_hit_and_misses_take_the_first_config_that_fits(table, fake_gpu):
    assert _tuning().choose(_named()).config.kwargs == {"BLOCK": 64}
    miss = _tuning().choose(_named(d=96))
    assert miss.config.kwargs == {"BLOCK": 128} and miss.source.startswith("first fit")
    drop_64 = lambda cs, named: [c for c in cs if c.kwargs["BLOCK"] != 64]
    unfit = _tuning(drop_64).choose(_named())
    assert unfit.config.kwargs == {"BLOCK": 128} and "does not fit" in unfit.source
    assert _tuning().choose(_named(), interpreted=True).config is CONFIGS[-1]


def test_a_new_length_selects_a_row_without_timing(table, fake_gpu):
    t = _tuning()
    never = lambda c: pytest.fail("timed a config without FLASHATTN_LITE_AUTOTUNE=1")
    assert t.choose(_named(n=1024), bench=never).config.kwargs == {"BLOCK": 64}
    assert t.choose(_named(n=16384), bench=never).config.kwargs == {"BLOCK": 32}


def test_tuned_winners_persist_across_processes(table, fake_gpu, monkeypatch):
    monkeypatch.setenv("FLASHATTN_LITE_AUTOTUNE", "1")
    timed = []
    times = {128: 1.01, 64: 1.0, 32: 2.0}  # 128 is within 2% of the best: a tie, and first in prune order

    def bench(c):
        timed.append(c.kwargs["BLOCK"])
        return times[c.kwargs["BLOCK"]]
    first = _tuning().choose(_named(d=96), bench=bench)
    assert timed == [128, 64, 32] and first.config.kwargs == {"BLOCK": 128} and first.source.startswith("tuned (")
    assert len(list(Path(cache.cache_dir()).glob("tuning-*.json"))) == 1
    # A new process: a fresh Tuning, the winner read back, nothing timed.
    again = _tuning().choose(_named(d=96), bench=lambda c: pytest.fail("timed again"))
    assert again.config.kwargs == {"BLOCK": 128} and again.source == "tuned (disk cache)"
    # An edited kernel (another source hash) does not reuse it.
    edited = _tuning()
    edited.jit = type("Jit", (), {"cache_key": "edited"})()
    timed.clear()
    edited.choose(_named(d=96), bench=bench)
    assert timed == [128, 64, 32]


def test_length_must_be_a_key_argument():
    with pytest.raises(ValueError, match="length"):
        Tuning(CONFIGS, ["D"], CONFIGS[0], length="n")


def test_shipped_rows_name_configs_their_kernels_can_run():
    """Every row of every shipped table is one of its kernel's candidate configs."""
    from flashattn_lite.configs import sm90, tune
    kernels = tune.tuned_kernels()
    for name, rows in sm90.TABLE["kernels"].items():
        assert name in kernels, f"table rows for unknown kernel {name}"
        candidates = [configs.config_to_dict(c) for c in kernels[name].configs]
        for row in rows:
            assert row["config"] in candidates, (name, row)


def test_tune_grid_tunes_attention_at_each_gqa_ratio(monkeypatch, capsys):
    """``tune --gqa``: the attention and variants grids at Hkv = Hq / r KV heads (Hq = 2048 / d) for
    each ratio, one ratio after another; a ratio that does not divide Hq skipped with a note. The
    steps run on the meta device with a stand-in attention that records what it was called with."""
    from flashattn_lite.configs import tune
    from flashattn_lite.ops import attention as attention_module
    calls = []

    def stand_in(q, k, v, causal=False, **options):
        calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), causal,
                      {n: tuple(x.shape) if isinstance(x, torch.Tensor) else x for n, x in options.items()}))
        g = q.shape[1] // k.shape[1]
        return q * k.repeat_interleave(g, 1).sum(-1, keepdim=True) + v.repeat_interleave(g, 1)

    monkeypatch.setattr(attention_module, "attention", stand_in)
    grid = list(tune._grid(["attention", "variants", "decode"], [128, 64], [torch.bfloat16], [4096],
                           [1, 3, 4, 32], dev="meta"))
    out = capsys.readouterr().out
    assert "--gqa 3: skipped at d 128" in out and "--gqa 3: skipped at d 64" in out
    assert "--gqa 32: skipped at d 128" in out and "--gqa 32: skipped at d 64" not in out  # 32 heads at d 64
    attention = [(label, step) for label, step in grid if label.startswith("attention")]
    assert not any(label.endswith("gqa3") or label.startswith("attention d128") and label.endswith("gqa32")
                   for label, _ in attention)
    assert [label for label, _ in attention[:6]] == [
        "attention d128 torch.bfloat16 N4096 gqa1", "attention d128 torch.bfloat16 N4096 causal gqa1",
        "attention d64 torch.bfloat16 N4096 gqa1", "attention d64 torch.bfloat16 N4096 causal gqa1",
        "attention d128 torch.bfloat16 N4096 gqa4", "attention d128 torch.bfloat16 N4096 causal gqa4"]
    assert len(attention) == 2 * 2 + 2 * 2 + 2 + 5 * (2 + 2 + 1)  # plain (d × r × causal), then the variants
    assert sum(label.startswith("decode") for label, _ in grid) == len(tune.DECODE)  # decode: its own grid
    heads = {128: 16, 64: 32}
    for label, step in attention:
        calls.clear()
        step()
        (q, k, v, causal, options), = calls
        d, r = int(label.split()[1][1:]), int(label.split()[-1][3:])
        b, n = 4, 4096
        assert q == (b, heads[d], n, d) and k == v == (b, heads[d] // r, n, d), label
        assert causal == ("causal" in label), label
        for name in ("alibi_slopes", "sinks"):  # per query head
            assert options.get(name, (heads[d],)) == (heads[d],), label
    assert {label.split()[-1] for label, _ in attention if "sinks" in label} == {"gqa1", "gqa4", "gqa32"}


def test_tune_gqa_ratios():
    from flashattn_lite.bench.common import BenchArgumentError
    from flashattn_lite.configs import tune
    assert tune.gqa_ratios("1") == [1] and tune.gqa_ratios("8,1,4,8") == [8, 1, 4]
    for bad in ("0", "1,-4", "x", "", "1,", "2.5"):
        with pytest.raises(BenchArgumentError, match="--gqa"):
            tune.gqa_ratios(bad)


# ---------------------------------------------------------------- lengths do not re-key launches

def test_unspecialized_lengths_reuse_one_launch_entry(monkeypatch):
    from flashattn_lite import _launcher
    from test_launcher import _FakeJit, fake_fast_path
    fake_fast_path(monkeypatch)
    jit = _FakeJit()
    jit.params[1].do_not_specialize = True  # n: a length
    kern = _launcher.Launcher(jit)
    x = torch.randn(64)
    for n in (4096, 4097, 1, 33):
        kern[(1,)](x, n, 1.0, BLOCK=4)
    kern[(1,)](x, 2 ** 40, 1.0, BLOCK=4)  # beyond int32: another type, as for Triton
    assert [e[0] for e in jit.log] == ["slow", "fast", "fast", "fast", "slow"]


def test_an_override_table_of_another_arch_is_refused_and_a_tune_module_is_read(tmp_path, monkeypatch):
    """A table tuned on another GPU was served as this one's (its "arch" unread), and the ``.py``
    table ``flashattn-lite tune`` writes raised a JSONDecodeError at the first launch."""
    path = tmp_path / "a100.json"
    path.write_text(json.dumps({"arch": "sm80", "kernels": {"k": ROWS}}))
    monkeypatch.setenv("FLASHATTN_LITE_CONFIG_TABLE", str(path))
    configs.load_table.cache_clear()
    try:
        with pytest.raises(ValueError, match="holds the configs of sm80; this GPU is sm90"):
            configs.load_table("sm90")
        module = tmp_path / "sm90.py"
        module.write_text("TABLE = " + repr({"arch": "sm90", "kernels": {"k": ROWS}}) + "\n")
        monkeypatch.setenv("FLASHATTN_LITE_CONFIG_TABLE", str(module))
        configs.load_table.cache_clear()
        assert configs.load_table("sm90") == {"k": ROWS}
    finally:
        configs.load_table.cache_clear()
