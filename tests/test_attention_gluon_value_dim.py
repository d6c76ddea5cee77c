"""The Gluon forward and backward with v's head dim other than q's and k's (MLA's 192 and 128, as
DeepSeek-V2/V3 prefill): the kernels run at the wider one's padded width (``padded_head_dim``), the
TMA boxes reading the narrower tensors' missing columns as zeros and every store keeping to its
tensor's own columns. The CPU tests check the rules and the launches; the GPU tests compare with
the float64 reference and the portable kernels."""
import pytest
import torch
import triton

from conftest import ON_GPU, assert_close_to_ref
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_RANGES, SEQ_VARLEN, Variant, output_buffers
from flashattn_lite.reference import attention_reference, attention_varlen_reference
from test_attention_gluon_variants import faked_device, sm90  # noqa: F401
from test_attention_hopper import EPS, check_lse

REASON = None if ON_GPU and torch.cuda.get_device_capability()[0] == 9 else "the Gluon kernels need an sm_90 GPU"
if REASON is None:
    _q = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device="cuda")
    REASON = gluon_fwd.supported(_q, _q, _q)
needs_gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))

# (q/k head dim, v head dim): MLA's, narrower and wider v, two padded ones at once, v at 64 (and
# 48) beside the head dim 256 kernels (their V and dO at 128: ``wide_value_width``), and q's 128
# in those kernels' 256-wide boxes beside a wider v (Q·Kᵀ over 128 of them); 256 / 128's causal
# backward in one pass with dQ over two 128-column halves (``one_pass``).
DIMS = [(192, 128), (128, 64), (64, 128), (80, 48), (192, 64), (192, 48), (128, 256), (256, 128)]
# K 2 / V 2 with 128-key tiles fits at kernel width 256 only with K in 64-column chunks (q at most 192)
K2V2 = gluon_fwd.NARROW_QK_CONFIG


def test_kernel_width_is_the_wider_padded_dim():
    want = {(192, 128): 256, (128, 64): 128, (64, 128): 128, (80, 48): 128, (48, 40): 64, (256, 128): 256,
            (96, 96): 128}
    for (d, dv), width in want.items():
        assert gluon_fwd.padded_head_dim(d, dv) == width == gluon_bwd.kernel_head_dim(d, dv)
    for d, dv in ((192, 100), (100, 64), (64, 16), (300, 128)):  # either one not covered: neither
        assert gluon_fwd.padded_head_dim(d, dv) is None and gluon_bwd.kernel_head_dim(d, dv) is None
    assert gluon_fwd.padded_head_dim(96, None) == gluon_fwd.padded_head_dim(96) == 128
    note = gluon_fwd.path_note(PLAIN, 192, 128)  # the forward's P·V at v's own width
    assert "head dims 192 (q, k) and 128 (v) run at 256 and 128" in note
    assert "head dims 64 (q, k) and 128 (v) run at 128," in gluon_fwd.path_note(PLAIN, 64, 128)
    assert gluon_fwd.path_note(PLAIN, 128, 128) == gluon_fwd.PATH_NOTE
    # The forward at 128 / 64 runs each at its own width: nothing padded, nothing said.
    assert gluon_fwd.path_note(PLAIN, 128, 64) == gluon_fwd.PATH_NOTE
    for deterministic in (False, True):
        note = gluon_bwd.path_note(PLAIN, 192, deterministic, value_dim=128)
        assert "dK/dV and dQ kernels" in note and "run at 256 and 128" in note
    assert "run at 256 and 128" in gluon_bwd.path_note(PLAIN, 192, value_dim=64)  # (``wide_value_width``)
    assert "(v) run at 128," in gluon_bwd.path_note(PLAIN, 128, value_dim=64)  # the d ≤ 128 kernel: one width
    # Deterministic dq: the Triton TMA dQ kernel assumes v's head dim is q's; the portable one does not.
    assert "portable one-writer dQ" in gluon_bwd.path_note(PLAIN, 128, True, True, value_dim=64)
    assert gluon_bwd._tma_dq_covers(PLAIN, True, 128) and not gluon_bwd._tma_dq_covers(PLAIN, True, 128, 64)


def test_supported_takes_value_dims_the_triton_kernels_do_not(monkeypatch):
    monkeypatch.setattr(gluon_fwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_fwd, "_HAS_GLUON", True)
    monkeypatch.setattr(gluon_bwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_bwd, "_HAS_GLUON", True)
    monkeypatch.setattr(hopper, "_device_reason", lambda *tensors: None)  # CPU tensors stand in for sm_90 ones
    z = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)  # noqa: E731
    q, k, v = z(1, 4, 8, 192), z(1, 2, 8, 192), z(1, 2, 8, 128)
    assert gluon_fwd.supported(q, k, v) is None and gluon_bwd.supported(q, k, v, z(1, 4, 8, 128)) is None
    assert "head dims 192 (q, k) and 100 (v)" in gluon_fwd.supported(q, k, z(1, 2, 8, 100))
    assert "head dims 192 (q, k) and 100 (v)" in gluon_bwd.supported(q, k, z(1, 2, 8, 100), q)
    assert "do is not a tensor of o's shape" in gluon_bwd.supported(q, k, v, q)
    assert "k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv)" in gluon_fwd.supported(q, k, z(1, 2, 9, 128))
    # The Triton TMA kernels keep v's head dim equal to q's.
    assert "shapes" in hopper.covered(q[..., :128], k[..., :128], v[..., :64], hopper.HEAD_DIMS, {})
    # o padded above 128 (v at 136: 256 wide): the forward's ranges and varlen store, kept to v's
    # columns, spills: dense batches only. At 192 / 128 o is 128 wide: every layout.
    cu = torch.tensor([0, 8], dtype=torch.int32)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    assert gluon_fwd.supported(q[:1], k[:1], v[:1], variant=varlen) is None
    assert "dense batch only" in gluon_fwd.supported(q[:1], k[:1], z(1, 2, 8, 136), variant=varlen)


@faked_device
def test_dispatch_takes_q_above_128_beside_v_at_most_64(sm90, monkeypatch):
    # q above 128 beside v padded to 64 (the forward's V at 64, the backward's at 128 in 256-wide
    # kernels) takes the Gluon kernels like MLA's 192 / 128 and 128 / 64 (run on the GPU: DIMS).
    monkeypatch.setattr(gluon_bwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_bwd, "_HAS_GLUON", True)
    z = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)  # noqa: E731
    for d, dv in ((192, 64), (192, 48), (192, 128), (128, 64)):
        q, k, v = z(1, 2, 256, d), z(1, 2, 256, d), z(1, 2, 256, dv)
        assert gluon_fwd.fast_path(q, k, v, True, 0, 0.1), (d, dv)
        assert gluon_bwd.fast_path(z(1, 2, 256, dv), q, k, v, True, 0, 0.1), (d, dv)


def test_narrow_v_configs_are_the_default_only_where_measured(monkeypatch):
    # Kernel width 256 beside V's boxes at most 128 wide. q's head dim 192 (MLA's: K in 64-column
    # chunks, ``k_chunks``): K 2 / V 2 from 1k keys, causal or not, with any option, ranges and varlen
    # batches too (persistent, through the work queue). Where K cannot be chunked (q's 136–184,
    # whose last chunk would run past k's columns; q's 256): plain non-causal dense calls from 4k take 128-key tiles with V's own 3-deep
    # ring (its shared memory fits only beside a narrow V); causal calls, options, shorter ones, a wide
    # V and ranges or varlen batches keep the d 256 default.
    narrow, wide, k2v2 = gluon_fwd.NARROW_V_CONFIGS[1], gluon_fwd.default_config(256, False, 4096), K2V2
    assert wide not in gluon_fwd.NARROW_V_CONFIGS
    for cfg in gluon_fwd.NARROW_V_CONFIGS:
        assert cfg.smem_bytes(256, cfg.q_sets(256, 128), 128) <= gluon_fwd.SMEM_BYTES < cfg.smem_bytes(256, 1, 256)
    assert gluon_fwd.default_config(256, False, 4096, value_dim=128, plain=True) == narrow
    assert gluon_fwd.default_config(256, False, 16384, value_dim=64, plain=True) == narrow
    for q_dim in (256, 160):  # K whole
        assert gluon_fwd.default_config(256, False, 16384, value_dim=128, q_dim=q_dim, plain=True) == narrow
        assert gluon_fwd.default_config(256, False, 16384, value_dim=128, q_dim=q_dim, plain=False) == wide
        for causal in (False, True):
            assert gluon_fwd.default_config(256, causal, 8192, value_dim=128, q_dim=q_dim, plain=True) != k2v2
    for causal in (False, True):
        for n in (1024, 2048, 4096, 8192, 65536):
            for plain in (True, False):
                assert gluon_fwd.default_config(256, causal, n, value_dim=128, q_dim=192, plain=plain) == k2v2
        assert gluon_fwd.default_config(256, causal, 1000, value_dim=128, q_dim=192, plain=True) not in (narrow, k2v2)
    for args, kwargs in (((256, False, 2048), dict(value_dim=128, plain=True)),
                         ((256, True, 16384), dict(value_dim=128, plain=True)),
                         ((256, False, 8192), dict(value_dim=192, plain=True)), ((256, False, 8192), {}),
                         ((256, False, 8192), dict(value_dim=128))):  # (not said plain: not taken)
        assert gluon_fwd.default_config(*args, **kwargs) not in gluon_fwd.NARROW_V_CONFIGS, (args, kwargs)
    taken = []

    def launch(q, k, v, o, lse, scale, causal, cfg, variant=PLAIN):
        taken.append(cfg)
        raise RuntimeError("recorded")
    monkeypatch.setattr(gluon_fwd, "_launch", launch)
    bf = torch.bfloat16
    cu = torch.tensor([0, 1000, 4096], dtype=torch.int32)  # varlen: the rule's length is the mean, 2048
    layouts = (Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu),
               Variant(seq=SEQ_RANGES, seq_q=torch.tensor([[0, 4096]], dtype=torch.int32),
                       seq_k=torch.tensor([[0, 4096]], dtype=torch.int32)))
    options = (Variant(sinks=torch.zeros(2)), Variant(right=100), Variant(left=100), Variant(softcap=30.0),
               Variant(alibi=torch.zeros(2)))
    # through the forward at q's 192: K 2 / V 2 plain, with each option, and on ranges and varlen
    # batches (persistent through the work queue)
    # (the layouts at 8k rows and 4 query heads: more one-tile programs than SMs, and one KV head,
    # where ranges and varlen take the queue: ``_queue_pays``)
    q, v = torch.zeros(1, 2, 4096, 192, dtype=bf), torch.zeros(1, 2, 4096, 128, dtype=bf)
    long_q, long_k, long_v = (torch.zeros(1, h, 8192, w, dtype=bf) for h, w in ((4, 192), (1, 192), (1, 128)))
    cu_long, whole = torch.tensor([0, 1000, 8192], dtype=torch.int32), torch.tensor([[0, 8192]], dtype=torch.int32)
    long_layouts = (Variant(seq=SEQ_VARLEN, seq_q=cu_long, seq_k=cu_long),
                    Variant(seq=SEQ_RANGES, seq_q=whole, seq_k=whole))
    for variant in (PLAIN, Variant(), *options):
        with pytest.raises(RuntimeError, match="recorded"):
            gluon_fwd.attention_forward_gluon(q, q, v, 0.1, False, variant=variant)
    for variant in long_layouts:
        with pytest.raises(RuntimeError, match="recorded"):
            gluon_fwd.attention_forward_gluon(long_q, long_k, long_v, 0.1, False, variant=variant)
    assert taken == [k2v2] * 9, taken
    # at q's 160 (K whole): the 3-deep V ring for the plain call only
    taken.clear()
    q = torch.zeros(1, 2, 4096, 160, dtype=bf)
    for variant in (PLAIN, *options, *layouts):
        with pytest.raises(RuntimeError, match="recorded"):
            gluon_fwd.attention_forward_gluon(q, q, v, 0.1, False, variant=variant)
    assert taken[0] == narrow
    assert not any(cfg in (*gluon_fwd.NARROW_V_CONFIGS, k2v2) for cfg in taken[1:]), taken


def test_every_forward_default_fits_in_shared_memory():
    # Whatever (q, v) head dims, length, causal setting and options a call brings, the config the
    # forward's default picks fits in shared memory at the widths its boxes run (Q and K at the wider
    # padded width, V at v's own), and so does its one-tile form (``one_tile_per_program``).
    dims = (40, 64, 96, 128, 136, 192, 256)
    for d in dims:
        for dv in dims:
            D = gluon_fwd.padded_head_dim(d, dv)
            if D is None:
                continue
            w_v = gluon_fwd.padded_head_dim(dv)
            for causal in (False, True):
                for n in (1024, 2048, 4096, 8192, 12288, 16384, 65536):
                    for alibi, softcap, left, plain in ((False, False, False, True), (False, False, False, False),
                                                        (True, False, False, False), (False, True, True, False)):
                        cfg = gluon_fwd.default_config(D, causal, n, alibi, softcap, left, dv, d, plain=plain)
                        case = (d, dv, causal, n, alibi, softcap, left, plain, cfg.name)
                        chunks = gluon_fwd.k_chunks(cfg, D, d)
                        k_w = 64 * chunks if chunks > 1 else None  # K's ring at q's columns (``k_chunks``)
                        assert cfg.smem_bytes(D, cfg.q_sets(D, w_v, k_w), w_v, k_w) <= gluon_fwd.SMEM_BYTES, case
                        if not plain:
                            flat = gluon_fwd.one_tile_per_program(cfg)
                            assert flat.smem_bytes(D, 1, w_v, k_w) <= gluon_fwd.SMEM_BYTES, case


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_128_key_configs_hold_k_in_chunks_of_q_columns():
    # At kernel width 256 with q's columns fewer (MLA's 192), the 128-key configs load K as three
    # 64-column boxes a slot (q's columns only); at q's 256, and in the 64-key configs, K is one box.
    bf = torch.bfloat16
    q192, v128 = torch.zeros(1, 2, 300, 192, dtype=bf), torch.zeros(1, 2, 300, 128, dtype=bf)
    q256 = torch.zeros(1, 2, 300, 256, dtype=bf)
    for cfg in (*gluon_fwd.NARROW_V_CONFIGS, K2V2):
        _, args, kwargs = gluon_fwd._launch(q192, q192, v128, v128.clone(), torch.zeros(1, 2, 300), 0.1, False, cfg)
        assert kwargs["K_CHUNKS"] == 3 and list(args[1].block_shape) == [1, 1, 128, 64], cfg.name
        assert kwargs["HEAD_DIM"] == 192 and kwargs["Q_SETS"] == 1
    for q, cfg in ((q256, gluon_fwd.NARROW_V_CONFIGS[1]), (q192, gluon_fwd.default_config(256, False, 8192))):
        _, args, kwargs = gluon_fwd._launch(q, q, v128, v128.clone(), torch.zeros(1, 2, 300), 0.1, False, cfg)
        assert "K_CHUNKS" not in kwargs and list(args[1].block_shape)[3] == 256, cfg.name
    q160 = torch.zeros(1, 2, 300, 160, dtype=bf)
    _, args, kwargs = gluon_fwd._launch(q160, q160, v128, v128.clone(), torch.zeros(1, 2, 300), 0.1, False,
                                        gluon_fwd.NARROW_V_CONFIGS[1])
    assert "K_CHUNKS" not in kwargs and list(args[1].block_shape)[3] == 256  # (q's 160: K whole)
    # (K's ring at q's 192 columns: the two-slot config fits beside one Q set only so), one tile a
    # program too; where it does not fit (q's 160 or 256, K whole): ValueError
    assert K2V2.smem_bytes(256, 1, 128, 192) <= gluon_fwd.SMEM_BYTES < K2V2.smem_bytes(256, 1, 128)
    _, args, kwargs = gluon_fwd._launch(q192, q192, v128, v128.clone(), torch.zeros(1, 2, 300), 0.1, True,
                                        gluon_fwd.one_tile_per_program(K2V2))
    assert kwargs["K_CHUNKS"] == 3 and "PERSISTENT" not in kwargs and kwargs["STAGES"] == 2
    for q, cfg in ((q256, K2V2), (q160, K2V2), (q160, gluon_fwd.one_tile_per_program(K2V2))):
        with pytest.raises(ValueError, match="shared memory"):
            gluon_fwd._launch(q, q, v128, v128.clone(), torch.zeros(1, 2, 300), 0.1, False, cfg)


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_launches_read_at_the_kernel_width_and_store_each_tensors_columns():
    import inspect
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    bf = torch.bfloat16
    # The forward at 128 / 64: Q and K boxes 128 wide, V and O boxes 64 (P·V at v's width); a varlen
    # o's masked store at its own 64 columns.
    q, k, v = torch.zeros(1, 4, 300, 128, dtype=bf), torch.zeros(1, 2, 300, 128, dtype=bf), \
        torch.zeros(1, 2, 300, 64, dtype=bf)
    cfg = gluon_fwd.default_config(128, False, 300)
    o, lse = output_buffers(q, 64, PLAIN, True)
    _, args, kwargs = gluon_fwd._launch(q, k, v, o, lse, 0.1, False, cfg)
    assert kwargs["HEAD_DIM"] == 128 and "D_REAL" not in kwargs and o.shape[-1] == 64
    assert [a.block_shape[-1] for a in args[:4]] == [128, 128, 64, 64] and list(args[2].shape) == list(v.shape)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    o, lse = output_buffers(q, 64, varlen, True)
    _, _, kwargs = gluon_fwd._launch(q, k, v, o, lse, 0.1, True, gluon_fwd.one_tile_per_program(cfg), varlen)
    assert kwargs["HEAD_DIM"] == 128 and "D_REAL" not in kwargs
    # 192 / 136: V and O boxes 256 wide, the masked store kept to 136; a persistent 192 / 128 launch
    # counts V's ring at 128 columns: two Q sets fit (224 KiB, as d 128's).
    q2, k2, v2 = torch.zeros(1, 4, 300, 192, dtype=bf), torch.zeros(1, 2, 300, 192, dtype=bf), \
        torch.zeros(1, 2, 300, 136, dtype=bf)
    cfg2 = gluon_fwd.default_config(256, True, 300)
    o, lse = output_buffers(q2, 136, varlen, True)
    _, args, kwargs = gluon_fwd._launch(q2, k2, v2, o, lse, 0.1, True, gluon_fwd.one_tile_per_program(cfg2), varlen)
    assert [a.block_shape[-1] for a in args[:4]] == [256, 256, 256, 256] and kwargs["D_REAL"] == 136
    assert kwargs["HEAD_DIM"] == 192  # Q·Kᵀ over 192 of the boxes' 256 columns (``_qk``: 128 + 64)
    o, lse = output_buffers(q2, 128, PLAIN, True)
    _, args, kwargs = gluon_fwd._launch(q2, k2, v2[..., :128].contiguous(), o, lse, 0.1, True, cfg2)
    assert cfg2.persistent and kwargs["Q_SETS"] == 2 and [a.block_shape[-1] for a in args[:4]] == [256, 256, 128, 128]
    assert kwargs["HEAD_DIM"] == 192
    # 64 / 128: v wider than q, so every box at 128 (O is staged in Q's slot, which must hold it);
    # Q·Kᵀ over q's 64.
    o, lse = output_buffers(q[..., :64], 128, PLAIN, True)
    _, args, kwargs = gluon_fwd._launch(q[..., :64].contiguous(), k[..., :64].contiguous(), k, o, lse, 0.1, False,
                                        cfg)
    assert kwargs["HEAD_DIM"] == 64 and [a.block_shape[-1] for a in args[:4]] == [128] * 4
    # 128 / 256: every box at 256, Q·Kᵀ over q's 128 of them.
    v256 = torch.zeros(1, 2, 300, 256, dtype=bf)
    o, lse = output_buffers(q, 256, PLAIN, True)
    _, args, kwargs = gluon_fwd._launch(q, k, v256, o, lse, 0.1, False, gluon_fwd.default_config(256, False, 300))
    assert kwargs["HEAD_DIM"] == 128 and [a.block_shape[-1] for a in args[:4]] == [256] * 4
    # The d ≤ 128 backward: dv's masked stores keep to v's columns, dk's to k's (all of the kernel's here).
    plan = gluon_bwd.launch_plan(q, k, gluon_bwd.default_config(128, True, 300), True, varlen, value_dim=64)
    assert plan["constexprs"]["DV_REAL"] == 64 and "D_REAL" not in plan["constexprs"]
    assert "DV_REAL" not in gluon_bwd.launch_plan(q, k, gluon_bwd.default_config(128, True, 300), True,
                                                  value_dim=64)["constexprs"]  # dense: TMA stores
    # v wider than q (64 / 128): the kernel at 128, dk's stores to 64 columns, dv's to 128.
    q64, k64 = q[..., :64].contiguous(), k[..., :64].contiguous()
    ce = gluon_bwd.launch_plan(q64, k64, gluon_bwd.default_config(128, True, 300), True, varlen,
                               value_dim=128)["constexprs"]
    assert ce["HEAD_DIM"] == 128 and ce["D_REAL"] == 64 and ce["DV_REAL"] == 128
    assert ce["QK"] == 64  # Sᵀ over q's 64 columns of the kernel's 128 (``_qk``)
    # The fused dQ's float32 buffer: q's columns rounded up to 64, what the reduce-adds cover (64 of
    # the d ≤ 128 kernel's 128 at 64 / 128, whose consumer 1 does no dQ work; 192 of the one pass's 256).
    fused = gluon_bwd.default_config(128, True, 300)
    assert gluon_bwd.launch_plan(q64, k64, fused, True, value_dim=128)["dq_acc_shape"][3] == 64
    q192, k192 = torch.zeros(1, 4, 300, 192, dtype=bf), torch.zeros(1, 2, 300, 192, dtype=bf)
    one_pass = gluon_bwd.WIDE_ONE_PASS
    assert gluon_bwd.launch_plan(q192, k192, one_pass, True, value_dim=128)["dq_acc_shape"][3] == 192
    assert "QK" not in gluon_bwd.launch_plan(q, k, gluon_bwd.default_config(128, True, 300), True,
                                             value_dim=64)["constexprs"]  # q at the kernel's width
    # A GQA-split launch (float32 dK/dV sums by TMA reduce in 64-column boxes) over dv of 64 columns:
    # its descriptors have dv's own shape, so the boxes past column 64 are clipped.
    cfg = gluon_bwd.default_config(128, True, 8192)
    dv32 = torch.zeros(1, 2, 300, 64)
    _, args, kwargs = gluon_bwd._launch(q, k, v, q[..., :64], None, torch.zeros(k.shape), dv32,
                                        torch.zeros(4, 384), torch.zeros(4, 384), 0.1, True, cfg,
                                        dq_acc=torch.zeros(1, 4, 300, 128), kv_share=2)
    assert list(args[8].shape) == list(dv32.shape) and list(args[8].block_shape) == [1, 1, 64, 64]
    assert kwargs["HEAD_DIM"] == 128 and "DV_REAL" not in kwargs
    # The wide backward at 192 / 128: every store masked, dk and dq to 192 columns, dv to 128; Q and K
    # boxes at 256, V and dO at v's own 128 (dPᵀ = V·dOᵀ and dV at v's width).
    q, k, v = torch.zeros(2, 4, 200, 192, dtype=bf), torch.zeros(2, 2, 333, 192, dtype=bf), \
        torch.zeros(2, 2, 333, 128, dtype=bf)
    rows = torch.zeros(2 * 4, gluon_bwd._pad_rows(200))
    cfg = gluon_bwd.default_config(256, True, 333)
    dkdv, dq = wide.launches(q, k, v, q[..., :128], q, k, v, rows, rows, 0.1, True, cfg, PLAIN)
    for kernel, (grid, args, kwargs) in ((wide._attn_bwd_gluon_wide_kernel, dkdv),
                                         (wide._attn_bwd_gluon_wide_dq_kernel, dq)):
        constexprs = {n: c for n, c in kwargs.items() if n != "num_warps"}
        inspect.signature(kernel.fn).bind(*args, **constexprs)
        assert constexprs["HEAD_DIM"] == 256 and constexprs["D_REAL"] == 192
        assert constexprs["QK"] == 192  # S, Sᵀ over q's 192 columns of the kernel's 256 (``_qk``)
        assert [a.block_shape[-1] for a in args[:4]] == [256, 256, 128, 128]
    assert dkdv[2]["DV_REAL"] == 128 and "DV_REAL" not in dq[2]
    # v at 64 (256 / 64): V and dO still 128 wide, so each consumer's dV half of dO is 64 columns.
    dkdv, _ = wide.launches(q, k, v[..., :64], q[..., :64], q, k, v[..., :64], rows, rows, 0.1, True, cfg, PLAIN)
    assert [a.block_shape[-1] for a in dkdv[1][:4]] == [256, 256, 128, 128] and dkdv[2]["DV_REAL"] == 64



@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_one_pass_wide_backward_launches_only_the_dkdv_kernel():
    # Dense calls whose V runs at most 128 wide take one pass: dQ reduce-added by the dK/dV kernel into
    # the float32 buffer (64-column boxes), no dQ kernel; V at 256 and ranges or varlen keep the pair.
    import inspect
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    bf = torch.bfloat16
    q, k = torch.zeros(2, 4, 200, 192, dtype=bf), torch.zeros(2, 2, 333, 192, dtype=bf)
    v = torch.zeros(2, 2, 333, 128, dtype=bf)
    cu = torch.tensor([0, 100, 333], dtype=torch.int32)
    assert wide.one_pass(128, None, True) and wide.one_pass(128, PLAIN, True) and wide.one_pass(64, PLAIN, True)
    assert not wide.one_pass(128, None, False)  # non-causal: the pair (measured faster there)
    assert not wide.one_pass(256, None, True) and not wide.one_pass(192, None, True)
    for variant in (Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu), Variant(softcap=30.0), Variant(left=100),
                    Variant(sinks=torch.zeros(4))):
        assert not wide.one_pass(128, variant, True), variant
    assert "one pass" in gluon_bwd.path_note(PLAIN, 192, causal=True, value_dim=128)
    assert "one pass" in gluon_bwd.path_note(PLAIN, 256, causal=True, value_dim=128)  # (no padding to name)
    assert gluon_bwd.path_note(PLAIN, 256, causal=True) == gluon_bwd.PATH_NOTE  # v at 256: the pair
    assert "dQ kernels" in gluon_bwd.path_note(PLAIN, 192, causal=False, value_dim=128)
    assert "dQ kernels" in gluon_bwd.path_note(PLAIN, 192, deterministic=True, causal=True, value_dim=128)
    rows = torch.zeros(2 * 4, gluon_bwd._pad_rows(200))
    cfg = gluon_bwd.default_config(256, True, 333, value_dim=128)
    assert cfg.fused_dq
    dkdv, dq = wide.launches(q, k, v, q[..., :128], None, k, v, rows, rows, 0.1, True, cfg, PLAIN,
                             dq_acc=torch.zeros(2, 4, 200, 192))  # (q's 192 columns: ``dq_buffer_width``)
    assert dq is None and dkdv[2]["FUSED_DQ"] and list(dkdv[1][-1].block_shape) == [1, 1, 64, 64]
    # a buffer without a fused_dq config, or a fused_dq config without one: refused, never half-run
    for config, acc in ((cfg._replace(fused_dq=False), torch.zeros(2, 4, 200, 192)), (cfg, None)):
        with pytest.raises(ValueError, match="dq_acc"):
            wide.launches(q, k, v, q[..., :128], q, k, v, rows, rows, 0.1, True, config, PLAIN, dq_acc=acc)
    # runtime arguments positional, constexprs by keyword (``Launcher``'s fast path keys the latter)
    assert all(isinstance(c, (bool, int, float, str)) for c in dkdv[2].values())
    constexprs = {n: c for n, c in dkdv[2].items() if n != "num_warps"}
    inspect.signature(wide._attn_bwd_gluon_wide_kernel.fn).bind(*dkdv[1], **constexprs)
    # (no GQA split there: the wide kernels write dK and dV themselves)
    assert gluon_bwd.group_split(torch.zeros(1, 8, 65536, 192), torch.zeros(1, 1, 65536, 192), True, None, cfg) == 1


def test_mla_128_key_programs_are_picked_for_plain_causal_192_128_only():
    # The one pass's calls at q, k 192 and v 128 exactly (``takes_mla_programs``) take the 128-key programs;
    # every other head dim 256 call keeps what it took (a caller not naming q's head dim too).
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    mla, one, pair = gluon_bwd.WIDE_MLA, gluon_bwd.WIDE_ONE_PASS, gluon_bwd.WIDE_TWO_KERNELS
    assert mla.mla and mla.split_d and mla.fused_dq and mla.block_n == 128 and mla.name.endswith("-sd-mla")
    assert gluon_bwd.config_reason(256, mla) is None and not one.mla and not pair.mla
    for n in (2048, 8192):
        assert gluon_bwd.default_config(256, True, n, value_dim=128, qk_dim=192) == mla
        assert gluon_bwd.default_config(256, True, n, value_dim=128, variant=PLAIN, qk_dim=192) == mla
    for qk, dv in ((256, 128), (160, 128), (192, 64), (192, 96)):
        assert gluon_bwd.default_config(256, True, 8192, value_dim=dv, qk_dim=qk) == one, (qk, dv)
    assert gluon_bwd.default_config(256, True, 8192, value_dim=128) == one  # q's head dim not said
    cu = torch.tensor([0, 100, 333], dtype=torch.int32)
    for causal, det, variant in ((False, False, None), (True, True, None), (True, False, Variant(softcap=30.0)),
                                 (True, False, Variant(left=100)), (True, False, Variant(sinks=torch.zeros(4))),
                                 (True, False, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu))):
        assert not gluon_bwd.default_config(256, causal, 8192, det, 128, variant, qk_dim=192).mla, (causal, det, variant)
    assert wide.takes_mla_programs(192, 128, None, True) and wide.takes_mla_programs(192, 128, PLAIN, True)
    assert not wide.takes_mla_programs(192, 128, None, False) and not wide.takes_mla_programs(256, 128, None, True)
    assert "128-key programs" in gluon_bwd.path_note(PLAIN, 192, False, True, 128)
    assert "128-key programs" not in gluon_bwd.path_note(PLAIN, 256, False, True, 128)
    assert "one pass" in gluon_bwd.path_note(PLAIN, 256, False, True, 128)
    # its shared memory: Q, K at 192 columns, V, dO at 128, two dS sets, two float32 staging buffers
    want = 2 * 64 * 320 * 2 + 2 * (64 * 320 * 2 + 2 * 64 * 4) + 2 * 2 * 64 * 64 * 2 + 2 * 64 * 64 * 4
    assert gluon_bwd.shared_memory_bytes(256, mla) == want
    assert want + gluon_bwd.SMEM_SLACK <= gluon_bwd.SMEM_LIMIT


def test_mla_config_is_refused_for_other_widths_before_launch():
    mla = gluon_bwd.WIDE_MLA
    q, v = torch.zeros(1, 2, 8, 256, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="128-key programs"):
        gluon_bwd.attention_backward_gluon(v, q, q, v, v, torch.zeros(1, 2, 8), scale=0.1, causal=True, config=mla)
    q = q[..., :192].contiguous()
    with pytest.raises(ValueError, match="not causal"):
        gluon_bwd.attention_backward_gluon(v, q, q, v, v, torch.zeros(1, 2, 8), scale=0.1, causal=False, config=mla)


def test_hand_made_mla_configs_are_refused_before_launch():
    # The 128-key programs fuse dQ with two dS sets at head dim 256: any other form of the config is
    # refused by config_reason, before the row statistics or any kernel runs.
    mla = gluon_bwd.WIDE_MLA
    q, v = torch.zeros(1, 2, 8, 192, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    for cfg in (mla._replace(fused_dq=False), mla._replace(ds_bufs=1), mla._replace(split_d=False)):
        assert gluon_bwd.config_reason(256, cfg) is not None, cfg
        with pytest.raises(ValueError, match="attention_backward_gluon: config"):
            gluon_bwd.attention_backward_gluon(v, q, q, v, v, torch.zeros(1, 2, 8), scale=0.1, causal=True, config=cfg)


def test_wide_configs_ask_nothing_of_v_widths_no_kernel_runs():
    # v's head dims the kernels do not cover (kernel_head_dim None) answer "not the one pass" instead of
    # failing inside it, so the dispatch's own check names them.
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    for dv in (20, 250, 300):
        assert not wide.one_pass(dv, None, True) and not wide.takes_mla_programs(192, dv, None, True)
        assert gluon_bwd.default_config(256, True, 8192, value_dim=dv, qk_dim=192) == gluon_bwd.WIDE_TWO_KERNELS


@pytest.mark.parametrize("chunked", [False, True], ids=["one-launch", "chunked"])
def test_mla_default_reaches_the_launch_whole_and_in_chunks(monkeypatch, chunked):
    # attention_backward_gluon's default at 192 / 128 causal hands the 128-key config to every launch, GQA and
    # Nq ≠ Nk, in one launch or in chunks of KV heads (a small dQ buffer); deterministic mode gets the pair,
    # and writes_grads_into agrees with the default on out= (TMA-storable outputs, a dense batch).
    seen = []

    def fake_backward(do, q, k, v, o, lse, dlse, scale, causal, cfg, variant, out=None):
        seen.append((cfg, q.shape[1], k.shape[1]))
        return out if out is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    monkeypatch.setattr(gluon_bwd, "_backward", fake_backward)
    B, Hq, Hkv, Nq, Nk = 1, 6, 3, 100, 133
    if chunked:
        monkeypatch.setattr(gluon_bwd, "DQ_BUFFER_BYTES", B * (Hq // Hkv) * Nq * 192 * 4)
    bf = torch.bfloat16
    q, k = torch.zeros(B, Hq, Nq, 192, dtype=bf), torch.zeros(B, Hkv, Nk, 192, dtype=bf)
    v, do = torch.zeros(B, Hkv, Nk, 128, dtype=bf), torch.zeros(B, Hq, Nq, 128, dtype=bf)
    lse = torch.zeros(B, Hq, Nq)
    gluon_bwd.attention_backward_gluon(do, q, k, v, do, lse, scale=0.1, causal=True)
    assert [s[0] for s in seen] == [gluon_bwd.WIDE_MLA] * (3 if chunked else 1)
    assert [s[1:] for s in seen] == ([(2, 1)] * 3 if chunked else [(Hq, Hkv)])
    out = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    assert gluon_bwd.writes_grads_into(out, q, k, v, True)
    assert not gluon_bwd.writes_grads_into(out, q, k, v, True, Variant(seq=SEQ_RANGES,
                                            seq_q=torch.zeros(B, 2, dtype=torch.int32),
                                            seq_k=torch.zeros(B, 2, dtype=torch.int32)))
    seen.clear()
    torch.use_deterministic_algorithms(True)
    try:
        assert not gluon_bwd.writes_grads_into(out, q, k, v, True)
        gluon_bwd.attention_backward_gluon(do, q, k, v, do, lse, scale=0.1, causal=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert [s[0] for s in seen] == [gluon_bwd.WIDE_TWO_KERNELS]
    mla = gluon_bwd.WIDE_MLA  # no GQA split and no deferred dQ there: the kernel walks the group itself
    assert gluon_bwd.group_split(torch.zeros(1, 8, 65536, 192), torch.zeros(1, 1, 65536, 192), True, None, mla) == 1
    assert not gluon_bwd.defers_dq(256, mla, True)


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_mla_launch_binds_to_its_kernel_and_run_takes_it(monkeypatch):
    # One program per 128-key tile of each (batch, KV head); Q and K in 64-column boxes, V and dO at
    # 128, dQ reduce-added in 64-column boxes of the 192-column buffer; ``run`` launches it alone.
    import inspect
    import math
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    bf = torch.bfloat16
    q, k = torch.zeros(2, 4, 200, 192, dtype=bf), torch.zeros(2, 2, 333, 192, dtype=bf)
    v, do = torch.zeros(2, 2, 333, 128, dtype=bf), torch.zeros(2, 4, 200, 128, dtype=bf)
    rows = torch.zeros(2 * 4, gluon_bwd._pad_rows(200))
    mla, acc = gluon_bwd.WIDE_MLA, torch.zeros(2, 4, 200, 192)
    grid, args, kwargs = wide.mla_launch(q, k, v, do, k, v, rows, rows, 0.1, mla, acc)
    assert grid == (math.ceil(333 / 128) * 2 * 2,)
    constexprs = {n: c for n, c in kwargs.items() if n != "num_warps"}
    inspect.signature(wide._attn_bwd_gluon_mla_kernel.fn).bind(*args, **constexprs)
    assert [a.block_shape[-1] for a in args[:4]] == [64, 64, 128, 128] and list(args[6].block_shape) == [1, 1, 64, 64]
    assert constexprs["GROUP"] == 2 and constexprs["DS_BUFS"] == mla.ds_bufs and constexprs["STAGES"] == mla.stages
    for cfg, buf in ((gluon_bwd.WIDE_ONE_PASS, acc), (mla, None)):
        with pytest.raises(ValueError, match="mla config"):
            wide.mla_launch(q, k, v, do, k, v, rows, rows, 0.1, cfg, buf)
    # the kernel has no column masks, options or ranges: any other call is refused, not run
    q256, k256 = torch.zeros(2, 4, 200, 256, dtype=bf), torch.zeros(2, 2, 333, 256, dtype=bf)
    for call, kw in (((q256, k256, v, do), {}), ((q, k, v, do), dict(causal=False)),
                     ((q, k, v, do), dict(variant=Variant(softcap=30.0))),
                     ((q, k, v, do), dict(row_starts=torch.zeros(8, dtype=torch.int32)))):
        with pytest.raises(ValueError, match="plain causal calls over dense batches"):
            wide.mla_launch(*call, k, v, rows, rows, 0.1, mla, acc, **kw)
    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append((self.name, grid))
    for name in ("_attn_bwd_gluon_mla_launcher", "_attn_bwd_gluon_wide_launcher", "_attn_bwd_gluon_wide_dq_launcher"):
        monkeypatch.setattr(wide, name, Recorder(name))
    wide.run(q, k, v, do, None, k, v, rows, rows, 0.1, True, mla, PLAIN, None, acc)
    assert launched == [("_attn_bwd_gluon_mla_launcher", grid)]


def make(shape, dv, dtype, seed=0):
    """q, k (B, H, N, D), v (B, Hkv, Nk, Dv) and dO (B, Hq, Nq, Dv), random."""
    b, hq, hkv, nq, nk, d = shape
    g = torch.Generator().manual_seed(seed)

    def rand(*s):
        return torch.randn(*s, generator=g).to("cuda", dtype)
    return rand(b, hq, nq, d), rand(b, hkv, nk, d), rand(b, hkv, nk, dv), rand(b, hq, nq, dv)


SHAPES = [(2, 4, 2, 17, 17), (1, 4, 4, 4097, 4097), (1, 4, 2, 1000, 4097), (1, 2, 2, 4097, 1000)]


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d, dv", DIMS, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}:{}-q{}-k{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_and_backward_match_reference_and_portable(shape, d, dv, dtype, causal):
    from test_attention_bwd_hopper import portable_backward, reference_grads
    q, k, v, do = make(shape + (d,), dv, dtype)
    scale = d ** -0.5
    assert gluon_fwd.supported(q, k, v, causal=causal) is None
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, causal)
    assert o.shape == (*q.shape[:3], dv) and o.is_contiguous() and lse.shape == q.shape[:3]
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dtype)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    check_lse(lse, lse_ref, dtype)
    assert (o[~torch.isfinite(lse_ref)] == 0).all()

    assert gluon_bwd.supported(q, k, v, do, causal=causal) is None
    ours = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal)
    port = portable_backward(do, q, k, v, o, lse, causal)
    ref = reference_grads(q, k, v, do, causal, torch.float64)
    same = reference_grads(q, k, v, do, causal, dtype)
    for name, a, p, s, r, x in zip(("dq", "dk", "dv"), ours, port, same, ref, (q, k, v)):
        assert a.shape == x.shape and a.dtype == dtype, name
        assert_close_to_ref(a, s, r, eps=2 * EPS[dtype], what=name)
        assert_close_to_ref(a, p, r, eps=2 * EPS[dtype], what=f"{name} vs the portable backward's error")


NARROW = [(d, dv, c) for d, dv in ((192, 128), (256, 128), (192, 64)) for c in gluon_fwd.NARROW_V_CONFIGS]
NARROW += [(192, 128, K2V2), (192, 64, K2V2)]


@needs_gpu
@pytest.mark.parametrize("d, dv, config", NARROW, ids=lambda x: x.name if isinstance(x, gluon_fwd.Config) else str(x))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}:{}-q{}-k{}".format(*s))
def test_narrow_v_forward_configs_match_reference(shape, d, dv, causal, config):
    # The kernel width 256 configs for V at most 128 wide (128-key tiles, one or two K slots, V's own
    # ring; K in 64-column chunks where q's columns are fewer than 256: ``k_chunks``), bf16, against
    # float64 and the same math in bf16.
    q, k, v, _ = make(shape + (d,), dv, torch.bfloat16)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal, config=config)
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=torch.bfloat16)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[torch.bfloat16])
    check_lse(lse, lse_ref, torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("config", [*gluon_fwd.NARROW_V_CONFIGS, K2V2], ids=lambda c: c.name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_narrow_v_forward_configs_carry_their_rings_across_tiles(monkeypatch, config, causal):
    # Seven programs for 64 query tiles: each program takes several, its K and V rings (K in chunks of
    # q's 192 columns) and Q's slot running on across them; GQA 2, Nq ≠ Nk, against float64.
    monkeypatch.setattr(gluon_fwd, "gpu_sm_count", lambda device: 7)
    q, k, v, _ = make((2, 4, 2, 1000, 1500, 192), 128, torch.bfloat16, seed=6)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 192 ** -0.5, causal, config=config)
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=torch.bfloat16)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[torch.bfloat16])
    check_lse(lse, lse_ref, torch.bfloat16)


# MLA's forward with options and packed layouts through K 2 / V 2 (K in chunks of q's 192 columns):
# persistent on dense batches (7 programs, each taking several tiles), through the work queue on varlen
# and ranges ones (as the default runs them; one tile a program before).
# (name, options, v's head dim, dtype); softcap 2.5 and sinks of scale 2 move o past the tolerance.
K2V2_CASES = [("softcap-sinks", dict(softcap=2.5, sinks=True), 128, torch.bfloat16),
              ("alibi", dict(alibi="h"), 128, torch.bfloat16),
              ("window-left", dict(window=(300, None)), 128, torch.bfloat16),
              ("window-both", dict(window=(300, 40)), 128, torch.bfloat16),
              ("all", dict(window=(500, None), softcap=2.5, sinks=True, alibi="h"), 128, torch.bfloat16),
              ("all-v64-fp16", dict(window=(500, None), softcap=2.5, sinks=True, alibi="h"), 64, torch.float16),
              ("varlen", {}, 128, torch.bfloat16),
              ("varlen-all", dict(window=(300, None), softcap=2.5, sinks=True, alibi="h"), 128, torch.bfloat16),
              ("varlen-v48-fp16", dict(softcap=2.5), 48, torch.float16),
              ("ranges", {}, 128, torch.bfloat16),
              ("ranges-all-v64", dict(window=(300, None), softcap=2.5, sinks=True, alibi="h"), 64, torch.bfloat16)]


def _k2v2_options(opts, hq, g):
    """attention_reference's keyword arguments for a case: sinks' logits (scale 2) and ALiBi's slopes (Hq,)."""
    out = {name: value for name, value in opts.items() if name in ("window", "softcap")}
    if opts.get("sinks"):
        out["sinks"] = (2 * torch.randn(hq, generator=g)).to("cuda")
    if opts.get("alibi"):
        out["alibi_slopes"] = (torch.rand(hq, generator=g) * 0.05).to("cuda")
    return out


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", K2V2_CASES, ids=lambda c: c[0])
def test_k2v2_forward_with_options_and_packed_layouts(monkeypatch, case, causal):
    # Against float64: each option (ALiBi's bias, a window's bounds) and a varlen or ranges batch's
    # sequence ends in the chunked-K kernel, GQA 2, Nq ≠ Nk (causal with Nq > Nk: rows with no key, o
    # = 0); dense batches on 7 programs, each taking several tiles (the rings run on across them);
    # the options change o by more than the tolerance (so an option dropped fails); varlen and ranges
    # through the work queue, on 7 programs too.
    from test_attention_gluon_varlen import as_4d
    from test_attention_hopper import as_variant
    name, opts, dv, dt = case
    g = torch.Generator().manual_seed(8)
    hq, hkv = 4, 2
    options = _k2v2_options(opts, hq, g)
    monkeypatch.setattr(gluon_fwd, "gpu_sm_count", lambda device: 7)
    if name.startswith("varlen"):
        lens_q, lens_k = [17, 1000, 1, 2100], [40, 1000, 5, 2100]
        cq, ck = (torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
                  for lens in (lens_q, lens_k))
        q = torch.randn(sum(lens_q), hq, 192, generator=g).to("cuda", dt)
        k = torch.randn(sum(lens_k), hkv, 192, generator=g).to("cuda", dt)
        v = torch.randn(sum(lens_k), hkv, dv, generator=g).to("cuda", dt)
        variant = as_variant(as_4d(q), as_4d(k), options)._replace(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
        o, lse = gluon_fwd.attention_forward_gluon(as_4d(q), as_4d(k), as_4d(v), 192 ** -0.5, causal, variant=variant,
                                                   config=K2V2)
        o_ref, lse_ref = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal, **options)
        o_same, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal, dtype=dt, **options)
        assert_close_to_ref(o[0].transpose(0, 1), o_same.cuda(), o_ref.cuda(), eps=EPS[dt])
        check_lse(lse[0], lse_ref.cuda(), dt)
        if options:
            plain_ref, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal)
            assert (plain_ref - o_ref).abs().max() > 0.1
        return
    q, k, v, _ = make((2, hq, hkv, 1337, 1000, 192), dv, dt, seed=9)
    if name.startswith("ranges"):
        qr = torch.tensor([[3, 1000], [0, 129]], dtype=torch.int32, device="cuda")
        kr = torch.tensor([[9, 1000], [0, 700]], dtype=torch.int32, device="cuda")
        variant = as_variant(q, k, options)._replace(seq=SEQ_RANGES, seq_q=qr, seq_k=kr)
        o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 192 ** -0.5, causal, variant=variant, config=K2V2)
        for b in range(2):
            (a0, a1), (b0, b1) = qr[b].tolist(), kr[b].tolist()
            sl = [t[b:b + 1, :, r0:r1] for t, (r0, r1) in ((q, (a0, a1)), (k, (b0, b1)), (v, (b0, b1)))]
            o_ref, lse_ref = attention_reference(*sl, causal=causal, **options)
            o_same, _ = attention_reference(*sl, causal=causal, dtype=dt, **options)
            assert_close_to_ref(o[b:b + 1, :, a0:a1], o_same, o_ref, eps=EPS[dt])
            check_lse(lse[b:b + 1, :, a0:a1], lse_ref, dt)
            outside = torch.ones(q.shape[2], dtype=torch.bool, device="cuda")
            outside[a0:a1] = False
            assert (o[b][:, outside] == 0).all() and (lse[b][:, outside] == float("-inf")).all()
        return
    variant = as_variant(q, k, options)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 192 ** -0.5, causal, variant=variant, config=K2V2)
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal, **options)
    o_same, _ = attention_reference(q, k, v, causal=causal, dtype=dt, **options)
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dt])
    check_lse(lse, lse_ref, dt)
    if causal:  # bottom-right: query rows 0–336 see no key
        assert (o[:, :, :337] == 0).all()
    assert (attention_reference(q, k, v, causal=causal)[0] - o_ref).abs().max() > 0.1


@needs_gpu
@pytest.mark.parametrize("config", [None, 1], ids=["128-key-programs", "64-key-one-pass"])
def test_one_pass_wide_backward_in_chunks_matches_reference(monkeypatch, config):
    # MLA's 192 / 128 causal in one pass (dQ reduce-added in the kernel: by default the 128-key programs,
    # or the 64-key dK/dV kernel's one pass, WIDE_ONE_PASS), the float32 dQ buffer (q's 192 columns)
    # capped so the call runs in three launches over KV heads (GQA 2: each with its query heads),
    # Nq ≠ Nk: the gradients against float64, and no dQ kernel launched.
    causal = True
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    from test_attention_bwd_hopper import reference_grads
    B, Hq, Hkv, Nq, Nk = 1, 6, 3, 1000, 1337
    monkeypatch.setattr(gluon_bwd, "DQ_BUFFER_BYTES", B * (Hq // Hkv) * Nq * 192 * 4)
    monkeypatch.setattr(wide, "_attn_bwd_gluon_wide_dq_launcher", None)  # launched: a TypeError
    g = torch.Generator().manual_seed(11)
    q, k = (torch.randn(B, h, n, 192, generator=g).to("cuda", torch.bfloat16) for h, n in ((Hq, Nq), (Hkv, Nk)))
    v = torch.randn(B, Hkv, Nk, 128, generator=g).to("cuda", torch.bfloat16)
    do = torch.randn(B, Hq, Nq, 128, generator=g).to("cuda", torch.bfloat16)
    assert len(gluon_bwd.dq_buffer_chunks(B, Hq, Hkv, Nq, 192)) == 3
    widths, convert = [], gluon_bwd._dq_from_buffer

    def recording(dq_acc, *args):  # each launch's buffer: q's 192 columns, not the kernel's 256
        widths.append(dq_acc.shape)
        return convert(dq_acc, *args)
    monkeypatch.setattr(gluon_bwd, "_dq_from_buffer", recording)
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 192 ** -0.5, causal)
    ours = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=192 ** -0.5, causal=causal,
                                              config=None if config is None else gluon_bwd.CONFIGS[256][config])
    assert widths == [(B, Hq // Hkv, Nq, 192)] * 3
    ref = reference_grads(q, k, v, do, causal, torch.float64)
    same = reference_grads(q, k, v, do, causal, torch.bfloat16)
    for name, a, s_, r in zip(("dq", "dk", "dv"), ours, same, ref):
        assert_close_to_ref(a, s_, r, eps=2 * EPS[torch.bfloat16], what=name)


@needs_gpu
@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (192, 64)], ids=str)
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-dq", "deterministic"])
def test_attention_dispatch_and_views_of_one_projection(d, dv, deterministic):
    # attention() over q, k, v as views of one (B, N, H, 2·D + Dv) projection (each view's row
    # stride spans the others' columns, so a box reading past a tensor's columns would see them):
    # forward and backward on the Gluon kernels (explain() says so, naming the widths), the
    # gradients within 2% of the portable kernels' (deterministic mode: the one-writer dQ twice the
    # same bits).
    from flashattn_lite import attention, explain
    from flashattn_lite.ops import attention_bwd, attention_fwd
    B, H, N = 2, 8, 2048  # past MIN_WORK
    g = torch.Generator().manual_seed(3)
    proj = torch.randn(B, N, H, 2 * d + dv, generator=g).to("cuda", torch.bfloat16)
    q, k, v = (proj[..., a:b].transpose(1, 2) for a, b in ((0, d), (d, 2 * d), (2 * d, 2 * d + dv)))
    attention_fwd._HOPPER.clear()
    attention_bwd._HOPPER.clear()
    torch.use_deterministic_algorithms(deterministic)
    try:
        how = explain(q.requires_grad_(), k, v, causal=True)
        assert how.path == "hopper" and f"head dims {d} (q, k) and {dv} (v)" in how.reason, how
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        runs = []
        for _ in range(2 if deterministic else 1):
            out = attention(*leaves, causal=True)
            runs.append(torch.autograd.grad(out.float().square().sum(), leaves))
    finally:
        torch.use_deterministic_algorithms(False)
    assert out.shape == (B, H, N, dv)
    if deterministic:
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    with hopper.disabled():
        want_o = attention(*leaves, causal=True)
        want = torch.autograd.grad(want_o.float().square().sum(), leaves)
    assert (out.float() - want_o.float()).norm() <= 1e-2 * want_o.float().norm()
    for name, a, w in zip(("dq", "dk", "dv"), runs[0], want):
        assert (a.float() - w.float()).norm() <= 2e-2 * w.float().norm(), name
    attention_fwd._HOPPER.clear()
    attention_bwd._HOPPER.clear()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gqa_split_with_v_wider_than_q_matches_reference(monkeypatch, dtype):
    # 64 / 128 with the GQA group split (``group_split``: a program a query head, dK at q's 64
    # columns and dV at v's 128 reduce-added in float32 into the KV head's sums), causal, Nq ≠ Nk.
    from test_attention_bwd_hopper import reference_grads
    monkeypatch.setattr(gluon_bwd, "split_min_keys", lambda group, d: 0)
    q, k, v, do = make((2, 8, 2, 1000, 1037, 64), 128, dtype, seed=4)
    assert gluon_bwd.group_split(q, k, True, None, gluon_bwd.default_config(128, True, 1037)) == 4
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, 0.125, True)
    ours = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True)
    ref = reference_grads(q, k, v, do, True, torch.float64)
    same = reference_grads(q, k, v, do, True, dtype)
    for name, a, s_, r in zip(("dq", "dk", "dv"), ours, same, ref):
        assert_close_to_ref(a, s_, r, eps=2 * EPS[dtype], what=name)


@needs_gpu
@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (64, 128), (80, 48)], ids=str)
def test_varlen_matches_reference(d, dv, monkeypatch):
    # A packed batch (an empty sequence, one of one row, a partial tile): forward (the Gluon kernel,
    # o at v's width) and backward (Gluon, checked: dv's masked stores at a sequence's end keep to
    # v's columns) against the float64 varlen reference.
    import flashattn_lite as fl
    from flashattn_lite.ops import attention_bwd, attention_fwd, attention_fwd_hopper
    gluon_calls, backward, forward = [], gluon_bwd.attention_backward_gluon, gluon_fwd.attention_forward_gluon
    monkeypatch.setattr(gluon_bwd, "attention_backward_gluon",
                        lambda *a, **kw: gluon_calls.append("bwd") or backward(*a, **kw))
    monkeypatch.setattr(gluon_fwd, "attention_forward_gluon",
                        lambda *a, **kw: gluon_calls.append("fwd") or forward(*a, **kw))
    attention_fwd._HOPPER.clear()
    attention_bwd._HOPPER.clear()
    lens_q, lens_k = [1, 0, 1000, 333], [300, 0, 1000, 777]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g).to("cuda", torch.float16).requires_grad_()  # noqa: E731
    q, k, v = r(sum(lens_q), 4, d), r(sum(lens_k), 2, d), r(sum(lens_k), 2, dv)
    do = torch.randn(sum(lens_q), 4, dv, generator=g).to("cuda", torch.float16)
    old, attention_fwd_hopper.MIN_WORK = attention_fwd_hopper.MIN_WORK, 0
    try:
        o = fl.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
    finally:
        attention_fwd_hopper.MIN_WORK = old
        attention_fwd._HOPPER.clear()
        attention_bwd._HOPPER.clear()
    assert gluon_calls == ["fwd", "bwd"]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = attention_varlen_reference(*leaves, cu_q, cu_k, causal=True)
    ref = torch.autograd.grad(o_ref, leaves, do.double())
    assert o.shape == (sum(lens_q), 4, dv)
    assert (o.double() - o_ref).abs().max() <= 2e-2
    for name, a, w in zip(("dq", "dk", "dv"), grads, ref):
        assert (a.double() - w).norm() <= 1e-2 * w.norm(), name


@needs_gpu
@pytest.mark.parametrize("shape", [(1, 4, 4, 1000, 1000), (1, 4, 2, 2047, 2047), (2, 2, 1, 4097, 4097),
                                   (1, 4, 2, 1000, 1337), (1, 2, 2, 64, 64), (1, 2, 2, 129, 129)],
                         ids=lambda s: "b{}-h{}:{}-q{}-k{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mla_128_key_programs_match_reference_and_the_64_key_one_pass(shape, dtype):
    # MLA's 192 / 128 causal as 128-key programs (the default there): against float64, and within
    # rounding of the 64-key one pass (dK, dV: the same sums in the same order but P through shared
    # memory; dQ: float32 adds in another order), MHA and GQA, odd lengths, Nq < Nk.
    from test_attention_bwd_hopper import reference_grads
    q, k, v, do = make(shape + (192,), 128, dtype, seed=7)
    scale = 192 ** -0.5
    assert gluon_bwd.default_config(256, True, max(shape[3:]), False, 128, None, qk_dim=192).mla
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, scale, True)
    ours = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=True)
    old = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=True,
                                             config=gluon_bwd.WIDE_ONE_PASS)
    ref = reference_grads(q, k, v, do, True, torch.float64)
    same = reference_grads(q, k, v, do, True, dtype)
    for name, a, b, s_, r in zip(("dq", "dk", "dv"), ours, old, same, ref):
        assert a.shape == b.shape and a.dtype == dtype, name
        assert_close_to_ref(a, s_, r, eps=2 * EPS[dtype], what=name)
        diff = (a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)
        assert diff < 4 * EPS[dtype], f"{name}: {diff:.2e} from the 64-key one pass"
