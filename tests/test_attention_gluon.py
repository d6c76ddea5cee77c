"""The Gluon forward (ops/attention_fwd_gluon.py, warp-specialized wgmma + TMA): against the float64
reference and the Triton Hopper kernel (ops/attention_fwd_hopper.py) on the same inputs.

GPU only: Gluon kernels do not run in the Triton interpreter, and the kernel is written for triton
3.6's Gluon API on sm_90. Elsewhere the module is skipped (importing the kernel module must still
work, which the first test checks wherever it runs).
"""
import pytest
import torch

from conftest import ON_GPU, assert_close_to_ref
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from test_attention_hopper import EPS, check_against_reference, check_lse, make_qkv, shape_id


def _cannot_run() -> str | None:
    if not ON_GPU:
        return "Gluon kernels need a CUDA GPU (no interpreter)"
    if torch.cuda.get_device_capability()[0] != 9:
        return "the Gluon kernel needs an sm_90 GPU"
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device="cuda")
    return gluon_fwd.supported(q, q, q)


REASON = _cannot_run()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def test_module_imports_and_says_why_not():
    # On any machine: the module imports (Gluon guarded) and supported() answers in words.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    reason = gluon_fwd.supported(q, q, q)
    assert reason is not None and isinstance(reason, str)
    for d, configs in gluon_fwd.CONFIGS.items():
        assert d in gluon_fwd.HEAD_DIMS and configs
        assert gluon_fwd.default_config(d) in configs


def test_causal_length_rule():
    # Causal and window calls below CAUSAL_MIN_N[d] keys or queries take the TMA kernel at d 64 and
    # 128 (non-causal calls never); d 256, which the TMA kernel does not take, has no such floor.
    from flashattn_lite.ops.attention_fwd import PLAIN, Variant
    window = Variant(left=100)
    for d in (64, 128):
        n = gluon_fwd.CAUSAL_MIN_N[d]
        assert gluon_fwd._short(True, PLAIN, n - 1, n - 1, d) and gluon_fwd._short(False, window, 17, n - 1, d)
        assert not gluon_fwd._short(True, PLAIN, 17, n, d) and not gluon_fwd._short(False, PLAIN, 17, 17, d)
    assert not gluon_fwd._short(True, PLAIN, 17, 17, 256) and not gluon_fwd._short(False, window, 17, 17, 256)


def test_padded_head_dims():
    # Head dims the kernel has no tiles for run at the next of HEAD_DIMS above them: multiples of 8
    # (16-byte TMA rows) between 32 and 256; the rest are not covered. They have no TMA-kernel
    # alternative, so no causal length floor, and explain() names the padding.
    from flashattn_lite.ops.attention_fwd import PLAIN
    want = {64: 64, 128: 128, 256: 256, 40: 64, 48: 64, 56: 64, 72: 128, 80: 128, 96: 128, 112: 128,
            136: 256, 160: 256, 192: 256, 248: 256}
    for d, padded in want.items():
        assert gluon_fwd.padded_head_dim(d) == padded
    for d in (1, 8, 16, 24, 32, 36, 60, 100, 257, 264, 512):
        assert gluon_fwd.padded_head_dim(d) is None
    for d in (48, 96, 192):
        assert not gluon_fwd._short(True, PLAIN, 17, 17, d)
    assert "head dim 96 run at 128" in gluon_fwd.path_note(PLAIN, 96)
    assert gluon_fwd.path_note(PLAIN, 128) == gluon_fwd.PATH_NOTE


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_padded_launch_reads_and_stores_the_real_columns():
    # A d 96 launch: the d 128 kernel (HEAD_DIM, the default config's) over TMA boxes 128 wide on
    # the 96-wide tensors; a varlen launch also passes D_REAL (its masked stores keep to 96
    # columns), a dense one does not (its stores are TMA's, which drop the columns past 96).
    from flashattn_lite.ops.attention_fwd import SEQ_VARLEN, Variant, output_buffers
    q, kv = torch.zeros(2, 4, 300, 96, dtype=torch.bfloat16), torch.zeros(2, 2, 300, 96, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(2, 4, 300)
    cfg = gluon_fwd.default_config(128, False, 300)
    grid, args, kwargs = gluon_fwd._launch(q, kv, kv, o, lse, 96 ** -0.5, False, cfg)
    assert kwargs["HEAD_DIM"] == 128 and "D_REAL" not in kwargs
    assert [list(a.block_shape) for a in args[:4]] == [[1, 1, 64, 128], [1, 1, cfg.block_n, 128],
                                                       [1, 1, cfg.block_n, 128], [1, 1, 64, 128]]
    assert all(list(a.shape) == list(t.shape) for a, t in zip(args[:4], (q, kv, kv, o)))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    q1, k1 = q[:1], kv[:1]
    o1, lse1 = output_buffers(q1, 96, varlen, True)
    _, _, kwargs = gluon_fwd._launch(q1, k1, k1, o1, lse1, 96 ** -0.5, True, gluon_fwd.one_tile_per_program(cfg),
                                     varlen)
    assert kwargs["HEAD_DIM"] == 128 and kwargs["D_REAL"] == 96


# (B, Hq, Hkv, Nq, Nk): lengths 1, 17, 1000, 4097 (partial tiles), Nq ≠ Nk both ways (Nq > Nk under
# causal leaves rows with no key), GQA 2:1 (4:1 in its own test: the Hopper kernel compiles once per
# group, the Gluon kernel takes it at run time); each at d 64, 128 and 256.
SHAPES = [
    (1, 2, 2, 1, 1),
    (2, 4, 2, 17, 17),
    (2, 8, 2, 1000, 1000),
    (1, 4, 4, 4097, 4097),
    (1, 4, 2, 1000, 4097),
    (1, 2, 2, 4097, 1000),
    (1, 4, 2, 1, 4097),
    (1, 4, 2, 17, 1000),
]


def check(shape, dtype, causal, config, *, vs_hopper=True):
    q, k, v = make_qkv(shape, dtype)
    assert gluon_fwd.supported(q, k, v, causal=causal) is None
    scale = q.shape[-1] ** -0.5
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal, config=config)
    o_ref = check_against_reference(o, lse, q, k, v, causal)

    if not vs_hopper or shape[-1] not in hopper.HEAD_DIMS:  # the TMA kernel does not take d 256
        return
    o_hop, lse_hop = hopper.attention_forward_hopper(q, k, v, scale, causal)
    assert_close_to_ref(o, o_hop, o_ref, eps=EPS[dtype], what="output vs the Triton Hopper kernel's error")
    check_lse(lse, lse_hop.double(), dtype)


def check_grads_match_portable(q, k, v, causal):
    """attention()'s gradients (from the Hopper forward's o, lse) within 2% of the portable kernels'."""
    from flashattn_lite import attention
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(attention(*leaves, causal=causal).float().square().sum(), leaves)
    with hopper.disabled():
        want = torch.autograd.grad(attention(*leaves, causal=causal).float().square().sum(), leaves)
    for g, w in zip(grads, want):
        assert (g.float() - w.float()).norm() <= 2e-2 * w.float().norm()


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", gluon_fwd.HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: shape_id(s + (0,))[:-3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_matches_reference_and_hopper(shape, d, dtype, causal):
    # fp16 against the reference only: each (dtype, d, causal, group) is one more Hopper compile.
    check(shape + (d,), dtype, causal, None, vs_hopper=dtype == torch.bfloat16)


@needs_gpu
def test_repeated_launches_skip_tritons_path_and_read_their_own_tensors(monkeypatch):
    # After the first call, calls of other lengths with the same specialization launch the cached
    # binary directly (no Triton launch path): each must still read its own q, k, v and write its
    # own o through tensor maps encoded for it.
    launcher = gluon_fwd._attn_fwd_gluon_launcher
    assert launcher.enabled
    config = gluon_fwd.default_config(128, True, 1000)
    check((1, 4, 2, 1000, 1000, 128), torch.bfloat16, True, config, vs_hopper=False)
    slow = []
    first = launcher._first
    monkeypatch.setattr(launcher, "_first", lambda *a: slow.append(a) or first(*a))
    for shape in [(2, 4, 2, 777, 1500, 128), (1, 8, 2, 1000, 1000, 128), (1, 4, 2, 1000, 1000, 128)]:
        check(shape, torch.bfloat16, True, config, vs_hopper=False)
    assert not slow


@needs_gpu
def test_gqa_4_to_1():
    check((1, 8, 2, 1000, 1000, 128), torch.bfloat16, True, None)
    check((2, 8, 2, 333, 4097, 64), torch.bfloat16, False, None, vs_hopper=False)


@needs_gpu
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in gluon_fwd.HEAD_DIMS for c in gluon_fwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, gluon_fwd.Config) else f"d{x}")
def test_every_config_on_partial_tiles(head_dim, config):
    # Tails on both sides and the bottom-right diagonal (Nq < Nk, neither a tile multiple), GQA 2:1;
    # causal, which has every mask the non-causal kernel has (the zero-padded keys) and the diagonal.
    check((1, 4, 2, 1000, 1037, head_dim), torch.bfloat16, True, config)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", gluon_fwd.HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rows_whose_maximum_climbs(d, dtype, causal):
    # Scores that climb along the keys, each row at its own rate (0 to ~20 base-2 units per 128-key
    # tile; a quarter of the rows fall instead), so the online softmax rescales some rows at every
    # tile and others never after the first, within one warp's rows.
    q, k, v = make_qkv((1, 4, 2, 1000, 1037, d), dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    direction = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0).to(q.device)
    rate = (torch.rand(q.shape[:-1] + (1,), generator=g) * 1.6 - 0.4).to(q.device)
    climb = torch.linspace(0.0, 20.0, k.shape[2], device=q.device)[:, None] * direction * d ** 0.5
    k = (k.float() * 0.3 + climb).to(dtype)
    q = (q.float() * 0.3 + rate * direction * 4.0).to(dtype)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal)
    check_against_reference(o, lse, q, k, v, causal)


PERSISTENT = [(d, c) for d in gluon_fwd.HEAD_DIMS for c in gluon_fwd.CONFIGS[d] if c.persistent]


@needs_gpu
@pytest.mark.parametrize("options", ["plain", "all"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, config", PERSISTENT, ids=[f"d{d}-{c.name}" for d, c in PERSISTENT])
def test_persistent_programs_walk_many_tiles(head_dim, config, causal, options):
    # Three programs for 2·4·cdiv(1300, BLOCK_M) tiles: each walks many, so the K/V ring, the turns
    # and the Q sets wrap many times, across tiles with no key tile (causal with Nq − Nk ≥ BLOCK_M,
    # or outside the window) and partial tiles on both sides, GQA 2:1; plain or with a window's
    # left side, softcap, (B, Hq) ALiBi slopes and sinks. Bit for bit the one-tile-per-program
    # config's output (the same per-tile code), and the float64 reference's when plain.
    from flashattn_lite.ops.attention_fwd import PLAIN, Variant
    q, k, v = make_qkv((2, 4, 2, 1300, 1000, head_dim), torch.bfloat16)
    variant = PLAIN
    if options == "all":
        g = torch.Generator().manual_seed(11)
        variant = Variant(left=300, softcap=30.0, sinks=torch.randn(4, generator=g).to(q.device),
                          alibi=(torch.rand(2, 4, generator=g) * 0.05).to(q.device))
    scale = head_dim ** -0.5
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    grid, args, kwargs = gluon_fwd._launch(q, k, v, o, lse, scale, causal, config, variant, sms=3)
    assert grid == (3,) and kwargs["PERSISTENT"]
    gluon_fwd._attn_fwd_gluon_kernel[grid](*args, **kwargs)
    if variant is PLAIN:
        check_against_reference(o, lse, q, k, v, causal)
    o1, lse1 = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal,
                                                 config=gluon_fwd.one_tile_per_program(config), variant=variant)
    assert torch.equal(o, o1) and torch.equal(lse, lse1)


@needs_gpu
def test_strided_heads_read_in_place():
    # (B, N, H, D) storage seen as (B, H, N, D): the descriptors take the strides.
    q, k, v = make_qkv((2, 8, 2, 1000, 777, 128), torch.float16, layout="bnhd")
    assert not q.is_contiguous()
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.125, True)
    oc, lsec = gluon_fwd.attention_forward_gluon(q.contiguous(), k.contiguous(), v.contiguous(), 0.125, True)
    assert torch.equal(o, oc) and torch.equal(lse, lsec)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_head_dim_reads_views_of_a_fused_qkv(causal):
    # q, k, v as views of one (B, N, 3, H, 96) projection: rows 3·H·96 elements apart, k's 96
    # columns followed in memory by v's. The boxes 128 wide must read zeros past column 96 (the
    # descriptors' bounds), not the neighbour's values: the same o, lse as on contiguous copies, and
    # the gradients through attention() as the portable kernels give them.
    g = torch.Generator(device="cuda").manual_seed(9)
    qkv = torch.randn(2, 2048, 3, 8, 96, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    assert gluon_fwd.supported(q, k, v, causal=causal) is None
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 96 ** -0.5, causal)
    oc, lsec = gluon_fwd.attention_forward_gluon(q.contiguous(), k.contiguous(), v.contiguous(), 96 ** -0.5, causal)
    assert torch.equal(o, oc) and torch.equal(lse, lsec)
    check_against_reference(o, lse, q, k, v, causal)
    from flashattn_lite import attention
    leaf = qkv.clone().requires_grad_()

    def grad_of_views():
        q, k, v = (t.transpose(1, 2) for t in leaf.unbind(2))
        return torch.autograd.grad(attention(q, k, v, causal=causal).float().square().sum(), leaf)[0].float()
    got = grad_of_views()
    with hopper.disabled():
        want = grad_of_views()
    assert (got - want).norm() <= 2e-2 * want.norm()


def test_takes_a_window_refuses_ranges():
    # softcap, ALiBi, sinks and sliding windows are its options (tests/test_attention_gluon_variants.py,
    # tests/test_attention_gluon_window.py); ranges/varlen layouts are never handed to it.
    from flashattn_lite.ops.attention_fwd import SEQ_RANGES, Variant
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    assert gluon_fwd._variant_reason(Variant(left=4)) is None
    assert gluon_fwd._variant_reason(Variant(left=4, right=0, softcap=3.0)) is None
    assert "ranges" in gluon_fwd.supported(q, q, q, variant=Variant(left=4, seq=SEQ_RANGES))
    with pytest.raises(ValueError, match="ranges"):
        gluon_fwd.attention_forward_gluon(q, q, q, 0.125, False, variant=Variant(left=4, seq=SEQ_RANGES))


@needs_gpu
@pytest.mark.parametrize("offset", [0, 3000, -500])
def test_non_causal_call_takes_the_gluon_kernels_at_any_causal_offset(offset):
    # A causal_offset places the diagonal, a window and ALiBi's distances; a non-causal call has none
    # of them, so whatever its offset it takes the Gluon kernels, forward and backward (ring
    # attention's off-diagonal blocks: n/2 query rows against n keys, offset 0), and gives what the
    # bottom-right default gives.
    from flashattn_lite import _log
    from flashattn_lite.ops import attention_bwd, attention_fwd
    from flashattn_lite.ops.attention import attention_core
    q, k, v = make_qkv((1, 8, 2, 2048, 4096, 128), torch.bfloat16)
    attention_fwd._HOPPER.clear()
    attention_bwd._HOPPER.clear()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with _log.recording() as notes:
        o, lse = attention_core(*leaves, causal_offset=offset, return_lse=True)
        grads = torch.autograd.grad(o.float().square().sum(), leaves)
    assert [(where, path, "Gluon" in reason) for path, where, reason in notes] == [
        ("attention forward", "hopper", True), ("attention backward", "hopper", True)]
    default_o, default_lse = attention_core(q, k, v, return_lse=True)
    assert torch.equal(o, default_o) and torch.equal(lse, default_lse)
    check_against_reference(o.detach(), lse.detach(), q, k, v, False)
    with hopper.disabled():
        want = torch.autograd.grad(attention_core(*leaves, causal_offset=offset).float().square().sum(), leaves)
    for g, w in zip(grads, want):
        assert (g.float() - w.float()).norm() <= 2e-2 * w.float().norm()


PADDED_DIMS = (48, 80, 96, 112, 192)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", PADDED_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[4], SHAPES[5]], ids=lambda s: shape_id(s + (0,))[:-3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_padded_head_dims_match_reference(shape, d, dtype, causal):
    # Head dims run padded (``padded_head_dim``) against float64: partial tiles, Nq ≠ Nk both ways,
    # GQA; o keeps its real width (the TMA store drops the padding).
    check(shape + (d,), dtype, causal, None, vs_hopper=False)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_head_dim_dispatch(causal):
    # attention() at d 96 (Phi-3's head dim): the forward takes the Gluon kernel padded to 128, causal
    # at 2k too (no TMA-kernel alternative), explain() says so, and the backward (portable at d 96)
    # runs from its (o, lse) to the portable kernels' gradients.
    from flashattn_lite import attention, explain
    from flashattn_lite.ops import attention_fwd
    q, k, v = make_qkv((2, 8, 4, 2048, 2048, 96), torch.bfloat16)  # past MIN_WORK (2³²)
    attention_fwd._HOPPER.clear()
    how = explain(q, k, v, causal=causal, backward=False)
    assert how.path == "hopper" and "Gluon" in how.reason and "head dim 96 run at 128" in how.reason
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 96 ** -0.5, causal)
    assert torch.equal(attention(q, k, v, causal=causal), o)
    check_against_reference(o, lse, q, k, v, causal)
    check_grads_match_portable(q, k, v, causal)


@needs_gpu
@pytest.mark.parametrize("d, causal, n, takes_gluon", [(128, False, 2048, True), (128, True, 2048, True),
                                                       (64, True, 1024, False), (64, True, 2048, True),
                                                       (64, True, 8192, True)],
                         ids=["d128-full-2k", "d128-causal-2k", "d64-causal-1k", "d64-causal-2k", "d64-causal-8k"])
def test_attention_dispatches_where_it_measured_fastest(d, causal, n, takes_gluon):
    # attention() sends plain calls to the Gluon kernel non-causal at any length and causal from
    # CAUSAL_MIN_N[d] on (2k), else to the Triton TMA kernel; both give what
    # the kernel called directly gives, and the backward runs from the Gluon kernel's (o, lse).
    from flashattn_lite import attention, explain
    from flashattn_lite.ops import attention_fwd
    q, k, v = make_qkv((16384 // n, 8, 8, n, n, d), torch.bfloat16)
    attention_fwd._HOPPER.clear()
    how = explain(q, k, v, causal=causal, backward=False)
    assert how.path == "hopper" and ("Gluon" in how.reason) == takes_gluon
    direct = (gluon_fwd.attention_forward_gluon if takes_gluon else hopper.attention_forward_hopper)(
        q, k, v, d ** -0.5, causal)[0]
    assert torch.equal(attention(q, k, v, causal=causal), direct)
    check_grads_match_portable(q, k, v, causal)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dim_256_forward_takes_it_backward_the_portable_kernels(causal):
    # d 256 (Gemma's head dim): attention() sends the forward to the Gluon kernel (the Triton TMA
    # kernel does not take d 256), causal at 1k too (CAUSAL_MIN_N[256] is 0: the alternative is the
    # portable kernel); the backward, which no Hopper kernel takes at d 256, runs the portable
    # kernels from the Gluon kernel's (o, lse) and gives their gradients. 2³² of work: MIN_WORK.
    from flashattn_lite import attention, explain
    from flashattn_lite.ops import attention_fwd
    q, k, v = make_qkv((2, 8, 4, 1024, 1024, 256), torch.bfloat16)
    attention_fwd._HOPPER.clear()
    how = explain(q, k, v, causal=causal, backward=False)
    assert how.path == "hopper" and "Gluon" in how.reason
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 256 ** -0.5, causal)
    assert torch.equal(attention(q, k, v, causal=causal), o)
    check_against_reference(o, lse, q, k, v, causal)
    check_grads_match_portable(q, k, v, causal)
