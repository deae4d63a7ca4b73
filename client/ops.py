"""The op layer both modes stand on, with no runtime state: what an ATen op is (OpSpec, its
schema's facts computed once), what the runtime memoises per signature (Entry) and how its
results become the op's return value (Return), and how op arguments become graph arguments.

Eager dispatch (dispatch.py) and adaptive recording (recorder.py) both import this module;
neither imports the other's privates.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from trnsim.client.errors import check_device_index
from trnsim.compiler.graph import (
    ArgValue,
    DeviceArg,
    DTypeArg,
    LayoutArg,
    MemoryFormatArg,
    Node,
    ScalarInput,
    TensorType,
    Value,
)
from trnsim.protos import graph_pb2
from trnsim.simulator import dtypes, execute

Tensor = torch.Tensor
Handler = Callable[["OpSpec", tuple[Any, ...], dict[str, Any]], Any]
# torch enums -> graph enums: the executor's tables read backwards.
_MEMORY_FORMATS = {v: k for k, v in execute.MEMORY_FORMATS.items()}
_LAYOUTS = {v: k for k, v in execute.LAYOUTS.items()}
_SHAPE_FROM_SCALARS = {"aten::arange", "aten::range", "aten::linspace", "aten::logspace"}
# What a mode that defers ops (adaptive recording) answers for an op it did not take: the
# caller runs it eagerly.
NOT_RECORDED = object()


# -- per-op facts, computed once --------------------------------------------------------------------
class UnsupportedArgumentError(NotImplementedError):
    """Unrecoverable for this call: the op got an argument a graph cannot carry."""


class OpSpec:
    __slots__ = (
        "argument_names",
        "handler",
        "is_view",
        "mutated",
        "name",
        "op",
        "positional_names",
        "returns_tensor",
        "shape_from_scalars",
        "writes",
    )

    def __init__(self, op: Any) -> None:
        schema = op._schema
        self.op = op
        self.name = f"{schema.name}.{schema.overload_name or 'default'}"
        self.positional_names = [a.name for a in schema.arguments if not a.kwarg_only]
        self.argument_names = frozenset(a.name for a in schema.arguments)
        # return index -> name of the argument it writes through (in-place / out=)
        self.writes: dict[int, str] = {}
        for j, r in enumerate(schema.returns):
            if r.alias_info is not None and r.alias_info.is_write:
                for a in schema.arguments:
                    if (
                        a.alias_info is not None
                        and a.alias_info.before_set == r.alias_info.before_set
                    ):
                        self.writes[j] = a.name
        self.returns_tensor = [str(r.type).startswith("Tensor") for r in schema.returns]
        returned: set[str] = set()
        for r in schema.returns:
            if r.alias_info is not None:
                returned |= set(r.alias_info.before_set)
        # Arguments written but not returned (running stats, in-place foreach lists).
        self.mutated = frozenset(
            a.name
            for a in schema.arguments
            if a.alias_info is not None
            and a.alias_info.is_write
            and not set(a.alias_info.before_set) & returned
        )
        # Ops whose output shape depends on the values of float arguments: those values
        # are part of the signature (the executable still takes them at run time).
        self.shape_from_scalars = schema.name in _SHAPE_FROM_SCALARS
        self.is_view = any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        # How the eager dispatcher runs it (set by dispatch.py when it first meets the op)
        self.handler: Handler | None = None


_SPECS: dict[Any, OpSpec] = {}


def spec_for(op: Any) -> OpSpec:
    """The facts of an op (memoised); the handler is the eager dispatcher's business."""
    spec = _SPECS.get(op)
    if spec is None:
        spec = _SPECS[op] = OpSpec(op)
    return spec


# -- what an op returns -----------------------------------------------------------------------------
class Kind(enum.Enum):
    FRESH = "fresh"  # a new tensor (nbytes 0: data-dependent, sized after the run)
    LIST = "list"  # a list of new tensors
    WRITE = "write"  # an argument, written in place (arg: its tensor index)
    NONE = "none"  # an optional output the op did not produce
    VALUE = "value"  # a Python value: the host needs the device's answer


FRESH, LIST, WRITE, NONE, VALUE = Kind.FRESH, Kind.LIST, Kind.WRITE, Kind.NONE, Kind.VALUE


@dataclass(frozen=True, slots=True)
class Return:
    """One of an op's return values. `sizes` holds the bytes of each new tensor it makes
    (one for FRESH, one per item for LIST, none otherwise)."""

    kind: Kind
    sizes: tuple[int, ...] = ()
    arg: int = -1  # WRITE: the tensor argument it writes

    @property
    def nbytes(self) -> int:
        return self.sizes[0]

    @staticmethod
    def fresh(nbytes: int) -> Return:
        return Return(FRESH, (nbytes,))

    @staticmethod
    def items(sizes: list[int]) -> Return:
        return Return(LIST, tuple(sizes))

    @staticmethod
    def written(arg: int) -> Return:
        return Return(WRITE, arg=arg)


def flat_returns(returns: list[Return]) -> list[Return]:
    """One Return per executable output: a LIST as a FRESH per item."""
    out: list[Return] = []
    for r in returns:
        if r.kind is LIST:
            out.extend(Return.fresh(n) for n in r.sizes)
        else:
            out.append(r)
    return out


@dataclass
class Entry:
    """What the runtime memoises per op signature: the loaded executable and how to turn its
    CPU results into the op's return value (output metadata included)."""

    # The one-op executable; None until first needed when the signature was first met
    # while recording a compiled region, which runs it inside the region's executable.
    loaded: execute.LoadedExecutable | None
    returns: list[Return]
    dynamic: bool  # output shape depends on data: a sync point
    out_args: list[int]  # tensor indices of out= arguments (computed on the CPU, copied back)
    # The op as a graph node (inputs Value(None, k) = k-th tensor argument, ScalarInput(s) =
    # s-th float) and the metadata of each new output: what the recorder needs.
    node: Node | None = None
    fresh: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = field(default_factory=list)
    fusible: bool = False
    # Its outputs were checked on a real run against `fresh` (the Meta kernels' metadata,
    # which recording hands out before anything runs); a mismatch makes it unfusible.
    verified: bool = False
    compile_later: Callable[[], execute.LoadedExecutable] | None = None
    # Fusible but for drawing from the CPU's generator when it runs (dropout): a compiled
    # region whose draws all run in its own order records it (client/compiled.py).
    cpu_draw: bool = False
    # It makes sparse tensors from strided ones (to_sparse): it runs as a sparse op
    # (client/sparse.py), never as an executable.
    sparse_out: bool = False
    # A tensor passed twice (a * a) is one input of the executable, so the compiler counts
    # its memory once: which tensor arguments the executable takes, in order (None: all).
    takes: tuple[int, ...] | None = None

    def inputs_of(self, tensors: list[Any]) -> list[Any]:
        """The executable's inputs among the op's tensor arguments (`node` names them all)."""
        takes = self.takes
        return tensors if takes is None else [tensors[k] for k in takes]

    # nbytes when the op returns one new tensor of known size (the hot case), else None.
    one_fresh_output: int | None = field(init=False)
    fresh_nbytes: int = field(init=False)  # bytes of all the new tensors it makes
    outputs: list[Return] = field(init=False)  # one per executable output (flat_returns)

    def executable(self) -> execute.LoadedExecutable:
        """The one-op executable, compiled now if it was deferred (see `loaded`)."""
        if self.loaded is None:
            assert self.compile_later is not None
            self.loaded, self.compile_later = self.compile_later(), None
        return self.loaded

    def __post_init__(self) -> None:
        simple = len(self.returns) == 1 and self.returns[0].kind is FRESH and not self.dynamic
        self.one_fresh_output = self.returns[0].nbytes if simple else None
        self.fresh_nbytes = sum(sum(r.sizes) for r in self.returns)
        self.outputs = flat_returns(self.returns)


# -- arguments as a graph carries them ------------------------------------------------------------
def tensor_type(t: Tensor) -> TensorType:
    return TensorType(tuple(t.shape), tuple(t.stride()), dtypes.from_name(str(t.dtype)), 0)


DYNAMIC = TensorType((-1,), (1,), graph_pb2.FLOAT32)


def graph_arg(value: Any, inputs: list[TensorType], counter: list[int]) -> ArgValue:
    """An op argument as a graph carries it: a tensor becomes the next graph input (its type
    appended to `inputs`), a float the next runtime scalar (counted in counter[0]), enums
    their graph codes, lists element by element."""
    if isinstance(value, Tensor):
        inputs.append(tensor_type(value))
        return Value(None, len(inputs) - 1)
    if type(value) is float:
        counter[0] += 1
        return ScalarInput(counter[0] - 1)
    if isinstance(value, (list, tuple)):
        return tuple(graph_arg(v, inputs, counter) for v in value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, torch.dtype):
        return DTypeArg(dtypes.from_name(str(value)))
    if isinstance(value, torch.device):
        check_device_index(value)
        return DeviceArg(value.type)
    if isinstance(value, torch.memory_format):
        return MemoryFormatArg(_MEMORY_FORMATS[value])
    if isinstance(value, torch.layout):
        return LayoutArg(_LAYOUTS[value])
    raise UnsupportedArgumentError(
        f"an argument of type {type(value).__name__} ({value!r}) cannot be passed to a neuron "
        f"op yet; convert it to a tensor or a Python number"
    )
