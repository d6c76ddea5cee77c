"""decode(): split-KV attention of new tokens against contiguous and paged KV caches, checked per
sequence against float64 attention over that sequence's valid keys (causal, bottom-right)."""
import threading
import warnings

import pytest
import torch

from bound_launch import InterpretedLaunch
from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only
from flashattn_lite import attention, decode
from flashattn_lite.ops import decode as decode_module
from flashattn_lite.ops import decode_mla_gluon
from flashattn_lite.ops.decode import MAX_SPLITS, MIN_SPLIT_LEN, WAVES, choose_num_splits
from flashattn_lite.reference import attention_reference

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}
NEG_INF = float("-inf")


def make_cache(B, Hq, Hkv, Nq, D, Dv, lengths, *, block_size=None, capacity=None, dtype=torch.float16, seed=0):
    """q, k_cache, v_cache, cache_seqlens, block_table and the per-sequence dense K/V.

    Paged: blocks are handed out in a shuffled order (with spare blocks), table padding is −1.
    Cache positions past each length hold NaN: a kernel that reads them poisons its output.
    """
    g = torch.Generator().manual_seed(seed)
    capacity = capacity or max(max(lengths), 1)
    dense_k = [torch.randn(Hkv, L, D, generator=g) for L in lengths]
    dense_v = [torch.randn(Hkv, L, Dv, generator=g) for L in lengths]
    q = torch.randn(B, Hq, Nq, D, generator=g)
    if block_size is None:
        k_cache = torch.full((B, Hkv, capacity, D), float("nan"))
        v_cache = torch.full((B, Hkv, capacity, Dv), float("nan"))
        for b, L in enumerate(lengths):
            k_cache[b, :, :L], v_cache[b, :, :L] = dense_k[b], dense_v[b]
        table = None
    else:
        max_blocks = -(-capacity // block_size)
        used = [-(-L // block_size) for L in lengths]
        num_blocks = sum(used) + 3
        perm = torch.randperm(num_blocks, generator=g)
        k_cache = torch.full((num_blocks, Hkv, block_size, D), float("nan"))
        v_cache = torch.full((num_blocks, Hkv, block_size, Dv), float("nan"))
        table = torch.full((B, max_blocks), -1, dtype=torch.int32)
        nxt = 0
        for b, L in enumerate(lengths):
            for j in range(used[b]):
                blk = int(perm[nxt])
                nxt += 1
                table[b, j] = blk
                n = min(block_size, L - j * block_size)
                k_cache[blk, :, :n] = dense_k[b][:, j * block_size:j * block_size + n]
                v_cache[blk, :, :n] = dense_v[b][:, j * block_size:j * block_size + n]
        table = table.to(DEVICE)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    to = lambda t: t.to(DEVICE, dtype)  # noqa: E731
    return to(q), to(k_cache), to(v_cache), seqlens, table, [to(k) for k in dense_k], [to(v) for v in dense_v]


def reference(q, dense_k, dense_v, scale=None):
    """Per sequence: causal bottom-right attention over its L valid keys; float64 and q's dtype."""
    outs = []
    for dtype in (torch.float64, q.dtype):
        o_all, lse_all = [], []
        for b, (k, v) in enumerate(zip(dense_k, dense_v)):
            if k.shape[1] == 0:
                o_all.append(torch.zeros(q.shape[1], q.shape[2], v.shape[-1], dtype=dtype, device=q.device))
                lse_all.append(torch.full(q.shape[1:3], NEG_INF, dtype=dtype, device=q.device))
                continue
            o, lse = attention_reference(q[b:b + 1], k[None], v[None], causal=True, scale=scale, dtype=dtype)
            o_all.append(o[0])
            lse_all.append(lse[0])
        outs.append((torch.stack(o_all), torch.stack(lse_all)))
    return outs


def check(o, lse, q, dense_k, dense_v, scale=None):
    (o_ref, lse_ref), (o_same, _) = reference(q, dense_k, dense_v, scale)
    assert o.shape == o_ref.shape and o.dtype == q.dtype and lse.dtype == torch.float32
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[q.dtype])
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "empty rows must (only) give lse = -inf"
    assert (lse[~finite] == NEG_INF).all() and (o[~finite] == 0).all()
    torch.testing.assert_close(lse.double()[finite], lse_ref[finite], atol=2e-3 if q.dtype == torch.float32 else 2e-2,
                               rtol=0)


# (B, Hq, Hkv, Nq, D, Dv, lengths, block_size or None (contiguous), capacity or None)
CPU_CASES = {
    "contig-gqa2-nq1-ragged": (3, 4, 2, 1, 32, 32, [70, 1, 37], None, 80),
    "contig-mqa-nq3-short": (2, 4, 1, 3, 32, 32, [40, 2], None, 48),
    "contig-mha-d40-dv24": (1, 2, 2, 1, 40, 24, [33], None, None),
    "contig-empty-seq": (2, 2, 1, 2, 16, 16, [0, 20], None, 24),
    "paged16-gqa4-nq2": (3, 8, 2, 2, 32, 32, [70, 5, 33], 16, 80),
    "paged8-gqa4-nq1": (2, 4, 1, 1, 32, 32, [45, 17], 8, None),
    "paged12-mqa-nq4": (2, 4, 1, 4, 16, 16, [30, 3], 12, 36),
    "paged32-rowblocks": (1, 16, 1, 5, 16, 16, [50], 32, None),     # 80 query rows: two row tiles
}
GPU_CASES = {
    "contig-llama-nq1": (4, 32, 8, 1, 128, 128, [5000, 300, 1, 4097], None, 6000),
    "paged16-llama-nq1": (4, 32, 8, 1, 128, 128, [5000, 300, 17, 4097], 16, 6000),
    "paged256-llama-nq4": (3, 32, 8, 4, 128, 128, [9000, 700, 4], 256, 9216),
    "paged64-mqa-d64-nq8": (2, 16, 1, 8, 64, 64, [3000, 64], 64, None),
    "contig-mha-d256": (2, 4, 4, 2, 256, 256, [2000, 999], None, None),
    "paged16-batch64": (64, 32, 8, 1, 128, 128, [100 + 37 * i for i in range(64)], 16, None),
}
CASES = {**CPU_CASES, **(GPU_CASES if ON_GPU else {})}
# auto, none, a few, many (more splits than key tiles: empty splits). The interpreter runs one
# program at a time, so CPU runs fewer fp32 variants.
SPLITS = [None, 1, 3, 64] if ON_GPU else [None, 1, 3, 12]
PARAMS = [(dtype, name, s) for dtype in DTYPES for name in CASES for s in SPLITS
          if ON_GPU or dtype != torch.float32 or s in (None, 3)]
# float32 on the GPU, as on the CPU, at auto and 3 splits (the split logic is dtype-free), on the cases
# of each kind: ragged with length 1, odd D ≠ Dv, an empty sequence, odd pages with Nq 4, two row tiles,
# and 256-key pages over 9000 keys (fp16/bf16 run every case).
FP32_GPU_CASES = ["contig-gqa2-nq1-ragged", "contig-mha-d40-dv24", "contig-empty-seq", "paged12-mqa-nq4",
                  "paged32-rowblocks", "paged256-llama-nq4"]


@pytest.mark.parametrize("dtype,name,num_splits", PARAMS,
                         ids=[f"{str(d).split('.')[-1]}-{n}-splits{s}" for d, n, s in PARAMS])
@gpu_fp32_only(name=FP32_GPU_CASES, num_splits=[None, 3])
def test_decode_matches_attention(dtype, name, num_splits):
    B, Hq, Hkv, Nq, D, Dv, lengths, bs, cap = CASES[name]
    q, kc, vc, seqlens, table, dk, dv = make_cache(B, Hq, Hkv, Nq, D, Dv, lengths, block_size=bs, capacity=cap,
                                                   dtype=dtype)
    o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=num_splits, return_lse=True)
    check(o, lse, q, dk, dv)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_scale_and_plain_return(paged):
    q, kc, vc, seqlens, table, dk, dv = make_cache(2, 4, 2, 2, 32, 32, [21, 40], block_size=16 if paged else None,
                                                   seed=1)
    o, lse = decode(q, kc, vc, seqlens, block_table=table, scale=0.3, num_splits=2, return_lse=True)
    check(o, lse, q, dk, dv, scale=0.3)
    o_plain = decode(q, kc, vc, seqlens, block_table=table, scale=0.3, num_splits=2)
    assert isinstance(o_plain, torch.Tensor)
    torch.testing.assert_close(o_plain, o, atol=0, rtol=0)


def test_equals_library_attention_on_dense_cache():
    """With every sequence full (L = Nmax), decode is attention(q, k, v, causal=True)."""
    q, kc, vc, seqlens, _, _, _ = make_cache(2, 4, 2, 3, 32, 32, [48, 48], seed=2)
    o, lse = decode(q, kc, vc, seqlens, num_splits=3, return_lse=True)
    o_ref, lse_ref = attention(q, kc, vc, causal=True, return_lse=True)
    torch.testing.assert_close(o, o_ref, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=0)


def test_inputs_requiring_grad_are_warned_of():
    """decode records nothing for autograd: a training loop calling it is told, not handed a detached o."""
    q, kc, vc, seqlens, _, _, _ = make_cache(1, 2, 1, 1, 16, 16, [5], capacity=8, seed=0)
    with pytest.warns(UserWarning, match="inference only"):
        o = decode(q.clone().requires_grad_(), kc, vc, seqlens)
    assert not o.requires_grad
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        decode(q.clone().requires_grad_(), kc, vc, seqlens)


def test_paged_equals_contiguous_and_splits_agree():
    args = (2, 4, 1, 2, 32, 32, [61, 26])
    q, kc, vc, seqlens, _, _, _ = make_cache(*args, capacity=64, seed=3)
    qp, kp, vp, _, table, _, _ = make_cache(*args, block_size=16, capacity=64, seed=3)
    assert torch.equal(q, qp)
    base = decode(q, kc, vc, seqlens, num_splits=1)
    for splits in (2, 5, 9, 2 ** 40):  # (more splits than cache positions: the empty ones are not allocated)
        for out in (decode(q, kc, vc, seqlens, num_splits=splits), decode(q, kp, vp, seqlens, block_table=table,
                                                                          num_splits=splits)):
            torch.testing.assert_close(out, base, atol=2e-3, rtol=0)


# The launch settings ``benchmarks/decode_sweep.py`` times (``decode_forward``'s ``launch``) are exact too.
TUNING_VARIANTS = {
    "bn16-stages1": dict(config=(16, 4, 1)),
    "bn32-stages2": dict(config=(32, 4, 2)),
    "masked-parts": dict(masked_parts=True),
}
VARIANT_PARAMS = [(v, name, s) for v in TUNING_VARIANTS for name in CPU_CASES for s in (None, 3)]


@pytest.mark.parametrize("variant,name,num_splits", VARIANT_PARAMS,
                         ids=[f"{v}-{n}-splits{s}" for v, n, s in VARIANT_PARAMS])
def test_tuning_variants_match_attention(variant, name, num_splits):
    B, Hq, Hkv, Nq, D, Dv, lengths, bs, cap = CPU_CASES[name]
    q, kc, vc, seqlens, table, dk, dv = make_cache(B, Hq, Hkv, Nq, D, Dv, lengths, block_size=bs, capacity=cap)
    o, lse = decode_module.decode_forward(q, kc, vc, seqlens, table, scale=D ** -0.5, num_splits=num_splits,
                                          launch=TUNING_VARIANTS[variant])
    check(o, lse, q, dk, dv)


def test_launch_settings_are_checked():
    q, kc, vc, seqlens, _, _, _ = make_cache(1, 2, 1, 1, 16, 16, [20], seed=9)
    for bad, match in ((dict(prefetch_tile=1), "among"), (dict(prefetch_tiles=3), "power of two"),
                       (dict(prefetch_tiles=-2), "power of two"), (dict(prefetch_tiles=1.0), "power of two")):
        with pytest.raises(ValueError, match=match):
            decode_module.decode_forward(q, kc, vc, seqlens, None, scale=0.25, num_splits=2, launch=bad)
    # benchmarks/decode_sweep.py's variants pass the same checks.
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "decode_sweep.py"
    spec = importlib.util.spec_from_file_location("decode_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    for settings, _ in sweep.VARIANTS.values():
        decode_module._check_launch(settings)


def _counting_binds(monkeypatch):
    """Replace the two kernels' ``Launcher.bind`` by one that logs each binding and returns an
    ``InterpretedLaunch`` that logs its tensors to ``launches`` and relaunches the kernel on them
    with the bound arguments. Returns (binds, launches)."""
    binds, launches = [], []

    def counting(kernel):
        def bind(grid, args, constexprs, n_tensors):
            binds.append(kernel.name)
            rest = args[n_tensors:]

            def run(tensors):
                launches.append((kernel.name, tensors))
                kernel.launch(grid, (*tensors, *rest), constexprs)
            return InterpretedLaunch(kernel.name, run)
        return bind
    monkeypatch.setattr(decode_module, "_PLANS", {})
    for kernel in (decode_module._decode_split_kernel, decode_module._merge_stacked_kernel):
        monkeypatch.setattr(kernel, "bind", counting(kernel))
    return binds, launches


STAGE1, MERGE = "_decode_split_kernel", "_merge_stacked_kernel"


def test_repeated_calls_reuse_their_bound_launches(monkeypatch):
    """A call whose signature was seen makes the two bound launches on its own tensors (results
    exact for new values and lengths); a change of anything the launches depend on (num_splits,
    dtype, scale, strides, block-table shape) binds anew; experiment settings never bind."""
    binds, launches = _counting_binds(monkeypatch)
    q, kc, vc, seqlens, _, dk, dv = make_cache(2, 4, 2, 1, 32, 32, [40, 64], capacity=64, seed=10)
    check(*decode(q, kc, vc, seqlens, num_splits=3, return_lse=True), q, dk, dv)
    assert binds == [STAGE1, MERGE] and launches == []
    # Same signature, other values and lengths, return_lse or not: no new binding, both bound.
    q2, kc2, vc2, seqlens2, _, dk2, dv2 = make_cache(2, 4, 2, 1, 32, 32, [17, 50], capacity=64, seed=11)
    check(*decode(q2, kc2, vc2, seqlens2, num_splits=3, return_lse=True), q2, dk2, dv2)
    o_plain = decode(q2, kc2, vc2, seqlens2, num_splits=3)
    assert binds == [STAGE1, MERGE] and [name for name, _ in launches] == [STAGE1, MERGE] * 2
    stage1_tensors = launches[0][1]
    assert stage1_tensors[0] is q2 and stage1_tensors[1] is kc2 and stage1_tensors[5] is seqlens2
    assert launches[3][1][2] is o_plain  # the merge writes the returned output
    # Each change below is a new signature: bound anew (one split: stage 1 only).
    padded_q = torch.cat([q2, q2], 3)[..., :32]  # other strides
    changes = [(dict(num_splits=4), 2), (dict(num_splits=1), 1), (dict(num_splits=3, scale=0.3), 2),
               (dict(num_splits=3, q=padded_q), 2), (dict(num_splits=3, q=q2.float(), k_cache=kc2.float(),
                                                          v_cache=vc2.float()), 2)]
    for change, n_bound in changes:
        before = len(binds)
        kw = dict(dict(q=q2, k_cache=kc2, v_cache=vc2), **change)
        decode(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), seqlens2, **kw)
        assert len(binds) == before + n_bound, change
    # Paged: the block table's shape is part of the signature, its entries are not.
    qp, kp, vp, seqlens_p, table, dkp, dvp = make_cache(2, 4, 2, 1, 32, 32, [40, 64], block_size=16, capacity=64,
                                                        seed=12)
    before = len(binds)
    check(*decode(qp, kp, vp, seqlens_p, block_table=table, num_splits=3, return_lse=True), qp, dkp, dvp)
    shuffled = table.flip(0).contiguous()
    o, lse = decode(qp.flip(0), kp, vp, seqlens_p.flip(0).contiguous(), block_table=shuffled, num_splits=3,
                    return_lse=True)
    check(o.flip(0), lse.flip(0), qp, dkp, dvp)
    wider = torch.cat([table, torch.full_like(table[:, :1], -1)], 1)
    decode(qp, kp, vp, seqlens_p, block_table=wider, num_splits=3)
    assert len(binds) == before + 4
    # Experiment settings plan afresh and bind nothing.
    before = len(binds)
    decode_module.decode_forward(q2, kc2, vc2, seqlens2, None, scale=0.25, num_splits=3, launch={})
    decode_module.decode_forward(q2, kc2, vc2, seqlens2, None, scale=0.25, num_splits=3, launch=dict(no_pdl=True))
    assert len(binds) == before


def test_scratch_is_kept_per_stream_and_thread_and_never_returned(monkeypatch):
    """The partials, and lse where the caller does not ask for it, are the plan's scratch: reused
    by the next call (results exact for new values), never handed back (a returned lse survives
    later calls), one per thread, none past SCRATCH_BYTES; a merge launch that declines its bound
    path (a misaligned tensor) runs the plain launch."""
    binds, launches = _counting_binds(monkeypatch)
    q, kc, vc, seqlens, _, dk, dv = make_cache(2, 4, 2, 1, 32, 32, [40, 64], capacity=64, seed=20)
    o, lse = decode(q, kc, vc, seqlens, num_splits=3, return_lse=True)
    kept_lse = lse.clone()
    plan = next(iter(decode_module._PLANS.values()))
    assert len(plan.kept) == 1
    scratch = next(iter(plan.kept.values()))
    assert all(t.data_ptr() != lse.data_ptr() for t in scratch)
    q2, kc2, vc2, seqlens2, _, dk2, dv2 = make_cache(2, 4, 2, 1, 32, 32, [17, 50], capacity=64, seed=21)
    o2 = decode(q2, kc2, vc2, seqlens2, num_splits=3)
    assert torch.equal(lse, kept_lse)  # the returned lse is the caller's
    assert torch.equal(o2, decode(q2, kc2, vc2, seqlens2, num_splits=3, return_lse=True)[0])
    check(*decode(q2, kc2, vc2, seqlens2, num_splits=3, return_lse=True), q2, dk2, dv2)
    assert len(plan.kept) == 1 and next(iter(plan.kept.values())) is scratch
    plan.merge.bound.declines = {MERGE}  # the merge's plain launch after stage 1's bound one
    check(*decode(q, kc, vc, seqlens, num_splits=3, return_lse=True), q, dk, dv)
    plan.merge.bound.declines = ()
    # Another thread: scratch of its own.
    out = {}
    worker = threading.Thread(target=lambda: out.update(o=decode(q2, kc2, vc2, seqlens2, num_splits=3)))
    worker.start()
    worker.join()
    assert torch.equal(out["o"], o2) and len(plan.kept) == 2
    # A plan full of pairs drops those of threads that ended before it keeps none for a new one.
    monkeypatch.setattr(decode_module, "SCRATCH_COPIES", 2)
    worker = threading.Thread(target=lambda: out.update(o=decode(q2, kc2, vc2, seqlens2, num_splits=3)))
    worker.start()
    worker.join()
    assert torch.equal(out["o"], o2) and len(plan.kept) == 2 and worker.ident in {t for _, t in plan.kept}
    # Past SCRATCH_BYTES a plan keeps none; nor past SCRATCH_TOTAL_BYTES over all plans.
    monkeypatch.setattr(decode_module, "SCRATCH_BYTES", 16)
    check(*decode(q, kc, vc, seqlens, num_splits=2, return_lse=True), q, dk, dv)
    assert decode_module._PLANS[decode_module._signature(q, kc, vc, None, 32 ** -0.5, 2)].kept == {}
    monkeypatch.setattr(decode_module, "SCRATCH_BYTES", 2 << 20)
    monkeypatch.setattr(decode_module, "SCRATCH_TOTAL_BYTES", decode_module.kept_scratch_bytes())
    check(*decode(q, kc, vc, seqlens, num_splits=4, return_lse=True), q, dk, dv)
    assert decode_module._PLANS[decode_module._signature(q, kc, vc, None, 32 ** -0.5, 4)].kept == {}


def test_non_contiguous_lengths():
    """cache_seqlens as a strided view (e.g. a column of a host-side table) is read by value."""
    q, kc, vc, seqlens, _, dk, dv = make_cache(2, 4, 2, 1, 32, 32, [40, 9], capacity=48, seed=13)
    strided = torch.stack([seqlens, seqlens + 7], 1)[:, 0]
    assert not strided.is_contiguous()
    check(*decode(q, kc, vc, strided, num_splits=2, return_lse=True), q, dk, dv)


def test_repeated_calls_with_other_shapes_reproduce_every_result():
    """Back-to-back calls with other batches and split counts (other workspace shapes, other
    compiled specializations on the launch fast path) reproduce every result bit for bit."""
    calls = [((1, 4, 2, 1, [70]), 3), ((3, 4, 2, 2, [70, 1, 37]), 4), ((1, 4, 2, 1, [70]), 12),
             ((5, 8, 2, 1, [9, 64, 0, 33, 50]), None), ((3, 4, 2, 2, [70, 1, 37]), 2)]
    runs = []
    for seed, ((B, Hq, Hkv, Nq, lengths), splits) in enumerate(calls):
        q, kc, vc, seqlens, _, dk, dv = make_cache(B, Hq, Hkv, Nq, 32, 32, lengths, seed=20 + seed)
        runs.append(((q, kc, vc, seqlens, splits), decode(q, kc, vc, seqlens, num_splits=splits, return_lse=True)))
        check(*runs[-1][1], q, dk, dv)
    for (q, kc, vc, seqlens, splits), (o, lse) in runs[::-1] + runs:
        o2, lse2 = decode(q, kc, vc, seqlens, num_splits=splits, return_lse=True)
        assert torch.equal(o2, o) and torch.equal(lse2, lse)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_empty_sequences_give_zero_and_neg_inf(paged):
    """Length-0 sequences make every split of theirs empty: the merged row is o = 0, lse = −inf,
    next to non-empty sequences and in an all-empty batch."""
    for lengths in ([0, 45, 0], [0, 0]):
        q, kc, vc, seqlens, table, dk, dv = make_cache(len(lengths), 4, 2, 2, 16, 16, lengths, capacity=48,
                                                       block_size=16 if paged else None, seed=8)
        for splits in (1, 4, None):
            o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=splits, return_lse=True)
            check(o, lse, q, dk, dv)
            empty = seqlens == 0
            assert (o[empty] == 0).all() and (lse[empty] == NEG_INF).all()


def test_strided_cache_and_query_read_in_place():
    """A (B, N, H, D) cache and query passed as (B, H, N, D) views; paged (blocks, bs, H, D) too."""
    q, kc, vc, seqlens, table, dk, dv = make_cache(2, 4, 2, 2, 32, 32, [30, 47], seed=4)
    o_ref = decode(q, kc, vc, seqlens, num_splits=2)
    t = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    o = decode(t(q), t(kc), t(vc), seqlens, num_splits=2)
    torch.testing.assert_close(o, o_ref, atol=0, rtol=0)
    q, kp, vp, seqlens, table, dk, dv = make_cache(2, 4, 2, 2, 32, 32, [30, 47], block_size=16, seed=4)
    o = decode(q, t(kp), t(vp), seqlens, block_table=table.t().contiguous().t(), num_splits=2)
    torch.testing.assert_close(o, o_ref, atol=0, rtol=0)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_cpu_twin_matches_reference(torch_cpu_path, paged):
    q, kc, vc, seqlens, table, dk, dv = make_cache(3, 4, 2, 2, 32, 24, [300, 1, 77], block_size=16 if paged else None,
                                                   dtype=torch.float32, seed=5)
    q, kc, vc, seqlens = q.cpu(), kc.cpu(), vc.cpu(), seqlens.cpu()
    table = table.cpu() if paged else None
    for splits in (None, 1, 4):
        o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=splits, return_lse=True)
        check(o, lse, q, [k.cpu() for k in dk], [v.cpu() for v in dv])


def test_split_heuristic():
    sms = 132
    for hkv in (1, 8, 32):
        for b in (1, 2, 3, 4, 8, 16, 64, 256):
            for L in (100, 1024, 4096, 1 << 15, 1 << 18):
                s = choose_num_splits(b, hkv, 1, L, sms)
                assert 1 <= s <= MAX_SPLITS
                assert s == 1 or (s - 1) * MIN_SPLIT_LEN < L, "no split shorter than MIN_SPLIT_LEN"
                waves = b * hkv * s / sms
                if s * MIN_SPLIT_LEN < L and s < MAX_SPLITS:      # not capped by length
                    assert 0.75 * WAVES - b * hkv / sms <= waves or s == 1, (b, hkv, L, s)
                    assert waves <= 1.25 * WAVES + b * hkv / sms or s == 1   # ±25% of the ideal count, rounded
                    # (a sequence's heads alone fill over half the GPU: the count cannot be finer)
                    assert waves / -(-waves // 1) >= 0.85 or b * hkv > sms / 2, f"last wave mostly empty: {(b, hkv, L, s)}"
    # Llama-style GQA on an H100: the batch fills the GPU from B = 16 on (no merge stage).
    assert [choose_num_splits(b, 8, 1, 1 << 15, sms) for b in (1, 2, 4, 8, 16, 64)] == [16, 8, 4, 2, 1, 1]
    assert choose_num_splits(1, 8, 1, 4096, sms) == 4096 // MIN_SPLIT_LEN


# MLA's latent cache (DeepSeek-V2/V3 decoding, projections absorbed): one KV head whose rows are 512
# latent + 64 rope columns, v the latent 512 (a view of the same cache: read once), 16 or 128 heads.
MLA_CASES = {  # (B, Hq, Nq, lengths, block_size or None)
    "contig-h16": (2, 16, 1, [70, 1], None),
    "paged16-h40-nq2": (2, 40, 2, [45, 17], 16),  # 80 query rows: five 16-row tiles (three of 32, v apart)
    **({"contig-h128": (4, 128, 1, [5000, 300, 1, 4097], None),
        "paged64-h128-nq2": (3, 128, 2, [9000, 64, 700], 64)} if ON_GPU else {}),
}


@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("shared", [True, False], ids=["v-view-of-k", "v-apart"])
@pytest.mark.parametrize("name", list(MLA_CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16])
def test_mla_latent_cache(dtype, name, shared, num_splits):
    B, Hq, Nq, lengths, bs = MLA_CASES[name]
    q, kc, vc, seqlens, table, dk, dv = make_cache(B, Hq, 1, Nq, 576, 512, lengths, block_size=bs, dtype=dtype)
    if shared:  # v: the first 512 columns of the one cache tensor
        vc, dv = kc[..., :512], [k[..., :512] for k in dk]
    plan = decode_module._make_plan(q, kc, vc, table, 576 ** -0.5, num_splits, {}, False)
    stage = plan.stage1  # (on sm_90 with v a view of k: the Gluon kernel, the portable one its fallback)
    assert isinstance(stage, decode_mla_gluon.MlaStage) == (decode_mla_gluon.reason(q, kc, vc, table, 0.04) is None)
    if isinstance(stage, decode_mla_gluon.MlaStage):
        stage = stage.fallback
    ce = stage.constexprs
    assert ce["D_TAIL"] == 64 and ce["BLOCK_D"] == 512 and ce["V_FROM_K"] == shared
    rows = decode_module.WIDE_BLOCK_M if shared else decode_module.WIDE_BLOCK_M_V_APART
    assert ce["BLOCK_M"] == min(rows, max(16, 1 << (Hq * Nq - 1).bit_length()))
    o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=num_splits, return_lse=True)
    check(o, lse, q, dk, dv)


def test_wide_head_dims_take_8_warp_configs_that_fit():
    # Past head dim 256 the prune offers only the 8-warp configs ptxas compiles without spills: 16-key
    # tiles at 32 query rows, 32 (then 16) at 16 rows; V from K's tile leaves more room in shared memory.
    k = torch.zeros(1, dtype=torch.bfloat16)
    for block_m, widths in ((32, {16}), (16, {32, 16})):
        for shared in (True, False):
            named = dict(HEAD_DIM=576, HEAD_DIM_V=512, BLOCK_M=block_m, V_FROM_K=shared, k=k)
            kept = decode_module._prune(decode_module._configs(), named)
            assert kept and all(c.num_warps == 8 for c in kept), kept
            assert {c.kwargs["BLOCK_N"] for c in kept} == widths
            assert kept[0].kwargs["BLOCK_N"] == max(widths)
    # head dims to 256 keep the tuned list's configs
    assert decode_module._prune(decode_module._configs(), dict(HEAD_DIM=128, HEAD_DIM_V=128, BLOCK_M=16, k=k))[0] \
        in decode_module._configs()


def test_head_blocks_and_v_from_k():
    assert decode_module.head_blocks(128) == (128, 0) and decode_module.head_blocks(40) == (64, 0)
    assert decode_module.head_blocks(576) == (512, 64) and decode_module.head_blocks(512) == (512, 0)
    assert decode_module.head_blocks(300) == (256, 64)
    k = torch.zeros(2, 1, 8, 576)
    assert decode_module.v_from_k(k, k[..., :512]) and decode_module.v_from_k(k, k[..., :300])
    # a copy, columns other than the first, or a narrower v whose block is not K's: read apart
    assert not decode_module.v_from_k(k, k[..., :512].clone())
    assert not decode_module.v_from_k(k, k[..., 64:])
    assert not decode_module.v_from_k(k, k[..., :128])
    k64 = torch.zeros(2, 1, 8, 64)
    assert decode_module.v_from_k(k64, k64) and not decode_module.v_from_k(k64, k64[..., :32])


def test_bad_input_names_the_argument():
    q, kc, vc, seqlens, _, _, _ = make_cache(2, 4, 2, 1, 16, 16, [10, 20], capacity=24, seed=6)
    _, kp, vp, _, table, _, _ = make_cache(2, 4, 2, 1, 16, 16, [10, 20], block_size=8, capacity=24, seed=6)
    cases = [
        (ValueError, "k_cache=torch.float32", dict(k_cache=kc.float())),
        (TypeError, "q must have dtype", dict(q=q.long())),
        (TypeError, "cache_seqlens", dict(cache_seqlens=seqlens.long())),
        (ValueError, "cache_seqlens", dict(cache_seqlens=seqlens[:1])),
        (ValueError, "q heads", dict(q=q[:, :3])),
        (ValueError, "k_cache head dim", dict(q=torch.cat([q, q], -1))),
        (ValueError, "k_cache batch", dict(k_cache=kc[:1], v_cache=vc[:1])),
        (ValueError, "v_cache", dict(v_cache=vc[:, :, :5])),
        (ValueError, "num_splits", dict(num_splits=0)),
        (ValueError, r"cache_seqlens\[1\] = 25", dict(cache_seqlens=torch.tensor([10, 25], dtype=torch.int32,
                                                                                  device=DEVICE))),
        (ValueError, r"cache_seqlens\[0\] = -1", dict(cache_seqlens=torch.tensor([-1, 2], dtype=torch.int32,
                                                                                  device=DEVICE))),
        (TypeError, "block_table", dict(k_cache=kp, v_cache=vp, block_table=table.long())),
        (ValueError, "block_table batch", dict(k_cache=kp, v_cache=vp, block_table=table[:1])),
        (ValueError, r"block_table\[1, 2\] = 99", dict(k_cache=kp, v_cache=vp, block_table=_poke(table, 1, 2, 99))),
        (ValueError, r"block_table\[0, 0\] = -1", dict(k_cache=kp, v_cache=vp, block_table=_poke(table, 0, 0, -1))),
        (TypeError, "scale", dict(scale="big")),
        # Edges of the one-test fast check in decode's validation: each must still reach its error.
        (ValueError, "num_splits", dict(num_splits=True)),
        (TypeError, "q must be a torch.Tensor", dict(q=q.tolist())),
        (ValueError, "at least one column", dict(k_cache=kp, v_cache=vp, block_table=table[:, :0])),
        (ValueError, "v_cache dim 0", dict(v_cache=vc[:1])),
        # past 256: MLA's latent cache (576 / 512, 16-bit) only
        (ValueError, r"past 256 must be MLA's latent cache, 576 and 512; got 592 and 16",
         dict(q=q.repeat(1, 1, 1, 37), k_cache=kc.repeat(1, 1, 1, 37))),
        (ValueError, r"past 256 must be MLA's latent cache, 576 and 512; got 16 and 512",
         dict(v_cache=vc.repeat(1, 1, 1, 32))),
        (ValueError, r"576 / 512 \(MLA's latent cache\) take float16 or bfloat16, got float32",
         dict(q=q.repeat(1, 1, 1, 36).float(), k_cache=kc.repeat(1, 1, 1, 36).float(),
              v_cache=vc.repeat(1, 1, 1, 32).float())),
    ]
    base = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=seqlens)
    for exc, match, change in cases:
        kw = {**base, **change}
        with pytest.raises(exc, match=match):
            decode(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), kw.pop("cache_seqlens"), check_values=True, **kw)
    # Table padding past each sequence's last block is never read (vLLM-style −1 fill is fine).
    assert (table[0, 2:] == -1).all()
    decode(q, kp, vp, seqlens, block_table=table, check_values=True)


@pytest.mark.parametrize("path", ["kernels"] + ([] if ON_GPU else ["cpu-twin"]))
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else []), ids=str)
def test_unchecked_bad_values_read_as_clamped(paged, dtype, path, request):
    """check_values=False (the default on CUDA: a check costs a sync) with lengths past the cache or
    negative, and table entries in use outside [0, num_blocks): the kernel reads each length clamped
    into [0, capacity] and each block id outside [0, num_blocks) as the last block, never past the
    cache, and gives what those values give. On the CPU the PyTorch twin too."""
    if path == "cpu-twin":
        request.getfixturevalue("torch_cpu_path")
    g = torch.Generator().manual_seed(11)
    B, Hq, Hkv, D, block, width = 3, 4, 2, 16, 8, 4   # paged: 4 table entries × 8 rows = 32 positions
    n_blocks = 7
    shape = (n_blocks, Hkv, block, D) if paged else (B, Hkv, width * block, D)
    kc, vc = (torch.randn(*shape, generator=g).to(DEVICE, dtype) for _ in range(2))
    q = torch.randn(B, Hq, 2, D, generator=g).to(DEVICE, dtype)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    bad_lens, lens = i32([40, -5, 17]), i32([32, 0, 17])
    bad_table = i32([[3, -1, 6, 2], [0, 1, 2, 3], [9, 4, 100, 5]]) if paged else None
    table = i32([[3, 6, 6, 2], [0, 1, 2, 3], [6, 4, 6, 5]]) if paged else None
    for splits in (1, 3):
        got = decode(q, kc, vc, bad_lens, block_table=bad_table, num_splits=splits, check_values=False)
        want = decode(q, kc, vc, lens, block_table=table, num_splits=splits, check_values=True)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _poke(t, i, j, value):
    t = t.clone()
    t[i, j] = value
    return t


@pytest.mark.skipif(not ON_GPU, reason="CUDA: bf16 and long caches")
def test_gpu_long_cache_bf16_all_paths():
    """bf16, 32k-long ragged batch, Llama-style GQA; contiguous and paged agree with the reference."""
    lengths = [32768, 20000, 1]
    for bs in (None, 16, 256):
        q, kc, vc, seqlens, table, dk, dv = make_cache(3, 32, 8, 1, 128, 128, lengths, block_size=bs,
                                                       dtype=torch.bfloat16, seed=7)
        for splits in (None, 1, 37):
            o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=splits, return_lse=True)
            check(o, lse, q, dk, dv)


def test_paged_generation_example_matches_full_recompute(torch_cpu_path):
    """examples/paged_generation.py: prefill, batched decode steps, a freed slot reused; every
    step's logits checked against a no-cache forward (the example asserts). On CPU through the
    PyTorch twins (the kernels are covered above); on CUDA through the kernels."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "paged_generation.py"
    spec = importlib.util.spec_from_file_location("paged_generation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--steps", "3", "--block-size", "8", "--device", DEVICE])


def test_mla_decoding_example_matches_the_unabsorbed_layer(torch_cpu_path):
    """examples/mla_decoding.py: DeepSeek's attention decoded with the projections absorbed (q against
    the 576-wide latent rows of a paged cache, v the latent) against the plain per-head layer in
    float64, every step (the example asserts). On CPU through the PyTorch twin; on sm_90 through the
    Gluon MLA kernel."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mla_decoding.py"
    spec = importlib.util.spec_from_file_location("mla_decoding", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--steps", "2", "--device", DEVICE])


def test_paged_cache_with_values_in_the_keys():
    """``v_from_k=True`` (MLA's latent cache): one tensor, v a view of k's first columns, written
    through k alone, and decode over it equal to decode over the same rows given apart."""
    from flashattn_lite.kv_cache import PagedKVCache
    g = torch.Generator().manual_seed(3)
    cache = PagedKVCache(2, 1, 24, head_dim_v=16, v_from_k=True, num_blocks=6, block_size=4, max_seqs=2,
                         max_seq_len=12, device=DEVICE)
    assert cache.v.data_ptr() == cache.k.data_ptr() and cache.v.shape[-1] == 16
    rows = torch.randn(2, 1, 7, 24, generator=g).to(DEVICE, torch.float16)
    step = cache.append([0, 1], 7)
    step.write(1, rows)
    q = torch.randn(2, 3, 1, 24, generator=g).to(DEVICE, torch.float16)
    o = step.attend(1, q)
    want = decode(q, rows, rows[..., :16].contiguous(), step.seqlens)
    torch.testing.assert_close(o, want, atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="v_new must be None"):
        step.write(1, rows, rows[..., :16])
    with pytest.raises(ValueError, match="k_new must have shape"):
        step.write(1, rows[..., :16])          # the values alone: the keys' columns are missing
    with pytest.raises(ValueError, match="head_dim_v must be an int"):
        PagedKVCache(1, 1, 16, head_dim_v=8.0, v_from_k=True, num_blocks=1, max_seqs=1, max_seq_len=4)
    with pytest.raises(ValueError, match="head_dim_v must be in"):
        PagedKVCache(1, 1, 16, head_dim_v=32, v_from_k=True, num_blocks=1, max_seqs=1, max_seq_len=4)
    with pytest.raises(TypeError, match="v_from_k must be a bool"):
        PagedKVCache(1, 1, 16, v_from_k=1, num_blocks=1, max_seqs=1, max_seq_len=4)
    apart = PagedKVCache(1, 1, 16, num_blocks=2, block_size=4, max_seqs=1, max_seq_len=8, device=DEVICE)
    with pytest.raises(ValueError, match="v_new is required"):
        apart.append([0], 1).write(0, rows[:1, :, :1, :16])


def test_paged_cache_refuses_what_would_name_another_slot():
    """Ids and layers are ints in range (a negative one would count from the end: another sequence's
    blocks freed, another layer written), tensors on the cache's device, q the step's last new rows."""
    from flashattn_lite.kv_cache import PagedKVCache
    cache = PagedKVCache(2, 1, 8, num_blocks=8, block_size=4, max_seqs=3, max_seq_len=10, dtype=torch.float32)
    cache.append([0], 3)
    cache.append([2], 5)
    for bad, error in ((-1, ValueError), (3, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="seq_id"):
            cache.free(bad)
        with pytest.raises(error, match="seq_id"):
            cache.length(bad)
    assert [cache.length(i) for i in range(3)] == [3, 0, 5]  # nothing freed
    with pytest.raises(TypeError, match="seq_ids"):
        cache.append([1.7], 1)                 # not truncated to sequence 1
    with pytest.raises(TypeError, match="num_new"):
        cache.append([1], 1.5)
    with pytest.raises(RuntimeError, match="max_seq_len \\(10 tokens\\)"):
        cache.append([2], 6)                   # 11 tokens: within the blocks' 12 rows, past max_seq_len
    step = cache.append([1], 2)
    k = torch.randn(1, 1, 2, 8)
    for bad, error in ((-1, ValueError), (2, ValueError), (0.0, TypeError)):
        with pytest.raises(error, match="layer"):
            step.write(bad, k, k)
        with pytest.raises(error, match="layer"):
            step.attend(bad, k)
    with pytest.raises(ValueError, match="cache's device"):
        step.write(0, k.to("meta"), k)
    with pytest.raises(ValueError, match="q must have shape"):
        step.attend(0, torch.randn(1, 1, 3, 8))  # more rows than the step's 2 new tokens
    step.write(0, k, k)
    assert step.attend(0, k[:, :, 1:]).shape == (1, 1, 1, 8)  # the last new token alone
    with pytest.raises(ValueError, match=r"q must have the cache's dtype \(float32: PagedKVCache\(dtype=...\)\)"):
        step.attend(0, k[:, :, 1:].half())
    for kwargs, error, needle in ((dict(num_layers=2.0), TypeError, "num_layers"),
                                  (dict(head_dim="8"), TypeError, "head_dim"),
                                  (dict(max_seqs=0), ValueError, "max_seqs"),
                                  (dict(dtype=torch.int32), TypeError, "dtype"),
                                  (dict(head_dim=300), ValueError, "head_dim")):
        args = dict(num_layers=1, num_kv_heads=1, head_dim=8, num_blocks=2, max_seqs=1, max_seq_len=4)
        with pytest.raises(error, match=needle):
            PagedKVCache(**{**args, **kwargs})


def test_paged_cache_refuses_a_step_that_outlived_a_free():
    """A step made before its sequence was freed names blocks another sequence may own by then: using
    it raises, where it used to overwrite that sequence's keys. A live sequence's earlier step still works."""
    from flashattn_lite.kv_cache import PagedKVCache
    cache = PagedKVCache(1, 1, 16, num_blocks=4, block_size=4, max_seqs=2, max_seq_len=16, dtype=torch.float32,
                         device=DEVICE)
    old = cache.append([0], 2)
    earlier = cache.append([1], 1)
    cache.append([1], 1)                       # a later step of a live sequence leaves earlier ones usable
    earlier.write(0, *(torch.randn(1, 1, 1, 16, device=DEVICE),) * 2)
    cache.free(0)
    new = cache.append([0], 2)                 # a new sequence in slot 0, on the freed block
    kv = torch.randn(1, 1, 2, 16, device=DEVICE)
    new.write(0, kv, kv)
    zeros = torch.zeros(1, 1, 2, 16, device=DEVICE)
    with pytest.raises(RuntimeError, match="stale: sequence 0 was freed"):
        old.write(0, zeros, zeros)
    with pytest.raises(RuntimeError, match="stale"):
        old.attend(0, zeros)
    torch.testing.assert_close(new.attend(0, kv[:, :, 1:]), decode(kv[:, :, 1:], kv, kv, torch.tensor(
        [2], dtype=torch.int32, device=DEVICE)))


def test_paged_cache_stores_values_not_autograd_history():
    """An input that requires grad is stored as a value (the pool does not join its graph, which would
    keep every step's projections alive); an int or bool tensor is a TypeError, not cast."""
    from flashattn_lite.kv_cache import PagedKVCache
    cache = PagedKVCache(1, 1, 16, num_blocks=4, block_size=4, max_seqs=1, max_seq_len=16, dtype=torch.float32,
                         device=DEVICE)
    step = cache.append([0], 1)
    proj = torch.nn.Linear(16, 16).to(DEVICE)
    x = torch.randn(1, 1, 1, 16, device=DEVICE)
    step.write(0, proj(x), proj(x))
    assert not cache.k.requires_grad and cache.k.grad_fn is None and not cache.v.requires_grad
    torch.testing.assert_close(cache.k[0, step.slot_block[0, 0], :, 0], proj(x)[0, :, 0].detach())
    for bad in (torch.ones(1, 1, 1, 16, dtype=torch.int32, device=DEVICE),
                torch.ones(1, 1, 1, 16, dtype=torch.bool, device=DEVICE)):
        with pytest.raises(TypeError, match="k_new must be a floating-point tensor"):
            step.write(0, bad, x)
        with pytest.raises(TypeError, match="v_new must be a floating-point tensor"):
            step.write(0, x, bad)


def test_paged_cache_refuses_what_decode_would_refuse_at_construction():
    """MLA's widths decode in 16-bit only, so a float32 latent cache is refused when made, not at its
    first attend; a dtype given as a string is named as one."""
    from flashattn_lite.kv_cache import PagedKVCache
    args = dict(num_blocks=1, block_size=64, max_seqs=1, max_seq_len=64)
    with pytest.raises(TypeError, match="float16 or bfloat16 only"):
        PagedKVCache(1, 1, 576, head_dim_v=512, v_from_k=True, dtype=torch.float32, **args)
    with pytest.raises(TypeError, match="got 'float16'"):
        PagedKVCache(1, 1, 64, dtype="float16", **args)


def test_paged_cache_takes_inputs_on_the_device_it_was_named_by():
    """A device named with its index or without ("cuda" / "cuda:0", "cpu:0" / "cpu") is one device."""
    from flashattn_lite.kv_cache import PagedKVCache
    name = "cuda" if DEVICE == "cuda" else "cpu:0"
    cache = PagedKVCache(1, 1, 8, num_blocks=2, block_size=4, max_seqs=1, max_seq_len=8, device=name)
    step = cache.append([0], 2)
    k = torch.randn(1, 1, 2, 8, device=DEVICE).to(cache.dtype)
    step.write(0, k, k)
    assert step.attend(0, k[:, :, 1:]).shape == (1, 1, 1, 8)


def test_paged_cache_allocator():
    from flashattn_lite.kv_cache import PagedKVCache
    cache = PagedKVCache(1, 1, 16, num_blocks=4, block_size=4, max_seqs=2, max_seq_len=12, device=DEVICE)
    cache.append([0], 5)                       # 2 blocks
    step = cache.append([0, 1], 3)             # seq 0: 8 tokens (2 blocks), seq 1: 3 (1 block)
    assert cache.free_blocks == 1 and step.seqlens.tolist() == [8, 3]
    assert step.positions.tolist() == [[5, 6, 7], [0, 1, 2]]
    assert len(set(cache.block_table[0, :2].tolist() + cache.block_table[1, :1].tolist())) == 3
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        cache.append([0, 1], 2)                # needs 2 more blocks, 1 free: nothing changes
    assert cache.length(0) == 8 and cache.free_blocks == 1
    with pytest.raises(RuntimeError, match="max_seq_len"):
        cache.append([0], 5)
    with pytest.raises(ValueError, match=r"seq_ids\[0\] must be in \[0, 2\)"):
        cache.append([-1], 1)                  # no Python negative indexing into the last slot
    cache.free(0)
    assert cache.free_blocks == 3 and cache.seqlens[0].item() == 0 and (cache.block_table[0] == -1).all()


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and streams")
def test_scratch_under_cuda_graphs_and_concurrent_streams(monkeypatch):
    """A decode step captured in a CUDA graph keeps its own partials (allocated in the capture), so
    eager steps of the same signature between replays (the plan's kept scratch) leave the graph's
    results right; steps on two streams at once each use their own stream's scratch."""
    monkeypatch.setattr(decode_module, "_PLANS", {})
    dtype = torch.bfloat16
    q, kc, vc, seqlens, _, dk, dv = make_cache(2, 8, 2, 1, 64, 64, [300, 1000], capacity=1024, dtype=dtype, seed=30)
    q2, kc2, vc2, seqlens2, _, dk2, dv2 = make_cache(2, 8, 2, 1, 64, 64, [999, 17], capacity=1024, dtype=dtype,
                                                     seed=31)

    def check_o(o, q, dense_k, dense_v):
        (o_ref, _), (o_same, _) = reference(q, dense_k, dense_v)
        assert_close_to_ref(o, o_same, o_ref, eps=EPS[q.dtype])

    decode(q, kc, vc, seqlens, num_splits=4)  # plan made and bound before capturing
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode(q, kc, vc, seqlens, num_splits=4)
    torch.cuda.current_stream().wait_stream(side)
    plan = decode_module._PLANS[decode_module._signature(q, kc, vc, None, 64 ** -0.5, 4)]
    kept = dict(plan.kept)
    assert len(kept) == 2  # the current stream's and the side stream's
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = decode(q, kc, vc, seqlens, num_splits=4)
    assert plan.kept.keys() == kept.keys()  # nothing kept from the capture: the graph's partials are its own
    for _ in range(3):
        graph.replay()
        o_eager = decode(q2, kc2, vc2, seqlens2, num_splits=4)  # same signature, other values, eager
        torch.cuda.synchronize()
        check_o(o_graph, q, dk, dv)
        check_o(o_eager, q2, dk2, dv2)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = []
    for s, args in zip(streams, [(q, kc, vc, seqlens), (q2, kc2, vc2, seqlens2)]):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append([decode(*args, num_splits=4) for _ in range(20)])
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for o in outs[0]:
        check_o(o, q, dk, dv)
    for o in outs[1]:
        check_o(o, q2, dk2, dv2)
