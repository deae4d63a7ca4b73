"""DDP and FSDP2 over neuron modules: what they need that only a C++ device backend gives,
done here (client/api/patches.py puts these wrappers in place)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from trnsim.client.core import runtime
from trnsim.client.distributed.errors import CollectiveError
from trnsim.client.distributed.staging import NAME

Tensor = torch.Tensor
DdpInit = Callable[..., None]  # DistributedDataParallel.__init__
StorageFn = Callable[[Tensor], None]  # FSDP2's free_storage and alloc_storage


def _on_neuron(module: torch.nn.Module | None) -> bool:
    return module is not None and any(p.device.type == NAME for p in module.parameters())


def _used_map_message(wanted: list[str]) -> str:
    return (
        f"DistributedDataParallel({'=True, '.join(wanted)}=True) on neuron: PyTorch's "
        f"reducer copies its map of used parameters through pinned host memory, which "
        f"only a C++ device backend can allocate. Let every parameter take part in each "
        f"step's loss, or freeze the ones a step leaves out (requires_grad_(False)), "
        f"and construct DDP without it (transformers.Trainer: "
        f"TrainingArguments(ddp_find_unused_parameters=False))"
    )


def ddp_init(original: DdpInit) -> DdpInit:
    """DDP's __init__, refusing find_unused_parameters and static_graph over neuron
    parameters (their map of used parameters needs pinned memory from the C++ backend: the
    backward would stop on a PyTorch-internal error) and dropping device_ids."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: torch.nn.Module, *args: object, **kwargs: object) -> None:
        bound = signature.bind(self, *args, **kwargs).arguments
        wanted = [k for k in ("find_unused_parameters", "static_graph") if bound.get(k)]
        module = bound.get("module")
        if wanted and _on_neuron(module):
            raise NotImplementedError(_used_map_message(wanted))
        if bound.get("device_ids") and _on_neuron(module):
            # accelerate passes device_ids=[local rank]: here the one core of this process,
            # neuron:0 in it. DDP over a module on one device takes none.
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
            args = tuple(None if i in (1, 2) else a for i, a in enumerate(args))
        original(self, *args, **kwargs)

    return __init__


def fsdp_free_storage(free: StorageFn) -> StorageFn:
    """FSDP2's free_storage: a neuron tensor's storage gives its HBM back (DeviceMemory.park);
    its bytes stay on the host (PyTorch lets only C++ backends resize a storage to 0)."""

    def free_storage(tensor: Tensor) -> None:
        if tensor.device.type != NAME:
            return free(tensor)
        runtime.get().memory.park(tensor.untyped_storage())
        return None

    return free_storage


def fsdp_alloc_storage(alloc: StorageFn) -> StorageFn:
    """FSDP2's alloc_storage: a parked neuron storage takes HBM again (Runtime.unpark)."""

    def alloc_storage(tensor: Tensor) -> None:
        if tensor.device.type != NAME:
            return alloc(tensor)
        storage = tensor.untyped_storage()
        if storage.nbytes() < tensor.numel() * tensor.itemsize:
            raise CollectiveError(
                f"FSDP asked a neuron storage of {storage.nbytes()} bytes to grow to "
                f"{tensor.numel() * tensor.itemsize}; neuron storages cannot grow in place"
            )
        runtime.get().memory.unpark(storage)
        return None

    return alloc_storage
