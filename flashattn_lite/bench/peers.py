"""The attention methods every benchmark compares, behind one registry.

Each peer knows how to run itself (forward, and forward+backward through autograd), whether it can
run a given problem (checked by trying a tiny case of the same kind, once, so the answer is what
this torch build actually does, not what a table says it should), how it handles GQA, and how much
memory above the inputs it needs in theory. The memory formulas count the tensors each
implementation allocates (its outputs, what autograd saves, the gradients, known workspaces); S is
the number of attention scores B·Hq·N², e the input element size. They are the leading terms, so
measured peaks sit at or a little above them (allocator rounding, small temporaries, library
workspaces).

Causal attention here always has Nq = Nk, where top-left (SDPA's ``is_causal``) and bottom-right
(ours, FlashAttention) alignment agree.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

MODES = ("fwd", "bwd", "fwd+bwd")
# The GEMMs of each mode, as (how many at q/k's head dim, how many at v's): forward Q·Kᵀ and P·V;
# backward Q·Kᵀ again, dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q. With D = Dv that is FlashAttention's convention,
# backward FLOPs 2.5 × the forward's.
MODE_GEMM_DIMS = {"fwd": (1, 1), "bwd": (3, 2), "fwd+bwd": (4, 3)}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_DTYPE_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}


def parse_dtype(name: str) -> torch.dtype:
    key = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


@dataclass(frozen=True)
class Problem:
    """One attention problem: q (B, Hq, N, D), k (B, Hkv, N, D) and v (B, Hkv, N, Dv), self-attention
    (Nq = Nk); Dv is ``value_dim``, D where it is None."""
    batch: int
    heads: int
    kv_heads: int
    seqlen: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    device: str
    value_dim: int | None = None

    @property
    def dv(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def scores(self) -> int:
        """S = B·Hq·N²: the number of entries of the full score matrix."""
        return self.batch * self.heads * self.seqlen * self.seqlen

    @property
    def q_bytes(self) -> int:
        return self.batch * self.heads * self.seqlen * self.head_dim * self.elem

    @property
    def kv_bytes(self) -> int:
        """k and v together."""
        return self.batch * self.kv_heads * self.seqlen * (self.head_dim + self.dv) * self.elem

    @property
    def row_stats_bytes(self) -> int:
        """One float32 per query row (an lse, a δ = rowsum(dO∘O))."""
        return self.batch * self.heads * self.seqlen * 4

    def input_bytes(self, mode: str) -> int:
        """q, k, v, and dO for modes with a backward: what "above the inputs" subtracts."""
        return self.q_bytes + self.kv_bytes + (self.q_bytes * self.dv // self.head_dim if mode != "fwd" else 0)

    def flops(self, mode: str) -> float:
        """2·B·Hq·N² per GEMM column (``MODE_GEMM_DIMS``): 4·B·Hq·N²·D forward, 2.5 × that backward and
        3.5 × forward+backward at Dv = D (2·B·Hq·N²·(D + Dv), (3D + 2Dv), (4D + 3Dv) with v's own head
        dim); halved when causal."""
        per_d, per_dv = MODE_GEMM_DIMS[mode]
        f = 2.0 * self.scores * (per_d * self.head_dim + per_dv * self.dv)
        return f / 2 if self.causal else f

    def with_seqlen(self, n: int) -> "Problem":
        return Problem(self.batch, self.heads, self.kv_heads, n, self.head_dim, self.dtype, self.causal, self.device,
                       self.value_dim)

    def tiny(self) -> "Problem":
        """The smallest problem of the same kind, for availability trials and warm-ups."""
        return Problem(1, self.group, 1, 256, self.head_dim, self.dtype, self.causal, self.device, self.value_dim)

    def make_inputs(self, mode: str, seed: int = 0):
        """q, k, v (requiring grad when the mode has a backward) and dO (or None)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        grad = mode != "fwd"

        def rand(h, d=self.head_dim):
            t = torch.randn((self.batch, h, self.seqlen, d), generator=gen, device=self.device, dtype=self.dtype)
            return t.requires_grad_(grad)
        q, k, v = rand(self.heads), rand(self.kv_heads), rand(self.kv_heads, self.dv)
        do = rand(self.heads, self.dv).detach() if grad else None
        return q, k, v, do


# ------------------------------------------------------------------------------- implementations

def _naive(q, k, v, causal: bool):
    """Materialised scores, softmax in float32. GQA by stacking a group's queries as rows, so K/V are
    never copied. Each step frees what it no longer needs, so the peak is the two N² float32
    tensors alive inside softmax, not more."""
    B, Hq, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    mask = torch.ones((N, Nk), dtype=torch.bool, device=q.device).triu_(Nk - N + 1) if causal else None
    s = torch.matmul((q * D ** -0.5).reshape(B, Hkv, G * N, D), k.transpose(-1, -2)).float()
    if mask is not None:
        s.view(B, Hkv, G, N, Nk).masked_fill_(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    o = torch.matmul(p.to(q.dtype), v)
    return o.view(B, Hq, N, v.shape[-1])


def _repeat_kv(k, v, group: int):
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


# How FlexAttention is compiled: "static" (a graph per shape; what the speed sweep uses, so flex is
# timed at its best) or "dynamic" (one graph per shape family, N symbolic; what the memory sweep
# uses, so that ten lengths do not cost ten compilations).
FLEX_COMPILE = {"dynamic": False}


def _compiled_flex():
    return _compiled_flex_for(FLEX_COMPILE["dynamic"])


@functools.lru_cache(maxsize=None)
def _compiled_flex_for(dynamic: bool):
    """One compiled FlexAttention per process and mode. Compiling per call would time the compiler;
    the recompile limit is raised so that a sweep over many shapes never silently falls back to
    eager flex_attention, which materialises the full score matrix."""
    from torch.nn.attention.flex_attention import flex_attention
    import torch._dynamo.config as dcfg
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(getattr(dcfg, name), 256))
    return torch.compile(flex_attention, dynamic=dynamic)


def _causal_block_mask(n: int, device, block: int = 128):
    """Causal BlockMask built from its block lists directly: full blocks below the diagonal, a
    partial one on it. ``create_block_mask`` would first evaluate the mask on all N² positions."""
    from torch.nn.attention.flex_attention import BlockMask
    nb = -(-n // block)
    rows = torch.arange(nb, device=device, dtype=torch.int32)
    kv_num = torch.ones((1, 1, nb), device=device, dtype=torch.int32)
    kv_idx = rows.view(1, 1, nb, 1).expand(1, 1, nb, nb).contiguous()
    full_num = rows.view(1, 1, nb).contiguous()
    full_idx = torch.arange(nb, device=device, dtype=torch.int32).view(1, 1, 1, nb).expand(1, 1, nb, nb).contiguous()

    def causal(b, h, q_idx, kv_idx_):
        return q_idx >= kv_idx_
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=causal,
                                    seq_lengths=(n, n))


# --------------------------------------------------------------------------------- the registry

@dataclass
class Runner:
    """A peer bound to one problem: ``fn(q, k, v) -> o``, run inside ``context``."""
    fn: Callable
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    gqa: str = "-"


@dataclass
class Peer:
    name: str
    label: str
    summary: str
    memory_formula: dict  # mode -> human-readable formula of the theory below
    _build: Callable[[Problem, str], Runner]  # (problem, gqa_way) -> Runner
    _theory: Callable[[Problem, str, str], float]  # (problem, mode, gqa_way) -> bytes above inputs
    needs_cuda: bool = False
    cpu_on_request: bool = False  # runs on CPU only when asked for by name (too slow to be a default)
    gqa_ways: tuple = ("native",)  # tried in order when Hq > Hkv
    _cache: dict = field(default_factory=dict, repr=False)

    def check(self, problem: Problem, *, explicit: bool = False) -> tuple[str | None, str]:
        """(None, gqa_way) if this peer runs problems like ``problem``, else (reason, "")."""
        if self.needs_cuda and problem.device != "cuda":
            return "needs CUDA", ""
        if problem.device == "cpu" and self.cpu_on_request and not explicit:
            return "CPU only when requested by name", ""
        key = (problem.device, problem.dtype, problem.head_dim, problem.dv, problem.causal, problem.group > 1)
        if key not in self._cache:
            self._cache[key] = self._trial(problem.tiny())
        return self._cache[key]

    def _trial(self, tiny: Problem) -> tuple[str | None, str]:
        ways = self.gqa_ways if tiny.group > 1 else ("native" if "native" in self.gqa_ways else self.gqa_ways[0],)
        reason = "not supported"
        for way in ways:
            try:
                q, k, v, do = tiny.make_inputs("fwd+bwd")
                r = self._build(tiny, way)
                with r.context():
                    o = r.fn(q, k, v)
                    torch.autograd.grad(o, (q, k, v), do)
                if not torch.isfinite(o).all():
                    raise RuntimeError("non-finite output on a random input")
                return None, way
            except Exception as exc:  # every failure means "not available here"; the reason is kept
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        return reason, ""

    def build(self, problem: Problem, gqa_way: str) -> Runner:
        return self._build(problem, gqa_way)

    def theory_bytes(self, problem: Problem, mode: str, gqa_way: str = "native") -> float:
        return float(self._theory(problem, mode, gqa_way))


def _grads(p: Problem) -> int:
    return p.q_bytes + p.kv_bytes


def _out(p: Problem) -> int:
    """o: (B, Hq, N, Dv) in q's dtype, q's bytes at v's head dim."""
    return p.q_bytes * p.dv // p.head_dim


def _repeat_bytes(p: Problem, way: str) -> int:
    """Repeated K (D wide) and V (Dv wide) at Hq heads (and, with a backward, their gradients before
    the group sum)."""
    if way != "repeat_kv" or p.group == 1:
        return 0
    return p.batch * p.heads * p.seqlen * (p.head_dim + p.dv) * p.elem


def _flash_like_theory(fwd_extra: Callable[[Problem], int], bwd_extra: Callable[[Problem], int]):
    def theory(p: Problem, mode: str, way: str) -> int:
        rep = _repeat_bytes(p, way)
        fwd = _out(p) + p.row_stats_bytes + fwd_extra(p)
        if mode == "fwd":
            return fwd + rep
        return fwd + _grads(p) + bwd_extra(p) + 2 * rep
    return theory


def _naive_theory(p: Problem, mode: str, way: str) -> int:
    # fwd: inside softmax the float32 scores and probabilities are both alive (8·S), beside the
    # causal mask (N² bools). fwd+bwd: softmax's backward holds P, dP and dS in float32 (12·S);
    # causal adds the out-of-place masked_fill of dS (16·S). Checked against the CPU allocator.
    mask = p.seqlen * p.seqlen if p.causal else 0
    if mode == "fwd":
        return 8 * p.scores + mask
    return (16 if p.causal else 12) * p.scores + mask + _grads(p)


def _math_theory(p: Problem, mode: str, way: str) -> int:
    # ATen's math SDPA upcasts fp16/bf16 q, k, v to float32, scales copies of q and k, repeats K/V
    # for GQA, makes the causal mask a float N² tensor, and keeps scores and probabilities alive
    # in softmax (8·S); its output is float32 until the final cast. Backward as naive (12·S), its
    # gradients float32 before the cast back.
    full32 = p.batch * p.heads * p.seqlen * p.head_dim * 4
    up = (p.q_bytes + p.kv_bytes) * 4 // p.elem if p.elem < 4 else 0
    if mode == "fwd":
        mask = 4 * p.seqlen * p.seqlen if p.causal else 0
        # scaled q and k copies (D wide), the float32 output (Dv), repeated K (D) and V (Dv) with GQA
        widths = 2 * p.head_dim + p.dv + ((p.head_dim + p.dv) if p.group > 1 else 0)
        return 8 * p.scores + mask + up + p.batch * p.heads * p.seqlen * widths * 4
    return 12 * p.scores + (p.q_bytes + p.kv_bytes) * 4 // p.elem + full32


def _ours_portable_theory(p: Problem, mode: str, way: str) -> int:
    """``_ours_theory`` with the Hopper paths off, as ``ours-portable`` runs (no Gluon dQ buffer)."""
    from ..ops.attention_fwd_hopper import disabled
    with disabled():
        return _ours_theory(p, mode, way)


def _ours_theory(p: Problem, mode: str, way: str) -> int:
    if p.device == "cpu":
        # The CPU twin computes in float32, 512 keys at a time. Counted from its code: the forward
        # keeps four chunk-sized float32 buffers alive at once (scores, their shift, exp, the
        # product), the backward six (scores, P, dP, the shift, dS and a product), plus a float32
        # accumulator and float32 copies (and gradients) of lower-precision inputs.
        from ..ops.attention_cpu import CPU_CHUNK as c
        chunk = p.batch * p.heads * p.seqlen * min(c, p.seqlen) * 4
        acc = p.batch * p.heads * p.seqlen * p.dv * 4  # o's float32 accumulator: v's head dim
        up = (p.q_bytes + p.kv_bytes) * 4 // p.elem if p.elem != 4 else 0
        if mode == "fwd":
            return _out(p) + p.row_stats_bytes + acc + 4 * chunk + up
        return _out(p) + p.row_stats_bytes + _grads(p) + 6 * chunk + 2 * up
    return _flash_like_theory(lambda p: 0, lambda p: 2 * p.row_stats_bytes + _gluon_dq_bytes(p))(p, mode, way)


def _gluon_dq_bytes(p: Problem) -> int:
    """What the Gluon backward adds where a large plain call on sm_90 takes it: the float32 dQ it
    reduce-adds into (as FlashAttention's backwards keep) and δ, lse₂ padded to 128-row tiles, for
    its largest launch (calls with that buffer run in chunks of rows and KV heads past
    ``DQ_BUFFER_BYTES``: ``dq_buffer_chunks``). It runs every head dim pair that ``kernel_head_dim``
    maps to a kernel width (v's may differ from q's), its dQ buffer q's columns within that width
    (``dq_buffer_width``). At width 256 only a one-pass call (``attention_bwd_gluon_wide.one_pass``:
    plain causal, v padding to at most 128) has the buffer; the others run a dK/dV and a dQ kernel,
    in one launch, and have δ, lse₂ only.
    Under deterministic algorithms (no buffer: a one-writer dQ kernel) it counts 0."""
    from ..ops import attention_bwd_gluon as gluon
    from ..ops import attention_fwd_hopper as hopper
    width = gluon.kernel_head_dim(p.head_dim, p.value_dim)
    elements = p.batch * p.heads * p.seqlen * max(p.head_dim, p.dv)  # q's or o's (dO's), the larger
    takes = (p.device == "cuda" and torch.cuda.get_device_capability() == (9, 0) and gluon._HAS_GLUON
             and hopper.enabled() and _triton_version().startswith(gluon.TESTED_TRITON)
             and not torch.are_deterministic_algorithms_enabled() and p.dtype in gluon.DTYPES
             and width is not None and elements < 2 ** 31  # (``attention_fwd_hopper.covered``)
             and p.batch * p.heads * p.seqlen ** 2 * p.head_dim >= hopper.MIN_WORK)
    if not takes:
        return 0
    fused = gluon.default_config(width, p.causal, p.seqlen, False, p.dv, qk_dim=p.head_dim).fused_dq
    whole = (slice(None), slice(None))
    width = gluon.dq_buffer_width(p.head_dim, width)  # q's columns only (64 at 64 / 128, 192 at MLA)
    rows, kv_heads = gluon.dq_buffer_chunks(p.batch, p.heads, p.kv_heads, p.seqlen, width)[0] if fused else whole
    planes = len(range(p.batch)[rows]) * len(range(p.kv_heads)[kv_heads]) * p.group  # (row, query head) pairs
    return planes * ((p.seqlen * width * 4 if fused else 0) + 2 * (-(-p.seqlen // 128) * 128) * 4)


def _triton_version() -> str:
    import triton
    return triton.__version__


def _flex_theory(p: Problem, mode: str, way: str) -> int:
    # The causal BlockMask holds four int32 (N/128)² index tables (kv and q orders, partial and
    # full blocks); the backward adds δ.
    nb = -(-p.seqlen // 128)
    blocks = 4 * nb * nb * 4 if p.causal else 0
    return _flash_like_theory(lambda p: blocks, lambda p: p.row_stats_bytes)(p, mode, way)


def _sdpa_peer(name: str, label: str, backend_name: str, summary: str, theory, formula: dict,
               needs_cuda: bool) -> Peer:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def build(problem: Problem, way: str) -> Runner:
        causal = problem.causal
        group = problem.group
        if way == "enable_gqa":
            def fn(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        else:
            def fn(q, k, v):
                k, v = _repeat_kv(k, v, group)
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return Runner(fn, lambda: sdpa_kernel([backend]), way if group > 1 else "-")

    return Peer(name, label, summary, formula, build, theory, needs_cuda=needs_cuda,
                gqa_ways=("enable_gqa", "repeat_kv"))


def _build_ours(problem: Problem, way: str) -> Runner:
    from .. import attention
    causal = problem.causal
    return Runner(lambda q, k, v: attention(q, k, v, causal=causal), gqa="native" if problem.group > 1 else "-")


def _build_ours_portable(problem: Problem, way: str) -> Runner:
    # The Hopper paths are off for the whole measurement (the context), so the backwards the
    # benchmarks time take the portable kernels too, not only the forward.
    from .. import attention
    from ..ops.attention_fwd_hopper import disabled
    causal = problem.causal
    return Runner(lambda q, k, v: attention(q, k, v, causal=causal), context=disabled,
                  gqa="native" if problem.group > 1 else "-")


def _build_naive(problem: Problem, way: str) -> Runner:
    causal = problem.causal
    return Runner(lambda q, k, v: _naive(q, k, v, causal), gqa="native" if problem.group > 1 else "-")


def _build_flex(problem: Problem, way: str) -> Runner:
    flex = _compiled_flex()
    mask = _causal_block_mask(problem.seqlen, problem.device) if problem.causal else None
    gqa = problem.group > 1
    return Runner(lambda q, k, v: flex(q, k, v, block_mask=mask, enable_gqa=gqa),
                  gqa="enable_gqa" if gqa else "-")


def _fa2_bwd_extra(p: Problem) -> int:
    """FlashAttention-2's backward: a float32 dQ accumulator, δ, and for GQA dK (D wide) and dV (Dv
    wide) per query head before the group sum."""
    expanded = p.batch * p.heads * p.seqlen * (p.head_dim + p.dv) * p.elem if p.group > 1 else 0
    return p.q_bytes * 4 // p.elem + p.row_stats_bytes + expanded


_FLASH_FORMULA = {"fwd": "O + lse",
                  "fwd+bwd": "O + lse + dQ,dK,dV + fp32 dQ accumulator + δ (+ per-head dK,dV for GQA)"}


def _registry() -> dict[str, Peer]:
    flash_like = _flash_like_theory
    peers = [
        Peer("ours", "flashattn_lite", "flashattn_lite.attention (Triton on CUDA; tiled PyTorch twin on CPU)",
             {"fwd": "O + lse", "fwd+bwd": "O + lse + dQ,dK,dV + δ + lse·log2e"},
             _build_ours, _ours_theory),
        Peer("ours-portable", "flashattn_lite portable",
             "flashattn_lite.attention with the Hopper paths off (FLASHATTN_LITE_HOPPER=0: no Gluon or "
             "TMA forward or backward): the portable Triton kernels everywhere",
             {"fwd": "O + lse", "fwd+bwd": "O + lse + dQ,dK,dV + δ + lse·log2e"},
             _build_ours_portable, _ours_portable_theory),
        Peer("naive", "naive (fp32 softmax)", "matmul → float32 softmax → matmul, full N² scores",
             {"fwd": "8·S (fp32 scores + probs) + causal mask N²",
              "fwd+bwd": "12·S (P, dP, dS fp32; 16·S causal) + dQ,dK,dV"},
             _build_naive, _naive_theory),
        _sdpa_peer("sdpa-math", "SDPA math", "MATH",
                   "F.scaled_dot_product_attention, math backend (ATen composite, float32 upcast)",
                   _math_theory, {"fwd": "8·S (fp32 scores + probs) + fp32 copies of q,k,v + causal mask 4·N²",
                                  "fwd+bwd": "12·S (P, dP, dS fp32) + fp32 dQ,dK,dV"}, needs_cuda=False),
        _sdpa_peer("sdpa-flash", "SDPA flash", "FLASH_ATTENTION",
                   "F.scaled_dot_product_attention, FlashAttention-2 backend (CPU: ATen's flash kernel)",
                   flash_like(lambda p: 0, _fa2_bwd_extra), _FLASH_FORMULA, needs_cuda=False),
        _sdpa_peer("sdpa-cudnn", "SDPA cuDNN", "CUDNN_ATTENTION",
                   "F.scaled_dot_product_attention, cuDNN backend",
                   flash_like(lambda p: 0, lambda p: p.row_stats_bytes),
                   {"fwd": "O + stats", "fwd+bwd": "O + stats + dQ,dK,dV + δ (+ cuDNN workspace)"},
                   needs_cuda=True),
        _sdpa_peer("sdpa-efficient", "SDPA mem-efficient", "EFFICIENT_ATTENTION",
                   "F.scaled_dot_product_attention, memory-efficient (xFormers/CUTLASS) backend",
                   flash_like(lambda p: 0, lambda p: p.q_bytes * 4 // p.elem + p.row_stats_bytes),
                   _FLASH_FORMULA, needs_cuda=True),
        Peer("flex", "FlexAttention", "torch.compile(flex_attention), causal through a BlockMask",
             {"fwd": "O + lse (+ causal BlockMask 16·(N/128)²)",
              "fwd+bwd": "O + lse + dQ,dK,dV + δ (+ BlockMask)"},
             _build_flex, _flex_theory, cpu_on_request=True, gqa_ways=("native",)),
    ]
    return {p.name: p for p in peers}


PEERS: dict[str, Peer] = _registry()


def parse_methods(text: str) -> list[str]:
    """'all' or a comma-separated list of peer names, validated."""
    if text.strip() == "all":
        return list(PEERS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise ValueError(f"unknown method(s) {', '.join(unknown) or repr(text)}; choose from {', '.join(PEERS)} or 'all'")
    return list(dict.fromkeys(names))


def run_once(runner: Runner, q, k, v, do, mode: str):
    """One forward (and backward) call; returns nothing so that outputs die with the call."""
    o = runner.fn(q, k, v)
    if mode != "fwd":
        torch.autograd.grad(o, (q, k, v), do)


def timed_callable(runner: Runner, q, k, v, do, mode: str) -> Callable[[], object]:
    """What a speed measurement times. ``bwd`` keeps one forward graph and reruns its backward
    (retain_graph), with ``autograd.grad`` so no gradient accumulation is timed."""
    if mode == "fwd":
        return lambda: runner.fn(q, k, v)
    if mode == "fwd+bwd":
        return lambda: torch.autograd.grad(runner.fn(q, k, v), (q, k, v), do)
    o = runner.fn(q, k, v)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
