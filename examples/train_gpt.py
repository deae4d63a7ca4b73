"""A small GPT trained with AdamW on the simulated Trainium chip, next to the same on CPU.

    python examples/train_gpt.py [--steps 20] [--device neuron]

Nothing is downloaded: the training text is generated. The only line that differs from a
CPU script is where the model and batches go: `.to("neuron")`.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_batches(
    cfg: GPTConfig, steps: int, batch: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Generated text: noisy arithmetic progressions over the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g)
        step = torch.randint(1, 4, (batch, 1), generator=g)
        seq = (start + step * torch.arange(cfg.block_size + 1)) % cfg.vocab_size
        noise = torch.rand(seq.shape, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, cfg.vocab_size, seq.shape, generator=g), seq)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def train(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    device: str,
    foreach: bool | None = None,
    on_step: object = None,
) -> list[float]:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=foreach)
    losses = []
    for step, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if callable(on_step):
            on_step(step, losses[-1])
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig()
    cpu_model = GPT(cfg)
    dev_model = copy.deepcopy(cpu_model)
    batches = make_batches(cfg, args.steps, args.batch)
    cpu_losses = train(cpu_model, batches, "cpu")
    step_times: list[int] = []
    neuron = args.device == "neuron"

    def mark(step: int, loss: float) -> None:
        if neuron:
            step_times.append(torch.neuron.metrics()["wall_ns"])

    start = time.perf_counter()
    losses = train(dev_model, batches, args.device, on_step=mark)
    elapsed = time.perf_counter() - start
    print(f"{'step':>4} {'cpu loss':>10} {args.device + ' loss':>12}")
    for i, (a, b) in enumerate(zip(cpu_losses, losses, strict=True)):
        print(f"{i:>4} {a:>10.6f} {b:>12.6f}")
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu_losses, losses, strict=True))
    print(f"largest relative loss difference: {worst:.2e}")
    if neuron:
        m = torch.neuron.metrics()
        per_step = [b - a for a, b in itertools.pairwise(step_times)]
        print(
            f"executables compiled: {m['executables_compiled']} "
            f"(cache hits {m['cache_hits']}, misses {m['cache_misses']}, launches {m['launches']})"
        )
        if per_step:
            print(
                f"simulated step time (last step): {per_step[-1] / 1e6:.3f} ms; "
                f"device busy {m['device_busy_ns'] / 1e6:.3f} ms over {len(losses)} steps"
            )
        print(
            f"device memory: {torch.neuron.memory_allocated() / 2**20:.2f} MiB allocated, "
            f"peak {torch.neuron.max_memory_allocated() / 2**20:.2f} MiB"
        )
    print(f"real time for {len(losses)} steps: {elapsed:.2f} s")


if __name__ == "__main__":
    main()
