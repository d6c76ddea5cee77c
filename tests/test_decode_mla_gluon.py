"""decode() against MLA's latent cache on the Gluon kernel (sm_90, ``ops/decode_mla_gluon.py``): the
same calls as the portable kernel's, checked against float64 attention per sequence and against the
portable kernel on the same inputs. Cache rows past each length hold NaN (``make_cache``)."""
import pytest
import torch

from conftest import ON_GPU
from flashattn_lite import decode, explain
from flashattn_lite.ops import decode as decode_module
from flashattn_lite.ops import decode_mla_gluon
from test_decode import check, make_cache


def _takes(q, kc, vc, table):
    return ON_GPU and decode_mla_gluon.reason(q, kc, vc, table) is None


def _kernel_runs_here() -> bool:
    if not ON_GPU:
        return False
    k = torch.empty(1, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
    return decode_mla_gluon.reason(k[:, :, :1], k, k[..., :512], None) is None


needs_kernel = pytest.mark.skipif(not _kernel_runs_here(),
                                  reason="the Gluon MLA decode kernel runs on CUDA sm_90 with triton 3.6")

CASES = {  # (B, Hq, Nq, lengths, block_size or None)
    "h16": (3, 16, 1, [1, 70, 0], None),                       # one row block, mostly padding rows
    "h64-odd": (4, 64, 1, [17, 1000, 4097, 63], None),
    "h128": (2, 128, 1, [9000, 65], None),
    "h40-nq2": (2, 40, 2, [45, 130], None),                    # 80 rows: a second, partial row block
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
    vc, dv = kc[..., :512], [k[..., :512] for k in dk]
    assert _takes(q, kc, vc, table)
    plan = decode_module._make_plan(q, kc, vc, table, 576 ** -0.5, num_splits, {}, False)
    assert isinstance(plan.stage1, decode_mla_gluon.MlaStage)
    o, lse = decode(q, kc, vc, seqlens, block_table=table, num_splits=num_splits, return_lse=True)
    check(o, lse, q, dk, dv)
    o_p, lse_p = decode_module.decode_forward(q, kc, vc, seqlens, table, scale=576 ** -0.5, num_splits=num_splits,
                                              launch=dict(portable=True))
    torch.testing.assert_close(o, o_p, atol=2e-2 if dtype == torch.bfloat16 else 3e-3, rtol=0)
    finite = torch.isfinite(lse_p)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], lse_p[finite], atol=2e-3, rtol=0)


@needs_kernel
def test_explain_names_the_kernel():
    q, kc, _, seqlens, _, _, _ = make_cache(1, 16, 1, 1, 576, 512, [100], dtype=torch.bfloat16)
    why = explain.decode(q, kc, kc[..., :512], seqlens)
    assert why.path == "hopper" and [k.name for k in why.kernels] == ["_mla_decode_kernel"], str(why)
    why = explain.decode(q, kc, kc[..., :512].clone(), seqlens)  # v apart from k: the portable kernel
    assert "_mla_decode_kernel" not in [k.name for k in why.kernels], str(why)


@needs_kernel
def test_strided_q_and_a_wider_cache_row():
    # q as a (B, Nq, Hq, D) tensor's transpose (its rows not one stride: copied), the cache rows part of
    # a wider buffer (row stride 640), paged by 64.
    B, Hq, Nq, lengths = 2, 32, 3, [900, 70]
    q, kc, _, seqlens, table, dk, _ = make_cache(B, Hq, 1, Nq, 576, 512, lengths, block_size=64,
                                                 dtype=torch.bfloat16)
    wide = torch.full((*kc.shape[:3], 640), float("nan"), dtype=kc.dtype, device=kc.device)
    wide[..., :576] = kc
    kc = wide[..., :576]
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert _takes(qt, kc, kc[..., :512], table)
    plan = decode_module._make_plan(qt, kc, kc[..., :512], table, 576 ** -0.5, None, {}, False)
    assert isinstance(plan.stage1, decode_mla_gluon.MlaStage) and plan.stage1.copy_q
    o, lse = decode(qt, kc, kc[..., :512], seqlens, block_table=table, return_lse=True)
    check(o, lse, q, dk, [k[..., :512] for k in dk])


@needs_kernel
def test_unaligned_cache_takes_the_portable_kernel():
    # An address off 16 bytes (the same signature as an aligned call) runs the portable stage 1.
    B, Hq, Nq, lengths = 2, 64, 1, [300, 129]
    q, kc, _, seqlens, _, dk, _ = make_cache(B, Hq, 1, Nq, 576, 512, lengths, dtype=torch.bfloat16)
    flat = torch.full((kc.numel() + 8,), float("nan"), dtype=kc.dtype, device=kc.device)
    shifted = flat[1:1 + kc.numel()].view(kc.shape)
    shifted.copy_(kc)
    assert shifted.data_ptr() % 16 and shifted.stride() == kc.stride()
    decode(q, kc, kc[..., :512], seqlens)  # the aligned call plans the Gluon stage for this signature
    o, lse = decode(q, shifted, shifted[..., :512], seqlens, return_lse=True)
    check(o, lse, q, dk, [k[..., :512] for k in dk])


def test_reasons():
    # What the kernel refuses, in words (the host rules; no GPU needed).
    q = torch.zeros(1, 16, 1, 576, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16)
    why = decode_mla_gluon.reason(q, k, k[..., :512], None)
    assert why is not None  # a CPU tensor (or no Gluon, or another triton)
    if not decode_mla_gluon._HAS_GLUON or not __import__("triton").__version__.startswith("3.6."):
        return
    assert "sm_90" in why
    if ON_GPU and torch.cuda.get_device_capability() == (9, 0):
        q, k = q.cuda(), k.cuda()
        assert "view of k_cache" in decode_mla_gluon.reason(q, k, k[..., :512].clone(), None)
        assert "multiples of 64" in decode_mla_gluon.reason(q, k[:, :, :32], k[:, :, :32, :512],
                                                            torch.zeros(1, 1, dtype=torch.int32, device="cuda"))
        assert "16-bit" in decode_mla_gluon.reason(q.float(), k.float(), k.float()[..., :512], None)
