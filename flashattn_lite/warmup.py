"""Compile ahead of time the kernel variants a model will launch, so its first step is not slow.

A kernel variant is fixed by what the kernels take as compile-time arguments — dtype, head dims,
the GQA group, causal and the other options — not by lengths (those are runtime arguments and,
where they select a config, only pick a table row). So one tiny call per variant, on dummy
tensors, compiles (or loads from Triton's disk cache) everything a model needs.
"""
from __future__ import annotations

import inspect
import itertools

import torch

from . import _checks
from ._log import log_once
from ._runtime import runs_triton


def model_shapes(model) -> dict:
    """{"head_dims", "gqa", "kv_heads", "dtypes"} of a HuggingFace config object or model name
    (the name through ``transformers.AutoConfig``, which must be installed). An MLA model's head dims
    are a (q / k, v) pair, as its attention layers call the kernels."""
    config = model
    if isinstance(model, str):
        try:
            from transformers import AutoConfig
        except ImportError:
            raise ValueError(f"model={model!r} is a name, which needs transformers (pip install transformers); "
                             "pass a config object or head_dims/gqa/dtypes instead") from None
        config = AutoConfig.from_pretrained(model)
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"model must be a transformers config with num_attention_heads, got {type(model).__name__}")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    head_dims = (head_dim,)
    if getattr(config, "qk_nope_head_dim", None) and getattr(config, "qk_rope_head_dim", None):
        # MLA (DeepSeek-V2/V3, Kimi K2, MiniCPM3): attention runs at q, k = nope + rope columns beside
        # v's own head dim (their configs' head_dim is the rope part alone)
        head_dims = ((config.qk_nope_head_dim + config.qk_rope_head_dim, getattr(config, "v_head_dim", None)
                      or config.qk_nope_head_dim + config.qk_rope_head_dim),)
    dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or torch.bfloat16
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""), torch.bfloat16)
    if dtype not in _checks.FLOAT_DTYPES:
        dtype = torch.bfloat16
    return {"head_dims": head_dims, "gqa": (heads // kv_heads,), "kv_heads": kv_heads, "dtypes": (dtype,),
            "layer_options": layer_options(config)}


def layer_options(config) -> tuple:
    """The score options of each kind of attention layer a transformers config describes, as the
    HF integration passes them (``flashattn_lite.integrations.hf``): a sliding window of W keys is
    ``window=(W - 1, 0)``, Gemma 2's ``attn_logit_softcapping`` is ``softcap``, gpt-oss layers have
    ``sinks``. Each is compiled separately (they are different kernels)."""
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds:
        sliding = "sliding_attention" in kinds
        full = any(k != "sliding_attention" for k in kinds)
    else:  # Mistral-style: every layer slides when a window is set (Qwen2 gates it by use_sliding_window)
        sliding = isinstance(window, int) and getattr(config, "use_sliding_window", True) is not False
        full = not sliding
    common = {}
    if getattr(config, "attn_logit_softcapping", None):
        common["softcap"] = float(config.attn_logit_softcapping)
    if getattr(config, "model_type", None) == "gpt_oss":
        common["sinks"] = True  # a (Hq,) tensor, made per call
    options = ([dict(common)] if full else []) + ([dict(common, window=(window - 1, 0))]
                                                   if sliding and isinstance(window, int) and window > 0 else [])
    return tuple(options) or (dict(common),)


# One length in each range where the kernels' configs stay the same, so a call at any length finds
# its kernels compiled once each of these ran: the shipped table's rows (2k, 4k and 8k rows; the
# buckets are powers of two up to 8k, each length taking the nearest row), the Hopper kernels'
# ``default_config`` switches (8k, and 16k for the TMA forward at d 128 causal), the Gluon forward's
# (8k, and 12k at d 128 and 256 causal: ``CAUSAL_PERSISTENT_MAX_N``) and its causal crossover
# (``CAUSAL_MIN_N``: 2k; 1k compiles the TMA kernel below it).
# ``tests/test_warmup.py`` checks it against them.
LENGTH_CLASSES = (1024, 2048, 4096, 6144, 8192, 12288, 16384)


def warmup(model=None, *, head_dims=None, dtypes=None, gqa=None, causal=(True,), backward: bool = True,
           decode: bool = False, softmax: bool = False, mla_decode: bool = False, length: int = 4096,
           max_length: int | None = None, device=None, progress: bool = True, **options) -> list[str]:
    """Compile the kernels for every combination of the given variants; returns their labels.

    The backward compiled is the one calls take under the determinism setting in force: call it
    after ``torch.use_deterministic_algorithms(True)`` if training runs with it (a one-writer dQ).

    Args:
        model: a HuggingFace config object or model name (head dims, GQA group and dtype from it;
            explicit arguments below override).
        head_dims: ints (D = Dv) or (D, Dv) pairs. Default 128 (or the model's).
        dtypes: torch float dtypes. Default bfloat16 (or the model's).
        gqa: query heads per KV head. Default 1 (or the model's).
        causal: the causal settings to compile (``(True, False)`` for both).
            ``head_dims``, ``dtypes``, ``gqa`` and ``causal`` each also take a single value
            (``dtypes=torch.float16`` is ``dtypes=(torch.float16,)``).
        backward: also compile the backward kernels.
        decode: also compile ``decode`` (one new token against a contiguous cache of ``length``
            positions, unsplit and at split counts that take each of the merge's split tiles; a batch
            of another size may still compile a merge at its own row tile, and a paged cache its own
            stage-1 variant).
        softmax: also compile ``softmax`` rows of ``length`` elements (forward and backward).
        mla_decode: also compile ``decode`` against MLA's latent cache (q and the cache 576 wide, v its
            first 512 columns; 128 heads, one new token), for the 16-bit ``dtypes``: a contiguous cache
            and one paged by 64 rows, split and not (on sm_90 the Gluon kernel and the merge).
        length: the dummy sequence length of decode and softmax (``mla_decode`` takes its own: what any
            length compiles), and the first one of attention.
        max_length: on a GPU, attention is also compiled at each length where its configs change
            (``LENGTH_CLASSES``) up to this one (default: all of them), and on sm_90 at a size that
            takes the Hopper kernels (calls of ≥ ``MIN_WORK``), so no later length compiles. (The
            backward of short calls, ≤ ``attention_bwd.SHORT_MAX_N`` keys, is compiled at every
            ``max_length``.)
        device: default the current CUDA device. On the CPU only ``TRITON_INTERPRET=1`` runs
            kernels; otherwise there is nothing to compile and the result is empty.
        progress: a tqdm progress bar when tqdm is installed.
        **options: passed to ``attention`` as they are (the score options a model uses): its keyword
            arguments other than ``causal`` (``window``, ``softcap``, ...); any other name is a
            TypeError, also where nothing compiles. Without them and with a ``model``, each of its
            layer kinds (``layer_options``) is compiled, dense and as the HF integration runs padded
            batches (per-row ranges).
    """
    unknown = sorted(set(options) - set(_attention_options()))
    if unknown:
        raise TypeError(f"warmup got unexpected options {', '.join(unknown)}: **options must be keyword "
                        f"arguments of flashattn_lite.attention ({', '.join(_attention_options())})")
    for name, flag in (("backward", backward), ("decode", decode), ("softmax", softmax),
                       ("mla_decode", mla_decode), ("progress", progress)):
        _checks.check_bool(name, flag)
    shapes = model_shapes(model) if model is not None else {}
    variants = [(options, False)]
    if model is not None and not options:
        variants = [(o, padded) for o in shapes["layer_options"] for padded in (False, True)]
    head_dims = _pairs(head_dims if head_dims is not None else shapes.get("head_dims", (128,)))
    dtypes = _values("dtypes", dtypes if dtypes is not None else shapes.get("dtypes", (torch.bfloat16,)), torch.dtype)
    gqa = _values("gqa", gqa if gqa is not None else shapes.get("gqa", (1,)), int)
    causal = _values("causal", causal, bool)
    kv_heads = shapes.get("kv_heads", 1)
    for dt in dtypes:
        if dt not in _checks.FLOAT_DTYPES:
            raise TypeError(f"dtypes must hold float16, bfloat16 or float32, got {dt}")
    for g in gqa:
        if type(g) is not int:
            raise TypeError(f"gqa must hold ints (query heads per KV head), got {type(g).__name__}")
        if g < 1:
            raise ValueError(f"gqa must hold ints ≥ 1 (query heads per KV head), got {g!r}")
    for c in causal:
        if not isinstance(c, bool):
            raise TypeError(f"causal must hold bools, got {c!r}")
    if mla_decode and not any(dt in (torch.float16, torch.bfloat16) for dt in dtypes):
        raise ValueError(f"mla_decode compiles 16-bit kernels: dtypes must hold float16 or bfloat16, got {dtypes}")
    if type(length) is not int or length < 1:
        raise ValueError(f"length must be an int ≥ 1, got {length!r}")
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise ValueError(f"max_length must be an int ≥ 1 or None, got {max_length!r}")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if not runs_triton(torch.empty(0, device=device)):
        log_once(("warmup", str(device)), f"warmup: nothing to compile on {device} (no Triton kernels run there)")
        return []

    # The interpreter runs one config at every length: the dummy length is enough there.
    lengths = [length] if device.type != "cuda" else sorted(
        {length, *(n for n in LENGTH_CLASSES if max_length is None or n <= max_length)})
    tasks = []
    for (d, dv), dt, g in itertools.product(head_dims, dtypes, gqa):
        for c, (opts, padded) in itertools.product(causal, variants):
            label = f"attention {_name(dt)} d{d}{'' if dv == d else f'/{dv}'} gqa{g}{' causal' if c else ''}"
            label += "".join(f" {k}" for k in opts) + (" padded" if padded else "")
            tasks.append((label + (" fwd+bwd" if backward else " fwd"),
                          lambda d=d, dv=dv, dt=dt, g=g, c=c, opts=opts, padded=padded: _attention(
                              d, dv, dt, g, kv_heads, c, backward, lengths, device, opts, padded)))
        if decode:
            tasks.append((f"decode {_name(dt)} d{d} gqa{g}",
                          lambda d=d, dv=dv, dt=dt, g=g: _decode(d, dv, dt, g, kv_heads, length, device)))
    if mla_decode:
        for dt in (dt for dt in dtypes if dt in (torch.float16, torch.bfloat16)):
            tasks.append((f"decode {_name(dt)} MLA 576/512", lambda dt=dt: _mla_decode(dt, length, device)))
    if softmax:
        for dt in dtypes:
            tasks.append((f"softmax {_name(dt)} N{length} fwd+bwd", lambda dt=dt: _softmax(dt, length, device)))
    for label, run in _progress(tasks, progress):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [label for label, _ in tasks]


def _attention_options() -> tuple[str, ...]:
    """The keyword arguments of ``flashattn_lite.attention`` that ``**options`` may hold: all but
    ``causal``, which warmup takes itself."""
    from .ops.attention import attention
    return tuple(name for name, p in inspect.signature(attention).parameters.items()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "causal")


def _values(name: str, value, single: type) -> tuple:
    """A sequence of settings as a tuple; a lone ``single`` (an int, a bool, a dtype) is a one-item one."""
    if isinstance(value, single):
        return (value,)
    try:
        values = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a {single.__name__} or a sequence of them, "
                        f"got {type(value).__name__}") from None
    if not values:
        raise ValueError(f"{name} must hold at least one value, got an empty sequence")
    return values


def _pairs(head_dims) -> list[tuple[int, int]]:
    """An int or a sequence of items, each an int (D = Dv) or a (D, Dv) pair."""
    items = [head_dims] if isinstance(head_dims, int) else list(head_dims)
    pairs = []
    for h in items:
        d, dv = (h, h) if isinstance(h, int) else tuple(h) if isinstance(h, (tuple, list)) and len(h) == 2 else (0, 0)
        if not all(type(x) is int and 1 <= x <= 256 for x in (d, dv)):
            raise ValueError(f"head_dims must hold ints or (D, Dv) pairs in [1, 256], got {h!r}")
        pairs.append((d, dv))
    if not pairs:
        raise ValueError("head_dims must name at least one head dim")
    return pairs


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _attention(d, dv, dtype, group, kv_heads, causal, backward, lengths, device, options, padded=False):
    """At each length: one call on the portable kernels (what short or small calls take), then, on
    sm_90, one with enough work to take the Hopper kernels (``MIN_WORK``) where the call is theirs
    (``padded``, per-row ranges: the Gluon kernels' own binaries).
    With the backward, on a GPU, also a call at each key tile of the one-launch backward of short
    calls (``attention_bwd.SHORT_BLOCKS``), a kernel of its own with a binary per tile (where the
    options keep a call off it, these take the three-launch kernels, already compiled)."""
    from .ops import attention_fwd_gluon as gluon
    from .ops import attention_fwd_hopper as hopper
    from .ops.attention_bwd import SHORT_BLOCKS
    hopper_gpu = (device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
                  and hopper.enabled() and dtype in hopper.DTYPES and gluon.padded_head_dim(d, dv) is not None)
    for n in lengths:
        with hopper.disabled():
            _attention_call(1, d, dv, dtype, group, kv_heads, causal, backward, n, device, options, padded)
        if hopper_gpu:
            batch = -(-hopper.MIN_WORK // (group * kv_heads * n * n * d))
            _attention_call(batch, d, dv, dtype, group, kv_heads, causal, backward, n, device, options, padded)
    if backward and device.type == "cuda":
        for n in SHORT_BLOCKS:
            with hopper.disabled():
                _attention_call(1, d, dv, dtype, group, kv_heads, causal, backward, n, device, options, padded)


def _attention_call(batch, d, dv, dtype, group, kv_heads, causal, backward, length, device, options, padded):
    from .ops.attention import attention_core
    q = torch.randn(batch, group * kv_heads, length, d, device=device, dtype=dtype, requires_grad=backward)
    k = torch.randn(batch, kv_heads, length, d, device=device, dtype=dtype, requires_grad=backward)
    v = torch.randn(batch, kv_heads, length, dv, device=device, dtype=dtype, requires_grad=backward)
    options = dict(options)
    if options.get("sinks") is True:
        options["sinks"] = torch.zeros(q.shape[1], device=device)
    if padded:
        rows = torch.tensor([[0, length]] * batch, dtype=torch.int32, device=device)
        options.update(q_ranges=rows, k_ranges=rows)
    out = attention_core(q, k, v, causal=causal, **options)
    if backward:  # with lse returned, a loss of o alone and one that uses lse too: two backward variants
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(outs[0], (q, k, v), torch.ones_like(outs[0]), retain_graph=len(outs) > 1)
        if len(outs) > 1:
            torch.autograd.grad(outs, (q, k, v), [torch.ones_like(t) for t in outs])
        with torch.no_grad():  # the forward that stores no lse (evaluation, inference) is its own kernel
            attention_core(q, k, v, causal=causal, **options)


def _decode(d, dv, dtype, group, kv_heads, length, device):
    """One new token a sequence against a contiguous cache, at the split count the call chooses and at
    counts that take each of the merge's split tiles (a power of two up to 32) and none (one split:
    stage 1 writes o itself), as a serving loop's batches of other sizes choose them."""
    from .ops.decode import decode
    q = torch.randn(1, group * kv_heads, 1, d, device=device, dtype=dtype)
    k = torch.randn(1, kv_heads, length, d, device=device, dtype=dtype)
    v = torch.randn(1, kv_heads, length, dv, device=device, dtype=dtype)
    lens = torch.full((1,), length, device=device, dtype=torch.int32)
    decode(q, k, v, lens)
    for splits in (1, 2, 3, 5, 9, 17):
        decode(q, k, v, lens, num_splits=splits)


def _mla_decode(dtype, length, device):
    """One new token of 128 heads against MLA's latent cache, as a serving loop's steps run it:
    contiguous and paged by 64 rows, split (one sequence of 32k keys) and not (a batch that fills the
    GPU), and the merge at each of its tiles (a power of two of splits, from 2 to 128)."""
    from .ops.decode import MLA_HEAD_DIMS, decode
    d, dv = MLA_HEAD_DIMS
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    n = 32768 if device.type == "cuda" else min(length, 1000)  # (the interpreter: a short one)
    for b, rows in ((1, n), (2 * sms, min(n, 1024))):
        q = torch.randn(b, 128, 1, d, device=device, dtype=dtype)
        lens = torch.full((b,), rows, device=device, dtype=torch.int32)
        cache = torch.randn(b, 1, -(-rows // 64) * 64, d, device=device, dtype=dtype)
        pool = cache.view(-1, 1, 64, d)
        table = torch.arange(pool.shape[0], device=device, dtype=torch.int32).view(b, -1)
        decode(q, cache, cache[..., :dv], lens)
        decode(q, pool, pool[..., :dv], lens, block_table=table)
        if b == 1:
            for splits in (2, 3, 5, 9, 17, 33, 65):
                decode(q, cache, cache[..., :dv], lens, num_splits=splits)


def _softmax(dtype, length, device):
    from .ops.softmax import softmax
    x = torch.randn(4, length, device=device, dtype=dtype, requires_grad=True)
    y = softmax(x)
    torch.autograd.grad(y, x, torch.ones_like(y))


def _progress(tasks, enabled: bool):
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return tasks
        bar = tqdm(tasks, desc="flashattn_lite warmup", unit="variant")
        return ((bar.set_postfix_str(label) or label, run) for label, run in bar)
    return tasks


# ------------------------------------------------------------------ flashattn-lite warmup

def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, metavar="NAME",
                        help="a HuggingFace model name or config folder (needs transformers)")
    parser.add_argument("--head-dims", type=_int_list, default=None, metavar="D,...", help="default 128")
    parser.add_argument("--dtypes", type=_dtype_list, default=None, metavar="DTYPE,...",
                        help="from bf16, fp16, fp32 (default bf16)")
    parser.add_argument("--gqa", type=_int_list, default=None, metavar="G,...",
                        help="query heads per KV head (default 1)")
    parser.add_argument("--causal", choices=["yes", "no", "both"], default="yes")
    parser.add_argument("--no-backward", action="store_true", help="forward kernels only")
    parser.add_argument("--decode", action="store_true", help="also decode")
    parser.add_argument("--softmax", action="store_true", help="also softmax")
    parser.add_argument("--mla-decode", action="store_true",
                        help="also decode against MLA's latent cache (576 / 512, 16-bit dtypes)")
    parser.add_argument("--length", type=int, default=4096, help="dummy sequence length (default 4096)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="compile attention's configs for lengths up to this (default: every length class)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> list[str]:
    from .bench.common import BenchArgumentError
    causal = {"yes": (True,), "no": (False,), "both": (False, True)}[args.causal]
    try:
        labels = warmup(args.model, head_dims=args.head_dims, dtypes=args.dtypes, gqa=args.gqa, causal=causal,
                        backward=not args.no_backward, decode=args.decode, softmax=args.softmax,
                        mla_decode=args.mla_decode, length=args.length, max_length=args.max_length,
                        progress=not args.no_progress)
    except (ValueError, TypeError) as e:
        raise BenchArgumentError(str(e)) from None
    print("\n".join(labels) if labels else "nothing to compile: no CUDA device (and TRITON_INTERPRET is not 1)")
    return labels


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise ValueError(f"expected comma-separated ints, got {text!r}") from None


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _dtype_list(text: str) -> list[torch.dtype]:
    names = [x for x in text.split(",") if x]
    bad = [n for n in names if n not in _DTYPES]
    if bad or not names:
        raise ValueError(f"expected dtypes from {', '.join(_DTYPES)}, got {text!r}")
    return [_DTYPES[n] for n in names]
