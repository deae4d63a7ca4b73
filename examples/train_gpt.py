"""A small GPT trained with AdamW on the simulated Trainium chip, next to the same on CPU.

    python examples/train_gpt.py [--steps 20] [--device neuron]

Nothing is downloaded: the training text is generated. The only line that differs from a
CPU script is where the model and batches go: `.to("neuron")`.

The simulated step times are steady-state ones: compiles are off the simulated clock here
(NEURON_SIM_COMPILE_CLOCK=off unless set), so adaptive mode's fused graphs run as soon as
they are compiled. With them on the clock, a fused graph's tens of seconds of modelled
compile time pass before it runs (benchmarks/ttfs.py measures the first step that way).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import os
import time
from dataclasses import dataclass

os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")  # steady state (see above)

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


def _simulated_step_times(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[list[float], list[int]]:
    """Trains on neuron; returns the losses and the simulated wall time of every step."""
    marks = [torch.neuron.metrics()["wall_ns"]]

    def mark(step: int, loss: float) -> None:
        marks.append(torch.neuron.metrics()["wall_ns"])

    losses = train(model, batches, "neuron", on_step=mark)
    return losses, [b - a for a, b in itertools.pairwise(marks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig()
    cpu_model = GPT(cfg)
    models = {"eager": copy.deepcopy(cpu_model), "adaptive": copy.deepcopy(cpu_model)}
    batches = make_batches(cfg, args.steps, args.batch)
    cpu_losses = train(cpu_model, batches, "cpu")
    if args.device == "cpu":
        for i, loss in enumerate(cpu_losses):
            print(f"{i:>4} {loss:>10.6f}")
        return
    losses, times, seconds = {}, {}, {}
    for mode, model in models.items():  # the same chip, one mode after the other
        torch.neuron.set_eager_mode(mode)
        start = time.perf_counter()
        losses[mode], times[mode] = _simulated_step_times(model, batches)
        seconds[mode] = time.perf_counter() - start
    print(
        f"{'step':>4} {'cpu loss':>10} {'eager loss':>11} {'adaptive loss':>14} {'eager ms':>9} {'adaptive ms':>12}"
    )
    for i, cpu in enumerate(cpu_losses):
        print(
            f"{i:>4} {cpu:>10.6f} {losses['eager'][i]:>11.6f} {losses['adaptive'][i]:>14.6f} "
            f"{times['eager'][i] / 1e6:>9.3f} {times['adaptive'][i] / 1e6:>12.3f}"
        )
    for mode in models:
        diffs = [
            abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu_losses, losses[mode], strict=True)
        ]
        worst = float("nan") if any(math.isnan(d) for d in diffs) else max(diffs)
        print(f"{mode}: largest relative loss difference from CPU {worst:.2e}")
    steady = max(1, len(cpu_losses) // 2)  # the second half: caches warm, fused graphs ready
    eager_ms = sorted(times["eager"][steady:])[len(times["eager"][steady:]) // 2] / 1e6
    adaptive_ms = sorted(times["adaptive"][steady:])[len(times["adaptive"][steady:]) // 2] / 1e6
    print(
        f"simulated step time (median of steps {steady}-{len(cpu_losses) - 1}): eager {eager_ms:.3f} ms, "
        f"adaptive {adaptive_ms:.3f} ms, adaptive / eager = {adaptive_ms / eager_ms:.2f}"
    )
    m = torch.neuron.metrics()
    print(
        f"executables compiled: {m['executables_compiled']}, fetched from the daemon's cache: "
        f"{m['executables_fetched']} (signature cache hits {m['cache_hits']}, misses "
        f"{m['cache_misses']}); adaptive: {m['graphs_formed']} graphs, {m['fused_executions']} fused runs "
        f"covering {m['fused_ops']} ops, {m['op_by_op_graphs']} run op by op, "
        f"{m['fused_graphs_fetched']} fused graphs from the cache at first sight, "
        f"{m['fused_compiles_ready']}/{m['fused_compiles_requested']} fused compiles ready"
    )
    pending = m["fused_compiles_requested"] - m["fused_compiles_ready"]
    if pending and not m["fused_compiles_ready"]:  # the cold run: say why it went op by op
        print(
            f"why adaptive ran op by op: its {pending} fused graphs were still compiling when "
            f"the run ended (at -O2 a graph takes tens of seconds of modelled compile time; "
            f"the {args.steps} steps took {sum(times['adaptive']) / 1e9:.3f} s of simulated "
            f"time). The daemon keeps them in its cache: run again, or `trnsim precompile` what "
            f"NEURON_RECORD_GRAPHS recorded, and adaptive mode fuses from its first steps."
        )
    elif pending:
        print(
            f"{pending} of {m['fused_compiles_requested']} fused graphs never ran fused (met "
            f"once, or again only before their executable arrived): those ran op by op"
        )
    print(
        f"device memory: {torch.neuron.memory_allocated() / 2**20:.2f} MiB allocated, "
        f"peak {torch.neuron.max_memory_allocated() / 2**20:.2f} MiB"
    )
    print(
        f"real time for {args.steps} steps: eager {seconds['eager']:.2f} s, adaptive {seconds['adaptive']:.2f} s"
    )


if __name__ == "__main__":
    main()
