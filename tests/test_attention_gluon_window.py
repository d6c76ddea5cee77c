"""Sliding windows in the Gluon forward (ops/attention_fwd_gluon.py): FlashAttention-2's window (key j
visible to query i iff i + off − left ≤ j ≤ i + off + right, off = Nk − Nq, a side −1 unbounded,
causal capping right at 0), key tiles outside the band never loaded.

On any machine: the tile ranges each program loads and masks (``key_tiles``, run by the interpreter
or the GPU in a tiny Triton kernel) against the window mask; the launch's window flags and
arguments (a call without a window passes what it passed before windows existed); the configs
chosen; and, on a faked sm_90 device (CPU tensors), what ``supported``, ``fast_path`` and
``attention()`` do with window calls. On an sm_90 GPU with triton 3.6: o and lse against the float64
reference and the Triton TMA kernel over a covering grid of windows, options, dtypes and shapes.
"""
import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE
from flashattn_lite.ops import attention_fwd
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops.attention_fwd import PLAIN, Variant
from flashattn_lite.ops.attention_fwd_gluon import key_tiles as gluon_key_tiles
from flashattn_lite.reference import window_mask
from test_attention_gluon_variants import check, faked_device, needs_gpu, options_for, sm90  # noqa: F401
from test_attention_hopper import _cannot_run as hopper_cannot_run, as_variant, make_qkv, shape_id


# ---------------------------------------------------------------- the tile ranges (any machine)

@triton.jit
def _key_tiles_kernel(out, n_k, off, win_left, win_right, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
                      HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    lo, n_tiles, mid_lo, mid_hi = gluon_key_tiles(t * BLOCK_M, n_k, off, win_left, win_right, CAUSAL, HAS_LEFT,
                                                  HAS_RIGHT, BLOCK_M, BLOCK_N)
    tl.store(out + 4 * t, lo)
    tl.store(out + 4 * t + 1, n_tiles)
    tl.store(out + 4 * t + 2, mid_lo)
    tl.store(out + 4 * t + 3, mid_hi)


def key_tiles(n_q, n_k, left, right, causal, block_m, block_n):
    """(lo, n_tiles, mid_lo, mid_hi) of every query tile, as the Gluon kernel computes them (its
    flags from ``window_flags``, its sides as ``_option_args`` passes them)."""
    variant = Variant(left=left, right=right)
    has_left, has_right = gluon_fwd.window_flags(variant, causal)
    tiles = triton.cdiv(n_q, block_m)
    out = torch.empty(tiles, 4, dtype=torch.int32, device=DEVICE)
    _key_tiles_kernel[(tiles,)](out, n_k, n_k - n_q, left if has_left else 0, right if has_right else 0, causal,
                                has_left, has_right, block_m, block_n)
    return out.tolist()


def visible(n_q, n_k, left, right, causal, rows):
    """[rows, Nk] bool: the keys each of ``rows`` (row indices, past Nq too) sees."""
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = torch.as_tensor(rows)[:, None] + (n_k - n_q)
    j = torch.arange(n_k)[None, :]
    ok = torch.ones(len(rows), n_k, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


# (Nq, Nk, left, right, causal): each side alone and both, causal with and without a left side,
# Nq ≠ Nk both ways, a zero-width band, bands wider than the sequence, and no window (the ranges
# the kernel computed before windows).
RANGE_CASES = [
    (300, 300, 40, -1, False), (300, 300, -1, 40, False), (300, 300, 40, 7, False), (300, 300, 0, 0, False),
    (300, 300, 100, -1, True), (300, 300, 100, 5, True), (300, 300, -1, 5, True), (300, 300, -1, -1, True),
    (300, 300, -1, -1, False), (100, 333, 50, 20, False), (333, 100, 50, 20, False), (333, 100, 30, -1, True),
    (100, 333, 30, -1, True), (257, 1000, 5000, 5000, False), (1000, 257, 0, -1, True), (70, 70, 3, 3, False),
]


@pytest.mark.parametrize("n_q, n_k, left, right, causal", RANGE_CASES,
                         ids=[f"{c[0]}x{c[1]}-l{c[2]}-r{c[3]}{'-causal' if c[4] else ''}" for c in RANGE_CASES])
@pytest.mark.parametrize("block_m, block_n", [(128, 128), (192, 128), (192, 64)], ids=lambda b: str(b))
def test_key_tiles_cover_the_band_and_mask_its_edges(n_q, n_k, left, right, causal, block_m, block_n):
    # Each program loads whole key tiles from lo, covering every key any row of its tile sees, and
    # no tile past the last one a row sees; the tiles in [mid_lo, mid_hi) are seen whole by every
    # row (they run unmasked). A window of W keys loads at most cdiv(BLOCK_M + W, BLOCK_N) + 1 tiles.
    for t, (lo, n_tiles, mid_lo, mid_hi) in enumerate(key_tiles(n_q, n_k, left, right, causal, block_m, block_n)):
        rows = list(range(t * block_m, (t + 1) * block_m))
        seen = visible(n_q, n_k, left, right, causal, rows)
        hi = lo + n_tiles * block_n
        assert lo % block_n == 0 and n_tiles >= 0 and lo >= 0 and hi <= triton.cdiv(n_k, block_n) * block_n
        keys = seen.any(0).nonzero().flatten()
        if len(keys):
            assert lo <= keys.min() and keys.max() < hi, (t, lo, hi)
            assert keys.min() < lo + block_n and hi - block_n <= keys.max(), (t, lo, hi)  # no idle tile
        assert lo <= mid_lo <= mid_hi
        for key in range(lo, hi, block_n):  # the kernel's test: a tile from key runs unmasked iff
            if mid_lo <= key < mid_hi:      # mid_lo ≤ key < mid_hi
                assert key + block_n <= min(mid_hi, n_k) and seen[:, key:key + block_n].all(), (t, key)
        if left >= 0 and (right >= 0 or causal):
            width = left + (0 if causal else right) + 1
            assert n_tiles <= triton.cdiv(block_m + width, block_n) + 1


def test_key_tiles_skip_the_tiles_outside_a_long_window():
    # The benchmark's shape at a smaller scale: causal, 32 key tiles, a window of 4: each program
    # loads at most 2 + 4 tiles, not the causal prefix (O(N·W), not O(N²)).
    n, w = 32 * 128, 4 * 128
    ranges = key_tiles(n, n, w - 1, 0, True, 128, 128)
    assert max(r[1] for r in ranges) <= 6 and sum(r[1] for r in ranges) <= 5 * len(ranges)
    assert ranges[0][0] == 0 and ranges[-1][0] == n - w - 128


# ---------------------------------------------------------------- the launch (any machine)

def test_window_flags_and_arguments():
    # (HAS_LEFT, HAS_RIGHT): causal takes the right side as its diagonal; a causal call without a
    # left side is the plain causal kernel. Sides a launch does not use go as None (constexprs), so
    # a call without a window passes the arguments it passed before windows existed.
    flags = gluon_fwd.window_flags
    assert flags(PLAIN, False) == flags(PLAIN, True) == (False, False)
    assert flags(Variant(left=7), False) == (True, False) and flags(Variant(left=7), True) == (True, False)
    assert flags(Variant(right=3), False) == (False, True) and flags(Variant(right=3), True) == (False, False)
    assert flags(Variant(left=7, right=3), False) == (True, True)
    assert flags(Variant(left=7, right=3), True) == (True, False)
    assert flags(Variant(left=0, right=0), False) == (True, True)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    for variant, causal, sides, has in [
            (Variant(softcap=3.0), True, (None, None), (False, False)),
            (Variant(left=5, softcap=3.0), True, (5, None), (True, False)),
            (Variant(left=5, right=2), False, (5, 2), (True, True)),
            (Variant(right=2, sinks=torch.zeros(2)), False, (None, 2), (False, True)),
            (Variant(right=2, sinks=torch.zeros(2)), True, (None, None), (False, False))]:
        args, launch_flags = gluon_fwd._option_args(variant, q, 0.125, causal)
        assert args[4:6] == sides and (launch_flags["HAS_LEFT"], launch_flags["HAS_RIGHT"]) == has
    args, launch_flags = gluon_fwd._option_args(PLAIN, q, 0.125, True)
    assert args == (None,) * 8 and not any(launch_flags.values())


def test_default_config_keeps_windows_from_spilling():
    # Three consumers (160 registers each) spill with a left side and softcap at d 64 (triton 3.6,
    # sm_90: benchmarks/ptx_hashes.py --ptxas): two consumers then. Without those the window keeps
    # the plain call's config; d 128 takes two consumers at every length and option.
    cfg = gluon_fwd.default_config
    assert cfg(64, True, 32768) == cfg(64, True, 32768, left=True) and cfg(64, True, 32768).consumers == 3
    assert cfg(64, True, 32768, softcap=True, left=True).consumers == 2
    assert cfg(64, False, 2048, softcap=True).consumers == 3
    assert cfg(128, True, 32768, alibi=True, softcap=True, left=True) == cfg(128, True, 32768)
    assert cfg(128, False, 2048, alibi=True, left=True) == cfg(128, False, 2048)
    assert cfg(128, False, 2048).consumers == cfg(128, True, 32768).consumers == 2


# ---------------------------------------------------------------- dispatch (faked sm_90 device)

WINDOWS = [("left", False, (5, None)), ("both", False, (4, 3)), ("right", False, (None, 2)),
           ("causal-left", True, (7, None)), ("causal-both", True, (6, 2))]


@faked_device
@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: c[0])
def test_supported_takes_windows(sm90, case):
    _, causal, window = case
    shape = (2, 4, 2, 17, 23, 64)
    q, k, v = make_qkv(shape, torch.float16)
    for opts in ({}, dict(softcap=4.0, sinks=True, alibi="bh")):
        variant = as_variant(q, k, options_for(dict(opts, window=window), shape))
        assert gluon_fwd.supported(q, k, v, causal=causal, variant=variant) is None
        assert gluon_fwd.supported(q, k, v, causal=causal, variant=variant._replace(left=-2)) is not None


@faked_device
@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: c[0])
def test_window_calls_count_as_causal_for_the_length_rule(sm90, case):
    # A window call takes the Gluon kernel from CAUSAL_MIN_N on (by max(Nq, Nk), not the window's
    # width: a causal 4k window at 32k is long), causal or not; below it the TMA kernel. explain()'s
    # note names the window and the kernel. Plain non-causal calls keep taking it at any length.
    _, causal, window = case
    n_long = gluon_fwd.CAUSAL_MIN_N[64]
    for nq, nk, to_gluon in ((17, 23, False), (40, n_long - 1, False), (40, n_long, True), (n_long, 40, True)):
        shape = (1, 2, 1, nq, nk, 64)
        q, k, v = make_qkv(shape, torch.float16)
        variant = as_variant(q, k, dict(window=window))
        assert gluon_fwd.fast_path(q, k, v, causal, nk - nq, 0.125, variant) == to_gluon
        assert gluon_fwd.fast_path(q, k, v, False, nk - nq, 0.125, PLAIN)
        run, note = attention_fwd._hopper_path(q, k, v, causal, nk - nq, 0.125, variant)
        assert "sliding window" in note
        if to_gluon:
            assert run is gluon_fwd.attention_forward_gluon and note == gluon_fwd.path_note(variant)
            assert "Gluon" in note
        else:
            assert run is hopper.attention_forward_hopper and note == hopper.path_note(variant)


@faked_device
@pytest.mark.parametrize("case", [WINDOWS[1], WINDOWS[3]], ids=lambda c: c[0])
def test_attention_hands_the_window_to_it(sm90, monkeypatch, case):
    # attention() end to end on the faked device, the length rule lowered to the test's size: the
    # Gluon entry point gets the call's Variant with its window (a stand-in runs the TMA kernel in
    # the interpreter), explain() names the Gluon kernel and the window.
    if hopper_cannot_run() is not None:
        pytest.skip(hopper_cannot_run())
    from flashattn_lite import attention, explain
    monkeypatch.setattr(gluon_fwd, "CAUSAL_MIN_N", {64: 16, 128: 16})
    calls = []

    def stand_in(q, k, v, scale, causal, *, variant=PLAIN, config=None):
        assert config is None and gluon_fwd._variant_reason(variant) is None
        calls.append(variant)
        return hopper.attention_forward_hopper(q, k, v, scale, causal, variant=variant,
                                               config=hopper.INTERPRETER_CONFIG)
    monkeypatch.setattr(gluon_fwd, "attention_forward_gluon", stand_in)
    _, causal, window = case
    shape = (1, 4, 2, 17, 23, 64)
    q, k, v = make_qkv(shape, torch.float16)
    options = dict(window=window, softcap=4.0)
    variant = as_variant(q, k, options)
    e = explain(q, k, v, causal=causal, **options)
    assert e.path == "hopper" and e.reason == "attention forward: " + gluon_fwd.path_note(variant)
    o, lse = attention(q, k, v, causal=causal, return_lse=True, **options)
    assert len(calls) == 2 and (calls[-1].left, calls[-1].right) == (variant.left, variant.right)
    o_hop, lse_hop = hopper.attention_forward_hopper(q, k, v, 64 ** -0.5, causal, variant=variant,
                                                     config=hopper.INTERPRETER_CONFIG)
    assert torch.equal(o, o_hop) and torch.equal(lse, lse_hop)


# ---------------------------------------------------------------- the kernel (sm_90 GPU)

# Windows in keys (×37 on shapes of 100 queries or more: test_attention_hopper.variant_options): the
# left side alone, both, the right side alone, causal with a left side, causal with both (the right
# capped at 0), a zero-width band.
GPU_WINDOWS = [("left", False, (5, None)), ("both", False, (4, 3)), ("right", False, (None, 2)),
               ("causal-left", True, (7, None)), ("causal-both", True, (6, 2)), ("zero", False, (0, 0))]
GPU_OPTIONS = [("none", {}), ("softcap", dict(softcap=4.0)), ("alibi-bh-f64", dict(alibi="bh")),
               ("sinks", dict(sinks=True)), ("all", dict(softcap=30.0, sinks=True, alibi="h"))]
# (B, Hq, Hkv, Nq, Nk): odd lengths, Nq ≠ Nk both ways (rows with no visible key when Nq > Nk or
# the band misses them: o = 0, lse = −inf or the sink), GQA 2:1 and 4:1, one query against 4097 keys
# (its band far from key 0: the loader's offset), bands over many tiles (4097: masked edges and an
# unmasked middle).
GPU_SHAPES = [(1, 2, 2, 17, 17), (2, 4, 2, 1000, 1000), (1, 4, 2, 1000, 4097), (1, 2, 2, 4097, 1000),
              (1, 4, 4, 4097, 4097), (1, 4, 2, 1, 4097), (2, 8, 2, 257, 300)]
GPU_SETTINGS = [(128, torch.bfloat16), (64, torch.float16), (128, torch.float16), (64, torch.bfloat16)]
# Each window meets each option set once (30 cases), the shapes and (d, dtype) settings in turn.
GPU_GRID = [(f"{wname}-{oname}", causal, dict(opts, window=window),
             GPU_SHAPES[n % len(GPU_SHAPES)] + (GPU_SETTINGS[n % len(GPU_SETTINGS)][0],),
             GPU_SETTINGS[n % len(GPU_SETTINGS)][1])
            for n, ((wname, causal, window), (oname, opts)) in enumerate(
                (w, o) for w in GPU_WINDOWS for o in GPU_OPTIONS)]


@needs_gpu
@pytest.mark.parametrize("name, causal, opts, shape, dtype", GPU_GRID,
                         ids=[f"{g[0]}-{shape_id(g[3])}-{str(g[4])[6:]}" for g in GPU_GRID])
def test_windows_match_reference_and_tma(name, causal, opts, shape, dtype):
    check(shape, dtype, causal, name, opts)


@needs_gpu
@pytest.mark.parametrize("head_dim, config", [(d, c) for d in gluon_fwd.HEAD_DIMS for c in gluon_fwd.CONFIGS[d]],
                         ids=lambda x: x.name if isinstance(x, gluon_fwd.Config) else f"d{x}")
def test_every_config_with_a_window(head_dim, config):
    # A causal band with every option through each config (the ones default_config avoids for
    # spills compute the same): edges on both sides of many tiles, tails, GQA 2:1.
    check((1, 4, 2, 1000, 1037, head_dim), torch.bfloat16, True, "all",
          dict(window=(9, None), softcap=30.0, sinks=True, alibi="bh"), config)


@needs_gpu
def test_attention_sends_a_long_window_to_it():
    # attention() at CAUSAL_MIN_N with a causal window takes the Gluon kernel (explain() names it and
    # the window) and gives what the kernel called directly gives.
    from flashattn_lite import attention, explain
    n = gluon_fwd.CAUSAL_MIN_N[128]
    q, k, v = make_qkv((2, 4, 2, n, n, 128), torch.bfloat16)  # B 2: MIN_WORK at n 2k
    attention_fwd._HOPPER.clear()
    e = explain(q, k, v, causal=True, window=(1023, 0), backward=False)
    variant = as_variant(q, k, dict(window=(1023, 0)))
    assert e.path == "hopper" and e.reason == "attention forward: " + gluon_fwd.path_note(variant)
    o = attention(q, k, v, causal=True, window=(1023, 0))
    assert torch.equal(o, gluon_fwd.attention_forward_gluon(q, k, v, 128 ** -0.5, True, variant=variant)[0])
