"""Context parallelism: one long sequence split over the GPUs of a ring, attention exact.

    torchrun --nproc-per-node 2 examples/ring_attention.py   # NCCL, one GPU a rank; else gloo on CPU
    python examples/ring_attention.py                         # the same: it starts torchrun itself

Each rank holds a zigzag shard of q, k, v (``shard``), runs ``ring_attention`` forward and backward
with a gpt-oss-style layer's options (causal, a sliding window, one sink per head), and checks its
shard of the output and of the gradients against single-device ``attention`` on the whole sequence.
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
import flashattn_lite  # noqa: E402
from flashattn_lite.distributed import ring_attention, shard  # noqa: E402


def main():
    cuda = torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])  # one GPU per rank, else CPU processes
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    B, Hq, Hkv, D = 1, 8, 2, 64
    N = 2 * dist.get_world_size() * (2048 if cuda else 32)   # the whole sequence: 2W chunks
    options = dict(causal=True, window=(N // 4 - 1, 0))      # a window of N/4 keys
    g = torch.Generator(device=device).manual_seed(0)        # the same full tensors on every rank
    q = torch.randn(B, Hq, N, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, Hkv, N, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    sinks = torch.randn(Hq, device=device, generator=g)
    do = torch.randn(B, Hq, N, D, device=device, dtype=dtype, generator=g)

    # This rank's shard of the sequence (dim 2): tokens [r·c, (r+1)·c) and [(2W−1−r)·c, (2W−r)·c).
    mine = [shard(t, 2).requires_grad_() for t in (q, k, v)]
    my_sinks = sinks.clone().requires_grad_()
    o = ring_attention(*mine, sinks=my_sinks, **options)
    o.backward(shard(do, 2))
    dist.all_reduce(my_sinks.grad)  # each rank holds its queries' share of a shared parameter's gradient

    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    one_sinks = sinks.clone().requires_grad_()
    o_one = flashattn_lite.attention(*whole, sinks=one_sinks, **options)
    o_one.backward(do)

    def err(ours, ref):
        return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    errors = {"o": err(o, shard(o_one, 2))}
    errors.update({f"d{name}": err(t.grad, shard(w.grad, 2)) for name, t, w in zip("qkv", mine, whole)})
    errors["dsinks"] = err(my_sinks.grad, one_sinks.grad)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} ({device}, N {N}): relative error against one "
          "device: " + ", ".join(f"{name} {e:.1e}" for name, e in errors.items()), flush=True)
    assert max(errors.values()) < (2e-2 if dtype == torch.bfloat16 else 1e-4), errors
    dist.destroy_process_group()


if __name__ == "__main__":
    if "WORLD_SIZE" not in os.environ:  # plain python: become torchrun, one process per GPU (2 on CPU)
        from torch.distributed.run import main as torchrun
        nproc = torch.cuda.device_count() if torch.cuda.device_count() >= 2 else 2
        sys.exit(torchrun(["--standalone", "--nproc-per-node", str(nproc), __file__]))
    main()
