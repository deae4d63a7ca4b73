"""Tensor parallelism (DTensor) on the simulated chip: each block's MLP split across the
ranks' NeuronCores, the first Linear by columns and the second by rows (one all-reduce in
forward, one in backward); every rank sees the whole batch.

    torchrun --nproc-per-node 4 examples/train_tp.py [--steps 6]

Rank 0 prints the loss beside a one-process CPU run on the same batch; the parameters,
gathered at the end, are compared with the CPU run's.
"""

from __future__ import annotations

from parallel import run
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def wrap(model: nn.Module, world: int) -> nn.Module:
    mesh = init_device_mesh("neuron", (world,))
    for block in model.blocks:
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model


if __name__ == "__main__":
    # The blocks' MLP parameters are DTensors and the rest plain tensors: PyTorch's foreach
    # optimizers take one kind at a time (as on CUDA), so AdamW goes tensor by tensor.
    run("tp", wrap, split_batch=False, description=__doc__, foreach=False)
