"""torch.compile(fullgraph=True) through the custom ops: forward, backward, dropout, replace_sdpa.

CPU runs backend="aot_eager" (AOTAutograd + our fake kernels, no C++ build); GPU runs inductor."""
import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, ON_GPU, rel_err
import flashattn_lite
from flashattn_lite.nn import MultiheadAttention

import os
BACKEND = os.environ.get("FA_TEST_BACKEND") or ("inductor" if ON_GPU else "aot_eager")
# The op's registration and the compiled dropout are dtype-free; on the GPU they run in fp16, whose
# kernels compile in seconds (float32's took two minutes per test there; float32 dropout and the
# compiled float32 module run in test_sdpa.py and below).
OP_DTYPE = torch.float16 if ON_GPU else torch.float32


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("path", ["kernels", "cpu_twin"])
def test_custom_ops_pass_opcheck(request, path):
    """Schema, fake kernels and autograd registration (torch's own checker), on the Triton kernels
    (interpreted on CPU) and on the PyTorch twin. AOTAutograd hands the backward expanded
    (stride-0) output grads, which this catches."""
    if path == "cpu_twin":
        if ON_GPU:
            pytest.skip("the PyTorch twin runs on CPU tensors")
        request.getfixturevalue("torch_cpu_path")
    q = torch.randn(1, 2, 5, 16, device=DEVICE, dtype=OP_DTYPE, requires_grad=True)
    k = torch.randn(1, 1, 7, 16, device=DEVICE, dtype=OP_DTYPE, requires_grad=True)
    mask = torch.rand(1, 1, 5, 7, device=DEVICE) > 0.3
    mask[..., 0] = True
    seed = torch.tensor(1234)
    sinks = torch.randn(2, device=DEVICE, requires_grad=True)
    alibi = torch.rand(1, 2, device=DEVICE)
    plain = (None, None, None, None, 0.25)  # sinks, alibi, seq_q, seq_k, scale
    # (q, k, v, mask, sinks, alibi, seq_q, seq_k, scale, causal, offset, left, right, softcap, seq, dropout_p, seed)
    cases = [(q, k, k, None, *plain, True, 2, -1, -1, 0.0, 0, 0.0, None),
             (q, k, k, mask, *plain, False, 0, -1, -1, 0.0, 0, 0.2, seed),
             (q, k, k, None, sinks, alibi, None, None, 0.25, True, 2, 3, -1, 2.0, 0, 0.0, None)]
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 4, 7], dtype=torch.int32, device=DEVICE)
    packed_q, packed_k = q.detach()[0].transpose(0, 1).requires_grad_(), k.detach()[0].transpose(0, 1).requires_grad_()
    cases.append((packed_q, packed_k, packed_k, None, sinks, None, cu, cu_k, 0.25, True, 0, -1, -1, 0.0, 2, 0.0,
                  None))  # varlen
    for args in cases:
        torch.library.opcheck(torch.ops.flashattn_lite.attention_fwd.default, args)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = MultiheadAttention(32, 4, 2, causal=True, rotary=True)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x, mask=None):
        return self.norm(x + self.attn(x, attn_mask=mask))


def _out_and_grads(model, x, mask, weight):
    model.zero_grad()
    out = model(x, mask)
    (out * weight).sum().backward()  # a random projection: no cancellation in the gradients
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("with_mask", [False, True], ids=["causal", "causal+mask"])
def test_compiled_module_matches_eager_forward_and_backward(with_mask, monkeypatch):
    """Compiled and eager are each compared with a float64 run of the same model (the PyTorch twin
    on CPU): inductor reorders the float32 arithmetic around our ops, so the two float32 runs
    differ by rounding, and the compiled one must be as accurate as eager."""
    torch.manual_seed(0)
    model = _Tiny().to(DEVICE)
    x = torch.randn(2, 9, 32, device=DEVICE)
    weight = torch.randn(2, 9, 32, device=DEVICE)
    mask = (torch.rand(2, 1, 1, 9, device=DEVICE) > 0.2) if with_mask else None
    if mask is not None:
        mask[..., 0] = True
    eager = _out_and_grads(model, x, mask, weight)
    compiled = _out_and_grads(torch.compile(model, fullgraph=True, backend=BACKEND), x, mask, weight)
    with monkeypatch.context() as m:
        m.setenv("TRITON_INTERPRET", "0")  # float64 runs on the PyTorch twin
        ref = _out_and_grads(copy.deepcopy(model).cpu().double(), x.cpu().double(), None if mask is None
                             else mask.cpu(), weight.cpu().double())
    for what, e, c, r in zip(["output"] + [n for n, _ in model.named_parameters()],
                             [eager[0]] + eager[1], [compiled[0]] + compiled[1], [ref[0]] + ref[1]):
        e_err, c_err = rel_err(e.cpu(), r), rel_err(c.cpu(), r)
        assert c_err <= 2 * e_err + 1e-6, f"{what}: compiled err {c_err:.2e} vs eager {e_err:.2e}"


def test_compiled_dropout_no_graph_break_and_fresh_masks():
    def f(q, k, v):
        return flashattn_lite.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    q = torch.randn(1, 2, 8, 16, device=DEVICE, dtype=OP_DTYPE, requires_grad=True)
    cf = torch.compile(f, fullgraph=True, backend=BACKEND)
    a, b = cf(q, q, q), cf(q, q, q)
    assert not torch.equal(a, b), "each call of the compiled graph draws a new seed"
    a.sum().backward()
    assert torch.isfinite(q.grad).all()
    if BACKEND == "aot_eager":  # the seed draw runs as the eager aten op: same stream as eager
        torch.manual_seed(5)
        ref = f(q, q, q)
        torch.manual_seed(5)
        assert torch.equal(cf(q, q, q), ref)


def test_compiled_model_calling_torch_sdpa_after_replace():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q = torch.randn(1, 4, 6, 16, device=DEVICE)
    kv = torch.randn(1, 2, 6, 16, device=DEVICE)
    with flashattn_lite.replace_sdpa():
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm
        out = torch.compile(M(), fullgraph=True, backend=backend)(q, kv, kv)
    assert any("flashattn_lite.attention_fwd" in str(n.target) for n in graphs[0].graph.nodes)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_reduce_overhead_mode_replays_the_kernels_from_a_cuda_graph():
    """torch.compile(mode="reduce-overhead") captures our ops in a CUDA graph (the answer to
    per-call host overhead in loops of tiny calls); replays with new inputs match eager."""
    torch.manual_seed(0)
    model = _Tiny().to(DEVICE).eval()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):  # warm-up, capture, then replays
            x = torch.randn(2, 9, 32, device=DEVICE)
            out = compiled(x).clone()
            torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_compiled_output_strides_are_the_kernels():
    # The custom op's fake allocates o by the kernels' rule (``dense_output``: q's layout), so a
    # compiled graph's view of o's strides is the real one: a model's (B, N, H, D) layout stays so.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 17, 4, 32, generator=g).to(DEVICE, torch.float16).transpose(1, 2) for _ in range(3))
    eager = flashattn_lite.attention(q, k, v, causal=True)
    compiled = torch.compile(lambda q, k, v: flashattn_lite.attention(q, k, v, causal=True), fullgraph=True,
                             backend=BACKEND)(q, k, v)
    assert eager.stride() == compiled.stride() == q.stride()
    assert torch.equal(eager, compiled)


def test_meta_tensors_get_the_ops_shapes():
    """Meta tensors (shape inference, models built on the meta device) take the custom ops' fake
    implementations: outputs and gradients of the right shapes on meta, no kernel, no copy."""
    m, kv = torch.empty(1, 4, 5, 8, device="meta"), torch.empty(1, 2, 7, 8, device="meta")
    o, lse = flashattn_lite.attention(m, kv, kv[..., :6], causal=True, window=(2, 0), return_lse=True)
    assert (o.shape, lse.shape, o.device.type) == ((1, 4, 5, 6), (1, 4, 5), "meta")
    q = m.clone().requires_grad_()
    flashattn_lite.attention(q, kv, kv).sum().backward()
    assert q.grad.shape == q.shape and q.grad.device.type == "meta"
    assert flashattn_lite.scaled_dot_product_attention(m, m, m, is_causal=True).shape == m.shape
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device="meta")
    packed = torch.empty(5, 4, 8, device="meta")
    assert flashattn_lite.attention_varlen(packed, packed[:, :2], packed[:, :2], cu, cu).shape == packed.shape


def test_varlen_and_ranges_compile_whole_with_default_bound_checks():
    """The default bound check reads the values only in eager mode on CPU tensors: a compiled call
    (fullgraph) takes the kernels' clamped reads instead of breaking the graph, and gives the eager
    result. A bad batch is still refused in eager mode."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(9, 2, 16, generator=g).to(DEVICE, torch.float16)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    f = lambda q, cu: flashattn_lite.attention_varlen(q, q, q, cu, cu, causal=True)  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True, backend=BACKEND)(q, cu), f(q, cu))
    x = q.transpose(0, 1)[None]  # (1, H, N, D)
    ranges = torch.tensor([[1, 8]], dtype=torch.int32, device=DEVICE)
    h = lambda x, r: flashattn_lite.ops.attention.attention_core(x, x, x, q_ranges=r, k_ranges=r)  # noqa: E731
    assert torch.equal(torch.compile(h, fullgraph=True, backend=BACKEND)(x, ranges), h(x, ranges))
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="cu_seqlens"):
            f(q, torch.tensor([0, 5, 4], dtype=torch.int32))
