"""Every change trnsim makes to PyTorch's own objects, each with its reason, each made once.

A Python device backend reaches PyTorch through official hooks (PrivateUse1 kernels, the
device module, c10d backends), but some of what torch.cuda does lives in C++ interfaces a
Python backend cannot implement. There, and only there, a PyTorch function is replaced by
one that serves neuron and hands every other device to the original. The replacements live
with the code they serve (ties.py, accelerator.py, pinned.py, torch_profiler.py,
autocast.py, distributed/parallel.py, layouts.py); putting them in place, and the guard
that does so once per process, are here. backend.register() installs them at `import
torch`, in this file's order, but for two that wait for their module's import, FSDP2's and
FakeTensor's (importing either at `import torch` costs time).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

_installed: set[str] = set()  # the patches in place, by name


def _once(patch: Callable[[], None]) -> Callable[[], None]:
    """The one guard: `patch` runs the first time it is called in the process, never again."""

    @functools.wraps(patch)
    def install() -> None:
        if patch.__name__ in _installed:
            return
        _installed.add(patch.__name__)
        patch()

    return install


def installed() -> frozenset[str]:
    """The names of the patches in place."""
    return frozenset(_installed)


@_once
def module_apply_keeps_ties() -> None:
    """Module._apply (.to(), .half()...) swaps a parameter's data in place only between
    tensors PyTorch deems shallow-copy compatible, never CPU and PrivateUse1: tied weights
    would come back as two copies and parameters as new objects (an optimizer built before
    `.to("neuron")` would step stale ones). client/api/ties.py re-ties them and keeps their
    identity, as on CUDA."""
    from trnsim.client.api import ties

    torch.nn.Module._apply = ties.keep_ties(torch.nn.Module._apply)  # type: ignore[method-assign]


@_once
def accelerator_calls_reach_neuron() -> None:
    """torch.accelerator.synchronize() and its memory_* calls reach a device guard's
    synchronizeDevice and a DeviceAllocator, C++ interfaces a Python backend cannot
    implement (they fail on internal asserts): with neuron the current accelerator, each is
    answered by its torch.neuron equivalent (client/api/accelerator.py)."""
    from torch.accelerator import memory
    from trnsim.client.api import accelerator

    for name, target, takes_device in accelerator.routes():
        original = getattr(torch.accelerator, name)
        routed = accelerator.route(original, target, takes_device)
        setattr(torch.accelerator, name, routed)
        if getattr(memory, name, None) is original:
            setattr(memory, name, routed)


@_once
def tensor_pinning_for_neuron() -> None:
    """PyTorch pins through the backend's getPinnedMemoryAllocator hook, which a Python
    backend cannot provide, and dispatches pin_memory on the CPU tensor, never reaching a
    neuron kernel: tensor.pin_memory() and is_pinned() for neuron are answered by
    client/core/pinned.py (DataLoader(pin_memory=True) calls them)."""
    from trnsim.client.core import pinned

    torch.Tensor.pin_memory = pinned.wrap_pin_memory(torch.Tensor.pin_memory)  # type: ignore[method-assign]
    torch.Tensor.is_pinned = pinned.wrap_is_pinned(torch.Tensor.is_pinned)  # type: ignore[method-assign]


@_once
def torch_profiler_sees_the_device() -> None:
    """A real accelerator's profiler plugin is C++ (a kineto IActivityProfiler), which a
    Python backend cannot register: torch.profiler.profile's __exit__, event parsing and
    trace export are wrapped so that the simulated chip's launches get device time in its
    tables and traces (client/core/torch_profiler.py)."""
    from torch.autograd import profiler as autograd_profiler
    from trnsim.client.core import runtime, torch_profiler

    def synchronize() -> None:  # (no runtime yet: nothing launched)
        if runtime.initialized():
            runtime.get().synchronize()

    cls = autograd_profiler.profile
    cls.__exit__ = torch_profiler.wrap_exit(cls.__exit__, synchronize)  # type: ignore[method-assign]
    cls._ensure_function_events = torch_profiler.wrap_ensure_function_events(  # type: ignore[method-assign]
        cls._ensure_function_events
    )
    cls.export_chrome_trace = torch_profiler.wrap_export_chrome_trace(  # type: ignore[method-assign]
        cls.export_chrome_trace
    )


@_once
def autocast_defaults_to_bfloat16() -> None:
    """torch.autocast("neuron") without a dtype should mean bfloat16, the NeuronCore's
    native type, but PyTorch's per-thread default for PrivateUse1 is float16 and no backend
    hook sets it: autocast.__init__ sets it on each thread's first autocast on neuron
    (client/api/autocast.py; torch.set_autocast_dtype still wins)."""
    from trnsim.client.api import autocast

    cls = torch.amp.autocast_mode.autocast
    cls.__init__ = autocast.bfloat16_first(cls.__init__)  # type: ignore[method-assign]


@_once
def ddp_refuses_used_parameter_map() -> None:
    """DDP with find_unused_parameters or static_graph copies its map of used parameters
    through pinned host memory that PyTorch's C++ reducer asks the device backend for, which
    a Python backend cannot provide: its backward would stop on a PyTorch-internal error.
    DDP over neuron parameters refuses them at construction instead, saying what to do, and
    takes no device_ids (distributed/parallel.py)."""
    from trnsim.client.distributed import parallel

    ddp = torch.nn.parallel.DistributedDataParallel
    ddp.__init__ = parallel.ddp_init(ddp.__init__)  # type: ignore[method-assign]


@_once
def fsdp_parks_storage() -> None:
    """FSDP2 frees an unsharded parameter by resizing its storage to 0 bytes and brings it
    back by resizing it again, which PyTorch lets only C++ backends implement. For neuron
    tensors its two helpers return the storage's HBM to the allocator and take it again
    (DeviceMemory.park/unpark, client/core/device_memory.py): the memory accounting is FSDP's, the bytes stay on the host."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:  # (a torch without FSDP2)
        return
    from trnsim.client.distributed import parallel

    alloc = parallel.fsdp_alloc_storage(_fsdp_param.alloc_storage)
    _fsdp_param.free_storage = parallel.fsdp_free_storage(_fsdp_param.free_storage)  # type: ignore[assignment]
    _fsdp_param.alloc_storage = alloc  # type: ignore[assignment]
    _fsdp_param_group.alloc_storage = alloc  # type: ignore[assignment]


@_once
def fake_convolutions_lay_out_as_on_cpu() -> None:
    """On a device it cannot name, FakeTensor (dynamo, AOTAutograd, any backend) lays a
    convolution's outputs out contiguously where the CPU keeps channels_last: its rules for
    the convolutions lay a neuron convolution's outputs out as eager dispatch does
    (client/core/layouts.py). Installed once torch._subclasses.fake_impls is imported."""
    from torch._subclasses import fake_impls
    from trnsim.client.core import layouts

    table = fake_impls.op_implementations_dict
    for op in layouts.CONVOLUTIONS:
        rule = table.get(op)
        if rule is not None:
            table[op] = layouts.fake_rule(rule)
