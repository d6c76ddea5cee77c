"""Train a tiny GPT on random tokens for a few steps with flashattn_lite's attention.

    python examples/train_tiny_gpt.py [--steps 20] [--compile]

Runs in seconds on CPU (PyTorch twin of the kernel) and on a GPU (Triton kernels, bf16 autocast).
"""
import argparse
import time

import torch
from torch import nn

from flashattn_lite.nn import MultiheadAttention


class GPT(nn.Module):
    def __init__(self, vocab=256, dim=128, depth=2, heads=4, kv_heads=2, max_len=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict(dict(
                ln1=nn.LayerNorm(dim), ln2=nn.LayerNorm(dim),
                attn=MultiheadAttention(dim, heads, kv_heads, causal=True, rotary=True, dropout=0.1),
                mlp=nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)))))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = x + b["attn"](b["ln1"](x))
            x = x + b["mlp"](b["ln2"](x))
        return self.head(self.ln(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT().to(device)
    step_model = torch.compile(model, fullgraph=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # A learnable task on random tokens: predict the token that came 3 positions earlier.
    tokens = torch.randint(0, 256, (16, 65), device=device)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = tokens[:, 3:-1], tokens[:, :-4]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = nn.functional.cross_entropy(step_model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s on {device}")


if __name__ == "__main__":
    main()
