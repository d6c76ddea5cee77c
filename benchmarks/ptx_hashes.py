"""The sm_90 PTX of the portable, the TMA and the Gluon attention forward and of the Gluon backward at a
few option sets, hashed: a refactor of shared @triton.jit helpers that leaves every hash unchanged leaves
the kernels that ran on the GPU unchanged. Needs no GPU, only a triton with the CUDA backend (the GPU's
version: 3.6; the Gluon kernels' lines say "unavailable" on another, or in a checkout whose Gluon module
has no ``_launch``).

    python benchmarks/ptx_hashes.py OLD_CHECKOUT > old.txt; python benchmarks/ptx_hashes.py . > new.txt
    diff old.txt new.txt
    python benchmarks/ptx_hashes.py . --ptxas   # each hash with ptxas -v's registers and spills (sm_90a)
    python benchmarks/ptx_hashes.py . --ptxas --only=varlen   # only the cases whose name has "varlen"
    python benchmarks/ptx_hashes.py . --only="gluon varlen" --dump=new/   # each case's PTX as a file (ptxas takes it)

A checkout from before the Gluon window compiles the window lines (listed last) without the window:
their hashes are then its plain kernels'.

Debug sections, file names, source locations and labels are dropped before hashing (they move with
the source, not the code)."""
import hashlib, re, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
PTXAS = "--ptxas" in sys.argv[2:]
ONLY = [a[len("--only="):] for a in sys.argv[2:] if a.startswith("--only=")]  # cases whose name has it
DUMP = next((a[len("--dump="):] for a in sys.argv[2:] if a.startswith("--dump=")), None)  # folder for the PTX
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import flashattn_lite.ops.attention_fwd as f
import flashattn_lite.ops.attention_fwd_hopper as h

T = GPUTarget("cuda", 90, 32)
PTRS = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "lse": "*fp32", "mask": "*bf16", "sinks": "*fp32",
        "alibi": "*fp32", "q_starts": "*i32", "q_ends": "*i32", "k_starts": "*i32", "k_ends": "*i32"}
FLOATS = {"qk_scale", "softcap_scale", "softcap2", "drop_scale"}

def compile_ptx(J, ce, types):
    """PTX of @triton.jit ``J`` for sm_90: constexprs from ``ce``, other arguments typed by ``types``
    (name -> type; pointers are 16-byte aligned), the rest fp32 scalars (FLOATS) or i32. A constexpr
    not in ``ce`` takes its default, as a launch does."""
    ce = {**{p.name: p.default for p in J.params if p.is_constexpr and p.has_default}, **ce}
    sig, constexprs, attrs = {}, {}, {}
    for i, n in enumerate(J.arg_names):
        if n in ce:
            sig[n] = "constexpr"; constexprs[(i,)] = ce[n]
        elif n in types:
            sig[n] = types[n]
            if types[n].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "fp32" if n in FLOATS else "i32"
    k = triton.compile(ASTSource(J, sig, constexprs, attrs), target=T, options=dict(num_warps=8, num_stages=3))
    return k.asm["ptx"]

def portable(opts):
    ce = dict(GROUP=1, HEAD_DIM=128, HEAD_DIM_V=128, BLOCK_D=128, BLOCK_DV=128, HAS_LEFT=False, HAS_RIGHT=True,
              MASK_KIND=0, SOFTCAP=False, ALIBI=False, SINKS=False, SEQ=0, FAST_TANH=False, DROPOUT=False,
              PRECISION="tf32", FOLD_SCALE=True, STORE_LSE=True, BLOCK_M=128, BLOCK_N=64)
    return compile_ptx(f._attn_fwd_kernel.jit, {**ce, **opts}, PTRS)

def portable_bwd(kernel, opts):
    """A portable backward kernel (``_bwd_dq_kernel``, ``_bwd_dkdv_kernel``) at the forward's
    ``portable`` defaults."""
    import flashattn_lite.ops.attention_bwd as ab
    ce = dict(GROUP=1, HEAD_DIM=128, HEAD_DIM_V=128, BLOCK_D=128, BLOCK_DV=128, HAS_LEFT=False, HAS_RIGHT=True,
              MASK_KIND=0, SOFTCAP=False, ALIBI=False, SEQ=0, FAST_TANH=False, DROPOUT=False,
              PRECISION="tf32", BLOCK_M=64, BLOCK_N=64)
    types = {**PTRS, "do": "*bf16", "dq": "*bf16", "dk": "*bf16", "dv": "*bf16", "lse2": "*fp32", "delta": "*fp32"}
    return compile_ptx(getattr(ab, kernel).jit, {**ce, **opts}, types)

def portable_dq(opts):
    return portable_bwd("_bwd_dq_kernel", opts)

def portable_dkdv(opts):
    return portable_bwd("_bwd_dkdv_kernel", opts)

def tma(opts, causal=True):
    ce = dict(GROUP=1, HEAD_DIM=128, CAUSAL=causal, HAS_LEFT=False, HAS_RIGHT=causal, SOFTCAP=False, ALIBI=False,
              SINKS=False, FAST_TANH=False, BLOCK_M=128, BLOCK_N=64)
    types = {"q_desc": "tensordesc<bf16[1,1,128,128]>", "o_desc": "tensordesc<bf16[1,1,128,128]>",
             "k_desc": "tensordesc<bf16[1,1,64,128]>", "v_desc": "tensordesc<bf16[1,1,64,128]>",
             "lse": "*fp32", "sinks": "*fp32", "alibi": "*fp32"}
    return compile_ptx(h._attn_fwd_hopper_kernel, {**ce, **opts}, types)

def _gluon_case(opts, causal, d):
    """(variant, causal, d, q, kv, B, H, N) of a Gluon case: bf16 CPU tensors, GQA 2:1, the
    option tensors named in ``opts`` (``causal`` and ``d`` may come in it too)."""
    import torch
    opts = dict(opts)
    causal, d = opts.pop("causal", causal), opts.pop("d", d)
    B, H, N = 2, 4, 1024
    q, kv = torch.zeros(B, H, N, d, dtype=torch.bfloat16), torch.zeros(B, H // 2, N, d, dtype=torch.bfloat16)
    tensors = dict(alibi=torch.zeros(H), alibi_bh=torch.zeros(B, H, dtype=torch.float64), sinks=torch.zeros(H))
    variant = f.Variant(**{"alibi" if n == "alibi_bh" else n: tensors.get(n, v) for n, v in opts.items()})
    return (variant if opts else f.PLAIN), causal, d, q, kv, B, H, N


def _width(t, width):
    """A zero tensor laid out as ``t`` (dense (B, H, N, d), or a varlen (1, H, total, d) view of
    (total, H, d)) at head dim ``width``: v and dO where v's head dim is not q's (``dv``)."""
    import torch
    if t.shape[3] == width:
        return t
    if t.stride(1) < t.stride(2):  # the varlen view
        return torch.zeros(t.shape[2], t.shape[1], width, dtype=t.dtype).transpose(0, 1).unsqueeze(0)
    return torch.zeros(*t.shape[:3], width, dtype=t.dtype)


def _compile_gluon(J, args, kwargs):
    """The PTX of Gluon kernel ``J`` launched with ``args``/``kwargs``, bound by Triton's own
    argument specialisation."""
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(T)
    bound, spec, options = create_function_from_signature(J.signature, J.params, backend)(*args, **kwargs)
    options, sig, constexprs, attrs = J._pack_args(backend, kwargs, bound, spec, options)
    return triton.compile(GluonASTSource(J, sig, constexprs, attrs), target=T, options=options.__dict__).asm["ptx"]


def gluon(opts, causal=True, d=128):
    """The Gluon forward as ``attention_forward_gluon`` launches it (``_launch`` on CPU tensors), at
    its default config for N 8k (window sides as ``left``/``right`` in ``opts``; with ``dv``, the d 256
    default a call without v's width gets), or the sweep's config named ``config`` in ``opts``
    (with ``dv``: of ``NARROW_V_CONFIGS`` or ``NARROW_QK_CONFIG``)."""
    import torch
    import flashattn_lite.ops.attention_fwd_gluon as g
    opts = dict(opts)
    config = opts.pop("config", None)  # a config of the sweep by name ("unavailable" where none has it)
    dv = opts.pop("dv", None)  # v's head dim, if not q's
    variant, causal, d, q, kv, B, H, N = _gluon_case(opts, causal, d)
    if dv is not None:  # (the d 256 default for N 8k as a call without v's width gets it)
        cfg = g.default_config(g.padded_head_dim(d, dv), causal, 8192)
        if config is not None:  # or a narrow-V config by name
            cfg = next(c for c in (*g.NARROW_V_CONFIGS, g.NARROW_QK_CONFIG) if c.name == config)
        v = _width(kv, dv)
        _, args, kwargs = g._launch(q, kv, v, _width(q, dv), torch.empty(B, H, N), 0.088, causal, cfg, variant)
        return _compile_gluon(g._attn_fwd_gluon_kernel, args, kwargs)
    if config is not None:
        cfg = next(c for c in g.CONFIGS[d] if c.name == config)
        _, args, kwargs = g._launch(q, kv, kv, torch.empty_like(q), torch.empty(B, H, N), 0.088, causal, cfg,
                                    variant)
        return _compile_gluon(g._attn_fwd_gluon_kernel, args, kwargs)
    kd = getattr(g, "padded_head_dim", lambda x: x)(d) or d  # the width its config is picked at, as calls do
    try:  # the window's config rule (a checkout from before windows takes three arguments)
        cfg = g.default_config(kd, causal, 8192, variant.alibi is not None, variant.softcap > 0, variant.left >= 0)
    except TypeError:
        cfg = g.default_config(kd, causal, 8192, variant.alibi is not None)
    _, args, kwargs = g._launch(q, kv, kv, torch.empty_like(q), torch.empty(B, H, N), 0.088, causal, cfg, variant)
    return _compile_gluon(g._attn_fwd_gluon_kernel, args, kwargs)


def gluon_seq(opts, causal=True, d=128):
    """The Gluon forward on a packed varlen batch (``seq="varlen"``: (1, H, total, D) views of
    (total, H, D), three sequences) or with per-row ranges (``seq="ranges"``), one tile a program
    (as ranges run, and varlen did before its persistent schedule; ``persistent=True``: the config
    as it is), at its default config for the sequences' mean length
    (varlen) or the tensors' length (ranges) as a call without v's width gets it (``dv``: the d 256
    default), or ``NARROW_QK_CONFIG`` named ``config``. A checkout whose Gluon forward refuses these layouts
    says "unavailable"."""
    import torch
    opts = dict(opts)
    causal, d, seq, dv = opts.pop("causal", causal), opts.pop("d", d), opts.pop("seq"), opts.pop("dv", None)
    config = opts.pop("config", None)  # (with ``dv``) ``NARROW_QK_CONFIG`` by name, one tile a program
    persistent = opts.pop("persistent", False)  # varlen as attention_forward_gluon runs it now (persistent)
    import flashattn_lite.ops.attention_fwd_gluon as g
    B, H, N = 2, 4, 1024
    tensors = dict(alibi=torch.zeros(H), alibi_bh=torch.zeros(3 if seq == "varlen" else B, H, dtype=torch.float64),
                   sinks=torch.zeros(H))
    options = {"alibi" if n == "alibi_bh" else n: tensors.get(n, v) for n, v in opts.items()}
    if seq == "varlen":
        cu = torch.tensor([0, 300, 1100, B * N], dtype=torch.int32)
        q = torch.zeros(B * N, H, d, dtype=torch.bfloat16).transpose(0, 1).unsqueeze(0)
        kv = torch.zeros(B * N, H // 2, d, dtype=torch.bfloat16).transpose(0, 1).unsqueeze(0)
        variant = f.Variant(**options, seq=f.SEQ_VARLEN, seq_q=cu, seq_k=cu)
    else:
        ranges = torch.tensor([[0, 700], [5, 1024]], dtype=torch.int32)
        q, kv = torch.zeros(B, H, N, d, dtype=torch.bfloat16), torch.zeros(B, H // 2, N, d, dtype=torch.bfloat16)
        variant = f.Variant(**options, seq=f.SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    if g._variant_reason(variant) is not None:
        raise ValueError(g._variant_reason(variant))
    n = q.shape[2] // 3 if seq == "varlen" else N
    width = d if dv is None else g.padded_head_dim(d, dv)  # v's head dim ``dv`` (not q's): the wider one's
    cfg = g.default_config(width, causal, n, variant.alibi is not None, variant.softcap > 0, variant.left >= 0)
    if config is not None:
        cfg = next(c for c in (g.NARROW_QK_CONFIG,) if c.name == config)
    # one tile a program: as attention_forward_gluon runs ranges (and, before the persistent varlen
    # schedule, varlen); ``persistent``: the config as it is
    if not persistent:
        cfg = g.one_tile_per_program(cfg) if hasattr(g, "one_tile_per_program") else cfg._replace(persistent=False)
    v = kv if dv is None else _width(kv, dv)
    o, lse = f.output_buffers(q, v.shape[3], variant, True)
    _, args, kwargs = g._launch(q, kv, v, o, lse, 0.088, causal, cfg, variant)
    return _compile_gluon(g._attn_fwd_gluon_kernel, args, kwargs)


def gluon_bwd(opts, causal=True, d=128):
    """The Gluon backward as ``attention_backward_gluon`` launches it (``_launch`` on CPU tensors), at
    its default config (fused dQ), GQA 2:1 (window sides as ``left``/``right`` in ``opts``; ``seq``:
    "varlen" for a packed batch of 4 sequences, (1, H, total, d) views of (total, H, d), or of 2 of
    8k with ``long`` (their slots one KV head after another: ``VARLEN_HEAD_MAJOR_FROM``), or "ranges"
    for a padded one)."""
    import torch
    import flashattn_lite.ops.attention_bwd_gluon as g
    opts = dict(opts)
    seq, config, dv = opts.pop("seq", None), opts.pop("config", None), opts.pop("dv", None)
    one_pass = opts.pop("one_pass", False)  # the wide dK/dV kernel reducing dQ too (``FUSED_DQ``)
    kv_share = opts.pop("kv_share", 1)  # GQA split: each program one query head, dK and dV float32 sums
    mla, mha = opts.pop("mla", False), opts.pop("mha", False)  # MLA's 128-key programs (``takes_mla_programs``); GQA 1
    long = opts.pop("long", False)
    variant, causal, d, q, kv, B, H, N = _gluon_case(opts, causal, d)
    if mla:
        import flashattn_lite.ops.attention_bwd_gluon_wide as w
        kv = torch.zeros_like(q) if mha else kv
        cfg = next(c for c in g.CONFIGS[256] if getattr(c, "mla", False))
        v, rows = _width(kv, dv), torch.zeros(B * H, 1024)
        _, args, kwargs = w.mla_launch(q, kv, v, _width(q, dv), kv, v, rows, rows, 0.088, cfg,
                                       torch.zeros(B, H, N, 192))
        return _compile_gluon(w._attn_bwd_gluon_mla_kernel, args, kwargs)
    rows = torch.zeros(B * H, 1024)
    if seq == "varlen":
        B, N = 1, 16 * 1024 if long else 4 * 1024
        q = torch.zeros(N, H, d, dtype=torch.bfloat16).transpose(0, 1).unsqueeze(0)
        kv = torch.zeros(N, H // 2, d, dtype=torch.bfloat16).transpose(0, 1).unsqueeze(0)
        cu = torch.tensor([0, N // 2, N] if long else [0, 1000, 1017, 3000, N], dtype=torch.int32)
        variant = variant._replace(seq=f.SEQ_VARLEN, seq_q=cu, seq_k=cu)
        rows = torch.zeros(H, N)
    elif seq == "ranges":
        ranges = torch.tensor([[0, 1000], [24, 1024]], dtype=torch.int32)
        variant = variant._replace(seq=f.SEQ_RANGES, seq_q=ranges, seq_k=ranges)
    kd = getattr(g, "kernel_head_dim", lambda x: x)(d) or d  # a head dim run padded: the kernel's
    v, do = kv, q
    if dv is not None:  # v's (and dO's) head dim not q's: the wider one's padded width
        kd, v, do = g.kernel_head_dim(d, dv), _width(kv, dv), _width(q, dv)
    cfg = g.default_config(kd, causal, 8192)
    if config is not None:  # a config of the sweep by name, or the head dim 256 dQ kernel ("dq")
        cfg = next(c for c in g.CONFIGS[kd] if c.name == config or (config == "dq" and not c.fused_dq))
    if getattr(cfg, "split_d", False):  # head dim 256: the wide kernels
        import flashattn_lite.ops.attention_bwd_gluon_wide as w
        if one_pass:
            dkdv, _ = w.launches(q, kv, v, do, None, kv, v, rows, rows, 0.088, causal, cfg._replace(fused_dq=True),
                                 variant, dq_acc=torch.zeros(B, H, N, g.dq_buffer_width(d, kd)))
            return _compile_gluon(w._attn_bwd_gluon_wide_kernel, *dkdv[1:])
        dkdv, dq = w.launches(q, kv, v, do, q, kv, v, rows, rows, 0.088, causal, cfg._replace(fused_dq=False), variant,
                              torch.zeros(4, dtype=torch.int32))
        if config == "dq":
            return _compile_gluon(w._attn_bwd_gluon_wide_dq_kernel, *dq[1:])
        return _compile_gluon(w._attn_bwd_gluon_wide_kernel, *dkdv[1:])
    dk, dv = (kv, v) if kv_share == 1 else (kv.float(), v.float())
    share = dict(kv_share=kv_share) if kv_share > 1 else {}
    _, args, kwargs = g._launch(q, kv, v, do, None, dk, dv, rows, rows, 0.088, causal, cfg, variant,
                                dq_acc=torch.zeros(B, H, N, kd), row_starts=torch.zeros(4, dtype=torch.int32), **share)
    return _compile_gluon(g._attn_bwd_gluon_kernel, args, kwargs)

def decode(opts):
    """The split-KV decode kernel's stage 1 (bf16 cache, float32 partials; GQA 32:8, Nq 1 unless
    ``opts`` says otherwise): ``opts`` are its constexprs (head dims, paging, MLA's ``D_TAIL`` and
    ``V_FROM_K``), over a launch's defaults."""
    from flashattn_lite.ops import decode as dec
    d, dv = opts.get("HEAD_DIM", 128), opts.get("HEAD_DIM_V", 128)
    ce = dict(GROUP=4, HEAD_DIM=d, HEAD_DIM_V=dv, BLOCK_D=max(16, triton.next_power_of_2(min(d, 256))),
              BLOCK_DV=max(16, triton.next_power_of_2(dv)), BLOCK_M=16, PAGED=False, PAGE_SIZE=1,
              PRECISION="tf32", WAIT_PRIOR=True, PREFETCH_TILES=1, K_LINES=2, V_LINES=2, LINE=64,
              LAUNCH_MERGE=True, BLOCK_N=64)
    ce.update(opts)
    types = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*fp32", "lse": "*fp32", "seqlens": "*i32",
             "block_table": "*i32"}
    return compile_ptx(dec._decode_split_kernel.jit, ce, types)


def mla_decode_gluon(opts):
    """The Gluon MLA decode kernel (latent cache 576 / 512, V read from K, bf16) as ``MlaStage``
    launches it: 16 heads × 1 new token, 4 splits, paged when ``opts`` says ``paged``."""
    import torch
    import flashattn_lite.ops.decode_mla_gluon as m
    from flashattn_lite.ops.attention_fwd_gluon import default_layout
    B, Hq, Nq, splits = 2, 16, 1, 4
    q = torch.empty(B, Hq, Nq, 576, dtype=torch.bfloat16)
    paged = opts.get("paged", False)
    cache = torch.empty(8 if paged else B, 1, 64 if paged else 512, 576, dtype=torch.bfloat16)
    table = torch.zeros(B, 8, dtype=torch.int32) if paged else None
    o, lse = torch.empty(splits, B, Hq, Nq, 512), torch.empty(splits, B, Hq, Nq)
    stage = m.MlaStage(q, cache, table, splits, 1, 0.04, o.stride(), lse.stride(), None)
    layout = default_layout((1, m.BLOCK_M, m.BOX), q.dtype)
    q_desc = m.TensorDescriptor(q.reshape(B, Hq * Nq, 576), *stage.q_rows, [1, m.BLOCK_M, m.BOX], layout)
    kv_desc = m.TensorDescriptor(cache, *stage.kv_rows, [1, m.BLOCK_N, m.BOX], layout)
    seqlens = torch.zeros(B, dtype=torch.int32)
    args = (q_desc, kv_desc, o, lse, seqlens, seqlens if table is None else table, *stage.rest)
    return _compile_gluon(m._mla_decode_kernel, args, stage.constexprs)


def bwd_rows(opts):
    """The Triton kernels around the Gluon backward at head dim ``d`` (in ``opts``, with ``kernel``):
    its row statistics (``_row_stats_kernel``), the portable preprocess the ranges and varlen
    layouts take (``_bwd_preprocess``) and the dQ conversion (``_dq_convert_kernel``), at the block
    widths their launches pick (a head dim run padded is no power of 2)."""
    import flashattn_lite.ops.attention_bwd as ab
    import flashattn_lite.ops.attention_bwd_gluon as g
    d, kernel = opts["d"], opts["kernel"]
    kd = getattr(g, "kernel_head_dim", lambda x: x)(d) or d
    types = {"o": "*bf16", "do": "*bf16", "dq": "*bf16", "lse": "*fp32", "dlse": "*fp32", "delta_pad": "*fp32",
             "lse2_pad": "*fp32", "dq_acc": "*fp32", "delta": "*fp32", "lse2": "*fp32", "acc": "*fp32"}
    block_dv = triton.next_power_of_2(d)
    acc_w = {}
    if opts.get("one_pass"):  # the head dim 256 one pass's buffer: q's columns (192), no power of 2
        dv = opts["dv"]
        kd, acc_w = g.kernel_head_dim(d, dv), dict(ACC_W=g.dq_buffer_width(d, g.kernel_head_dim(d, dv)))
        block_dv = triton.next_power_of_2(dv)
    if kernel == "row stats":
        return compile_ptx(g._row_stats_kernel.jit, dict(HEAD_DIM=kd, HEAD_DIM_V=opts.get("dv", d), HAS_DLSE=False,
                                                        ZERO_DQ=True, BLOCK_M=64, BLOCK_DV=block_dv, **acc_w), types)
    if kernel == "preprocess":
        return compile_ptx(ab._bwd_preprocess.jit, dict(HEAD_DIM_V=d, BLOCK_DV=block_dv, HAS_DLSE=False,
                                                        BLOCK_M=64), types)
    return compile_ptx(g._dq_convert_kernel.jit, dict(HEAD_DIM=kd, SPREAD=not acc_w, BLOCK_R=8192 // kd,
                                                      **(dict(D_REAL=d) if kd != d else {}), **acc_w), types)


def body(ptx):  # the code only: no debug sections, file names or source locations
    ptx = ptx.split(".section\t.debug")[0]
    return "\n".join(l for l in (x.strip() for x in ptx.splitlines())
                     if not l.startswith(("//", ".file", ".loc", "$L__")) and ".loc" not in l)

QK2 = "g-m128-n128-s2-pp-r240-ps"  # ``NARROW_QK_CONFIG`` by name (MLA's K 2 / V 2)
cases = [("portable plain", portable, {}), ("portable softcap", portable, dict(SOFTCAP=True, FAST_TANH=True)),
         ("portable softcap window", portable, dict(SOFTCAP=True, FAST_TANH=True, HAS_LEFT=True)),
         ("portable alibi", portable, dict(ALIBI=True, FOLD_SCALE=False)),
         ("tma plain", tma, {}), ("tma softcap", tma, dict(SOFTCAP=True, FAST_TANH=True)),
         ("tma softcap window", tma, dict(SOFTCAP=True, FAST_TANH=True, HAS_LEFT=True)),
         ("tma alibi+sinks", tma, dict(ALIBI=True, SINKS=True)),
         ("gluon plain", gluon, {}), ("gluon softcap", gluon, dict(softcap=30.0)),
         ("gluon alibi (B, H)", gluon, dict(alibi_bh=True)),
         ("gluon softcap+alibi+sinks", gluon, dict(softcap=30.0, alibi=True, sinks=True)),
         ("gluon bwd plain", gluon_bwd, {}), ("gluon bwd sinks", gluon_bwd, dict(sinks=True)),
         ("gluon bwd softcap", gluon_bwd, dict(softcap=30.0)),
         ("gluon bwd alibi (B, H)", gluon_bwd, dict(alibi_bh=True)),
         ("gluon bwd softcap+alibi+sinks", gluon_bwd, dict(softcap=30.0, alibi=True, sinks=True)),
         ("gluon d64 plain", gluon, dict(d=64)),
         ("gluon d64 softcap+sinks", gluon, dict(d=64, softcap=30.0, sinks=True)),
         # Sliding windows (causal caps the right side at 0): the window group's call, both sides,
         # the right side alone, every option with a causal window; d 64 too (three consumers, but
         # two for a left side with softcap: ``default_config``).
         ("gluon causal window", gluon, dict(left=4095)),
         ("gluon window both", gluon, dict(left=300, right=40, causal=False)),
         ("gluon window right", gluon, dict(right=40, causal=False)),
         ("gluon causal window+all", gluon, dict(left=4095, softcap=30.0, alibi=True, sinks=True)),
         ("gluon d64 causal window", gluon, dict(left=4095, d=64)),
         ("gluon d64 window both+softcap+sinks", gluon, dict(left=300, right=40, causal=False, d=64, softcap=30.0,
                                                              sinks=True)),
         ("gluon d64 window right+softcap", gluon, dict(right=40, causal=False, d=64, softcap=30.0)),
         # The Gluon backward: plain non-causal and d 64 (unchanged by windows), then windows as for
         # the forward (a checkout from before the backward's windows compiles them without).
         ("gluon bwd full", gluon_bwd, dict(causal=False)), ("gluon bwd d64", gluon_bwd, dict(d=64)),
         ("gluon bwd d64 full", gluon_bwd, dict(d=64, causal=False)),
         ("gluon bwd causal window", gluon_bwd, dict(left=4095)),
         ("gluon bwd window both", gluon_bwd, dict(left=300, right=40, causal=False)),
         ("gluon bwd window right", gluon_bwd, dict(right=40, causal=False)),
         ("gluon bwd window left", gluon_bwd, dict(left=300, causal=False)),
         ("gluon bwd causal window+all", gluon_bwd, dict(left=4095, softcap=30.0, alibi=True, sinks=True)),
         ("gluon bwd causal window+alibi", gluon_bwd, dict(left=4095, alibi=True)),
         ("gluon bwd causal window+softcap", gluon_bwd, dict(left=4095, softcap=30.0)),
         ("gluon bwd d64 causal window", gluon_bwd, dict(left=4095, d=64)),
         ("gluon bwd d64 window both+softcap+sinks", gluon_bwd, dict(left=300, right=40, causal=False, d=64,
                                                                     softcap=30.0, sinks=True)),
         ("gluon bwd d64 causal window+all", gluon_bwd, dict(left=4095, d=64, softcap=30.0, alibi=True,
                                                             sinks=True)),
         # Ranges and varlen batches: the portable kernel (whose ``varlen_tile`` the Gluon forward
         # shares), then the Gluon forward (listed last; "unavailable" before it took them): causal
         # and not, d 64 and 128, a window with every option.
         ("portable varlen", portable, dict(SEQ=2)), ("portable ranges", portable, dict(SEQ=1)),
         ("portable bwd dq plain", portable_dq, {}), ("portable bwd dq varlen", portable_dq, dict(SEQ=2)),
         ("portable bwd dq ranges", portable_dq, dict(SEQ=1)),
         ("portable bwd dkdv plain", portable_dkdv, {}), ("portable bwd dkdv varlen", portable_dkdv, dict(SEQ=2)),
         ("portable bwd dkdv ranges", portable_dkdv, dict(SEQ=1)),
         ("gluon varlen causal", gluon_seq, dict(seq="varlen")),
         ("gluon varlen", gluon_seq, dict(seq="varlen", causal=False)),
         ("gluon d64 varlen causal", gluon_seq, dict(seq="varlen", d=64)),
         ("gluon varlen causal window+all", gluon_seq, dict(seq="varlen", left=300, softcap=30.0, alibi_bh=True,
                                                            sinks=True)),
         ("gluon d128 dv64 varlen causal", gluon_seq, dict(seq="varlen", dv=64)),
         ("gluon d192 dv128 causal", gluon, dict(d=192, dv=128)),
         ("gluon d192 dv128", gluon, dict(d=192, dv=128, causal=False)),
         ("gluon d192 dv128 narrow v", gluon, dict(d=192, dv=128, causal=False, config="g-m128-n128-s1v3-pp-r240-ps")),
         ("gluon d192 dv128 narrow v2 causal", gluon, dict(d=192, dv=128, config="g-m128-n128-s1v2-pp-r240-ps")),
         ("gluon d192 dv128 narrow qk causal", gluon, dict(d=192, dv=128, config="g-m128-n128-s2-pp-r240-ps")),
         ("gluon d192 dv128 varlen causal", gluon_seq, dict(seq="varlen", d=192, dv=128)),
         # Decoding's stage 1: Llama's d 128, d 64 paged, and MLA's latent cache (576 / 512, V read from K)
         ("decode d128", decode, {}), ("decode d64 paged16", decode, dict(HEAD_DIM=64, HEAD_DIM_V=64, PAGED=True,
                                                                           PAGE_SIZE=16, BLOCK_N=128)),
         ("decode mla 576 512", decode, dict(HEAD_DIM=576, HEAD_DIM_V=512, BLOCK_D=512, D_TAIL=64, V_FROM_K=True,
                                             BLOCK_M=16, BLOCK_N=32)),  # (the shipped tile: 16 rows × 32 keys)
         ("decode mla gluon", mla_decode_gluon, {}), ("decode mla gluon paged", mla_decode_gluon, dict(paged=True)),
         # MLA's K 2 / V 2 (K in chunks) with the options, and one tile a program on varlen and ranges
         ("gluon d192 dv128 narrow qk causal window+all", gluon, dict(d=192, dv=128, config=QK2, left=4095,
                                                                      softcap=30.0, alibi=True, sinks=True)),
         ("gluon d192 dv128 narrow qk softcap+sinks", gluon, dict(d=192, dv=128, config=QK2, causal=False,
                                                                  softcap=30.0, sinks=True)),
         ("gluon d192 dv128 narrow qk alibi", gluon, dict(d=192, dv=128, config=QK2, causal=False, alibi=True)),
         ("gluon d192 dv128 narrow qk window both", gluon, dict(d=192, dv=128, config=QK2, causal=False, left=300,
                                                                right=40)),
         ("gluon d192 dv128 narrow qk varlen causal", gluon_seq, dict(seq="varlen", d=192, dv=128, config=QK2)),
         ("gluon d192 dv128 narrow qk varlen window+all", gluon_seq, dict(seq="varlen", d=192, dv=128, config=QK2,
                                                                          left=300, softcap=30.0, alibi_bh=True,
                                                                          sinks=True)),
         ("gluon d192 dv128 narrow qk ranges", gluon_seq, dict(seq="ranges", d=192, dv=128, config=QK2,
                                                               causal=False)),
         ("gluon d128 dv64 causal", gluon, dict(dv=64)),
         ("gluon d64 dv128 causal", gluon, dict(d=64, dv=128)),
         ("gluon ranges causal", gluon_seq, dict(seq="ranges")),
         ("gluon d64 ranges", gluon_seq, dict(seq="ranges", d=64, causal=False)),
         ("gluon ranges window both+alibi+sinks", gluon_seq, dict(seq="ranges", left=300, right=40, causal=False,
                                                                  alibi_bh=True, sinks=True)),
         # Ranges and varlen batches of the Gluon backward (a checkout from before them
         # compiles these as dense: their hashes are then the dense kernels').
         ("gluon bwd varlen", gluon_bwd, dict(seq="varlen")),
         ("gluon bwd varlen full", gluon_bwd, dict(seq="varlen", causal=False)),
         ("gluon bwd varlen d64", gluon_bwd, dict(seq="varlen", d=64)),
         ("gluon bwd varlen d64 full", gluon_bwd, dict(seq="varlen", d=64, causal=False)),
         ("gluon bwd ranges", gluon_bwd, dict(seq="ranges")),
         ("gluon bwd varlen causal window+all", gluon_bwd, dict(seq="varlen", left=4095, softcap=30.0, alibi=True,
                                                                sinks=True)),
         # Non-causal ALiBi: the step loop's distances from the rows (dense) or from each sequence's first row (varlen).
         ("gluon bwd full alibi", gluon_bwd, dict(causal=False, alibi=True)),
         ("gluon bwd full softcap+alibi", gluon_bwd, dict(causal=False, softcap=30.0, alibi=True)),
         ("gluon bwd varlen full alibi", gluon_bwd, dict(seq="varlen", causal=False, alibi=True)),
         ("gluon bwd varlen full softcap+alibi", gluon_bwd, dict(seq="varlen", causal=False, softcap=30.0,
                                                                 alibi=True)),
         # The persistent configs of the Gluon forward's sweep ("unavailable" before them).
         ("gluon ps d128 m192", gluon, dict(config="g-m192-n64-s3-pp-r160-ps")),
         ("gluon ps d128 m128 full", gluon, dict(config="g-m128-n128-s3-pp-r240-ps", causal=False)),
         ("gluon ps d128 m128 softcap+sinks", gluon, dict(config="g-m128-n128-s3-pp-r240-ps", softcap=30.0,
                                                           sinks=True)),
         ("gluon ps d64", gluon, dict(config="g-m192-n128-s3-pp-r160-ps", d=64)),
         # d 64's non-causal default below 8k: the three consumers persistent, with the options
         # ``default_config`` leaves on them (no ALiBi; softcap only without a left side).
         ("gluon ps d64 full", gluon, dict(config="g-m192-n128-s3-pp-r160-ps", d=64, causal=False)),
         ("gluon ps d64 window both+sinks", gluon, dict(config="g-m192-n128-s3-pp-r160-ps", d=64, causal=False,
                                                         left=300, right=40, sinks=True)),
         ("gluon ps d64 window right+softcap+sinks", gluon, dict(config="g-m192-n128-s3-pp-r160-ps", d=64,
                                                                  causal=False, right=40, softcap=30.0,
                                                                  sinks=True)),
         # d 64 with two ping-ponging consumers (128-row tiles), one tile per program and persistent.
         ("gluon d64 m128 pp", gluon, dict(config="g-m128-n128-s3-pp-r240", d=64)),
         ("gluon ps d64 m128", gluon, dict(config="g-m128-n128-s3-pp-r240-ps", d=64)),
         ("gluon ps d64 m128 causal window+all", gluon, dict(config="g-m128-n128-s3-pp-r240-ps", d=64, left=300,
                                                              softcap=30.0, alibi=True, sinks=True)),
         # d 64's causal default below 8k: two consumers without turns, persistent.
         ("gluon ps d64 m128 no turns", gluon, dict(config="g-m128-n128-s3-r240-ps", d=64)),
         ("gluon ps d64 m128 no turns causal window+all", gluon, dict(config="g-m128-n128-s3-r240-ps", d=64,
                                                                       left=300, softcap=30.0, alibi=True,
                                                                       sinks=True)),
         # d 128 persistent with a 2-deep K ring and a 3-deep V ring (two Q sets fit).
         ("gluon ps d128 m128 k2v3", gluon, dict(config="g-m128-n128-s2v3-pp-r240-ps")),
         ("gluon ps d128 m128 k2v3 full", gluon, dict(config="g-m128-n128-s2v3-pp-r240-ps", causal=False)),
         ("gluon ps d128 m128 k2v3 causal window+all", gluon, dict(config="g-m128-n128-s2v3-pp-r240-ps", left=300,
                                                                   softcap=30.0, alibi=True, sinks=True)),
         # d 256 (the forward only): 64-key tiles, a 2-deep ring; the default persistent below 12k.
         ("gluon d256 plain", gluon, dict(d=256)), ("gluon d256 full", gluon, dict(d=256, causal=False)),
         ("gluon d256 softcap", gluon, dict(d=256, softcap=30.0)),
         ("gluon d256 alibi (B, H)", gluon, dict(d=256, alibi_bh=True)),
         ("gluon d256 softcap+alibi+sinks", gluon, dict(d=256, softcap=30.0, alibi=True, sinks=True)),
         ("gluon d256 causal window+all", gluon, dict(d=256, left=4095, softcap=30.0, alibi=True, sinks=True)),
         ("gluon d256 window both+softcap+sinks", gluon, dict(d=256, left=300, right=40, causal=False, softcap=30.0,
                                                              sinks=True)),
         ("gluon d256 no turns", gluon, dict(d=256, config="g-m128-n64-s2-r240")),
         ("gluon d256 one tile", gluon, dict(d=256, config="g-m128-n64-s2-pp-r240")),
         ("gluon ps d256 no turns", gluon, dict(d=256, config="g-m128-n64-s2-r240-ps")),
         ("gluon ps d256 softcap+alibi+sinks", gluon, dict(d=256, config="g-m128-n64-s2-pp-r240-ps", softcap=30.0,
                                                           alibi=True, sinks=True)),
         ("gluon d256 varlen causal", gluon_seq, dict(seq="varlen", d=256)),
         ("gluon d256 ranges", gluon_seq, dict(seq="ranges", d=256, causal=False)),
         ("gluon d256 varlen causal window+all", gluon_seq, dict(seq="varlen", d=256, left=300, softcap=30.0,
                                                                 alibi_bh=True, sinks=True)),
         # Head dims run padded to the next of the kernel's (``padded_head_dim``): a dense call compiles
         # to the padded dim's kernel; ranges and varlen add D_REAL to their masked stores.
         ("gluon d96 full", gluon, dict(d=96, causal=False)),
         ("gluon d96 varlen causal", gluon_seq, dict(seq="varlen", d=96)),
         ("gluon d48 varlen causal window+all", gluon_seq, dict(seq="varlen", d=48, left=300, softcap=30.0,
                                                                alibi_bh=True, sinks=True)),
         ("gluon d48 ranges", gluon_seq, dict(seq="ranges", d=48, causal=False)),
         ("gluon d80 ranges", gluon_seq, dict(seq="ranges", d=80, causal=False)),
         ("gluon d96 varlen causal window+all", gluon_seq, dict(seq="varlen", d=96, left=300, softcap=30.0,
                                                                alibi_bh=True, sinks=True)),
         ("gluon d192 full", gluon, dict(d=192, causal=False)),
         ("gluon bwd d96", gluon_bwd, dict(d=96)), ("gluon bwd d96 full", gluon_bwd, dict(d=96, causal=False)),
         ("gluon bwd d96 varlen", gluon_bwd, dict(d=96, seq="varlen")),
         ("gluon bwd d80 varlen full", gluon_bwd, dict(d=80, seq="varlen", causal=False)),
         ("gluon bwd d48 ranges window+all", gluon_bwd, dict(d=48, seq="ranges", left=300, softcap=30.0, alibi=True,
                                                             sinks=True)),
         ("bwd row stats d96", bwd_rows, dict(d=96, kernel="row stats")),
         ("bwd preprocess d80", bwd_rows, dict(d=80, kernel="preprocess")),
         ("bwd dq convert d96", bwd_rows, dict(d=96, kernel="dq convert")),
         ("bwd row stats one pass d192 dv128", bwd_rows, dict(d=192, dv=128, one_pass=True, kernel="row stats")),
         ("bwd dq convert one pass d192", bwd_rows, dict(d=192, dv=128, one_pass=True, kernel="dq convert")),
         ("gluon bwd d192 dv128", gluon_bwd, dict(d=192, dv=128)),
         ("gluon bwd d192 dv128 dq", gluon_bwd, dict(d=192, dv=128, config="dq")),
         ("gluon bwd d192 dv128 one pass", gluon_bwd, dict(d=192, dv=128, one_pass=True)),
         ("gluon bwd d192 dv128 mla", gluon_bwd, dict(d=192, dv=128, mla=True)),
         ("gluon bwd d192 dv128 mla mha", gluon_bwd, dict(d=192, dv=128, mla=True, mha=True)),
         ("gluon bwd d192 dv64", gluon_bwd, dict(d=192, dv=64)),
         ("gluon bwd d192 dv128 varlen window+all", gluon_bwd, dict(d=192, dv=128, seq="varlen", left=300,
                                                                    softcap=30.0, alibi=True, sinks=True)),
         ("gluon bwd d128 dv64 varlen", gluon_bwd, dict(dv=64, seq="varlen")),
         ("gluon bwd d128 dv64", gluon_bwd, dict(dv=64)),
         ("gluon bwd d64 dv128", gluon_bwd, dict(d=64, dv=128)),
         ("gluon bwd d64 dv128 varlen", gluon_bwd, dict(d=64, dv=128, seq="varlen")),
         ("gluon bwd d64 dv128 gqa split", gluon_bwd, dict(d=64, dv=128, kv_share=2)),
         ("gluon bwd d192", gluon_bwd, dict(d=192)), ("gluon bwd d192 dq", gluon_bwd, dict(d=192, config="dq")),
         ("gluon bwd d192 varlen window+all", gluon_bwd, dict(d=192, seq="varlen", left=300, softcap=30.0,
                                                              alibi=True, sinks=True)),
         ("gluon bwd d256", gluon_bwd, dict(d=256)), ("gluon bwd d256 full", gluon_bwd, dict(d=256, causal=False)),
         ("gluon bwd d256 softcap", gluon_bwd, dict(d=256, softcap=30.0)),
         ("gluon bwd d256 alibi (B, H)", gluon_bwd, dict(d=256, alibi_bh=True)),
         ("gluon bwd d256 causal window+all", gluon_bwd, dict(d=256, left=4095, softcap=30.0, alibi=True,
                                                              sinks=True)),
         ("gluon bwd d256 window both", gluon_bwd, dict(d=256, left=300, right=40, causal=False)),
         ("gluon bwd d256 dq", gluon_bwd, dict(d=256, config="dq")),
         ("gluon bwd d256 dq full", gluon_bwd, dict(d=256, config="dq", causal=False)),
         ("gluon bwd d256 dq causal window+all", gluon_bwd, dict(d=256, config="dq", left=4095, softcap=30.0,
                                                                 alibi=True, sinks=True)),
         ("gluon bwd d256 dq window both", gluon_bwd, dict(d=256, config="dq", left=300, right=40, causal=False)),
         ("gluon bwd d256 ranges", gluon_bwd, dict(d=256, seq="ranges")),
         ("gluon bwd d256 ranges window+all", gluon_bwd, dict(d=256, seq="ranges", left=300, softcap=30.0,
                                                              alibi=True, sinks=True)),
         ("gluon bwd d256 dq ranges", gluon_bwd, dict(d=256, seq="ranges", config="dq")),
         ("gluon bwd d256 dq ranges full", gluon_bwd, dict(d=256, seq="ranges", config="dq", causal=False)),
         ("gluon bwd d256 varlen", gluon_bwd, dict(d=256, seq="varlen")),
         ("gluon bwd d256 varlen window+all", gluon_bwd, dict(d=256, seq="varlen", left=300, softcap=30.0,
                                                              alibi=True, sinks=True)),
         ("gluon bwd d256 dq varlen", gluon_bwd, dict(d=256, seq="varlen", config="dq")),
         ("gluon bwd d256 dq varlen full", gluon_bwd, dict(d=256, seq="varlen", config="dq", causal=False)),
         # Varlen batches on the persistent schedule's work queue (``_loader_queue``; "unavailable" before
         # it), at the default config of the batch's mean length (682: persistent for every head dim).
         ("gluon ps varlen causal", gluon_seq, dict(seq="varlen", persistent=True)),
         ("gluon ps varlen", gluon_seq, dict(seq="varlen", causal=False, persistent=True)),
         ("gluon ps d64 varlen causal", gluon_seq, dict(seq="varlen", d=64, persistent=True)),
         ("gluon ps d64 varlen", gluon_seq, dict(seq="varlen", d=64, causal=False, persistent=True)),
         ("gluon ps varlen causal window+all", gluon_seq, dict(seq="varlen", left=300, softcap=30.0, alibi_bh=True,
                                                               sinks=True, persistent=True)),
         ("gluon ps d64 varlen causal window+all", gluon_seq, dict(seq="varlen", d=64, left=300, softcap=30.0,
                                                                   alibi_bh=True, sinks=True, persistent=True)),
         ("gluon ps d128 dv64 varlen causal", gluon_seq, dict(seq="varlen", dv=64, persistent=True)),
         ("gluon ps d96 varlen causal", gluon_seq, dict(seq="varlen", d=96, persistent=True)),
         ("gluon ps d256 varlen causal", gluon_seq, dict(seq="varlen", d=256, persistent=True)),
         ("gluon ps d256 varlen causal window+all", gluon_seq, dict(seq="varlen", d=256, left=300, softcap=30.0,
                                                                    alibi_bh=True, sinks=True, persistent=True)),
         ("gluon ps d192 dv128 narrow qk varlen causal", gluon_seq, dict(seq="varlen", d=192, dv=128, config=QK2,
                                                                         persistent=True)),
         ("gluon ps d192 dv128 narrow qk varlen window+all", gluon_seq, dict(seq="varlen", d=192, dv=128,
                                                                             config=QK2, left=300, softcap=30.0,
                                                                             alibi_bh=True, sinks=True,
                                                                             persistent=True)),
         # Per-row ranges on the same queue.
         ("gluon ps ranges causal", gluon_seq, dict(seq="ranges", persistent=True)),
         ("gluon ps d64 ranges", gluon_seq, dict(seq="ranges", d=64, causal=False, persistent=True)),
         ("gluon ps ranges window both+alibi+sinks", gluon_seq, dict(seq="ranges", left=300, right=40, causal=False,
                                                                     alibi_bh=True, sinks=True, persistent=True)),
         ("gluon ps d256 ranges", gluon_seq, dict(seq="ranges", d=256, causal=False, persistent=True)),
         ("gluon ps d192 dv128 narrow qk ranges", gluon_seq, dict(seq="ranges", d=192, dv=128, config=QK2,
                                                                  causal=False, persistent=True)),
         # Varlen backward slots one KV head after another (sequences of 8k keys on average and more:
         # ``VARLEN_HEAD_MAJOR_FROM``; before it, these batches compiled to the heads-fastest kernels).
         ("gluon bwd varlen long", gluon_bwd, dict(seq="varlen", long=True)),
         ("gluon bwd varlen long full", gluon_bwd, dict(seq="varlen", long=True, causal=False)),
         ("gluon bwd d256 varlen long", gluon_bwd, dict(d=256, seq="varlen", long=True)),
         ("gluon bwd d256 dq varlen long", gluon_bwd, dict(d=256, seq="varlen", config="dq", long=True))]


def ptxas(ptx):
    """ptxas -v's registers and spill bytes of the kernel (sm_90a), as triton's own ptxas reports."""
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return f"regs {','.join(regs)} spills {','.join(f'{a}/{b}' for a, b in spills)}"


for name, fn, opts in cases:
    if ONLY and not any(word in name for word in ONLY):
        continue
    try:
        ptx = fn(opts)
    except Exception as e:  # noqa: BLE001 - an older checkout or another triton: say so, go on
        if fn not in (gluon, gluon_bwd, gluon_seq):
            raise
        print(name, "unavailable", f"({type(e).__name__}: {str(e)[:80]})", flush=True)
        continue
    print(name, hashlib.sha1(body(ptx).encode()).hexdigest()[:12], *([ptxas(ptx)] if PTXAS else []), flush=True)
    if DUMP:  # the PTX as compiled: ptxas and cuobjdump -sass take it, to compare two checkouts' SASS
        import os
        os.makedirs(DUMP, exist_ok=True)
        with open(os.path.join(DUMP, name.replace(" ", "_") + ".ptx"), "w") as out:  # (``f`` is a module here)
            out.write(ptx)
