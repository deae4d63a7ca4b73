"""torch.accelerator's device calls, served by torch.neuron when neuron is the accelerator.

torch.accelerator.synchronize() and its memory_* calls reach C++ interfaces (a device
guard's synchronizeDevice, a DeviceAllocator) that a Python backend cannot implement: they
fail with internal asserts. Where the current accelerator is neuron, each of these calls is
answered by its torch.neuron equivalent; for any other accelerator they are untouched
(client/api/patches.py puts the routes in place).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

R = TypeVar("R")

# torch.accelerator name -> torch.neuron name
ROUTES = {
    "synchronize": "synchronize",
    "memory_stats": "memory_stats",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "get_memory_info": "mem_get_info",
}
NO_ARGUMENT = {"empty_cache": "empty_cache"}


def _on_neuron() -> bool:
    current = torch.accelerator.current_accelerator()
    return current is not None and current.type == "neuron"


def routes() -> list[tuple[str, str, bool]]:
    """(torch.accelerator name, torch.neuron name, whether it takes a device) of each call."""
    return [
        *((name, target, True) for name, target in ROUTES.items()),
        *((name, target, False) for name, target in NO_ARGUMENT.items()),
    ]


def route(original: Callable[..., R], name: str, takes_device: bool) -> Callable[..., R]:
    """`original`, answered by torch.neuron's `name` while neuron is the accelerator."""

    @functools.wraps(original)
    def call(*args: object) -> R:
        if not _on_neuron():
            return original(*args)
        target = getattr(torch.neuron, name)
        return target(*args) if takes_device else target()  # type: ignore[no-any-return]

    return call
