"""Shared fixtures: where tests run, and how close is close enough.

Without CUDA the Triton kernels run in the interpreter (TRITON_INTERPRET=1 must be set before
Triton decorates any kernel, hence here). Tolerances follow flash-attention's convention: our error
against a float64 reference may be at most twice PyTorch's own error in the same dtype, plus eps.
Where that "own" result is ``attention_reference(dtype=fp16/bf16)``, it is computed as a fused kernel
computes it (float32 arithmetic from the 16-bit inputs, outputs rounded), which keeps the bar tight.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from flashattn_lite.reference import rel_err  # noqa: E402,F401 - the tests import it from here

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# The CPU interpreter computes tl.dot on bf16 wrongly (a known Triton interpreter issue): bf16 is
# covered on the GPU only.
DTYPES = [torch.float16, torch.bfloat16, torch.float32] if ON_GPU else [torch.float16, torch.float32]


def gpu_fp32_only(**allowed):
    """Mark a test whose float32 items run on the GPU only where each named parameter takes one of
    the ``allowed`` values: ``@gpu_fp32_only(shape=[SMALL_ODD, LARGE], causal=[False, True])``.

    float32 kernels do their dots on CUDA cores and compile slowly (tens of seconds each), while
    fp16/bf16 keep the full GPU grid and the CPU interpreter runs every item (this mark is inert
    there). Each use says in one comment line why its float32 subset is enough. The other items are
    deselected at collection (pytest reports them as deselected)."""
    return pytest.mark.gpu_fp32_only(**allowed)


# A test of a float64 PyTorch model of a kernel's schedule (no attention kernel runs; at most the
# tile-range helpers, which tests of their own check on the GPU): CPU CI runs it, the GPU suite
# deselects it (it would only repeat CI's result, and costs ~2 minutes of worker time there).
model_only = pytest.mark.model_only


def pytest_configure(config):
    config.addinivalue_line("markers", "model_only: a float64 model of a kernel's schedule: deselected on the GPU")
    config.addinivalue_line("markers", "gpu_fp32_only(**allowed): on the GPU, float32 items only where each named "
                            "parameter takes an allowed value (conftest.gpu_fp32_only)")


def pytest_collection_modifyitems(config, items):
    if not ON_GPU:
        return
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("model_only") is not None:
            drop.append(item)
            continue
        mark = item.get_closest_marker("gpu_fp32_only")
        params = getattr(getattr(item, "callspec", None), "params", {})
        assert mark is None or "dtype" in params, f"{item.nodeid}: gpu_fp32_only needs a 'dtype' parameter"
        if mark is not None and params.get("dtype") is torch.float32:
            unknown = set(mark.kwargs) - set(params)
            assert not unknown, f"{item.nodeid}: gpu_fp32_only names no parameter {sorted(unknown)}"
            if any(params[name] not in values for name, values in mark.kwargs.items()):
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def assert_close_to_ref(ours, torch_same_dtype, ref, *, eps: float, what: str = "output", floor_rms: float = 1e-3):
    """err(ours) ≤ 2·err(torch in the same dtype) + eps, both measured against the float64 ref
    (``rel_err``: relative, or absolute where the ref's RMS is below ``floor_rms``)."""
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    e_ours, e_torch = rel_err(ours, ref, floor_rms), rel_err(torch_same_dtype, ref, floor_rms)
    assert e_ours <= 2 * e_torch + eps, f"{what}: rel err {e_ours:.3e} > 2·{e_torch:.3e} + {eps:.0e}"


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """Every test starts from the same global RNG state, so values drawn without a generator do not
    depend on which tests ran before it in its worker: a failure reproduces when the test runs alone."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """GPU runs use a dozen pytest workers on one GPU: give each test's cached blocks back, so a
    worker's float64 references do not hold memory another worker's test needs."""
    yield
    if ON_GPU:
        torch.cuda.empty_cache()


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def gluon_backward_calls(monkeypatch):
    """A list that grows by one at each call of the Gluon backward (``attention_backward_gluon``,
    still run): a test's "the fast path was taken" check. The backward decisions start empty and
    those bound to the counting wrapper end with the test."""
    from flashattn_lite.ops import attention_bwd, attention_bwd_gluon
    calls = []
    real = attention_bwd_gluon.attention_backward_gluon
    monkeypatch.setattr(attention_bwd_gluon, "attention_backward_gluon",
                        lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    return calls


@pytest.fixture
def torch_cpu_path(monkeypatch):
    """Run ops through their PyTorch CPU twins instead of the interpreted Triton kernels."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def run_cli(argv, capsys):
    """The CLI's main(argv) → (exit status, stdout, stderr); argparse's SystemExit becomes a status."""
    from flashattn_lite import cli
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


_TIMES = os.environ.get("FLASHATTN_LITE_TEST_TIMES")


def pytest_runtest_logreport(report):
    """With FLASHATTN_LITE_TEST_TIMES=path, append 'seconds phase outcome nodeid' as each test ends (a
    GPU run cut by its timeout still says where the time went; xdist workers append alike)."""
    if not _TIMES or (report.when != "call" and report.outcome == "passed"):
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller receives every worker's report too
        return
    with open(_TIMES, "a") as f:
        f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")
