"""Device memory as PyTorch sees it: host memory tagged as the PrivateUse1 device.

A neuron tensor's storage is CPU memory: made by the C++ door over a CPU tensor's memory
when it is loaded (client/door/fast_door.cpp), else imported through DLPack with its
device type re-tagged to kDLExtDev, so data_ptr(), views and storage-level code work; the
same memory is seen as a CPU tensor by re-tagging the other way (1-2 us).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

_KDL_CPU = 1
_KDL_EXT_DEV = 12  # torch imports kDLExtDev as the PrivateUse1 device
# DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 device_type; int32 id}}:
# the device type is the little-endian int32 at byte 8 of the capsule's pointer. Both tags
# fit in its low byte and the other three bytes are zero, so one byte is rewritten.
_DEVICE_TYPE_OFFSET = ctypes.sizeof(ctypes.c_void_p)

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
# (a byte written through c_uint8.from_address costs a third of a ctypes.memset call, which
# converts its three arguments: this runs for every op's output)
_byte_at = ctypes.c_uint8.from_address
_to_dlpack = torch._C._to_dlpack
_from_dlpack = torch._C._from_dlpack
_NAME = b"dltensor"


# The C++ door's maker of neuron tensors (client/door/fast.py installs it): its storages
# give their HBM back through DeviceMemory.adopted's records, with no Python storage object
# (PyTorch counts one as a reference to the storage, and its autograd then accumulates
# gradients out of place: an allocation a real device does not make).
native_device_of: list[Callable[[torch.Tensor], torch.Tensor | None]] = []


def to_device(cpu: torch.Tensor) -> torch.Tensor:
    """A neuron tensor that owns (shares) cpu's memory, with the same sizes and strides."""
    if native_device_of:
        made = native_device_of[0](cpu)
        if made is not None:
            return made
    capsule = _to_dlpack(cpu)
    _byte_at(_get_pointer(capsule, _NAME) + _DEVICE_TYPE_OFFSET).value = _KDL_EXT_DEV
    return _from_dlpack(capsule)


def to_host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing a neuron tensor's memory (no copy, no sync). DLPack has no
    conjugate or negative bit: such views are aliased plain and the bit set again."""
    if t.is_conj():
        return to_host_alias(t.conj()).conj()
    if t.is_neg():
        return to_host_alias(t._neg_view())._neg_view()
    capsule = _to_dlpack(t)
    _byte_at(_get_pointer(capsule, _NAME) + _DEVICE_TYPE_OFFSET).value = _KDL_CPU
    return _from_dlpack(capsule)
