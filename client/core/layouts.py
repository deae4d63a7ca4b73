"""Output layouts as the CPU's kernels choose them, where PyTorch's Meta kernels for a
PrivateUse1 device choose others: convolution.

The simulator computes every op with the CPU's kernel, so a device tensor should lie in
memory as the CPU's result does. For most ops the Meta kernel agrees with the CPU. A
convolution does not: on a device it cannot name, PyTorch picks the "overrideable" backend
and a contiguous output, while the CPU (as cuDNN on CUDA) keeps a channels_last input's
channels_last layout. Layout is not only performance: dropout, bernoulli and every random op
draw in memory order, so a channels_last activation on the CPU and a contiguous one on the
device get different masks from the same seed (transformers' Segformer decode head).

Both ways a device learns an output's metadata take the CPU's layout from here:
the op layer and recording (client/core/ops.py, from the Meta kernel's outputs) and
FakeTensor, which compiled mode's AOTAutograd traces with (fake_rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.fx.operator_schemas import normalize_function
from trnsim.client.core.types import Args, Kwargs, Op, OpValue

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

aten = torch.ops.aten
CONVOLUTIONS = (
    aten.convolution.default,
    aten._convolution.default,
    aten._convolution.deprecated,
    aten.convolution_backward.default,
)
_NAMES = frozenset(
    f"aten::{op._schema.name.split('::')[1]}.{op._overloadname}" for op in CONVOLUTIONS
)
DEVICE = "neuron"


def chooses_layout(op_name: str) -> bool:
    """Whether the op's outputs take another layout on the CPU than its Meta kernel says."""
    return op_name in _NAMES


def cpu_memory_format(op: Op, args: Args, kwargs: Kwargs) -> torch.memory_format | None:
    """The memory format the CPU's kernel gives a convolution's outputs (input gradient and
    weight gradient for convolution_backward), or None to keep the Meta kernel's: symbolic
    sizes, or arguments the schema does not take. Only metadata is read."""
    normalized = normalize_function(op, args, kwargs, normalize_to_only_use_kwargs=True)
    if normalized is None:
        return None
    given = normalized.kwargs
    source, weight = given["input"], given["weight"]
    if not _concrete(source) or not _concrete(weight):
        return None
    cpu_input, cpu_weight = _stand_in(source), _stand_in(weight)
    bias = given.get("bias")
    select: Kwargs = {
        "stride": given["stride"],
        "padding": given["padding"],
        "dilation": given["dilation"],
        "transposed": given["transposed"],
        "output_padding": given["output_padding"],
        "groups": given["groups"],
        "bias": _stand_in(bias) if isinstance(bias, torch.Tensor) else None,
    }
    if bias is None:
        select["bias_sizes"] = given.get("bias_sizes")
    backend = torch._C._select_conv_backend(cpu_input, cpu_weight, **select)
    if cpu_weight.dim() == 3:  # (conv1d is run as a 2-d convolution of height 1)
        cpu_input, cpu_weight = cpu_input.contiguous().unsqueeze(2), cpu_weight.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(cpu_input, cpu_weight, backend)


def restride(t: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """A meta tensor of t's size and dtype laid out in memory_format (3-d tensors as 4-d
    ones of height 1, as the CPU's convolution does)."""
    if t.dim() == 3 and memory_format == torch.channels_last:
        shaped = torch.empty((t.shape[0], t.shape[1], 1, t.shape[2]), dtype=t.dtype, device="meta")
        return shaped.to(memory_format=memory_format).squeeze(2)
    if t.dim() != 4 and memory_format == torch.channels_last:
        return t
    if t.dim() != 5 and memory_format == torch.channels_last_3d:
        return t
    return torch.empty(t.shape, dtype=t.dtype, device="meta", memory_format=memory_format)


def as_on_cpu(
    op: Op,
    args: Args,
    kwargs: Kwargs,
    out: Args,
    wrap: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Args:
    """A convolution's Meta outputs with the strides the CPU's kernel gives them (each new
    meta tensor passed through wrap(old, new) when given: FakeTensor's rule)."""
    memory_format = cpu_memory_format(op, args, kwargs)
    if memory_format is None:
        return out
    laid = 2 if op is aten.convolution_backward.default else 1  # (not the bias gradient)
    return tuple(
        (wrap or _new)(t, restride(t, memory_format))
        if j < laid and isinstance(t, torch.Tensor)
        else t
        for j, t in enumerate(out)
    )


def _new(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return new


def _concrete(t: object) -> bool:
    return isinstance(t, torch.Tensor) and not any(
        isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride())
    )


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of t's sizes, strides and dtype, for the CPU's layout rules (its memory
    is reserved, never touched)."""
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype)


FakeRule = Callable[..., OpValue]  # a FakeTensor implementation: (mode, func, *args, **kwargs)


def fake_rule(rule: FakeRule) -> FakeRule:
    """FakeTensor's rule for a convolution, giving a neuron convolution's outputs the CPU's
    layout too: AOTAutograd's graphs (compiled mode) then hold the strides eager dispatch
    gives. (client/api/patches.py puts it in FakeTensor's table.)"""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    def conv(mode: FakeTensorMode, func: Op, *args: OpValue, **kwargs: OpValue) -> OpValue:
        out = rule(mode, func, *args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        if not isinstance(first, FakeTensor) and isinstance(out, tuple):
            first = out[1]
        if not isinstance(first, FakeTensor) or first.fake_device.type != DEVICE:
            return out
        with unset_fake_temporarily():
            fixed = as_on_cpu(
                func,
                args,
                kwargs,
                out if isinstance(out, tuple) else (out,),
                lambda t, new: FakeTensor(mode, new, t.fake_device),
            )
        return fixed if isinstance(out, tuple) else fixed[0]

    return conv
