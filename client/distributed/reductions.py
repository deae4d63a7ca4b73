"""Reduce ops as gloo runs them: c10d's, and the functional collectives' by name; AVG and
PREMUL_SUM, which gloo lacks, as a SUM between a premultiply and a divide."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist
from trnsim.client.distributed.errors import CollectiveError

Tensor = torch.Tensor
RedOp = dist.ReduceOp.RedOpType
_GLOO_OPS = {
    RedOp.SUM: dist.ReduceOp.SUM,
    RedOp.PRODUCT: dist.ReduceOp.PRODUCT,
    RedOp.MIN: dist.ReduceOp.MIN,
    RedOp.MAX: dist.ReduceOp.MAX,
    RedOp.BAND: dist.ReduceOp.BAND,
    RedOp.BOR: dist.ReduceOp.BOR,
    RedOp.BXOR: dist.ReduceOp.BXOR,
}


@dataclasses.dataclass(frozen=True)
class Reduction:
    """gloo's op for a c10d op, with a factor to premultiply the inputs by and a divisor
    for the results."""

    gloo_op: dist.ReduceOp
    factor: float = 1.0
    divisor: float = 1.0


def reduction(op: dist.ReduceOp | RedOp, size: int, what: str) -> Reduction:
    """How gloo runs c10d's reduce op `op` in a group of `size` ranks."""
    kind = op.op if hasattr(op, "op") else op
    if kind == RedOp.AVG:
        return Reduction(dist.ReduceOp(dist.ReduceOp.SUM), 1.0, float(size))
    if kind == RedOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if not isinstance(factor, float):
            raise CollectiveError(f"{what}: PREMUL_SUM needs a Python float factor")
        return Reduction(dist.ReduceOp(dist.ReduceOp.SUM), factor, 1.0)
    if kind not in _GLOO_OPS:
        raise CollectiveError(f"{what}: reduce op {kind} is not supported")
    return Reduction(dist.ReduceOp(_GLOO_OPS[kind]), 1.0, 1.0)


def scale(tensors: Sequence[Tensor], factor: float, divisor: float) -> None:
    """Multiplies by factor and divides by divisor in place (integers: floor division)."""
    for t in tensors:
        if factor != 1.0:
            t.mul_(factor)
        if divisor != 1.0:
            if t.is_floating_point() or t.is_complex():
                t.div_(divisor)
            else:
                t.copy_(torch.div(t, divisor, rounding_mode="floor"))


def functional_op(name: str) -> dist.ReduceOp:
    """The c10d op of a functional collective's reduce op name ("sum", "avg"...)."""
    ops = {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.AVG,
        "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
    }
    if name.lower() not in ops:
        raise CollectiveError(f"functional collective reduce op {name!r} is not supported")
    return dist.ReduceOp(ops[name.lower()])
