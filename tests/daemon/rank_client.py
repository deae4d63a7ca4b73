"""One rank of the N-ranks dedupe test (test_ranks.py): a small transformer block trained a
few steps on neuron (the mode is NEURON_EAGER's), as every rank of a data-parallel job
does, with data of its own."""

from __future__ import annotations

import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        attn = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def main() -> None:
    rank, steps = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(256, 64), Block(), Block(), nn.Linear(64, 256)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(rank))
    x, y = data[:, :-1].to("neuron"), data[:, 1:].to("neuron")
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
