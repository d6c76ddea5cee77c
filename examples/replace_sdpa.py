"""Run an existing model's scaled_dot_product_attention calls on flashattn_lite, in one line.

    python examples/replace_sdpa.py

On a GPU the calls run our kernels and the printed difference is rounding. On a CPU without
TRITON_INTERPRET=1 they fall back to torch's SDPA (with a one-time warning), so the difference
printed there is 0; with TRITON_INTERPRET=1 they run the Triton kernels in the interpreter.
"""
import torch
import torch.nn.functional as F

import flashattn_lite


class Block(torch.nn.Module):
    """Any model that calls torch's SDPA: nothing in it knows about flashattn_lite."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, N, E = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, N, E))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Block().to(device)
    x = torch.randn(2, 128, 64, device=device)
    expected = model(x)
    with flashattn_lite.replace_sdpa(model):  # the one line (or: handle = replace_sdpa(model); handle.restore())
        got = model(x)
    # On CPU (without TRITON_INTERPRET=1) this falls back to torch's SDPA, with a warning saying so.
    print(f"max |ours − torch| = {(got - expected).abs().max().item():.2e} on {device}")


if __name__ == "__main__":
    main()
