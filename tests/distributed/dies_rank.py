"""A two-rank job where rank 1 dies after joining the group: rank 0's next collective must
fail with the neuron backend's error (naming the likely cause), not hang. Run by
test_torchrun.py as two plain processes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("neuron", timeout=timedelta(seconds=20))
t = torch.ones(4, device="neuron")
dist.all_reduce(t)  # both alive: fine
if dist.get_rank() == 1:
    os._exit(3)  # dies without a word to the group
dist.all_reduce(t)
print("rank 0: the all-reduce after rank 1 died returned")
