"""The Gluon forward's score options (ops/attention_fwd_gluon.py: softcap, ALiBi, sinks; its sliding
windows are tests/test_attention_gluon_window.py's): what it takes and refuses, where ``attention()`` sends each option, and on an
sm_90 GPU its o and lse against the float64 reference and the Triton TMA kernel on the same inputs.

The dispatch tests run anywhere on a faked sm_90 device (CPU tensors; nothing is launched, or the TMA
kernel runs in the interpreter in the Gluon kernel's place). The kernel tests need CUDA sm_90 and the
triton the Gluon kernel is written for (3.6); elsewhere they are skipped.
"""
import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_close_to_ref
from flashattn_lite.ops import attention_fwd
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_RANGES, Variant
from flashattn_lite.reference import attention_reference
from test_attention_hopper import (EPS, _cannot_run as hopper_cannot_run, as_variant, check_lse, hidden_rows,
                                   make_qkv, shape_id, variant_options)
from test_attention_gluon import SHAPES, needs_gpu


faked_device = pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")

# (name, options as test_attention_hopper.variant_options takes them): each option alone, ALiBi
# slopes (Hq,) float32 and (B, Hq) float64, and all three together.
OPTION_SETS = [
    ("softcap", dict(softcap=2.5)),
    ("alibi-h", dict(alibi="h")),
    ("alibi-bh-f64", dict(alibi="bh")),
    ("sinks", dict(sinks=True)),
    ("softcap-sinks", dict(softcap=30.0, sinks=True)),
    ("all", dict(softcap=30.0, sinks=True, alibi="bh")),
]
NAMED = {"softcap": "softcap", "alibi": "ALiBi", "sinks": "sinks"}


def options_for(opts, shape, name=""):
    """attention()'s keyword arguments for an option set (slopes float64 for the "-f64" sets)."""
    options = variant_options(opts, shape)
    if name.endswith("f64"):
        options["alibi_slopes"] = options["alibi_slopes"].double()
    return options


# ---------------------------------------------------------------- what it takes (any machine)

@pytest.fixture
def sm90(monkeypatch):
    """As on an sm_90 GPU with the tested triton, at any size: CPU tensors pass the device check
    (nothing here launches the Gluon kernel). The cache of dispatch decisions starts and ends empty."""
    import triton
    monkeypatch.setattr(hopper, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(hopper, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(hopper, "MIN_WORK", 0)
    monkeypatch.setattr(gluon_fwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_fwd, "_HAS_GLUON", True)
    monkeypatch.delenv("FLASHATTN_LITE_HOPPER", raising=False)
    attention_fwd._HOPPER.clear()
    yield
    attention_fwd._HOPPER.clear()


SHAPE = (2, 4, 2, 17, 23, 64)


@faked_device
@pytest.mark.parametrize("case", OPTION_SETS, ids=lambda c: c[0])
def test_supported_takes_each_option(sm90, case):
    name, opts = case
    q, k, v = make_qkv(SHAPE, torch.float16)
    variant = as_variant(q, k, options_for(opts, SHAPE, name))
    for causal in (False, True):
        assert gluon_fwd.supported(q, k, v, causal=causal, variant=variant) is None
        assert gluon_fwd.supported(q, k, v, causal=causal, causal_offset=6, scale=0.3, variant=variant,
                                   need_lse=False) is None


@faked_device
def test_supported_refuses_the_rest(sm90):
    q, k, v = make_qkv(SHAPE, torch.float16)
    every = as_variant(q, k, options_for(dict(softcap=4.0, sinks=True, alibi="bh"), SHAPE))
    reason = gluon_fwd.supported
    # Windows are taken (tests/test_attention_gluon_window.py), sides out of range are not.
    assert "window" in reason(q, k, v, variant=every._replace(left=-2))
    assert "window" in reason(q, k, v, variant=every._replace(right=2 ** 30))
    assert "ranges" in reason(q, k, v, variant=every._replace(seq=SEQ_RANGES))
    assert "Variant" in reason(q, k, v, variant=(3, 0))
    assert "mask" in reason(q, k, v, variant=every, attn_mask=torch.ones(1, 1, 17, 23, dtype=torch.bool))
    assert "dropout" in reason(q, k, v, variant=every, dropout_p=0.1)
    assert "not handled" in reason(q, k, v, variant=every, frobnicate=True)
    assert "causal_offset" in reason(q, k, v, causal=True, causal_offset=2, variant=every)
    assert "variant=" in reason(q, k, v, softcap=2.0)  # by name: not the kernel's currency
    assert "alibi" in reason(q, k, v, variant=every._replace(alibi=every.alibi.half()))
    assert "sinks" in reason(q, k, v, variant=every._replace(sinks=every.sinks[:3]))
    assert "dtype" in reason(q.float(), k.float(), v.float(), variant=every)


def test_forward_refuses_what_it_does_not_take():
    # Raised before anything is launched, so on any machine.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16, device=DEVICE)
    for variant in (Variant(seq=SEQ_RANGES), Variant(left=4, seq=SEQ_RANGES), (3, 0)):
        with pytest.raises(ValueError, match="variant"):
            gluon_fwd.attention_forward_gluon(q, q, q, 0.125, False, variant=variant)


def test_path_note_names_the_options():
    q = torch.zeros(2, 4, 8, 64)
    every = Variant(softcap=3.0, alibi=torch.zeros(4), sinks=torch.zeros(4))
    assert gluon_fwd.path_note(PLAIN) == gluon_fwd.PATH_NOTE and "plain" in gluon_fwd.PATH_NOTE
    assert "Gluon" in gluon_fwd.path_note(every)
    assert all(word in gluon_fwd.path_note(every) for word in NAMED.values())
    assert "ALiBi" in gluon_fwd.path_note(as_variant(q, q, dict(alibi_slopes=torch.zeros(2, 4))))
    assert "softcap" not in gluon_fwd.path_note(Variant(sinks=torch.zeros(4)))


@faked_device
@pytest.mark.parametrize("case", [("plain", {})] + OPTION_SETS + [("window", dict(window=(5, None))),
                                                                   ("all+window", dict(window=(5, 2), softcap=4.0,
                                                                                       sinks=True, alibi="h"))],
                         ids=lambda c: c[0])
def test_dispatch_under_the_plain_length_rules(sm90, case):
    # Options take the Gluon kernel where plain calls do: non-causal at any length, causal from
    # CAUSAL_MIN_N[d] on, a window counting as causal (tests/test_attention_gluon_window.py); the rest
    # the TMA kernel, explain()'s note naming the options either way.
    name, opts = case
    n_long = gluon_fwd.CAUSAL_MIN_N[64]
    for causal, nq, nk in ((False, 17, 23), (True, 17, 23), (True, 40, n_long), (True, n_long, 40)):
        shape = (1, 2, 1, nq, nk, 64)
        q, k, v = make_qkv(shape, torch.float16)
        variant = as_variant(q, k, options_for(opts, shape, name))
        to_gluon = not (causal or "window" in opts) or max(nq, nk) >= n_long
        assert gluon_fwd.fast_path(q, k, v, causal, nk - nq, 0.125, variant) == to_gluon
        run, note = attention_fwd._hopper_path(q, k, v, causal, nk - nq, 0.125, variant)
        if to_gluon:
            assert run is gluon_fwd.attention_forward_gluon and note == gluon_fwd.path_note(variant)
        else:
            assert run is hopper.attention_forward_hopper and note == hopper.path_note(variant)
        # (A window that cuts no pair is no window: the 2k × 40 call's, scaled to 185 keys.)
        assert all(NAMED[o] in note for o in opts if o in NAMED) and ("plain" in note) == (variant is PLAIN)


@faked_device
def test_dispatch_respects_the_switches(sm90, monkeypatch):
    q, k, v = make_qkv(SHAPE, torch.float16)
    variant = as_variant(q, k, options_for(dict(softcap=4.0, sinks=True), SHAPE))
    assert gluon_fwd.fast_path(q, k, v, False, 6, 0.125, variant)
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")
    assert not gluon_fwd.fast_path(q, k, v, False, 6, 0.125, variant)
    monkeypatch.delenv("FLASHATTN_LITE_HOPPER")
    monkeypatch.setattr(hopper, "MIN_WORK", 2 ** 32)
    assert not gluon_fwd.fast_path(q, k, v, False, 6, 0.125, variant)
    monkeypatch.setattr(hopper, "MIN_WORK", 0)
    monkeypatch.setattr(gluon_fwd, "TESTED_TRITON", ("0.0.",))
    assert not gluon_fwd.fast_path(q, k, v, False, 6, 0.125, variant)


@faked_device
@pytest.mark.parametrize("case", [OPTION_SETS[0], OPTION_SETS[-1]], ids=lambda c: c[0])
def test_attention_hands_the_variant_to_it(sm90, monkeypatch, case):
    # attention() end to end on the faked device: the Gluon entry point is called with the call's
    # Variant (its stand-in runs the TMA kernel in the interpreter: Gluon does not run there), and
    # explain() names the Gluon kernel and the options.
    if hopper_cannot_run() is not None:
        pytest.skip(hopper_cannot_run())
    from flashattn_lite import attention, explain
    calls = []

    def stand_in(q, k, v, scale, causal, *, variant=PLAIN, config=None):
        assert config is None and gluon_fwd._variant_reason(variant) is None
        calls.append(variant)
        return hopper.attention_forward_hopper(q, k, v, scale, causal, variant=variant,
                                               config=hopper.INTERPRETER_CONFIG)
    monkeypatch.setattr(gluon_fwd, "attention_forward_gluon", stand_in)
    name, opts = case
    q, k, v = make_qkv(SHAPE, torch.float16)
    options = options_for(opts, SHAPE, name)
    e = explain(q, k, v, **options)
    assert e.path == "hopper" and e.kernels == ()
    assert e.reason == "attention forward: " + gluon_fwd.path_note(as_variant(q, k, options))
    o, lse = attention(q, k, v, return_lse=True, **options)
    variant = as_variant(q, k, options)
    assert len(calls) == 2 and calls[-1].softcap == variant.softcap and (calls[-1].left, calls[-1].right) == (-1, -1)
    assert calls[-1].sinks is variant.sinks and calls[-1].alibi is variant.alibi
    o_hop, lse_hop = hopper.attention_forward_hopper(q, k, v, 64 ** -0.5, False, variant=variant,
                                                     config=hopper.INTERPRETER_CONFIG)
    assert torch.equal(o, o_hop) and torch.equal(lse, lse_hop)


# ---------------------------------------------------------------- the kernel (sm_90 GPU)

# SHAPES (test_attention_gluon): lengths 1, 17, 1000, 4097, Nq ≠ Nk both ways (Nq > Nk under causal
# leaves rows with no key: o = 0, lse = −inf or the sink), GQA 2:1 and 4:1.
# (d, dtype, causal): each option set meets each shape once and each of these 8 once.
SETTINGS = [(d, dtype, causal) for causal in (True, False) for dtype in (torch.bfloat16, torch.float16)
            for d in (128, 64)]
GRID = [(name, opts, shape + (SETTINGS[(i + j) % 8][0],), *SETTINGS[(i + j) % 8][1:])
        for j, (name, opts) in enumerate(OPTION_SETS) for i, shape in enumerate(SHAPES)]


def check(shape, dtype, causal, name, opts, config=None):
    """The Gluon kernel's (o, lse) with these options: the float64 reference's o and lse within the
    dtype's tolerance, rows with no visible key o = 0 (lse the sink's logit, with sinks), and in bf16
    the TMA kernel's o and lse on the same inputs (the tolerances of tests/test_attention_gluon.py;
    fp16 against the reference only, as there: each (dtype, d, causal, group, options) is one more
    TMA compile)."""
    q, k, v = make_qkv(shape, dtype)
    options = options_for(opts, shape, name)
    variant = as_variant(q, k, options)
    assert gluon_fwd.supported(q, k, v, causal=causal, variant=variant) is None
    scale = q.shape[-1] ** -0.5
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, variant=variant, config=config)
    assert o.shape == q.shape and o.dtype == dtype and o.is_contiguous()
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()

    o_ref, lse_ref = attention_reference(q, k, v, causal=causal, **options)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dtype, **options)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    check_lse(lse, lse_ref, dtype)
    hidden = hidden_rows(q, k, causal, options)
    assert (o[hidden] == 0).all()
    if "sinks" in options:
        sink = options["sinks"].view(1, -1, 1).expand_as(lse)
        assert torch.allclose(lse[hidden], sink[hidden])

    if dtype != torch.bfloat16 or q.shape[-1] not in hopper.HEAD_DIMS:  # the TMA kernel does not take d 256
        return
    o_hop, lse_hop = hopper.attention_forward_hopper(q, k, v, scale, causal, variant=variant)
    assert_close_to_ref(o, o_hop, o_ref, eps=EPS[dtype], what="output vs the TMA kernel's error")
    check_lse(lse, lse_hop.double(), dtype)


@needs_gpu
@pytest.mark.parametrize("name, opts, shape, dtype, causal", GRID,
                         ids=[f"{g[0]}-{shape_id(g[2])}-{str(g[3])[6:]}-{'causal' if g[4] else 'full'}"
                              for g in GRID])
def test_options_match_reference_and_tma(name, opts, shape, dtype, causal):
    check(shape, dtype, causal, name, opts)


@needs_gpu
@pytest.mark.parametrize("name", ["all", "softcap-sinks"])
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in gluon_fwd.HEAD_DIMS for c in gluon_fwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, gluon_fwd.Config) else f"d{x}")
def test_every_config_with_every_option(head_dim, config, name):
    # Every option at once through each config (ALiBi in the d 64 three-consumer ones spills,
    # default_config avoids them, but they compute the same), and softcap with sinks but no ALiBi
    # (the softcap kernels Gemma and gpt-oss-style models take): tails on both sides, the
    # bottom-right diagonal, GQA 2:1.
    check((1, 4, 2, 1000, 1037, head_dim), torch.bfloat16, True, name, dict(OPTION_SETS)[name], config)


GPU_DISPATCH = OPTION_SETS + [("window", dict(window=(8, None)))]  # 296 keys at 2k tokens


@needs_gpu
@pytest.mark.parametrize("case", GPU_DISPATCH, ids=lambda c: c[0])
def test_attention_sends_each_option_to_it(case):
    # A Gluon-size call (non-causal, 2k tokens, MIN_WORK): attention() takes the Gluon kernel with
    # each option (explain() names it and the options) and gives what the kernel called directly
    # gives. A window counts as causal for the length rule: below CAUSAL_MIN_N[d] it takes the TMA
    # kernel (at d 128 that is below 2k, so this one takes the Gluon kernel too).
    from flashattn_lite import attention, explain
    name, opts = case
    shape = (1, 8, 2, 2048, 2048, 128)
    q, k, v = make_qkv(shape, torch.bfloat16)
    options = options_for(opts, shape, name)
    variant = as_variant(q, k, options)
    attention_fwd._HOPPER.clear()
    e = explain(q, k, v, backward=False, **options)
    gluon = "window" not in opts or shape[3] >= gluon_fwd.CAUSAL_MIN_N[shape[5]]
    note = gluon_fwd.path_note(variant) if gluon else hopper.path_note(variant)
    assert e.path == "hopper" and e.reason == "attention forward: " + note
    run = gluon_fwd.attention_forward_gluon if gluon else hopper.attention_forward_hopper
    assert torch.equal(attention(q, k, v, **options), run(q, k, v, 128 ** -0.5, False, variant=variant)[0])


@needs_gpu
def test_causal_long_call_and_its_backward():
    # Causal from CAUSAL_MIN_N on (B 4: MIN_WORK), every option: the Gluon kernel's (o, lse) feed the
    # portable backward (the sinks' gradient reads the lse, sink term included), as the TMA kernel's do.
    from flashattn_lite import attention, explain
    shape = (4, 2, 1, gluon_fwd.CAUSAL_MIN_N[128], gluon_fwd.CAUSAL_MIN_N[128], 128)
    q, k, v = make_qkv(shape, torch.bfloat16)
    options = options_for(OPTION_SETS[-1][1], shape)
    attention_fwd._HOPPER.clear()
    e = explain(q, k, v, causal=True, backward=False, **options)
    assert e.reason == "attention forward: " + gluon_fwd.path_note(as_variant(q, k, options))
    sinks = options.pop("sinks").requires_grad_()

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)] + [sinks]
        o = attention(*leaves[:3], causal=True, sinks=sinks, **options)
        return o, torch.autograd.grad(o.float().square().sum(), leaves)
    o, ours = grads()
    with hopper.disabled():
        o_port, theirs = grads()
    assert (o.float() - o_port.float()).norm() <= 1e-2 * o_port.float().norm()
    for g, gp in zip(ours, theirs):
        assert (g.float() - gp.float()).norm() <= 2e-2 * gp.float().norm()
