"""A small training script under torch.compile(backend="neuron"), run twice as its own process
by test_compiled.py against one daemon: the second run must compile nothing."""

from __future__ import annotations

import json

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
forward = torch.compile(model, backend="neuron")
x = torch.randn(6, 8).to("neuron")
losses = []
for _ in range(4):
    opt.zero_grad()
    loss = forward(x).pow(2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
m = torch.neuron.metrics()
print(
    json.dumps(
        {"losses": losses, "fused": m["fused_executions"], "ready": m["compiled_graphs_ready"]}
    )
)
