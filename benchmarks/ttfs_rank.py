"""One rank of benchmarks/ttfs.py (started by torchrun): a small Llama-style model (RMSNorm,
rotary attention with grouped KV heads, SwiGLU) trained to its first optimizer.step() and
loss.item() on the neuron device, then two more steps. Writes what it measured as JSON to
$TTFS_OUT/rank-$RANK.json."""

from __future__ import annotations

import json
import os
import time

LAUNCHED = float(os.environ["TTFS_T0"])  # the launcher's clock when it started torchrun

import torch
from compile_wait import time_compiles
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, 4, 2, 4 * dim) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // 4 // 2
        freqs = 1.0 / (10000 ** (torch.arange(half).float() / half))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    compile_wait = time_compiles()
    torch.manual_seed(0)
    model = Llama().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, 512, (4, 65), generator=g)
    x, y = data[:, :-1].to("neuron"), data[:, 1:].to("neuron")
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        walls.append(time.perf_counter() - start)
        if len(walls) == 1:
            first = time.time() - LAUNCHED
            sim_first = torch.neuron.metrics()["host_ns"]
            compile_wall = compile_wait[0]
    m = torch.neuron.metrics()
    out = {
        "rank": rank,
        "ttfs_wall_s": first,
        "first_step_wall_s": walls[0],
        "steady_step_wall_s": min(walls[1:]),
        "ttfs_sim_s": sim_first / 1e9,
        "steady_step_sim_us": None,
        "compile_wait_sim_s": m["compile_wait_ns"] / 1e9,
        "compile_wait_wall_s": compile_wall,
        "executables_compiled": m["executables_compiled"],
        "executables_fetched": m["executables_fetched"],
        "fused_compiles_requested": m["fused_compiles_requested"],
        "mode": os.environ.get("NEURON_EAGER", "eager"),
    }
    before = torch.neuron.metrics()["wall_ns"]
    for _ in range(2):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    out["steady_step_sim_us"] = (torch.neuron.metrics()["wall_ns"] - before) / 2e3
    path = os.path.join(os.environ["TTFS_OUT"], f"rank-{rank}.json")
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
