"""merge_attention_states(_stacked): partial attention over disjoint key sets merges into attention
over their union (against the float64 reference), empty parts, layouts, gradients, bad input."""
import pytest
import torch

from conftest import DEVICE, DTYPES, ON_GPU, assert_close_to_ref, gpu_fp32_only
from flashattn_lite import attention, merge_attention_states, merge_attention_states_stacked
from flashattn_lite.reference import attention_reference

EPS = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-4}
NEG_INF = float("-inf")

# (B, Hq, Hkv, Nq, Nk, D, cut points splitting the keys)
CPU_CASES = [
    (1, 2, 2, 5, 40, 16, (13,)),
    (2, 4, 1, 3, 33, 40, (1, 17, 30)),
    (1, 4, 2, 1, 50, 64, (10, 20, 30, 40, 45)),
]
GPU_CASES = [
    (2, 32, 8, 1, 4096, 128, (1000, 2048, 3000)),
    (4, 16, 16, 300, 2000, 64, (700,)),
    (1, 8, 2, 7, 9000, 256, tuple(range(500, 9000, 500))),
]
CASES = CPU_CASES + (GPU_CASES if ON_GPU else [])
# float32 on the GPU: the merge is elementwise in float32 whatever the dtype; the cost is the float32
# attention compiles of the partials: one small odd case and one large one (fp16/bf16 run every case).
FP32_GPU_CASES = [CPU_CASES[1], GPU_CASES[0]]


def case_id(c):
    b, hq, hkv, nq, nk, d, cuts = c
    return f"b{b}-h{hq}:{hkv}-q{nq}-k{nk}-d{d}-parts{len(cuts) + 1}"


def make(case, dtype, seed=0, requires_grad=False):
    b, hq, hkv, nq, nk, d, _ = case
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g).to(DEVICE, dtype).requires_grad_(requires_grad)
               for s in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    return q, k, v


def partials(q, k, v, cuts):
    bounds = [0, *cuts, k.shape[2]]
    return [attention(q, k[:, :, a:e], v[:, :, a:e], return_lse=True) for a, e in zip(bounds, bounds[1:])]


def check_against_full(o, lse, q, k, v, dtype):
    o_ref, lse_ref = attention_reference(q.detach(), k.detach(), v.detach())
    o_same, _ = attention_reference(q.detach(), k.detach(), v.detach(), dtype=dtype)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert_close_to_ref(o, o_same, o_ref, eps=EPS[dtype])
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-3 if dtype == torch.float32 else 2e-2, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(case=FP32_GPU_CASES)
def test_pair_equals_attention_over_union(case, dtype):
    q, k, v = make(case, dtype)
    cut = case[-1][len(case[-1]) // 2]
    (o_a, lse_a), (o_b, lse_b) = partials(q, k, v, (cut,))
    o, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    check_against_full(o, lse, q, k, v, dtype)
    # Symmetric in its two arguments.
    o2, lse2 = merge_attention_states(o_b, lse_b, o_a, lse_a)
    torch.testing.assert_close(o2, o, atol=2e-3 if dtype != torch.float32 else 1e-6, rtol=0)
    torch.testing.assert_close(lse2, lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("as_list", [False, True], ids=["tensor", "list"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@gpu_fp32_only(case=FP32_GPU_CASES)
def test_stacked_equals_attention_over_union(case, dtype, as_list):
    q, k, v = make(case, dtype, seed=1)
    parts = partials(q, k, v, case[-1])
    os_, lses = [p[0] for p in parts], [p[1] for p in parts]
    o, lse = merge_attention_states_stacked(os_, lses) if as_list else \
        merge_attention_states_stacked(torch.stack(os_), torch.stack(lses))
    check_against_full(o, lse, q, k, v, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stacked_equals_chain_of_pairs(dtype):
    case = CPU_CASES[2]
    q, k, v = make(case, dtype, seed=2)
    parts = partials(q, k, v, case[-1])
    o, lse = parts[0]
    for o_b, lse_b in parts[1:]:
        o, lse = merge_attention_states(o.float(), lse, o_b.float(), lse_b)
    o_s, lse_s = merge_attention_states_stacked(torch.stack([p[0].float() for p in parts]),
                                                torch.stack([p[1] for p in parts]))
    torch.testing.assert_close(o_s, o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_s, lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_parts_are_ignored_even_if_nan(dtype):
    """lse = −inf marks a part with no keys; its o may be garbage. All-empty rows → 0, −inf."""
    q, k, v = make(CPU_CASES[1], dtype, seed=3)
    o_full, lse_full = attention(q, k, v, return_lse=True)
    junk = torch.full_like(o_full, float("nan"))
    empty = torch.full_like(lse_full, NEG_INF)
    o, lse = merge_attention_states(junk, empty, o_full, lse_full)
    torch.testing.assert_close(o, o_full, atol=1e-3 if dtype != torch.float32 else 1e-6, rtol=0)
    torch.testing.assert_close(lse, lse_full)
    o, lse = merge_attention_states_stacked([o_full, junk, junk], [lse_full, empty, empty])
    torch.testing.assert_close(o, o_full, atol=1e-3 if dtype != torch.float32 else 1e-6, rtol=0)
    torch.testing.assert_close(lse, lse_full)
    # Some rows empty in every part; the others take part a's row as is.
    lse_a = lse_full.clone()
    lse_a[:, :, 0] = NEG_INF
    o_a = o_full.clone()
    o_a[:, :, 0] = float("nan")
    for o, lse in (merge_attention_states(o_a, lse_a, junk, empty),
                   merge_attention_states_stacked([junk, o_a], [empty, lse_a])):
        assert torch.isfinite(o).all()
        assert (o[:, :, 0] == 0).all() and (lse[:, :, 0] == NEG_INF).all()
        torch.testing.assert_close(o[:, :, 1:], o_full[:, :, 1:], atol=1e-3 if dtype != torch.float32 else 1e-6, rtol=0)


def test_far_apart_lse_do_not_overflow():
    o_a = torch.randn(1, 2, 3, 16, device=DEVICE)
    o_b = torch.randn(1, 2, 3, 16, device=DEVICE)
    lse_a = torch.full((1, 2, 3), 5000.0, device=DEVICE)
    lse_b = torch.full((1, 2, 3), -5000.0, device=DEVICE)
    o, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o, o_a)
    torch.testing.assert_close(lse, lse_a)
    o, lse = merge_attention_states(o_a, lse_a, o_b, lse_a)   # equal weights
    torch.testing.assert_close(o, (o_a + o_b) / 2)
    torch.testing.assert_close(lse, lse_a + torch.log(torch.tensor(2.0)).item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_layouts_read_in_place(dtype):
    """(B, N, H, D) storage passed as (B, H, N, D) views, and partials stored (B, H, N, S, D)."""
    g = torch.Generator().manual_seed(4)
    B, H, N, D, S = 2, 3, 5, 24, 3
    o_bnhd = torch.randn(S, B, N, H, D, generator=g).to(DEVICE, dtype)
    lse_bnh = (torch.randn(S, B, N, H, generator=g) * 3).to(DEVICE)
    o_view, lse_view = o_bnhd.transpose(2, 3), lse_bnh.transpose(2, 3)
    o_ref, lse_ref = merge_attention_states_stacked(o_view.contiguous(), lse_view.contiguous())
    o, lse = merge_attention_states_stacked(o_view, lse_view)
    torch.testing.assert_close(o, o_ref, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_ref, atol=0, rtol=0)
    o_last = o_view.permute(1, 2, 3, 0, 4).contiguous().permute(3, 0, 1, 2, 4)   # S next to D in memory
    o, lse = merge_attention_states_stacked(o_last, lse_view)
    torch.testing.assert_close(o, o_ref, atol=0, rtol=0)
    o, lse = merge_attention_states(o_view[0], lse_view[0], o_view[1], lse_view[1])
    o2, lse2 = merge_attention_states(o_view[0].contiguous(), lse_view[0].contiguous(),
                                      o_view[1].contiguous(), lse_view[1].contiguous())
    torch.testing.assert_close(o, o2, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse2, atol=0, rtol=0)


@pytest.mark.parametrize("stacked", [False, True], ids=["pair", "stacked"])
def test_gradients_match_attention_over_union(stacked):
    """Backpropagating through attention on the parts and the merge gives full attention's grads."""
    case = (1, 2, 1, 3, 24, 16, (7, 15))
    q, k, v = make(case, torch.float32, seed=5, requires_grad=True)
    w = torch.randn(1, 2, 3, 16, device=DEVICE)
    w_lse = torch.randn(1, 2, 3, device=DEVICE)
    o_full, lse_full = attention(q, k, v, return_lse=True)
    grads_full = torch.autograd.grad((o_full * w).sum() + (lse_full * w_lse).sum(), (q, k, v))
    parts = partials(q, k, v, (7,) if not stacked else case[-1])
    if stacked:
        o, lse = merge_attention_states_stacked([p[0] for p in parts], [p[1] for p in parts])
    else:
        o, lse = merge_attention_states(*parts[0], *parts[1])
    grads = torch.autograd.grad((o * w).sum() + (lse * w_lse).sum(), (q, k, v))
    for name, g, g_ref in zip("qkv", grads, grads_full):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4, msg=f"d{name}")


@pytest.mark.parametrize("stacked", [False, True], ids=["pair", "stacked"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_lse_gradient_of_nearly_equal_parts_is_not_the_outputs_rounding(dtype, stacked):
    """dlse_s = w_s·(dlse + ⟨dO, O_s − O⟩): with parts whose outputs nearly agree, O_s − O is small
    and O's 16-bit rounding would be most of it; the backward forms O in float32, so dlse_s is
    within float32 rounding of float64 (against the returned O it was off by 6% here)."""
    g = torch.Generator().manual_seed(11)
    o_a = torch.randn(2, 3, 5, 256, generator=g)
    o_b = o_a + 0.01 * torch.randn(o_a.shape, generator=g)
    o_a, o_b = (t.to(DEVICE, dtype).requires_grad_() for t in (o_a, o_b))
    lse_a, lse_b = (torch.randn(2, 3, 5, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    do = torch.randn(2, 3, 5, 256, generator=g).to(DEVICE, dtype)
    o, lse = (merge_attention_states_stacked([o_a, o_b], [lse_a, lse_b]) if stacked
              else merge_attention_states(o_a, lse_a, o_b, lse_b))
    ours = torch.autograd.grad(o, (lse_a, lse_b), do)
    leaves = [t.detach().double().requires_grad_() for t in (o_a, lse_a, o_b, lse_b)]
    w = torch.softmax(torch.stack(leaves[1::2]), 0)
    o_ref = w[0].unsqueeze(-1) * leaves[0] + w[1].unsqueeze(-1) * leaves[2]
    ref = torch.autograd.grad(o_ref, leaves[1::2], do.double())
    for got, want in zip(ours, ref):
        assert (got.double() - want).norm() <= 1e-4 * want.norm()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy warns at inf − inf; checked
@pytest.mark.parametrize("loss", ["o+lse", "o", "lse"])
@pytest.mark.parametrize("stacked", [False, True], ids=["pair", "stacked"])
def test_gradients_at_non_finite_lse_match_the_reference(stacked, loss):
    """A part's lse NaN or +inf makes its row NaN (``test_nonfinite.py``); the gradients are the
    float64 reference's (lse = logaddexp of the parts, o = Σ exp(lse_s − lse)·o_s, by autograd):
    NaN where the reference's are, never silently finite (they were all 0), and 0 for a part that a
    +inf part outweighs. One difference: through the lse alone, a +inf part's own d lse is NaN,
    where the reference's lse is +inf and its d lse the limit dlse; ours is NaN (the merged lse)."""
    nan, inf = float("nan"), float("inf")
    pairs = [(nan, 0.3), (0.3, nan), (inf, 0.3), (-2.0, inf), (inf, NEG_INF), (inf, inf), (nan, NEG_INF),
             (nan, inf), (NEG_INF, 0.3), (0.1, 0.3)]
    g = torch.Generator().manual_seed(17)
    o_a, o_b = (torch.randn(1, 1, len(pairs), 24, generator=g) for _ in range(2))
    lse_a, lse_b = (torch.tensor([p[i] for p in pairs]).view(1, 1, -1) for i in (0, 1))
    do, dlse = torch.randn(o_a.shape, generator=g), torch.randn(lse_a.shape, generator=g)

    def grads(merge, dtype, device):
        leaves = [t.to(device, dtype).requires_grad_() for t in (o_a, lse_a, o_b, lse_b)]
        o, lse = merge(*leaves)
        terms = {"o": (o * do.to(device, dtype)).sum(), "lse": (lse * dlse.to(device, dtype)).sum()}
        return o, torch.autograd.grad(sum(terms[t] for t in loss.split("+")), leaves, allow_unused=True)

    def reference(oa, la, ob, lb):
        lse = torch.logaddexp(la, lb)
        return torch.exp(la - lse).unsqueeze(-1) * oa + torch.exp(lb - lse).unsqueeze(-1) * ob, lse

    ours = (lambda oa, la, ob, lb: merge_attention_states_stacked([oa, ob], [la, lb])) if stacked \
        else merge_attention_states
    nan_rows = lambda t: torch.isnan(t).reshape(len(pairs), -1).any(-1).nonzero().flatten().tolist()  # noqa: E731
    o, got = grads(ours, torch.float32, DEVICE)
    o_ref, want = grads(reference, torch.float64, "cpu")
    if loss == "lse":  # the one difference (docstring)
        want = [want[0], torch.where(torch.isposinf(lse_a), nan, want[1]),
                want[2], torch.where(torch.isposinf(lse_b), nan, want[3])]
    torch.testing.assert_close(o.double().cpu(), o_ref, equal_nan=True)
    for name, a, b in zip(("do_a", "dlse_a", "do_b", "dlse_b"), got, want):
        a = a.double().cpu()
        if b is None:  # o unused: the reference has no gradient, ours is 0
            assert not a.any(), name
            continue
        assert torch.equal(torch.isnan(a), torch.isnan(b)), f"{name}: NaN rows {nan_rows(a)}, reference {nan_rows(b)}"
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, equal_nan=True, msg=name)


@pytest.mark.parametrize("stacked", [False, True], ids=["pair", "stacked"])
def test_gradient_through_the_lse_alone(stacked, monkeypatch):
    """Only the merged lse reaches the loss (o unused: autograd passes no dO): d lse_s is the parts'
    softmax weight times dlse, d o_s is zero, without a pass over the parts (the backward's early
    return: the parts' zeroing of empty rows is not reached)."""
    g = torch.Generator().manual_seed(13)
    o_a, o_b = (torch.randn(2, 3, 5, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 3, 5, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    dlse = torch.randn(2, 3, 5, generator=g).to(DEVICE)
    _, lse = (merge_attention_states_stacked([o_a, o_b], [lse_a, lse_b]) if stacked
              else merge_attention_states(o_a, lse_a, o_b, lse_b))
    from flashattn_lite.ops import merge_states as ms

    def no_pass(*args):
        raise AssertionError("the backward formed the parts although no dO came")
    monkeypatch.setattr(ms, "_empty_to_zero", no_pass)
    d_oa, d_la, d_ob, d_lb = torch.autograd.grad(lse, (o_a, lse_a, o_b, lse_b), dlse)
    w = torch.softmax(torch.stack([lse_a, lse_b]).detach().double(), 0)
    assert not d_oa.any() and not d_ob.any()
    torch.testing.assert_close(d_la.double(), w[0] * dlse.double(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(d_lb.double(), w[1] * dlse.double(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_cpu_twin_matches_reference(torch_cpu_path, dtype):
    case = CPU_CASES[1]
    q, k, v = make(case, dtype, seed=6)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    parts = partials(q, k, v, case[-1])
    o, lse = merge_attention_states_stacked([p[0] for p in parts], [p[1] for p in parts])
    check_against_full(o, lse, q, k, v, dtype)
    o, lse = merge_attention_states(*partials(q, k, v, (11,))[0], *partials(q, k, v, (11,))[1])
    check_against_full(o, lse, q, k, v, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_merge_into_an_accumulator_in_place(dtype):
    # A float32 accumulator merged in place with parts in their own dtype, as ring attention's
    # forward does: equals the out-of-place merge of the same states, empty rows (lse −inf, o NaN)
    # included, and the accumulator tensors are the ones written (views of a larger state).
    from flashattn_lite.ops.merge_states import merge_pair_into
    g = torch.Generator().manual_seed(3)
    o_a = torch.randn(2, 3, 9, 16, generator=g).to(DEVICE)
    lse_a = torch.randn(2, 3, 9, generator=g).to(DEVICE)
    lse_a[0, 1, :4] = float("-inf")
    o_a[0, 1, :4] = float("nan")
    o_b = torch.randn(2, 3, 9, 16, generator=g).to(device=DEVICE, dtype=dtype)
    lse_b = torch.randn(2, 3, 9, generator=g).to(DEVICE)
    lse_b[0, 1, 2:6] = float("-inf")
    want_o, want_lse = merge_attention_states(o_a.nan_to_num(), lse_a, o_b.float(), lse_b)
    state_o = torch.full((2, 3, 12, 16), 7.0, device=DEVICE)
    state_lse = torch.full((2, 3, 12), 7.0, device=DEVICE)
    state_o[:, :, 1:10], state_lse[:, :, 1:10] = o_a, lse_a
    merge_pair_into(state_o[:, :, 1:10], state_lse[:, :, 1:10], o_b, lse_b)
    torch.testing.assert_close(state_o[:, :, 1:10], want_o, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state_lse[:, :, 1:10], want_lse, rtol=1e-6, atol=1e-6)
    assert (state_o[:, :, [0, 10, 11]] == 7).all() and (state_lse[:, :, [0, 10, 11]] == 7).all()
    assert torch.isneginf(state_lse[0, 1, 3:5]).all() and (state_o[0, 1, 3:5] == 0).all()


def test_bad_input_names_the_argument():
    o = torch.randn(1, 2, 3, 16, device=DEVICE)
    lse = torch.randn(1, 2, 3, device=DEVICE)
    with pytest.raises(TypeError, match="lse_b"):
        merge_attention_states(o, lse, o, lse.half())
    with pytest.raises(ValueError, match="lse_a"):
        merge_attention_states(o, lse[:, :, :2], o, lse)
    with pytest.raises(ValueError, match="o_b"):
        merge_attention_states(o, lse, o[:, :1], lse[:, :1])
    with pytest.raises(ValueError, match="dtype"):
        merge_attention_states(o, lse, o.half(), lse)
    with pytest.raises(ValueError, match="o_a"):
        merge_attention_states(o[0], lse[0], o[0], lse[0])
    with pytest.raises(TypeError, match="o_a"):
        merge_attention_states(o.long(), lse, o, lse)
    with pytest.raises(ValueError, match="lse"):
        merge_attention_states_stacked(torch.stack([o, o]), torch.stack([lse, lse, lse]))
    with pytest.raises(ValueError, match="at least one"):
        merge_attention_states_stacked([], [])
    with pytest.raises(TypeError, match=r"lse\[1\]"):
        merge_attention_states_stacked([o, o], [lse, lse.double()])


def test_stacked_tiles_take_every_split_from_512_columns(monkeypatch):
    # From 512 columns (MLA's latent) the stacked merge takes every split in one pass (up to 128),
    # 128 columns and up to 4 rows a program; narrower heads keep the 32-split rule.
    from flashattn_lite.ops import merge_states
    monkeypatch.setattr(merge_states, "interpreter_active", lambda: False)
    t = torch.zeros(1)
    assert merge_states.stacked_tiles(128, 512, 66, t) == (128, 1, 128)
    assert merge_states.stacked_tiles(1024, 512, 8, t) == (8, 4, 128)
    assert merge_states.stacked_tiles(128, 512, 300, t)[0] == 128   # more splits: the kernel loops
    assert merge_states.stacked_tiles(128, 128, 66, t)[0] == 32


def test_stacked_merge_at_512_columns_with_the_wide_tiles(monkeypatch):
    # The wide tiles (1-row programs over 128 split slots, 70 of them parts, some empty) against the
    # PyTorch twin.
    from flashattn_lite.ops import merge_states
    monkeypatch.setattr(merge_states, "interpreter_active", lambda: False)
    assert merge_states.stacked_tiles(3, 512, 70, torch.zeros(1)) == (128, 1, 128)
    g = torch.Generator().manual_seed(0)
    o_parts = torch.randn(70, 1, 3, 1, 512, generator=g).to(DEVICE)
    lse_parts = torch.randn(70, 1, 3, 1, generator=g).to(DEVICE)
    lse_parts[1::3, 0, 0, 0] = float("-inf")
    o, lse = merge_attention_states_stacked(o_parts, lse_parts)
    o_ref, lse_ref = merge_states.merge_stacked_torch(o_parts.cpu(), lse_parts.cpu())
    torch.testing.assert_close(o.float().cpu(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), lse_ref, atol=1e-5, rtol=1e-5)
