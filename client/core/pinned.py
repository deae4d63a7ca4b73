"""Pinned host memory for the neuron device: tensor.pin_memory(), tensor.is_pinned() and
DataLoader(pin_memory=True).

PyTorch pins through the backend's PrivateUse1 hooks (getPinnedMemoryAllocator), which a
Python backend cannot provide, and dispatches pin_memory on the CPU tensor, never reaching
a neuron kernel. So the Tensor methods are wrapped: when neuron is the device asked for (or
the current accelerator), pin_memory returns a copy in memory the runtime marks as pinned.
A non_blocking copy from pinned memory to the device is a DMA on the stream and the host goes
on, as from page-locked memory on a real device; from pageable memory the host is busy for
the transfer. Other devices' pinning is untouched. (client/api/patches.py puts the wrapped
methods in place.)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch

Device = torch.device | str | int
PinMemory = Callable[..., torch.Tensor]  # Tensor.pin_memory(self, device=None)
IsPinned = Callable[..., bool]  # Tensor.is_pinned(self, device=None)

# data_ptr -> its storage (while it lives)
_pinned: dict[int, weakref.ref[torch.UntypedStorage]] = {}


def is_pinned(t: torch.Tensor) -> bool:
    """Whether t is a CPU tensor in memory pinned for neuron."""
    if not t.is_cpu:
        return False
    storage = t.untyped_storage()
    ref = _pinned.get(storage.data_ptr())
    return ref is not None and ref() is storage


def _for_neuron(device: Device | None) -> bool:
    if device is not None:
        return torch.device(device).type == "neuron"
    current = torch.accelerator.current_accelerator()
    return current is not None and current.type == "neuron"


def mark(t: torch.Tensor) -> None:
    """t (a CPU tensor the runtime allocated) is pinned memory from now on."""
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    if ptr:
        _pinned[ptr] = weakref.ref(storage, lambda _: _pinned.pop(ptr, None))


def _pin(t: torch.Tensor) -> torch.Tensor:
    pinned = torch.empty_like(t, memory_format=torch.preserve_format).copy_(t)
    mark(pinned)
    return pinned


def wrap_pin_memory(original: PinMemory) -> PinMemory:
    """Tensor.pin_memory: for neuron, a copy in memory the runtime marks as pinned."""

    @functools.wraps(original)
    def pin_memory(self: torch.Tensor, device: Device | None = None) -> torch.Tensor:
        if not self.is_cpu or not _for_neuron(device):
            return original(self) if device is None else original(self, device)
        return self if is_pinned(self) else _pin(self)

    return pin_memory


def wrap_is_pinned(original: IsPinned) -> IsPinned:
    """Tensor.is_pinned: for neuron, whether the memory is marked as pinned."""

    @functools.wraps(original)
    def is_pinned_method(self: torch.Tensor, device: Device | None = None) -> bool:
        if not self.is_cpu or not _for_neuron(device):
            return original(self) if device is None else original(self, device)
        return is_pinned(self)

    return is_pinned_method
