"""transformers integration: attn_implementation="fa_lite" against "eager" on tiny random models of
every attention family (Llama, Mistral sliding window, Qwen3 mixed layers, Gemma 2 softcap, gpt-oss
sinks, DeepSeek-V3's latent attention with v's head dim below q's), padded batches, generation,
training; and what reaches the kernel."""
import sys
import warnings
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import DEVICE, ON_GPU  # noqa: E402
import flashattn_lite.ops.attention as attn_ops  # noqa: E402
from flashattn_lite import _log  # noqa: E402
from flashattn_lite.integrations import hf  # noqa: E402
from transformers import masking_utils  # noqa: E402

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
VOCAB, LEN = 97, 11
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0,
               attention_dropout=0.0)
GPU_ONLY = pytest.mark.skipif(not ON_GPU, reason="interpreted kernels are slow: this family runs on the GPU only")


def _config(family):
    if family == "llama":
        return transformers.LlamaConfig(**_COMMON)
    if family == "mistral":  # every layer slides, over a window shorter than the sequence
        return transformers.MistralConfig(sliding_window=4, **_COMMON)
    if family == "qwen3":  # layer 0 full, layer 1 sliding
        return transformers.Qwen3Config(use_sliding_window=True, sliding_window=4, max_window_layers=1, **_COMMON)
    if family == "gemma2":  # sliding and full layers, softcap small enough to bite
        return transformers.Gemma2Config(sliding_window=4, attn_logit_softcapping=1.0, query_pre_attn_scalar=8,
                                         **_COMMON)
    if family == "gpt_oss":  # every token goes to both experts: no routing choice for rounding to flip
        return transformers.GptOssConfig(sliding_window=4, num_local_experts=2, num_experts_per_tok=2, **_COMMON)
    if family == "deepseek_v3":
        return _deepseek_config()
    raise ValueError(family)


def _deepseek_config(nope=8, rope=8, value=8, **overrides):
    """DeepSeek-V3's multi-head latent attention: q and k at head dim nope + rope, v at ``value``
    (MLA's 128 + 64 and 128 at full size); dense MLPs only (no expert routing for rounding to flip)."""
    common = {n: c for n, c in _COMMON.items() if n not in ("head_dim", "num_key_value_heads")}
    config = dict(common, num_key_value_heads=common["num_attention_heads"], moe_intermediate_size=16,
                  q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=nope,
                  qk_rope_head_dim=rope, v_head_dim=value, first_k_dense_replace=common["num_hidden_layers"],
                  n_routed_experts=2, num_experts_per_tok=1)
    config.update(overrides)
    return transformers.DeepseekV3Config(**config)


def _ablate(family, model):
    """Switch off the feature the family is here for (to show that it matters); None if none."""
    if family == "mistral":
        model.config.sliding_window = None
    elif family == "gemma2":
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = None
    elif family == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.fill_(-1e4)
    else:
        return None
    return model


def _models(family, dtype=DTYPE, config=None):
    """(eager reference, ours) with the same weights; the eager model in float32. ``config``: instead
    of the family's tiny one."""
    config = _config(family) if config is None else config
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    if family == "gpt_oss":  # init leaves sinks near 0; large ones make the sink term matter
        with torch.no_grad():
            for layer in ref.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                         attn_implementation=hf.ATTN_IMPLEMENTATION)
    ours.load_state_dict(ref.state_dict())
    return ref.to(DEVICE).eval(), ours.to(DEVICE, dtype).eval()


def _batch(pad="left"):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, LEN), generator=g)
    am = torch.ones(3, LEN, dtype=torch.long)
    if pad == "left":
        am[1, :3] = 0
        am[2, :7] = 0
    else:
        am[1, 8:] = 0
        am[2, 4:] = 0
    ids[am == 0] = 0
    return ids.to(DEVICE), am.to(DEVICE)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _hf_fallbacks():
    return sum(n for (where, _), n in _log.fallback_counts().items() if where == "hf")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Every attention_core call the integration makes, with its keyword arguments."""
    calls, core = [], attn_ops.attention_core

    def spy(q, k, v, **kw):
        calls.append(dict(kw, q=q, k=k, v=v))
        return core(q, k, v, **kw)

    monkeypatch.setattr(attn_ops, "attention_core", spy)
    return calls


GENERATE_FAMILIES = ["mistral", "gemma2", "gpt_oss", "deepseek_v3",
                     pytest.param("llama", marks=GPU_ONLY), pytest.param("qwen3", marks=GPU_ONLY)]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "gemma2", "gpt_oss", "deepseek_v3"])
def test_logits_match_eager_on_left_padded_batch(family, kernel_calls):
    ref, ours = _models(family)
    ids, am = _batch("left")
    keep = am.bool()
    before = _hf_fallbacks()
    with torch.no_grad():
        l_ref = ref(input_ids=ids, attention_mask=am).logits
        l_ours = ours(input_ids=ids, attention_mask=am).logits
        ablated = _ablate(family, copy.deepcopy(ref))
        l_ablated = None if ablated is None else ablated(input_ids=ids, attention_mask=am).logits
        l_nomask = ref(input_ids=ids).logits
    assert _rel(l_ours[keep], l_ref[keep]) < TOL[DTYPE]
    assert _hf_fallbacks() == before
    assert len(kernel_calls) == 2 and all(c.get("attn_mask") is None for c in kernel_calls)
    if family == "deepseek_v3":  # v's head dim reaches the kernel as it is, below q's (no padding to q's)
        assert all(c["q"].shape[-1] == 16 and c["v"].shape[-1] == 8 for c in kernel_calls)
    # What is being tested must matter, well beyond TOL: the padding, and the family's feature.
    assert _rel(l_nomask[keep], l_ref[keep]) > 0.1
    if l_ablated is not None:
        assert _rel(l_ablated[keep], l_ref[keep]) > 0.1


@pytest.mark.parametrize("family", ["gemma2", pytest.param("qwen3", marks=GPU_ONLY)])
def test_logits_match_eager_on_right_padded_batch(family):
    ref, ours = _models(family)
    ids, am = _batch("right")
    keep = am.bool()
    with torch.no_grad():
        assert _rel(ours(input_ids=ids, attention_mask=am).logits[keep],
                    ref(input_ids=ids, attention_mask=am).logits[keep]) < TOL[DTYPE]


@pytest.mark.parametrize("family", GENERATE_FAMILIES)
def test_generate_matches_eager(family):
    ref, ours = _models(family, torch.float32)  # greedy tokens: no bf16 near-ties between the two
    ids, am = _batch("left")
    kw = dict(attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    before = _hf_fallbacks()
    assert torch.equal(ours.generate(input_ids=ids, **kw), ref.generate(input_ids=ids, **kw))
    assert _hf_fallbacks() == before


@pytest.mark.parametrize("family", ["llama", pytest.param("mistral", marks=GPU_ONLY)])
def test_generate_with_static_cache_matches_eager(family, kernel_calls):
    ref, ours = _models(family, torch.float32)
    ids, am = _batch("left")
    kw = dict(attention_mask=am, max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static")
    assert torch.equal(ours.generate(input_ids=ids, **kw), ref.generate(input_ids=ids, **kw))
    # The static cache holds empty slots past the last token: ranges, not a mask, keep them out.
    assert all(c["k_ranges"] is not None for c in kernel_calls[:2])  # the prefill


@pytest.mark.parametrize("family", ["gpt_oss", pytest.param("gemma2", marks=GPU_ONLY)])
def test_training_step_gradients_match_eager(family):
    exact, ours = _models(family)      # eager in float32: what both are measured against
    ref = copy.deepcopy(exact).to(DTYPE)  # eager in our dtype
    ids, am = _batch("left")
    _assert_training_gradients_close(exact, ref, ours, ids, am)
    if family == "gpt_oss":
        assert ours.model.layers[0].self_attn.sinks.grad.abs().max() > 0


def _assert_training_gradients_close(exact, ref, ours, ids, am):
    """One training step of each model on a padded batch: ours may be at most twice as far from
    ``exact`` (eager in float32) as ``ref`` (eager in our dtype) is (exactly eager on CPU)."""
    # Padded positions' outputs are ours to choose (zeros) and eager's (a mean over masked keys):
    # no label may read them, including the first real token, which a padded position predicts.
    labels = ids.masked_fill(am == 0, -100)
    labels[:, 1:].masked_fill_(am[:, :-1] == 0, -100)
    for m in (ref, ours, exact):
        m.train()
        m(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
    # Errors are relative to the gradient, floored at a tenth of the mean gradient's norm: a
    # parameter whose gradient nearly cancels (gpt-oss's router bias, ~1e-3 of the others) would
    # otherwise weigh bf16 rounding noise as a relative error of 50%.
    pairs = [(name, p_ref.grad.float(), p_ours.grad.float(), p_exact.grad.float())
             for (name, p_ref), p_ours, p_exact in zip(ref.named_parameters(), ours.parameters(), exact.parameters())]
    floor = 0.1 * sum(g.norm() for *_, g in pairs) / len(pairs)
    for name, g_ref, g_ours, g_exact in pairs:
        scale = torch.maximum(g_exact.norm(), floor)
        err_ours, err_ref = (g_ours - g_exact).norm() / scale, (g_ref - g_exact).norm() / scale
        assert err_ours <= 2 * err_ref + 5 * TOL[DTYPE], (name, err_ours.item(), err_ref.item())


def _long_left_padded(seed: int, pad: int):
    """(ids, attention_mask) of two 3000-token rows, the second left-padded by ``pad`` tokens."""
    ids = torch.randint(1, VOCAB, (2, 3000), generator=torch.Generator().manual_seed(seed))
    am = torch.ones_like(ids)
    am[1, :pad] = 0
    ids[am == 0] = 0
    return ids, am


@pytest.mark.skipif(not ON_GPU, reason="a real head dim and length: the GPU only")
def test_gemma2_training_at_head_dim_256_takes_the_gluon_kernels(monkeypatch):
    """Gemma 2 at its real head dim (256) and a long left-padded batch: the padded rows reach the
    backward as per-row ranges, which on sm_90 (triton 3.6) take the head dim 256 Gluon kernels;
    the gradients match eager's as in the small training test."""
    from test_attention_bwd_gluon import REASON
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    from flashattn_lite.ops.attention_fwd import SEQ_RANGES
    config = dict(_COMMON, hidden_size=512, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=256, max_position_embeddings=4096)
    config = transformers.Gemma2Config(**config, sliding_window=1024, attn_logit_softcapping=50.0,
                                       query_pre_attn_scalar=256)
    exact, ours = _models("gemma2", config=config)
    ref = copy.deepcopy(exact).to(DTYPE)
    ids, am = _long_left_padded(seed=2, pad=500)
    calls = []
    run = wide.run
    monkeypatch.setattr(wide, "run", lambda *a, **kw: calls.append(a[12].seq) or run(*a, **kw))
    _assert_training_gradients_close(exact, ref, ours, ids.to(DEVICE), am.to(DEVICE))
    if REASON is None:  # sm_90 with triton 3.6: both layers' backward on the d 256 kernels
        assert calls == [SEQ_RANGES] * 2


@pytest.mark.skipif(not ON_GPU, reason="a real head dim and length: the GPU only")
def test_head_dim_96_training_takes_the_padded_gluon_kernels(monkeypatch):
    """A Llama at Phi-3's head dim (96) on a long left-padded batch: the padded rows reach the
    backward as per-row ranges, which on sm_90 (triton 3.6) take the Gluon backward run at head dim
    128 (``kernel_head_dim``); the gradients match eager's as in the small training test."""
    from test_attention_bwd_gluon import REASON
    from flashattn_lite.ops import attention_bwd_gluon as gluon_bwd
    from flashattn_lite.ops.attention_fwd import SEQ_RANGES
    config = transformers.LlamaConfig(**dict(_COMMON, hidden_size=384, intermediate_size=256, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=96, max_position_embeddings=4096))
    exact, ours = _models("llama", config=config)
    ref = copy.deepcopy(exact).to(DTYPE)
    ids, am = _long_left_padded(seed=3, pad=700)
    calls = []
    launch = gluon_bwd._launch
    monkeypatch.setattr(gluon_bwd, "_launch", lambda *a, **kw: calls.append((a[0].shape[-1], a[12].seq))
                        or launch(*a, **kw))
    _assert_training_gradients_close(exact, ref, ours, ids.to(DEVICE), am.to(DEVICE))
    if REASON is None:  # sm_90 with triton 3.6: both layers' backward on the Gluon kernel, over ranges
        assert calls == [(96, SEQ_RANGES)] * 2


@pytest.mark.skipif(not ON_GPU, reason="a real head dim and length: the GPU only")
def test_deepseek_v3_training_at_mla_head_dims_takes_the_gluon_kernels(monkeypatch):
    """DeepSeek-V3's latent attention at its real head dims (q, k 128 + 64, v 128) on a long
    left-padded batch: the backward over per-row ranges takes the head dim 256 Gluon kernels
    (``kernel_head_dim(192, 128)``) with v's own 128 columns; the gradients match eager's as in the
    small training test."""
    from test_attention_bwd_gluon import REASON
    from flashattn_lite.ops import attention_bwd_gluon_wide as wide
    from flashattn_lite.ops.attention_fwd import SEQ_RANGES
    config = _deepseek_config(128, 64, 128, hidden_size=256, intermediate_size=256, num_attention_heads=2,
                              num_key_value_heads=2, kv_lora_rank=64, max_position_embeddings=4096)
    exact, ours = _models("deepseek_v3", config=config)
    ref = copy.deepcopy(exact).to(DTYPE)
    ids, am = _long_left_padded(seed=4, pad=600)
    calls = []
    run = wide.run
    monkeypatch.setattr(wide, "run", lambda *a, **kw: calls.append((a[0].shape[-1], a[2].shape[-1], a[12].seq))
                        or run(*a, **kw))
    _assert_training_gradients_close(exact, ref, ours, ids.to(DEVICE), am.to(DEVICE))
    if REASON is None:  # sm_90 with triton 3.6: both layers' backward on the wide kernels, over ranges
        assert calls == [(192, 128, SEQ_RANGES)] * 2


def test_no_dense_mask_reaches_the_kernel(kernel_calls, monkeypatch):
    """transformers' mask builders are never called, and the kernel sees O(B) ranges, no mask."""
    def refuse(*args, **kwargs):
        raise AssertionError("a dense (L, S) mask was built")

    monkeypatch.setattr(masking_utils, "sdpa_mask", refuse)
    monkeypatch.setattr(masking_utils, "eager_mask", refuse)
    _, ours = _models("gpt_oss", torch.float32)
    ids, am = _batch("left")
    ours.generate(input_ids=ids, attention_mask=am, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert len(kernel_calls) == 4  # two layers, prefill and one decode step
    for c in kernel_calls:
        assert c.get("attn_mask") is None
        assert c["sinks"] is not None and c["window"] in (None, (3, 0))
        for r in (c["q_ranges"], c["k_ranges"]):
            # None: every key in the layer's cache is valid (a sliding layer's decode step here).
            assert r is None or (r.shape == (3, 2) and r.dtype == torch.int32 and r.device == c["q"].device)
    assert [c["k_ranges"][:, 0].tolist() for c in kernel_calls[:2]] == [[0, 3, 7]] * 2  # prefill


def test_keyword_no_fallback_takes_is_an_error_not_dropped():
    # A keyword with a value that neither the kernel, transformers' sdpa nor the model's eager attention
    # names would be dropped by any of them (they take **kwargs): an error naming it, never a result.
    ref, ours = _models("mistral", torch.float32)
    ids, am = _batch("left")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="some_future_option"):
        ours(input_ids=ids, attention_mask=am, some_future_option=1)
    # None is off: the call runs on the kernel as without the keyword
    before = _hf_fallbacks()
    with torch.no_grad():
        l_ours = ours(input_ids=ids, attention_mask=am, some_future_option=None).logits
        l_ref = ref(input_ids=ids, attention_mask=am).logits
    assert _hf_fallbacks() == before and _rel(l_ours[am.bool()], l_ref[am.bool()]) < 1e-5


def test_fallback_takes_the_function_that_names_the_keywords(monkeypatch):
    # sdpa where it names every keyword (position_bias), the model's eager where only it does (a sinks=
    # of its own), loudly; a keyword neither names: an error (both would drop it).
    import types
    seen = []

    def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sinks=None,
                                **kwargs):
        seen.append(sinks)
        return query.transpose(1, 2), None
    model_module = types.ModuleType("a_model_with_sinks")
    model_module.eager_attention_forward = eager_attention_forward
    monkeypatch.setitem(sys.modules, "a_model_with_sinks", model_module)
    layer = type("Layer", (torch.nn.Module,), {"__module__": "a_model_with_sinks", "is_causal": False})()
    q = torch.randn(1, 2, 3, 8)
    sinks = torch.randn(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.attention_forward(layer, q, q, q, None, sinks=sinks)
        assert len(seen) == 1 and seen[0] is sinks
        bias = torch.randn(1, 2, 3, 3)
        o, _ = hf.attention_forward(layer, q, q, q, None, position_bias=bias)
        assert len(seen) == 1  # sdpa took it
        want = torch.softmax(q @ q.transpose(-1, -2) * 8 ** -0.5 + bias, -1) @ q
        torch.testing.assert_close(o, want.transpose(1, 2), atol=1e-5, rtol=0)
        with pytest.raises(NotImplementedError, match="block_indices"):
            hf.attention_forward(layer, q, q, q, None, block_indices=torch.zeros(1, dtype=torch.int64))


@pytest.mark.parametrize("causal, n_q", [(True, 9), (True, 1), (False, 9)], ids=["causal", "decode-step", "full"])
def test_sliding_window_without_a_mask_is_applied(causal, n_q):
    # No mask (a direct call, or a mask function that gives a layer None): the window is applied as
    # transformers' flash_attention_2 path reads it (W keys up to the query's own under causal, top-left;
    # |i - j| < W otherwise; a decode step sees the last W keys), never dropped; a bad value is an error.
    from flashattn_lite.reference import attention_reference
    layer = type("Layer", (torch.nn.Module,), {"is_causal": causal})()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, n, 8, generator=g).to(DEVICE) for h, n in ((4, n_q), (2, 9), (2, 9)))
    before = _hf_fallbacks()
    o, _ = hf.attention_forward(layer, q, k, v, None, sliding_window=3)
    assert _hf_fallbacks() == before
    window = (2, 0) if causal and n_q > 1 else (2, 2)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=causal and n_q > 1, window=window,
                                 causal_offset=0 if causal and n_q > 1 else None)
    torch.testing.assert_close(o.double(), ref.transpose(1, 2), atol=1e-5, rtol=0)
    full, _ = hf.attention_forward(layer, q, k, v, None)
    assert not torch.allclose(o, full, atol=1e-3)  # the window changed something
    for bad, error in ((0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="sliding_window"):
            hf.attention_forward(layer, q, k, v, None, sliding_window=bad)


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # the fallback is sdpa, or eager for softcap
def test_padding_with_a_hole_falls_back_to_transformers(family, kernel_calls):
    ref, ours = _models(family, torch.float32)
    ids, am = _batch("left")
    am[0, 5] = 0
    keep = am.bool()
    before = _hf_fallbacks()
    with torch.no_grad():
        l_ours = ours(input_ids=ids, attention_mask=am).logits
        l_ref = ref(input_ids=ids, attention_mask=am).logits
    assert _hf_fallbacks() == before + 2 and kernel_calls == []
    assert _rel(l_ours[keep], l_ref[keep]) < 1e-5


def test_float64_falls_back_to_transformers(kernel_calls):
    ref, ours = _models("gemma2", torch.float64)
    ids, _ = _batch("left")  # no padding: transformers' float64 eager turns padded rows into NaN
    with torch.no_grad():
        l_ours = ours(input_ids=ids).logits
        l_ref = ref.double()(input_ids=ids).logits
    assert kernel_calls == [] and _rel(l_ours, l_ref) < 1e-10


# ------------------------------------------------------------------ range_mask against transformers' masks

def _dense_from_ranges(m: hf.RangeMask, batch):
    """The (B, L, S) visibility the kernel computes from a RangeMask (the attention_core contract)."""
    L, S = m.q_length, m.kv_length
    if m.k_ranges is None:
        qr, kr = torch.tensor([[0, L]] * batch), torch.tensor([[0, S]] * batch)
    else:
        qr, kr = m.q_ranges.cpu(), m.k_ranges.cpu()
    r, c = torch.arange(L)[:, None], torch.arange(S)[None, :]
    out = []
    for (qs, qe), (ks, ke) in zip(qr.tolist(), kr.tolist()):
        i, j, off = r - qs, c - ks, (ke - ks) - (qe - qs)
        vis = (r >= qs) & (r < qe) & (c >= ks) & (c < ke)
        if m.causal:
            vis &= j <= i + off
        if m.window is not None:
            vis &= j >= i + off - (m.window - 1)
        out.append(vis)
    return torch.stack(out)


@pytest.mark.parametrize("case", [
    # (mask pattern, L, kv_length, q_offset, kv_offset, valid [start, end) per row of the 2-D mask, its length)
    ("causal", 6, 6, 0, 0, [(0, 6), (2, 6), (5, 6)], 6),            # left padding, prefill
    ("causal", 6, 6, 0, 0, [(0, 6), (0, 4), (0, 1)], 6),            # right padding, prefill
    ("causal", 1, 9, 8, 0, [(0, 9), (3, 9)], 9),                    # decode step, dynamic cache
    ("causal", 3, 16, 6, 0, [(0, 9), (4, 9)], 9),                   # static cache: empty slots past 9
    ("sliding", 5, 5, 0, 0, [(0, 5), (1, 5)], 5),                   # sliding window, prefill
    ("sliding", 1, 4, 9, 6, [(0, 10), (8, 10), (2, 10)], 10),       # sliding-window cache, decode
    ("bidirectional", 5, 5, 0, 0, [(0, 5), (0, 3)], 5),
    ("causal", 4, 4, 0, 0, None, 4),                                # no padding mask
])
def test_range_mask_matches_transformers_mask(case):
    kind, L, S, q_off, kv_off, valid, total = case
    fn = {"causal": masking_utils.causal_mask_function,
          "sliding": masking_utils.sliding_window_causal_mask_function(3),
          "bidirectional": masking_utils.bidirectional_mask_function}[kind]
    pad = None
    if valid is not None:
        pad = torch.zeros(len(valid), total, dtype=torch.bool)
        for b, (s, e) in enumerate(valid):
            pad[b, s:e] = True
    batch = 2 if pad is None else pad.shape[0]
    args = dict(batch_size=batch, q_length=L, kv_length=S, q_offset=q_off, kv_offset=kv_off, mask_function=fn,
                attention_mask=pad)
    m = hf.range_mask(**args)
    assert m.fallback is None
    want = masking_utils.sdpa_mask(allow_is_causal_skip=False, **args)[:, 0]
    got = _dense_from_ranges(m, batch)
    # Query rows that are padding are ours to zero (their outputs are never read).
    rows = torch.ones(batch, L, dtype=torch.bool) if pad is None or kind == "bidirectional" else \
        masking_utils.prepare_padding_mask(pad, S, kv_off)[:, q_off:q_off + L]
    assert torch.equal(got[rows], want[rows])
    assert not got[~rows].any()


@pytest.mark.parametrize("what", ["hole", "chunked", "empty row"])
def test_range_mask_refuses_what_ranges_cannot_say(what):
    pad = torch.ones(2, 6, dtype=torch.bool)
    fn, extra = masking_utils.causal_mask_function, {}
    if what == "hole":
        pad[1, 2] = False
    elif what == "chunked":
        fn, extra = masking_utils.chunked_causal_mask_function(2, torch.zeros(2, dtype=torch.long)), dict(local_size=2)
    else:
        pad[1] = False
    m = hf.range_mask(batch_size=2, q_length=6, kv_length=6, mask_function=fn, attention_mask=pad, **extra)
    assert m.fallback is not None
    assert m.dense("sdpa").shape == (2, 1, 6, 6)  # transformers' own mask, for the fallback


def test_flash_in_the_name_is_refused():
    with pytest.raises(ValueError, match="flash"):
        hf.register("flashattn_lite")
    assert hf.register("my_attn") == "my_attn"


def test_bert_encoder_with_padding_runs_on_the_kernel(kernel_calls):
    # BERT's layers pass encoder_hidden_states=None (off): bidirectional, right-padded, on our kernel.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64)
    ref = transformers.BertModel(config, add_pooling_layer=False).eval()
    ours = copy.deepcopy(ref)
    ref.set_attn_implementation("eager")
    ours.set_attn_implementation(hf.ATTN_IMPLEMENTATION)
    ids = torch.randint(0, 100, (3, 12))
    am = torch.ones(3, 12, dtype=torch.long)
    am[0, 9:], am[1, 5:] = 0, 0
    before = _hf_fallbacks()
    with torch.no_grad():
        h_ours = ours(input_ids=ids, attention_mask=am).last_hidden_state
        h_ref = ref(input_ids=ids, attention_mask=am).last_hidden_state
    assert _hf_fallbacks() == before and len(kernel_calls) == 2
    assert _rel(h_ours[am.bool()], h_ref[am.bool()]) < 1e-5
