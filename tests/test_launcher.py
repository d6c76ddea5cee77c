"""The fast launch path's cache: which calls reuse a compiled kernel and with which arguments.

The real path needs a GPU (it runs in every GPU test); these tests drive ``Launcher`` with a fake
kernel so the key logic is checked on CPU: a launch may skip Triton's own path only when
everything Triton specializes on is unchanged."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flashattn_lite import _launcher


class _Param:
    def __init__(self, num, name, constexpr=False, default=None, has_default=False):
        self.num, self.name, self.is_constexpr = num, name, constexpr
        self.default, self.has_default = default, has_default


class _Compiled:
    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "fn", "meta"

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, metadata, enter, exit_, *args):
        self.log.append(("fast", (g0, g1, g2), args))


class _FakeJit:
    """A kernel (x, n, scale, BLOCK: constexpr, FLAG: constexpr = True) compiled on first sight."""

    def __init__(self):
        self.params = [_Param(0, "x"), _Param(1, "n"), _Param(2, "scale"), _Param(3, "BLOCK", True),
                       _Param(4, "FLAG", True, True, True)]
        self.arg_names = [p.name for p in self.params]
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("slow", args, kwargs))
            return _Compiled(self.log)
        return run


def fake_fast_path(monkeypatch):
    """The fast launch path as on a GPU, with no GPU: stream 0, device 0, default Triton knobs."""
    monkeypatch.setattr(_launcher, "fast_launch_enabled", lambda: True)
    monkeypatch.setattr(_launcher, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_launcher, "_current_device", lambda: 0)
    monkeypatch.setattr(_launcher, "_knobs", SimpleNamespace(
        runtime=SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None, debug=False),
        compilation=SimpleNamespace(instrumentation_mode="")))


@pytest.fixture
def fake(monkeypatch):
    fake_fast_path(monkeypatch)
    jit = _FakeJit()
    return jit, _launcher.Launcher(jit, tune_key=["n", "BLOCK"])  # BLOCK: a constexpr key argument


def test_second_launch_reuses_the_compiled_kernel_with_args_in_signature_order(fake):
    jit, kern = fake
    x = torch.randn(64)
    kern[lambda meta: (meta["BLOCK"] * 2,)](x, 32, 0.5, BLOCK=4)
    kern[lambda meta: (meta["BLOCK"] * 2,)](x, 32, 0.25, BLOCK=4)
    assert [e[0] for e in jit.log] == ["slow", "fast"]
    assert jit.log[1][1] == (8, 1, 1)
    assert jit.log[1][2] == (x, 32, 0.25, 4, True)  # the default of FLAG filled in


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int_is_one", "int_divisibility", "int64", "uint64",
                                    "constexpr", "tune_value"])
def test_a_change_triton_specializes_on_takes_the_slow_path(fake, change):
    jit, kern = fake
    x = torch.randn(64)
    base = dict(x=x, n=2 ** 40 + 32 if change == "uint64" else 32, BLOCK=4)
    kern[(1,)](base["x"], base["n"], 1.0, BLOCK=base["BLOCK"])
    new = dict(base)
    if change == "misaligned":
        new["x"] = x[1:]  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        new["x"] = x.double()
    elif change == "int_is_one":
        new["n"] = 1
    elif change == "int_divisibility":
        new["n"] = 33
    elif change == "int64":
        new["n"] = 2 ** 40
    elif change == "uint64":
        new["n"] = 2 ** 63 + 32
    elif change == "constexpr":
        new["BLOCK"] = 8
    kern[(1,)](new["x"], new["n"] if change != "tune_value" else 48, 1.0, BLOCK=new["BLOCK"])
    assert [e[0] for e in jit.log] == ["slow", "slow"]


def test_constexpr_values_are_keyed_by_type_and_positional_constexprs_take_the_slow_path(fake):
    jit, kern = fake
    x = torch.randn(64)
    kern[(1,)](x, 32, 1.0, BLOCK=4, FLAG=True)
    kern[(1,)](x, 32, 1.0, BLOCK=4, FLAG=1)  # equal to True, but Triton keys str(value)
    kern[(1,)](x, 32, 1.0, 4)
    kern[(1,)](x, 32, 1.0, 4)
    assert [e[0] for e in jit.log] == ["slow", "slow", "slow", "slow"]


def test_a_debug_knob_set_after_warm_up_takes_the_slow_path(fake):
    jit, kern = fake
    x = torch.randn(64)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    _launcher._knobs.runtime.debug = True
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    assert [e[0] for e in jit.log] == ["slow", "slow"]


def test_values_outside_the_specialization_still_hit_the_cache(fake):
    jit, kern = fake
    x = torch.randn(64)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    kern[(1,)](torch.randn(128), 32, 3.0, BLOCK=4)  # another aligned tensor, another float
    assert [e[0] for e in jit.log] == ["slow", "fast"]


def test_the_exact_value_table_is_bounded_and_misaligned_tensors_have_exact_keys_of_their_own(fake, monkeypatch):
    jit, kern = fake
    monkeypatch.setattr(_launcher, "_EXACT_ENTRIES", 2)
    x = torch.randn(64)
    for scale in (1.0, 2.0, 3.0, 4.0):  # one specialization, four exact keys
        kern[(1,)](x, 32, scale, BLOCK=4)
    assert [e[0] for e in jit.log] == ["slow", "fast", "fast", "fast"]
    assert len(kern.exact) <= 2
    kern[(1,)](x[1:], 32, 1.0, BLOCK=4)  # a new specialization (like cu_seqlens[1:]): Triton's path once …
    kern.entries.clear()  # … then the fast path from the exact key alone
    kern[(1,)](x[1:], 32, 1.0, BLOCK=4)
    assert [e[0] for e in jit.log[4:]] == ["slow", "fast"]
    assert jit.log[-1][2][0].data_ptr() == x[1:].data_ptr()
    kern[(1,)](x[1:], 32, 1.0, BLOCK=4)
    kern[(1,)](x, 32, 1.0, BLOCK=4)  # aligned again: not the misaligned entry
    assert [e[0] for e in jit.log[6:]] == ["fast", "slow"]


def test_equal_values_of_different_types_are_different_exact_keys(fake):
    jit, kern = fake
    x = torch.randn(64)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    kern[(1,)](x, 32, 1, BLOCK=4)  # int 1 is specialized as a constant, 1.0 is not
    assert [e[0] for e in jit.log] == ["slow", "fast", "slow"]


def test_a_bound_launch_reuses_grid_scalars_and_tail_with_new_tensors(fake):
    jit, kern = fake
    x = torch.randn(64)
    grid = lambda meta: (meta["BLOCK"] * 3,)
    assert kern.bind(grid, (x, 32, 0.5), dict(BLOCK=4), 1) is None  # nothing compiled yet
    kern[grid](x, 32, 0.5, BLOCK=4)
    launch = kern.bind(grid, (x, 32, 0.5), dict(BLOCK=4), 1)
    y = torch.randn(64)
    assert launch(y) is True
    assert jit.log[-1] == ("fast", (12, 1, 1), (y.data_ptr(), 32, 0.5, 4, True))  # the address, as an int
    assert launch(y[1:]) is False  # not 16-byte aligned: the caller takes the full path
    _launcher._knobs.runtime.debug = True
    assert launch(y) is False
    assert len(jit.log) == 2


def test_a_bound_launch_checked_once_for_several_launches(fake, monkeypatch):
    # ready(): the checks that depend on no tensor (device, recording, hooks, knobs); launch_ready:
    # the alignment and the launch, for a caller making several launches after one check.
    jit, kern = fake
    x = torch.randn(64)
    kern[(2,)](x, 32, 0.5, BLOCK=4)
    launch = kern.bind((2,), (x, 32, 0.5), dict(BLOCK=4), 1)
    y = torch.randn(64)
    assert launch.ready()
    assert launch.launch_ready(7, (y,)) is True and jit.log[-1] == ("fast", (2, 1, 1), (y.data_ptr(), 32, 0.5, 4, True))
    assert launch.launch_ready(7, (y[1:],)) is False
    monkeypatch.setattr(_launcher, "_current_device", lambda: 1)  # another device current
    assert not launch.ready() and launch(y) is False
    monkeypatch.setattr(_launcher, "_current_device", lambda: 0)
    with _launcher.recording():
        assert not launch.ready()
    assert launch.ready()
    assert [e[0] for e in jit.log] == ["slow", "fast"]


def test_the_three_bound_backward_launches_make_one_check_on_one_stream(monkeypatch):
    # attention_bwd's entry of three bound launches: one ready() (one current-device query), then
    # the three on the stream it read; a launch that declines ends the entry (False: the caller
    # redoes the whole backward), and a failed check launches nothing.
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.ops.attention_fwd import PLAIN
    fake_fast_path(monkeypatch)
    checks = []
    monkeypatch.setattr(_launcher, "_current_device", lambda: checks.append(0) or 0)
    monkeypatch.setattr(_launcher, "_raw_stream", lambda device: 7)
    log = []
    knobs = _launcher._knob_state()
    pre, kv, qt = (_launcher.BoundLaunch(0, knobs, None, (i + 1, 1, 1), (), _Compiled(log)) for i in range(3))
    run = attention_bwd._bound_three(pre, kv, qt)
    q, k, v, do, o, dq, dk, dv = (torch.randn(1, 2, 8, 16) for _ in range(8))
    lse = torch.randn(1, 2, 8)
    delta = run(q, k, v, do, o, lse, dq, dk, dv, PLAIN)
    assert isinstance(delta, torch.Tensor) and delta.shape == lse.shape
    assert len(checks) == 1 and [e[1][0] for e in log] == [1, 2, 3]
    assert log[0][2][:4] == tuple(t.data_ptr() for t in (o, do, lse, lse))
    assert log[2][2][4] == dq.data_ptr()
    del log[:], checks[:]
    assert run(q, k, v, do, o, lse, dq[..., 1:], dk, dv, PLAIN) is False  # dq misaligned: dq's launch declines
    assert len(checks) == 1 and [e[1][0] for e in log] == [1, 2]
    del log[:], checks[:]
    with _launcher.recording():  # explain(): nothing launched
        assert run(q, k, v, do, o, lse, dq, dk, dv, PLAIN) is False
    assert len(checks) == 1 and log == []
    # Launches bound under other knobs (never within one call): each makes its own check.
    other = _launcher.BoundLaunch(0, (*knobs[:-1], "hook"), None, (3, 1, 1), (), _Compiled(log))
    assert run(q, k, v, do, o, lse, dq, dk, dv, PLAIN) is not False
    del log[:], checks[:]
    assert attention_bwd._bound_three(pre, kv, other)(q, k, v, do, o, lse, dq, dk, dv, PLAIN) is False
    assert len(checks) == 3 and [e[1][0] for e in log] == [1, 2]


def test_a_bound_launch_of_a_misaligned_tensor_keeps_the_aligned_positions_aligned(monkeypatch):
    # Two tensor positions; the second misaligned at bind (a varlen call's cu_seqlens[1:]): its
    # binary assumes nothing of that address, so any address runs there, while the first position
    # must stay aligned.
    fake_fast_path(monkeypatch)
    jit = _FakeJit()
    jit.params = [_Param(0, "x"), _Param(1, "y"), _Param(2, "n"), _Param(3, "BLOCK", True)]
    jit.arg_names = [p.name for p in jit.params]
    kern = _launcher.Launcher(jit)
    x, cu = torch.randn(64), torch.zeros(64, dtype=torch.int32)
    kern[(1,)](x, cu[1:], 32, BLOCK=4)
    launch = kern.bind((1,), (x, cu[1:], 32), dict(BLOCK=4), 2)
    assert launch is not None
    assert launch(x, cu[1:]) is True and launch(x, cu) is True  # either address in the second position
    assert launch(x[1:], cu[1:]) is False  # the first position was aligned: it must stay so
    assert [e[0] for e in jit.log] == ["slow", "fast", "fast"]
    assert jit.log[1][2][:2] == (x.data_ptr(), cu[1:].data_ptr())
    kern[(1,)](x[1:], cu[1:], 32, BLOCK=4)  # no position aligned: any addresses run
    launch = kern.bind((1,), (x[1:], cu[1:], 32), dict(BLOCK=4), 2)
    assert launch(x, cu) is True and launch(x[3:], cu[1:]) is True


@pytest.mark.parametrize("hook", ["empty_chain", "chain", "function"])
def test_launch_hooks_get_metadata_only_when_one_would_run(fake, hook, monkeypatch):
    jit, kern = fake
    chain = SimpleNamespace(calls=[] if hook == "empty_chain" else [print])  # Triton's HookChain shape
    _launcher._knobs.runtime.launch_enter_hook = print if hook == "function" else chain
    seen = []
    monkeypatch.setattr(_Compiled, "launch_metadata", lambda self, grid, stream, *args: seen.append(grid) or "meta")
    x = torch.randn(64)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    kern[(1,)](x, 32, 1.0, BLOCK=4)
    assert jit.log[1][0] == "fast"
    assert seen == ([] if hook == "empty_chain" else [(1,)])


def _gluon_descriptor(t, block, swizzle=None):
    """A Gluon host TMA descriptor over ``t`` (skips where this Triton has no Gluon)."""
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    gl = pytest.importorskip("triton.experimental.gluon.language")
    dtype = {torch.float16: gl.float16, torch.float32: gl.float32}[t.dtype]
    layout = (gl.NVMMASharedLayout.get_default_for(block, dtype) if swizzle is None else
              gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=dtype.primitive_bitwidth,
                                   rank=len(block)))
    return hopper.TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def test_tma_descriptors_are_keyed_by_dtype_block_and_layout_not_by_shape_or_address(fake):
    jit, kern = fake
    first = _gluon_descriptor(torch.randn(128, 64).half(), [64, 64])
    other = _gluon_descriptor(torch.randn(384, 64).half()[64:], [64, 64])  # another shape and address
    kern[(1,)](first, 32, 1.0, BLOCK=4)
    kern[(1,)](other, 32, 1.0, BLOCK=4)
    assert [e[0] for e in jit.log] == ["slow", "fast"]
    assert jit.log[1][2][0] is other  # Triton's launcher encodes the new descriptor's tensor map
    for changed in (_gluon_descriptor(torch.randn(128, 64).half(), [32, 64]),        # block
                    _gluon_descriptor(torch.randn(128, 64), [64, 64]),               # dtype
                    _gluon_descriptor(torch.randn(128, 64).half(), [64, 64], 64)):   # layout
        kern[(1,)](changed, 32, 1.0, BLOCK=4)
        assert jit.log[-1][0] == "slow"


def test_disabled_launcher_always_takes_triton_path(monkeypatch):
    monkeypatch.setenv("FLASHATTN_LITE_FAST_LAUNCH", "0")
    jit = _FakeJit()
    kern = _launcher.Launcher(jit)
    for _ in range(2):
        kern[(1,)](torch.randn(4), 2, 1.0, BLOCK=4)
    assert [e[0] for e in jit.log] == ["slow", "slow"]


# ---------------------------------------------------------------- on the GPU: the real fast path

def _ops(dev="cuda"):
    """(name, run(seed) → (ours, float64 reference)) for each kernel family; repeated calls with
    fresh data reuse one specialization, so every call after the first takes the fast path."""
    import flashattn_lite as fa
    from flashattn_lite.reference import attention_reference

    def attn(seed, causal=True):
        g = torch.Generator(device=dev).manual_seed(seed)
        q, k, v = (torch.randn(2, 4, 100, 64, device=dev, dtype=torch.float16, generator=g) for _ in range(3))
        return fa.attention(q, k, v, causal=causal), attention_reference(q, k, v, causal=causal)[0]

    def attn_bwd(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        q, k, v = (torch.randn(1, 4, 80, 64, device=dev, dtype=torch.float16, generator=g).requires_grad_()
                   for _ in range(3))
        do = torch.randn(1, 4, 80, 64, device=dev, dtype=torch.float16, generator=g)
        ours = torch.autograd.grad(fa.attention(q, k, v, causal=True), (q, k, v), do)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.autograd.grad(attention_reference(qd, kd, vd, causal=True)[0], (qd, kd, vd), do.double())
        return torch.cat([t.flatten() for t in ours]), torch.cat([t.flatten() for t in ref])

    def softmax(seed, n=5000):
        g = torch.Generator(device=dev).manual_seed(seed)
        x = torch.randn(8, n, device=dev, generator=g)
        return fa.softmax(x), torch.softmax(x.double(), -1)

    def long_softmax(seed):
        return softmax(seed, n=1 << 20)

    def decode(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        q = torch.randn(2, 8, 1, 64, device=dev, dtype=torch.float16, generator=g)
        k, v = (torch.randn(2, 2, 3000, 64, device=dev, dtype=torch.float16, generator=g) for _ in range(2))
        lens = torch.tensor([3000, 1234], device=dev, dtype=torch.int32)
        ref = torch.cat([attention_reference(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])[0]
                         for i, n in enumerate(lens.tolist())])
        return fa.decode(q, k, v, lens, num_splits=4), ref

    return {"attention": attn, "attention_backward": attn_bwd, "softmax": softmax,
            "softmax_split": long_softmax, "decode_split_merge": decode}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled launch path needs a GPU")
@pytest.mark.parametrize("op", ["attention", "attention_backward", "softmax", "softmax_split",
                                "decode_split_merge"])
def test_repeated_calls_on_the_fast_path_match_the_reference(op):
    run = _ops()[op]
    for seed in range(4):
        ours, ref = run(seed)
        err = ((ours.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-3, f"call {seed}: rel err {err:.2e}"


def test_the_key_separates_whatever_the_installed_triton_specializes_apart():
    """Our per-argument key is at least as fine as Triton's own specialization (checked against
    the installed Triton's specializer where it exposes one)."""
    specialize = pytest.importorskip("triton._C.libtriton").__dict__.get("native_specialize_impl")
    if specialize is None:
        pytest.skip("this Triton has no native specializer to compare with")
    from triton.backends.compiler import BaseBackend
    base = torch.empty(64)
    values = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, 2 ** 40, 2 ** 63, 2 ** 63 + 16,
              True, False, 0.5, 1.0, None, base, base[1:], base[4:], base.half(), base.double()]
    try:
        values += [_gluon_descriptor(t, block, swizzle) for t in (base.half().view(8, 8), base.view(8, 8),
                                                                  torch.empty(16, 8).half())
                   for block in ([8, 8], [4, 8]) for swizzle in (None, 0)]
    except pytest.skip.Exception:  # no Gluon in this Triton: plain arguments only
        pass
    for a in values:
        for b in values:
            theirs = [specialize(BaseBackend, x, False, True, True) for x in (a, b)]
            if str(theirs[0]) != str(theirs[1]):
                assert _launcher._spec(a) != _launcher._spec(b), (a, b, theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled launch path needs a GPU")
def test_a_repeated_small_backward_takes_its_bound_launches():
    # The portable backward binds its three launches after the first plain call of a shape; the
    # next call of that shape launches through them (checked against float64 just above).
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    attention_bwd._BOUND.clear()
    q, k, v = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    for _ in range(2):
        torch.autograd.grad(fa.attention(q, k, v, causal=True), (q, k, v), torch.ones_like(q))
    assert len(attention_bwd._BOUND) == 1


def test_keep_bound_keeps_launches_not_none_and_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(_launcher, "BOUND_ENTRIES", 2)
    table = {}
    _launcher.keep_bound(table, "a", None)  # nothing could be bound: nothing kept
    assert table == {}
    _launcher.keep_bound(table, "a", 1)
    _launcher.keep_bound(table, "b", 2)
    _launcher.keep_bound(table, "c", 3)  # full: the table starts over
    assert table == {"c": 3}


def _counted(table: dict) -> list:
    """Wraps every bound launch in ``table``: the returned list gets, per launch through one,
    whether it ran (not False)."""
    ran = []
    for key, entry in list(table.items()):
        def counted(*args, _entry=entry):
            result = _entry(*args)
            ran.append(result is not False)
            return result
        table[key] = counted
    return ran


def _variant_call(case: str, seed: int, dev="cuda"):
    """(ours, float64 reference) of one forward+backward of ``case``, every output flattened into
    one vector; the sequence bounds change with ``seed``, the shapes and counts do not."""
    import flashattn_lite as fa
    from flashattn_lite.ops.attention import attention_core
    from flashattn_lite.reference import attention_reference, attention_varlen_reference
    g = torch.Generator(device=dev).manual_seed(seed)
    rand = lambda *s: torch.randn(*s, device=dev, dtype=torch.float16, generator=g)  # noqa: E731
    sinks = torch.randn(4, device=dev, generator=g).requires_grad_()
    if case == "varlen-sinks":
        lens = ([20, 30, 16, 30], [40, 8, 24, 24], [1, 50, 5, 40], [33, 33, 29, 1])[seed % 4]
        cu = torch.tensor([0] + lens, device=dev).cumsum(0).to(torch.int32)
        q, k, v = (rand(96, h, 64).requires_grad_() for h in (4, 2, 2))
        leaves, do = (q, k, v, sinks), rand(96, 4, 64)
        run = lambda q, k, v, s, ref: (attention_varlen_reference(q, k, v, cu.cpu(), cu.cpu(), causal=True, sinks=s)[0]  # noqa: E731
                                       if ref else fa.attention_varlen(q, k, v, cu, cu, causal=True, sinks=s))
    elif case == "ranges-window-sinks":
        starts = torch.randint(0, 20, (3,), generator=torch.Generator().manual_seed(seed))
        ranges = torch.stack([starts, starts + 40], 1).to(dev, torch.int32)
        q, k, v = (rand(3, h, 60, 64).requires_grad_() for h in (4, 2, 2))
        leaves, do = (q, k, v, sinks), rand(3, 4, 60, 64)

        def run(q, k, v, s, ref):
            if not ref:
                return attention_core(q, k, v, causal=True, window=(9, 0), sinks=s, q_ranges=ranges, k_ranges=ranges)
            o = torch.zeros_like(q)
            for b, (r0, r1) in enumerate(ranges.tolist()):
                o[b:b + 1, :, r0:r1] = attention_reference(q[b:b + 1, :, r0:r1], k[b:b + 1, :, r0:r1],
                                                           v[b:b + 1, :, r0:r1], causal=True, window=(9, 0),
                                                           sinks=s)[0]
            return o
    else:  # "dense-options": the one-launch backward with every option but sinks
        slopes = torch.rand(4, device=dev, generator=g)
        q, k, v = (rand(2, h, 50, 64).requires_grad_() for h in (4, 2, 2))
        leaves, do = (q, k, v), rand(2, 4, 50, 64)
        options = dict(causal=True, window=(12, 0), softcap=15.0, alibi_slopes=slopes)
        run = lambda q, k, v, ref: (attention_reference(q, k, v, **options)[0] if ref  # noqa: E731
                                    else fa.attention(q, k, v, **options))
    ours_o = run(*leaves, False)
    ours = (ours_o, *torch.autograd.grad(ours_o, leaves, do))
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref_o = run(*ref_leaves, True)
    ref = (ref_o, *torch.autograd.grad(ref_o, ref_leaves, do.double()))
    return [t.flatten() for t in ours], [t.flatten() for t in ref]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled launch path needs a GPU")
@pytest.mark.parametrize("case", ["varlen-sinks", "ranges-window-sinks", "dense-options"])
def test_repeated_variant_calls_take_their_bound_launches_and_match_the_reference(case):
    # The portable forward and backward bind a call's launches after its first call; the next
    # calls, with new values and new sequence bounds, run through them and match float64.
    from flashattn_lite.ops import attention_bwd, attention_fwd, attention_fwd_hopper
    with attention_fwd_hopper.disabled():
        attention_fwd._BOUND.clear()
        attention_bwd._BOUND.clear()
        for seed in range(4):
            if seed == 1:
                ran = _counted(attention_fwd._BOUND), _counted(attention_bwd._BOUND)
            ours, ref = _variant_call(case, seed)
            for name, a, b in zip(("o", "dq", "dk", "dv", "dsinks"), ours, ref):
                err = ((a.double() - b).norm() / b.norm()).item()
                assert err < 3e-3, f"call {seed}, {name}: rel err {err:.2e}"
    assert ran[0] == [True] * 3 and ran[1] == [True] * 3, ran
