"""Registers the neuron device with PyTorch: the PrivateUse1 backend and its kernels."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

import torch
from torch.serialization import STORAGE
from trnsim.client.core.types import Args, Kwargs, Op, OpValue

if TYPE_CHECKING:
    from trnsim.client.core.ops import OpSpec

_state: dict[str, object] = {}  # what registering made, kept alive (libraries, hooks)


class _Hooks(torch._C._acc.PrivateUse1Hooks):  # type: ignore[misc,name-defined]
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):  # type: ignore[misc,name-defined]
    def type_(self) -> torch._C._autograd.DeviceType:  # type: ignore[override]
        # (the C++ guard takes the DeviceType; torch's stub names a device's other forms)
        return torch._C._autograd.DeviceType.PrivateUse1


def _fallback(op: Op, *args: OpValue, **kwargs: OpValue) -> OpValue:
    spec = _specs.get(op)
    if spec is None:  # (the rest runs for every op the fallback takes: one dict lookup)
        spec = _first_sight(op)
    return _enter(spec, args, kwargs)


def _first_sight(op: Op) -> OpSpec:
    """The door's spec of an op the fallback meets for the first time (memoised), unless it
    has a CPU kernel only (_cpu_only): refused, every time."""
    if "direct" not in _state:
        _register_direct_kernels()
    if op.namespace != "aten" and _cpu_only(op.name()):
        raise NotImplementedError(_cpu_only_message(op.name()))
    from trnsim.client.door.kernel import ready

    spec = _specs[op] = ready(op)
    return spec


_specs: dict[Op, OpSpec] = {}  # op -> the door's spec of it, for the ops the fallback took
# The door (client/door/kernel.py), bound on the first neuron op: an import statement in
# _fallback would cost a microsecond on every op (it looks the module's spec up each time).
_enter: Callable[[OpSpec, Args, Kwargs], OpValue]


def _cpu_only(name: str) -> bool:
    """An op outside ATen with a CPU kernel and none for neuron, nor one made of other ops
    (a torch.library op registered for device_types="cpu"): its CPU kernel is CPU code,
    and running it on the device's memory without a word would hide a missing kernel.
    (c10d's CPU-only ops belong to gloo's process groups; the neuron group has its own.)"""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (
        not name.startswith("c10d::")
        and has(name, "CPU")
        and not any(
            has(name, key)
            for key in (
                "PrivateUse1",
                "CompositeImplicitAutograd",
                "CompositeExplicitAutograd",
                "CompositeExplicitAutogradNonFunctional",
            )
        )
    )


def _cpu_only_message(name: str) -> str:
    return (
        f"{name} has a kernel for the CPU only, none for neuron. Give it one: "
        f"torch.neuron.register_kernel({name.split('.')[0]}, cost=...) runs its CPU "
        f"implementation as one neuron kernel with the cost you declare (README: custom "
        f"kernels); or register it without device_types (or for 'neuron' too) if its body "
        f"is made of PyTorch ops; or move its inputs to the CPU with .cpu() first."
    )


def _wants_direct_kernel(name: str) -> bool:
    """Ops that would otherwise decompose before reaching the backend: structured ops
    (CompositeExplicitAutogradNonFunctional), composites CPU replaces with its own kernel,
    foreach ops (one executable for the whole list instead of one per tensor), and the
    composites in _WHOLE."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(name, "PrivateUse1") or not name.startswith("aten::"):
        return False
    if name in _WHOLE:
        return True
    if has(name, "CompositeExplicitAutogradNonFunctional"):
        return True
    if has(name, "CompositeExplicitAutograd"):
        # convolution: without it the backend gets convolution_overrideable, which only
        # C++ backends implement; the CPU runs its own convolution kernels beneath.
        return has(name, "CPU") or name.startswith(("aten::_foreach_", "aten::convolution"))
    return False


# Composites whose own kernel reaches the device through out= variants (arange.start_out,
# logical_not.out over an empty tensor), which never join a graph: taken whole, as one op,
# they do (dynamo's and AOTAutograd's graphs make aranges for positions and _safe_softmax
# for attention; transformers' attention masks call logical_not, T5's buckets abs).
_WHOLE = frozenset(
    [
        "aten::arange",
        "aten::arange.start",
        "aten::arange.start_step",
        "aten::_safe_softmax",
        "aten::logical_not",
        "aten::logical_and",
        "aten::logical_or",
        "aten::logical_xor",
        "aten::abs",
    ]
)


def _register_direct_kernels() -> None:
    """Once, on the first neuron op (kept out of `import torch`: about 20 ms)."""
    global _enter
    from trnsim.client.door.kernel import enter, ready

    _enter = enter
    from trnsim.client.door import fast

    lib = torch.library.Library("aten", "IMPL")
    names: list[str] = []
    for name in torch._C._dispatch_get_all_op_names():
        if not _wants_direct_kernel(name):
            continue
        base, _, overload = name[len("aten::") :].partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")

        def direct(
            *args: OpValue,
            _op: Op = op,
            _spec: list[OpSpec] = [],  # noqa: B006  (filled once: the op's spec)
            **kwargs: OpValue,
        ) -> OpValue:
            if not _spec:  # (the door's spec of the op, kept here from its first call on)
                _spec.append(ready(_op))
            return enter(_spec[0], args, kwargs)

        lib.impl(name[len("aten::") :], direct, _PYTHON_KEY[0])
        names.append(name[len("aten::") :])
    door = fast.module()
    if door is not None:  # (the C++ door before each, as before every op the fallback takes)
        door.register_door(names, False)
        fast.direct_kernels_registered()
    _state["direct"] = lib
    _state["direct_count"] = len(names)


# Ops whose PrivateUse1 kernel is registered directly, not reached through the fallback:
# `torch.tensor(data, device="neuron")` under FakeTensorMode (dynamo tracing a model that
# makes one, as transformers' KV caches do) copies the data to the device with the Python
# dispatch key excluded, where PyTorch's fallback trampoline fails an internal assert
# (python_dispatch.cpp: func != nullptr) and a direct kernel does not.
_DIRECT_ALWAYS = ("empty.memory_format", "empty_strided", "_copy_from")


def _register_early_kernels() -> torch.library.Library:
    """Behind the C++ door (which makes empty tensors and copies between neuron tensors
    itself when warm) when it is loaded."""
    from trnsim.client.door import fast

    lib = torch.library.Library("aten", "IMPL")
    for name in _DIRECT_ALWAYS:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        lib.impl(name, functools.partial(_fallback, op), _PYTHON_KEY[0])
    door = fast.module()
    if door is not None:
        door.register_door(list(_DIRECT_ALWAYS), False)
    # _to_copy's own kernel for the device is its composite one (empty + copy_), which the
    # dispatcher would pick anyway: registered directly for the same reason.
    lib.impl("_to_copy", _to_copy, "PrivateUse1")
    return lib


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _to_copy(self: torch.Tensor, **kwargs: OpValue) -> torch.Tensor:
    """PyTorch's composite, except a non_blocking copy to the CPU: the composite would put it
    in pinned memory through the PrivateUse1 hooks' pinned allocator, which a Python backend
    cannot provide. Here the destination is pinned memory of client/core/pinned.py, and the copy
    a DMA on the current stream that the host does not wait for (as from CUDA)."""
    to_copy = torch.ops.aten._to_copy.default
    device = kwargs.get("device")
    if (
        not kwargs.get("non_blocking")
        or device is None
        or torch.device(device).type != "cpu"
        or self.layout != torch.strided
    ):
        return to_copy.redispatch(_COMPOSITE, self, **kwargs)  # type: ignore[no-any-return]
    from trnsim.client.core import pinned

    out = torch.empty_like(
        self,
        dtype=kwargs.get("dtype") or self.dtype,
        device="cpu",
        memory_format=kwargs.get("memory_format") or torch.preserve_format,
    )
    pinned.mark(out)
    return out.copy_(self, non_blocking=True)


def _tag(obj: STORAGE) -> str | None:
    return (
        "neuron"
        if getattr(obj, "device", None) is not None and obj.device.type == "neuron"
        else None
    )


def _restore(obj: STORAGE, location: str) -> STORAGE | None:
    """torch.load: storages saved from neuron (or map_location="neuron") come back on it."""
    if not location.startswith("neuron"):
        return None
    from trnsim.client.core.memory import to_host_alias
    from trnsim.client.door.special import empty_device_tensor

    if obj.device.type == "neuron":
        return obj
    nbytes = obj.nbytes()
    t = empty_device_tensor([nbytes], None, torch.uint8)
    if nbytes:
        to_host_alias(t).copy_(torch.empty(0, dtype=torch.uint8).set_(obj))
    return t.untyped_storage()


def skip_in_dynamo() -> None:
    """Dynamo must never trace trnsim's own Python: the device's kernels, which run from
    C++ dispatch inside a compiled function's eager parts (an .item() at a graph break), and
    the runtime a compiled function reaches through torch.neuron or an optimizer. Whatever
    the backend (neuron, aot_eager, eager...): registered when torch._dynamo is imported."""
    from torch._dynamo import trace_rules

    for package in ("client", "simulator", "compiler", "policy", "protos", "daemon"):
        trace_rules.add(f"trnsim.{package}")


INDUCTOR_MESSAGE = (
    "Inductor (torch.compile's default backend) cannot generate code for neuron tensors. "
    'Use torch.compile(model, backend="neuron"), or call '
    'torch.compiler.set_default_backend("neuron") once before torch.compile(model).'
)


class _NoInductorScheduling:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(INDUCTOR_MESSAGE)


class _NoInductorWrapper:
    supports_caching = False

    @staticmethod
    def create(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(INDUCTOR_MESSAGE)


def _inductor_names_neuron_backend() -> None:
    """torch.compile(model) with inductor on neuron tensors: an error that says which
    backend to use, instead of inductor's KeyError: 'neuron' from its device tables."""
    from torch._inductor.codegen import common

    common.register_device_op_overrides("neuron", common.DeviceOpOverrides())
    common.register_backend_for_device(
        "neuron",
        _NoInductorScheduling,  # type: ignore[arg-type]
        _NoInductorWrapper,  # type: ignore[arg-type]
        _NoInductorWrapper,  # type: ignore[arg-type]
        _NoInductorWrapper,  # type: ignore[arg-type]
    )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function once a module has been imported (torch._dynamo: importing it at
    `import torch` would cost a second)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            self.then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: Callable[[], None]) -> None:
    """then() once module `name` is imported (now, if it is)."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def register() -> None:
    """Called through the torch.backends entry point during `import torch`: stays cheap."""
    if "hooks" in _state:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    from trnsim.client.api import device

    torch._register_device_module("neuron", device)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    hooks, guard = _Hooks(), _Guard()
    _state["hooks"], _state["guard"] = hooks, guard
    torch._C._acc.register_python_privateuseone_hook(hooks)
    torch._C._acc.register_python_privateuseone_device_guard(guard)
    _state["fallback"] = _register_fallback()
    from trnsim.client.door import sparse

    _state["sparse"] = sparse.register()  # sparse COO and compressed tensors
    _state["early"] = _register_early_kernels()
    _state["bits"] = _copy_from_keeps_math_bits()
    torch.serialization.register_package(11, _tag, _restore)
    after_import("torch._dynamo", skip_in_dynamo)
    from trnsim.client.api import patches  # (every change to PyTorch's own objects)

    # FakeTensor lays a neuron convolution's outputs out as eager dispatch does
    after_import("torch._subclasses.fake_impls", patches.fake_convolutions_lay_out_as_on_cpu)
    after_import("torch._inductor.codegen.common", _inductor_names_neuron_backend)
    from trnsim.client.core import runtime
    from trnsim.client.modes import adaptive

    runtime.RECORDING_MODES["adaptive"] = adaptive.Adaptive  # (the runtime imports no mode)

    patches.module_apply_keeps_ties()  # .to("neuron") keeps tied weights tied
    patches.accelerator_calls_reach_neuron()  # torch.accelerator.synchronize() etc.
    from trnsim.client.api import neuronx

    neuronx.install()  # accelerate and transformers find the neuron device (a stand-in)
    patches.tensor_pinning_for_neuron()  # tensor.pin_memory(), DataLoader(pin_memory=True)
    patches.torch_profiler_sees_the_device()  # ProfilerActivity.PrivateUse1: device time
    from trnsim.client.door import meta_kernels

    _state["meta"] = meta_kernels.register()  # shapes of the ops only the device runs
    from trnsim.client.api import explain
    from trnsim.client.core import shapes

    shapes.start_from_env()  # NEURON_RECORD_SHAPES
    explain.write_at_exit()  # NEURON_EXPLAIN
    from trnsim.client.api import autocast
    from trnsim.client.door import attention

    patches.autocast_defaults_to_bfloat16()  # torch.autocast("neuron"): bfloat16
    _state["autocast"] = autocast.register()
    _state["attention"] = attention.register()  # SDPA's fused backend, as the CPU picks it
    if torch.distributed.is_available():
        _register_distributed()


# The key the Python door's kernels are registered under: PrivateUse1, or PrivateUse2 behind
# the C++ door (client/door/fast.py), which hands the calls it does not serve on to them.
_PYTHON_KEY = ["PrivateUse1"]


def _register_fallback() -> torch.library.Library:
    """The Python door as every op's fallback; behind the C++ door when it loads (built on
    first use)."""
    lib = torch.library.Library("_", "IMPL")
    from trnsim.client.door import fast

    door = fast.load()
    if door is None:
        lib.fallback(_fallback, "PrivateUse1")
        return lib
    _PYTHON_KEY[0] = "PrivateUse2"
    lib.fallback(_fallback, "PrivateUse2")
    door.register_door([], True)
    fast.install(door)
    from trnsim.client.core import runtime

    runtime.MODE_HOOKS.append(fast.mode_set)
    return lib


def _copy_from_keeps_math_bits() -> torch.library.Library:
    """Like copy_, _copy_from takes conjugate/negative views as they are (the host alias
    keeps the bit); materialising them first would call _copy_from again, forever."""
    bits = torch.library.Library("aten", "IMPL")
    for key in ("Conjugate", "Negative"):
        bits.impl("_copy_from", torch.library.fallthrough_kernel, key)
    return bits


def _register_distributed() -> None:
    """The neuron process group and what torch.distributed's wrappers need on neuron."""
    from trnsim.client import distributed
    from trnsim.client.api import patches

    distributed.register()  # init_process_group("neuron"), FSDP2, DTensor
    patches.ddp_refuses_used_parameter_map()  # DDP: a clear error, not an internal one
    # FSDP2 frees and brings back neuron storages (once FSDP2 is imported: it is slow)
    after_import(
        "torch.distributed.fsdp._fully_shard._fsdp_param_group", patches.fsdp_parks_storage
    )
