"""The types of what torch hands the op layer: an ATen op, and its call's arguments and results.

An ATen call's arguments and results are whatever its schema says: tensors, numbers, bools,
strings, None, dtypes, devices, layouts, memory formats, generators, symbolic sizes, and
lists and tuples of them. Python's types cannot follow a schema, so they are `OpValue`,
declared here once; the handlers of the door and the modes, the torch patches' wrappers and
the op layer say `Args` and `Kwargs` for a call's arguments.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from torch._ops import OpOverload

OpValue: TypeAlias = Any  # an ATen call's argument or result, as its schema types it
Args: TypeAlias = tuple[OpValue, ...]  # an ATen call's positional arguments
Kwargs: TypeAlias = dict[str, OpValue]  # an ATen call's keyword arguments
Op: TypeAlias = OpOverload[..., OpValue]  # an ATen op overload (aten::add.Tensor)
