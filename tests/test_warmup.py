"""warmup(): which variants it compiles, its argument errors, HF configs; the CLI's warmup, tune and
first-call subcommands' argument errors (exit status 2, no traceback)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import flashattn_lite as fa
from conftest import run_cli
from flashattn_lite.warmup import layer_options, model_shapes

ON_GPU = torch.cuda.is_available()


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_warmup_compiles_every_combination():
    labels = fa.warmup(head_dims=[16, (16, 32)], dtypes=[torch.float16], gqa=[2], causal=(False, True),
                       length=16, decode=True, progress=False)
    assert labels == ["attention float16 d16 gqa2 fwd+bwd", "attention float16 d16 gqa2 causal fwd+bwd",
                      "decode float16 d16 gqa2", "attention float16 d16/32 gqa2 fwd+bwd",
                      "attention float16 d16/32 gqa2 causal fwd+bwd", "decode float16 d16 gqa2"]


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_warmup_compiles_mla_decoding_for_the_16_bit_dtypes():
    labels = fa.warmup(head_dims=16, dtypes=[torch.float16, torch.float32], backward=False, mla_decode=True,
                       length=70, progress=False)
    assert labels[-1] == "decode float16 MLA 576/512" and sum("MLA" in x for x in labels) == 1


def test_nothing_to_compile_on_the_cpu_twin(torch_cpu_path):
    assert fa.warmup(head_dims=16, dtypes=[torch.float16], length=16, device="cpu") == []


def test_arguments_are_checked_even_where_nothing_compiles(torch_cpu_path):
    """On the CPU twin warmup returns [] at once: a misspelt option or a bad flag must still raise."""
    with pytest.raises(TypeError, match="unexpected options windw"):
        fa.warmup(head_dims=16, device="cpu", windw=(3, 0))
    with pytest.raises(TypeError, match="decode must be a bool"):
        fa.warmup(head_dims=16, device="cpu", decode="no")
    # Every keyword option of the public attention is taken.
    assert fa.warmup(head_dims=16, device="cpu", scale=0.5, window=(3, 0), softcap=30.0, sinks=True,
                     alibi_slopes=None, return_lse=True) == []


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_single_values_stand_for_one_item_sequences():
    one = fa.warmup(head_dims=16, dtypes=torch.float16, gqa=2, causal=False, length=16, backward=False,
                    progress=False)
    assert one == fa.warmup(head_dims=[16], dtypes=[torch.float16], gqa=[2], causal=(False,), length=16,
                            backward=False, progress=False) == ["attention float16 d16 gqa2 fwd"]


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_warmup_takes_return_lse():
    assert fa.warmup(head_dims=16, dtypes=[torch.float16], length=16, return_lse=True,
                     progress=False) == ["attention float16 d16 gqa1 causal return_lse fwd+bwd"]


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(head_dims=0), ValueError, "head_dims"),
    (dict(head_dims=[(16, 300)]), ValueError, "head_dims"),
    (dict(head_dims=["x"]), ValueError, "head_dims"),
    (dict(dtypes=[torch.int8]), TypeError, "dtypes"),
    (dict(gqa=[0]), ValueError, "gqa"),
    (dict(gqa=[2.0]), TypeError, "gqa"),
    (dict(gqa=2.5), TypeError, "gqa"),
    (dict(gqa=()), ValueError, "gqa"),
    (dict(dtypes="float16"), TypeError, "dtypes"),
    (dict(dtypes=()), ValueError, "dtypes"),
    (dict(causal=("yes",)), TypeError, "causal"),
    (dict(causal=1), TypeError, "causal"),
    (dict(causal=None), TypeError, "causal"),
    (dict(backward="no"), TypeError, "backward"),
    (dict(decode="no"), TypeError, "decode"),
    (dict(softmax=1), TypeError, "softmax"),
    (dict(progress="no"), TypeError, "progress"),
    (dict(windw=(3, 0)), TypeError, "windw"),
    (dict(attn_mask=None), TypeError, "attn_mask"),  # attention_core's, not the public attention's
    (dict(causal_offset=0), TypeError, "causal_offset"),
    (dict(length=0), ValueError, "length"),
    (dict(max_length=0), ValueError, "max_length"),
    (dict(mla_decode=1), TypeError, "mla_decode"),
    (dict(mla_decode=True, dtypes=[torch.float32]), ValueError, "mla_decode"),
    (dict(model=SimpleNamespace(hidden_size=64)), ValueError, "model"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_arguments_name_themselves(kwargs, error, needle):
    # Tiny shapes: an argument let through compiles in seconds under the interpreter, not minutes.
    with pytest.raises(error, match=needle):
        fa.warmup(**{"head_dims": 16, "length": 16, "progress": False, **kwargs})


def test_shapes_from_a_transformers_config():
    llama = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, torch_dtype="bfloat16")
    assert model_shapes(llama) == {"head_dims": (128,), "gqa": (4,), "kv_heads": 8, "dtypes": (torch.bfloat16,),
                                   "layer_options": ({},)}
    gemma = SimpleNamespace(text_config=SimpleNamespace(num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                                        hidden_size=2304, torch_dtype=torch.float32))
    assert model_shapes(gemma)["head_dims"] == (256,) and model_shapes(gemma)["dtypes"] == (torch.float32,)
    # MLA: q and k at nope + rope columns beside v's head dim (the config's head_dim is the rope part alone)
    deepseek = SimpleNamespace(num_attention_heads=128, num_key_value_heads=128, hidden_size=7168, head_dim=64,
                               qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, torch_dtype="bfloat16")
    assert model_shapes(deepseek)["head_dims"] == ((192, 128),) and model_shapes(deepseek)["gqa"] == (1,)


def test_shapes_of_transformers_mla_configs():
    transformers = pytest.importorskip("transformers")
    for config in (transformers.DeepseekV3Config(), transformers.DeepseekV2Config()):
        assert model_shapes(config)["head_dims"] == ((192, 128),), type(config).__name__


def test_layer_options_follow_the_hf_integration():
    """Each kind of layer a config describes, with the options the HF integration passes for it."""
    transformers = pytest.importorskip("transformers")
    gpt_oss = transformers.GptOssConfig(num_hidden_layers=2, sliding_window=8)
    assert layer_options(gpt_oss) == ({"sinks": True}, {"sinks": True, "window": (7, 0)})
    gemma = transformers.Gemma2Config(num_hidden_layers=2, sliding_window=64, attn_logit_softcapping=30.0)
    assert layer_options(gemma) == ({"softcap": 30.0}, {"softcap": 30.0, "window": (63, 0)})
    assert layer_options(transformers.MistralConfig(sliding_window=16)) == ({"window": (15, 0)},)
    assert layer_options(transformers.LlamaConfig()) == ({},)


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_warmup_from_a_model_compiles_its_layer_kinds_dense_and_padded():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GptOssConfig(num_hidden_layers=2, sliding_window=8, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, hidden_size=64, torch_dtype="float16")
    labels = fa.warmup(cfg, length=16, backward=False, progress=False)
    assert labels == ["attention float16 d16 gqa2 causal sinks fwd", "attention float16 d16 gqa2 causal sinks padded fwd",
                      "attention float16 d16 gqa2 causal sinks window fwd",
                      "attention float16 d16 gqa2 causal sinks window padded fwd"]


@pytest.mark.parametrize("argv, needle", [
    (["warmup", "--head-dims", "x"], "--head-dims"),
    (["warmup", "--dtypes", "int8"], "--dtypes"),
    (["warmup", "--head-dims", "0"], "head_dims"),
    (["warmup", "--causal", "maybe"], "--causal"),
    (["warmup", "--max-length", "0"], "max_length"),
    (["warmup", "--max-length", "lots"], "--max-length"),
    (["tune"], "--out"),
    (["tune", "--out", "table.txt"], "--out"),
    (["tune", "--out", "t.json", "--ops", "bogus"], "--ops"),
    (["tune", "--out", "t.json", "--cache-dir", __file__], "--cache-dir"),  # a file, not a folder
    (["tune", "--out", "t.json", "--cache-dir", ""], "--cache-dir"),
    (["tune", "--out", "t.json", "--gqa", "0"], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", "4,-8"], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", "4,x"], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", "2.5"], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", ""], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", "1,"], "--gqa"),
    (["tune", "--out", "t.json", "--gqa", "4", "--ops", "decode,softmax"], "--gqa applies to the attention"),
    (["first-call", "--length", "lots"], "--length"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_cli_argument_errors(argv, needle, capsys):
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and needle in err and "Traceback" not in err


@pytest.mark.skipif(ON_GPU, reason="without a GPU")
def test_gpu_only_subcommands_say_so(capsys, tmp_path):
    for argv in (["first-call", "--out", str(tmp_path)], ["tune", "--out", str(tmp_path / "t.json")],
                 ["tune", "--out", str(tmp_path / "t.json"), "--ops", "attention,variants"],  # a valid op list
                 ["tune", "--out", str(tmp_path / "t.json"), "--gqa", "1,4,8"]):  # valid ratios
        status, _, err = run_cli(argv, capsys)
        assert status == 2 and "GPU" in err


@pytest.mark.skipif(ON_GPU, reason="tiny interpreter shapes")
def test_cli_warmup_prints_what_it_compiled(capsys):
    status, out, err = run_cli(["warmup", "--head-dims", "16", "--dtypes", "fp16", "--length", "16",
                                "--no-backward", "--no-progress"], capsys)
    assert status == 0, err
    assert out.strip() == "attention float16 d16 gqa1 causal fwd"


def test_length_classes_cover_every_config_switch(monkeypatch):
    """warmup compiles attention at its dummy length and at each of ``LENGTH_CLASSES``: every length a
    call may have must pick the configs (and the Hopper kernel) of one of those, or its first call
    would compile. Checked against the Hopper modules' rules and the shipped sm_90 table."""
    from flashattn_lite import configs
    from flashattn_lite.ops import (attention_bwd_gluon, attention_bwd_hopper, attention_fwd, attention_fwd_gluon,
                                    attention_fwd_hopper)
    from flashattn_lite.warmup import LENGTH_CLASSES
    for module in (attention_fwd_hopper, attention_bwd_hopper, attention_fwd):
        monkeypatch.setattr(module, "interpreter_active", lambda: False)

    def portable(kernel, d, causal, n):
        key = {"dtype": "bfloat16", "HEAD_DIM": d, "HEAD_DIM_V": d, "HAS_LEFT": False, "HAS_RIGHT": causal,
               "MASK_KIND": 0, "SOFTCAP": False, "ALIBI": False, "SEQ": 0, "DROPOUT": False,
               "n_bucket": attention_fwd.length_bucket(n, n)}
        key.update({"SINKS": False} if kernel == "_attn_fwd_kernel" else {"GROUP": 1})
        return str(configs.lookup(kernel, key, "sm90", "n_bucket"))

    def chosen(d, causal, n):
        return (attention_fwd_hopper.default_config(d, causal, n), attention_fwd_gluon.default_config(d, causal, n),
                attention_bwd_hopper.default_config(d, causal, n), attention_bwd_gluon.default_config(d, causal, n),
                causal and n >= attention_fwd_gluon.CAUSAL_MIN_N[d],
                *(portable(kernel, d, causal, n) for kernel in ("_attn_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel")))

    lengths = sorted({2 ** e + x for e in range(18) for x in (-1, 0, 1)} - {0})
    for d in (64, 128):
        for causal in (False, True):
            warmed = {chosen(d, causal, n) for n in (4096, *LENGTH_CLASSES)}  # 4096: the default length
            for n in lengths:
                assert chosen(d, causal, n) in warmed, (d, causal, n)


def _binaries(modules=None):
    """{(kernel, Triton's specialization key)} of every kernel binary of ``modules`` (default: the
    attention ones) loaded in this process."""
    import triton
    from flashattn_lite.ops import (attention_bwd, attention_bwd_gluon, attention_bwd_hopper, attention_fwd,
                                    attention_fwd_gluon, attention_fwd_hopper)
    modules = modules or (attention_fwd, attention_bwd, attention_fwd_hopper, attention_fwd_gluon,
                          attention_bwd_hopper, attention_bwd_gluon)
    jits = {name: getattr(v, "jit", v) for m in modules for name, v in vars(m).items()}
    return {(name, str(key)) for name, j in jits.items() if isinstance(j, triton.runtime.JITFunction)
            for cache in j.device_caches.values() for key in cache[0]}


@pytest.mark.skipif(not ON_GPU, reason="counts the kernels compiled for the GPU")
def test_after_warmup_no_length_compiles():
    """After warmup of a variant, calls at any length (short or long, each length class, the Hopper
    kernels' sizes, the one-launch backward's short calls) load no new kernel binary in this process."""
    binaries = _binaries
    fa.warmup(head_dims=[128], dtypes=[torch.bfloat16], causal=(False, True), progress=False)
    before = binaries()
    for n in (5, 40, 100, 3000, 4097, 6000, 8192, 12345, 16384, 20000):
        for causal in (False, True):
            q, k, v = (torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            o = fa.attention(q, k, v, causal=causal)
            o.backward(torch.randn_like(o))
            with torch.no_grad():
                fa.attention(q, k, v, causal=causal)
            new = binaries() - before
            assert not new, f"N {n}, causal {causal}: new binaries:\n" + "\n".join(
                _closest_difference(name, key, before) for name, key in sorted(new))



@pytest.mark.skipif(not ON_GPU, reason="counts the kernels compiled for the GPU")
def test_after_model_warmup_padded_batches_compile_nothing():
    """warmup(model=...) compiles each layer kind dense and padded (per-row ranges, how the HF
    integration passes a padded batch), the latter on sm_90 on the Gluon kernels too: a padded call
    up to max_length then loads no new kernel binary."""
    from flashattn_lite.ops.attention import attention_core
    config = SimpleNamespace(num_attention_heads=16, num_key_value_heads=4, head_dim=128, hidden_size=2048,
                             torch_dtype=torch.bfloat16)
    fa.warmup(model=config, max_length=4096, progress=False)
    before = _binaries()
    g = torch.Generator(device="cuda").manual_seed(0)
    for n in (100, 3000, 4096):
        q = torch.randn(2, 16, n, 128, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        k, v = (torch.randn(2, 4, n, 128, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
                for _ in range(2))
        rows = torch.tensor([[0, n], [n // 3, n]], dtype=torch.int32, device="cuda")
        o = attention_core(q, k, v, causal=True, q_ranges=rows, k_ranges=rows)
        o.backward(torch.randn_like(o))
        new = _binaries() - before
        assert not new, f"N {n}: new binaries:\n" + "\n".join(
            _closest_difference(name, key, before) for name, key in sorted(new))

@pytest.mark.skipif(not ON_GPU, reason="counts the kernels compiled for the GPU")
def test_after_mla_decode_warmup_serving_steps_compile_nothing():
    """warmup(mla_decode=True)'s calls (``_mla_decode``) cover a serving loop's steps against MLA's
    latent cache: any batch, length and table width, contiguous or paged by 64, split or not, load
    no new decode or merge binary."""
    from flashattn_lite.ops import decode as dec
    from flashattn_lite.ops import decode_mla_gluon, merge_states
    from flashattn_lite.warmup import _mla_decode
    modules = (dec, decode_mla_gluon, merge_states)
    _mla_decode(torch.bfloat16, 4096, torch.device("cuda"))
    before = _binaries(modules)
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, n, paged in ((1, 30000, False), (1, 65, True), (5, 4000, True), (7, 333, False), (300, 200, True),
                        (300, 1500, False)):
        q = torch.randn(b, 128, 1, 576, device="cuda", generator=g).to(torch.bfloat16)
        width = -(-n // 64)
        cache = torch.randn(b, 1, width * 64, 576, device="cuda", generator=g).to(torch.bfloat16)
        lens = torch.full((b,), n, device="cuda", dtype=torch.int32)
        table = None
        if paged:
            cache = cache.view(b * width, 1, 64, 576)
            table = torch.randperm(b * width, device="cuda", generator=g).to(torch.int32).view(b, width)
        fa.decode(q, cache, cache[..., :512], lens, block_table=table)
        new = _binaries(modules) - before
        assert not new, f"B {b}, N {n}, paged {paged}: new binaries:\n" + "\n".join(
            _closest_difference(name, key, before) for name, key in sorted(new))


def _closest_difference(name, key, known) -> str:
    """A new binary's specialization key against the closest known one of the same kernel: the
    positions (argument index) that differ."""
    parts = lambda text: text.replace("[", "").replace("]", "").split("), (")  # noqa: E731
    new = parts(key)
    diffs = [[(i, a, b) for i, (a, b) in enumerate(zip(parts(other), new)) if a != b]
             for kernel, other in known if kernel == name]
    best = min(diffs, key=len, default=None)
    return f"{name}: " + ("no binary of it before" if best is None else f"differs from the closest at {best}")
