#!/usr/bin/env bash
# Every kernel family under NVIDIA compute-sanitizer: memcheck (out-of-bounds / misaligned accesses),
# racecheck (shared-memory hazards) and synccheck (barrier misuse: the split softmax and decode
# stages wait on each other). Small shapes, one python driver, FLASHATTN_LITE_AUTOTUNE=0. On sm_90 the
# Hopper kernels (Gluon and TMA forwards and backwards) are called directly too, and reached through the
# dispatch at small shapes (MIN_WORK 0): head dims 64/128/256, ranges and varlen, deterministic dQ.
#   bash benchmarks/sanitize.sh                 # reports under $OUT (default sanitize_out/)
#   TOOLS="memcheck" bash benchmarks/sanitize.sh
#   TOOLS=consan CONSAN_TIMEOUT=550 bash benchmarks/sanitize.sh   # the Gluon kernels under ConSan (a call of its own)
# Prints one line per tool (errors found) and exits non-zero if any tool found an error, failed or
# ran past its share of the time (TOOL_TIMEOUT seconds each, default 130, ConSan CONSAN_TIMEOUT,
# default 540; the three compute-sanitizer tools stay under ~8 minutes). The driver runs once
# without the sanitizer first, so Triton compiles outside it (WARMUP_TIMEOUT seconds, default 300).
# CONSAN_CASES picks ConSan's cases ("128-causal 256-varlen", default all of them).
set -uo pipefail
OUT=${OUT:-sanitize_out}
TOOLS=${TOOLS:-memcheck racecheck synccheck}
TOOL_TIMEOUT=${TOOL_TIMEOUT:-130}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 FLASHATTN_LITE_AUTOTUNE=0
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)}
if [ -z "$SAN" ] || [ ! -x "$SAN" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"; exit 2
fi
DRIVER="$OUT/sanitize_driver.py"
cat > "$DRIVER" <<'EOF'
"""One small call of every kernel family; prints 'ok' at the end (checked by the script)."""
import os
import torch
import flashattn_lite as fl
from flashattn_lite.ops import softmax as sm

torch.manual_seed(0)
dev, dt = "cuda", torch.float16


def r(*s, dtype=dt, grad=False):
    return torch.randn(*s, device=dev, dtype=dtype).requires_grad_(grad)


# attention: GQA, odd lengths and head dims, Dv != D, causal, masks, score options; forward + backward
for D, Dv in ((64, 64), (40, 24)):
    q, k, v = r(2, 4, 37, D, grad=True), r(2, 2, 53, D, grad=True), r(2, 2, 53, Dv, grad=True)
    for kw in (dict(), dict(causal=True), dict(causal=True, window=(8, 0), softcap=20.0,
                                              sinks=r(4, dtype=torch.float32, grad=True),
                                              alibi_slopes=torch.rand(4, device=dev))):
        o, lse = fl.attention(q, k, v, return_lse=True, **kw)
        (o.float().sum() + lse.sum()).backward()
    for mask in (torch.rand(37, 53, device=dev) > 0.3, r(2, 1, 37, 53)):
        fl.nn.FlashAttention(causal=True)(q, k, v, attn_mask=mask).float().sum().backward()
o = fl.scaled_dot_product_attention(r(1, 4, 33, 64, grad=True), r(1, 4, 17, 64, grad=True),
                                    r(1, 4, 17, 64, grad=True), is_causal=True)
o.float().sum().backward()
if hasattr(fl, "attention_varlen"):
    cu_q = torch.tensor([0, 5, 5 + 31, 5 + 31 + 1], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 9, 9 + 40, 9 + 40 + 70], dtype=torch.int32, device=dev)
    q, k, v = r(37, 4, 64, grad=True), r(119, 2, 64, grad=True), r(119, 2, 64, grad=True)
    for mx in ((None, None), (31, 70)):
        fl.attention_varlen(q, k, v, cu_q, cu_k, *mx, causal=True).float().sum().backward()


def unchecked_bounds(dtype):
    """varlen bounds read unchecked (``check_seqlens=False``, the default on CUDA) and so clamped: a
    batch ending early and one starting late (the rows outside cleared), a zero-padded tail, bounds
    below 0 and past the totals. A call's bound launch (``Launcher.bind``) takes the later bound sets
    of a signature, plain and then with a window and sinks, on new values."""
    for calls in range(2):
        q, k, v = r(60, 4, 64, dtype=dtype, grad=True), r(80, 2, 64, dtype=dtype, grad=True), \
            r(80, 2, 64, dtype=dtype, grad=True)
        for cq, ck in (([0, 20, 45 + calls], [0, 30, 70]), ([3 + calls, 30, 50], [0, 40, 77]),
                       ([0, 25, 0, 0], [0, 33 + calls, 0, 0]), ([-5, 30, 99], [0, 50 - calls, 200])):
            cu = [torch.tensor(c, dtype=torch.int32, device=dev) for c in (cq, ck)]
            for causal in (False, True):
                options = dict(window=(7, 0), sinks=r(4, dtype=torch.float32)) if calls else {}
                fl.attention_varlen(q, k, v, *cu, causal=causal, check_seqlens=False,
                                    **options).float().sum().backward()


unchecked_bounds(dt)

# softmax family: the row kernel, the two-pass kernel and the split kernel (programs that wait)
for N, strategy in ((1000, "auto"), (3000, "two_pass"), (70000, "split"), (40000, "auto")):
    x = r(3, N, dtype=torch.float32, grad=True)
    for op in (sm.SOFTMAX, sm.LOG_SOFTMAX, sm.LOGSUMEXP):
        y = sm._apply(op, x, -1, strategy=strategy)
        y.sum().backward()

# merge: pair and stacked, with empty parts
o_a, o_b = r(2, 3, 9, 40, grad=True), r(2, 3, 9, 40, grad=True)
l_a, l_b = r(2, 3, 9, dtype=torch.float32), r(2, 3, 9, dtype=torch.float32)
l_a[0, 0, 0] = float("-inf")
o, lse = fl.merge_attention_states(o_a, l_a.requires_grad_(), o_b, l_b.requires_grad_())
(o.float().sum() + lse.sum()).backward()
o, lse = fl.merge_attention_states_stacked(r(5, 2, 3, 9, 40), r(5, 2, 3, 9, dtype=torch.float32))

# decode: contiguous and paged (blocks smaller than, and a multiple of, the key tile), ragged, splits
q = r(3, 8, 2, 64)
kc, vc = r(3, 2, 600, 64), r(3, 2, 600, 64)
lens = torch.tensor([600, 1, 333], dtype=torch.int32, device=dev)
for splits in (None, 1, 3):
    fl.decode(q, kc, vc, lens, num_splits=splits)
for bs in (16, 128):
    width = -(-600 // bs)
    table = torch.randperm(3 * width, device=dev, dtype=torch.int32).view(3, width)
    kp, vp = r(3 * width, 2, bs, 64), r(3 * width, 2, bs, 64)
    for splits in (None, 1, 3):
        fl.decode(q, kp, vp, lens, block_table=table, num_splits=splits)
# splits that start past their sequence's end and past the block table's width (a one-entry table;
# a full 65-entry one at the default split count): no table read past its last entry
one = torch.tensor([[2]], dtype=torch.int32, device=dev)
fl.decode(r(1, 4, 1, 64), r(4, 1, 256, 64), r(4, 1, 256, 64), lens[1:2], block_table=one, num_splits=64)
full = torch.randperm(65, device=dev, dtype=torch.int32).view(1, 65)
fl.decode(r(1, 8, 1, 128), r(65, 8, 64, 128), r(65, 8, 64, 128), torch.tensor([4160], dtype=torch.int32, device=dev),
          block_table=full)

# the Hopper kernels (sm_90 only; entry points called directly: small shapes stay under MIN_WORK):
# the Gluon forward and backward (plain; a causal window with softcap, ALiBi and sinks), the Triton
# TMA forward (plain; every score option) and backward. Not under racecheck: it models bar.sync
# barriers only, while the Gluon kernels hand shared memory between their warp partitions through
# mbarriers and TMA (the async proxy), which it reports as hazards at the partition entry (9 in a
# 2026-11-24 run, all at the kernel's def line or its gl.warp_specialize call). ConSan, which
# models those, checks the Gluon kernels instead (TOOLS=consan, below).
GLUON = os.environ.get("SANITIZE_TOOL") != "racecheck"
if torch.cuda.get_device_capability() == (9, 0):
    from flashattn_lite.ops import attention_bwd_gluon, attention_bwd_hopper, attention_fwd_gluon, attention_fwd_hopper
    from flashattn_lite.ops.attention_fwd import Variant
    q, k, v = r(1, 4, 300, 128, dtype=torch.bfloat16), r(1, 2, 333, 128, dtype=torch.bfloat16), \
        r(1, 2, 333, 128, dtype=torch.bfloat16)
    GLUON = (GLUON and attention_fwd_gluon.supported(q, k, v) is None
             and attention_bwd_gluon.supported(q, k, v, q) is None)
    for causal in (False, True):
        if GLUON:
            attention_fwd_gluon.attention_forward_gluon(q, k, v, 0.088, causal)
        o, lse = attention_fwd_hopper.attention_forward_hopper(q, k, v, 0.088, causal)
        attention_bwd_hopper.attention_backward_hopper(torch.randn_like(o), q, k, v, o, lse, scale=0.088,
                                                       causal=causal)
        if GLUON:
            attention_bwd_gluon.attention_backward_gluon(torch.randn_like(o), q, k, v, o, lse, scale=0.088,
                                                         causal=causal)
    options = Variant(left=40, right=0, softcap=20.0, alibi=torch.rand(4, device=dev),
                      sinks=torch.randn(4, device=dev))
    attention_fwd_hopper.attention_forward_hopper(q, k, v, 0.088, True, variant=options)
    if GLUON:  # decode against MLA's latent cache (the Gluon decode kernel): contiguous, paged by 64, splits
        qm, lm = r(2, 40, 2, 576, dtype=torch.bfloat16), torch.tensor([300, 77], dtype=torch.int32, device=dev)
        cm, pm = r(2, 1, 320, 576, dtype=torch.bfloat16), r(12, 1, 64, 576, dtype=torch.bfloat16)
        tm = torch.randperm(12, device=dev)[:10].view(2, 5).to(torch.int32)
        for splits in (None, 1, 3):
            fl.decode(qm, cm, cm[..., :512], lm, num_splits=splits)
            fl.decode(qm, pm, pm[..., :512], lm, block_table=tm, num_splits=splits)
    if GLUON:
        o, lse = attention_fwd_gluon.attention_forward_gluon(q, k, v, 0.088, True, variant=options)
        attention_bwd_gluon.attention_backward_gluon(torch.randn_like(o), q, k, v, o, lse, scale=0.088, causal=True,
                                                     variant=options)

# The Hopper dispatch at small shapes (MIN_WORK 0), through the public API as a real call reaches it:
# head dims 64, 128 and 256 and ones run padded (48, 80, 96, 192; v's other than q's: 192 / 128, 128 / 64,
# 64 / 128) (bf16, GQA), dense
# batches, per-row ranges and packed varlen batches (an empty sequence among them), the score options,
# and the deterministic backwards' one-writer dQ kernels. The kernels launched are listed in the log.
if torch.cuda.get_device_capability() == (9, 0) and GLUON:
    from flashattn_lite import _launcher
    from flashattn_lite.ops import attention_fwd_gluon, attention_fwd_hopper
    from flashattn_lite.ops.attention import attention_core
    attention_fwd_hopper.MIN_WORK = 0
    bf = torch.bfloat16
    slopes, sinks = torch.rand(4, device=dev), r(4, dtype=torch.float32)
    every = dict(window=(40, 0), softcap=20.0, alibi_slopes=slopes, sinks=sinks)
    i32 = dict(dtype=torch.int32, device=dev)
    rq, rk = torch.tensor([[3, 150], [0, 97]], **i32), torch.tensor([[0, 203], [11, 150]], **i32)
    cu_q, cu_k = torch.tensor([0, 37, 37, 187], **i32), torch.tensor([0, 53, 54, 257], **i32)

    def dense(d, causal, deterministic=False, dv=None, **options):  # dv: v's head dim, if not d
        q, k, v = r(2, 4, 150, d, dtype=bf, grad=True), r(2, 2, 203, d, dtype=bf, grad=True), \
            r(2, 2, 203, dv or d, dtype=bf, grad=True)
        torch.use_deterministic_algorithms(deterministic)
        fl.attention(q, k, v, causal=causal, **options).float().sum().backward()
        attention_core(q, k, v, causal=causal, q_ranges=rq, k_ranges=rk, **options).float().sum().backward()
        torch.use_deterministic_algorithms(False)

    def packed(d, causal, deterministic=False, dv=None, **options):
        q, k, v = r(187, 4, d, dtype=bf, grad=True), r(257, 2, d, dtype=bf, grad=True), \
            r(257, 2, dv or d, dtype=bf, grad=True)
        torch.use_deterministic_algorithms(deterministic)
        fl.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, **options).float().sum().backward()
        torch.use_deterministic_algorithms(False)

    with _launcher.recording() as launches:
        unchecked_bounds(bf)  # the Gluon kernels at MIN_WORK 0
        dense(64, True, **every)
        packed(64, True, deterministic=True, window=(40, 0), softcap=20.0)
        dense(128, False, alibi_slopes=slopes, softcap=20.0)
        dense(128, True, deterministic=True)
        packed(128, True, **every)
        dense(256, False)
        dense(256, True, **every)
        packed(256, False, alibi_slopes=slopes, softcap=20.0)
        dense(96, True, **every)  # padded: TMA boxes past the tensors' columns, masked stores kept to them
        packed(80, False, alibi_slopes=slopes, softcap=20.0)
        packed(48, True, deterministic=True, window=(40, 0))
        dense(192, False)
        packed(192, True, alibi_slopes=slopes, softcap=20.0)  # the backward's wide kernels, padded
        dense(192, True, dv=128, **every)  # v's head dim not q's (MLA): every box 256 wide, stores to each width
        dense(192, True, dv=128)  # plain causal MLA: the wide backward in one pass (dQ reduce-added)
        packed(128, False, dv=64, alibi_slopes=slopes)
        packed(64, True, dv=128, deterministic=True)
        for cfg in (*attention_fwd_gluon.NARROW_V_CONFIGS, attention_fwd_gluon.NARROW_QK_CONFIG):  # 128-key tiles
            for causal in (False, True):
                attention_fwd_gluon.attention_forward_gluon(r(2, 4, 150, 192, dtype=bf), r(2, 2, 203, 192, dtype=bf),
                                                            r(2, 2, 203, 128, dtype=bf), 0.1, causal, config=cfg)
        # K 2 / V 2 with every option, and one tile a program on ranges and varlen batches
        from flashattn_lite.ops.attention_fwd import SEQ_RANGES, SEQ_VARLEN, Variant
        k2v2 = attention_fwd_gluon.NARROW_QK_CONFIG
        flat = attention_fwd_gluon.one_tile_per_program(k2v2)
        options = Variant(left=40, softcap=20.0, alibi=slopes, sinks=sinks)
        mla = r(2, 4, 150, 192, dtype=bf), r(2, 2, 203, 192, dtype=bf), r(2, 2, 203, 128, dtype=bf)
        attention_fwd_gluon.attention_forward_gluon(*mla, 0.1, True, config=k2v2, variant=options)
        attention_fwd_gluon.attention_forward_gluon(*mla, 0.1, False, config=flat,
                                                    variant=Variant(seq=SEQ_RANGES, seq_q=rq, seq_k=rk))
        mla = (t.transpose(0, 1)[None] for t in (r(187, 4, 192, dtype=bf), r(257, 2, 192, dtype=bf),
                                                 r(257, 2, 128, dtype=bf)))
        attention_fwd_gluon.attention_forward_gluon(*mla, 0.1, True, config=flat,
                                                    variant=options._replace(seq=SEQ_VARLEN, seq_q=cu_q, seq_k=cu_k))
        dense(64, True, dv=128)  # 64 / 128's fused dQ: one consumer without dQ work, dK over q's 64 columns
        from flashattn_lite.ops import attention_bwd_gluon
        split_min_keys, attention_bwd_gluon.split_min_keys = attention_bwd_gluon.split_min_keys, lambda group, d: 0
        dense(64, True, dv=128)  # the same with the GQA split: dK, dV float32 sums at their own widths
        attention_bwd_gluon.split_min_keys = split_min_keys
        # A model's (B, N, H, D) projections seen as (B, H, N, D): o stored in q's layout, dO the
        # output's transposed gradient read in place; 64 / 128 / 192-with-128, causal and not
        for d, dv, causal in ((64, 64, True), (128, 128, False), (192, 128, True)):
            qt, kt, vt, dot = (r(2, n, h, w, dtype=bf).transpose(1, 2).requires_grad_()
                               for n, h, w in ((150, 4, d), (203, 2, d), (203, 2, dv), (150, 4, dv)))
            torch.autograd.backward(fl.attention(qt, kt, vt, causal=causal), dot.detach())
        # results written into rows of larger tensors (out=, as the ring's step 0 does): o, dq, dk, dv
        from flashattn_lite.ops.attention import PLAIN, _backward_impl, _forward_impl
        for d, causal in ((64, True), (128, False), (192, True)):
            q, k, v = r(2, 4, 150, d, dtype=bf), r(2, 2, 203, d, dtype=bf), r(2, 2, 203, d, dtype=bf)
            bufs = [torch.full((2, h, n + 20, d), 7.0, device=dev, dtype=bf)
                    for h, n in ((4, 150), (4, 150), (2, 203), (2, 203))]
            o_view, *grad_views = (b[:, :, 10:-10] for b in bufs)
            o, lse = _forward_impl(q, k, v, None, 0.1, causal, 53, 0.0, 0, True, PLAIN, out=o_view)
            _backward_impl(torch.randn_like(o), q, k, v, o, lse, None, None, 0.1, causal, 53, 0.0, 0, PLAIN,
                           out=tuple(grad_views))
            assert all(bool((b[:, :, :10] == 7).all() and (b[:, :, -10:] == 7).all()) for b in bufs)
    print("Hopper dispatch launched:", ", ".join(sorted({launch.kernel for launch in launches})))
torch.cuda.synchronize()
print("ok")
EOF

# Triton's concurrency sanitizer (ConSan: TRITON_INSTRUMENTATION_MODE=consan) for the Gluon kernels:
# racecheck does not model their mbarrier/TMA handoffs between warp groups; ConSan instruments every
# shared-memory access against the kernel's barriers and asserts on the device on a race.
CONSAN="$OUT/consan_driver.py"
cat > "$CONSAN" <<'EOF'
"""One Gluon case under ConSan: ``consan_driver.py D MODE`` runs the forward and the backward on a
small odd GQA shape and checks them against the float64 reference (autograd). MODE:

- ``plain``, ``causal``: plain attention at the default configs (CONSAN_CONFIGS=all: every config);
- ``window``: a causal left window with softcap, ALiBi and sinks, 100 queries against 333 keys, so
  the backward's first key tiles have no query tile at all;
- ``deterministic``: the window's call under torch.use_deterministic_algorithms (the Gluon backward
  without its fused dQ; dq from the portable one-writer kernel);
- ``tma-dq``: plain causal in deterministic mode, dq from the Triton TMA dQ kernel. Not among the
  default cases: triton 3.6's ConSan reports a deadlock in that kernel's pipelined loop, a false
  positive of its model of two TMA copies on one mbarrier (docs/trust.md);
- ``varlen``: a packed batch (an empty sequence among three) with the window's options, through
  ``attention_varlen`` at MIN_WORK 0, checking that the Gluon kernels were the ones launched;
- ``mla-train`` (D 192): MLA's training shapes, q and k 192 beside v 128, causal: the backward's
  128-key programs (``_attn_bwd_gluon_mla_kernel``, checked to be the kernel launched);
- ``mla`` (D 576): ``decode`` against MLA's latent cache on the Gluon decode kernel: 40 heads × 2 new
  tokens (a partial second row block), a ragged batch whose last tiles hold stale rows, a contiguous
  cache (paged ones differ only in the loader's table read), splits 1 and 3 (an empty split among
  them), against float64. Not among the default cases: on triton 3.6 it printed nothing within 500 s
  (H200, 2026-11-30), its instrumented compile still running or stuck; ``CONSAN_CASES=576-mla``.

The other modes call the Gluon entry points, so few other Triton kernels are compiled with
instrumentation. An instrumented backward takes minutes to compile (ptxas on ~10 MB of PTX): the
script runs the cases as parallel processes."""
import faulthandler, os, sys
import torch
import triton
import flashattn_lite as fl
from flashattn_lite import _launcher
from flashattn_lite.ops import attention_bwd_gluon, attention_fwd_gluon, attention_fwd_hopper
from flashattn_lite.ops.attention_fwd import PLAIN, Variant
from flashattn_lite.reference import attention_reference, attention_varlen_reference

faulthandler.enable()
MODES = ("plain", "causal", "window", "deterministic", "tma-dq", "varlen", "mla", "mla-train")
d, mode = int(sys.argv[1]), sys.argv[2]
if mode not in MODES:
    sys.exit(f"ConSan driver: mode {mode!r} is not one of {MODES}")
causal, window = mode != "plain", mode in ("window", "varlen", "deterministic")
scratch = lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda")  # noqa: E731


def use_scratch():
    """ConSan's instrumented kernels take scratch memory from Triton's allocators, which are set per
    thread (context variables): here, and in autograd's backward thread (a hook, ``varlen``)."""
    triton.set_allocator(scratch)
    if hasattr(triton.runtime._allocation, "set_profile_allocator"):
        triton.runtime._allocation.set_profile_allocator(scratch)


use_scratch()
if torch.cuda.get_device_capability() != (9, 0) or not attention_fwd_gluon._HAS_GLUON:
    sys.exit("ConSan: no Gluon kernel runs here (needs sm_90 and the tested triton): nothing checked")
assert triton.knobs.compilation.instrumentation_mode == "consan", "run with TRITON_INSTRUMENTATION_MODE=consan"
torch.manual_seed(0)
if mode == "mla":
    bf, i32 = torch.bfloat16, dict(dtype=torch.int32, device="cuda")
    q, lens = torch.randn(2, 40, 2, d, device="cuda", dtype=bf), torch.tensor([300, 77], **i32)
    cache = torch.randn(2, 1, 320, d, device="cuda", dtype=bf)
    want = torch.cat([attention_reference(q[b:b + 1].double(), cache[b:b + 1, :, :n].double(),
                                          cache[b:b + 1, :, :n, :512].double(), causal=True, scale=0.05)[0]
                      for b, n in enumerate((300, 77))])
    with _launcher.recording() as launches:
        for splits in (1, 3):
            # (progress lines tell a slow instrumented compile from a hang in the kernel)
            print(f"mla decode: splits {splits}: compiling and launching", flush=True)
            o = fl.decode(q, cache, cache[..., :512], lens, scale=0.05, num_splits=splits)
            print(f"mla decode: splits {splits}: launched, waiting for the kernel", flush=True)
            torch.cuda.synchronize()
            assert (o.double() - want).abs().max() < 0.05, (mode, splits)
    names = {launch.kernel for launch in launches}
    assert "_mla_decode_kernel" in names, f"decode did not take the Gluon kernel: {sorted(names)}"
    print("mla decode: splits 1 and 3, clean", flush=True)
    print("ok")
    sys.exit(0)
if mode == "varlen":
    i32 = dict(dtype=torch.int32, device="cuda")
    cu_q, cu_k = torch.tensor([0, 37, 37, 187], **i32), torch.tensor([0, 53, 54, 257], **i32)
    q = torch.randn(187, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(257, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
else:
    q = torch.randn(1, 4, 100 if window else 300, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 333, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if mode == "mla-train":
        v = v[..., :128].contiguous()
do = torch.randn(*q.shape[:-1], v.shape[-1], device="cuda", dtype=q.dtype)
q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
variant, options, leaves = PLAIN, {}, [q64, k64, v64]
if window:
    slopes = torch.rand(4, device="cuda")
    sinks = torch.randn(4, device="cuda")
    variant = Variant(left=40, right=0, softcap=20.0, alibi=slopes, sinks=sinks)
    sinks64 = sinks.double().requires_grad_()
    options = dict(window=(40, 0), softcap=20.0, alibi_slopes=slopes, sinks=sinks64)
    leaves.append(sinks64)


def check_backward(got, want, config=None):
    for a, w in zip(got, want):  # dq, dk, dv (and dsinks with the window's options)
        assert (a.double() - w).norm() <= 2e-2 * w.norm(), (d, mode, config)


if mode == "varlen":
    ref = attention_varlen_reference(q64, k64, v64, cu_q, cu_k, causal=True, scale=0.088, **options)[0]
    want = torch.autograd.grad(ref, leaves, do.double())
    attention_fwd_hopper.MIN_WORK = 0  # the small batch takes the Hopper kernels
    leaves = [t.requires_grad_() for t in (q, k, v, sinks)]
    with _launcher.recording() as launches:
        o = fl.attention_varlen(q, k, v, cu_q, cu_k, causal=True, scale=0.088, **dict(options, sinks=sinks))
        o.register_hook(lambda grad: use_scratch() or grad)
        got = torch.autograd.grad(o, leaves, do)
        torch.cuda.synchronize()
    names = {launch.kernel for launch in launches}
    assert {"_attn_fwd_gluon_kernel"} <= names and names & {"_attn_bwd_gluon_kernel", "_attn_bwd_gluon_wide_kernel"}, \
        f"the varlen call did not take the Gluon kernels: {sorted(names)}"
    assert (o.double() - ref).abs().max() < 0.05, (d, mode)
    check_backward(got, want)
    print(f"d {d} varlen: forward and backward clean ({', '.join(sorted(names))})", flush=True)
    print("ok")
    sys.exit(0)
ref = attention_reference(q64, k64, v64, causal=causal, scale=0.088, **options)[0]
want = torch.autograd.grad(ref, leaves, do.double())
every = os.environ.get("CONSAN_CONFIGS") == "all" and not window
for config in attention_fwd_gluon.CONFIGS[d] if every else [None]:
    o, lse = attention_fwd_gluon.attention_forward_gluon(q, k, v, 0.088, causal, config=config, variant=variant)
    torch.cuda.synchronize()
    assert (o.double() - ref).abs().max() < 0.05, (d, mode, config)
    print(f"forward {config or 'default config'}: clean", flush=True)
torch.use_deterministic_algorithms(mode in ("deterministic", "tma-dq"))
# (the head dim 256 one pass, WIDE_ONE_PASS, takes v at most 128 wide: not these calls)
for config in [c for c in attention_bwd_gluon.CONFIGS[d] if not (c.split_d and c.fused_dq)] if every else [None]:
    with _launcher.recording() as launches:
        got = attention_bwd_gluon.attention_backward_gluon(do, q, k, v, o, lse, scale=0.088, causal=causal,
                                                           config=config, variant=variant)
        torch.cuda.synchronize()
    check_backward(got, want, config)
    names = {launch.kernel for launch in launches}
    assert mode != "mla-train" or "_attn_bwd_gluon_mla_kernel" in names, f"not the 128-key kernel: {sorted(names)}"
    print(f"backward {config or 'default config'}: clean ({', '.join(sorted(names))})", flush=True)
print(f"d {d} {mode}: forward and backward clean", flush=True)
print("ok")
EOF

echo "warm-up (compiles the kernels outside the sanitizer)"
if [ "$TOOLS" = consan ]; then
  echo "   skipped: ConSan compiles its own instrumented kernels"
else
  timeout "${WARMUP_TIMEOUT:-300}" python "$DRIVER" > "$OUT/warmup.log" 2>&1
  rc=$?
  if [ $rc = 124 ]; then
    echo "the warm-up ran past WARMUP_TIMEOUT (${WARMUP_TIMEOUT:-300} s): a fresh machine compiles every kernel"; exit 1
  elif [ $rc != 0 ]; then
    tail -20 "$OUT/warmup.log"; echo "the driver fails without the sanitizer: see $OUT/warmup.log"; exit 1
  fi
fi
[ -f "$OUT/warmup.log" ] && grep "^Hopper dispatch" "$OUT/warmup.log" && echo "warm-up done at ${SECONDS}s"
status=0
summary=""
for tool in $TOOLS; do
  log="$OUT/sanitize-$tool.log"
  if [ "$tool" = consan ]; then  # Triton's own concurrency sanitizer, for the Gluon kernels (see above)
    rc=0
    pids=""
    read -r -a cases <<< "${CONSAN_CASES:-64-plain 64-causal 64-window 128-plain 128-causal 128-window 128-deterministic 256-plain 256-causal 256-window 64-varlen 128-varlen 256-varlen 192-mla-train}"
    for case in "${cases[@]}"; do  # one process each, in parallel
      ( TRITON_INSTRUMENTATION_MODE=consan CUDA_LAUNCH_BLOCKING=1 timeout "${CONSAN_TIMEOUT:-540}" python "$CONSAN" ${case/-/ }
        s=$?; [ $s -ne 0 ] && echo "exit status $s"; exit $s ) > "$log.$case" 2>&1 &
      pids="$pids $!"
    done
    for pid in $pids; do wait "$pid"; r=$?; [ $r -ne 0 ] && [ $rc -ne 124 ] && rc=$r; done
    for f in "$log".*; do echo "== ${f##*.}"; grep -v "^ok$" "$f"; done > "$log"
    # "ok" once in the summary only when every case printed it
    [ "$(cat "$log".* | grep -c "^ok$")" -eq ${#cases[@]} ] && echo ok >> "$log"
    grep -E "^== |exit status|clean$|Error|assert" "$log" | head -30
    (exit $rc)
  else
    # memcheck sees an access past a tensor only where the tensor's allocation ends: without the caching
    # allocator every tensor is an allocation of its own (a read past a small table was hidden before).
    # (set for memcheck alone: the other tools need no exact bounds and run faster cached)
    nocache=$([ "$tool" = memcheck ] && echo "env PYTORCH_NO_CUDA_MEMORY_CACHING=1")
    SANITIZE_TOOL=$tool $nocache timeout "$TOOL_TIMEOUT" "$SAN" --tool "$tool" \
      --target-processes all --print-limit 50 python "$DRIVER" > "$log" 2>&1
  fi
  rc=$?
  # memcheck/synccheck end with "ERROR SUMMARY: N errors", racecheck with "RACECHECK SUMMARY: N hazards
  # displayed (E errors, W warnings)"; ConSan fails the launch with a device-side assert.
  errors=$(grep -Eo "ERROR SUMMARY: [0-9]+|\([0-9]+ errors," "$log" | grep -Eo "[0-9]+" | awk '{s += $1} END {print s + 0}')
  [ "$tool" = consan ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && errors=$((errors + 1))
  if [ "$rc" -eq 124 ]; then
    limit=$([ "$tool" = consan ] && echo "${CONSAN_TIMEOUT:-540}" || echo "$TOOL_TIMEOUT")
    line="$tool: TIMEOUT after ${limit}s ($errors errors reported so far)"; status=1
  elif ! grep -q "^ok$" "$log"; then
    line="$tool: the driver did not finish (exit $rc, $errors errors)"; status=1
  elif [ "$errors" -ne 0 ]; then
    line="$tool: $errors errors"; status=1
  else
    line="$tool: 0 errors"
  fi
  summary="$summary$line (report: $log)"$'\n'
  grep -m 20 -E "^========= (Invalid|Error|Race|Barrier|.*hazard)" "$log"
done
printf "%s" "$summary"
exit $status
