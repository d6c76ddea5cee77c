"""The Hopper forward (TMA descriptors, ops/attention_fwd_hopper.py): against the float64 reference
and the portable kernel, on the same inputs, plain and with the score variants (softcap, ALiBi,
sinks, sliding window), and how ``attention()`` dispatches to it.

On the CPU the Triton interpreter runs the kernel (tensor descriptors included) in fp16/fp32 at
tiny shapes; on an sm_90 GPU, fp16/bf16 at up to 4097 tokens at the
default config, and every config of the benchmark's sweep once on partial tiles. Elsewhere
(another GPU, or a triton without descriptors) the module is skipped.
"""
import functools

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_close_to_ref
from flashattn_lite._runtime import interpreter_active
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops import attention_fwd
from flashattn_lite.ops.attention import _variant
from flashattn_lite.ops.attention_fwd import PLAIN, attention_forward
from flashattn_lite.reference import attention_reference, window_mask

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9
EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}


def cannot_run(what: str, tiny_call) -> str | None:
    """Why this machine cannot run ``what`` (a Hopper kernel, in words), or None; ``tiny_call()``
    runs it once on tiny CPU tensors to see whether the interpreter can (the backward's tests too)."""
    if not hopper._HAS_TMA:
        return "this triton has no tensor descriptors"
    if ON_GPU:
        return None if ON_HOPPER else f"{what} needs an sm_90 GPU"
    if not interpreter_active():
        return "CPU without TRITON_INTERPRET=1"
    try:  # the interpreter must run descriptor loads/stores (triton 3.9 does; 3.6's fails on numpy 2.4)
        tiny_call()
    except Exception as e:  # noqa: BLE001 - any failure here means: skip, saying why
        return f"the Triton interpreter cannot run {what} here ({type(e).__name__}: {e})"
    return None


@functools.lru_cache(maxsize=None)
def _cannot_run() -> str | None:
    """Why this machine cannot run the kernel, or None."""
    def tiny_call():
        q = torch.zeros(1, 1, 1, 64, dtype=torch.float16)
        hopper.attention_forward_hopper(q, q, q, 1.0, False)
    return cannot_run("the Hopper kernel", tiny_call)


pytestmark = pytest.mark.skipif(_cannot_run() is not None, reason=str(_cannot_run()))

# (B, Hq, Hkv, Nq, Nk, D): lengths 1, 17, 100 (partial tiles), Nq ≠ Nk both ways (Nq > Nk under
# causal leaves rows with no key), GQA 2:1 and 4:1. COMMON_*: shared with the backward's tests.
COMMON_CPU_SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (1, 2, 1, 17, 17, 64),
    (2, 4, 2, 17, 100, 64),
    (1, 2, 1, 100, 17, 64),
    (1, 2, 2, 1, 100, 128),
]
COMMON_GPU_SHAPES = [
    (1, 2, 2, 1, 1, 64),
    (2, 4, 1, 17, 17, 64),
    (2, 8, 2, 1000, 1000, 64),
    (1, 4, 4, 4097, 4097, 64),
    (1, 4, 1, 1000, 4097, 64),
    (1, 2, 2, 4097, 1000, 64),
    (1, 4, 2, 1, 4097, 64),
]


def shapes(cpu_extra, gpu_extra):
    """The shapes to run here: the common ones plus these; on the GPU each at d 64 and at d 128."""
    if not ON_GPU:
        return COMMON_CPU_SHAPES + cpu_extra
    return [s for base in COMMON_GPU_SHAPES + gpu_extra for s in (base, base[:5] + (128,))]


SHAPES = shapes([(1, 4, 1, 64, 100, 128)], [(1, 4, 2, 17, 1000, 64)])
DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16, torch.float32]
# On the GPU the default config for the shape (the sweep test and the benchmark run the others).
CONFIGS = [None] if ON_GPU else [hopper.INTERPRETER_CONFIG]


def shape_id(s):
    b, hq, hkv, nq, nk, d = s
    return f"b{b}-h{hq}:{hkv}-q{nq}-k{nk}-d{d}"


def config_id(c):
    return "default" if c is None else c.name


def make_qkv(shape, dtype, *, layout="bhnd", seed=0, with_do=False):
    """q, k, v (and with ``with_do`` a dO like q, drawn after them), each (B, H, N, D)."""
    b, hq, hkv, nq, nk, d = shape
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(heads, n):
        if layout == "bnhd":  # (B, N, H, D) storage seen as (B, H, N, D): strided heads and rows
            return torch.randn(b, n, heads, d, generator=g).to(DEVICE, dtype).transpose(1, 2)
        return torch.randn(b, heads, n, d, generator=g).to(DEVICE, dtype)

    qkv = rand(hq, nq), rand(hkv, nk), rand(hkv, nk)
    return qkv + (rand(hq, nq),) if with_do else qkv


def portable(q, k, v, causal, variant=PLAIN):
    with hopper.disabled():  # large calls would take the Hopper kernel itself
        return attention_forward(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal,
                                 causal_offset=k.shape[2] - q.shape[2], mask=None, dropout_p=0.0, seed=0,
                                 variant=variant)


def check_lse(lse, lse_ref, dtype):
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[~finite] == float("-inf")).all()
    assert torch.allclose(lse.double()[finite], lse_ref[finite], atol=1e-3 if dtype == torch.float32 else 2e-2)


def check_against_reference(o, lse, q, k, v, causal):
    """A Hopper kernel's (o, lse) for q, k, v: layout, the float64 reference's o and lse within the
    dtype's tolerance, rows with no visible key o = 0 exactly (never NaN). Returns o_ref."""
    dtype = q.dtype
    assert o.shape == q.shape and o.dtype == dtype and o.stride() == torch.empty_like(q).stride()  # q's layout
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    check_lse(lse, lse_ref, dtype)
    assert (o[~torch.isfinite(lse_ref)] == 0).all()
    return o_ref


def check_forward(shape, dtype, causal, config):
    q, k, v = make_qkv(shape, dtype)
    assert not ON_GPU or hopper.supported(q, k, v, causal=causal) is None
    o, lse = hopper.attention_forward_hopper(q, k, v, q.shape[-1] ** -0.5, causal, config=config)
    o_ref = check_against_reference(o, lse, q, k, v, causal)

    o_port, lse_port = portable(q, k, v, causal)
    assert_close_to_ref(o, o_port, o_ref, eps=EPS[dtype], what="output vs the portable kernel's error")
    check_lse(lse, lse_port.double(), dtype)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_reference_and_portable(shape, dtype, causal, config):
    check_forward(shape, dtype, causal, config)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter runs one config (the test above)")
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in hopper.HEAD_DIMS for c in hopper.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, hopper.Config) else f"d{x}")
def test_every_swept_config_on_partial_tiles(head_dim, config):
    # The benchmark checks each config at lengths that are whole tiles; here the tails and the
    # bottom-right diagonal (Nq < Nk, neither a tile multiple), GQA 2:1.
    check_forward((1, 4, 2, 1000, 1037, head_dim), torch.float16, True, config)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_heads_read_in_place(causal):
    # (B, N, H, D) storage, as HuggingFace models hand it over: the descriptors take the strides.
    shape = (2, 4, 2, 100, 37, 64) if not ON_GPU else (2, 8, 2, 1000, 777, 128)
    dtype = torch.float16
    q, k, v = make_qkv(shape, dtype, layout="bnhd")
    assert not q.is_contiguous()
    config = None if ON_GPU else hopper.INTERPRETER_CONFIG
    o, lse = hopper.attention_forward_hopper(q, k, v, 0.125, causal, config=config)
    oc, lsec = hopper.attention_forward_hopper(q.contiguous(), k.contiguous(), v.contiguous(), 0.125, causal,
                                               config=config)
    assert torch.equal(o, oc) and torch.equal(lse, lsec)


# ---------------------------------------------------------------- the score variants

# (name, causal, options): each option alone and together; sinks / alibi are drawn per shape by
# ``variant_options``, windows (in keys) spread over a few tiles on the GPU's longer shapes.
VARIANT_CASES = [
    ("softcap", False, dict(softcap=2.5)),
    ("softcap-causal", True, dict(softcap=30.0)),
    ("alibi-h-causal", True, dict(alibi="h")),
    ("alibi-bh", False, dict(alibi="bh")),
    ("sinks", False, dict(sinks=True)),
    ("sinks-causal", True, dict(sinks=True)),
    ("window-both", False, dict(window=(4, 3))),
    ("window-left-causal", True, dict(window=(5, None))),
    ("window-right-only", False, dict(window=(-1, 2))),
    ("window-0-0", False, dict(window=(0, 0))),
    ("all-causal", True, dict(window=(7, None), softcap=4.0, sinks=True, alibi="bh")),
    ("all", False, dict(window=(6, 2), softcap=4.0, sinks=True, alibi="h")),
]
# Lengths 1, 17, 40 against 17/40/23 keys (partial tiles both ways, Nq ≠ Nk both ways: rows with
# no visible key under causal and narrow windows), GQA 2:1 and 4:1.
# On the GPU each at d 64 and d 128, windows ×37 from 100 tokens up (``variant_options``).
VARIANT_SHAPES = [(1, 2, 1, 1, 17, 64), (1, 2, 1, 17, 17, 64), (2, 4, 2, 17, 40, 64), (1, 4, 1, 40, 23, 128)]
if ON_GPU:
    VARIANT_SHAPES = [s for base in [(1, 2, 2, 1, 1, 64), (2, 4, 1, 17, 17, 64), (2, 8, 2, 1000, 1000, 64),
                                     (1, 4, 1, 257, 4097, 64), (1, 4, 4, 1000, 300, 64)]
                      for s in (base, base[:5] + (128,))]
# fp16 only on the CPU: the Hopper kernel takes 16-bit inputs, and the interpreter's bf16 tl.dot is wrong.
VARIANT_DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]


def variant_options(opts, shape, seed=0):
    """attention()'s keyword arguments for a case: sinks (Hq,) and slopes (Hq,) or (B, Hq) drawn
    here, windows widened ×37 on shapes of 100 keys or more."""
    b, hq, nq = shape[0], shape[1], shape[3]
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, value in opts.items():
        if name == "window" and nq >= 100:
            value = tuple(w if w is None or w < 0 else w * 37 for w in value)
        if name == "sinks":
            value = (torch.randn(hq, generator=g) * 2).to(DEVICE, torch.float32)
        if name == "alibi":
            name, value = "alibi_slopes", (torch.rand((hq,) if value == "h" else (b, hq), generator=g) * 0.3).to(DEVICE)
        out[name] = value
    return out


def as_variant(q, k, options):
    """The ``Variant`` attention() builds from these options."""
    return _variant(q, k, window=options.get("window"), softcap=options.get("softcap"),
                    sinks=options.get("sinks"), alibi_slopes=options.get("alibi_slopes"))


def hidden_rows(q, k, causal, options):
    """(B, Hq, Nq) bool: rows that see no key (causal with Nq > Nk, a narrow window)."""
    nq, nk = q.shape[2], k.shape[2]
    left, right = ((None if w is None or w < 0 else w) for w in options.get("window", (None, None)))
    if causal:
        right = 0 if right is None else min(right, 0)
    return (~window_mask(nq, nk, nk - nq, left, right, q.device).any(1)).expand(q.shape[:3])


def check_variant(shape, dtype, causal, opts, config):
    q, k, v = make_qkv(shape, dtype)
    options = variant_options(opts, shape)
    variant = as_variant(q, k, options)
    assert not ON_GPU or hopper.supported(q, k, v, causal=causal, variant=variant) is None
    o, lse = hopper.attention_forward_hopper(q, k, v, q.shape[-1] ** -0.5, causal, variant=variant, config=config)
    assert o.shape == q.shape and o.dtype == dtype and o.stride() == torch.empty_like(q).stride()  # q's layout
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()

    o_ref, lse_ref = attention_reference(q, k, v, causal=causal, **options)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dtype, **options)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    check_lse(lse, lse_ref, dtype)  # with sinks a hidden row's lse is the sink's logit, finite
    hidden = hidden_rows(q, k, causal, options)
    assert (o[hidden] == 0).all()
    if "sinks" in options:
        sink = options["sinks"].view(1, -1, 1).expand_as(lse)
        assert torch.allclose(lse[hidden], sink[hidden])

    # The portable forward: same o, and the lse its backward expects (sink term included).
    o_port, lse_port = portable(q, k, v, causal, variant)
    assert_close_to_ref(o, o_port, o_ref, eps=EPS[dtype], what="output vs the portable kernel's error")
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_port))
    finite = torch.isfinite(lse_port)
    assert torch.allclose(lse[finite], lse_port[finite], atol=2e-3 if ON_GPU else 1e-4)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", VARIANT_DTYPES, ids=str)
def test_variants_match_reference_and_portable(shape, dtype, case, config):
    _, causal, opts = case
    check_variant(shape, dtype, causal, opts, config)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter runs one config (the test above)")
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in hopper.HEAD_DIMS for c in hopper.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, hopper.Config) else f"d{x}")
def test_every_swept_config_with_every_option(head_dim, config):
    # Every option at once, through each config of the sweep: window edges on both sides of the
    # diagonal, partial tiles, GQA 2:1.
    check_variant((1, 4, 2, 1000, 1037, head_dim), torch.float16, True, dict(window=(3, None), softcap=4.0,
                                                                               sinks=True, alibi="bh"), config)
    check_variant((1, 4, 2, 1000, 1037, head_dim), torch.bfloat16, False, dict(window=(3, 1), softcap=4.0,
                                                                                 sinks=True, alibi="h"), config)


def test_variant_reasons():
    # What the forward's kernel takes in ``variant`` and what it leaves to the portable kernel;
    # the backward's rules (``variants=False``) still take plain attention only.
    q = torch.zeros(2, 4, 8, 64, dtype=torch.float16, device=DEVICE)
    k = torch.zeros(2, 2, 8, 64, dtype=torch.float16, device=DEVICE)
    reason = functools.partial(hopper._reason_for_options, q, k)
    sinks = torch.zeros(4, device=DEVICE)
    slopes = torch.zeros(2, 4, device=DEVICE)
    every = as_variant(q, k, dict(window=(3, 0), softcap=5.0, sinks=sinks, alibi_slopes=slopes))
    for variant in (every, as_variant(q, k, dict(window=(None, 2))), as_variant(q, k, dict(alibi_slopes=slopes[0])),
                    as_variant(q, k, dict(sinks=sinks.double()))):
        assert reason(dict(variant=variant, causal=True, scale=0.1), variants=True) is None
        assert reason(dict(variant=variant)) is not None  # the backward's rules
    assert reason(dict(variant=PLAIN), variants=True) is None and reason(dict(variant=PLAIN)) is None
    assert "ranges" in reason(dict(variant=every._replace(seq=attention_fwd.SEQ_RANGES)), variants=True)
    assert "varlen" in reason(dict(variant=every._replace(seq=attention_fwd.SEQ_VARLEN)), variants=True)
    assert "alibi" in reason(dict(variant=every._replace(alibi=slopes[:1])), variants=True)
    assert "alibi" in reason(dict(variant=every._replace(alibi=slopes.half())), variants=True)
    assert "sinks" in reason(dict(variant=every._replace(sinks=torch.zeros(4, 2, device=DEVICE)[:, 0])),
                             variants=True)
    assert "sinks" in reason(dict(variant=every._replace(sinks=sinks[:3])), variants=True)
    assert "window" in reason(dict(variant=every._replace(left=-2)), variants=True)
    assert "softcap" in reason(dict(variant=every._replace(softcap=float("inf"))), variants=True)
    assert "Variant" in reason(dict(variant=(3, 0)), variants=True)
    for name, value in (("window", (3, 0)), ("softcap", 2.0), ("sinks", sinks), ("alibi_slopes", slopes)):
        assert "variant=" in reason({name: value}, variants=True)  # by name: not the kernel's currency
        assert name in reason({name: value})
    assert "mask" in reason(dict(mask=torch.ones(1, 1, 8, 8, dtype=torch.bool)), variants=True)
    assert "dropout" in reason(dict(dropout_p=0.1, variant=every), variants=True)
    assert "causal_offset" in reason(dict(causal_offset=3, variant=every), variants=True)
    # The offset places the diagonal, a window and ALiBi's distances: where none is, it changes
    # nothing and the kernel (bottom-right) takes the call.
    capped = as_variant(q, k, dict(softcap=5.0, sinks=sinks))
    assert reason(dict(causal_offset=3)) is None and reason(dict(causal_offset=-7, causal=False)) is None
    assert reason(dict(causal_offset=3, variant=capped), variants=True) is None
    assert "causal_offset" in reason(dict(causal_offset=3, causal=True))
    assert "causal_offset" in reason(dict(causal_offset=3, variant=capped, causal=True), variants=True)
    for banded in (dict(alibi_slopes=slopes[0]), dict(window=(3, None)), dict(window=(None, 0))):
        assert "causal_offset" in reason(dict(causal_offset=3, variant=as_variant(q, k, banded)), variants=True)


@pytest.fixture
def hopper_dispatch(monkeypatch):
    """attention() as on an sm_90 GPU with the tested triton, at any size: CPU tensors pass the
    device check, and the Hopper kernel runs in the interpreter. The cache of decisions starts and
    ends empty."""
    import triton
    monkeypatch.setattr(hopper, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(hopper, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(hopper, "MIN_WORK", 0)
    monkeypatch.delenv("FLASHATTN_LITE_HOPPER", raising=False)
    attention_fwd._HOPPER.clear()
    yield
    attention_fwd._HOPPER.clear()


DISPATCH_SHAPE = (1, 4, 2, 17, 23, 64)


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors in the interpreter")
@pytest.mark.parametrize("case", [("plain", False, {})] + VARIANT_CASES[::2] + VARIANT_CASES[-1:],
                         ids=lambda c: c[0])
def test_attention_dispatches_variants_to_it(hopper_dispatch, case):
    from flashattn_lite import attention, explain
    _, causal, opts = case
    q, k, v = make_qkv(DISPATCH_SHAPE, torch.float16)
    options = variant_options(opts, DISPATCH_SHAPE)
    e = explain(q, k, v, causal=causal, **options)
    assert e.path == "hopper" and e.kernels == ()  # no portable launch
    assert e.reason.startswith("attention forward: ")
    assert e.reason.endswith(hopper.path_note(as_variant(q, k, options)))
    named = {"softcap": "softcap", "alibi_slopes": "ALiBi", "sinks": "sinks", "window": "sliding window"}
    assert all(named[name] in e.reason for name in options) and ("plain" in e.reason) == (not options)
    o, lse = attention(q, k, v, causal=causal, return_lse=True, **options)
    o_hop, lse_hop = hopper.attention_forward_hopper(q, k, v, q.shape[-1] ** -0.5, causal,
                                                     variant=as_variant(q, k, options))
    assert torch.equal(o, o_hop) and torch.equal(lse, lse_hop)
    with hopper.disabled():
        assert explain(q, k, v, causal=causal, **options).path == "interpreter"


def paths_taken(q, k, v, **options):
    """(dispatch notes, kernel launches) of ``attention_core(q, k, v, **options)``."""
    from flashattn_lite import _launcher, _log
    from flashattn_lite.ops.attention import attention_core
    with _log.recording() as notes, _launcher.recording() as launches:
        attention_core(q, k, v, **options)
    return [n[0] for n in notes], [launch.kernel for launch in launches]


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors in the interpreter")
@pytest.mark.parametrize("what", ["attn_mask", "dropout", "ranges", "dv", "causal_offset", "head_dim", "fp32",
                                  "misaligned"])
def test_attention_leaves_the_rest_to_the_portable_kernel(hopper_dispatch, what):
    # Each with options the kernel takes (softcap, sinks, causal), so the call would otherwise go to it.
    q, k, v = make_qkv(DISPATCH_SHAPE, torch.float16)
    b, hq, hkv, nq, nk, d = DISPATCH_SHAPE
    options = dict(causal=True, **variant_options(dict(softcap=5.0, sinks=True), DISPATCH_SHAPE))
    assert paths_taken(q, k, v, **options) == (["hopper"], [])
    if what == "attn_mask":
        options["attn_mask"] = torch.rand(1, 1, nq, nk) > 0.2
    elif what == "dropout":
        options["dropout_p"] = 0.1
    elif what == "ranges":
        options["q_ranges"] = torch.tensor([[0, nq]], dtype=torch.int32)
        options["k_ranges"] = torch.tensor([[0, nk - 3]], dtype=torch.int32)
    elif what == "dv":
        v = v[..., :32]
    elif what == "causal_offset":
        options["causal_offset"] = 2
    elif what == "head_dim":
        q, k, v = q[..., :32], k[..., :32], v[..., :32]
    elif what == "fp32":
        q, k, v = q.float(), k.float(), v.float()
    elif what == "misaligned":  # 2 bytes past a 16-byte boundary: checked per call, not per signature
        q = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view_as(q).copy_(q)
    assert paths_taken(q, k, v, **options) == ([], ["_attn_fwd_kernel"])


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors in the interpreter")
def test_backward_after_the_hopper_forward(hopper_dispatch):
    # The portable backward works from the Hopper forward's (o, lse): the sinks' gradient reads
    # the lse, sink term included. Every option, causal, GQA, Nq ≠ Nk.
    from flashattn_lite import attention, explain
    shape = (1, 4, 2, 17, 23, 64)
    q, k, v = make_qkv(shape, torch.float16)
    options = variant_options(dict(window=(7, None), softcap=4.0, sinks=True, alibi="bh"), shape)
    sinks = options["sinks"].requires_grad_()
    e = explain(*(t.requires_grad_() for t in (q, k, v)), causal=True, **options)
    assert e.path == "hopper" and "_attn_fwd_kernel" not in str(e)
    assert e.forward[0] == "hopper" and e.backward[0] == "interpreter"  # explain() says each direction's

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)] + [sinks]
        o = attention(*leaves[:3], causal=True, **{**options, "sinks": sinks})
        return torch.autograd.grad(o.float().square().sum(), leaves)
    ours = grads()
    with hopper.disabled():
        theirs = grads()
    for g, gp in zip(ours, theirs):
        assert (g.float() - gp.float()).norm() <= 1e-3 * gp.float().norm() + 1e-6


def test_supported_reasons():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16, device=DEVICE)
    if not ON_GPU:
        assert "CUDA" in hopper.supported(q, q, q, causal=True)
        return
    kv = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device=DEVICE)
    assert hopper.supported(q, kv, kv, causal=True, scale=0.1, causal_offset=0) is None
    assert hopper.supported(q, kv, kv, need_lse=False) is None
    assert "head dim" in hopper.supported(q[..., :48], kv[..., :48], kv[..., :48])
    assert "dtype" in hopper.supported(q.float(), kv.float(), kv.float())
    assert "window" in hopper.supported(q, kv, kv, window=(4, 0))  # by name: pass variant=
    window = as_variant(q, kv, dict(window=(4, 0), softcap=3.0))
    assert hopper.supported(q, kv, kv, causal=True, variant=window) is None
    assert "ranges" in hopper.supported(q, kv, kv, variant=window._replace(seq=attention_fwd.SEQ_RANGES))
    assert "causal_offset" in hopper.supported(q, kv, kv, causal=True, causal_offset=3)
    assert "scale" in hopper.supported(q, kv, kv, scale=-1.0)
    assert "dropout" in hopper.supported(q, kv, kv, dropout_p=0.1)
    assert "not handled" in hopper.supported(q, kv, kv, frobnicate=True)
    odd = torch.zeros(1, 2, 8, 68, dtype=torch.float16, device=DEVICE)[..., :64]  # rows 136 B apart
    assert "aligned" in hopper.supported(odd, kv, kv)
    assert "strided" in hopper.supported(q.transpose(2, 3).contiguous().transpose(2, 3), kv, kv)
    assert "broadcast" in hopper.supported(q, kv.expand(1, 2, 8, 64), kv.expand(1, 2, 8, 64))
    big = torch.empty(1, 1, 2 ** 31 // 64, 64, dtype=torch.float16, device=DEVICE)  # 4 GiB, never written
    assert "2³¹" in hopper.supported(big, kv[:, :, :1], kv[:, :, :1])


GPU_DISPATCH_CASES = [("plain", False, {}), ("plain-causal", True, {})] + [
    c for c in VARIANT_CASES if c[0] in ("softcap", "alibi-h-causal", "sinks-causal", "window-left-causal", "all")]


@pytest.mark.skipif(not ON_HOPPER, reason="dispatch to the Hopper kernel happens on sm_90 only")
@pytest.mark.parametrize("case", GPU_DISPATCH_CASES, ids=lambda c: c[0])
def test_attention_dispatches_large_calls_to_it(case):
    # Large enough to pass MIN_WORK (8·2048·2048·128 = 2³²): attention() takes the TMA kernel on
    # the triton it was verified with, plain or with the variants, and gives what the portable
    # kernel gives; with FLASHATTN_LITE_HOPPER=0 it takes the portable kernel; the (portable)
    # backward works from either (the sinks' gradient too).
    import triton

    from flashattn_lite import attention, explain
    _, causal, opts = case
    shape = (1, 8, 2, 2048, 2048, 128)
    q, k, v = (t.requires_grad_() for t in make_qkv(shape, torch.bfloat16))
    options = variant_options(opts, shape)
    leaves = [q, k, v] + ([options["sinks"].requires_grad_()] if "sinks" in options else [])
    attention_fwd._HOPPER.clear()
    tested = triton.__version__.startswith(hopper.TESTED_TRITON)
    e = explain(q, k, v, causal=causal, backward=False, **options)  # the forward's path
    assert (e.path == "hopper") == tested
    # Calls the Gluon kernel covers go there (tests/test_attention_gluon*.py), the rest here.
    variant = as_variant(q, k, options)
    gluon = gluon_fwd.fast_path(q, k, v, causal, 0, 128 ** -0.5, variant)
    note = gluon_fwd.path_note(variant) if gluon else hopper.path_note(variant)
    assert not tested or e.reason == "attention forward: " + note
    o = attention(q, k, v, causal=causal, **options)
    grads = torch.autograd.grad(o.float().square().sum(), leaves)
    with hopper.disabled():
        assert explain(q, k, v, causal=causal, backward=False, **options).path == "triton"
        o_port = attention(q, k, v, causal=causal, **options)
        grads_port = torch.autograd.grad(o_port.float().square().sum(), leaves)
    detached = [t.detach() for t in (q, k, v)]
    ref_options = {name: t.detach() if isinstance(t, torch.Tensor) else t for name, t in options.items()}
    o_ref, _ = attention_reference(*detached, causal=causal, **ref_options)
    o_same, _ = attention_reference(*detached, causal=causal, dtype=torch.bfloat16, **ref_options)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[torch.bfloat16])
    assert_close_to_ref(o, o_port, o_ref, eps=EPS[torch.bfloat16], what="vs the portable kernel")
    for g, gp in zip(grads, grads_port):
        assert (g.float() - gp.float()).norm() <= 2e-2 * gp.float().norm()


def test_the_switch_takes_0_or_1_only(monkeypatch):
    for value, on in (("1", True), ("0", False), ("", True)):
        monkeypatch.setenv("FLASHATTN_LITE_HOPPER", value)
        assert hopper.enabled() is on
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "off")
    with pytest.raises(ValueError, match="FLASHATTN_LITE_HOPPER"):
        hopper.enabled()
    with hopper.disabled():
        assert not hopper.enabled()
