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
from typing import Any

import torch
from trnsim.compiler.graph import KERNEL_ENGINES, KernelCost

__all__ = ["KernelCost", "cost_of", "register_kernel"]

_COSTS: dict[str, Callable[..., KernelCost]] = {}  # "ns::op.overload" -> its cost function
_LIBS: list[torch.library.Library] = []


def register_kernel(op: Any, cost: Callable[..., KernelCost]) -> None:
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
    key = qualified if "." in name else f"{qualified}.default"
    _COSTS[key] = cost
    lib = torch.library.Library(namespace, "IMPL")

    def neuron_kernel(*args: Any, **kwargs: Any) -> Any:
        from trnsim.client.dispatch import kernel

        return kernel(overload, *args, **kwargs)

    lib.impl(name, neuron_kernel, "PrivateUse1")
    _LIBS.append(lib)


def cost_of(op_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelCost | None:
    """The declared cost of a call of a registered kernel (None for every other op)."""
    fn = _COSTS.get(op_name)
    if fn is None:
        return None
    cost = fn(*args, **kwargs)
    if not isinstance(cost, KernelCost) or cost.engine not in KERNEL_ENGINES or cost.ns < 0:
        raise ValueError(
            f"the cost function of {op_name} returned {cost!r}: it must return "
            f"torch.neuron.KernelCost(engine=one of {KERNEL_ENGINES}, ns>=0, ...)"
        )
    return cost
