"""Sliding windows in the Gluon backward (ops/attention_bwd_gluon.py): FlashAttention-2's window (key j
visible to query i iff i + off − left ≤ j ≤ i + off + right, off = Nk − Nq, a side −1 unbounded,
causal capping right at 0), query tiles outside the band never loaded.

On any machine: the query tiles each key tile visits and masks (``query_tiles``, run by the
interpreter or the GPU in a tiny Triton kernel) against the window mask; the launch's window flags
(a call without a window launches what it launched before windows existed); and, on a faked sm_90
device (CPU tensors), what ``supported``, ``fast_path``, ``attention()`` and ``explain()`` do with
window calls. (The float64 model of the schedule with windows is in test_attention_bwd_gluon.py.)
On an sm_90 GPU with triton 3.6: dq, dk, dv (and dsinks) against the float64 reference and the
portable backward over a compact grid of windows, options, dtypes and shapes.
"""
import pytest
import torch
import triton

from conftest import ON_GPU
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
from flashattn_lite.ops.attention_fwd import PLAIN, Variant
from flashattn_lite.reference import window_mask
from test_attention_bwd_gluon import check_variant_backward, needs_gpu, query_tiles, sm90  # noqa: F401
from test_attention_gluon_window import RANGE_CASES
from test_attention_hopper import as_variant, make_qkv, shape_id

BLOCK_M, BLOCK_N = 64, 128  # the kernel's tiles (``config_reason``)


# ---------------------------------------------------------------- the tile ranges (any machine)

@pytest.mark.parametrize("n_q, n_k, left, right, causal", RANGE_CASES,
                         ids=[f"{c[0]}x{c[1]}-l{c[2]}-r{c[3]}{'-causal' if c[4] else ''}" for c in RANGE_CASES])
def test_query_tiles_cover_the_band_and_mask_its_edges(n_q, n_k, left, right, causal):
    # Each key tile visits whole query tiles from lo, covering every row that sees one of its keys
    # (keys past Nk count as the band's: the kernel masks them in the warpgroup holding them), and
    # no tile without such a row at either end; the tiles starting in [mid_lo, mid_hi) (mid_hi only
    # read under a left side: without one the band runs to Nq) are seen whole by each of their rows
    # below Nq (rows past Nq have P = 0: lse₂ = +inf). A window of W keys visits at most
    # cdiv(BLOCK_N + W, BLOCK_M) + 1 query tiles.
    has_left = left >= 0
    q_end = triton.cdiv(n_q, BLOCK_M) * BLOCK_M
    if causal:
        right = 0
    band = window_mask(q_end, n_k + BLOCK_N, n_k - n_q, left if left >= 0 else None, right if right >= 0 else None)
    band[n_q:] = True  # rows past Nq: P = 0 whatever the mask
    for t, (lo, n_tiles, mid_lo, mid_hi) in enumerate(query_tiles(n_q, n_k, left, right, causal)):
        keys = range(t * BLOCK_N, (t + 1) * BLOCK_N)
        seen = band[:, keys.start:keys.stop]
        hi = lo + n_tiles * BLOCK_M
        assert lo % BLOCK_M == 0 and n_tiles >= 0 and lo >= 0 and hi <= q_end, (t, lo, hi)
        rows = seen[:n_q].any(1).nonzero().flatten()
        real_rows = seen[:n_q, : max(min(n_k - keys.start, BLOCK_N), 0)].any(1).nonzero().flatten()
        if len(real_rows):
            assert lo <= real_rows.min() and real_rows.max() < hi, (t, lo, hi)
        if n_tiles:
            assert rows.min() < lo + BLOCK_M and hi - BLOCK_M <= rows.max(), (t, lo, hi)  # no idle tile
        assert lo <= mid_lo
        for start_m in range(lo, hi, BLOCK_M):  # the kernel's test for an unmasked tile
            if start_m >= mid_lo and (not has_left or start_m < mid_hi):
                assert seen[start_m:start_m + BLOCK_M].all(), (t, start_m)
        if left >= 0 and (right >= 0 or causal):
            width = left + (0 if causal else right) + 1
            assert n_tiles <= triton.cdiv(BLOCK_N + width, BLOCK_M) + 1


def test_query_tiles_skip_the_tiles_outside_a_long_window():
    # The benchmark's shape at a smaller scale: causal, 32 key tiles, a window of 4 of them: each key
    # tile visits at most 2 + 2·4 query tiles of 64 rows, not the rest of the sequence (O(N·W)).
    n, w = 32 * 128, 4 * 128
    ranges = query_tiles(n, n, w - 1, 0, True)
    assert max(r[1] for r in ranges) <= 10 and sum(r[1] for r in ranges) <= 10 * len(ranges)
    assert ranges[0][0] == 0 and ranges[-1][0] == n - 128


def test_plain_ranges_are_the_old_ones():
    # Without a window the helper gives what the kernel computed before windows: causal from the
    # diagonal's first tile to Nq rounded up, masked up to the first row seeing the whole tile;
    # otherwise every row, unmasked.
    for n_q, n_k in ((300, 300), (100, 333), (333, 100), (1, 4097)):
        q_end, off = triton.cdiv(n_q, BLOCK_M) * BLOCK_M, n_k - n_q
        for causal in (False, True):
            for t, (lo, n_tiles, mid_lo, mid_hi) in enumerate(query_tiles(n_q, n_k, -1, -1, causal)):
                start_n = t * BLOCK_N
                want_lo = min(max(start_n - off, 0) // BLOCK_M * BLOCK_M, q_end) if causal else 0
                want_mid = min(triton.cdiv(max(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M, q_end) \
                    if causal else 0
                assert (lo, n_tiles, mid_lo, mid_hi) == (want_lo, (q_end - want_lo) // BLOCK_M, want_mid, q_end)


# ---------------------------------------------------------------- the launch (any machine)

def test_window_flags_and_arguments():
    # The forward's rule (window_flags): causal takes the right side as its diagonal, a causal call
    # without a left side is the plain causal kernel. Sides a launch does not use go as None
    # (constexprs), so a call without a window passes the arguments it passed before windows.
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    for variant, causal, sides, has in [
            (Variant(left=5), True, (5, None), (True, False)),
            (Variant(left=5, right=2), True, (5, None), (True, False)),
            (Variant(left=5, right=2), False, (5, 2), (True, True)),
            (Variant(right=2, softcap=3.0), False, (None, 2), (False, True)),
            (Variant(right=2, softcap=3.0), True, (None, None), (False, False)),
            (Variant(left=0, right=0), False, (0, 0), (True, True))]:
        args, flags = gluon_bwd._option_args(variant, q, 0.125, causal)
        assert args[:2] == sides and (flags["HAS_LEFT"], flags["HAS_RIGHT"]) == has
        constexprs = gluon_bwd.launch_plan(q, q, gluon_bwd.CONFIGS[64][0], causal, variant)["constexprs"]
        assert (constexprs["HAS_LEFT"], constexprs["HAS_RIGHT"]) == has and constexprs["CAUSAL"] is causal
    for variant in (PLAIN, Variant(right=7)):
        args, flags = gluon_bwd._option_args(variant, q, 0.125, True)
        assert args == (None,) * 7 and not any(flags.values())


# ---------------------------------------------------------------- dispatch (faked sm_90 device)

WINDOWS = [("left", False, (5, None)), ("both", False, (4, 3)), ("right", False, (None, 2)),
           ("causal-left", True, (7, None)), ("causal-both", True, (6, 2))]


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: c[0])
def test_supported_and_fast_path_take_windows(sm90, case):
    # Every window, alone or with every option, is taken; under deterministic mode too, dq then by
    # the portable dQ kernel (d 64 non-causal calls keep the portable backward), and a causal call's
    # right side alone is the diagonal (the plain causal kernel).
    _, causal, window = case
    shape = (2, 4, 2, 17, 23, 64)
    q, k, v = make_qkv(shape, torch.float16)
    off = k.shape[2] - q.shape[2]
    for opts in ({}, dict(softcap=4.0, sinks=torch.zeros(4), alibi_slopes=torch.rand(2, 4))):
        variant = as_variant(q, k, dict(opts, window=window))
        assert gluon_bwd.supported(q, k, v, q, causal=causal, variant=variant) is None
        assert gluon_bwd.fast_path(q, q, k, v, causal, off, 0.125, variant=variant)
        assert gluon_bwd.fast_path(q, q, k, v, causal, off, 0.125, True, variant=variant) == causal
        assert "window" in gluon_bwd.supported(q, k, v, q, causal=causal, variant=variant._replace(left=-2))
    diagonal = as_variant(q, k, dict(window=(None, 2)))
    assert gluon_bwd.fast_path(q, q, k, v, True, off, 0.125, True, variant=diagonal)


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
@pytest.mark.parametrize("case", [WINDOWS[1], WINDOWS[3]], ids=lambda c: c[0])
def test_attention_and_explain_take_it_for_windows(monkeypatch, case):
    # attention()'s backward of a window call reaches the Gluon entry point with the call's Variant
    # and explain() names the Gluon backward and the window. On the CPU the decision is faked (as in
    # test_attention_bwd_gluon's dispatch tests) and the portable backward stands in for the kernel.
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.ops import attention_fwd_hopper as hopper_fwd
    calls = []

    def stand_in(do, q, k, v, o, lse, *, scale, causal, dlse=None, variant=None, config=None):
        assert config is None and gluon_bwd._variant_reason(variant) is None
        calls.append(variant)
        with hopper_fwd.disabled():
            return attention_bwd.attention_backward(do, q, k, v, o, lse, dlse, scale=scale, causal=causal,
                                                    causal_offset=k.shape[2] - q.shape[2], mask=None,
                                                    dropout_p=0.0, seed=0, variant=variant)

    monkeypatch.setattr(gluon_bwd, "attention_backward_gluon", stand_in)
    monkeypatch.setattr(gluon_bwd, "fast_path", lambda *args, **kwargs: hopper_fwd.enabled())
    monkeypatch.setattr(attention_bwd, "_HOPPER", {})
    _, causal, window = case
    q, k, v = make_qkv((1, 4, 2, 17, 23, 64), torch.float16)
    variant = as_variant(q, k, dict(window=window))
    e = fa.explain(q, k, v, causal=causal, window=window, backward=True)
    assert e.path == "hopper" and e.reason == "attention backward: " + gluon_bwd.path_note(variant)
    assert "Gluon" in e.reason and "sliding window" in e.reason
    assert len(calls) == 1 and (calls[0].left, calls[0].right) == (variant.left, variant.right)


# ---------------------------------------------------------------- the kernel (sm_90 GPU)

# (name, causal, window (keys; None unbounded), options, (B, Hq, Hkv, Nq, Nk, D), dtype): causal with a
# left side (a right side given too: capped at 0), both sides, each side alone, bands of one key and
# wider than the sequences, odd lengths (1, 17, 1000, 4097), Nq ≠ Nk both ways (rows that see no key:
# dq 0), GQA 2:1 and 4:1, d 64, 128 and 256, fp16 and bf16, the options with windows.
F16, BF16 = torch.float16, torch.bfloat16
GPU_CASES = [
    ("causal-left", True, (255, None), {}, (2, 4, 2, 1000, 1000, 128), BF16),
    ("causal-left-many-tiles", True, (1000, None), {}, (1, 4, 4, 4097, 4097, 64), F16),
    ("causal-left-right-capped", True, (100, 7), {}, (1, 2, 2, 1000, 1037, 128), F16),
    ("causal-left-gqa4", True, (37, None), {}, (1, 8, 2, 1000, 1000, 128), BF16),
    ("causal-one-key", True, (0, None), {}, (1, 2, 2, 1000, 1000, 64), BF16),
    ("causal-wider-than-n", True, (5000, None), {}, (1, 2, 2, 1000, 4097, 128), BF16),
    ("causal-left-nq>nk", True, (100, None), {}, (1, 2, 2, 4097, 1000, 128), F16),
    ("causal-left-one-query", True, (100, None), {}, (1, 4, 2, 1, 4097, 128), BF16),
    ("both", False, (300, 40), {}, (2, 4, 2, 1000, 1000, 128), BF16),
    ("both-nq<nk", False, (64, 64), {}, (1, 4, 2, 1000, 4097, 64), F16),
    ("both-one-key", False, (0, 0), {}, (1, 2, 2, 1000, 1000, 128), BF16),
    ("both-one-key-nq<nk", False, (0, 0), {}, (1, 2, 2, 17, 1000, 64), F16),
    ("both-wider-than-n", False, (5000, 5000), {}, (1, 2, 2, 1000, 1037, 128), BF16),
    ("both-17", False, (3, 2), {}, (1, 2, 2, 17, 17, 64), F16),
    ("both-1", False, (0, 0), {}, (1, 2, 2, 1, 1, 128), BF16),
    ("right", False, (None, 40), {}, (2, 4, 2, 1000, 1000, 128), BF16),
    ("right-zero", False, (None, 0), {}, (1, 2, 2, 1000, 4097, 64), F16),
    ("right-nq>nk", False, (None, 300), {}, (1, 2, 2, 4097, 1000, 128), BF16),
    ("left", False, (200, None), {}, (1, 4, 2, 1000, 1000, 64), BF16),
    ("left-gqa4", False, (500, None), {}, (1, 8, 2, 1037, 1000, 128), F16),
    ("causal-left-all", True, (255, None), dict(softcap=30.0, sinks=True, alibi="bh"),
     (1, 4, 2, 1000, 1037, 128), BF16),
    ("both-all", False, (100, 20), dict(softcap=4.0, sinks=True, alibi="h"), (1, 8, 2, 1000, 1000, 64), F16),
    ("causal-left-sinks-nq>nk", True, (10, None), dict(sinks=True), (1, 2, 2, 1037, 300, 128), F16),
    ("right-alibi", False, (None, 50), dict(alibi="bh"), (1, 4, 2, 1000, 1000, 128), BF16),
    ("left-softcap", False, (70, None), dict(softcap=2.5), (1, 4, 2, 1000, 1000, 128), F16),
    ("causal-left-softcap-d64", True, (129, None), dict(softcap=30.0), (2, 4, 2, 1000, 1000, 64), BF16),
    # d 256: the split-head-dim kernel (attention_bwd_gluon_wide), Gemma's options
    ("causal-left-d256", True, (1023, None), {}, (1, 4, 2, 4097, 4097, 256), BF16),
    ("causal-left-softcap-d256", True, (255, None), dict(softcap=50.0), (1, 4, 2, 1000, 1037, 256), BF16),
    ("both-all-d256", False, (100, 20), dict(softcap=4.0, sinks=True, alibi="bh"), (1, 4, 2, 1000, 1000, 256), F16),
    ("right-alibi-d256", False, (None, 50), dict(alibi="h"), (1, 8, 2, 17, 300, 256), BF16),
]


@needs_gpu
@pytest.mark.parametrize("name, causal, window, opts, shape, dtype", GPU_CASES,
                         ids=[f"{c[0]}-{shape_id(c[4])}-{str(c[5])[6:]}" for c in GPU_CASES])
def test_windows_match_reference_and_portable(name, causal, window, opts, shape, dtype):
    from test_attention_hopper import variant_options
    check_variant_backward(shape, dtype, causal, dict(variant_options(opts, shape), window=window))


@needs_gpu
def test_attention_sends_a_window_backward_to_it():
    # attention() with a causal window: the backward takes the Gluon kernel (explain() names it and
    # the window) and gives what the kernel called directly on the saved o and lse gives (dk, dv bit
    # for bit; dq's fp32 adds arrive in any order).
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    shape = (1, 8, 2, 4096, 4096, 128)
    q0, k0, v0 = make_qkv(shape, torch.bfloat16)
    attention_bwd._HOPPER.clear()
    window = (1023, 0)
    e = fa.explain(q0, k0, v0, causal=True, window=window, backward=True)
    variant = as_variant(q0, k0, dict(window=window))
    assert e.path == "hopper" and e.reason == "attention backward: " + gluon_bwd.path_note(variant)
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    o, lse = fa.attention(q, k, v, causal=True, window=window, return_lse=True)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    direct = gluon_bwd.attention_backward_gluon(do, q0, k0, v0, o.detach(), lse.detach(), scale=128 ** -0.5,
                                                causal=True, variant=variant)
    assert torch.equal(grads[1], direct[1]) and torch.equal(grads[2], direct[2])
    assert (grads[0].float() - direct[0].float()).abs().max() <= 1e-2 * direct[0].float().abs().max()
