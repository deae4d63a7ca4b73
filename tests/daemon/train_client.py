"""One training process of the kill -9 test: trains on neuron and on CPU, compares."""

from __future__ import annotations

import sys

import torch

steps = int(sys.argv[1])
torch.manual_seed(0)
cpu = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
)
dev = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
)
dev.load_state_dict(cpu.state_dict())
dev.to("neuron")
opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
g = torch.Generator().manual_seed(1)
for step in range(steps):
    x = torch.randn(8, 16, generator=g) * (1 + step % 3)  # new shapes of work keep arriving
    losses = []
    for model, opt, device in ((cpu, opts[0], "cpu"), (dev, opts[1], "neuron")):
        loss = model(x.to(device)[: 4 + step % 5]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == losses[1], (step, losses)
    print(f"step {step}", flush=True)
for a, b in zip(cpu.parameters(), dev.parameters(), strict=True):
    assert torch.equal(a.detach(), b.detach().cpu())
print("OK", flush=True)
