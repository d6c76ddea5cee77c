"""Does ConSan (TRITON_INSTRUMENTATION_MODE=consan, triton 3.6) take a correct Triton kernel that loads
through a TMA descriptor for a deadlock? ``python consan_tma_probe.py CASE``:

- ``loop1`` / ``loop3``: a minimal kernel summing tiles loaded by ``desc.load`` in a loop, without and
  with software pipelining (num_stages 1 / 3), checked against torch (both clean, 2026-11-29);
- ``pair3``: the pipelined loop loading two tiles an iteration (two descriptors) that one wgmma reads,
  which Triton's pipeliner puts on one mbarrier (expect_tx of both), as in the TMA backward kernels'
  loops (their K and V, or Q and dO); the TMA forward's loop, which is clean, gives K and V a barrier
  each;
- ``prologue3``: the same loop after two tiles loaded one by one before it, as the TMA dQ kernel
  loads its q and do (each load its own mbarrier, initialised, waited and invalidated);
- ``dots3``: the TMA dQ kernel's loop body in small: s = a·kᵀ, then acc += s·k, wgmma reading the
  loaded tile, the accumulating one left in flight into the next iteration;
- ``fwd`` / ``bwd``: the Triton TMA attention forward / backward (``attention_fwd_hopper``,
  ``attention_bwd_hopper``) on a small causal call; ``bwd0`` … ``bwd4``: the backward at the sweep's
  config i (8 or 4 warps, 2 or 3 stages); ``bwd-s1``: the default config without pipelining.

One case per process: a device-side assert leaves the CUDA context unusable."""
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


triton.set_allocator(scratch)
if hasattr(triton.runtime._allocation, "set_profile_allocator"):
    triton.runtime._allocation.set_profile_allocator(scratch)


@triton.jit
def _tile_sum(desc, out, n_tiles, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for i in tl.range(0, n_tiles, num_stages=STAGES):
        acc += desc.load([i * BLOCK, 0]).to(tl.float32)
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs[:, None] * BLOCK + offs[None, :], acc)


@triton.jit
def _pair_sum(a_desc, b_desc, out, n_tiles, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for i in tl.range(0, n_tiles, num_stages=STAGES):
        acc = tl.dot(a_desc.load([i * BLOCK, 0]), tl.trans(b_desc.load([i * BLOCK, 0])), acc)
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs[:, None] * BLOCK + offs[None, :], acc)


@triton.jit
def _tile_dots(desc, a_desc, out, n_tiles, BLOCK: tl.constexpr, PROLOGUE: tl.constexpr, DOTS: tl.constexpr,
               STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    a = tl.zeros([BLOCK, BLOCK], tl.bfloat16)
    if PROLOGUE:
        a = a_desc.load([0, 0])
        acc += a_desc.load([BLOCK, 0]).to(tl.float32)
    for i in tl.range(0, n_tiles, num_stages=STAGES):
        k = desc.load([i * BLOCK, 0])
        if DOTS:
            s = tl.dot(a, tl.trans(k))
            acc = tl.dot(s.to(tl.bfloat16), k, acc)
        else:
            acc += k.to(tl.float32)
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs[:, None] * BLOCK + offs[None, :], acc)


case = sys.argv[1]
torch.manual_seed(0)
if case.startswith("loop"):
    x = torch.randn(64 * 9, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 64, device="cuda")
    _tile_sum[(1,)](TensorDescriptor(x, list(x.shape), list(x.stride()), [64, 64]), out, 9, 64, int(case[-1]))
    torch.cuda.synchronize()
    assert torch.allclose(out, x.float().view(9, 64, 64).sum(0), atol=1e-2)
elif case == "pair3":
    x, y = (torch.randn(64 * 9, 64, device="cuda", dtype=torch.bfloat16) / 8 for _ in range(2))
    out = torch.empty(64, 64, device="cuda")
    desc = lambda t: TensorDescriptor(t, list(t.shape), list(t.stride()), [64, 64])  # noqa: E731
    _pair_sum[(1,)](desc(x), desc(y), out, 9, 64, 3)
    torch.cuda.synchronize()
    want = sum(a.float() @ b.float().T for a, b in zip(x.view(9, 64, 64), y.view(9, 64, 64)))
    assert torch.allclose(out, want, atol=1e-2, rtol=1e-2), (out - want).abs().max()
elif case in ("prologue3", "dots3"):
    x = torch.randn(64 * 9, 64, device="cuda", dtype=torch.bfloat16) / 8
    a = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16) / 8
    out = torch.empty(64, 64, device="cuda")
    desc = lambda t: TensorDescriptor(t, list(t.shape), list(t.stride()), [64, 64])  # noqa: E731
    dots = case == "dots3"
    _tile_dots[(1,)](desc(x), desc(a), out, 9, 64, True, dots, 3)
    torch.cuda.synchronize()
    want = a[64:].float() + sum((a[:64].float() @ t.float().T).bfloat16().float() @ t.float()
                                if dots else t.float() for t in x.view(9, 64, 64))
    assert torch.allclose(out, want, atol=5e-2, rtol=2e-2), (out - want).abs().max()
else:
    from flashattn_lite.ops import attention_bwd_hopper, attention_fwd_hopper
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = attention_fwd_hopper.attention_forward_hopper(q, k, v, 0.088, True)
    if case.startswith("bwd"):
        config = attention_bwd_hopper.default_config(128, True, 300)
        if case == "bwd-s1":
            config = config._replace(dkdv=config.dkdv._replace(num_stages=1), dq=config.dq._replace(num_stages=1))
        elif case != "bwd":
            config = attention_bwd_hopper.CONFIGS[128][int(case[3:])]
        print("config", config.name, flush=True)
        attention_bwd_hopper.attention_backward_hopper(torch.randn_like(o), q, k, v, o, lse, scale=0.088, causal=True,
                                                       config=config)
    torch.cuda.synchronize()
print(f"{case}: no report")
