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

from conftest import DEVICE, ON_GPU, assert_close_to_ref
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
from flashattn_lite.ops.attention_fwd import PLAIN, Variant
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
    # Plain attention only, said before anything about the device; PLAIN and None are plain.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    for variant in (Variant(softcap=30.0), Variant(left=16), Variant(sinks=torch.zeros(2))):
        assert "plain attention only" in gluon_bwd.supported(q, q, q, q, variant=variant)
        with pytest.raises(ValueError, match="plain attention only"):
            gluon_bwd.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.125, causal=False,
                                               variant=variant)
    for variant in (None, PLAIN):
        reason = gluon_bwd.supported(q, q, q, q, variant=variant)
        assert reason is None or "plain attention" not in reason


def test_configs_fit_and_default_is_swept():
    for d, configs in gluon_bwd.CONFIGS.items():
        assert d in gluon_bwd.HEAD_DIMS and configs
        assert len({c.name for c in configs}) == len(configs)
        for causal in (False, True):
            for n in (2048, 8192, 16384):
                assert gluon_bwd.default_config(d, causal, n) in configs
        for cfg in configs:
            assert gluon_bwd.config_reason(d, cfg) is None, cfg.name
            assert cfg.block_n == 128
            assert gluon_bwd.shared_memory_bytes(d, cfg) + gluon_bwd.SMEM_SLACK <= gluon_bwd.SMEM_LIMIT


def test_shared_memory_model():
    # The offline sm_90 compile (triton 3.6) allotted these bytes; the model is within the slack.
    compiled = {(64, gluon_bwd.Config(2, 64, 3, True, 2)): 149504, (64, gluon_bwd.Config(2, 64, 3, False)): 83840,
                (128, gluon_bwd.Config(2, 64, 2, True, 2)): 198112, (128, gluon_bwd.Config(2, 64, 2, False)): 132448}
    for (d, cfg), smem in compiled.items():
        model = gluon_bwd.shared_memory_bytes(d, cfg)
        assert model <= smem <= model + gluon_bwd.SMEM_SLACK, cfg.name


@pytest.mark.parametrize("cfg, why", [
    (gluon_bwd.Config(1, 64, 2, True), "two consumers"),
    (gluon_bwd.Config(2, 128, 2, True), "64-row query tiles"),
    (gluon_bwd.Config(2, 64, 2, True, 3), "dS sets"),
    (gluon_bwd.Config(2, 64, 4, True, 2), "shared memory"),
])
def test_bad_config_is_refused_before_launch(cfg, why):
    assert why in gluon_bwd.config_reason(128, cfg)
    q = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=why):
        gluon_bwd.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.1, causal=True, config=cfg)
    assert "head dim" in gluon_bwd.config_reason(96, gluon_bwd.CONFIGS[64][0])


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


def test_row_stats_are_padded():
    # δ and lse₂ by the portable preprocess (the interpreter runs it here), padded rows δ = 0 and
    # lse₂ = +inf (P = 0 there); a row with no key (lse −inf) gets lse₂ +inf; dlse folds into δ.
    g = torch.Generator().manual_seed(0)
    o, do = (torch.randn(1, 2, 20, 64, generator=g).half().to(DEVICE) for _ in range(2))
    lse = torch.randn(1, 2, 20, generator=g)
    lse[0, 1, 3] = -math.inf
    lse, dlse = lse.to(DEVICE), torch.randn(1, 2, 20, generator=g).to(DEVICE)
    (delta_pad, lse2_pad), (delta, lse2) = gluon_bwd._row_stats(do, o, lse, dlse, 128)
    want_delta = (do.float() * o.float()).sum(-1) - dlse
    assert delta_pad.shape == lse2_pad.shape == (2, 128)
    torch.testing.assert_close(delta_pad[:, :20], want_delta.view(2, 20), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2_pad[0, :20], lse[0, 0] * 1.4426950408889634)
    assert lse2_pad[1, 3] == math.inf
    assert (delta_pad[:, 20:] == 0).all() and (lse2_pad[:, 20:] == math.inf).all()
    assert torch.equal(delta.view(2, 20), delta_pad[:, :20])


def test_dq_conversion_keeps_q_layout():
    # dq is empty_like(q) (q's strides, q's dtype) filled from the dense fp32 buffer.
    q = torch.randn(2, 5, 3, 64).to(torch.bfloat16).transpose(1, 2)  # (B, H, N, D) over (B, N, H, D)
    acc = torch.randn(q.shape)
    dq = gluon_bwd._dq_from_buffer(acc, q)
    assert dq.stride() == q.stride() and dq.dtype == q.dtype
    torch.testing.assert_close(dq.float(), acc, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# CPU: the kernel's schedule, modelled in float64
# ---------------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634


def _box(t, b, h, start, n):
    """A TMA box load: rows [start, start + n) of head (b, h), zeros past the end."""
    out = t.new_zeros((n,) + t.shape[3:])
    hi = min(start + n, t.shape[2])
    if hi > start:
        out[: hi - start] = t[b, h, start:hi]
    return out


def model_backward(do, q, k, v, o, lse, scale, causal, cfg):
    """(dq, dk, dv) computed the way the kernel schedules it, in float64: per program (key tile,
    batch, KV head) the query range [lo, q_end) with masks only from lo to mid or in a warpgroup
    holding keys past Nk, rotated start without causal, the GQA group as one flat loop, padded
    lse₂/δ rows, dQ columns per consumer (D 128) or per step (D 64), rows past the ends dropped."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group, M, C = Hq // Hkv, cfg.block_m, cfg.consumers
    BN = 64 * C
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
        off, q_end = Nk - Nq, -(-Nq // M) * M
        lo = mid = rot = 0
        if causal:
            lo = min(max(start_n - off, 0) // M * M, q_end)
            mid = min(-(-max(start_n + BN - 1 - off, 0) // M) * M, q_end)
        else:
            rot = tile
        n_tiles = (q_end - lo) // M
        kc = [_box(k, b, h_kv, start_n + 64 * c, 64) for c in range(C)]
        vc = [_box(v, b, h_kv, start_n + 64 * c, 64) for c in range(C)]
        dkc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
        dvc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
        for it in range(group * n_tiles):
            g, i = it // n_tiles, it % n_tiles
            if not causal:
                i = (i + rot) % n_tiles
            h, start_m = h_kv * group + g, lo + i * M
            qt, dot = _box(q, b, h, start_m, M), _box(do, b, h, start_m, M)
            l2, dl = lse2[b * Hq + h, start_m:start_m + M], delta[b * Hq + h, start_m:start_m + M]
            ds = []
            for c in range(C):
                keys = start_n + 64 * c + torch.arange(64)
                pt = torch.exp2(kc[c] @ qt.T * scale * LOG2E - l2)
                if start_m < mid or start_n + 64 * (c + 1) > Nk:
                    visible = (keys < Nk)[:, None].expand(64, M)
                    if causal:
                        visible = visible & (keys[:, None] <= (start_m + torch.arange(M) + off)[None, :])
                    pt = torch.where(visible, pt, 0.0)
                assert torch.isfinite(pt).all(), "an unmasked tile overflowed"
                dvc[c] += pt @ dot
                dst = pt * (vc[c] @ dot.T - dl)
                dkc[c] += dst @ qt
                ds.append(dst.T)
            if cfg.fused_dq:
                for me in range(C):
                    cols = [me * 64] if D // 64 == C else ([0] if it % C == me else [])
                    for col in cols:
                        part = sum(ds[c] @ kc[c][:, col:col + 64] for c in range(C)) * scale
                        hi = min(start_m + M, Nq)
                        dq[b, h, start_m:hi, col:col + 64] += part[: hi - start_m]
        for c in range(C):
            s0 = start_n + 64 * c
            hi = min(s0 + 64, Nk)
            dk[b, h_kv, s0:hi] = dkc[c][: max(hi - s0, 0)] * scale
            dv[b, h_kv, s0:hi] = dvc[c][: max(hi - s0, 0)]
    return dq, dk, dv


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
def test_gqa_4_to_1():
    check_backward((1, 8, 2, 1000, 1000, 128), torch.bfloat16, True, None)
    check_backward((2, 8, 2, 333, 777, 64), torch.float16, False, None)


@needs_gpu
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in gluon_bwd.HEAD_DIMS for c in gluon_bwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, gluon_bwd.Config) else f"d{x}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_config_on_partial_tiles(head_dim, config, causal):
    # Tails on both sides and the bottom-right diagonal (Nq < Nk, neither a tile multiple), GQA 2:1.
    check_backward((1, 4, 2, 1000, 1037, head_dim), torch.bfloat16, causal, config)


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
    assert torch.equal(ours[1], dense[1]) and torch.equal(ours[2], dense[2])
    assert (ours[0].float() - dense[0].float()).abs().max() <= 1e-2 * dense[0].float().abs().max()


@needs_gpu
def test_dk_dv_are_deterministic():
    q, k, v, do, o, lse = _saved((2, 8, 2, 2000, 2000, 128), torch.bfloat16, True)
    first = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True)
    second = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True)
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])


@needs_gpu
def test_deterministic_mode_gives_the_same_dq_bits():
    # Under torch.use_deterministic_algorithms the default config computes dq with the Triton dQ
    # kernel (one writer per element) instead of fp32 reduce-adds in any order.
    q, k, v, do, o, lse = _saved((2, 8, 2, 2000, 2000, 128), torch.bfloat16, False)
    torch.use_deterministic_algorithms(True)
    try:
        assert not gluon_bwd.default_config(128, False, 2000, True).fused_dq
        runs = [gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=False) for _ in range(2)]
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
