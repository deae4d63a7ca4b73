"""FSDP2 (`fully_shard`) on the simulated chip: parameters sharded across the ranks'
NeuronCores, all-gathered for forward and backward, gradients reduce-scattered.

    torchrun --nproc-per-node 4 examples/train_fsdp.py [--steps 6]

Rank 0 prints the loss beside a one-process CPU run on the same global batch; the
parameters, gathered at the end, are compared with the CPU run's.
"""

from __future__ import annotations

from parallel import run
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def wrap(model: nn.Module, world: int) -> nn.Module:
    mesh = init_device_mesh("neuron", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


if __name__ == "__main__":
    run("fsdp", wrap, split_batch=True, description=__doc__)
