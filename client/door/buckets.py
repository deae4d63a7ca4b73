"""Shape buckets for eager ops: an op whose tensor sizes change with the data (MoE routing,
masked selection) compiles once per bucket, not once per size.

The door asks here on a signature's first sight (kernel.py `_entry`). The signature's family
is the op at the user's line with its device tensors' sizes taken out (how each lies in
memory is kept); policy/buckets.py `DynamicSizes` says which of those sizes are dynamic (one
size met with several values, everything else the same). A signature with dynamic sizes gets
the executable of the op traced at their buckets (over meta stand-ins), run at its own
sizes: computed at the real size, priced at the bucket (simulator/execute.py
LoadedExecutable.at_size), as compiled mode's buckets are.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from trnsim.client.core import runtime
from trnsim.client.core.notes import NOTES
from trnsim.client.core.ops import OneNode, OpSpec, one_node
from trnsim.client.core.types import Args, Kwargs, OpValue
from trnsim.compiler.graph import to_proto
from trnsim.simulator.execute import LoadedExecutable

Tensor = torch.Tensor


def executable(
    rt: runtime.Runtime,
    spec: OpSpec,
    key: tuple[object, ...],
    args: Args,
    kwargs: Kwargs,
    made: OneNode,
) -> LoadedExecutable | None:
    """The executable of the signature's bucket run at its sizes, or None: the signature
    compiles at its own sizes (no size of it is dynamic, it is already a bucket's, or the op
    cannot run at the bucket's)."""
    if made.dynamic:  # (its outputs are sized by the data: nothing to trace at a bucket)
        return None
    where = made.debug.node_locations[0]
    family, sizes, layouts = _family(key, (where.file, where.line))
    wanted = rt.dynamic_sizes.bucket(family, sizes) if sizes else []
    if not wanted:
        return None
    site = f"{where.file}:{where.line}"
    dynamic, values = rt.dynamic_sizes.dynamic(family)
    NOTES.op_bucket_sizes[(spec.name, site)] = f"{_positions(layouts, dynamic)} (met: {values})"
    # (this signature's bucket first, then those of sizes met before, when one just turned dynamic)
    compiled = [_compile_at(rt, spec, args, kwargs, layouts, at, site) for at in wanted]
    if compiled[0] is None or wanted[0] == sizes:
        return None
    rt.count("op_bucket_signatures")
    NOTES.op_buckets[(spec.name, site, _shapes(layouts, wanted[0]))] += 1
    return compiled[0].at_size(to_proto(made.graph), made.debug)


def _compile_at(
    rt: runtime.Runtime,
    spec: OpSpec,
    args: Args,
    kwargs: Kwargs,
    layouts: list[Layout | None],
    at: tuple[int, ...],
    site: str,
) -> LoadedExecutable | None:
    """The op's executable traced at a bucket's sizes, or None if it cannot be one."""
    try:
        traced = one_node(spec, *_stand_ins(args, kwargs, layouts, at))
        if traced is None or traced.dynamic:
            raise ValueError("its outputs' sizes are not known at the bucket's sizes")
        loaded = rt.executables.get(traced.graph, traced.debug)
    except Exception as e:  # noqa: BLE001  (the signature still runs, compiled at its own sizes)
        rt.count("op_buckets_refused")
        NOTES.op_buckets_refused[(spec.name, site, f"{type(e).__name__}: {e}"[:200])] += 1
        return None
    NOTES.op_buckets[(spec.name, site, _shapes(layouts, at))] += 0  # (compiled)
    return loaded


def _family(
    key: tuple[object, ...], site: tuple[str, int]
) -> tuple[Hashable, tuple[int, ...], list[Layout | None]]:
    """(the signature's family, its device tensors' sizes in order, each tensor's layout).
    A dense tensor's layout is the order of its dimensions (its strides follow from its
    sizes); any other's, its strides, kept (a chunk's rows keep their stride whatever their
    number). A CPU tensor's sizes stay in the family."""
    family: list[object] = []
    sizes: list[int] = []
    layouts: list[Layout | None] = []
    for item in key:
        if type(item) is tuple and len(item) == 4 and type(item[0]) is torch.Size:
            shape, stride, dtype, is_cpu = item
            layout = None if is_cpu else Layout.of(shape, stride)
            layouts.append(layout)
            if layout is not None:
                family.append((layout, dtype))
                sizes.extend(shape)
                continue
        family.append(item)
    return (tuple(family), site), tuple(sizes), layouts


@dataclass(frozen=True)
class Layout:
    """How a device tensor lies in memory, whatever its sizes: dense with its dimensions in
    `order` (contiguous, transposed, channels-last...), or at fixed `strides` (a chunk, a
    slice with gaps, a broadcast)."""

    order: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.order or self.strides)

    @staticmethod
    def of(shape: tuple[int, ...], stride: tuple[int, ...]) -> Layout:
        order = tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))
        if _dense(shape, order) == tuple(stride):
            return Layout(order=order)
        return Layout(strides=tuple(stride))

    def at(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The strides of a tensor of this layout at these sizes."""
        return _dense(shape, self.order) if self.order else self.strides


def _dense(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """A dense tensor's strides, its dimensions laid out in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _stand_ins(
    args: Args, kwargs: Kwargs, layouts: list[Layout | None], at: tuple[int, ...]
) -> tuple[Args, Kwargs, list[Tensor]]:
    """The op's arguments with each device tensor a meta tensor at the bucket's sizes (a
    tensor passed twice is one stand-in), and its tensor arguments in order."""
    sizes = iter(at)
    layout_of = iter(layouts)
    made: dict[int, Tensor] = {}  # id(tensor) -> its stand-in, for this call only
    tensors: list[Tensor] = []

    def swap(value: OpValue) -> OpValue:
        if isinstance(value, Tensor):
            layout = next(layout_of)
            if layout is not None:
                shape = tuple(next(sizes) for _ in range(layout.rank))
                if id(value) not in made:
                    made[id(value)] = torch.empty_strided(
                        shape, layout.at(shape), dtype=value.dtype, device="meta"
                    )
                value = made[id(value)]
            tensors.append(value)
            return value
        if type(value) is list or type(value) is tuple:
            return type(value)(swap(v) for v in value)
        return value

    new_args = tuple(swap(v) for v in args)
    new_kwargs = {name: swap(v) for name, v in kwargs.items()}
    return new_args, new_kwargs, tensors


def _positions(layouts: list[Layout | None], dynamic: frozenset[int]) -> str:
    """'tensor 0 dim 0, tensor 2 dim 0': the dynamic positions, by tensor argument."""
    named: list[str] = []
    i = 0
    for k, layout in enumerate(layouts):
        rank = layout.rank if layout is not None else 0
        named += [f"tensor {k} dim {d}" for d in range(rank) if i + d in dynamic]
        i += rank
    return ", ".join(named)


def _shapes(layouts: list[Layout | None], at: tuple[int, ...]) -> str:
    """The bucket's sizes, one tensor at a time: '(32, 64) (64, 256)'."""
    sizes = iter(at)
    return " ".join(
        str(tuple(next(sizes) for _ in range(layout.rank))) for layout in layouts if layout
    )
