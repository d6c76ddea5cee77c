"""decode() against MLA's latent cache on the Gluon kernel (sm_90, ``ops/decode_mla_gluon.py``): the
same calls as the portable kernel's, checked against float64 attention per sequence and against the
portable kernel on the same inputs, with the kernel that ran asserted. Cache rows past each length
hold NaN (``make_cache``)."""
import pytest
import torch

from conftest import ON_GPU
from flashattn_lite import _launcher, decode, explain
from flashattn_lite.ops import attention_fwd_hopper
from flashattn_lite.ops import decode as decode_module
from flashattn_lite.ops import decode_mla_gluon
from test_decode import check, make_cache

SCALE = 576 ** -0.5
KERNEL = "_mla_decode_kernel"


def _kernel_runs_here() -> bool:
    if not ON_GPU:
        return False
    k = torch.empty(1, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
    return decode_mla_gluon.reason(k[:, :, :1], k, k[..., :512], None, SCALE) is None


needs_kernel = pytest.mark.skipif(not _kernel_runs_here(),
                                  reason="the Gluon MLA decode kernel runs on CUDA sm_90 with triton 3.6")


def _run(q, kc, seqlens, table=None, **kw):
    """(o, lse, the names of the kernels launched) of decode with v a view of the cache."""
    with _launcher.recording() as launches:
        o, lse = decode(q, kc, kc[..., :512], seqlens, block_table=table, return_lse=True, **kw)
    return o, lse, [launch.kernel for launch in launches]


def _views(dk):
    return [k[..., :512] for k in dk]


CASES = {  # (B, Hq, Nq, lengths, block_size or None)
    "h16": (3, 16, 1, [1, 70, 0], None),                       # one row block, mostly padding rows
    "h64-odd": (4, 64, 1, [17, 1000, 4097, 63], None),
    "h128": (2, 128, 1, [9000, 65], None),
    "h40-nq2": (2, 40, 2, [45, 130], None),                    # 80 rows: a second, partial row block
    "h32-nq4": (2, 32, 4, [66, 129], None),                    # the causal band across a tile / split edge
    "h1": (2, 1, 1, [500, 3], None),                           # one query row a sequence
    "h128-nq2-paged64": (3, 128, 2, [5000, 64, 1], 64),
    "h128-paged128": (2, 128, 1, [3001, 200], 128),
    "h16-nq4-paged64": (2, 16, 4, [3, 777], 64),               # new tokens past the cache's first rows
}


@needs_kernel
@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_float64_and_the_portable_kernel(dtype, name, num_splits):
    B, Hq, Nq, lengths, bs = CASES[name]
    q, kc, _, seqlens, table, dk, _ = make_cache(B, Hq, 1, Nq, 576, 512, lengths, block_size=bs, dtype=dtype)
    o, lse, ran = _run(q, kc, seqlens, table, num_splits=num_splits)
    assert KERNEL in ran, ran
    check(o, lse, q, dk, _views(dk))
    o_p, lse_p = decode_module.decode_forward(q, kc, kc[..., :512], seqlens, table, scale=SCALE, num_splits=num_splits,
                                              launch=dict(portable=True))
    torch.testing.assert_close(o, o_p, atol=2e-2 if dtype == torch.bfloat16 else 3e-3, rtol=0)
    finite = torch.isfinite(lse_p)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], lse_p[finite], atol=2e-3, rtol=0)


@needs_kernel
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_unchecked_bad_values_read_as_clamped(paged):
    # check_values=False with a length past the cache, a negative one and table entries in use outside
    # [0, num_blocks): this kernel reads them clamped, as the portable one does (test_decode's twin),
    # and gives what the clamped values give.
    g = torch.Generator(device="cuda").manual_seed(4)
    B, Hq, n_blocks = 3, 16, 7
    kc = torch.randn(n_blocks if paged else B, 1, 64 if paged else 256, 576, generator=g, device="cuda").bfloat16()
    q = torch.randn(B, Hq, 1, 576, generator=g, device="cuda").bfloat16()
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    bad_lens, lens = i32([300, -5, 170]), i32([256, 0, 170])
    bad_table = i32([[3, -1, 6, 2], [0, 1, 2, 3], [9, 4, 100, 5]]) if paged else None
    table = i32([[3, 6, 6, 2], [0, 1, 2, 3], [6, 4, 6, 5]]) if paged else None
    for splits in (1, 3):
        got, _, ran = _run(q, kc, bad_lens, bad_table, num_splits=splits, check_values=False)
        assert KERNEL in ran, ran
        want, _, _ = _run(q, kc, lens, table, num_splits=splits, check_values=True)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@needs_kernel
def test_a_second_call_of_a_signature_reads_its_own_tensors():
    # The plan (and its descriptors) is reused: new q, cache, lengths and table must be the ones read.
    for seed, lengths in ((0, [300, 70]), (1, [129, 320])):
        q, kc, _, seqlens, table, dk, _ = make_cache(2, 64, 1, 2, 576, 512, lengths, block_size=64, capacity=320,
                                                     dtype=torch.bfloat16, seed=seed)
        o, lse, ran = _run(q, kc, seqlens, table)
        assert KERNEL in ran, ran
        check(o, lse, q, dk, _views(dk))


@needs_kernel
@pytest.mark.parametrize("scale", [0.3, -0.05, 0.0])
def test_scales(scale):
    # The kernel folds the scale into the exp2 after masking: only a positive one runs it.
    q, kc, _, seqlens, _, dk, _ = make_cache(2, 32, 1, 2, 576, 512, [300, 70], dtype=torch.bfloat16)
    o, lse, ran = _run(q, kc, seqlens, scale=scale)
    assert (KERNEL in ran) == (scale > 0), ran
    check(o, lse, q, dk, _views(dk), scale=scale)


@needs_kernel
def test_explain_names_the_kernel():
    q, kc, _, seqlens, _, _, _ = make_cache(1, 16, 1, 1, 576, 512, [100], dtype=torch.bfloat16)
    why = explain.decode(q, kc, kc[..., :512], seqlens)
    assert why.path == "hopper" and [k.name for k in why.kernels] == [KERNEL], str(why)
    why = explain.decode(q, kc, kc[..., :512].clone(), seqlens)  # v apart from k: the portable kernel
    assert KERNEL not in [k.name for k in why.kernels], str(why)
    with attention_fwd_hopper.disabled():
        assert KERNEL not in [k.name for k in explain.decode(q, kc, kc[..., :512], seqlens).kernels]


@needs_kernel
def test_strided_q_and_wider_cache_rows():
    # q as a (B, Nq, Hq, D) tensor's transpose (its rows not one stride: copied), then as a slice of a
    # wider buffer (rows of one stride: read in place); the cache rows inside a 640-wide buffer.
    B, Hq, Nq, lengths = 2, 32, 3, [900, 70]
    q, kc, _, seqlens, table, dk, _ = make_cache(B, Hq, 1, Nq, 576, 512, lengths, block_size=64,
                                                 dtype=torch.bfloat16)
    wide = torch.full((*kc.shape[:3], 640), float("nan"), dtype=kc.dtype, device=kc.device)
    wide[..., :576] = kc
    kc = wide[..., :576]
    q_wide = torch.full((B, Hq, Nq, 640), float("nan"), dtype=q.dtype, device=q.device)
    q_wide[..., :576] = q
    for qs, copied in ((q.transpose(1, 2).contiguous().transpose(1, 2), True), (q_wide[..., :576], False)):
        plan = decode_module._make_plan(qs, kc, kc[..., :512], table, SCALE, None, {}, False)
        assert isinstance(plan.stage1, decode_mla_gluon.MlaStage) and plan.stage1.copy_q == copied
        o, lse, ran = _run(qs, kc, seqlens, table)
        assert KERNEL in ran, ran
        check(o, lse, q, dk, _views(dk))


@needs_kernel
def test_what_the_kernel_cannot_address_takes_the_portable_kernel():
    B, Hq, lengths = 2, 64, [300, 129]
    q, kc, _, seqlens, _, dk, _ = make_cache(B, Hq, 1, 1, 576, 512, lengths, dtype=torch.bfloat16)
    # an address off 16 bytes, on the first call of its signature and after an aligned one
    flat = torch.full((kc.numel() + 8,), float("nan"), dtype=kc.dtype, device=kc.device)
    shifted = flat[1:1 + kc.numel()].view(kc.shape)
    shifted.copy_(kc)
    assert shifted.data_ptr() % 16 and shifted.stride() == kc.stride()
    decode_module._PLANS.clear()
    for cache in (shifted, kc, shifted):
        o, lse, ran = _run(q, cache, seqlens)
        assert (KERNEL in ran) == (cache is kc), ran
        check(o, lse, q, dk, _views(dk))
    # one cache row block shared by the batch (a zero batch stride)
    o, lse, ran = _run(q, kc[:1].expand(B, -1, -1, -1), seqlens)
    assert KERNEL not in ran, ran
    check(o, lse, q, [kc[0, :, :L] for L in lengths], [kc[0, :, :L, :512] for L in lengths])


@needs_kernel
def test_paged_kv_cache_with_values_in_the_keys_takes_the_kernel():
    # PagedKVCache(v_from_k=True) at MLA's widths, pages of 64: its steps run this kernel.
    from flashattn_lite.kv_cache import PagedKVCache
    g = torch.Generator().manual_seed(5)
    cache = PagedKVCache(2, 1, 576, head_dim_v=512, v_from_k=True, num_blocks=40, block_size=64, max_seqs=3,
                         max_seq_len=1000, dtype=torch.bfloat16, device="cuda")
    lengths = [700, 1, 333]
    rows = [torch.randn(1, 1, n, 576, generator=g).to("cuda", torch.bfloat16) for n in lengths]
    for b, r in enumerate(rows):
        cache.append([b], r.shape[2]).write(1, r)
    new = torch.randn(3, 1, 1, 576, generator=g).to("cuda", torch.bfloat16)
    step = cache.append([0, 1, 2], 1)
    step.write(1, new)
    q = torch.randn(3, 128, 1, 576, generator=g).to("cuda", torch.bfloat16)
    with _launcher.recording() as launches:
        o, lse = step.attend(1, q, scale=SCALE, return_lse=True)
    assert KERNEL in [launch.kernel for launch in launches]
    dk = [torch.cat([r[0], new[b:b + 1, 0]], 1) for b, r in enumerate(rows)]
    check(o, lse, q, dk, _views(dk), scale=SCALE)


def test_reasons():
    # What the kernel refuses, in words (the host rules; no GPU needed).
    q = torch.zeros(1, 16, 1, 576, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16)
    why = decode_mla_gluon.reason(q, k, k[..., :512], None, SCALE)
    assert why is not None  # a CPU tensor (or no Gluon, or another triton)
    if not decode_mla_gluon._HAS_GLUON or not __import__("triton").__version__.startswith("3.6."):
        return
    assert "sm_90" in why
    if ON_GPU and torch.cuda.get_device_capability() == (9, 0):
        q, k = q.cuda(), k.cuda()
        assert "view of k_cache" in decode_mla_gluon.reason(q, k, k[..., :512].clone(), None, SCALE)
        assert "multiples of 64" in decode_mla_gluon.reason(q, k[:, :, :32], k[:, :, :32, :512],
                                                            torch.zeros(1, 1, dtype=torch.int32, device="cuda"), SCALE)
        assert "not > 0" in decode_mla_gluon.reason(q, k, k[..., :512], None, 0.0)
        k2 = k.expand(2, -1, -1, -1)
        assert "stride is 0" in decode_mla_gluon.reason(q.expand(2, -1, -1, -1), k2, k2[..., :512], None, SCALE)


def test_tma_strides():
    # Size-1 dims take the packed stride; zero or unaligned strides, or a strided last dim, qualify not.
    t = torch.zeros(1, dtype=torch.bfloat16)
    assert decode_mla_gluon._tma_strides(t, [1, 64, 576], [3, 576, 1]) == ([1, 64, 576], [64 * 576, 576, 1])
    assert decode_mla_gluon._tma_strides(t, [2, 64, 576], [0, 576, 1]) is None
    assert decode_mla_gluon._tma_strides(t, [2, 64, 576], [64 * 577, 577, 1]) is None
    assert decode_mla_gluon._tma_strides(t, [2, 64, 576], [64 * 1152, 1152, 2]) is None
    q = torch.zeros(2, 8, 3, 576, dtype=torch.bfloat16)
    assert decode_mla_gluon._q_rows(q) == ([2, 24, 576], [8 * 3 * 576, 576, 1])
    assert decode_mla_gluon._q_rows(q.transpose(1, 2).contiguous().transpose(1, 2)) is None
    assert decode_mla_gluon._q_rows(q[:, :, :1]) == ([2, 8, 576], [8 * 3 * 576, 3 * 576, 1])
