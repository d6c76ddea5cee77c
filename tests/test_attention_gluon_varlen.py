"""Packed varlen batches (``attention_varlen``, SEQ_VARLEN) and per-row key ranges (SEQ_RANGES, how
the HF integration passes padded batches) in the Gluon forward (ops/attention_fwd_gluon.py).

On any machine: the (sequence, query tile) scan the kernel shares with the portable one
(``varlen_scan``, run by the interpreter or the GPU in a tiny Triton kernel, lanes passed in as the
Gluon kernel passes its own) against brute force; the launch's grid and arguments (a dense call
passes what it passed before); and, on a faked sm_90 device (CPU tensors), what ``supported``,
``fast_path`` and ``attention_varlen()``/``attention()`` do with such calls. On an sm_90 GPU with
triton 3.6: o and lse against the float64 reference and the portable kernel, mixed lengths 1 … 4097,
Nq ≠ Nk per sequence, GQA, fp16/bf16, d 64/128, causal or not, options.
"""
import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, assert_close_to_ref
from flashattn_lite.ops import attention_fwd
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops import attention_fwd_hopper as hopper
from flashattn_lite.ops.attention_fwd import (PLAIN, SEQ_RANGES, SEQ_VARLEN, Variant, varlen_scan, varlen_slot,
                                             varlen_tile)
from flashattn_lite.reference import attention_reference, attention_varlen_reference
from test_attention_gluon_variants import faked_device, needs_gpu, sm90  # noqa: F401
from test_attention_hopper import EPS, check_lse


# ---------------------------------------------------------------- the tile scan (any machine)

@triton.jit
def _scan_kernel(out, starts, ends, n_seq, total, SCAN: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    b, start_m = varlen_scan(starts, ends, n_seq, total, t, tl.arange(0, SCAN), BLOCK)
    tl.store(out + 4 * t, b)
    tl.store(out + 4 * t + 1, start_m)
    b, start_m = varlen_tile(starts, ends, n_seq, total, t, BLOCK, SCAN)  # the portable kernel's twin
    tl.store(out + 4 * t + 2, b)
    tl.store(out + 4 * t + 3, start_m)


def brute_force_slots(lens, block):
    """(b, start_m) of every slot: each sequence's tiles last-first, in order, then empty slots."""
    slots = [(b, (n_tiles - 1 - i) * block) for b, n in enumerate(lens)
             for n_tiles in [triton.cdiv(n, block)] for i in range(n_tiles)]
    n_slots = triton.cdiv(sum(lens), block) + len(lens)
    return slots + [(len(lens), 0)] * (n_slots - len(slots))


@pytest.mark.parametrize("lens, scan, block", [
    ([1, 17, 128, 1000, 4097], 4, 128), ([1, 17, 128, 1000, 4097], 128, 192),
    ([0, 5, 0, 0, 300, 64, 1], 2, 64), ([3] * 9 + [0, 200], 4, 64), ([7], 8, 128)],
    ids=["mixed-scan4", "mixed-m192", "empty-among", "more-than-chunks", "one"])
def test_scan_maps_every_slot(lens, scan, block):
    # Every (sequence, query tile) exactly once, last tile of each sequence first, chunked scans
    # (``scan`` lanes < sequences) as one; the slots past the last tile say b = n_seq. The same of
    # the portable kernel's ``varlen_tile`` (the scan written out twice: see ``varlen_scan``).
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE)
    n_slots = triton.cdiv(sum(lens), block) + len(lens)
    out = torch.empty(n_slots, 4, dtype=torch.int32, device=DEVICE)
    _scan_kernel[(n_slots,)](out, cu[:-1], cu[1:], len(lens), sum(lens), scan, block)
    assert [tuple(r[:2]) for r in out.tolist()] == brute_force_slots(lens, block)
    assert [tuple(r[2:]) for r in out.tolist()] == brute_force_slots(lens, block)


@pytest.mark.parametrize("cu, total", [([0, 5, 40], 13), ([0, 9, 4, 13], 13), ([-8, 5, 13], 13),
                                       ([0, 300, 100, 300], 300)], ids=["past-total", "decreasing", "negative",
                                                                        "overlapping"])
def test_scan_clamps_bad_bounds_into_the_tensor(cu, total):
    # Unchecked bad cu_seqlens: the scan reads each sequence as seq_bounds clamps it (0 ≤ first ≤ end ≤
    # total), so no slot names a row outside the tensor; a slot past the grid's tiles is simply not run.
    firsts = [min(max(c, 0), total) for c in cu[:-1]]
    lens = [min(max(e, f), total) - f for f, e in zip(firsts, cu[1:])]
    block = 4
    n_slots = triton.cdiv(total, block) + len(lens)
    t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    out = torch.empty(n_slots, 4, dtype=torch.int32, device=DEVICE)
    _scan_kernel[(n_slots,)](out, t[:-1], t[1:], len(lens), total, 2, block)
    want = (brute_force_slots(lens, block) + [(len(lens), 0)] * n_slots)[:n_slots]
    assert [tuple(r[:2]) for r in out.tolist()] == want
    assert [tuple(r[2:]) for r in out.tolist()] == want


# ---------------------------------------------------------------- the launch (any machine, no GPU)

def packed(lens_q, lens_k, hq, hkv, d, dtype, seed=0, device=DEVICE):
    """q (total_q, Hq, d), k, v (total_k, Hkv, d) and the cu_seqlens (int32)."""
    g = torch.Generator().manual_seed(seed)
    cu = [torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
          for lens in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(device, dtype) for _ in range(2))
    return q, k, v, cu[0], cu[1]


def as_4d(t):
    return t.transpose(0, 1).unsqueeze(0)


@triton.jit
def _varlen_slot_kernel(out, n_heads, HEADS_FASTEST: tl.constexpr):
    pid = tl.program_id(0)
    h, slot = varlen_slot(pid, tl.num_programs(0), n_heads, HEADS_FASTEST)
    tl.store(out + 2 * pid, h)
    tl.store(out + 2 * pid + 1, slot)


@pytest.mark.parametrize("heads_fastest", [False, True], ids=["head-major", "heads-fastest"])
@pytest.mark.parametrize("n_heads, n_slots", [(3, 5), (1, 4), (4, 1)])
def test_varlen_slot_takes_every_head_and_slot_once(n_heads, n_slots, heads_fastest):
    # A varlen grid of slots · heads programs: each (head, slot) once, one head's slots after
    # another (the forward's one-tile grid, the backward's from long sequences), or every head of a
    # slot together.
    out = torch.full((2 * n_heads * n_slots,), -1, dtype=torch.int32, device=DEVICE)
    _varlen_slot_kernel[(n_heads * n_slots,)](out, n_heads, heads_fastest)
    got = [tuple(out[2 * p:2 * p + 2].tolist()) for p in range(n_heads * n_slots)]
    if heads_fastest:
        assert got == [(h, s) for s in range(n_slots) for h in range(n_heads)]
    else:
        assert got == [(h, s) for h in range(n_heads) for s in range(n_slots)]


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_launch_grid_and_arguments():
    # Varlen: (cdiv(total, BLOCK_M) + sequences) · Hq slots, the bounds and the output's strides
    # passed, SEQ set, no work queue one tile a program (a persistent launch's: a zeroed int32);
    # ranges: the dense (head-major) grid; a dense call passes None for every one of them and no SEQ
    # (the kernel it compiled to before: benchmarks/ptx_hashes.py).
    q, k, v, cq, ck = packed([5, 300, 17], [9, 300, 40], 4, 2, 64, torch.float16, device="cpu")
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    cfg = gluon_fwd.Config(2, 128, 3, False)
    o, lse = attention_fwd.output_buffers(q4, 64, variant, True)
    grid, args, kwargs = gluon_fwd._launch(q4, k4, v4, o, lse, 0.125, True, cfg, variant)
    assert grid == ((triton.cdiv(322, 128) + 3) * 4,) and kwargs["SEQ"] == SEQ_VARLEN
    bounds = args[-10:-6]
    assert [b.data_ptr() for b in bounds] == [cq.data_ptr(), cq[1:].data_ptr(), ck.data_ptr(), ck[1:].data_ptr()]
    assert args[-6:-4] == (1, 3) and args[-4] is o and args[-3:-1] == (64, 4 * 64) and args[-1] is None
    grid, args, kwargs = gluon_fwd._launch(q4, k4, v4, o, lse, 0.125, True, cfg._replace(persistent=True), variant,
                                           sms=5)
    assert grid == (5,) and kwargs["PERSISTENT"] and args[-1].dtype == torch.int32 and args[-1].tolist() == [0]
    ranges = torch.tensor([[0, 5], [2, 7]], dtype=torch.int32)
    qd, kd = torch.zeros(2, 4, 7, 64, dtype=torch.float16), torch.zeros(2, 2, 9, 64, dtype=torch.float16)
    variant = Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    o, lse = attention_fwd.output_buffers(qd, 64, variant, True)
    grid, args, kwargs = gluon_fwd._launch(qd, kd, kd, o, lse, 0.125, False, cfg, variant)
    assert grid == (8,) and kwargs["SEQ"] == SEQ_RANGES and args[-6:-4] == (2, 2) and args[-1] is None
    assert (o == 0).all() and (lse == float("-inf")).all()  # the padding rows no program writes
    grid, args, kwargs = gluon_fwd._launch(qd, kd, kd, torch.empty_like(qd), torch.empty(2, 4, 7), 0.125, False,
                                           cfg, PLAIN)
    assert "SEQ" not in kwargs and args[-10:] == (None,) * 10


# ---------------------------------------------------------------- dispatch (faked sm_90 device)

OPTIONS = [("none", {}), ("window", dict(left=5)), ("all", dict(left=5, softcap=4.0))]


@faked_device
@pytest.mark.parametrize("case", OPTIONS, ids=lambda c: c[0])
def test_supported_takes_varlen_and_ranges(sm90, case):
    _, opts = case
    q, k, v, cq, ck = packed([5, 17], [9, 40], 4, 2, 64, torch.float16)
    sinks = torch.zeros(4)
    varlen = Variant(**opts, sinks=sinks, seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    for causal in (False, True):
        # The call's causal_offset is unused (each sequence's diagonal is its own).
        assert gluon_fwd.supported(q4, k4, v4, causal=causal, causal_offset=0, variant=varlen) is None
        assert gluon_fwd.fast_path(q4, k4, v4, causal, 0, 0.125, varlen)  # no length rule: see _short
    ranges = torch.tensor([[0, 5], [2, 7]], dtype=torch.int32)
    qd, kd = torch.zeros(2, 4, 7, 64, dtype=torch.float16), torch.zeros(2, 2, 9, 64, dtype=torch.float16)
    dense_ranges = Variant(**opts, seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    assert gluon_fwd.supported(qd, kd, kd, causal=True, variant=dense_ranges) is None
    reason = gluon_fwd.supported
    assert "int32" in reason(q4, k4, v4, variant=varlen._replace(seq_q=cq.long()))
    assert "int32" in reason(qd, kd, kd, variant=dense_ranges._replace(seq_k=ranges.t().contiguous().t()))
    assert "int32" in reason(qd, kd, kd, variant=dense_ranges._replace(seq_q=None))
    assert "layout" in reason(qd, kd, kd, variant=dense_ranges._replace(seq=7))
    assert "head dim" in reason(q4[..., :32], k4[..., :32], v4[..., :32], variant=varlen)


@faked_device
def test_supported_padded_head_dims(sm90):
    # Head dims run padded (``padded_head_dim``): at 96 (to 128) dense, varlen and ranges alike; at
    # 192 (to 256) dense only (the sequence-end store would spill); a head dim that is no multiple
    # of 8 not at all.
    for d, layouts in ((96, True), (48, True), (192, False)):
        q, k, v, cq, ck = packed([5, 17], [9, 40], 4, 2, d, torch.float16)
        varlen = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
        ranges = Variant(seq=SEQ_RANGES, seq_q=torch.tensor([[0, 5], [2, 7]], dtype=torch.int32),
                         seq_k=torch.tensor([[0, 9], [1, 9]], dtype=torch.int32))
        qd, kd = torch.zeros(2, 4, 7, d, dtype=torch.float16), torch.zeros(2, 2, 9, d, dtype=torch.float16)
        assert gluon_fwd.supported(qd, kd, kd, causal=True) is None
        for reason in (gluon_fwd.supported(as_4d(q), as_4d(k), as_4d(v), causal=True, variant=varlen),
                       gluon_fwd.supported(qd, kd, kd, causal=False, variant=ranges)):
            assert (reason is None) == layouts and (layouts or "dense batch only" in reason)
    q = torch.zeros(1, 2, 7, 36, dtype=torch.float16)
    assert "head dim 36" in gluon_fwd.supported(q, q, q)


@faked_device
def test_explain_names_the_layout(sm90):
    q, k, v, cq, ck = packed([5, 17], [9, 40], 4, 2, 64, torch.float16)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    run, note = attention_fwd._hopper_path(as_4d(q), as_4d(k), as_4d(v), True, 0, 0.125, varlen)
    assert run is gluon_fwd.attention_forward_gluon and "varlen" in note and "Gluon" in note
    ranges = torch.tensor([[0, 5], [2, 7]], dtype=torch.int32)
    qd, kd = torch.zeros(2, 4, 7, 64, dtype=torch.float16), torch.zeros(2, 2, 9, 64, dtype=torch.float16)
    variant = Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    run, note = attention_fwd._hopper_path(qd, kd, kd, False, 2, 0.125, variant)
    assert run is gluon_fwd.attention_forward_gluon and "ranges" in note


@faked_device
@pytest.mark.parametrize("layout", ["varlen", "ranges"])
def test_attention_hands_the_layout_to_it(sm90, monkeypatch, layout):
    # attention_varlen() / attention_core(q_ranges=…) end to end on the faked device: the Gluon entry point
    # gets the call's Variant with its layout and bounds (a stand-in runs the portable kernel in its
    # place: Gluon does not run in the interpreter) and the call returns what it returns.
    from flashattn_lite import attention_varlen
    from flashattn_lite.ops.attention import attention_core
    calls = []

    def stand_in(q, k, v, scale, causal, *, variant=PLAIN, config=None):
        assert config is None and gluon_fwd._variant_reason(variant) is None
        calls.append(variant)
        with hopper.disabled():
            return attention_fwd.attention_forward(q, k, v, scale=scale, causal=causal, causal_offset=0, mask=None,
                                                   dropout_p=0.0, seed=0, variant=variant)
    monkeypatch.setattr(gluon_fwd, "attention_forward_gluon", stand_in)
    if layout == "varlen":
        q, k, v, cq, ck = packed([5, 1, 17], [9, 4, 12], 4, 2, 64, torch.float16)
        o, lse = attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
        assert len(calls) == 1 and calls[0].seq == SEQ_VARLEN and calls[0].seq_q is cq
        o_ref, lse_ref = attention_varlen_reference(q, k, v, cq, ck, causal=True)
        assert o.shape == q.shape and lse.shape == (4, q.shape[0])
    else:
        qr = torch.tensor([[3, 20], [0, 12]], dtype=torch.int32)
        kr = torch.tensor([[9, 26], [0, 12]], dtype=torch.int32)
        g = torch.Generator().manual_seed(1)
        q = torch.randn(2, 4, 20, 64, generator=g).half()
        k, v = (torch.randn(2, 2, 26, 64, generator=g).half() for _ in range(2))
        o, lse = attention_core(q, k, v, causal=True, q_ranges=qr, k_ranges=kr, return_lse=True)
        assert len(calls) == 1 and calls[0].seq == SEQ_RANGES
        o_ref, lse_ref = attention_reference(q[:1, :, 3:20], k[:1, :, 9:26], v[:1, :, 9:26], causal=True)
        o, lse = o[:1, :, 3:20], lse[:1, :, 3:20]
    assert (o.double() - o_ref).abs().max() < 1e-2
    assert torch.allclose(lse.double(), lse_ref, atol=1e-2)


# ---------------------------------------------------------------- the kernel (sm_90 GPU)

# Mixed lengths 1 … 4097 (tiles crossing each sequence's end into the next, one-row sequences,
# many tiles), Nq ≠ Nk per sequence both ways (rows with no visible key under causal: o = 0, lse =
# −inf), an empty query sequence among them.
LENS = [([1, 17, 128, 1000, 4097], [1, 17, 128, 1000, 4097]),
        ([17, 1000, 1, 4097, 128], [40, 700, 5, 4097, 300]),
        ([1000, 0, 300, 1], [17, 64, 1000, 4097])]
SETTINGS = [(128, torch.bfloat16), (64, torch.float16), (128, torch.float16), (64, torch.bfloat16)]
GRID = [(lens, d, dtype, causal, hq, hkv)
        for n, (lens, causal, (hq, hkv)) in enumerate((lens, causal, heads) for lens in LENS for causal in (True, False)
                                                       for heads in ((4, 2), (2, 2)))
        for d, dtype in [SETTINGS[n % len(SETTINGS)]]]
# d 256, which only the Gluon forward takes among the Hopper kernels:
GRID += [(LENS[1], 256, torch.bfloat16, True, 4, 2), (LENS[2], 256, torch.float16, False, 2, 2)]
# Head dims run padded to 128 (``padded_head_dim``): a tile crossing a sequence's end takes the
# masked store, which must keep to o's own columns (wider, it would write the next row's first ones).
GRID += [(LENS[1], 96, torch.bfloat16, True, 4, 2), (LENS[2], 80, torch.float16, False, 2, 2)]


def _portable(q4, k4, v4, scale, causal, variant):
    with hopper.disabled():
        return attention_fwd.attention_forward(q4, k4, v4, scale=scale, causal=causal, causal_offset=0, mask=None,
                                               dropout_p=0.0, seed=0, variant=variant)


@needs_gpu
@pytest.mark.parametrize("lens, d, dtype, causal, hq, hkv", GRID,
                         ids=[f"lens{LENS.index(g[0])}-d{g[1]}-{str(g[2])[6:]}-{'causal' if g[3] else 'full'}-"
                              f"h{g[4]}:{g[5]}" for g in GRID])
def test_varlen_matches_reference_and_portable(lens, d, dtype, causal, hq, hkv):
    q, k, v, cq, ck = packed(*lens, hq, hkv, d, dtype)
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    assert gluon_fwd.supported(q4, k4, v4, causal=causal, variant=variant) is None
    scale = d ** -0.5
    o, lse = gluon_fwd.attention_forward_gluon(q4, k4, v4, scale, causal, variant=variant)
    o_ref, lse_ref = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal)
    o_same, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal, dtype=dtype)
    o3 = o[0].transpose(0, 1)
    assert_close_to_ref(o3, o_same.to(DEVICE), o_ref.to(DEVICE), eps=EPS[dtype])
    check_lse(lse[0], lse_ref.to(DEVICE), dtype)
    o_p, lse_p = _portable(q4, k4, v4, scale, causal, variant)
    assert_close_to_ref(o3, o_p[0].transpose(0, 1), o_ref.to(DEVICE), eps=EPS[dtype], what="output vs portable")
    check_lse(lse[0], lse_p[0].double(), dtype)


# The persistent schedule's work queue (``_loader_queue``) at its configs: two Q sets, one, three
# consumers, no turns.
QUEUE_CONFIGS = [(128, gluon_fwd.Config(2, 128, 2, True, persistent=True, v_stages=3), True),
                 (128, gluon_fwd.Config(2, 128, 3, True, persistent=True), False),
                 (64, gluon_fwd.Config(3, 128, 3, True, 160, persistent=True), False),
                 (64, gluon_fwd.Config(2, 128, 3, False, persistent=True), True)]


@needs_gpu
@pytest.mark.parametrize("sms", [1, 7, None], ids=["one-program", "seven-programs", "every-sm"])
@pytest.mark.parametrize("d, cfg, causal", QUEUE_CONFIGS, ids=[f"d{d}-{c.name}-{'causal' if x else 'full'}"
                                                               for d, c, x in QUEUE_CONFIGS])
def test_persistent_varlen_takes_every_tile_once(d, cfg, causal, sms):
    # 100 sequences of 0 … 300 rows (the loader's scan over several chunks of bounds, empty
    # sequences, Nq ≠ Nk), taken from the queue by one program (every tile, the Q sets wrapping
    # around many times), by seven, by one per SM: o and lse, written into NaN-filled buffers,
    # match the float64 reference everywhere.
    g = torch.Generator().manual_seed(5)
    lens_q = torch.randint(0, 301, (100,), generator=g).tolist()
    lens_k = [n + int(x) for n, x in zip(lens_q, torch.randint(0, 40, (100,), generator=g))]
    q, k, v, cq, ck = packed(lens_q, lens_k, 4, 2, d, torch.bfloat16, seed=5)
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    o, lse = attention_fwd.output_buffers(q4, d, variant, True)
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    grid, args, kwargs = gluon_fwd._launch(q4, k4, v4, o, lse, d ** -0.5, causal, cfg, variant, sms=sms)
    assert kwargs["PERSISTENT"] and (sms is None or grid == (sms,))
    gluon_fwd._attn_fwd_gluon_launcher[grid](*args, **kwargs)
    o_ref, lse_ref = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal)
    o_same, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=causal, dtype=torch.bfloat16)
    assert_close_to_ref(o[0].transpose(0, 1), o_same.to(DEVICE), o_ref.to(DEVICE), eps=EPS[torch.bfloat16])
    check_lse(lse[0], lse_ref.to(DEVICE), torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("sms", [1, 7, None], ids=["one-program", "seven-programs", "every-sm"])
@pytest.mark.parametrize("d, cfg, causal", QUEUE_CONFIGS[:3:2], ids=[f"d{d}-{c.name}-{'causal' if x else 'full'}"
                                                                     for d, c, x in QUEUE_CONFIGS[:3:2]])
def test_persistent_ranges_take_every_tile_once(d, cfg, causal, sms):
    # Per-row ranges on the queue: 9 rows (an empty range, a one-row one, whole rows, ranges ending
    # mid-tile), each row's tiles only (none past its range's end), rows inside the ranges written
    # into NaN, the padding left at 0 / −inf.
    B, L, S = 9, 700, 900
    qr = torch.tensor([[0, 700], [5, 5], [699, 700], [3, 300], [0, 129], [128, 700], [1, 2], [17, 650], [0, 64]],
                      dtype=torch.int32, device=DEVICE)
    kr = torch.tensor([[0, 900], [0, 17], [2, 900], [9, 300], [0, 129], [100, 900], [0, 1], [0, 650], [0, 64]],
                      dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(B, 4, L, d, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(B, 2, S, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    variant = Variant(seq=SEQ_RANGES, seq_q=qr, seq_k=kr)
    o, lse = attention_fwd.output_buffers(q, d, variant, True)
    for b, (a0, a1) in enumerate(qr.tolist()):
        o[b, :, a0:a1] = float("nan")
        lse[b, :, a0:a1] = float("nan")
    grid, args, kwargs = gluon_fwd._launch(q, k, v, o, lse, d ** -0.5, causal, cfg, variant, sms=sms)
    assert kwargs["PERSISTENT"] and (sms is None or grid == (sms,))
    gluon_fwd._attn_fwd_gluon_launcher[grid](*args, **kwargs)
    for b in range(B):
        (a0, a1), (b0, b1) = qr[b].tolist(), kr[b].tolist()
        outside = torch.ones(L, dtype=torch.bool, device=DEVICE)
        outside[a0:a1] = False
        assert (o[b][:, outside] == 0).all() and (lse[b][:, outside] == float("-inf")).all()
        if a1 > a0:
            sl = [t[b:b + 1, :, r0:r1] for t, (r0, r1) in ((q, (a0, a1)), (k, (b0, b1)), (v, (b0, b1)))]
            o_ref, lse_ref = attention_reference(*sl, causal=causal)
            o_same, _ = attention_reference(*sl, causal=causal, dtype=torch.bfloat16)
            assert_close_to_ref(o[b:b + 1, :, a0:a1], o_same, o_ref, eps=EPS[torch.bfloat16])
            check_lse(lse[b:b + 1, :, a0:a1], lse_ref, torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16), (256, torch.bfloat16),
                                      (96, torch.bfloat16), (48, torch.float16)],
                         ids=["d128-bf16", "d64-fp16", "d256-bf16", "d96-bf16", "d48-fp16"])
def test_varlen_with_window_and_options(d, dtype):
    # A causal window with softcap, per-sequence ALiBi slopes (B, Hq) and sinks, across sequence ends.
    lens_q, lens_k = [17, 1000, 1, 4097], [40, 1000, 5, 4097]
    q, k, v, cq, ck = packed(lens_q, lens_k, 4, 2, d, dtype)
    g = torch.Generator().manual_seed(3)
    opts = dict(window=(300, 0), softcap=30.0, sinks=torch.randn(4, generator=g).to(DEVICE),
                alibi_slopes=torch.rand(4, 4, generator=g).to(DEVICE) * 0.05)
    from flashattn_lite import attention_varlen
    attention_fwd._HOPPER.clear()
    o, lse = attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True, **opts)
    o_ref, lse_ref = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=True, **opts)
    o_same, _ = attention_varlen_reference(q, k, v, cq.cpu(), ck.cpu(), causal=True, dtype=dtype, **opts)
    assert_close_to_ref(o, o_same.to(DEVICE), o_ref.to(DEVICE), eps=EPS[dtype])
    check_lse(lse, lse_ref.to(DEVICE), dtype)


@needs_gpu
@pytest.mark.parametrize("d, dtype, causal", [(128, torch.bfloat16, True), (64, torch.float16, False),
                                              (128, torch.float16, False), (64, torch.bfloat16, True),
                                              (96, torch.bfloat16, True), (80, torch.float16, False)],
                         ids=["d128-bf16-causal", "d64-fp16-full", "d128-fp16-full", "d64-bf16-causal",
                              "d96-bf16-causal", "d80-fp16-full"])
def test_ranges_match_reference_and_zero_the_padding(d, dtype, causal):
    # Padded batch rows (the HF integration's layout): each row's [start, end) alone, bottom-right
    # aligned; padding rows o = 0, lse = −inf; partial tiles at each range's end store no padding row.
    B, L, S = 3, 1000, 1300
    qr = torch.tensor([[3, 1000], [0, 129], [999, 1000]], dtype=torch.int32, device=DEVICE)
    kr = torch.tensor([[9, 1300], [0, 129], [2, 700]], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, 4, L, d, generator=g).to(DEVICE, dtype)
    k, v = (torch.randn(B, 2, S, d, generator=g).to(DEVICE, dtype) for _ in range(2))
    variant = Variant(seq=SEQ_RANGES, seq_q=qr, seq_k=kr)
    assert gluon_fwd.supported(q, k, v, causal=causal, variant=variant) is None
    o, lse = gluon_fwd.attention_forward_gluon(q, k, v, d ** -0.5, causal, variant=variant)
    o_p, lse_p = _portable(q, k, v, d ** -0.5, causal, variant)
    for b in range(B):
        (a0, a1), (b0, b1) = qr[b].tolist(), kr[b].tolist()
        sl = [t[b:b + 1, :, r0:r1] for t, (r0, r1) in ((q, (a0, a1)), (k, (b0, b1)), (v, (b0, b1)))]
        o_ref, lse_ref = attention_reference(*sl, causal=causal)
        o_same, _ = attention_reference(*sl, causal=causal, dtype=dtype)
        assert_close_to_ref(o[b:b + 1, :, a0:a1], o_same, o_ref, eps=EPS[dtype])
        check_lse(lse[b:b + 1, :, a0:a1], lse_ref, dtype)
        outside = torch.ones(L, dtype=torch.bool, device=DEVICE)
        outside[a0:a1] = False
        assert (o[b][:, outside] == 0).all() and (lse[b][:, outside] == float("-inf")).all()
    # The portable kernel on the same inputs: the same rows written, within the dtype's rounding
    # (rows, not elements: an output element near 0 may round to exactly 0 in one kernel only).
    assert torch.equal((o == 0).all(-1), (o_p == 0).all(-1))
    assert torch.equal(lse == float("-inf"), lse_p == float("-inf"))
    assert (o.float() - o_p.float()).abs().max() < 4 * EPS[dtype]
