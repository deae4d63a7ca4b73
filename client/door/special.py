"""The ops the door handles on their own, not as a one-node graph: host reads of a device
value, allocation (empty, empty_strided, the zero tensor of forward AD), resizing and other
metadata-only edits, in-place views, and nested tensors (refused with what to do instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch
from trnsim.client.core import memory, runtime
from trnsim.client.core.errors import check_device_index
from trnsim.client.core.memory import to_device
from trnsim.client.core.notes import note_placeholder
from trnsim.client.core.ops import Handler, OpSpec
from trnsim.client.core.types import Args, Kwargs, OpValue
from trnsim.simulator import shape_only

META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# set_ and resize_ only edit TensorImpl metadata; the CPU kernels do that for any device
# (the Meta ones try to grow the storage, which device storages cannot).
CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
Tensor = torch.Tensor


def _local_scalar_dense(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    rt = runtime.get()
    rt.count("ops_dispatched")
    rt.device_to_host(args[0].element_size())
    if not rt.numerics and not shape_only.is_real(args[0]):
        note_placeholder(".item() (a Python number or truth value of a tensor)")
        return _placeholder(args[0].dtype)
    return memory.to_host_alias(args[0]).item()


def _placeholder(dtype: torch.dtype) -> bool | complex | float | int:
    """Shape-only mode's value for a tensor read as a Python number (notes.PLACEHOLDER)."""
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


def empty_device_tensor(
    shape: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype | None
) -> Tensor:
    rt = runtime.get()
    dtype = dtype or torch.get_default_dtype()
    strides = _contiguous_strides(shape) if stride is None else list(stride)
    # The simulated HBM first: a tensor the device cannot hold is its OutOfMemoryError, never
    # the host allocator's error about the memory that backs it.
    block = rt.memory.allocate(_span(shape, strides) * dtype.itemsize)
    if rt.numerics:
        host = torch.empty_strided(shape, strides, dtype=dtype)
    else:  # (never filled, even with deterministic algorithms on)
        host = shape_only.empty(shape, strides, dtype)
        shape_only.forget(host)
    return rt.memory.adopt(to_device(host), block, host)


def _span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements a tensor of this geometry addresses in its storage."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))


def _empty(spec: OpSpec, args: Args, kwargs: Kwargs) -> Tensor:
    rt = runtime.get()
    rt.count("ops_dispatched")
    check_device_index(kwargs.get("device"))
    if kwargs.get("pin_memory"):
        raise RuntimeError(
            "pin_memory is not available for neuron tensors (they are not host tensors)"
        )
    memory_format = kwargs.get("memory_format")
    if spec.name == "aten::empty_strided.default":
        return empty_device_tensor(args[0], args[1], kwargs.get("dtype"))
    t = empty_device_tensor(args[0], None, kwargs.get("dtype"))
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        host = torch.empty(args[0], dtype=t.dtype, memory_format=memory_format)
        return empty_device_tensor(host.shape, host.stride(), host.dtype)
    return t


def _zero_tensor(spec: OpSpec, args: Args, kwargs: Kwargs) -> Tensor:
    """_efficientzerotensor (forward-mode AD's zero tangents): a ZeroTensor is a tensor
    without memory that only C++ backends can make; here it is zeros in device memory, which
    every op reads as the zeros it stands for."""
    check_device_index(kwargs.get("device"))
    t = empty_device_tensor(list(args[0]), None, kwargs.get("dtype"))
    return t.zero_()


def _whole_storage(t: Tensor, numel: int) -> Tensor:
    """The tensor's whole storage (numel elements) as a 1-D CPU view."""
    flat = torch.ops.aten.as_strided.default.redispatch(META, t, (numel,), (1,), 0)
    return memory.to_host_alias(flat)


def _contiguous_strides(size: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for s in reversed(size):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


def _resize(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    """resize_: metadata only when the storage is big enough, else a new storage that keeps
    the old contents (device storages cannot grow in place)."""
    self, size = args[0], list(args[1])
    runtime.get().flush("hazard")
    runtime.get().count("ops_dispatched")
    numel = 1
    for s in size:
        numel *= s
    if (self.storage_offset() + numel) * self.element_size() <= self.untyped_storage().nbytes():
        return spec.op.redispatch(CPU_KERNEL, *args, **kwargs)
    fresh = empty_device_tensor([self.storage_offset() + numel], None, self.dtype)
    old_numel = self.untyped_storage().nbytes() // self.element_size()
    if old_numel and runtime.get().numerics:
        _whole_storage(fresh, old_numel).copy_(_whole_storage(self, old_numel))
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        CPU_KERNEL,
        self,
        fresh.untyped_storage(),
        self.storage_offset(),
        size,
        _contiguous_strides(size),
    )
    return self


def _metadata(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    runtime.get().flush("hazard")  # recorded ops read the tensor as it is now
    runtime.get().count("ops_dispatched")
    return spec.op.redispatch(CPU_KERNEL, *args, **kwargs)


def _no_op(spec: OpSpec, args: Args, kwargs: Kwargs) -> None:
    return None


def _inplace_view(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    """t_, transpose_, squeeze_...: change the tensor's own sizes and strides, no data."""
    runtime.get().flush("hazard")  # recorded ops read the tensor as it is now
    runtime.get().count("ops_dispatched")
    runtime.get().count("view_ops")
    return spec.op.redispatch(META, *args, **kwargs)


_INPLACE_VIEWS = "t_ transpose_ squeeze_ unsqueeze_ as_strided_ swapdims_ swapaxes_ detach_"


def _no_nested_fast_path(spec: OpSpec, args: Args, kwargs: Kwargs) -> bool:
    """neuron has no nested tensors. nn.TransformerEncoder asks this before building one for
    its fast path: "no" sends it down its regular path (outputs at padded positions are not
    zeroed there, as PyTorch documents for that path)."""
    runtime.get().count("ops_dispatched")
    return False


def _nested(spec: OpSpec, args: Args, kwargs: Kwargs) -> NoReturn:
    raise NotImplementedError(
        f"{spec.name}: nested tensors are not supported on the neuron device; use padded "
        f"tensors with a mask (for nn.TransformerEncoder: enable_nested_tensor=False)"
    )


HANDLERS: dict[str, Handler] = {
    "aten::_local_scalar_dense.default": _local_scalar_dense,
    "aten::empty.memory_format": _empty,
    "aten::empty_strided.default": _empty,
    "aten::resize_.default": _resize,
    "aten::set_.source_Storage_storage_offset": _metadata,
    "aten::set_.source_Storage": _metadata,
    "aten::set_.source_Tensor": _metadata,
    "aten::record_stream.default": _no_op,
    "aten::_efficientzerotensor.default": _zero_tensor,
    "aten::_nested_tensor_from_mask_left_aligned.default": _no_nested_fast_path,
    "aten::_nested_tensor_from_mask.default": _nested,
    "aten::_nested_tensor_from_tensor_list.default": _nested,
}
for _name in _INPLACE_VIEWS.split():
    _packet = getattr(torch.ops.aten, _name)
    for _overload in _packet.overloads():
        HANDLERS[f"aten::{_name}.{_overload}"] = _inplace_view
