"""Custom kernels: a `torch.library.custom_op` with a neuron implementation and a cost.

    @torch.library.custom_op("demo::rms_norm", mutates_args=())
    def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
        ...  # the kernel's numerics, on CPU tensors

    @rms_norm.register_fake
    def _(x, w, eps):
        return torch.empty_like(x)

    torch.neuron.register_kernel(rms_norm, cost=lambda x, w, eps: torch.neuron.KernelCost(
        engine="vector", ns=x.numel() / 512, hbm_bytes=2 * x.nbytes + w.nbytes))

On neuron tensors the op is then one node, in every mode: one executable in eager mode, one
node of a recorded graph in adaptive mode and of a region in compiled mode. Its numerics are
the op's own implementation, run on the tensors' memory by the simulator; its time is the
declared cost (the cost function sees the call's arguments: tensors with their shapes).
Without register_kernel, PyTorch runs a custom op's Python body on neuron tensors op by op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from trnsim.client.core.kernel_costs import declare_cost
from trnsim.client.core.types import OpValue
from trnsim.client.door import kernel
from trnsim.compiler.graph import KernelCost

__all__ = ["KernelCost", "register_kernel"]

_LIBS: list[torch.library.Library] = []


def register_kernel(op: object, cost: Callable[..., KernelCost]) -> None:
    """Makes a custom op one neuron kernel priced by `cost(*args, **kwargs)`."""
    overload = getattr(op, "_opoverload", op)
    if not isinstance(overload, torch._ops.OpOverload):
        raise TypeError(
            f"register_kernel takes a torch.library.custom_op or an OpOverload, not {op!r}"
        )
    qualified = overload.name()  # "demo::rms_norm" (".overload" when not default)
    namespace, name = qualified.split("::", 1)
    if namespace == "aten":
        raise ValueError("register_kernel is for custom ops; aten ops are priced by the compiler")
    declare_cost(qualified if "." in name else f"{qualified}.default", cost)
    lib = torch.library.Library(namespace, "IMPL")

    def neuron_kernel(*args: OpValue, **kwargs: OpValue) -> OpValue:
        return kernel.kernel(overload, *args, **kwargs)

    lib.impl(name, neuron_kernel, "PrivateUse1")
    _LIBS.append(lib)
