"""explain(): the path a call took, its kernels and configs, and why; the log of first compiles and
fallbacks (each once). CPU tensors: the interpreter path, and the PyTorch twin."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

import flashattn_lite as fa
from flashattn_lite import _log
from flashattn_lite.explain import _explained

ON_GPU = torch.cuda.is_available()


def qkv(n=20, d=16, requires_grad=False, device="cpu"):
    return [torch.randn(1, h, n, d, device=device, requires_grad=requires_grad) for h in (2, 1, 1)]


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
def test_attention_under_the_interpreter_names_each_kernel_and_its_config():
    e = fa.explain(*qkv(), causal=True)
    assert (e.op, e.path) == ("attention", "interpreter")
    assert [k.name for k in e.kernels] == ["_attn_fwd_kernel"]
    assert e.kernels[0].config["BLOCK_M"] == 16 and e.kernels[0].source == "interpreter config"
    assert "TRITON_INTERPRET=1" in e.reason and "_attn_fwd_kernel" in str(e)


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
@pytest.mark.parametrize("n, backward", [
    (20, ["_bwd_short_kernel"]),  # every key in one tile: the one-launch backward
    (70, ["_bwd_preprocess", "_bwd_dkdv_kernel", "_bwd_dq_kernel"]),
])
def test_backward_kernels_are_explained_when_an_input_requires_grad(n, backward):
    q, k, v = qkv(n=n, requires_grad=True)
    e = fa.explain(q, k, v)
    assert e.op == "attention forward+backward"
    assert [k.name for k in e.kernels] == ["_attn_fwd_kernel", *backward]
    assert q.grad is None  # the caller's tensors are untouched


def test_cpu_tensors_without_the_interpreter_run_the_twin(torch_cpu_path):
    e = fa.explain(*qkv())
    assert e.path == "cpu twin" and e.kernels == () and "TRITON_INTERPRET" in e.reason


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
def test_softmax_and_decode(capsys):
    s = fa.explain.softmax(torch.randn(3, 100), show=True)
    assert s.path == "interpreter" and [k.name for k in s.kernels] == ["_row_kernel"]
    assert "softmax: interpreter" in capsys.readouterr().out
    q = torch.randn(2, 4, 1, 16)
    kc, vc = torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    d = fa.explain.decode(q, kc, vc, torch.tensor([5, 32], dtype=torch.int32))
    assert d.op == "decode" and d.kernels[0].name == "_decode_split_kernel"


def test_bad_arguments_raise_as_the_call_does():
    q, k, v = qkv()
    with pytest.raises(ValueError):
        fa.explain(q, k[:, :, :, :8], v)


def test_a_fallback_is_the_path_with_its_reason():
    def call():
        _log.note_fallback("test-explain", "a reason only this test gives", warn=False)
    e = _explained("op", torch.empty(1), call, show=False)
    assert e.path == "torch fallback" and e.reason == "test-explain: a reason only this test gives"


def test_a_forward_only_call_has_one_path():
    def call():
        _log.note_path("hopper", "attention forward", "a forward note")
    e = _explained("op", torch.empty(1), call, show=False)
    assert (e.path, e.reason) == ("hopper", "attention forward: a forward note") == e.forward
    assert e.backward is None and str(e) == "op: hopper (attention forward: a forward note)"


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
@pytest.mark.parametrize("noted", ["forward", "backward"])
def test_forward_and_backward_on_different_paths_each_say_theirs(monkeypatch, noted):
    """A forward on one path and a backward on another (as a Hopper forward and the portable
    backward): each direction reports its own; ``path``/``reason`` stay the last one announced."""
    from flashattn_lite.ops import attention as attention_ops
    name = f"attention_{noted}"
    real = getattr(attention_ops, name)

    def noting(*args, **kwargs):
        _log.note_path("hopper", f"attention {noted}", "a stand-in")
        return real(*args, **kwargs)
    monkeypatch.setattr(attention_ops, name, noting)
    e = fa.explain(*qkv(requires_grad=True))
    hopper = ("hopper", f"attention {noted}: a stand-in")
    interpreter = ("interpreter", "CPU tensors with TRITON_INTERPRET=1: the Triton kernels in Triton's CPU interpreter")
    assert (e.forward, e.backward) == ((hopper, interpreter) if noted == "forward" else (interpreter, hopper))
    assert (e.path, e.reason) == hopper  # as before: the last path announced
    lines = str(e).splitlines()
    assert lines[:3] == ["attention forward+backward:", "  forward: %s (%s)" % e.forward,
                         "  backward: %s (%s)" % e.backward]
    assert [k.name for k in e.kernels] == ["_attn_fwd_kernel", "_bwd_short_kernel"]


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
def test_forward_and_backward_on_one_path_say_it_once():
    e = fa.explain(*qkv(), backward=True)
    assert e.forward == e.backward == (e.path, e.reason) and e.path == "interpreter"
    assert str(e).splitlines()[0] == f"attention forward+backward: interpreter ({e.reason})"


@pytest.fixture
def fresh_log(monkeypatch):
    monkeypatch.setenv("FLASHATTN_LITE_LOG", "1")
    seen = _log.log_once.__defaults__[0]
    saved = set(seen)
    seen.clear()
    yield
    seen.clear()
    seen.update(saved)


@pytest.mark.skipif(ON_GPU, reason="the interpreter path: CPU tensors")
def test_log_shows_each_first_compile_once(fresh_log, caplog):
    x = torch.randn(2, 300)
    with caplog.at_level(logging.INFO, logger="flashattn_lite"):
        fa.softmax(x)
        fa.softmax(x)
    lines = [r.getMessage() for r in caplog.records if "_row_kernel" in r.getMessage()]
    assert len(lines) == 1 and "BLOCK_N=512" in lines[0] and "interpreter config" in lines[0]


def test_log_shows_each_fallback_once(fresh_log, caplog):
    with caplog.at_level(logging.INFO, logger="flashattn_lite"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _log.note_fallback("test-log", "the same reason")
    assert [r.getMessage() for r in caplog.records] == ["test-log: falling back: the same reason"]
    assert len(caught) == 1
    assert _log.fallback_counts()[("test-log", "the same reason")] == 3


def test_an_untested_triton_on_hopper_is_said_once(monkeypatch):
    """On an sm_90 device with a triton the Hopper kernels were not tested on, calls run the portable
    kernels: a warning says so once (not per call), and not at all on other devices."""
    from flashattn_lite.ops import attention_fwd_hopper as hopper
    q = torch.zeros(1, 1, 1, 64, dtype=torch.float16)
    monkeypatch.setattr(hopper, "_warned_untested", [])
    monkeypatch.setattr(hopper.triton, "__version__", "3.5.1")
    monkeypatch.setattr(hopper, "_device_reason", lambda *a: "not an sm_90 (Hopper) device")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not hopper.triton_tested(q)
    assert not seen
    monkeypatch.setattr(hopper, "_device_reason", lambda *a: None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not hopper.fast_path(q, q, q, False, 0, 1.0) and not hopper.fast_path(q, q, q, True, 0, 1.0)
    assert [str(w.message) for w in seen] == [
        "flashattn_lite: triton 3.5.1 on an sm_90 GPU: the Hopper kernels are tested on triton 3.6.x only, so "
        "the portable kernels run (0.3-0.9 x as fast, by head dim); install triton 3.6.x for them"]
    monkeypatch.setattr(hopper.triton, "__version__", "3.6.0")
    assert hopper.triton_tested(q)


def test_explain_runs_a_backward_exactly_where_the_call_would():
    """Under no_grad a call records no backward (explain crashed there: it ran one on tensors that
    require grad); a sinks tensor that requires grad makes the call's backward run (explain ran the
    forward only); backward=True under no_grad still explains the backward."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    sinks = torch.zeros(2, requires_grad=True)
    with torch.no_grad():
        assert fa.explain(q, q, q).op == "attention"
        assert fa.explain(q, q, q, backward=True).op == "attention forward+backward"
    plain = q.detach()
    assert fa.explain(plain, plain, plain, sinks=sinks).op == "attention forward+backward"
    assert fa.explain(plain, plain, plain, sinks=sinks.detach()).op == "attention"
