"""Device memory as PyTorch sees it: host memory tagged as the PrivateUse1 device.

A neuron tensor's storage is CPU memory imported through DLPack with its device type
re-tagged to kDLExtDev, so data_ptr(), views and storage-level code work; the same memory
is seen as a CPU tensor by re-tagging the other way (1-2 us).
"""

from __future__ import annotations

import ctypes

import torch
from torch.utils import dlpack

_KDL_CPU = 1
_KDL_EXT_DEV = 12  # torch imports kDLExtDev as the PrivateUse1 device


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLTensorHead(ctypes.Structure):
    # DLManagedTensor starts with DLTensor: data pointer, then the device.
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _retag(capsule: object, device_type: int) -> object:
    head = _DLTensorHead.from_address(_get_pointer(capsule, b"dltensor"))
    head.device.device_type = device_type
    head.device.device_id = 0
    return capsule


def to_device(cpu: torch.Tensor) -> torch.Tensor:
    """A neuron tensor that owns (shares) cpu's memory, with the same sizes and strides."""
    return torch.from_dlpack(_retag(dlpack.to_dlpack(cpu), _KDL_EXT_DEV))  # type: ignore[arg-type]


def to_host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing a neuron tensor's memory (no copy, no sync)."""
    return torch.from_dlpack(_retag(dlpack.to_dlpack(t), _KDL_CPU))  # type: ignore[arg-type]
