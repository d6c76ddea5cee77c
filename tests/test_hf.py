"""transformers integration: attn_implementation="fa_lite" against "sdpa" on a tiny random Llama."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import DEVICE, ON_GPU  # noqa: E402
from flashattn_lite.integrations import hf  # noqa: E402

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = 3e-2 if ON_GPU else 1e-4


def _models(dtype=DTYPE, **cfg_kw):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   initializer_range=0.3, pad_token_id=0, **cfg_kw)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(DEVICE, dtype)
    ours = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=hf.ATTN_IMPLEMENTATION)
    ours.load_state_dict(ref.state_dict())
    return ref, ours.to(DEVICE, dtype)


def _left_padded_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (3, 10), generator=g)
    am = torch.ones(3, 10, dtype=torch.long)
    am[1, :3] = 0
    am[2, :6] = 0
    ids[am == 0] = 0
    return ids.to(DEVICE), am.to(DEVICE)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_logits_match_sdpa_on_left_padded_batch():
    ref, ours = _models()
    assert ours.config._attn_implementation == hf.ATTN_IMPLEMENTATION
    ids, am = _left_padded_batch()
    keep = am.bool()
    with torch.no_grad():
        l_ref = ref(input_ids=ids, attention_mask=am).logits
        l_ours = ours(input_ids=ids, attention_mask=am).logits
        l_nomask = ours(input_ids=ids).logits
    assert _rel(l_ours[keep], l_ref[keep]) < TOL
    # The padding must matter (so a backend that ignored the mask would fail above).
    assert _rel(l_nomask[keep], l_ref[keep]) > 10 * TOL


def test_generate_with_padding_matches_sdpa():
    ref, ours = _models(torch.float32)  # greedy tokens: no bf16 near-ties between the two backends
    ids, am = _left_padded_batch()
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(input_ids=ids, **kw), ref.generate(input_ids=ids, **kw))


def test_training_step_gradients_match_sdpa():
    ref, ours = _models(attention_dropout=0.0)
    ids, am = _left_padded_batch()
    labels = ids.masked_fill(am == 0, -100)
    for m in (ref, ours):
        m.train()
        m(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
    for (name, p_ref), p_ours in zip(ref.named_parameters(), ours.parameters()):
        assert _rel(p_ours.grad, p_ref.grad) < 5 * TOL, name


def test_flash_in_the_name_is_refused():
    with pytest.raises(ValueError, match="flash"):
        hf.register("flashattn_lite")
    assert hf.register("my_attn") == "my_attn"
