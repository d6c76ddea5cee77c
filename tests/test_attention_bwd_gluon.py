"""The Gluon backward (ops/attention_bwd_gluon.py, warp-specialized wgmma + TMA, dQ by TMA reduce-add):
against float64 reference gradients and the portable backward, on the same saved o and lse.

GPU tests run on an sm_90 GPU with triton 3.6 only (Gluon kernels do not run in the Triton
interpreter); elsewhere they are skipped, saying why. The CPU tests check what the host decides
without launching the kernel (supported(), configs, the launch plan, the padded row statistics, the
dq conversion) and, in float64, a model of the kernel's schedule: which query tiles each key tile
visits, where it masks, how the GQA group and the dQ columns are split — the index math the kernel
does, written out once more in Python.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, ON_GPU, assert_close_to_ref, model_only
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
from flashattn_lite.ops.attention_bwd_gluon import query_tiles as gluon_query_tiles
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_DENSE, SEQ_RANGES, SEQ_VARLEN, Variant
from flashattn_lite.ops.attention_fwd_gluon import window_flags
from flashattn_lite.reference import attention_reference
from test_attention_gluon import SHAPES  # the forward's: lengths 1, 17, 1000, 4097, Nq ≠ Nk, GQA 2:1
from test_attention_hopper import EPS


def _cannot_run() -> str | None:
    if not ON_GPU:
        return "Gluon kernels need a CUDA GPU (no interpreter)"
    if torch.cuda.get_device_capability()[0] != 9:
        return "the Gluon backward needs an sm_90 GPU"
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16, device="cuda")
    return gluon_bwd.supported(q, q, q, q)


REASON = _cannot_run()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))


# ---------------------------------------------------------------------------------------------
# CPU: host logic
# ---------------------------------------------------------------------------------------------

def test_module_imports_and_says_why_not():
    # On any machine: the module imports (Gluon guarded) and supported() answers in words.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    reason = gluon_bwd.supported(q, q, q, q, causal=True)
    if not ON_GPU:
        assert isinstance(reason, str) and reason


def test_refuses_the_variant_options():
    # Windows, softcap, ALiBi and sinks are taken, ranges and varlen layouts too
    # (test_attention_bwd_gluon_varlen.py); an unknown layout or a non-Variant is refused, said
    # before anything about the device; PLAIN and None are plain.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    refused = ((Variant(seq=7), "layout"), (Variant(left=16, seq=7), "layout"), ((3, 0), "Variant"))
    for variant, why in refused:
        assert why in gluon_bwd.supported(q, q, q, q, variant=variant)
        with pytest.raises(ValueError, match=why):
            gluon_bwd.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.125, causal=False,
                                               variant=variant)
    for variant in (None, PLAIN, Variant(softcap=30.0), Variant(sinks=torch.zeros(2)),
                    Variant(alibi=torch.zeros(2), softcap=5.0, sinks=torch.zeros(2)), Variant(left=16),
                    Variant(right=0, softcap=30.0), Variant(seq=SEQ_RANGES)):
        assert gluon_bwd._variant_reason(variant) is None
        reason = gluon_bwd.supported(q, q, q, q, variant=variant)
        assert reason is None or not any(word in reason for word in ("window", "ranges", "plain attention"))


def test_which_dq_kernel_a_one_writer_config_takes():
    # Without the fused dQ, dq comes from a kernel with one writer per element: the Triton TMA one
    # for plain scores over a dense batch (sinks, and a causal call's window without a left side,
    # the diagonal, leave them plain), the portable one for softcap, ALiBi, windows, ranges, varlen.
    covers = gluon_bwd._tma_dq_covers
    assert covers(None, False) and covers(PLAIN, True) and covers(Variant(sinks=torch.zeros(2)), False)
    assert covers(PLAIN, True, 64) and not covers(PLAIN, True, 96) and not covers(None, False, 48)  # padded
    assert covers(Variant(right=3), True) and not covers(Variant(right=3), False)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    for variant in (Variant(softcap=30.0), Variant(alibi=torch.zeros(2)), Variant(left=5), Variant(left=5, right=0),
                    Variant(seq=SEQ_RANGES, seq_q=torch.tensor([[0, 8]]), seq_k=torch.tensor([[0, 8]])),
                    Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)):
        assert not covers(variant, True) and not covers(variant, False), variant


@pytest.mark.parametrize("layout, causal", [("dense", True), ("dense", False), ("ranges", True), ("varlen", True),
                                            ("varlen", False)])
def test_attention_dq_is_the_portable_backwards_dq(layout, causal):
    # The one-writer configs' dq where the TMA dQ kernel does not reach (``attention_bwd.attention_dq``)
    # is the portable backward's dQ launch on its own: the same bits, with a window (two-sided without
    # causal), softcap, ALiBi and sinks, over a dense batch (Nq ≠ Nk), a padded (ranges) and a packed
    # (varlen) one; every row it owns written (dq starts as NaN where the caller allocates it empty).
    from flashattn_lite.ops import attention_bwd, attention_fwd
    from flashattn_lite.ops.attention_bwd import row_stats
    g = torch.Generator(device=DEVICE).manual_seed(11)
    Hq, Hkv, D = 4, 2, 32
    lengths = [37, 70, 5]
    if layout == "varlen":
        total = sum(lengths)
        q, do = (torch.randn(total, Hq, D, generator=g, device=DEVICE).half().transpose(0, 1).unsqueeze(0)
                 for _ in range(2))
        k, v = (torch.randn(total, Hkv, D, generator=g, device=DEVICE).half().transpose(0, 1).unsqueeze(0)
                for _ in range(2))
        cu = torch.tensor([0, 37, 107, 112], dtype=torch.int32, device=DEVICE)
        seq = dict(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    else:
        q, do = (torch.randn(3, Hq, 70, D, generator=g, device=DEVICE).half() for _ in range(2))
        k, v = (torch.randn(3, Hkv, 75, D, generator=g, device=DEVICE).half() for _ in range(2))
        ranges = torch.tensor([[0, 70], [33, 70], [60, 65]], dtype=torch.int32, device=DEVICE)
        seq = {} if layout == "dense" else dict(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges + 5)
    variant = Variant(left=20, right=-1 if causal else 7, softcap=4.0,
                      sinks=torch.randn(Hq, generator=g, device=DEVICE),
                      alibi=torch.rand(Hq, generator=g, device=DEVICE) * 0.3, **seq)
    offset = k.shape[2] - q.shape[2] if layout == "dense" else 0
    call = dict(scale=D ** -0.5, causal=causal)
    o, lse = attention_fwd.attention_forward(q, k, v, **call, causal_offset=offset, mask=None, dropout_p=0.0,
                                             seed=0, variant=variant)
    want = attention_bwd.attention_backward(do, q, k, v, o, lse, None, **call, causal_offset=offset, mask=None,
                                            dropout_p=0.0, seed=0, variant=variant)[0]
    delta, lse2 = row_stats(do, o, lse, None)
    dq = torch.zeros_like(q) if layout == "ranges" else torch.full_like(q, float("nan"))
    attention_bwd.attention_dq(do, q, k, v, dq, lse2, delta, **call, variant=variant)
    assert torch.isfinite(dq).all() and dq.abs().max() > 0
    assert torch.equal(dq, want)


def test_option_arguments_are_none_unless_used():
    # What a launch does not use is None (a constexpr the launch drops): a plain call and a call with
    # sinks only compile to the plain kernel; softcap and ALiBi pass their scalars and flags as the
    # portable kernels take them (score_args).
    q = torch.zeros(2, 4, 8, 64, dtype=torch.float16)
    plain_flags = dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, ALIBI=False, FAST_TANH=False)
    for variant, causal in ((PLAIN, False), (None, True), (Variant(sinks=torch.zeros(4)), False),
                            (Variant(right=5), True), (Variant(right=0), True)):
        args, flags = gluon_bwd._option_args(variant, q, 0.125, causal)
        assert args == (None,) * 7 and flags == plain_flags
    slopes = torch.rand(2, 4, dtype=torch.float64)
    args, flags = gluon_bwd._option_args(Variant(softcap=4.0, alibi=slopes, sinks=torch.zeros(4)), q, 0.125)
    win_left, win_right, alibi, stride_b, stride_h, softcap_scale, softcap2 = args
    assert (win_left, win_right) == (None, None) and alibi is slopes and (stride_b, stride_h) == slopes.stride()
    assert softcap_scale == 0.125 / 4.0 and softcap2 == pytest.approx(4.0 * 1.4426950408889634)
    assert flags["SOFTCAP"] and flags["ALIBI"]
    args, flags = gluon_bwd._option_args(Variant(alibi=torch.rand(4)), q, 0.125)
    assert args[3:] == (0, 1, None, None) and flags == dict(plain_flags, ALIBI=True)
    plan = gluon_bwd.launch_plan(q, q, gluon_bwd.CONFIGS[64][0], True, Variant(softcap=4.0))
    assert plan["constexprs"]["SOFTCAP"] and not plan["constexprs"]["ALIBI"]


def test_path_note_names_the_options():
    every = Variant(softcap=3.0, alibi=torch.zeros(4), sinks=torch.zeros(4))
    assert gluon_bwd.path_note(PLAIN) == gluon_bwd.PATH_NOTE == gluon_bwd.path_note(None)
    note = gluon_bwd.path_note(every)
    assert "Gluon warp-specialized backward" in note and all(w in note for w in ("softcap", "ALiBi", "sinks"))
    assert "softcap" not in gluon_bwd.path_note(Variant(sinks=torch.zeros(4)))
    wide = gluon_bwd.path_note(every, 256)  # head dim 256: its own two kernels, no reduce-add
    assert "dK/dV and dQ kernels" in wide and "reduce-add" not in wide and "softcap" in wide
    for deterministic in (False, True):  # 192 runs padded on the same two kernels, deterministic or not
        padded = gluon_bwd.path_note(PLAIN, 192, deterministic)
        assert "dK/dV and dQ kernels" in padded and "head dim 192 run at 256" in padded and "reduce-add" not in padded
    # Deterministic mode: dq by the portable one-writer kernel, but where the scores are plain (sinks,
    # a causal call's diagonal window), which the TMA dQ kernel takes; never the reduce-add.
    one_writer = gluon_bwd.path_note(every, 128, deterministic=True)
    assert "portable one-writer dQ" in one_writer and "reduce-add" not in one_writer and "softcap" in one_writer
    sinks = Variant(sinks=torch.zeros(4))
    tma = gluon_bwd.path_note(sinks, 128, True)
    assert "TMA one-writer dQ" in tma and "reduce-add" not in tma and "sinks" in tma
    assert "reduce-add" in gluon_bwd.path_note(sinks)
    diagonal = Variant(right=0, sinks=torch.zeros(4))
    assert "TMA one-writer dQ" in gluon_bwd.path_note(diagonal, 128, True, causal=True)
    assert "portable" in gluon_bwd.path_note(diagonal, 128, True, causal=False)
    # Every head dim the dispatch may ask about, q's and v's apart: below 256 no wide config is consulted.
    for d, dv, causal in [(16, None, True), (40, 24, True), (64, 16, True), (128, None, True), (100, 64, False)]:
        assert gluon_bwd.path_note(PLAIN, d, False, causal, dv) == gluon_bwd.PATH_NOTE
    assert "128-key programs" in gluon_bwd.path_note(PLAIN, 192, False, True, 128)
    assert "128-key programs" not in gluon_bwd.path_note(PLAIN, 192, False, False, 128)


def test_configs_fit_and_default_is_swept():
    for d, configs in gluon_bwd.CONFIGS.items():
        assert d in gluon_bwd.HEAD_DIMS and configs
        assert len({c.name for c in configs}) == len(configs)
        for causal in (False, True):
            for n in (2048, 8192, 16384):
                assert gluon_bwd.default_config(d, causal, n) in configs
        for cfg in configs:
            assert gluon_bwd.config_reason(d, cfg) is None, cfg.name
            assert cfg.block_n == (64 if cfg.split_d and not cfg.mla else 128)  # (MLA's 128-key programs)
            # (the head dim 256 one pass's 32 KB of dQ staging is not in the model: it fits beside V's
            # narrower boxes only, ``one_pass``, as its offline compile showed)
            assert gluon_bwd.shared_memory_bytes(d, cfg) + gluon_bwd.SMEM_SLACK <= gluon_bwd.SMEM_LIMIT


def test_shared_memory_model():
    # The offline sm_90 compile (triton 3.6) allotted these bytes; the model is within the slack.
    compiled = {(64, gluon_bwd.Config(2, 64, 3, True, 2)): 149504, (64, gluon_bwd.Config(2, 64, 3, False)): 83840,
                (128, gluon_bwd.Config(2, 64, 2, True, 2)): 198112, (128, gluon_bwd.Config(2, 64, 2, False)): 132448,
                (256, gluon_bwd.Config(2, 64, 2, False, 1, split_d=True)): 214464,
                (256, gluon_bwd.WIDE_MLA): 230880}  # (MLA's 128-key programs)
    for (d, cfg), smem in compiled.items():
        model = gluon_bwd.shared_memory_bytes(d, cfg)
        assert model <= smem <= model + gluon_bwd.SMEM_SLACK, cfg.name


@pytest.mark.skipif(not gluon_bwd._HAS_GLUON, reason="this triton has no Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256_launches_bind_to_their_kernels(causal):
    # The two d 256 kernels' launches (built on the CPU, as benchmarks/ptx_hashes.py compiles them):
    # every argument binds to a parameter of its kernel, the grids are one program per 64-key tile
    # of each (batch, KV head) and per 64-query tile of each (batch, query head), and the options
    # reach both kernels as constexprs.
    import inspect
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    B, Hq, Hkv, Nq, Nk, D = 2, 4, 2, 200, 333, 256
    q = torch.zeros(B, Hq, Nq, D, dtype=torch.bfloat16)
    k = torch.zeros(B, Hkv, Nk, D, dtype=torch.bfloat16)
    rows = torch.zeros(B * Hq, gluon_bwd._pad_rows(Nq))
    cfg = gluon_bwd.default_config(D, causal, Nk)
    variant = Variant(softcap=3.0, left=50)
    dkdv, dq = wide.launches(q, k, k, q, q, k, k, rows, rows, 0.1, causal, cfg, variant)
    launches = [(wide._attn_bwd_gluon_wide_kernel, dkdv, (math.ceil(Nk / 64) * B * Hkv,)),
                (wide._attn_bwd_gluon_wide_dq_kernel, dq, (math.ceil(Nq / 64) * B * Hq,))]
    for kernel, (grid, args, kwargs), want in launches:
        assert grid == want
        constexprs = {n: v for n, v in kwargs.items() if n != "num_warps"}
        inspect.signature(kernel.fn).bind(*args, **constexprs)  # a TypeError if they do not match
        assert constexprs["GROUP"] == Hq // Hkv and constexprs["HEAD_DIM"] == D and constexprs["CAUSAL"] is causal
        assert constexprs["SOFTCAP"] and constexprs["HAS_LEFT"] and not constexprs["ALIBI"]
    assert launches[1][1][2]["STAGES"] == wide.DQ_STAGES


@pytest.mark.parametrize("cfg, why", [
    (gluon_bwd.Config(1, 64, 2, True), "two consumers"),
    (gluon_bwd.Config(2, 128, 2, True), "64-row query tiles"),
    (gluon_bwd.Config(2, 64, 2, True, 3), "dS sets"),
    (gluon_bwd.Config(2, 64, 4, True, 2), "shared memory"),
    (gluon_bwd.WIDE_TWO_KERNELS, "split-head-dim"),
])
def test_bad_config_is_refused_before_launch(cfg, why):
    assert why in gluon_bwd.config_reason(128, cfg)
    q = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=why):
        gluon_bwd.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.1, causal=True, config=cfg)
    assert "head dim" in gluon_bwd.config_reason(96, gluon_bwd.CONFIGS[64][0])


def test_head_dim_256_takes_the_split_head_dim_kernel_only():
    # D 256's dK and dV do not fit a consumer's registers whole: only the split-head-dim configs run
    # there, and they run nowhere else. The default computes dq in its own kernel (no float32
    # reduce-adds: deterministic too).
    wide = gluon_bwd.default_config(256, True, 8192)
    assert wide.split_d and wide.block_n == 64 and wide.name.endswith("-wdq-r240-sd") and not wide.fused_dq
    for cfg in gluon_bwd.CONFIGS[256]:
        assert cfg.split_d and gluon_bwd.config_reason(256, cfg) is None
        for d in (64, 128):
            assert "split-head-dim" in gluon_bwd.config_reason(d, cfg)
    q256 = torch.zeros(1, 2, 8, 256, dtype=torch.bfloat16)
    for cfg in (gluon_bwd.CONFIGS[128][0], wide._replace(ds_bufs=2)):
        assert gluon_bwd.config_reason(256, cfg) is not None
        with pytest.raises(ValueError, match="head dim 256"):  # before anything runs
            gluon_bwd.attention_backward_gluon(q256, q256, q256, q256, q256, torch.zeros(1, 2, 8), scale=0.1,
                                               causal=True, config=cfg)
    assert gluon_bwd.default_config(256, True, 8192, deterministic=True) == wide
    # The one pass (dQ reduce-added by the dK/dV kernel) is a config of the sweep: the default picks it
    # exactly where ``one_pass`` takes the call, so passing the default by hand runs the same kernels.
    one = gluon_bwd.WIDE_ONE_PASS
    assert one.split_d and one.fused_dq and gluon_bwd.config_reason(256, one) is None
    assert gluon_bwd.default_config(256, True, 8192, value_dim=128) == one
    assert gluon_bwd.default_config(256, True, 8192, value_dim=128, variant=PLAIN) == one
    for causal, dv, variant, det in ((False, 128, None, False), (True, 256, None, False), (True, 192, None, False),
                                     (True, 128, Variant(softcap=30.0), False), (True, 128, None, True)):
        assert gluon_bwd.default_config(256, causal, 8192, det, dv, variant) == wide, (causal, dv, variant, det)
        note = gluon_bwd.path_note(variant or PLAIN, 192, det, causal, dv)
        assert "one pass" not in note, note
    assert "one pass" in gluon_bwd.path_note(PLAIN, 192, False, True, 128)
    # and refused for a call the one pass does not take, naming why (v 256 wide: its dQ staging would
    # not fit; not causal; options; ranges or varlen: never run on the GPU in one pass)
    for causal in (True, False):
        with pytest.raises(ValueError, match="one pass.*pads above 128" if causal else "one pass.*not causal"):
            gluon_bwd.attention_backward_gluon(q256, q256, q256, q256, q256, torch.zeros(1, 2, 8), scale=0.1,
                                               causal=causal, config=one)
    q, v = torch.zeros(1, 2, 8, 192, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    rows = torch.tensor([[0, 8]], dtype=torch.int32)
    for variant in (Variant(softcap=30.0), Variant(alibi=torch.zeros(2)), Variant(sinks=torch.zeros(2)),
                    Variant(left=4), Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu),
                    Variant(seq=SEQ_RANGES, seq_q=rows, seq_k=rows)):
        with pytest.raises(ValueError, match="one pass.*options"):
            gluon_bwd.attention_backward_gluon(v, q, q, v, v, torch.zeros(1, 2, 8), scale=0.1, causal=True,
                                               config=one, variant=variant)
    q = torch.zeros(2, 4, 100, 256, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 100, 256, dtype=torch.bfloat16)
    assert gluon_bwd.group_split(q, k, True, None, wide) == 1
    assert not gluon_bwd.defers_dq(256, wide, False)


@pytest.mark.parametrize("causal", [False, True])
def test_launch_plan(causal):
    # One program per 128-key tile of each (batch, KV head); the group in the kernel's loop; lse₂/δ
    # rows padded to whole 128-row tiles; the fp32 dQ buffer only with fused dQ.
    q = torch.zeros(2, 8, 1000, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 1037, 64, dtype=torch.bfloat16)
    fused, triton_dq = gluon_bwd.CONFIGS[64][0], gluon_bwd.CONFIGS[64][-1]
    plan = gluon_bwd.launch_plan(q, k, fused, causal)
    assert plan["grid"] == (math.ceil(1037 / 128) * 2 * 2,)
    assert plan["constexprs"]["GROUP"] == 4 and plan["constexprs"]["CAUSAL"] is causal
    assert plan["constexprs"]["FUSED_DQ"] and plan["constexprs"]["DS_BUFS"] == fused.ds_bufs
    assert plan["row_stats_shape"] == (16, 1024)
    assert plan["dq_acc_shape"] == (2, 8, 1000, 64)
    plan = gluon_bwd.launch_plan(q, k, triton_dq, causal)
    assert plan["dq_acc_shape"] is None and not plan["constexprs"]["FUSED_DQ"]
    assert plan["constexprs"]["DS_BUFS"] == 1


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_row_stats_are_padded(layout):
    # δ and lse₂ (the interpreter runs the kernel here), padded rows δ = 0 and lse₂ = +inf (P = 0
    # there); a row with no key (lse −inf) gets lse₂ +inf; dlse folds into δ; the fp32 dQ buffer,
    # allocated empty, comes back zeroed by the same pass; o and dO in either head layout.
    g = torch.Generator().manual_seed(0)
    o, do = (torch.randn(2, 3, 20, 64, generator=g).half().to(DEVICE) for _ in range(2))
    if layout == "bnhd":
        o, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (o, do))
    lse = torch.randn(2, 3, 20, generator=g)
    lse[0, 1, 3] = -math.inf
    lse, dlse = lse.to(DEVICE), torch.randn(2, 3, 20, generator=g).to(DEVICE)
    dq_acc = torch.full((2, 3, 20, 64), math.nan, device=DEVICE)
    (delta_pad, lse2_pad), (delta, lse2) = gluon_bwd._row_stats(do, o, lse, dlse, 128, dq_acc)
    want_delta = (do.float() * o.float()).sum(-1) - dlse
    assert delta_pad.shape == lse2_pad.shape == (6, 128)
    torch.testing.assert_close(delta_pad[:, :20], want_delta.reshape(6, 20), rtol=1e-5, atol=1e-5)
    want_lse2 = torch.where(lse == -math.inf, math.inf, lse * 1.4426950408889634)
    torch.testing.assert_close(lse2_pad[:, :20], want_lse2.reshape(6, 20))
    assert lse2_pad[1, 3] == math.inf
    assert (delta_pad[:, 20:] == 0).all() and (lse2_pad[:, 20:] == math.inf).all()
    assert torch.equal(delta, delta_pad.view(2, 3, 128)[:, :, :20]) and torch.equal(lse2, want_lse2)
    assert (dq_acc == 0).all()
    (delta_pad2, _), _ = gluon_bwd._row_stats(do, o, lse, None, 128)  # no dlse, no buffer
    torch.testing.assert_close(delta_pad2[:, :20], (want_delta + dlse).reshape(6, 20), rtol=1e-5, atol=1e-5)


def test_a_dq_buffer_of_q_columns_is_zeroed_and_converted_within_its_rows():
    # The head dim 256 one pass reduce-adds only q's qk_width (192 at MLA) columns: its fp32 buffer
    # is that wide, no power of two. The row statistics' pass zeroes exactly it (the storage's
    # guard floats past it stay NaN), and the conversion reads its 192-float rows into dq.
    assert [gluon_bwd.dq_buffer_width(d, 256) for d in (136, 192, 256)] == [192, 192, 256]
    assert [gluon_bwd.dq_buffer_width(d, 128) for d in (48, 64, 96, 128)] == [64, 64, 128, 128]
    g = torch.Generator().manual_seed(3)
    o, do = (torch.randn(1, 2, 20, 128, generator=g).half().to(DEVICE) for _ in range(2))
    lse = torch.randn(1, 2, 20, generator=g).to(DEVICE)
    storage = torch.full((2 * 20 * 192 + 64,), math.nan, device=DEVICE)
    dq_acc = storage[:2 * 20 * 192].view(1, 2, 20, 192)
    gluon_bwd._row_stats(do, o, lse, None, 128, dq_acc)
    assert (dq_acc == 0).all() and torch.isnan(storage[-64:]).all()
    want = torch.randn(1, 2, 20, 192, generator=g).to(DEVICE)
    q = torch.empty(1, 20, 2, 192, dtype=torch.float16, device=DEVICE).transpose(1, 2)
    dq = gluon_bwd._dq_from_buffer(want, q, False)
    assert dq.stride() == q.stride()
    torch.testing.assert_close(dq.float(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_dq_conversion_keeps_q_layout(d, spread):
    # dq is empty_like(q) (q's strides, q's dtype) filled from the fp32 buffer (the interpreter runs
    # the conversion kernel), whose columns a deferring kernel stages in _spread_banks' order:
    # column j of a 32-column span (16-byte chunk c = j // 4) sits at 16·(c mod 2) + 4·(c // 2) +
    # j mod 4, written out here once more. 17 rows: a partial block of rows.
    q = torch.randn(2, 17, 3, d).to(torch.float16).transpose(1, 2).to(DEVICE)  # (B, H, N, D) over (B, N, H, D)
    want = torch.randn(q.shape).to(DEVICE)
    j = torch.arange(d)
    c = (j % 32) // 4
    acc = torch.full_like(want, math.nan)
    acc[..., j // 32 * 32 + 16 * (c % 2) + 4 * (c // 2) + j % 4 if spread else j] = want
    dq = gluon_bwd._dq_from_buffer(acc, q, spread)
    assert dq.stride() == q.stride() and dq.dtype == q.dtype
    torch.testing.assert_close(dq.float(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("d, padded", [(96, 128), (80, 128), (48, 64)])
def test_dq_conversion_of_a_padded_buffer(d, padded, spread):
    # A head dim run padded (``kernel_head_dim``): the fp32 buffer is the kernel's width, dq q's; the
    # conversion writes dq's d columns from the buffer's (in _spread_banks' order where staged so)
    # and nothing past them: dq here is a view into wider rows whose other columns must stay NaN.
    assert gluon_bwd.kernel_head_dim(d) == padded
    acc = torch.randn(2, 3, 17, padded).to(DEVICE)
    wide = torch.randn(2, 3, 17, padded).to(torch.float16).to(DEVICE)
    want = gluon_bwd._dq_from_buffer(acc, wide, spread)[..., :d]
    rows = torch.full((2, 3, 17, padded + 8), math.nan, dtype=torch.float16, device=DEVICE)
    dq = gluon_bwd._dq_from_buffer(acc, rows[..., :d], spread, rows[..., :d])
    assert torch.equal(dq, want) and torch.isnan(rows[..., d:]).all()


def test_kernel_head_dims_and_their_launch(monkeypatch):
    # Multiples of 8 between 32 and 128 run at 64 or 128 (the forward's ``padded_head_dim``), 256
    # only as itself; a padded launch's boxes and fp32 dQ buffer are the kernel's width, and a
    # varlen or ranges launch passes D_REAL for its masked stores (a dense one does not: its stores
    # are TMA's, which drop the columns past d).
    want = {40: 64, 48: 64, 64: 64, 72: 128, 96: 128, 120: 128, 128: 128, 136: 256, 192: 256, 248: 256, 256: 256}
    assert all(gluon_bwd.kernel_head_dim(d) == p for d, p in want.items())
    assert all(gluon_bwd.kernel_head_dim(d) is None for d in (16, 32, 36, 100, 260, 264))
    monkeypatch.setattr(gluon_bwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_bwd, "_HAS_GLUON", True)
    q = torch.zeros(1, 2, 8, 100, dtype=torch.float16)
    assert "head dim 100" in gluon_bwd.supported(q, q, q, q)
    q, k = torch.zeros(2, 4, 300, 96), torch.zeros(2, 2, 300, 96)
    cfg = gluon_bwd.default_config(128, True, 300)
    plan = gluon_bwd.launch_plan(q, k, cfg, True)
    assert plan["constexprs"]["HEAD_DIM"] == 128 and "D_REAL" not in plan["constexprs"]
    assert plan["dq_acc_shape"] == (2, 4, 300, 128)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    assert gluon_bwd.launch_plan(q[:1], k[:1], cfg, True, varlen)["constexprs"]["D_REAL"] == 96


@pytest.mark.parametrize("B, Hq, Hkv, Nq, D, cap, want", [
    (1, 16, 16, 1024, 128, 256 << 20, [(None, None, 0, 16)]),  # 8 MiB: one launch
    (1, 16, 16, 524288, 128, 256 << 20, [(None, None, h, h + 1) for h in range(16)]),  # 256 MiB a head
    (2, 8, 2, 65536, 128, 256 << 20, [(None, None, 0, 1), (None, None, 1, 2)]),  # 4 query heads · 2 rows: 256 MiB
    (4, 4, 4, 100_000, 64, 60 << 20, [(b, b + 2, h, h + 1) for h in range(4) for b in (0, 2)]),  # rows split
    (3, 2, 1, 1_000_000, 128, 256 << 20, [(b, b + 1, 0, 1) for b in range(3)]),  # over the cap: one row each
    (1, 6, 3, 5000, 64, 5000 * 64 * 4 * 2 * 2, [(None, None, 0, 2), (None, None, 2, 3)])])  # a short last chunk
def test_dq_buffer_chunks(monkeypatch, B, Hq, Hkv, Nq, D, cap, want):
    # Chunks of (batch rows, KV heads) whose fp32 dQ buffer fits the cap (or one KV head of one
    # row, whatever its size), covering every (row, KV head) once, all rows together where they fit.
    monkeypatch.setattr(gluon_bwd, "DQ_BUFFER_BYTES", cap)
    chunks = gluon_bwd.dq_buffer_chunks(B, Hq, Hkv, Nq, D)
    assert [(r.start, r.stop, h.start or 0, h.stop or Hkv) for r, h in chunks] == want
    cells = [(b, h) for r, kv in chunks for b in range(B)[r] for h in range(Hkv)[kv]]
    assert sorted(cells) == [(b, h) for b in range(B) for h in range(Hkv)]
    for r, kv in chunks:
        size = len(range(B)[r]) * len(range(Hkv)[kv]) * (Hq // Hkv) * Nq * D * 4
        assert size <= cap or (len(range(B)[r]), len(range(Hkv)[kv])) == (1, 1)


def test_defers_dq_where_no_step_is_masked():
    # d 64 always (the consumers take turns by step); d 128 only where no step is masked.
    cfg = gluon_bwd.default_config(128)
    assert gluon_bwd.defers_dq(64, gluon_bwd.default_config(64), causal=True)
    assert gluon_bwd.defers_dq(128, cfg, causal=False)
    assert not gluon_bwd.defers_dq(128, cfg, causal=True)
    assert not gluon_bwd.defers_dq(128, cfg, causal=False, variant=Variant(left=100))
    ranges = torch.tensor([[0, 5]], dtype=torch.int32)
    assert not gluon_bwd.defers_dq(128, cfg, causal=False, variant=Variant(seq=SEQ_RANGES, seq_q=ranges,
                                                                          seq_k=ranges))
    assert gluon_bwd.defers_dq(128, cfg, causal=False, variant=Variant(softcap=30.0, sinks=torch.zeros(3)))


def _staging_wavefronts(spread: bool) -> set[int]:
    """Shared-memory wavefronts of each half-warp's 8-byte store when a consumer stages its dQ block
    (64 × 64 fp32, the wgmma accumulator layout) into the 128-byte-swizzled buffer, modelled: thread
    (warp w, lane l) holds rows 16w + l // 4 (+ 8) and column pairs 8g + 2·(l mod 4) (+ 1), g < 8;
    the buffer is two 32-column sub-tiles of 128-byte rows, chunk c of row r stored at c XOR (r mod 8);
    ``spread``: ``_spread_banks``' order, chunk 2a + b of a span at 4b + a. The set of wavefront
    counts over all store instructions (one per (w, row half, g)); 1 is the ideal."""
    counts = set()
    for w in range(4):
        for half in range(2):
            for g in range(8):
                for lanes in (range(0, 16), range(16, 32)):
                    words = set()
                    for lane in lanes:
                        row = 16 * w + 8 * half + lane // 4
                        for col in (8 * g + 2 * (lane % 4), 8 * g + 2 * (lane % 4) + 1):
                            c = col % 32 // 4
                            if spread:
                                c = 4 * (c % 2) + c // 2
                            line = col // 32 * 64 + row
                            words.add(line * 32 + (c ^ line % 8) * 4 + col % 4)
                    banks = [word % 32 for word in words]
                    counts.add(max(banks.count(bank) for bank in set(banks)))
    return counts


def test_spread_staging_covers_the_banks_once():
    # The reason for _spread_banks: in the plain order rows r and r ^ 1 of a half-warp put their
    # chunk pair on the same banks (two wavefronts a store); spread, every store takes one.
    assert _staging_wavefronts(spread=False) == {2}
    assert _staging_wavefronts(spread=True) == {1}


# ---------------------------------------------------------------------------------------------
# CPU: the kernel's schedule, modelled in float64
# ---------------------------------------------------------------------------------------------

@triton.jit
def _banded_key_tile_kernel(out, n_key_tiles, band, banded_heads):
    pid = tl.program_id(0)
    bh, tile = gluon_bwd.banded_key_tile(pid, tl.num_programs(0), n_key_tiles, band, banded_heads)
    tl.store(out + 2 * pid, bh)
    tl.store(out + 2 * pid + 1, tile)


@pytest.mark.parametrize("n_heads, n_key_tiles, band, banded", [(3, 7, 2, 3), (5, 16, 4, 2), (2, 9, 9, 2), (4, 1, 1, 4),
                                                                (3, 10, 3, 1), (1, 5, 8, 1), (4, 6, 2, 0)])
def test_banded_key_tile_order(n_heads, n_key_tiles, band, banded):
    # The kernel's program → (head, key tile) map, run by the interpreter (or the GPU): every pair
    # exactly once; the first heads head by head, heaviest (lowest) tile first; then the last
    # ``banded`` heads in bands: band 0 of each before band 1, a head's tiles of a band on
    # consecutive programs. No banded heads, or a band as wide as the head, is the head-major order.
    grid = n_heads * n_key_tiles
    out = torch.full((grid, 2), -1, dtype=torch.int32, device=DEVICE)
    _banded_key_tile_kernel[(grid,)](out, n_key_tiles, band, banded)
    got = [tuple(x) for x in out.cpu().tolist()]
    first = n_heads - banded
    want = [(h, t) for h in range(first) for t in range(n_key_tiles)]
    want += [(h, t) for start in range(0, n_key_tiles, band) for h in range(first, n_heads)
             for t in range(start, min(start + band, n_key_tiles))]
    assert got == want
    if band >= n_key_tiles or banded == 0:
        assert got == [(h, t) for h in range(n_heads) for t in range(n_key_tiles)]


def test_launch_order_rule():
    # The model's picks (B·N 16k tokens, hidden 2048, d 64 and 128 alike: 128-key tiles, 64-row
    # query tiles). One query head a program: no banded heads at 16k (no tail), some of the last
    # heads at 2k–8k. Programs walking a group of 4 or 8: every head banded below 16k (the measured
    # sweep, bwd_band-20261129-030431.json: +3 to +22%), the head-major order at 16k.
    for heads in (32, 16):
        for n in (2048, 4096, 8192, 16384):
            tiles = n // 128
            kv_heads = 16384 // n * heads
            band, banded = gluon_bwd.launch_order(tiles, kv_heads, 1, 132)
            assert band == gluon_bwd.NARROW_BAND and 0 <= banded < kv_heads
            assert (banded == 0) == (n == 16384), (heads, n)
            for group in (4, 8):
                walked = gluon_bwd.launch_order(tiles, kv_heads // group, group, 132)
                assert walked == ((tiles, 0) if n == 16384 else (gluon_bwd.NARROW_BAND, kv_heads // group))
    assert gluon_bwd.launch_order(64, 32, 1, 132)[1] < 32


def test_modelled_end_of_a_launch():
    # The list schedule: with an SM per program the launch ends with its heaviest program; on one
    # SM, after all of them; the band changes the order, not the sum.
    steps = [gluon_bwd.PROGRAM_STEPS + 4 * 2 * (10 - t) for t in range(10)]
    assert gluon_bwd._modelled_end(10, 3, 4, 10, sms=30) == pytest.approx(max(steps))
    for band, banded in ((1, -1), (3, -1), (10, -1), (2, 1), (2, 0)):
        assert gluon_bwd._modelled_end(10, 3, 4, band, 1, banded) == pytest.approx(3 * sum(steps))
    assert gluon_bwd._modelled_end(64, 8, 4, 2, 132) < gluon_bwd._modelled_end(64, 8, 4, 64, 132) / 1.15


@pytest.mark.parametrize("n_k, causal, window", [(1037, True, None), (1037, False, None), (4097, True, (300, 0)),
                                                 (4097, True, (-1, 0))])
def test_launch_plan_band(monkeypatch, n_k, causal, window):
    # The order comes from launch_order for dense causal launches without a window's left side (whose
    # tiles cost what its model says) only; every other launch gets the head-major order (the kernel
    # reads the order only under causal).
    q = torch.zeros(2, 8, 1000, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, n_k, 64, dtype=torch.bfloat16)
    asked = []
    monkeypatch.setattr(gluon_bwd, "launch_order", lambda nt, nh, g, sms: asked.append((nt, nh, g, sms)) or (3, 1))
    variant = PLAIN if window is None else Variant(left=window[0], right=window[1])
    plan = gluon_bwd.launch_plan(q, k, gluon_bwd.CONFIGS[64][0], causal, variant)
    tiles = math.ceil(n_k / 128)
    triangular = causal and (window is None or window[0] < 0)
    assert plan["order"] == ((3, 1) if triangular else (tiles, 0))
    assert asked == ([(tiles, 4, 4, 132)] if triangular else [])
    plan = gluon_bwd.launch_plan(q, k, gluon_bwd.CONFIGS[64][0], causal, Variant(seq=SEQ_RANGES))
    assert plan["order"] == (tiles, 0)


LOG2E = 1.4426950408889634


@triton.jit
def _query_tiles_kernel(out, n_q, off, win_left, win_right, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
                        HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    lo, n_tiles, mid_lo, mid_hi = gluon_query_tiles(t * BLOCK_N, n_q, off, win_left, win_right, CAUSAL, HAS_LEFT,
                                                    HAS_RIGHT, BLOCK_M, BLOCK_N)
    tl.store(out + 4 * t, lo)
    tl.store(out + 4 * t + 1, n_tiles)
    tl.store(out + 4 * t + 2, mid_lo)
    tl.store(out + 4 * t + 3, mid_hi)


def query_tiles(n_q, n_k, left, right, causal, block_m=64, block_n=128):
    """(lo, n_tiles, mid_lo, mid_hi) of every key tile, as the Gluon kernel computes them
    (``query_tiles`` run by the interpreter or the GPU; its flags from ``window_flags``, its sides as
    ``_option_args`` passes them)."""
    has_left, has_right = window_flags(Variant(left=left, right=right), causal)
    tiles = triton.cdiv(n_k, block_n)
    out = torch.empty(tiles, 4, dtype=torch.int32, device=DEVICE)
    _query_tiles_kernel[(tiles,)](out, n_q, n_k - n_q, left if has_left else 0, right if has_right else 0, causal,
                                  has_left, has_right, block_m, block_n)
    return out.tolist()


def _box(t, b, h, start, n):
    """A TMA box load: rows [start, start + n) of head (b, h), zeros past the end."""
    out = t.new_zeros((n,) + t.shape[3:])
    hi = min(start + n, t.shape[2])
    if hi > start:
        out[: hi - start] = t[b, h, start:hi]
    return out


def band_visible(keys, rows, n_k, off, left, right, has_left, has_right, causal):
    """Bool (64 keys, M rows): which pairs of an edge tile the kernel keeps (``_masked``): keys
    below ``n_k``, inside the window's band or, causal without one, left of the diagonal."""
    visible = (keys < n_k)[:, None].expand(keys.shape[0], rows.shape[-1])
    if has_left or has_right:
        if has_right or causal:
            visible = visible & (rows >= (keys - off - (right if has_right else 0))[:, None])
        if has_left:
            visible = visible & (rows <= (keys - off + left)[:, None])
    elif causal:
        visible = visible & (keys[:, None] <= rows + off)
    return visible


def model_query_step(qt, dot, l2, dl, kc, vc, dkc, dvc, start_n, start_m, edge, n_k, off, window, has_left,
                     has_right, causal, scale, softcap=0.0, slope=None, n_q=None):
    """One query tile of a program in the schedule models, float64, as each consumer c (keys
    start_n + 64c …) computes it: Pᵀ from the scores (the options as the kernel folds them), masked
    only on an ``edge`` tile or where the consumer holds keys past ``n_k``, and with a row bound
    ``n_q`` (ranges and varlen: the kernel's ``seq_n_q``; a dense batch has none, its padded lse₂ is
    +inf) on a tile crossing it; dV and dK accumulated into ``dvc``/``dkc``; returns each
    consumer's dS (rows × its 64 keys)."""
    left, right = window
    M, ds = qt.shape[0], []
    for c in range(len(kc)):
        keys = start_n + 64 * c + torch.arange(64)
        x, fold = kc[c] @ qt.T, scale * LOG2E
        if softcap:
            x, fold = torch.tanh(x * (scale / softcap)), softcap * LOG2E
        t = x
        if slope is not None:
            rows = (start_m + torch.arange(M)).double()
            x = x - slope * LOG2E / fold * (rows[None, :] - (keys - off).double()[:, None]).abs()
        pt = torch.exp2(x * fold - l2)
        crosses = n_q is not None and start_m + M > n_q
        if edge or crosses or start_n + 64 * (c + 1) > n_k:
            rows = (start_m + torch.arange(M))[None, :]
            visible = band_visible(keys, rows, n_k, off, left, right, has_left, has_right, causal)
            if n_q is not None:
                visible = visible & (rows < n_q)
            pt = torch.where(visible, pt, 0.0)
        assert torch.isfinite(pt).all(), "an unmasked tile overflowed"
        dvc[c] += pt @ dot
        dst = (pt * (1 - t * t) if softcap else pt) * (vc[c] @ dot.T - dl)
        dkc[c] += dst @ qt
        ds.append(dst.T)
    return ds


def model_dq_parts(ds, kc, it, d, scale):
    """The (column, dQ part) pairs the consumers reduce-add after step ``it`` of a program with fused
    dQ: per consumer 64 columns at D 128, at D 64 the one consumer whose turn it is."""
    consumers = len(kc)
    for me in range(consumers):
        for col in ([me * 64] if d // 64 == consumers else ([0] if it % consumers == me else [])):
            yield col, sum(ds[c] @ kc[c][:, col:col + 64] for c in range(consumers)) * scale


def model_backward(do, q, k, v, o, lse, scale, causal, cfg, softcap=0.0, slopes=None, window=(-1, -1)):
    """(dq, dk, dv) computed the way the kernel schedules it, in float64: per program (key tile,
    batch, KV head) the query tiles the kernel's ``query_tiles`` gives (run in the interpreter or
    on the GPU), masks only outside [mid_lo, mid_hi) (mid_hi only under a window's left side) or
    in a warpgroup holding keys past Nk, rotated start without causal or a window's right side,
    the GQA group as one flat loop, padded lse₂/δ rows, dQ columns per consumer (D 128) or per step
    (D 64), rows past the ends dropped. The options as the kernel computes them: ``softcap``
    (x = tanh(Sᵀ·scale/c), fold c·log2 e, dSᵀ times 1 − x²), ALiBi ``slopes`` (B, Hq) subtracted
    over the fold from x as slope·log2 e/fold · |query − (key − off)|, a ``window`` (left, right),
    −1 unbounded, masked per key: queries [key − off − right, key − off + left] (causal: right 0)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group, M, C = Hq // Hkv, cfg.block_m, cfg.consumers
    BN = 64 * C
    left, right = window
    has_left, has_right = window_flags(Variant(left=left, right=right), causal)
    ranges = query_tiles(Nq, Nk, left, right, causal, M, BN)
    pad = gluon_bwd._pad_rows(Nq)
    lse2 = torch.full((B * Hq, pad), math.inf, dtype=torch.float64)
    lse2[:, :Nq] = torch.where(torch.isinf(lse), math.inf, lse * LOG2E).reshape(B * Hq, Nq)
    delta = torch.zeros((B * Hq, pad), dtype=torch.float64)
    delta[:, :Nq] = (do * o).sum(-1).reshape(B * Hq, Nq)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    n_key_tiles = -(-Nk // BN)
    for pid in range(n_key_tiles * B * Hkv):
        tile, bh_kv = pid % n_key_tiles, pid // n_key_tiles
        b, h_kv, start_n = bh_kv // Hkv, bh_kv % Hkv, tile * BN
        off = Nk - Nq
        lo, n_tiles, mid_lo, mid_hi = ranges[tile]
        rotate = not (causal or has_right)
        kc = [_box(k, b, h_kv, start_n + 64 * c, 64) for c in range(C)]
        vc = [_box(v, b, h_kv, start_n + 64 * c, 64) for c in range(C)]
        dkc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
        dvc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
        for it in range(group * n_tiles):
            g, i = it // n_tiles, it % n_tiles
            if rotate:
                i = (i + tile) % n_tiles
            h, start_m = h_kv * group + g, lo + i * M
            qt, dot = _box(q, b, h, start_m, M), _box(do, b, h, start_m, M)
            l2, dl = lse2[b * Hq + h, start_m:start_m + M], delta[b * Hq + h, start_m:start_m + M]
            edge = start_m < mid_lo or (has_left and start_m >= mid_hi)
            slope = None if slopes is None else slopes[b, h]
            ds = model_query_step(qt, dot, l2, dl, kc, vc, dkc, dvc, start_n, start_m, edge, Nk, off, window,
                                  has_left, has_right, causal, scale, softcap, slope)
            if cfg.fused_dq:
                hi = min(start_m + M, Nq)
                for col, part in model_dq_parts(ds, kc, it, D, scale):
                    dq[b, h, start_m:hi, col:col + 64] += part[: hi - start_m]
        for c in range(C):
            s0 = start_n + 64 * c
            hi = min(s0 + 64, Nk)
            dk[b, h_kv, s0:hi] = dkc[c][: max(hi - s0, 0)] * scale
            dv[b, h_kv, s0:hi] = dvc[c][: max(hi - s0, 0)]
    return dq, dk, dv


@model_only
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 2, 2, 1, 1), (1, 4, 2, 130, 129), (1, 2, 1, 100, 37), (1, 2, 2, 37, 300),
                                   (2, 2, 1, 200, 1), (1, 2, 2, 257, 257)],
                         ids=lambda s: "b{}-h{}:{}-q{}-k{}".format(*s))
def test_schedule_model_matches_reference(shape, causal, d):
    # Every (query, key) pair visited once, masks exactly where needed (an unmasked tile with a
    # hidden pair would fail: P would not be 0 there), GQA sums, dQ columns all covered once.
    B, Hq, Hkv, Nq, Nk = shape
    g = torch.Generator().manual_seed(1)
    q, do = (torch.randn(B, Hq, Nq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Nk, d, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attention_reference(*leaves, causal=causal, dtype=torch.float64)
    want = torch.autograd.grad(o, leaves, do)
    got = model_backward(do, q, k, v, o.detach(), lse.detach(), d ** -0.5, causal, gluon_bwd.CONFIGS[d][0])
    for name, a, w in zip(("dq", "dk", "dv"), got, want):
        floor = 1e-3 * w.numel() ** 0.5
        assert ((a - w).norm() / w.norm().clamp_min(floor)).item() < 1e-10, name


@model_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("opts", [dict(softcap=2.5), dict(alibi="h"), dict(alibi="bh"), dict(sinks=True),
                                  dict(softcap=4.0, alibi="bh", sinks=True)],
                         ids=["softcap", "alibi-h", "alibi-bh", "sinks", "all"])
@pytest.mark.parametrize("shape, d", [((1, 4, 2, 130, 129), 64), ((1, 2, 2, 37, 300), 128), ((1, 2, 1, 300, 37), 64)],
                         ids=["b1-h4:2-q130-k129-d64", "b1-h2:2-q37-k300-d128", "b1-h2:1-q300-k37-d64"])
def test_schedule_model_with_options_matches_reference(shape, d, opts, causal):
    # The options' math as the kernel does it (the score fold, ALiBi's distance from the transposed
    # tile's keys and query columns, softcap's derivative; sinks only in the saved lse, and dsinks
    # by sinks_grad from δ), in float64 against autograd through the reference.
    check_model(shape, d, opts, causal)


# (window (left, right) in keys, −1 unbounded; causal): each side alone and both, causal with a left
# side (a right side given or not: capped at 0), a zero-width band, one of a single key under
# causal, a band wider than the sequences.
MODEL_WINDOWS = [((40, -1), False), ((-1, 40), False), ((70, 5), False), ((0, 0), False), ((100, -1), True),
                 ((100, 5), True), ((0, -1), True), ((1000, 1000), False)]


@model_only
@pytest.mark.parametrize("window, causal", MODEL_WINDOWS,
                         ids=[f"l{w[0]}-r{w[1]}{'-causal' if c else ''}" for w, c in MODEL_WINDOWS])
@pytest.mark.parametrize("shape, d, opts", [((1, 4, 2, 300, 300), 64, {}), ((1, 2, 2, 130, 333), 128, {}),
                                            ((1, 2, 1, 333, 130), 64, dict(softcap=4.0, alibi="bh", sinks=True))],
                         ids=["b1-h4:2-q300-k300-d64", "b1-h2:2-q130-k333-d128", "b1-h2:1-q333-k130-d64-all"])
def test_schedule_model_with_windows_matches_reference(shape, d, opts, window, causal):
    # The band's query tiles from the kernel's query_tiles, masked only at its edges (an unmasked tile
    # with a hidden pair would fail: P would not be 0 there), rows with no visible key (P = 0 from
    # lse₂ = +inf, or with sinks masked out), Nq ≠ Nk both ways, GQA, every option.
    check_model(shape, d, opts, causal, window)


def check_model(shape, d, opts, causal, window=(-1, -1)):
    """``model_backward`` with the options ``opts`` (as variant_options takes them) and ``window``
    against float64 autograd through the reference (and dsinks by sinks_grad from δ)."""
    from flashattn_lite.ops.attention_bwd import sinks_grad
    from test_attention_hopper import variant_options
    B, Hq, Hkv, Nq, Nk = shape
    g = torch.Generator().manual_seed(1)
    q, do = (torch.randn(B, Hq, Nq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Nk, d, generator=g, dtype=torch.float64) for _ in range(2))
    options = {n: (t.double().cpu() if isinstance(t, torch.Tensor) else t)
               for n, t in variant_options(opts, shape + (d,)).items()}
    if window != (-1, -1):
        options["window"] = tuple(None if w < 0 else w for w in window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if "sinks" in options:
        options["sinks"] = options["sinks"].requires_grad_()
        leaves.append(options["sinks"])
    o, lse = attention_reference(*leaves[:3], causal=causal, dtype=torch.float64, **options)
    want = torch.autograd.grad(o, leaves, do)
    slopes = options.get("alibi_slopes")
    if slopes is not None:
        slopes = slopes.expand(B, Hq)
    got = model_backward(do, q, k, v, o.detach(), lse.detach(), d ** -0.5, causal, gluon_bwd.CONFIGS[d][0],
                         softcap=options.get("softcap", 0.0), slopes=slopes, window=window)
    if "sinks" in options:
        delta = (do * o.detach()).sum(-1)
        got = got + (sinks_grad(options["sinks"].detach(), lse.detach(), delta),)
    for name, a, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        floor = 1e-3 * w.numel() ** 0.5
        assert ((a - w).norm() / w.norm().clamp_min(floor)).item() < 1e-10, name


# ---------------------------------------------------------------------------------------------
# GPU: against the float64 reference and the portable backward
# ---------------------------------------------------------------------------------------------

def _saved(shape, dtype, causal, *, layout="bhnd", seed=1):
    """q, k, v, dO and the portable forward's o, lse (as training hands them over)."""
    from test_attention_bwd_hopper import forward, make_inputs
    q, k, v, do = make_inputs(shape, dtype, layout=layout, seed=seed)
    o, lse = forward(q, k, v, causal)
    return q, k, v, do, o, lse


def check_backward(shape, dtype, causal, config, *, layout="bhnd", with_dlse=False):
    """Our gradients against float64 autograd (and torch's own in the same dtype) and against the
    portable backward's on the same o and lse: same shapes, strides and dtypes; error within
    twice torch's own plus eps; rows with no visible key get dq exactly 0."""
    from test_attention_bwd_hopper import portable_backward, reference_grads
    q, k, v, do, o, lse = _saved(shape, dtype, causal, layout=layout)
    assert gluon_bwd.supported(q, k, v, do, causal=causal) is None
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2)).to(q.device) if with_dlse else None
    ours = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=shape[-1] ** -0.5, causal=causal,
                                              config=config, dlse=dlse)
    port = portable_backward(do, q, k, v, o, lse, causal, dlse)
    ref = reference_grads(q, k, v, do, causal, torch.float64, dlse)
    same = reference_grads(q, k, v, do, causal, dtype, dlse)
    for name, a, p, s, r, x in zip(("dq", "dk", "dv"), ours, port, same, ref, (q, k, v)):
        assert a.shape == x.shape and a.dtype == dtype and a.stride() == p.stride(), name
        assert_close_to_ref(a, s, r, eps=2 * EPS[dtype], what=name)
        assert_close_to_ref(a, p, r, eps=2 * EPS[dtype], what=f"{name} vs the portable backward's error")
    hidden = ~torch.isfinite(lse)
    assert (ours[0][hidden] == 0).all()
    return ours


def assert_same_dk_dv(ours, other, shape, causal):
    """dK and dV of two calls bit for bit; where the launch splits a GQA group (``group_split``),
    its float32 sums take the group's adds in any order: then within one rounding of the dtype."""
    B, Hq, Hkv, Nq, Nk, D = shape
    q, k = torch.empty(B, Hq, Nq, D, device="meta"), torch.empty(B, Hkv, Nk, D, device="meta")
    split = gluon_bwd.group_split(q, k, causal, None, gluon_bwd.default_config(D, causal, max(Nq, Nk))) > 1
    for a, b in zip(ours[1:3], other[1:3]):
        if split:
            assert (a.float() - b.float()).abs().max() <= 2 ** -9 * b.float().abs().max()
        else:
            assert torch.equal(a, b)


def _shape_id(s):
    return "b{}-h{}:{}-q{}-k{}".format(*s)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", gluon_bwd.HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_backward_matches_reference_and_portable(shape, d, dtype, causal):
    check_backward(shape + (d,), dtype, causal, None)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [48, 80, 96, 192], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[4], SHAPES[5]], ids=_shape_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_padded_head_dims_match_reference_and_portable(shape, d, dtype, causal):
    # Head dims run padded to 64 or 128 (``kernel_head_dim``): the same checks, dq, dk, dv of q's,
    # k's, v's own width.
    check_backward(shape + (d,), dtype, causal, None)


@needs_gpu
@pytest.mark.parametrize("d", [48, 96])
def test_padded_head_dims_deterministic(d):
    # Under torch.use_deterministic_algorithms a padded head dim's dq comes from the portable
    # one-writer dQ kernel (the Triton TMA one takes 64 and 128 only): the same bits twice, and the
    # reference's gradients.
    from test_attention_bwd_hopper import reference_grads
    q, k, v, do, o, lse = _saved((2, 8, 2, 1000, 1000, d), torch.bfloat16, True)
    torch.use_deterministic_algorithms(True)
    try:  # (the float64 reference's autograd has no deterministic CUDA kernels: outside the mode)
        assert not gluon_bwd.default_config(gluon_bwd.kernel_head_dim(d), True, 1000, True).fused_dq
        runs = [gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=d ** -0.5, causal=True)
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    ref = reference_grads(q, k, v, do, True, torch.float64)
    same = reference_grads(q, k, v, do, True, torch.bfloat16)
    for name, a, s_, r in zip(("dq", "dk", "dv"), runs[0], same, ref):
        assert_close_to_ref(a, s_, r, eps=2 * EPS[torch.bfloat16], what=name)


@needs_gpu
def test_gqa_4_to_1():
    check_backward((1, 8, 2, 1000, 1000, 128), torch.bfloat16, True, None)
    check_backward((2, 8, 2, 333, 777, 64), torch.float16, False, None)


@needs_gpu
def test_repeated_launches_skip_tritons_path_and_read_their_own_tensors(monkeypatch):
    # After the first call, calls of other lengths with the same specialization launch the cached
    # binary directly: each must read and write its own tensors through tensor maps encoded for it.
    launcher = gluon_bwd._attn_bwd_gluon_launcher
    assert launcher.enabled
    config = gluon_bwd.default_config(128, True, 1000)
    check_backward((1, 4, 2, 1000, 1037, 128), torch.bfloat16, True, config)
    slow = []
    first = launcher._first
    monkeypatch.setattr(launcher, "_first", lambda *a: slow.append(a) or first(*a))
    # GQA 2:1 throughout: the backward's group is a constexpr.
    for shape in [(2, 4, 2, 777, 1500, 128), (1, 6, 3, 1000, 1000, 128), (1, 4, 2, 1000, 1037, 128)]:
        check_backward(shape, torch.bfloat16, True, config)
    assert not slow


@needs_gpu
@pytest.mark.parametrize("band, banded", [(1, 100), (2, 100), (3, 100), (100, 100), (2, 1), (3, 2)])
@pytest.mark.parametrize("shape, dtype", [((3, 8, 2, 1000, 1037, 128), torch.bfloat16),
                                          ((2, 4, 4, 777, 1500, 64), torch.float16)], ids=["d128-gqa4", "d64"])
def test_causal_bands_match_reference(monkeypatch, shape, dtype, band, banded):
    # Every band width (narrower than a head, one not dividing its tiles, wider) against float64,
    # and the band only reorders the programs: dK and dV bit-identical to the head-major order's.
    monkeypatch.setattr(gluon_bwd, "launch_order", lambda nt, nh, g, sms: (nt, 0))
    head_major = check_backward(shape, dtype, True, None)
    monkeypatch.setattr(gluon_bwd, "launch_order", lambda nt, nh, g, sms: (band, min(banded, nh)))
    ours = check_backward(shape, dtype, True, None)
    assert_same_dk_dv(ours, head_major, shape, True)


@needs_gpu
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in gluon_bwd.HEAD_DIMS for c in gluon_bwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, gluon_bwd.Config) else f"d{x}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_config_on_partial_tiles(head_dim, config, causal):
    # Tails on both sides and the bottom-right diagonal (Nq < Nk, neither a tile multiple), GQA 2:1.
    # The head dim 256 one pass takes only v at most 128 wide (the value-dim file runs it): at v's
    # 256 it is refused before the backward runs.
    shape = (1, 4, 2, 1000, 1037, head_dim)
    if config.split_d and config.fused_dq:
        with pytest.raises(ValueError, match="one pass"):
            check_backward(shape, torch.bfloat16, causal, config)
    else:
        check_backward(shape, torch.bfloat16, causal, config)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dlse_folds_into_delta(causal):
    check_backward((1, 4, 2, 1000, 777, 128), torch.float16, causal, None, with_dlse=True)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_heads_read_and_written_in_place(causal):
    # (B, N, H, D) storage: the descriptors take the strides, the gradients come back in the inputs'
    # layout; dk, dv equal the contiguous call's bit for bit (dq's fp32 adds arrive in any order).
    shape = (2, 8, 2, 1000, 777, 128)
    ours = check_backward(shape, torch.float16, causal, None, layout="bnhd")
    q, k, v, do, o, lse = _saved(shape, torch.float16, causal, layout="bnhd")
    assert not q.is_contiguous() and ours[0].stride() == q.stride() and ours[1].stride() == k.stride()
    dense = gluon_bwd.attention_backward_gluon(do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
                                               o, lse, scale=shape[-1] ** -0.5, causal=causal)
    assert_same_dk_dv(ours, dense, shape, causal)
    assert (ours[0].float() - dense[0].float()).abs().max() <= 1e-2 * dense[0].float().abs().max()


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dispatch_reads_a_strided_do_in_place(monkeypatch, causal):
    # A model's dO is often a transposed view ((B, N, H, D) storage: the output's transpose): the
    # dispatch hands it to the Gluon backward as it is (TMA reads its strides), not a contiguous
    # copy, and the gradients are the contiguous dO's (dk, dv bit for bit; dq up to its adds' order).
    import flashattn_lite
    from flashattn_lite.ops import attention_bwd
    seen = []
    real = gluon_bwd.attention_backward_gluon
    monkeypatch.setattr(gluon_bwd, "attention_backward_gluon",
                        lambda do, *a, **kw: seen.append(do) or real(do, *a, **kw))
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    shape = (2, 8, 2, 2100, 2100, 128)  # past the Hopper paths' least work (MIN_WORK)
    q, k, v, do, _, _ = _saved(shape, torch.bfloat16, causal, layout="bnhd")
    grads = []
    for d_o in (do, do.contiguous()):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        flashattn_lite.attention(*leaves, causal=causal).backward(d_o)
        grads.append([t.grad for t in leaves])
    assert not do.is_contiguous() and len(seen) == 2
    assert seen[0].data_ptr() == do.data_ptr() and seen[0].stride() == do.stride()
    assert_same_dk_dv(grads[0], grads[1], shape, causal)
    assert (grads[0][0].float() - grads[1][0].float()).abs().max() <= 1e-2 * grads[1][0].float().abs().max()


@needs_gpu
@pytest.mark.parametrize("cap_heads, opts", [(2, {}), (2, dict(softcap=4.0, alibi="bh", sinks=True)),
                                             (0.5, dict(alibi="h", sinks=True)), (1, dict(left=300))],
                         ids=["kv-heads", "kv-heads-options", "rows", "window"])
def test_long_calls_run_in_chunks_with_the_same_gradients(monkeypatch, cap_heads, opts):
    # A cap on the fp32 dQ buffer of `cap_heads` KV heads' worth (of all rows): the call runs in
    # chunks (of KV heads, or of rows when one KV head of all rows is over it), into one set of
    # gradients equal to the one-launch call's: dk, dv (and the sinks' gradient up to fp32
    # summation order) bit for bit, dq up to its fp32 reduce-adds' order; ALiBi's slopes and the
    # sinks taken per chunk.
    B, Hq, Hkv, N, d = 2, 8, 4, 700, 64
    q, k, v, do, o, lse = _saved((B, Hq, Hkv, N, N, d), torch.bfloat16, True)
    g = torch.Generator().manual_seed(3)
    variant = Variant(softcap=opts.get("softcap", 0.0), left=opts.get("left", -1),
                      alibi=None if "alibi" not in opts else
                      (torch.rand(Hq, generator=g) if opts["alibi"] == "h" else torch.rand(B, Hq, generator=g))
                      .to(q.device) * 0.1,
                      sinks=torch.randn(Hq, generator=g).to(q.device) if opts.get("sinks") else None)
    whole = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True, variant=variant)
    monkeypatch.setattr(gluon_bwd, "DQ_BUFFER_BYTES", int(cap_heads * B * (Hq // Hkv) * N * d * 4))
    assert len(gluon_bwd.dq_buffer_chunks(B, Hq, Hkv, N, d)) > 1
    parts = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True, variant=variant)
    assert torch.equal(parts[1], whole[1]) and torch.equal(parts[2], whole[2])
    assert parts[0].stride() == whole[0].stride()
    assert (parts[0].float() - whole[0].float()).abs().max() <= 1e-2 * whole[0].float().abs().max()
    if variant.sinks is not None:
        torch.testing.assert_close(parts[3], whole[3], rtol=1e-5, atol=1e-5)
    else:
        assert parts[3] is None and whole[3] is None


@needs_gpu
@pytest.mark.parametrize("shape, split", [((2, 8, 8, 2000, 2000, 128), False), ((2, 8, 2, 2000, 2000, 128), False),
                                          ((2, 8, 2, 2000, 2000, 128), True)], ids=["mha", "gqa4", "gqa4-split"])
def test_dk_dv_are_deterministic(monkeypatch, shape, split):
    # One program writes each dK, dV row (a GQA program walking its group); a split GQA launch
    # (``group_split``) adds the group's rows in float32 in any order, within one rounding.
    if split:
        monkeypatch.setattr(gluon_bwd, "split_min_keys", lambda group, d: 0)
    q, k, v, do, o, lse = _saved(shape, torch.bfloat16, True)
    runs = [gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True) for _ in range(2)]
    assert_same_dk_dv(*runs, shape, True)


@needs_gpu
@pytest.mark.parametrize("shape, dtype, layout", [((3, 8, 2, 1000, 1037, 128), torch.bfloat16, "bhnd"),
                                                  ((1, 8, 1, 777, 1500, 64), torch.float16, "bhnd"),
                                                  ((2, 8, 2, 1000, 777, 128), torch.float16, "bnhd")],
                         ids=["d128-gqa4", "d64-gqa8", "d128-gqa4-strided"])
def test_split_group_matches_reference(monkeypatch, shape, dtype, layout):
    # A GQA launch split into one program per query head (``group_split``; from ``split_min_keys`` keys,
    # here at any length): the float32 dK, dV sums against float64, in the head-major order, every
    # head banded and the last head banded (the group's heads apart in the order in each).
    monkeypatch.setattr(gluon_bwd, "split_min_keys", lambda group, d: 0)
    B, Hq, Hkv, Nq, Nk, D = shape
    q, k = torch.empty(B, Hq, Nq, D, device="meta"), torch.empty(B, Hkv, Nk, D, device="meta")
    assert gluon_bwd.group_split(q, k, True, None, gluon_bwd.default_config(D, True, max(Nq, Nk))) == Hq // Hkv
    runs = []
    for order in (lambda nt, nh, g, sms: (nt, 0), lambda nt, nh, g, sms: (2, nh), lambda nt, nh, g, sms: (3, 1)):
        monkeypatch.setattr(gluon_bwd, "launch_order", order)
        runs.append(check_backward(shape, dtype, True, None, layout=layout))
    assert_same_dk_dv(runs[1], runs[0], shape, True)


@needs_gpu
def test_deterministic_mode_walks_the_gqa_group(monkeypatch):
    # Under torch.use_deterministic_algorithms a GQA causal call is not split (at any length): every
    # gradient bit-identical from run to run.
    monkeypatch.setattr(gluon_bwd, "split_min_keys", lambda group, d: 0)
    q, k, v, do, o, lse = _saved((2, 8, 2, 2000, 2000, 128), torch.bfloat16, True)
    torch.use_deterministic_algorithms(True)
    try:
        runs = [gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@needs_gpu
@pytest.mark.parametrize("d", [128, 256])
def test_deterministic_mode_gives_the_same_dq_bits(d):
    # Under torch.use_deterministic_algorithms the default config computes dq with a dQ kernel (the
    # Triton one; at d 256 the wide one) with one writer per element, not fp32 reduce-adds in any order.
    q, k, v, do, o, lse = _saved((2, 8, 2, 2000, 2000, d), torch.bfloat16, False)
    torch.use_deterministic_algorithms(True)
    try:
        assert not gluon_bwd.default_config(d, False, 2000, True).fused_dq
        runs = [gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=d ** -0.5, causal=False)
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("loss", ["square", "with_lse"])
def test_attention_backward_dispatch(monkeypatch, loss):
    # attention()'s backward takes the Gluon backward for plain calls its fast path accepts, causal
    # or not, and explain() names it. On the CPU the decision is faked and the Triton TMA backward
    # (same contract, runs in the interpreter) stands in for the kernel, checking the plumbing.
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.ops import attention_bwd_hopper as hopper_bwd
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    calls = []
    real = gluon_bwd.attention_backward_gluon if ON_GPU else hopper_bwd.attention_backward_hopper

    def counting(*args, **kwargs):
        calls.append(kwargs["causal"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gluon_bwd, "attention_backward_gluon", counting)
    if not ON_GPU:
        monkeypatch.setattr(gluon_bwd, "fast_path", lambda *args: hopper_fwd.enabled())
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    shape, dtype = ((2, 8, 4, 2048, 2048, 128), torch.bfloat16) if ON_GPU else ((1, 2, 1, 20, 37, 64), torch.float16)
    B, Hq, Hkv, Nq, Nk, D = shape
    g = torch.Generator(device=DEVICE).manual_seed(3)
    q0 = torch.randn(B, Hq, Nq, D, generator=g, device=DEVICE).to(dtype)
    k0, v0 = (torch.randn(B, Hkv, Nk, D, generator=g, device=DEVICE).to(dtype) for _ in range(2))

    def grads(causal):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        o, lse = fa.attention(q, k, v, causal=causal, return_lse=True)
        total = o.float().square().sum() + (lse[lse.isfinite()].sum() if loss == "with_lse" else 0)
        return torch.autograd.grad(total, (q, k, v))

    for causal in (True, False):
        calls.clear()
        got = grads(causal)
        assert calls == [causal]
        with hopper_fwd.disabled():
            want = grads(causal)
        assert calls == [causal]
        for a, w in zip(got, want):
            assert a.shape == w.shape and a.dtype == w.dtype
            assert (a.float() - w.float()).norm() <= 2e-2 * w.float().norm()
    if ON_GPU:
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        assert "Gluon warp-specialized backward" in str(fa.explain(q, k, v, causal=True, backward=True))


def test_deterministic_mode_rules(monkeypatch):
    # Under torch.use_deterministic_algorithms: d 64 non-causal calls keep the portable kernels (the
    # one-writer dQ config measured slower than them there), the rest take the one-writer config,
    # and an explicit fused-dQ config is refused before launch, as torch refuses such ops.
    import triton
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    monkeypatch.setattr(gluon_bwd, "_HAS_GLUON", True)
    monkeypatch.setattr(gluon_bwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_bwd, "supported", lambda *args, **kwargs: None)
    monkeypatch.setattr(hopper_fwd, "enabled", lambda: True)
    for d in (64, 128):
        q = torch.empty(8, 16, 4096, d, device="meta")
        for causal in (False, True):
            assert gluon_bwd.fast_path(q, q, q, q, causal, 0, 0.1)
            assert gluon_bwd.fast_path(q, q, q, q, causal, 0, 0.1, deterministic=True) == (d == 128 or causal)
            assert not gluon_bwd.default_config(d, causal, 4096, deterministic=True).fused_dq
    q = torch.empty(8, 16, 4096, 256, device="meta")  # d 256: the wide pair, one writer per element
    for causal in (False, True):
        assert gluon_bwd.fast_path(q, q, q, q, causal, 0, 0.1, deterministic=True)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    fused = gluon_bwd.default_config(64)
    assert fused.fused_dq
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
            gluon_bwd.attention_backward_gluon(q, q, q, q, q, q[..., 0].float(), scale=0.1, causal=False,
                                               config=fused)
    finally:
        torch.use_deterministic_algorithms(False)


@needs_gpu
def test_attention_backward_is_bit_identical_in_deterministic_mode():
    # Through attention(): the dispatch decision is cached per determinism setting, so switching the
    # mode on after a call with it off still gives the one-writer dq.
    import flashattn_lite as fa
    g = torch.Generator(device="cuda").manual_seed(5)
    q0, k0, v0 = (torch.randn(2, 8, 2048, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))

    def grads():
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        o = fa.attention(q, k, v, causal=True)
        return torch.autograd.grad(o.float().square().sum(), (q, k, v))

    grads()  # decided and cached with the mode off
    torch.use_deterministic_algorithms(True)
    try:
        first, second = grads(), grads()
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# ---------------------------------------------------------------------------------------------
# The score options (softcap, ALiBi, sinks): what is taken, where attention() sends it, and on an
# sm_90 GPU the gradients against float64 and the portable backward on the same saved o and lse.
# ---------------------------------------------------------------------------------------------

# (name, options as test_attention_hopper.variant_options takes them): each alone, ALiBi slopes (Hq,)
# and (B, Hq), and all three together.
OPTION_SETS = [
    ("softcap", dict(softcap=2.5)),
    ("alibi-h", dict(alibi="h")),
    ("alibi-bh", dict(alibi="bh")),
    ("sinks", dict(sinks=True)),
    ("all", dict(softcap=4.0, sinks=True, alibi="bh")),
]


@pytest.fixture
def sm90(monkeypatch):
    """As on an sm_90 GPU with the tested triton, at any size (CPU tensors pass the device check;
    nothing here launches a kernel). The cache of backward decisions starts and ends empty."""
    import triton
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    monkeypatch.setattr(hopper_fwd, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(hopper_fwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(hopper_fwd, "MIN_WORK", 0)
    monkeypatch.setattr(gluon_bwd, "TESTED_TRITON", (triton.__version__,))
    monkeypatch.setattr(gluon_bwd, "_HAS_GLUON", True)
    monkeypatch.delenv("FLASHATTN_LITE_HOPPER", raising=False)
    attention_bwd._HOPPER.clear()
    yield
    attention_bwd._HOPPER.clear()


def _variant_call(opts, shape=(2, 4, 2, 17, 23, 64), dtype=torch.float16):
    from test_attention_hopper import as_variant, make_qkv, variant_options
    q, k, v = make_qkv(shape, dtype)
    return q, k, v, as_variant(q, k, variant_options(opts, shape))


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
@pytest.mark.parametrize("case", OPTION_SETS, ids=lambda c: c[0])
def test_supported_and_fast_path_take_each_option(sm90, case):
    _, opts = case
    q, k, v, variant = _variant_call(opts)
    for causal in (False, True):
        assert gluon_bwd.supported(q, k, v, q, causal=causal, variant=variant) is None
        assert gluon_bwd.supported(q, k, v, q, causal=causal, scale=0.3, dlse=None, variant=variant) is None
        assert gluon_bwd.fast_path(q, q, k, v, causal, 6, 0.125, variant=variant)
        # Deterministic mode: the one-writer configs take every option (dq by the portable dQ kernel
        # where the TMA one does not reach); d 64 non-causal calls keep the portable kernels.
        assert gluon_bwd.fast_path(q, q, k, v, causal, 6, 0.125, True, variant=variant) == causal


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_an_offset_off_the_bottom_right_is_taken_only_where_nothing_reads_it(sm90):
    # The kernel places the diagonal at Nk − Nq. Another causal_offset is harmless on a call with no
    # causal mask, window or ALiBi (ring attention's unmasked blocks) and taken; with any of them it
    # would move the mask, so the call keeps the portable kernels: forward and backward agree.
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    q, k, v, _ = _variant_call({})
    off = 2 + k.shape[2] - q.shape[2]
    for opts, taken in ((dict(), True), (dict(softcap=4.0, sinks=True), True), (dict(window=(3, None)), False),
                        (dict(window=(None, 2)), False), (dict(alibi="h"), False)):
        variant = _variant_call(opts)[3]
        for causal in (False, True):
            want = taken and not causal
            assert gluon_bwd.fast_path(q, q, k, v, causal, off, 0.125, variant=variant) == want, (opts, causal)
            forward = hopper_fwd._reason_for_options(q, k, dict(causal=causal, causal_offset=off, variant=variant),
                                                     variants=True)
            assert (forward is None) == want, (opts, causal, forward)
            assert gluon_bwd.fast_path(q, q, k, v, causal, off - 2, 0.125, variant=variant)  # the bottom-right one


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_supported_refuses_the_rest(sm90):
    q, k, v, every = _variant_call(dict(softcap=4.0, sinks=True, alibi="bh"))
    reason = gluon_bwd.supported
    for left, right in ((3, -1), (-1, 2), (0, 0)):  # windows are taken; sides below −1 are not
        assert reason(q, k, v, q, causal=True, variant=every._replace(left=left, right=right)) is None
        assert "window" in reason(q, k, v, q, variant=every._replace(left=left - 5, right=right))
    assert "seq_q" in reason(q, k, v, q, variant=every._replace(seq=SEQ_RANGES))  # ranges need their bounds
    assert "dropout" in reason(q, k, v, q, variant=every, dropout_p=0.1)
    assert "causal_offset" in reason(q, k, v, q, causal=True, causal_offset=2, variant=every)
    assert "alibi" in reason(q, k, v, q, variant=every._replace(alibi=every.alibi.half()))
    assert "sinks" in reason(q, k, v, q, variant=every._replace(sinks=every.sinks[:3]))
    assert "dtype" in reason(q.float(), k.float(), v.float(), q.float(), variant=every)


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_non_causal_alibi_past_2_24_rows_is_refused(sm90):
    # The d ≤ 128 kernel's non-causal step forms ALiBi's distances from rows in float32, exact only
    # up to 2²⁴: longer dense and padded calls keep the portable kernels (views: no memory needed).
    slopes = torch.rand(1)
    for d, rows, causal, seq, refused in ((64, gluon_bwd.EXACT_ROWS + 1, False, SEQ_DENSE, True),
                                          (128, gluon_bwd.EXACT_ROWS + 1, False, SEQ_RANGES, True),
                                          (64, gluon_bwd.EXACT_ROWS, False, SEQ_DENSE, False),
                                          (64, gluon_bwd.EXACT_ROWS + 1, True, SEQ_DENSE, False),
                                          (256, gluon_bwd.EXACT_ROWS + 1, False, SEQ_DENSE, False)):
        q = torch.zeros(1, 1, 1, d, dtype=torch.float16).expand(1, 1, rows, d)
        ranges = torch.tensor([[0, rows]], dtype=torch.int32) if seq == SEQ_RANGES else None
        variant = Variant(alibi=slopes, seq=seq, seq_q=ranges, seq_k=ranges)
        reason = gluon_bwd.supported(q, q, q, q, causal=causal, variant=variant) or ""
        assert ("ALiBi past" in reason) == refused, (d, rows, causal, seq, reason)
        if refused:  # and without ALiBi it is not this rule that refuses
            assert "ALiBi past" not in (gluon_bwd.supported(q, q, q, q, causal=causal,
                                                            variant=variant._replace(alibi=None)) or "")


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_backward_decision_is_keyed_by_the_variant(sm90):
    # attention_backward's cache: one decision per (call signature, variant signature); a window
    # takes the Gluon backward (the TMA pair is plain only); the note names the options.
    from flashattn_lite.ops import attention_bwd, attention_bwd_hopper
    q, k, v, every = _variant_call(dict(softcap=4.0, sinks=True, alibi="h"))
    off = k.shape[2] - q.shape[2]
    run, note = attention_bwd._hopper_backward(q, k, v, True, off, 0.125, every)
    assert run is gluon_bwd.attention_backward_gluon and note == gluon_bwd.path_note(every)
    assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, every)[0] is run
    assert len(attention_bwd._HOPPER) == 1
    softer = every._replace(softcap=8.0)
    assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, softer)[0] is run
    assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, PLAIN)[0] is run
    assert len(attention_bwd._HOPPER) == 3
    windowed = every._replace(left=3)
    run_w, note_w = attention_bwd._hopper_backward(q, k, v, True, off, 0.125, windowed)
    assert run_w is run and note_w == gluon_bwd.path_note(windowed) and "sliding window" in note_w
    torch.use_deterministic_algorithms(True)
    try:  # softcap/ALiBi/windows under deterministic mode: the Gluon backward too, not the TMA pair
        assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, every)[0] is run
        assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, Variant(left=3))[0] is run
        assert attention_bwd._hopper_backward(q, k, v, True, off, 0.125, PLAIN)[0] is run
    finally:
        torch.use_deterministic_algorithms(False)
    assert attention_bwd_hopper.attention_backward_hopper is not run


@pytest.mark.parametrize("case", OPTION_SETS + [("window", dict(window=(5, None), softcap=4.0))],
                         ids=lambda c: c[0])
def test_attention_backward_dispatch_with_options(monkeypatch, case):
    # attention()'s backward hands a call with options (a window too) to the Gluon backward with its
    # Variant and takes dq, dk, dv and dsinks from it. On the CPU the decision is faked and the
    # portable backward on the same inputs stands in for the kernel (same contract), checking the
    # plumbing: the sinks' gradient reaches sinks.grad, the window's sides reach the kernel.
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    from test_attention_hopper import variant_options
    name, opts = case
    calls = []
    real = gluon_bwd.attention_backward_gluon

    def stand_in(do, q, k, v, o, lse, *, scale, causal, dlse=None, variant=None, config=None):
        assert config is None and gluon_bwd._variant_reason(variant) is None and variant is not None
        calls.append((causal, variant))
        if ON_GPU:
            return real(do, q, k, v, o, lse, scale=scale, causal=causal, dlse=dlse, variant=variant)
        with hopper_fwd.disabled():
            return attention_bwd.attention_backward(do, q, k, v, o, lse, dlse, scale=scale, causal=causal,
                                                    causal_offset=k.shape[2] - q.shape[2], mask=None,
                                                    dropout_p=0.0, seed=0, variant=variant)

    monkeypatch.setattr(gluon_bwd, "attention_backward_gluon", stand_in)
    if not ON_GPU:
        monkeypatch.setattr(gluon_bwd, "fast_path", lambda *args, **kwargs: hopper_fwd.enabled())
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    shape, dtype = ((1, 8, 4, 2048, 2048, 128), torch.bfloat16) if ON_GPU else ((1, 4, 2, 20, 37, 64), torch.float16)
    B, Hq, Hkv, Nq, Nk, D = shape
    g = torch.Generator(device=DEVICE).manual_seed(3)
    q0 = torch.randn(B, Hq, Nq, D, generator=g, device=DEVICE).to(dtype)
    k0, v0 = (torch.randn(B, Hkv, Nk, D, generator=g, device=DEVICE).to(dtype) for _ in range(2))
    options = variant_options(opts, shape)

    def grads(causal):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        extra = dict(options)
        leaves = [q, k, v]
        if "sinks" in extra:
            extra["sinks"] = extra["sinks"].clone().requires_grad_()
            leaves.append(extra["sinks"])
        o, lse = fa.attention(q, k, v, causal=causal, return_lse=True, **extra)
        total = o.float().square().sum() + lse[lse.isfinite()].sum()
        return torch.autograd.grad(total, leaves)

    for causal in (True, False):
        calls.clear()
        got = grads(causal)
        assert len(calls) == 1
        assert calls[0][0] == causal and calls[0][1].softcap == opts.get("softcap", 0.0)
        left, right = options.get("window", (None, None))
        assert (calls[0][1].left, calls[0][1].right) == (-1 if left is None else left, -1 if right is None else right)
        with hopper_fwd.disabled():
            want = grads(causal)
        assert len(calls) == 1
        for a, w in zip(got, want):
            assert a.shape == w.shape and a.dtype == w.dtype
            assert (a.float() - w.float()).norm() <= 2e-2 * w.float().norm() + 1e-6


# (option set, head dim, causal, dtype, shape): every option set at d 64 and 128, causal or not, in
# fp16 and bf16 over 40 cases; shapes with partial tiles (odd lengths), Nq ≠ Nk both ways (rows with
# no visible key under causal: with sinks their lse is the sink's logit) and GQA 2:1 and 4:1.
VARIANT_BWD_SHAPES = [(1, 4, 2, 1000, 1037), (2, 4, 1, 517, 517), (1, 2, 2, 1037, 300), (1, 8, 4, 4097, 4097)]
VARIANT_BWD_CASES = [
    (name, d, causal, dtype, VARIANT_BWD_SHAPES[(i + 2 * j + (d == 128)) % len(VARIANT_BWD_SHAPES)])
    for i, (name, _) in enumerate(OPTION_SETS) for j, d in enumerate((64, 128, 256))
    for causal in (False, True) for dtype in (torch.float16, torch.bfloat16)
]


def _variant_case_id(case):
    name, d, causal, dtype, shape = case
    return f"{name}-d{d}-{'causal' if causal else 'full'}-{str(dtype)[6:]}-" + _shape_id(shape)


@needs_gpu
@pytest.mark.parametrize("case", VARIANT_BWD_CASES, ids=_variant_case_id)
def test_options_match_reference_and_portable(case):
    from test_attention_hopper import variant_options
    name, d, causal, dtype, shape = case
    opts = dict(OPTION_SETS)[name]
    check_variant_backward(shape + (d,), dtype, causal, variant_options(opts, shape + (d,)))


@needs_gpu
@pytest.mark.parametrize("case", [
    ("all", dict(softcap=4.0, sinks=True, alibi="bh"), 128, False, torch.bfloat16, (1, 4, 2, 1000, 1037)),
    ("all", dict(softcap=4.0, sinks=True, alibi="h"), 64, True, torch.float16, (2, 4, 1, 517, 517)),
    ("window", dict(window=(8, 1), softcap=30.0), 128, False, torch.float16, (1, 8, 4, 4097, 4097)),
    ("window-alibi", dict(window=(20, None), alibi="h"), 128, True, torch.bfloat16, (1, 2, 2, 1037, 300)),
], ids=lambda c: f"{c[0]}-d{c[2]}-{'causal' if c[3] else 'full'}")
def test_deterministic_options_match_reference_and_repeat(case):
    # Under torch.use_deterministic_algorithms a call with options keeps the Gluon backward: its
    # dK/dV kernel, dq by the portable dQ kernel (one writer per element): the same bits twice,
    # and as close to float64 as the default configs.
    from test_attention_hopper import variant_options
    name, opts, d, causal, dtype, shape = case
    check_variant_backward(shape + (d,), dtype, causal, variant_options(opts, shape + (d,)), deterministic=True)


def check_variant_backward(shape, dtype, causal, options, deterministic=False):
    """The Gluon backward of a call with ``options`` (attention()'s keyword arguments: window,
    softcap, alibi_slopes, sinks) on the portable forward's o and lse, against float64 autograd
    through the reference (and torch's own error in ``dtype``) and the portable backward: dq, dk, dv
    (and dsinks); rows with no visible key get dq exactly 0. ``deterministic``: under
    ``torch.use_deterministic_algorithms(True)`` (a one-writer config), run twice for the same bits."""
    from test_attention_bwd_hopper import make_inputs
    from test_attention_hopper import as_variant, hidden_rows, portable
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    from flashattn_lite.ops.attention_bwd import attention_backward
    q, k, v, do = make_inputs(shape, dtype)
    variant = as_variant(q, k, options)
    assert gluon_bwd.supported(q, k, v, do, causal=causal, variant=variant) is None
    o, lse = portable(q, k, v, causal, variant)  # the saved o and lse (sinks in the lse)
    scale = shape[-1] ** -0.5

    def gluon():
        return gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal, variant=variant)

    torch.use_deterministic_algorithms(deterministic)
    try:
        assert not (deterministic and gluon_bwd.default_config(shape[-1], causal, 4096, True).fused_dq)
        dq, dk, dv, dsinks = gluon()
        if deterministic:
            again = gluon()
            assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), again[:3]))
    finally:
        torch.use_deterministic_algorithms(False)
    with hopper_fwd.disabled():
        port = attention_backward(do, q, k, v, o, lse, None, scale=scale, causal=causal,
                                  causal_offset=k.shape[2] - q.shape[2], mask=None, dropout_p=0.0, seed=0,
                                  variant=variant)

    def reference(work_dtype):
        ref_opts = {n: (t.detach().to(work_dtype).requires_grad_() if n == "sinks" else t)
                    for n, t in options.items()}
        leaves = [t.detach().to(work_dtype).requires_grad_() for t in (q, k, v)]
        out, _ = attention_reference(*leaves, causal=causal, dtype=work_dtype, **ref_opts)
        wrt = leaves + ([ref_opts["sinks"]] if "sinks" in ref_opts else [])
        return torch.autograd.grad(out, wrt, do.to(work_dtype))

    ref, same = reference(torch.float64), reference(dtype)
    eps = 2 * EPS[dtype] + (2e-3 if "softcap" in options else 0.0)  # tanh.approx.f32 in both kernels' scores
    for what, a, p, s, r, x in zip(("dq", "dk", "dv"), (dq, dk, dv), port[:3], same, ref, (q, k, v)):
        assert a.shape == x.shape and a.dtype == dtype and a.stride() == p.stride(), what
        assert_close_to_ref(a, s, r, eps=eps, what=what)
        assert_close_to_ref(a, p, r, eps=eps, what=f"{what} vs the portable backward's error")
    assert (dq[hidden_rows(q, k, causal, options)] == 0).all()
    if "sinks" in options:
        assert dsinks is not None and dsinks.shape == variant.sinks.shape and dsinks.dtype == variant.sinks.dtype
        torch.testing.assert_close(dsinks.float(), port[3].float(), rtol=1e-4, atol=1e-4)  # same δ and lse
        assert_close_to_ref(dsinks, same[3], ref[3], eps=eps, what="dsinks")
    else:
        assert dsinks is None and port[3] is None


def test_group_split_plan(monkeypatch):
    # A dense plain causal GQA call with the fused dQ and split_min_keys keys runs one program per
    # query head's key tile (KV_SHARE = the group; the kernel walks no group), others walk the
    # group in one program.
    q = torch.zeros(2, 8, 1000, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 1037, 64, dtype=torch.bfloat16)
    fused, triton_dq = gluon_bwd.CONFIGS[64][0], gluon_bwd.CONFIGS[64][-1]
    assert gluon_bwd.group_split(q, k, True, None, fused) == 1  # short: walked
    long_k = torch.empty(2, 2, gluon_bwd.SPLIT_MIN_KEYS, 64, device="meta")
    assert gluon_bwd.group_split(q, long_k, True, None, fused) == 4
    assert gluon_bwd.group_split(q, long_k[:, :, 1:], True, None, fused) == 1
    # Wide groups (group × d ≥ 1024: GQA 8 at d 128, measured) split from fewer keys.
    assert gluon_bwd.split_min_keys(4, 64) == gluon_bwd.split_min_keys(8, 64) == gluon_bwd.SPLIT_MIN_KEYS == 4096
    assert gluon_bwd.split_min_keys(4, 128) == 4096 and gluon_bwd.split_min_keys(8, 128) == 2048
    wide_q = torch.empty(1, 16, 2048, 128, device="meta")
    wide_k = torch.empty(1, 2, 2048, 128, device="meta")
    assert gluon_bwd.group_split(wide_q, wide_k, True, None, gluon_bwd.CONFIGS[128][0]) == 8
    assert gluon_bwd.group_split(wide_q, wide_k[:, :, 1:], True, None, gluon_bwd.CONFIGS[128][0]) == 1
    monkeypatch.setattr(gluon_bwd, "split_min_keys", lambda group, d: 0)
    assert gluon_bwd.group_split(q, k, True, None, fused) == 4
    assert gluon_bwd.group_split(q, k, False, None, fused) == 1
    assert gluon_bwd.group_split(q, k, True, Variant(softcap=5.0), fused) == 1
    assert gluon_bwd.group_split(q, q, True, None, fused) == 1
    assert gluon_bwd.group_split(q, k, True, None, triton_dq) == 1  # deterministic: no float32 adds
    plan = gluon_bwd.launch_plan(q, k, gluon_bwd.CONFIGS[64][0], True, PLAIN, kv_share=4)
    assert plan["grid"] == (math.ceil(1037 / 128) * 2 * 8,)
    assert plan["constexprs"]["GROUP"] == 1 and plan["constexprs"]["KV_SHARE"] == 4
    assert "KV_SHARE" not in gluon_bwd.launch_plan(q, k, gluon_bwd.CONFIGS[64][0], True)["constexprs"]
