"""flashattn_lite.nn: FlashAttention, MultiheadAttention, RotaryEmbedding against plain PyTorch."""
import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, rel_err
from flashattn_lite.nn import FlashAttention, MultiheadAttention, RotaryEmbedding
from flashattn_lite.reference import attention_reference


def test_flash_attention_module_bottom_right_causal_mask_and_gqa():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 16, generator=g).to(DEVICE)
    k = torch.randn(2, 2, 9, 16, generator=g).to(DEVICE)
    v = torch.randn(2, 2, 9, 16, generator=g).to(DEVICE)
    mask = (torch.rand(2, 1, 1, 9, generator=g) > 0.3).to(DEVICE)
    mask[..., 0] = True
    mod = FlashAttention(causal=True, scale=0.2)
    ref, _ = attention_reference(q, k, v, causal=True, scale=0.2, attn_mask=mask)
    assert rel_err(mod(q, k, v, mask), ref) < 1e-5


def test_flash_attention_dropout_only_in_training():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    mod = FlashAttention(dropout=0.5)
    ref = FlashAttention()(q, q, q)
    assert torch.equal(mod.eval()(q, q, q), ref)
    assert not torch.allclose(mod.train()(q, q, q), ref)
    with pytest.raises(ValueError):
        FlashAttention(dropout=1.0)


def _reference_mha(m: MultiheadAttention, x, context=None, mask=None):
    """The same module, written with plain linear algebra and torch's SDPA (float64)."""
    x = x.double()
    ctx = x if context is None else context.double()
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    if m.fused_qkv:
        w, b = m.qkv_proj.weight.double(), m.qkv_proj.bias.double()
        q = F.linear(x, w[:hq * d], b[:hq * d])
        k, v = F.linear(ctx, w[hq * d:], b[hq * d:]).split([hkv * d, hkv * d], -1)
    else:
        q = F.linear(x, m.q_proj.weight.double(), m.q_proj.bias.double())
        k = F.linear(ctx, m.k_proj.weight.double(), m.k_proj.bias.double())
        v = F.linear(ctx, m.v_proj.weight.double(), m.v_proj.bias.double())
    B, L, S = x.shape[0], x.shape[1], ctx.shape[1]
    q, k, v = q.view(B, L, hq, d), k.view(B, S, hkv, d), v.view(B, S, hkv, d)
    if m.rotary is not None:
        def rot(t, n):  # complex-number form of rotate-half RoPE: independent of the module's code
            f64 = dict(dtype=torch.float64, device=t.device)
            freqs = m.rotary.base ** (-torch.arange(0, d, 2, **f64) / d)
            z = torch.complex(t[..., : d // 2], t[..., d // 2:])
            z = z * torch.polar(torch.ones(n, d // 2, **f64), torch.arange(n, **f64)[:, None] * freqs)[None, :, None]
            return torch.cat((z.real, z.imag), -1)
        q, k = rot(q, L), rot(k, S)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       is_causal=m.attn.causal, enable_gqa=True)
    return F.linear(o.transpose(1, 2).reshape(B, L, hq * d), m.out_proj.weight.double(), m.out_proj.bias.double())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("rotary", [False, True], ids=["", "rope"])
def test_multihead_attention_matches_plain_pytorch(fused, heads, rotary):
    torch.manual_seed(0)
    m = MultiheadAttention(32, heads[0], heads[1], fused_qkv=fused, causal=True, rotary=rotary).to(DEVICE)
    x = torch.randn(2, 7, 32, device=DEVICE, requires_grad=True)
    out = m(x)
    assert out.shape == x.shape
    assert rel_err(out, _reference_mha(m, x)) < 1e-5
    out.square().sum().backward()
    ref_x = x.detach().double().requires_grad_()
    _reference_mha(m, ref_x).square().sum().backward()
    assert rel_err(x.grad, ref_x.grad) < 1e-4


def test_multihead_cross_attention_with_padding_mask():
    torch.manual_seed(1)
    m = MultiheadAttention(32, 4, 2, head_dim=16).to(DEVICE)
    x, ctx = torch.randn(2, 5, 32, device=DEVICE), torch.randn(2, 9, 32, device=DEVICE)
    pad = torch.ones(2, 1, 1, 9, dtype=torch.bool, device=DEVICE)
    pad[1, ..., 6:] = False
    out = m(x, ctx, attn_mask=pad)
    assert rel_err(out, _reference_mha(m, x, ctx, pad)) < 1e-5
    assert not torch.allclose(out, m(x, ctx)), "the mask must matter"


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16).expand(1, 6, 1, 16), torch.randn(1, 1, 1, 16).expand(1, 6, 1, 16)
    pos = torch.arange(6)
    s = (rope(q, pos)[0, :, 0] @ rope(k, pos)[0, :, 0].T)
    assert torch.allclose(s.diagonal(1), s.diagonal(1)[0].expand(5), atol=1e-5)
    assert torch.allclose(s.diagonal(0), (q[0, 0, 0] @ k[0, 0, 0]).expand(6), atol=1e-5)
    with pytest.raises(ValueError):
        RotaryEmbedding(15)


def _rope_float64(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = positions.double()[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def test_rotary_frequencies_survive_dtype_moves_and_meta_construction():
    """The frequencies are not state: ``.half()`` must not round them (angles off by radians at
    position 4095 when they were a buffer) and a module built on the meta device, moved with
    ``to_empty`` and loaded from a state dict must rotate as one built normally."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 2, 16, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 1000, 4095])
    ref = _rope_float64(x, positions)
    assert rel_err(RotaryEmbedding(16).double()(x, positions), ref) < 1e-12  # float64 end to end
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        rope = RotaryEmbedding(16).to(dtype)
        assert rel_err(rope(x.to(dtype), positions), ref) < tol, dtype
    with torch.device("meta"):
        m = MultiheadAttention(32, 2, rotary=True)
    m = m.to_empty(device="cpu")
    normal = MultiheadAttention(32, 2, rotary=True)
    m.load_state_dict(normal.state_dict())
    xs = torch.randn(1, 5, 32, generator=g)
    assert torch.equal(m(xs), normal(xs))


def test_rotary_keeps_no_frequencies_from_a_compiled_graph():
    """Inside a compiled graph the frequencies are computed, never stored: a stored graph output
    may live in a CUDA graph's memory (mode="reduce-overhead"), overwritten at its next replay
    (torch's cudagraph trees raised on the eager call that read it). Eager calls keep them."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 5, 2, 16, generator=g)
    positions = torch.arange(5)
    rope = RotaryEmbedding(16)
    compiled = torch.compile(rope, backend="eager", fullgraph=True)
    out = compiled(x, positions)
    assert rope._inv_freq == {}
    assert torch.allclose(out, rope(x, positions), atol=1e-6)
    assert len(rope._inv_freq) == 1  # the eager call kept its own
    assert torch.allclose(compiled(x, positions), out, atol=1e-6)


def test_bad_head_configuration():
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiheadAttention(32, 4, 3)
    with pytest.raises(ValueError, match="divisible"):
        MultiheadAttention(30, 4)


def test_positions_need_a_rotary_embedding():
    """Without rotary=True nothing reads positions: passing them is an error, not a no-op."""
    m = MultiheadAttention(32, 4).to(DEVICE)
    x = torch.randn(1, 3, 32, device=DEVICE)
    with pytest.raises(ValueError, match="positions needs .*rotary=True"):
        m(x, positions=torch.arange(3, device=DEVICE))
    rope = MultiheadAttention(32, 4, rotary=True).to(DEVICE)
    assert torch.equal(rope(x, positions=torch.arange(3, device=DEVICE)), rope(x))  # the default positions


@pytest.mark.parametrize("base, error", [("garbage", TypeError), (True, TypeError), (torch.tensor(2.0), TypeError),
                                         (0.0, ValueError), (-1, ValueError), (float("nan"), ValueError),
                                         (float("inf"), ValueError)], ids=repr)
def test_rotary_base_is_a_finite_positive_number(base, error):
    with pytest.raises(error, match="rotary_base"):
        MultiheadAttention(32, 4, rotary=True, rotary_base=base)
    with pytest.raises(error, match="rotary_base"):  # checked whether or not rotary is on
        MultiheadAttention(32, 4, rotary_base=base)
    with pytest.raises(error, match="base"):
        RotaryEmbedding(8, base)
    assert RotaryEmbedding(8, 500).base == 500.0


@pytest.mark.parametrize("dropout, error", [("0.1", TypeError), (None, TypeError), (torch.tensor(0.1), TypeError),
                                            (False, TypeError), (-0.1, ValueError), (1, ValueError),
                                            (float("nan"), ValueError)], ids=repr)
def test_dropout_is_a_number_in_0_1(dropout, error):
    with pytest.raises(error, match="dropout"):
        FlashAttention(dropout=dropout)
    with pytest.raises(error, match="dropout"):  # passed on to FlashAttention, the same check
        MultiheadAttention(32, 4, dropout=dropout)


def test_dropout_accepts_ints_and_numpy_floats():
    np = pytest.importorskip("numpy")
    assert FlashAttention(dropout=0).dropout == 0.0
    mod = FlashAttention(dropout=np.float64(0.5)).train()
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    assert type(mod.dropout) is float and mod(q, q, q).shape == q.shape


@pytest.mark.parametrize("head_dim, error", [("8", TypeError), (8.0, TypeError), (True, TypeError),
                                             (0, ValueError), (-2, ValueError), (7, ValueError)], ids=repr)
def test_rotary_head_dim_is_a_positive_even_int(head_dim, error):
    with pytest.raises(error, match="head_dim"):
        RotaryEmbedding(head_dim)


def test_rotary_forward_checks_x_and_positions():
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 4, 8)
    for positions in (torch.arange(3), torch.arange(3).expand(2, 3), torch.arange(3)[None]):
        assert rope(x, positions).shape == x.shape
    with pytest.raises(ValueError, match="x last dim must equal head_dim"):
        rope(torch.randn(2, 3, 4, 6), torch.arange(3))
    with pytest.raises(ValueError, match="x must have 4 dimensions"):
        rope(torch.randn(3, 4, 8), torch.arange(3))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rope(x.tolist(), torch.arange(3))
    # A length-1 positions would broadcast: every token at one position.
    for bad in (torch.zeros(1, dtype=torch.long), torch.arange(4), torch.zeros(3, 3), torch.zeros(2, 1)):
        with pytest.raises(ValueError, match="positions must have shape"):
            rope(x, bad)
    with pytest.raises(ValueError, match="positions must have 1 or 2 dimensions"):
        rope(x, torch.zeros(2, 3, 1))
    with pytest.raises(TypeError, match="positions must be a torch.Tensor"):
        rope(x, [0, 1, 2])
