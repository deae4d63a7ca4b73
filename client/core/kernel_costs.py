"""Custom kernels' declared costs (torch.neuron.register_kernel, client/api/kernels.py): the op
layer prices a call of a registered custom op with its cost function."""

from __future__ import annotations

from collections.abc import Callable

from trnsim.client.core.types import Args, Kwargs
from trnsim.compiler.graph import KERNEL_ENGINES, KernelCost

_COSTS: dict[str, Callable[..., KernelCost]] = {}  # "ns::op.overload" -> its cost function


def declare_cost(op_name: str, cost: Callable[..., KernelCost]) -> None:
    """A custom op's cost function: its calls become one node priced by it."""
    _COSTS[op_name] = cost


def cost_of(op_name: str, args: Args, kwargs: Kwargs) -> KernelCost | None:
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
