"""Greedy generation with a paged KV cache, checked against recomputing full attention.

A tiny random-weight decoder (GQA, learned positions) generates for a batch of prompts of
different lengths. Each prompt is prefilled on its own (decode with Nq = prompt length: causal
within the new tokens), then all sequences decode together one token per step against the shared
block pool; one sequence finishes early and a new one takes its slot (and its freed blocks).
Every step's logits are compared with a from-scratch forward over the whole sequence using
``flashattn_lite.attention(causal=True)``.

    python examples/paged_generation.py                 # CPU (PyTorch twins) or CUDA if present
    TRITON_INTERPRET=1 python examples/paged_generation.py --steps 4   # the Triton kernels on CPU
"""
from __future__ import annotations

import argparse

import torch

from flashattn_lite import attention
from flashattn_lite.kv_cache import PagedKVCache


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab=97, dim=64, layers=2, heads=4, kv_heads=2, max_len=256):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict(dict(
                norm1=torch.nn.LayerNorm(dim), q=torch.nn.Linear(dim, dim),
                kv=torch.nn.Linear(dim, 2 * kv_heads * self.head_dim), o=torch.nn.Linear(dim, dim),
                norm2=torch.nn.LayerNorm(dim), mlp=torch.nn.Sequential(
                    torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)))))
        self.head = torch.nn.Linear(dim, vocab)

    def _qkv(self, blk, x):
        B, T, _ = x.shape
        h = blk["norm1"](x)
        q = blk["q"](h).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k, v = blk["kv"](h).view(B, T, 2, self.kv_heads, self.head_dim).unbind(2)
        return q, k.transpose(1, 2), v.transpose(1, 2)

    def _finish(self, blk, x, attn):
        B, _, T, _ = attn.shape
        x = x + blk["o"](attn.transpose(1, 2).reshape(B, T, -1))
        return x + blk["mlp"](blk["norm2"](x))

    def forward_full(self, tokens):
        """Logits (B, T, vocab) of whole sequences, no cache."""
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for blk in self.blocks:
            q, k, v = self._qkv(blk, x)
            x = self._finish(blk, x, attention(q, k, v, causal=True))
        return self.head(x)

    def forward_step(self, tokens, step):
        """Logits (B, n, vocab) of n new tokens per sequence, attending through the paged cache."""
        x = self.tok(tokens) + self.pos(step.positions)
        for layer, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            step.write(layer, k, v)
            x = self._finish(blk, x, step.attend(layer, q))
        return self.head(x)


@torch.no_grad()
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = TinyDecoder().to(dev, dtype).eval()
    cache = PagedKVCache(len(model.blocks), model.kv_heads, model.head_dim, num_blocks=24,
                         block_size=args.block_size, max_seqs=3, max_seq_len=128, dtype=dtype, device=dev)

    prompts = [torch.randint(0, 97, (n,)).tolist() for n in (5, 23, 40, 9)]
    seqs = {0: prompts[0], 1: prompts[1], 2: prompts[2]}    # slot → tokens so far
    waiting = [prompts[3]]
    worst = 0.0

    def check(slot, logits_new):
        """Compare the cached step's logits with a full recompute of the sequence."""
        nonlocal worst
        toks = torch.tensor(seqs[slot], device=dev)[None]
        full = model.forward_full(toks)[0, -logits_new.shape[0]:]
        err = ((logits_new.float() - full.float()).abs().max() / full.float().abs().max()).item()
        worst = max(worst, err)
        assert err < (2e-2 if dtype == torch.float16 else 1e-4), f"slot {slot}: logits differ by {err:.2e}"
        assert torch.equal(logits_new.argmax(-1), full.argmax(-1)), f"slot {slot}: greedy tokens differ"

    def prefill(slot):
        step = cache.append([slot], len(seqs[slot]))
        logits = model.forward_step(torch.tensor(seqs[slot], device=dev)[None], step)[0]
        check(slot, logits)
        seqs[slot].append(int(logits[-1].argmax()))

    for slot in list(seqs):
        prefill(slot)
    for t in range(args.steps):
        slots = sorted(seqs)
        step = cache.append(slots, 1)
        logits = model.forward_step(torch.tensor([[seqs[s][-1]] for s in slots], device=dev), step)
        for i, s in enumerate(slots):
            check(s, logits[i])
            seqs[s].append(int(logits[i, -1].argmax()))
        if t == args.steps // 2 and waiting:       # slot 0 finishes; a queued prompt reuses its blocks
            print(f"step {t}: slot 0 done after {cache.length(0)} tokens; slot 0 ← new prompt of {len(waiting[0])}")
            cache.free(0)
            seqs[0] = waiting.pop()
            prefill(0)
    lens = {s: cache.length(s) for s in sorted(seqs)}
    print(f"generated {args.steps} steps on {dev} ({dtype}); cached lengths {lens}; "
          f"{cache.free_blocks} free blocks; worst relative logit error vs full recompute {worst:.1e}")


if __name__ == "__main__":
    main()
