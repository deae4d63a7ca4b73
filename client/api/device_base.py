"""What torch.neuron's calls stand on: the device argument they take, its check, and the
runtime with the work recorded so far enqueued."""

from __future__ import annotations

import torch
from trnsim.client.core import runtime
from trnsim.client.core.errors import check_device_index

# What torch.cuda's calls take for a device: a torch.device, "neuron:0", or an index.
DeviceLike = torch.device | str | int


def check_index(device: DeviceLike | None) -> None:
    """A device argument names neuron:0, the one device of the process (None: the current)."""
    if device is None:
        return
    if isinstance(device, int):
        device = torch.device("neuron", device)
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"expected a neuron device, got {device}")
    check_device_index(device)


def flushed() -> runtime.Runtime:
    """The runtime, with anything recorded (adaptive mode) enqueued first."""
    rt = runtime.get()
    rt.flush("sync")
    return rt
