"""torch.distributed on the neuron device: the `neuron` c10d backend.

`init_process_group("neuron")` (or `"cpu:gloo,neuron:neuron"`, or no backend at all: the
accelerator's default) makes a NeuronProcessGroup (group.py). It is a Python ProcessGroup:
PyTorch lets a Python class stand for a whole group, not for one device's backend, so it
takes CPU tensors as well (straight to gloo, nothing on the timeline).

The data path is gloo's, over the host memory behind device tensors (staging.py,
client/core/memory.py), in a gloo group this group owns: no transport here. Each collective also
takes its place on the simulated timeline of every rank (timing.py):

- it waits for the work already issued on the current stream (its inputs), then runs on the
  group's collective queue, in issue order;
- the ranks agree when it starts: the last rank's arrival (one small gloo all-reduce of the
  arrival times), so it ends at the same simulated time on every rank;
- it lasts what the cost model gives for its algorithm and links (simulator/cost_model.py:
  ring or tree over NeuronLink inside a host, hierarchical over EFA across hosts);
- work.wait() makes the current stream wait for it, as with NCCL (work.py). Outputs nobody
  waited for (DDP reads its buckets through a future) make the first op that reads them wait.

Ranks are placed on hosts by NEURON_SIM_NODE, else torchrun's node rank (GROUP_RANK) when
the job spans several nodes, else the host name. The functional collectives (DTensor,
tensor parallel) get neuron kernels (functional.py); DDP and FSDP2 get what only a C++
backend would give them (parallel.py, put in place by client/api/patches.py).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_c10d import Store
from trnsim.client.distributed import functional
from trnsim.client.distributed.errors import CollectiveError
from trnsim.client.distributed.group import NeuronProcessGroup, host_identity
from trnsim.client.distributed.staging import NAME
from trnsim.client.distributed.timing import COLLECTIVE_STREAM_BASE
from trnsim.client.distributed.work import NeuronWork

__all__ = [
    "COLLECTIVE_STREAM_BASE",
    "NAME",
    "CollectiveError",
    "NeuronProcessGroup",
    "NeuronWork",
    "host_identity",
    "register",
]


def register() -> None:
    """Called by backend.register(): `neuron` becomes a c10d backend and the default one for
    neuron tensors, and the functional collectives (DTensor, tensor parallel) get kernels."""
    dist.Backend.register_backend(NAME, _create, devices=[NAME])
    functional.register()


def _create(store: Store, rank: int, size: int, timeout: timedelta) -> NeuronProcessGroup:
    return NeuronProcessGroup(store, rank, size, timeout)
