"""torch.accelerator's device calls, served by torch.neuron when neuron is the accelerator.

torch.accelerator.synchronize() and its memory_* calls reach C++ interfaces (a device
guard's synchronizeDevice, a DeviceAllocator) that a Python backend cannot implement: they
fail with internal asserts. Where the current accelerator is neuron, each of these calls is
answered by its torch.neuron equivalent; for any other accelerator they are untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

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


def _route(original: Callable[..., Any], name: str, takes_device: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any) -> Any:
        if not _on_neuron():
            return original(*args)
        target = getattr(torch.neuron, name)
        return target(*args) if takes_device else target()

    return call


_installed: list[bool] = []


def install() -> None:
    """Once per process (on `import torch`, with the neuron backend)."""
    from torch.accelerator import memory

    if _installed:
        return
    _installed.append(True)
    for table, takes_device in ((ROUTES, True), (NO_ARGUMENT, False)):
        for name, target in table.items():
            original = getattr(torch.accelerator, name)
            routed = _route(original, target, takes_device)
            setattr(torch.accelerator, name, routed)
            if getattr(memory, name, None) is original:
                setattr(memory, name, routed)
