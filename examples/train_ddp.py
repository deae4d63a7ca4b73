"""DistributedDataParallel on the simulated chip: each rank a NeuronCore, the global batch
split across them, gradients all-reduced in buckets while backward runs.

    torchrun --nproc-per-node 4 examples/train_ddp.py [--steps 6]

The only lines a CPU or CUDA DDP script would not have: `init_process_group("neuron")` and
`.to("neuron")` (examples/parallel.py). Rank 0 prints the loss beside a one-process CPU run
on the same global batch, and each step's simulated time beside the compute and collective
busy time it overlapped.
"""

from __future__ import annotations

from parallel import run
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wrap(model: nn.Module, world: int) -> nn.Module:
    # Small buckets, so that the first ones are all-reduced while backward goes on.
    return DistributedDataParallel(model, bucket_cap_mb=0.1)


if __name__ == "__main__":
    run("ddp", wrap, split_batch=True, description=__doc__)
