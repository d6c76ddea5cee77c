"""The Gluon backward over packed varlen batches (SEQ_VARLEN) and padded batches with per-row ranges
(SEQ_RANGES): the program → (sequence, key tile) mapping (``seq_key_tile``, run by the Triton
interpreter on CPU) against brute force; a float64 model of the kernel's schedule over a packed
batch (boxes that cross a sequence's end read the next sequence's rows, which the masks must zero,
and dK/dV rows past a sequence's keys are not stored) against float64 autograd; the host's
decisions (supported, fast_path, the launch plan, the dispatch cache); and, on an sm_90 GPU with
triton 3.6 only, the kernel against float64 autograd through ``attention_varlen_reference`` and
against the portable backward.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, ON_GPU, model_only
from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
from flashattn_lite.ops.attention_bwd_gluon import seq_key_tile
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_RANGES, SEQ_VARLEN, Variant
from flashattn_lite.ops.attention_fwd_gluon import window_flags
from test_attention_bwd_gluon import REASON, model_dq_parts, model_query_step, query_tiles
from test_attention_bwd_gluon import sm90  # noqa: F401 - the fixture

LOG2E = 1.4426950408889634
needs_gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))


# ---------------------------------------------------------------------------------------------
# CPU: the mapping helper in the interpreter, against brute force
# ---------------------------------------------------------------------------------------------

@triton.jit
def _seq_key_tile_kernel(out, q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, n_key_tiles, total_q, total_k,
                         BLOCK_N: tl.constexpr, SEQ: tl.constexpr):
    pid = tl.program_id(0)
    if SEQ == 2:
        r = seq_key_tile(pid, 0, q_starts, q_ends, k_starts, k_ends, stride_seq, n_seq, total_q, total_k, BLOCK_N, SEQ)
    else:
        r = seq_key_tile(pid % n_key_tiles, pid // n_key_tiles, q_starts, q_ends, k_starts, k_ends, stride_seq,
                         n_seq, total_q, total_k, BLOCK_N, SEQ)
    for i in tl.static_range(7):
        tl.store(out + 7 * pid + i, r[i])


def key_tiles(variant, total_k, block_n=128, total_q=None):
    """(b, start_n, q0, n_q, k0, n_k, off) of every program of one KV head, as the kernel maps them;
    total_q, total_k: the tensors' rows (varlen: the packed totals, ranges: the padded lengths)."""
    if total_q is None:
        total_q = int(variant.seq_q[-1]) if variant.seq == SEQ_VARLEN else int(variant.seq_q.max())
    if variant.seq == SEQ_VARLEN:
        cq, ck = variant.seq_q, variant.seq_k
        bounds, stride, n_seq = (cq[:-1], cq[1:], ck[:-1], ck[1:]), 1, cq.shape[0] - 1
        programs = triton.cdiv(total_k, block_n) + n_seq
    else:
        sq, sk = variant.seq_q, variant.seq_k
        bounds, stride, n_seq = (sq[:, 0], sq[:, 1], sk[:, 0], sk[:, 1]), 2, sq.shape[0]
        programs = triton.cdiv(total_k, block_n) * n_seq
    out = torch.full((programs, 7), -99, dtype=torch.int32, device=DEVICE)
    _seq_key_tile_kernel[(programs,)](out, *bounds, stride, n_seq, triton.cdiv(total_k, block_n), total_q, total_k,
                                      block_n, variant.seq)
    return out.tolist()


def _cu(lengths):
    return torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32, device=DEVICE)


LENGTHS = [
    ([1], [1]), ([17, 128, 1000], [17, 128, 1000]), ([0, 5, 0, 300], [3, 0, 7, 129]),
    ([128] * 5, [128] * 5), ([1, 17, 128, 1000, 4097], [30, 17, 256, 999, 4097]), ([255, 257, 1], [129, 1, 513]),
]


@model_only
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda p: "-".join(map(str, p[1])))
@pytest.mark.parametrize("block_n", [128])
def test_varlen_key_tiles_cover_every_tile_once(lengths, block_n):
    lq, lk = lengths
    cq, ck = _cu(lq), _cu(lk)
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    seen = {}
    for b, start_n, q0, n_q, k0, n_k, off in key_tiles(variant, sum(lk), block_n):
        if n_k == 0:  # an empty slot: no queries, nothing stored
            assert start_n == 0 and n_q == 0
            continue
        assert (b, start_n) not in seen, "a tile mapped twice"
        seen[(b, start_n)] = (q0, n_q, k0, n_k, off)
    want = {(b, t * block_n): (sum(lq[:b]), lq[b], sum(lk[:b]), lk[b], lk[b] - lq[b])
            for b in range(len(lk)) for t in range(triton.cdiv(lk[b], block_n))}
    assert seen == want


@model_only
@pytest.mark.parametrize("cu_k, total_k", [([0, 50, 400], 300), ([-90, 50, 300], 300), ([0, 200, 300, 20], 300),
                                           ([0, 1000, 0, 0, 0], 1000), ([0, 300, 100, 300], 300)],
                         ids=["past-total", "negative", "end-before-start", "zero-padded-tail", "overlapping"])
def test_varlen_key_tiles_of_bad_bounds(cu_k, total_k):
    # Unchecked bad cu_seqlens: as read by the kernel, every program's sequence lies inside the
    # tensors (the search's starts and the bounds clamped, ``seq_bounds``); as the backward passes
    # them (``nondecreasing_bounds``: clamped, then a running max), the programs cover every key tile
    # of that batch once. (A zero-padded tail read raw sends the search back: tiles lost.)
    n_seq = len(cu_k) - 1
    cq = _cu([30] * n_seq)
    bad = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=torch.tensor(cu_k, dtype=torch.int32, device=DEVICE))
    for b, start_n, q0, n_q, k0, n_k, off in key_tiles(bad, total_k, 128):
        assert 0 <= k0 <= k0 + n_k <= total_k and 0 <= q0 <= q0 + n_q <= int(cq[-1])
        assert 0 <= start_n < max(n_k, 1)
    fixed = gluon_bwd.nondecreasing_bounds(bad, int(cq[-1]), total_k)
    running = [0] * (n_seq + 1)
    for i, c in enumerate(cu_k):
        running[i] = max(min(max(c, 0), total_k), running[i - 1] if i else 0)
    assert fixed.seq_k.tolist() == running and fixed.seq_q.tolist() == cq.tolist()
    lk = [running[i + 1] - running[i] for i in range(n_seq)]
    seen = {}
    for b, start_n, q0, n_q, k0, n_k, off in key_tiles(fixed, total_k, 128):
        if n_k:
            assert (b, start_n) not in seen, "a tile mapped twice"
            seen[(b, start_n)] = (k0, n_k)
    assert seen == {(b, t * 128): (running[b], lk[b]) for b in range(n_seq) for t in range(triton.cdiv(lk[b], 128))}


@model_only
def test_ranges_key_tiles_skip_tiles_past_the_range():
    ranges_q = torch.tensor([[0, 10], [5, 300], [0, 0]], dtype=torch.int32, device=DEVICE)
    ranges_k = torch.tensor([[2, 300], [0, 129], [7, 9]], dtype=torch.int32, device=DEVICE)
    variant = Variant(seq=SEQ_RANGES, seq_q=ranges_q, seq_k=ranges_k)
    got = key_tiles(variant, 300, 128)
    n_tiles = 3
    for pid, (b, start_n, q0, n_q, k0, n_k, off) in enumerate(got):
        bb, t = pid // n_tiles, pid % n_tiles
        assert b == bb
        (q_lo, q_hi), (k_lo, k_hi) = ranges_q[bb].tolist(), ranges_k[bb].tolist()
        assert (q0, k0, off) == (q_lo, k_lo, (k_hi - k_lo) - (q_hi - q_lo))
        if t * 128 < k_hi - k_lo:
            assert (start_n, n_q, n_k) == (t * 128, q_hi - q_lo, k_hi - k_lo)
        else:
            assert (start_n, n_q, n_k) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------
# CPU: the schedule over a packed batch, modelled in float64
# ---------------------------------------------------------------------------------------------

def _packed_box(t, h, start, n):
    """A TMA box load from a packed (1, H, total, D) tensor: rows [start, start + n), the next
    sequence's rows where they cross an end, zeros past the total."""
    out = t.new_zeros((n,) + t.shape[3:])
    hi = min(start + n, t.shape[2])
    if hi > start:
        out[: hi - start] = t[0, h, start:hi]
    return out


def model_backward_varlen(do, q, k, v, o, lse, variant, scale, causal, cfg, window=(-1, -1)):
    """(dq, dk, dv) of a packed batch computed the way the kernel schedules it, in float64: programs
    from ``seq_key_tile`` (interpreter), each sequence's query tiles from ``query_tiles``, boxes
    read across sequence ends (the next sequence's Q, dO, lse₂, δ and K, V: real, finite data), masks
    where the kernel masks (outside [mid_lo, mid_hi), a warpgroup holding the key end, a tile crossing
    the query end), dQ reduce-adds of whole tiles (rows of the next sequence included: they must get
    exact zeros), dK/dV stored only up to the sequence's key end."""
    _, Hq, total_q, D = q.shape
    Hkv, total_k = k.shape[1], k.shape[2]
    group, M, C = Hq // Hkv, cfg.block_m, cfg.consumers
    BN = 64 * C
    left, right = window
    has_left, has_right = window_flags(Variant(left=left, right=right), causal)
    # lse₂ and δ as the kernel reads them: each sequence's rows from an aligned column (``_aligned_rows``)
    delta, lse2, starts = gluon_bwd._aligned_rows((do * o).sum(-1).reshape(1, Hq, total_q),
                                                  torch.where(torch.isinf(lse), math.inf, lse * LOG2E)
                                                  .reshape(1, Hq, total_q), variant)
    pad = delta.shape[1]
    assert (starts % 4 == 0).all()
    dq = torch.zeros_like(q)
    dk = torch.full_like(k, float("nan"))  # every key row must be written by its program
    dv = torch.full_like(v, float("nan"))
    for b, start_n, q0, n_q, k0, n_k, off in key_tiles(variant, total_k, BN):
        if n_q == 0:
            lo = n_tiles = mid_lo = mid_hi = 0
        else:
            ranges = query_tiles(n_q, n_q + off, left, right, causal, M, BN)
            lo, n_tiles, mid_lo, mid_hi = ranges[start_n // BN]
        rotate = not (causal or has_right)
        tile = start_n // BN
        for h_kv in range(Hkv):
            kc = [_packed_box(k, h_kv, k0 + start_n + 64 * c, 64) for c in range(C)]
            vc = [_packed_box(v, h_kv, k0 + start_n + 64 * c, 64) for c in range(C)]
            dkc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
            dvc = [torch.zeros(64, D, dtype=torch.float64) for _ in range(C)]
            for it in range(group * n_tiles):
                g, i = it // n_tiles, it % n_tiles
                if rotate:
                    i = (i + tile) % n_tiles
                h, start_m = h_kv * group + g, lo + i * M
                row = q0 + start_m
                qt, dot = _packed_box(q, h, row, M), _packed_box(do, h, row, M)
                # (a box past the padded columns reads zeros: lse₂ = 0 there, masked as past n_q)
                col = int(starts[b]) + start_m
                l2 = torch.cat([lse2[h, col:col + M], torch.zeros(max(col + M - pad, 0), dtype=torch.float64)])
                dl = torch.cat([delta[h, col:col + M], torch.zeros(max(col + M - pad, 0), dtype=torch.float64)])
                edge = start_m < mid_lo or (has_left and start_m >= mid_hi)
                ds = model_query_step(qt, dot, l2, dl, kc, vc, dkc, dvc, start_n, start_m, edge, n_k, off, window,
                                      has_left, has_right, causal, scale, n_q=n_q)
                hi = min(row + M, total_q)  # the whole box: rows of the next sequence too
                for col, part in model_dq_parts(ds, kc, it, D, scale):
                    nxt = part[q0 + n_q - row:hi - row] if q0 + n_q < hi else part[:0]
                    assert (nxt == 0).all(), "a reduce-add put a nonzero into the next sequence's dQ"
                    dq[0, h, row:hi, col:col + 64] += part[: hi - row]
            for c in range(C):
                s0 = start_n + 64 * c
                n_rows = min(n_k - s0, 64)
                if n_rows > 0:  # TMA store of a full box or masked register stores
                    dk[0, h_kv, k0 + s0:k0 + s0 + n_rows] = dkc[c][:n_rows] * scale
                    dv[0, h_kv, k0 + s0:k0 + s0 + n_rows] = dvc[c][:n_rows]
    return dq, dk, dv


def _reference_varlen(q, k, v, do, lq, lk, scale, causal, window=(-1, -1)):
    """float64 (o, lse, dq, dk, dv) of a packed batch, (1, H, total, D) layout, by autograd per sequence."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    Hq, Hkv = q.shape[1], k.shape[1]
    left, right = window
    os_, lses = [], []
    cq, ck = 0, 0
    for nq, nk in zip(lq, lk):
        qb, kb, vb = q[0, :, cq:cq + nq], k[0, :, ck:ck + nk], v[0, :, ck:ck + nk]
        kb, vb = kb.repeat_interleave(Hq // Hkv, 0), vb.repeat_interleave(Hq // Hkv, 0)
        s = qb @ kb.transpose(1, 2) * scale
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
        off = nk - nq
        visible = torch.ones(nq, nk, dtype=torch.bool)
        r = 0 if causal and right < 0 else (min(right, 0) if causal else right)
        if r >= 0:
            visible &= j <= i + off + r
        if left >= 0:
            visible &= j >= i + off - left
        s = s.masked_fill(~visible, -math.inf)
        lses.append(torch.logsumexp(s.detach(), -1))
        seen = visible.any(-1, keepdim=True)  # rows with no visible key: P = 0 (no NaN gradients)
        p = torch.softmax(torch.where(seen, s, 0.0), -1) * seen
        os_.append(p @ vb)
        cq, ck = cq + nq, ck + nk
    o = torch.cat(os_, 1).unsqueeze(0)
    lse = torch.cat(lses, 1).unsqueeze(0)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return o.detach(), lse.detach(), dq, dk, dv


MODEL_CASES = [  # (q lengths, k lengths, Hq, Hkv)
    ([1, 17, 128], [1, 17, 128], 2, 2),
    ([100, 37, 200], [37, 300, 65], 2, 1),
    ([0, 130, 1, 64], [5, 129, 0, 64], 2, 2),
    ([257, 63], [257, 63], 4, 2),
]


@model_only
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [(-1, -1), (40, -1), (30, 20)], ids=["nowin", "left", "both"])
@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "q{}-k{}".format("_".join(map(str, c[0])),
                                                                              "_".join(map(str, c[1]))))
def test_varlen_schedule_model_matches_reference(case, causal, d, window):
    # Every pair of each sequence visited once, rows and keys of the neighbours masked to exactly 0
    # (their dQ rows get zeros, their dK/dV rows are not written), every key row stored.
    lq, lk, Hq, Hkv = case
    if window == (30, 20) and causal:
        window = (30, -1)
    torch.manual_seed(0)
    q = torch.randn(1, Hq, sum(lq), d, dtype=torch.float64)
    k = torch.randn(1, Hkv, sum(lk), d, dtype=torch.float64)
    v = torch.randn(1, Hkv, sum(lk), d, dtype=torch.float64)
    do = torch.randn(1, Hq, sum(lq), d, dtype=torch.float64)
    scale = d ** -0.5
    o, lse, rdq, rdk, rdv = _reference_varlen(q, k, v, do, lq, lk, scale, causal, window)
    variant = Variant(left=window[0], right=window[1], seq=SEQ_VARLEN, seq_q=_cu(lq).cpu(), seq_k=_cu(lk).cpu())
    cfg = gluon_bwd.default_config(d, causal)
    dq, dk, dv = model_backward_varlen(do, q, k, v, o, lse, variant, scale, causal, cfg, window)
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# CPU: what the host decides
# ---------------------------------------------------------------------------------------------

def _varlen_call(lengths=(17, 128, 1000), Hq=4, Hkv=2, D=64, dtype=torch.float16, **options):
    total = sum(lengths)
    q = torch.zeros(total, Hq, D, dtype=dtype).transpose(0, 1).unsqueeze(0)
    k = torch.zeros(total, Hkv, D, dtype=dtype).transpose(0, 1).unsqueeze(0)
    cu = _cu(list(lengths)).cpu()
    return q, k, k, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu, **options)


@pytest.mark.skipif(not gluon_bwd._HAS_GLUON, reason="this triton has no Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256_varlen_launches_bind_to_their_kernels(monkeypatch, causal):
    # The d 256 kernels over a packed batch: every argument binds to its kernel's parameters, the
    # grids are slots sized from the totals (tiles of the total + one per sequence, per head: no
    # sync), the batch strides 0 (a program's b is its sequence), and the sequence count and the
    # lse₂/δ columns (row_starts) reach both kernels.
    import inspect
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    q, k, _, variant = _varlen_call(D=256, dtype=torch.bfloat16, left=50)
    total, n_seq = q.shape[2], variant.seq_q.shape[0] - 1
    rows = torch.zeros(4, gluon_bwd._pad_rows(total + 3 * n_seq))
    row_starts = torch.zeros(n_seq, dtype=torch.int32)
    cfg = gluon_bwd.default_config(256, causal, total)
    dkdv, dq = wide.launches(q, k, k, q, q, k, k, rows, rows, 0.1, causal, cfg, variant, row_starts)
    for kernel, (grid, args, kwargs), heads in ((wide._attn_bwd_gluon_wide_kernel, dkdv, 2),
                                                (wide._attn_bwd_gluon_wide_dq_kernel, dq, 4)):
        assert grid == ((math.ceil(total / 64) + n_seq) * heads,)
        constexprs = {n: v for n, v in kwargs.items() if n != "num_warps"}
        bound = inspect.signature(kernel.fn).bind(*args, **constexprs).arguments  # a TypeError if they do not match
        assert constexprs["SEQ"] == SEQ_VARLEN and constexprs["HAS_LEFT"]
        assert "QK" not in constexprs  # q at the kernel's 256: S over all of it
        assert bound["n_seq"] == n_seq and bound["row_starts"] is row_starts and bound["stride_seq"] == 1
        assert constexprs["HEADS_FASTEST"]  # (short sequences: ``varlen_slot``, the plan's order)
    # sequences of VARLEN_HEAD_MAJOR_FROM keys on average: both kernels' slots one head after another
    monkeypatch.setattr(gluon_bwd, "VARLEN_HEAD_MAJOR_FROM", total // n_seq)
    for _, _, kwargs in wide.launches(q, k, k, q, q, k, k, rows, rows, 0.1, causal, cfg, variant, row_starts):
        assert "HEADS_FASTEST" not in kwargs
        assert all(bound[name] == 0 for name in bound if name.startswith("stride_d") and name.endswith("b"))


def test_layouts_are_taken():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    for seq in (SEQ_RANGES, SEQ_VARLEN):
        assert gluon_bwd._variant_reason(Variant(seq=seq)) is None
    assert "layout" in gluon_bwd._variant_reason(Variant(seq=7))
    with pytest.raises(ValueError, match="layout"):
        gluon_bwd.attention_backward_gluon(q, q, q, q, q, torch.zeros(1, 2, 8), scale=0.125, causal=False,
                                           variant=Variant(seq=7))


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_supported_and_fast_path_take_varlen_and_ranges(sm90):
    q, k, v, variant = _varlen_call()
    for causal in (False, True):
        assert gluon_bwd.supported(q, k, v, q, causal=causal, causal_offset=5, variant=variant) is None
        assert gluon_bwd.fast_path(q, q, k, v, causal, 0, 0.125, variant=variant)
        # Deterministic mode: dq by the portable dQ kernel (d 64 non-causal: the portable backward).
        assert gluon_bwd.fast_path(q, q, k, v, causal, 0, 0.125, True, variant=variant) == causal
    assert gluon_bwd.supported(q, k, v, q, variant=variant._replace(left=30, softcap=3.0)) is None
    per_seq = torch.zeros(3, 4)
    assert gluon_bwd.supported(q, k, v, q, variant=variant._replace(alibi=per_seq)) is None
    assert "alibi" in gluon_bwd.supported(q, k, v, q, variant=variant._replace(alibi=torch.zeros(1, 4)))
    assert "seq_q" in gluon_bwd.supported(q, k, v, q, variant=variant._replace(seq_q=variant.seq_q.long()))
    assert "sequences" in gluon_bwd.supported(q, k, v, q, variant=variant._replace(seq_k=variant.seq_k[:2]))
    qd = torch.zeros(3, 4, 64, 64, dtype=torch.float16)
    kd = torch.zeros(3, 2, 80, 64, dtype=torch.float16)
    ranges = torch.tensor([[0, 64], [3, 10], [0, 0]], dtype=torch.int32)
    rv = Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=torch.tensor([[0, 80], [5, 60], [1, 2]], dtype=torch.int32))
    assert gluon_bwd.supported(qd, kd, kd, qd, causal=True, variant=rv) is None
    assert "ranges" in gluon_bwd.supported(qd, kd, kd, qd, variant=rv._replace(seq_q=ranges[:2]))


def test_varlen_launch_plan():
    q, k, _, variant = _varlen_call()
    cfg = gluon_bwd.default_config(64)
    plan = gluon_bwd.launch_plan(q, k, cfg, True, variant)
    assert plan["grid"] == ((triton.cdiv(q.shape[2], 128) + 3) * 2,)
    assert plan["constexprs"]["SEQ"] == SEQ_VARLEN
    assert plan["row_stats_shape"] == (4, gluon_bwd._pad_rows(q.shape[2] + 3 * 3))
    assert "SEQ" not in gluon_bwd.launch_plan(q, k, cfg, True, PLAIN)["constexprs"]
    note = gluon_bwd.path_note(variant)
    assert "varlen" in note and "Gluon" in note


def test_varlen_slots_run_one_kv_head_after_another_from_long_sequences():
    # ``varlen_slot``'s order by the sequences' mean key count: every KV head of a slot together
    # below VARLEN_HEAD_MAJOR_FROM (HEADS_FASTEST), one KV head's slots after another from it;
    # ranges and dense batches have no slots (their grids are head-major).
    cfg, long = gluon_bwd.default_config(64), gluon_bwd.VARLEN_HEAD_MAJOR_FROM
    for n_seq, total, fastest in ((3, 3 * long - 1, True), (3, 3 * long, False), (1, long - 1, True)):
        cu = torch.tensor([0] * n_seq + [total], dtype=torch.int32)
        q = torch.empty(1, 4, total, 64, dtype=torch.float16)
        constexprs = gluon_bwd.launch_plan(q, q[:, :2], cfg, True, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu))[
            "constexprs"]
        assert constexprs.get("HEADS_FASTEST", False) == fastest
    ranges = torch.tensor([[0, 10]], dtype=torch.int32)
    q = torch.empty(1, 4, 10, 64, dtype=torch.float16)
    assert "HEADS_FASTEST" not in gluon_bwd.launch_plan(q, q, cfg, True, Variant(seq=SEQ_RANGES, seq_q=ranges,
                                                                                  seq_k=ranges))["constexprs"]


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_backward_decision_is_keyed_by_the_layout(sm90):
    from flashattn_lite.ops import attention_bwd
    q, k, v, variant = _varlen_call()
    run, note = attention_bwd._hopper_backward(q, k, v, True, 0, 0.125, variant)
    assert run is gluon_bwd.attention_backward_gluon and "varlen" in note
    other = variant._replace(seq_q=_cu([500, 645]).cpu(), seq_k=_cu([500, 645]).cpu())
    assert attention_bwd._hopper_backward(q, k, v, True, 0, 0.125, other)[0] is run
    assert attention_bwd._hopper_backward(q, k, v, True, 0, 0.125, PLAIN)[0] is run
    assert len(attention_bwd._HOPPER) == 3
    torch.use_deterministic_algorithms(True)
    try:  # varlen under deterministic mode: the Gluon backward (dq by the portable dQ kernel)
        assert attention_bwd._hopper_backward(q, k, v, True, 0, 0.125, variant)[0] is run
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(ON_GPU, reason="the faked device: CPU tensors")
def test_deterministic_mode_keeps_varlen_on_the_gluon_backward(sm90):
    # Packed batches keep the Gluon backward under deterministic mode: d 256's two kernels write
    # each gradient element once; at d ≤ 128 the dK/dV kernel pairs with the portable dQ kernel
    # (one writer per element), d 64 non-causal calls excepted (the portable backward measured faster).
    from flashattn_lite.ops import attention_bwd
    q, k, v, variant = _varlen_call(lengths=(17, 1000, 4097, 2000), D=256, dtype=torch.bfloat16)
    torch.use_deterministic_algorithms(True)
    try:
        assert gluon_bwd.fast_path(q, q, k, v, True, 0, 0.0625, True, variant=variant)
        run, note = attention_bwd._hopper_backward(q, k, v, True, 0, 0.0625, variant)
        assert run is gluon_bwd.attention_backward_gluon and "head dim 256" in note and "varlen" in note
        for d in (64, 128):
            q, k, v, variant = _varlen_call(lengths=(17, 1000, 4097, 2000), D=d, dtype=torch.bfloat16)
            for causal in (True, False):
                assert gluon_bwd.fast_path(q, q, k, v, causal, 0, 0.088, True, variant=variant) == (causal or d == 128)
    finally:
        torch.use_deterministic_algorithms(False)
        attention_bwd._HOPPER.clear()


# ---------------------------------------------------------------------------------------------
# GPU (sm_90, triton 3.6): against float64 autograd and the portable backward
# ---------------------------------------------------------------------------------------------

GPU_CASES = [  # (q lengths, k lengths, Hq, Hkv, d, causal, dtype)
    ([1, 17, 128, 1000, 4097], None, 2, 2, 128, True, torch.bfloat16),
    ([1, 17, 128, 1000, 4097], None, 2, 2, 128, False, torch.float16),
    ([1, 17, 128, 1000, 4097], None, 4, 2, 64, True, torch.float16),
    ([1, 17, 128, 1000, 4097], None, 4, 2, 64, False, torch.bfloat16),
    ([17, 1000, 1], [300, 999, 129], 4, 1, 128, True, torch.bfloat16),
    ([17, 1000, 1], [300, 999, 129], 4, 1, 128, False, torch.float16),
    ([128, 4097], [1000, 4000], 2, 2, 64, True, torch.bfloat16),
    ([1000, 128], [1, 4097], 2, 1, 64, False, torch.float16),
    ([64] * 7 + [65], None, 2, 2, 128, True, torch.float16),
    ([1] * 9, [17] * 9, 4, 2, 128, True, torch.bfloat16),
    ([333, 0, 257], [333, 5, 0], 2, 2, 64, True, torch.bfloat16),
    ([4097, 17], [17, 4097], 4, 4, 128, True, torch.float16),
    # head dims run padded (``kernel_head_dim``): the masked stores at a sequence's end keep to d
    ([1, 17, 128, 1000, 4097], None, 4, 2, 96, True, torch.bfloat16),
    ([17, 1000, 1], [300, 999, 129], 4, 1, 80, False, torch.float16),
    ([333, 0, 257], [333, 5, 0], 2, 2, 48, True, torch.bfloat16),
    ([17, 1000, 1], [300, 999, 129], 4, 1, 192, True, torch.bfloat16),  # the wide kernels, padded
    # head dim 256: the wide kernels (dK/dV and dQ), with empty sequences and keys
    ([1, 17, 128, 1000, 4097], None, 2, 2, 256, True, torch.bfloat16),
    ([17, 1000, 1], [300, 999, 129], 4, 1, 256, False, torch.float16),
    ([333, 0, 257], [333, 5, 0], 2, 2, 256, True, torch.float16),
    ([64] * 7 + [65], None, 4, 2, 256, False, torch.bfloat16),
]


def _gpu_varlen(lq, lk, Hq, Hkv, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lq), Hq, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(sum(lk), Hkv, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(sum(lk), Hkv, d, device="cuda", generator=g).to(dtype)
    do = torch.randn(sum(lq), Hq, d, device="cuda", generator=g).to(dtype)
    cq = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return q, k, v, do, cq, ck


def _gpu_ranges(N, Hq, Hkv, d, dtype, seed):
    """A padded batch of three rows with per-row ranges (a full row, one whose queries start at 100
    and keys at 3, one of a single query over 17 keys): q, k, v, dO (3, H, N, d) and the Variant."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(3, Hq, N, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(3, Hkv, N, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    rq = torch.tensor([[0, N], [100, N], [N - 1, N]], dtype=torch.int32, device="cuda")
    rk = torch.tensor([[0, N], [3, N], [0, 17]], dtype=torch.int32, device="cuda")
    return q, k, v, do, Variant(seq=SEQ_RANGES, seq_q=rq, seq_k=rk)


def _check_against_reference(got, ref, portable, dtype):
    eps = torch.finfo(dtype).eps
    for name, a, r, p in zip(("dq", "dk", "dv"), got, ref, portable):
        assert torch.isfinite(a).all(), name
        err, err_portable = (a.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        scale = r.abs().max().item() + 1.0
        assert err <= 4 * err_portable + 8 * eps * scale, (name, err, err_portable)


@needs_gpu
@pytest.mark.parametrize("head_major", [False, True], ids=["heads-fastest", "kv-head-major"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "q{}-k{}-h{}:{}-d{}-{}-{}".format(
    "_".join(map(str, c[0][:4])), "same" if c[1] is None else "_".join(map(str, c[1][:4])), c[2], c[3], c[4],
    "causal" if c[5] else "full", str(c[6])[6:]))
def test_varlen_matches_reference_and_portable(monkeypatch, case, head_major):
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.reference import attention_varlen_reference
    lq, lk, Hq, Hkv, d, causal, dtype = case
    lk = lk or lq
    q, k, v, do, cq, ck = _gpu_varlen(lq, lk, Hq, Hkv, d, dtype)
    qr, kr, vr = (t.double().requires_grad_(True) for t in (q, k, v))
    o_ref, _ = attention_varlen_reference(qr, kr.repeat_interleave(Hq // Hkv, 1),
                                          vr.repeat_interleave(Hq // Hkv, 1), cq, ck, causal=causal)
    ref = torch.autograd.grad(o_ref, (qr, kr, vr), do.double())
    # The same saved o and lse through the Gluon backward and the portable one.
    o, lse = fa.attention_varlen(q, k, v, cq, ck, causal=causal, return_lse=True)
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    pk = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731 - the kernels' (1, H, total, D) view
    scale = d ** -0.5
    assert gluon_bwd.supported(pk(q), pk(k), pk(v), pk(do), causal=causal, variant=variant) is None
    if head_major:  # the slots' order of long sequences (``varlen_slot``) on these short ones
        monkeypatch.setattr(gluon_bwd, "VARLEN_HEAD_MAJOR_FROM", 1)
    got = gluon_bwd.attention_backward_gluon(pk(do).contiguous(), pk(q), pk(k), pk(v), pk(o), lse.unsqueeze(0),
                                             scale=scale, causal=causal, variant=variant)[:3]
    got = [g[0].transpose(0, 1) for g in got]
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")  # the portable kernels
    attention_bwd._HOPPER.clear()
    portable = attention_bwd.attention_backward(pk(do), pk(q), pk(k), pk(v), pk(o), lse.unsqueeze(0), None,
                                                scale=scale, causal=causal, causal_offset=0, mask=None,
                                                dropout_p=0.0, seed=0, variant=variant)
    attention_bwd._HOPPER.clear()
    portable = [g[0].transpose(0, 1) for g in portable[:3]]
    _check_against_reference(got, ref, portable, dtype)


@needs_gpu
@pytest.mark.parametrize("tail", ["clamped", "zero-padded"])
@pytest.mark.parametrize("d", [128, 256])
def test_bad_bounds_read_clamped(d, tail):
    # Unchecked bad cu_seqlens (a first row below 0, an end past the total, an end before its start):
    # the Gluon backward (the d <= 128 kernel, d 256's wide pair) computes the gradients of the clamped
    # bounds, as close to float64 as the same kernel given the clamped bounds themselves.
    import flashattn_lite as fa
    from flashattn_lite.reference import attention_varlen_reference
    lq, lk = [1000, 3000, 17], [900, 3100, 40]
    q, k, v, do, cq, ck = _gpu_varlen(lq, lk, 4, 2, d, torch.bfloat16, seed=5)
    as_i32 = lambda c: torch.tensor(c, dtype=torch.int32, device="cuda")  # noqa: E731
    bad_q, bad_k = as_i32([-7, 1000, 4000, 99999, 5]), as_i32([-1, 900, 4000, 4040 + 300, 0])
    if tail == "zero-padded":  # a preallocated cu_seqlens buffer, its unused tail left at 0
        bad_q, bad_k = (torch.cat([c, torch.zeros_like(c[:1])]) for c in (cq, ck))
    clamped_q, clamped_k = (torch.cat([c, c[-1:]]) for c in (cq, ck))  # the last sequence empty
    qr, kr, vr = (t.double().requires_grad_(True) for t in (q, k, v))
    o_ref, _ = attention_varlen_reference(qr, kr.repeat_interleave(2, 1), vr.repeat_interleave(2, 1),
                                          clamped_q, clamped_k, causal=True)
    ref = torch.autograd.grad(o_ref, (qr, kr, vr), do.double())
    o, lse = fa.attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
    pk = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731 - the kernels' (1, H, total, D) view

    def grads(seq_q, seq_k):
        variant = Variant(seq=SEQ_VARLEN, seq_q=seq_q, seq_k=seq_k)
        got = gluon_bwd.attention_backward_gluon(pk(do).contiguous(), pk(q), pk(k), pk(v), pk(o), lse.unsqueeze(0),
                                                 scale=d ** -0.5, causal=True, variant=variant)[:3]
        return [g[0].transpose(0, 1) for g in got]
    _check_against_reference(grads(bad_q, bad_k), ref, grads(clamped_q, clamped_k), torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_varlen_takes_the_gluon_backward(monkeypatch, gluon_backward_calls, causal):
    # attention_varlen()'s backward goes to the Gluon kernel (explain's note says varlen) and agrees
    # with the portable backward (FLASHATTN_LITE_HOPPER=0) to rounding.
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    lq = [1, 17, 128, 1000, 4097, 3000, 2000, 1500]
    q, k, v, do, cq, ck = _gpu_varlen(lq, lq, 8, 2, 128, torch.bfloat16, seed=1)
    calls = gluon_backward_calls

    def grads():
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o = fa.attention_varlen(qq, kk, vv, cq, ck, causal=causal)
        return torch.autograd.grad(o, (qq, kk, vv), do)

    fast = grads()
    assert calls, "the Gluon backward was not taken"
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")
    attention_bwd._HOPPER.clear()
    slow = grads()
    attention_bwd._HOPPER.clear()
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@needs_gpu
@pytest.mark.parametrize("causal, options", [(True, "plain"), (False, "plain"), (True, "gemma"), (False, "all")])
def test_attention_varlen_at_head_dim_256_takes_the_wide_kernels(monkeypatch, gluon_backward_calls, causal, options):
    # Packed varlen at d 256 (sequences of 1 to 4097 rows, GQA 2:1): attention_varlen's backward
    # goes to the head dim 256 Gluon kernels and matches the float64 reference as closely as the
    # portable backward does, plain, with Gemma's options (a window and softcap) and with every
    # option (a two-sided window, softcap, ALiBi per sequence, sinks; their gradients too).
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    from flashattn_lite.reference import attention_varlen_reference
    lq = [17, 300, 1000, 1, 129, 4097, 2000]  # (enough work for the fast path: ``MIN_WORK``)
    q, k, v, do, cq, _ = _gpu_varlen(lq, lq, 4, 2, 256, torch.bfloat16, seed=3)
    g = torch.Generator(device="cuda").manual_seed(5)
    kw = {}
    if options == "gemma":
        kw = dict(window=(200, 0 if causal else -1), softcap=30.0)
    elif options == "all":
        kw = dict(window=(100, 40), softcap=20.0, alibi_slopes=torch.rand(len(lq), 4, device="cuda", generator=g) * 0.1,
                  sinks=torch.randn(4, device="cuda", generator=g))
    pk = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731 - the kernels' (1, H, total, D) view
    variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=cq)
    assert gluon_bwd.supported(pk(q), pk(k), pk(v), pk(do), causal=causal, variant=variant) is None
    calls = gluon_backward_calls

    def grads(dtype=None):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        extra = dict(kw)
        if "sinks" in extra:
            extra["sinks"] = extra["sinks"].clone().requires_grad_(True)
        inputs = (qq, kk, vv) + ((extra["sinks"],) if "sinks" in extra else ())
        if dtype is None:
            o = fa.attention_varlen(qq, kk, vv, cq, cq, causal=causal, **extra)
        else:  # the float64 reference
            inputs = tuple(t.double().detach().requires_grad_(True) for t in inputs)
            if "sinks" in extra:
                extra["sinks"] = inputs[3]
            o, _ = attention_varlen_reference(inputs[0], inputs[1].repeat_interleave(2, 1),
                                              inputs[2].repeat_interleave(2, 1), cq, cq, causal=causal, **extra)
        return torch.autograd.grad(o, inputs, do.to(o.dtype))

    fast = grads()
    assert calls, "the Gluon backward was not taken"
    ref = grads(torch.float64)
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")  # the portable kernels
    attention_bwd._HOPPER.clear()
    portable = grads()
    attention_bwd._HOPPER.clear()
    _check_against_reference(fast, ref, portable, torch.bfloat16)
    if "sinks" in kw:
        err = (fast[3].double() - ref[3]).abs().max().item()
        assert err <= 4 * (portable[3].double() - ref[3]).abs().max().item() + 1e-2 * (ref[3].abs().max().item() + 1)


@needs_gpu
@pytest.mark.parametrize("d, causal", [(64, True), (128, True), (128, False), (256, True)])
def test_varlen_with_options_in_deterministic_mode_and_not(monkeypatch, gluon_backward_calls, d, causal):
    # A packed batch with a window, softcap and ALiBi per sequence keeps the Gluon backward with
    # and without deterministic mode (then at d 256 its two kernels, at d ≤ 128 its dK/dV kernel with
    # the portable dQ kernel; one writer per gradient element): two deterministic calls give the
    # same bits, and both modes agree with the portable backward.
    import flashattn_lite as fa
    from flashattn_lite.ops import attention_bwd
    lq = [17, 300, 1000, 1, 129, 4097, 2000, 4097]  # (enough work for the fast path at d 64: ``MIN_WORK``)
    q, k, v, do, cq, _ = _gpu_varlen(lq, lq, 8, 2, d, torch.bfloat16, seed=4)
    slopes = torch.rand(len(lq), 8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6)) * 0.1
    calls = gluon_backward_calls

    def grads():
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o = fa.attention_varlen(qq, kk, vv, cq, cq, causal=causal, window=(500, 0 if causal else 300), softcap=30.0,
                                alibi_slopes=slopes)
        return torch.autograd.grad(o, (qq, kk, vv), do)

    fused = grads()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [grads(), grads()]
    finally:
        torch.use_deterministic_algorithms(False)
        attention_bwd._HOPPER.clear()
    assert len(calls) == 3
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.isfinite(a).all() and torch.equal(a, b), name
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")
    slow = grads()
    attention_bwd._HOPPER.clear()
    for a, b, c in zip(runs[0], fused, slow):
        torch.testing.assert_close(a.float(), c.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(b.float(), c.float(), rtol=2e-2, atol=2e-2)


@needs_gpu
@pytest.mark.parametrize("d, causal, options", [(64, True, {}), (128, True, {}), (256, True, {}), (256, False, {}),
                                                (256, True, dict(left=300, softcap=30.0)),
                                                (256, True, dict(short_rows=True, alibi=True)),
                                                (128, False, dict(short_rows=True, alibi=True, left=300,
                                                                  deterministic=True)),
                                                (96, True, dict(short_rows=True)),
                                                (80, False, dict(short_rows=True, alibi=True, left=300,
                                                                 deterministic=True)),
                                                (192, True, dict(short_rows=True, alibi=True, left=300, softcap=30.0))],
                         ids=["d64", "d128", "d256", "d256-full", "d256-window-softcap", "d256-short-rows-alibi",
                              "d128-full-deterministic-window-alibi", "d96-short-rows",
                              "d80-full-deterministic-window-alibi",
                              "d192-short-rows-window-softcap-alibi"])
def test_ranges_match_portable(monkeypatch, d, causal, options):
    # A padded batch with per-row ranges (what the HF integration passes): Gluon against portable on
    # the same saved o and lse; rows outside the ranges get zero gradients (d 256 and 192: the wide kernels,
    # whose dQ kernel writes dq rows itself). ``short_rows``: row 0's queries and keys end 300 rows
    # before the tensor's (right padding), so its last query tile crosses the range's end.
    from flashattn_lite.ops import attention_bwd, attention_fwd
    q, k, v, do, variant = _gpu_ranges(1100, 4, 2, d, torch.float16, seed=2)
    options = dict(options)
    deterministic = options.pop("deterministic", False)
    if options.pop("short_rows", False):
        rq, rk = variant.seq_q.clone(), variant.seq_k.clone()
        rq[0, 1] = rk[0, 1] = 800
        variant = variant._replace(seq_q=rq, seq_k=rk)
    if options.pop("alibi", False):  # per (batch row, head) slopes
        options["alibi"] = torch.rand(3, 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    variant = variant._replace(**options)
    scale = d ** -0.5
    o, lse = attention_fwd.attention_forward(q, k, v, scale=scale, causal=causal, causal_offset=0, mask=None,
                                             dropout_p=0.0, seed=0, variant=variant)
    assert gluon_bwd.supported(q, k, v, do, causal=causal, variant=variant) is None
    torch.use_deterministic_algorithms(deterministic)  # (d ≤ 128: dq by the portable dQ kernel)
    try:
        got = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=scale, causal=causal,
                                                 variant=variant)[:3]
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setenv("FLASHATTN_LITE_HOPPER", "0")
    attention_bwd._HOPPER.clear()
    want = attention_bwd.attention_backward(do, q, k, v, o, lse, None, scale=scale, causal=causal, causal_offset=0,
                                            mask=None, dropout_p=0.0, seed=0, variant=variant)[:3]
    attention_bwd._HOPPER.clear()
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    assert (got[0][1, :, :100] == 0).all() and (got[1][2, :, 17:] == 0).all()
    rows, keys = variant.seq_q[0, 1].item(), variant.seq_k[0, 1].item()
    assert (got[0][0, :, rows:] == 0).all() and (got[1][0, :, keys:] == 0).all()


@needs_gpu
@pytest.mark.parametrize("layout", ["varlen", "ranges"])
def test_long_varlen_and_ranges_calls_run_in_chunks(monkeypatch, layout):
    # A cap of one KV head's buffer: a packed batch runs over KV heads, a padded one over rows and
    # KV heads (each chunk with its rows' ranges); the gradients equal the one-launch call's (dk,
    # dv bit for bit, dq up to its fp32 reduce order) and rows outside the ranges stay 0.
    from flashattn_lite.ops import attention_fwd
    Hq, Hkv, d = 4, 2, 64
    if layout == "varlen":
        lq = [17, 1000, 333]
        q, k, v, do, cq, ck = _gpu_varlen(lq, lq, Hq, Hkv, d, torch.bfloat16, seed=3)
        pk = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
        q, k, v, do = pk(q), pk(k), pk(v), pk(do).contiguous()
        variant = Variant(seq=SEQ_VARLEN, seq_q=cq, seq_k=ck)
    else:
        q, k, v, do, variant = _gpu_ranges(700, Hq, Hkv, d, torch.bfloat16, seed=4)
    o, lse = attention_fwd.attention_forward(q, k, v, scale=0.125, causal=True, causal_offset=0, mask=None,
                                             dropout_p=0.0, seed=0, variant=variant)
    whole = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True, variant=variant)
    B, _, N, _ = q.shape
    monkeypatch.setattr(gluon_bwd, "DQ_BUFFER_BYTES", (Hq // Hkv) * N * d * 4)
    chunks = gluon_bwd.dq_buffer_chunks(B, Hq, Hkv, N, d)
    assert len(chunks) == B * Hkv
    parts = gluon_bwd.attention_backward_gluon(do, q, k, v, o, lse, scale=0.125, causal=True, variant=variant)
    assert torch.equal(parts[1], whole[1]) and torch.equal(parts[2], whole[2])
    assert (parts[0].float() - whole[0].float()).abs().max() <= 1e-2 * whole[0].float().abs().max()
    if layout == "ranges":
        assert (parts[0][1, :, :100] == 0).all() and (parts[1][2, :, 17:] == 0).all()


def test_packed_do_is_taken_without_a_copy():
    # attention_backward hands dO to the Hopper backwards as it is wherever TMA can read it (the rule
    # it asks: ``_tensor_reason``), a packed varlen dO, (1, H, total, D) over (total, H, D), among
    # them; an expanded one (of o.sum()) or one whose rows are not 16-byte multiples is made
    # contiguous first.
    from flashattn_lite.ops.attention_bwd import _tensor_reason
    packed = torch.zeros(300, 4, 64, dtype=torch.float16).transpose(0, 1).unsqueeze(0)
    assert _tensor_reason("do", packed) is None
    assert _tensor_reason("do", torch.zeros(1, 1, 1, 64, dtype=torch.float16).expand(1, 4, 300, 64)) is not None
    odd_rows = torch.zeros(300, 4, 66, dtype=torch.float16)[..., :64].transpose(0, 1).unsqueeze(0)
    assert _tensor_reason("do", odd_rows) is not None


@pytest.mark.parametrize("seq", ["varlen", "varlen-bad-tail", "ranges"])
def test_row_stats_start_each_sequence_at_an_aligned_column(seq):
    # A TMA box of lse₂/δ must start 16-byte aligned (an unaligned start is an illegal instruction
    # on the H100): every sequence's first row at a multiple of 4 columns, each of its rows where the
    # kernel reads it (column r + shift), and no other row's value in a column it reads. With a
    # zero-padded, past-the-total tail, the bounds as the backward passes them (``nondecreasing_bounds``).
    g = torch.Generator().manual_seed(0)
    if seq.startswith("varlen"):
        cu = torch.tensor([0, 1, 1, 18, 146, 1146, 1147], dtype=torch.int32)
        variant = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
        if seq == "varlen-bad-tail":
            bad = torch.tensor([-3, 1, 1, 18, 146, 1146, 1147 + 500, 0, 0], dtype=torch.int32)
            variant = gluon_bwd.nondecreasing_bounds(variant._replace(seq_q=bad, seq_k=bad), 1147, 1147)
            cu = torch.cat([cu, cu[-1:], cu[-1:]])
        B, Hq, N = 1, 3, int(cu[-1])
        bounds = [(int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    else:
        rq = torch.tensor([[3, 100], [0, 129], [99, 100], [10, 10]], dtype=torch.int32)
        variant = Variant(seq=SEQ_RANGES, seq_q=rq, seq_k=rq)
        B, Hq, N = 4, 3, 130
        bounds = [tuple(r) for r in rq.tolist()]
    delta, lse2 = torch.randn(B, Hq, N, generator=g), torch.randn(B, Hq, N, generator=g)
    delta_pad, lse2_pad, starts = gluon_bwd._aligned_rows(delta, lse2, variant)
    assert delta_pad.shape == lse2_pad.shape and delta_pad.shape[1] % 128 == 0
    written = torch.zeros_like(delta_pad, dtype=torch.bool)
    for s, (q0, q1) in enumerate(bounds):
        b, first = (0, int(starts[s])) if seq.startswith("varlen") else (s, 0)
        assert first % 4 == 0
        rows = slice(b * Hq, (b + 1) * Hq)
        cols = slice(first, first + q1 - q0)
        assert torch.equal(delta_pad[rows, cols], delta[b, :, q0:q1]) and torch.equal(lse2_pad[rows, cols],
                                                                                      lse2[b, :, q0:q1])
        assert not written[rows, cols].any()  # sequences never share a column
        written[rows, cols] = True
    assert (delta_pad[~written] == 0).all() and (lse2_pad[~written] == math.inf).all()
