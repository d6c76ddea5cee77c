"""DeepSeek-V2/V3 attention (MLA) decoding with the projections absorbed, against a paged latent cache
(``PagedKVCache`` with ``v_from_k=True``), checked at every step against the same layer computed the
plain way (per-head keys and values).

Each cached token keeps one 576-wide row: its 512-wide compressed KV latent c and its 64-wide rotary
key part k_r, which every head shares. Head h's query splits into q_c (128 wide, against the keys
W_uk[h]·c) and q_r (64 wide, against k_r). Absorbing W_uk[h] into the query (q_c·W_uk[h], 512 wide)
turns every head's scores into a product with the latent row itself, and its values into the latent
(v = c, with W_uv[h] applied after the attention): ``decode(q, cache, cache[..., :512])`` with q
(B, H, 1, 576) and one KV head. The softmax scale stays the unabsorbed head dim's, (128 + 64) ** -0.5.
On sm_90 this runs the Gluon MLA kernel (``explain.decode`` says so), elsewhere the portable one.

    python examples/mla_decoding.py                 # CUDA if present, else CPU (PyTorch twins)
"""
from __future__ import annotations

import argparse

import torch

from flashattn_lite.kv_cache import PagedKVCache

LATENT, ROPE, NOPE, V_HEAD = 512, 64, 128, 128  # DeepSeek-V3's widths
PAGE = 64  # rows a cache page (the Gluon kernel takes multiples of 64)


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (…, n, 64) at positions pos (n,): pairs of columns rotated by pos·θ_i."""
    theta = 10000.0 ** (-torch.arange(0, ROPE, 2, device=x.device, dtype=torch.float32) / ROPE)
    angle = pos[:, None].float() * theta
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).to(x.dtype)


class MLAttention(torch.nn.Module):
    """The attention of one MLA layer (no query compression): the projections and both ways of
    computing it."""

    def __init__(self, dim=256, heads=16):
        super().__init__()
        self.heads = heads
        self.wq = torch.nn.Linear(dim, heads * (NOPE + ROPE), bias=False)
        self.wkv = torch.nn.Linear(dim, LATENT + ROPE, bias=False)   # c and k_r of a token
        self.w_uk = torch.nn.Parameter(torch.randn(heads, NOPE, LATENT) * LATENT ** -0.5)
        self.w_uv = torch.nn.Parameter(torch.randn(heads, V_HEAD, LATENT) * LATENT ** -0.5)
        self.wo = torch.nn.Linear(heads * V_HEAD, dim, bias=False)
        self.scale = (NOPE + ROPE) ** -0.5

    def latent_rows(self, x, pos):
        """The cache rows [c, rope(k_r)] (n, 576) of tokens x (n, dim) at positions pos."""
        c, k_r = self.wkv(x).split([LATENT, ROPE], -1)
        return torch.cat([c, rope(k_r, pos)], -1)

    def queries(self, x, pos):
        """(q_c (n, H, 128), rope(q_r) (n, H, 64)) of tokens x at positions pos."""
        q = self.wq(x).view(x.shape[0], self.heads, NOPE + ROPE)
        q_c, q_r = q.split([NOPE, ROPE], -1)
        return q_c, rope(q_r.transpose(0, 1), pos).transpose(0, 1)

    def absorbed_step(self, x, pos, step):
        """One decoding step of B sequences, one new token each (x (B, dim) at positions pos (B,)),
        whose latent rows are already in the paged cache (``step``, a ``PagedStep``): the absorbed
        form, through ``decode`` with v the cache's first 512 columns."""
        q_c, q_r = self.queries(x, pos)
        q = torch.cat([torch.einsum("bhn,hnl->bhl", q_c, self.w_uk), q_r], -1)       # (B, H, 576)
        o = step.attend(0, q[:, :, None], scale=self.scale)
        o = torch.einsum("bhl,hvl->bhv", o[:, :, 0], self.w_uv)                     # (B, H, 128)
        return self.wo(o.flatten(1))

    def plain_last(self, xs):
        """The last token's output for one sequence xs (n, dim), the unabsorbed way in float64: per
        head keys [W_uk[h]·c, k_r] and values W_uv[h]·c, softmax over every position."""
        pos = torch.arange(xs.shape[0], device=xs.device)
        rows = self.latent_rows(xs, pos).double()
        c, k_r = rows.split([LATENT, ROPE], -1)
        q_c, q_r = (t[-1].double() for t in self.queries(xs, pos))                  # (H, 128), (H, 64)
        k_c = torch.einsum("nl,hkl->hnk", c, self.w_uk.double())                     # (H, n, 128)
        v = torch.einsum("nl,hvl->hnv", c, self.w_uv.double())                       # (H, n, 128)
        s = (torch.einsum("hk,hnk->hn", q_c, k_c) + q_r @ k_r.T) * self.scale
        o = torch.einsum("hn,hnv->hv", torch.softmax(s, -1), v)
        return o.flatten() @ self.wo.weight.double().T


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16  # MLA's 576 / 512 decode takes 16-bit tensors
    torch.manual_seed(0)
    layer = MLAttention(heads=args.heads).to(dev, dtype).eval()
    prompts = [70, 5, 130]                                  # prompt lengths of three sequences
    B, dim = len(prompts), layer.wo.out_features
    max_blocks = -(-(max(prompts) + args.steps) // PAGE)
    # One 576-wide row a token, v its first 512 columns (one tensor): one layer, one KV head.
    cache = PagedKVCache(1, 1, LATENT + ROPE, head_dim_v=LATENT, v_from_k=True, num_blocks=B * max_blocks,
                         block_size=PAGE, max_seqs=B, max_seq_len=max(prompts) + args.steps, dtype=dtype, device=dev)
    hidden = [torch.randn(n, dim, device=dev, dtype=dtype) for n in prompts]   # each sequence's inputs so far

    with torch.no_grad():
        for b, xs in enumerate(hidden):                     # prefill: the prompts' latent rows
            rows = layer.latent_rows(xs, torch.arange(xs.shape[0], device=dev))
            cache.append([b], xs.shape[0]).write(0, rows[None, None])   # (1, 1, n, 576)
        worst = 0.0
        for _ in range(args.steps):
            x = torch.randn(B, dim, device=dev, dtype=dtype)
            pos = torch.tensor([h.shape[0] for h in hidden], device=dev)
            step = cache.append(list(range(B)), 1)
            step.write(0, layer.latent_rows(x, pos)[:, None, None])
            for b in range(B):
                hidden[b] = torch.cat([hidden[b], x[b:b + 1]])
            out = layer.absorbed_step(x, pos, step)
            for b in range(B):
                want = layer.plain_last(hidden[b])
                err = ((out[b].double() - want).norm() / want.norm()).item()
                worst = max(worst, err)
                assert err < 3e-2, f"sequence {b}: the absorbed step is off the plain layer by {err:.2e}"
    print(f"{args.steps} decoding steps of {B} sequences, {args.heads} heads, on {dev} ({dtype}): the absorbed "
          f"steps match the unabsorbed layer (worst relative error {worst:.1e})")


if __name__ == "__main__":
    main()
