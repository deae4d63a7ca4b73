"""One rank of the DDP features check (test_torchrun.py): `no_sync` gradient accumulation on
neuron against the same on one CPU process over the global batch, and the clear refusal of
`find_unused_parameters` and `static_graph`. Raises on any mismatch; rank 0 writes
OUT_DIR/ddp.json."""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Branchy(nn.Module):
    """A model whose second branch is used only when asked (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.used = nn.Linear(8, 1)
        self.unused = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, both: bool = False) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        return self.used(h) + (self.unused(h) if both else 0)


def close(name: str, neuron: torch.Tensor | None, cpu: torch.Tensor | None) -> None:
    if neuron is None or cpu is None:
        if not (neuron is None and cpu is None):
            raise AssertionError(f"{name}: neuron grad {neuron is None}, CPU grad {cpu is None}")
        return
    if not torch.allclose(neuron.cpu(), cpu, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"{name}: {neuron.cpu().flatten()[:4]} != {cpu.flatten()[:4]}")


def main() -> None:
    dist.init_process_group("neuron", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cpu_model = Branchy()
    g = torch.Generator().manual_seed(1)
    micro = [torch.randn(2 * world, 6, generator=g) for _ in range(3)]

    # no_sync: two micro-batches accumulate locally, the third synchronises (every
    # parameter used: without find_unused_parameters DDP waits for all of them).
    model = DDP(copy.deepcopy(cpu_model).to("neuron"))
    rows = slice(2 * rank, 2 * rank + 2)
    counts = []
    for i, x in enumerate(micro):
        before = torch.neuron.metrics()["collectives"]
        if i < 2:
            with model.no_sync():
                model(x[rows].to("neuron"), True).sum().backward()
        else:
            model(x[rows].to("neuron"), True).sum().backward()
        counts.append(torch.neuron.metrics()["collectives"] - before)
    if counts[0] != 0 or counts[1] != 0 or counts[2] < 1:
        raise AssertionError(f"collectives per micro-batch {counts}: no_sync must skip them")
    for x in micro:  # DDP averages over ranks: the CPU sums over the global batch / world
        (cpu_model(x, True).sum() / world).backward()
    for (name, p), q in zip(model.module.named_parameters(), cpu_model.parameters(), strict=True):
        close(f"no_sync {name}", p.grad, q.grad)

    # find_unused_parameters and static_graph: refused at construction, saying what to do
    # (PyTorch's reducer needs pinned memory only a C++ backend can give; README).
    refused = []
    for option in ("find_unused_parameters", "static_graph"):
        try:
            DDP(copy.deepcopy(cpu_model).to("neuron"), **{option: True})
        except NotImplementedError as e:
            if "freeze the ones a step leaves out" not in str(e):
                raise
            refused.append(option)
    if rank == 0:
        with open(os.path.join(sys.argv[1], "ddp.json"), "w") as f:
            json.dump({"collectives_per_micro_batch": counts, "refused": refused}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
