"""The op layer every mode stands on, with no runtime state: what an ATen op is (OpSpec, its
schema's facts computed once), what the runtime memoises per signature (Entry) and how its
results become the op's return value (Return), how op arguments become graph arguments, and
the whole translation of one op call into its graph node and one-node graph (one_node).

The door (kernel.py), eager mode and the recording modes all import this module; none of
them builds a node itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from trnsim.client.core import kernel_costs, layouts
from trnsim.client.core.errors import check_device_index, user_frame, user_location
from trnsim.client.core.types import Args, Kwargs, Op, OpValue
from trnsim.compiler import op_table
from trnsim.compiler.graph import (
    Alias,
    ArgValue,
    DeviceArg,
    DTypeArg,
    Graph,
    LayoutArg,
    MemoryFormatArg,
    Node,
    ScalarInput,
    TensorType,
    Value,
    remap_node,
)
from trnsim.protos import graph_pb2
from trnsim.simulator import dtypes, execute

Tensor = torch.Tensor
Handler = Callable[["OpSpec", Args, Kwargs], OpValue]  # how the door runs an op
T = TypeVar("T")
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

    def __init__(self, op: Op) -> None:
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
        # How the eager dispatcher runs it (set by the door, client/door/kernel.py, when it first meets the op)
        self.handler: Handler | None = None


_SPECS: dict[Op, OpSpec] = {}


def spec_for(op: Op) -> OpSpec:
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
    # The graph compile_later compiles (Executables.prefetch reads a cut's at once).
    deferred: tuple[Graph, graph_pb2.GraphDebug] | None = None
    # Fusible but for drawing from the CPU's generator when it runs (dropout): a compiled
    # region whose draws all run in its own order records it (client/modes/compiled.py).
    cpu_draw: bool = False
    # It makes sparse tensors from strided ones (to_sparse): it runs as a sparse op
    # (client/door/sparse.py), never as an executable.
    sparse_out: bool = False
    # A tensor passed twice (a * a) is one input of the executable, so the compiler counts
    # its memory once: which tensor arguments the executable takes, in order (None: all).
    takes: tuple[int, ...] | None = None
    # Each tensor argument's part of the signature, (shape, stride, dtype, is_cpu): what
    # eager mode checks a host alias against (client/core/device_memory.py host_alias_as).
    metas: list[tuple[object, ...]] = field(default_factory=list)
    # Whether the C++ door may serve its warm eager calls (client/door/fast.py; None: not
    # decided yet, on its first eager run).
    fast: bool | None = None

    def inputs_of(self, tensors: list[T]) -> list[T]:
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
            self.deferred = None
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


def graph_arg(value: OpValue, inputs: list[TensorType], counter: list[int]) -> ArgValue:
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
    if value is None or isinstance(value, (bool, int, str, complex)):
        return value  # (a complex number is a constant of the graph, as an int is)
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


# -- one op call as its graph node and one-node graph ------------------------------------------
Meta = tuple[
    tuple[int, ...], tuple[int, ...], torch.dtype
]  # a new output's (sizes, strides, dtype)


@dataclass(frozen=True)
class OneNode:
    """An op call translated for the device: its node, the one-node graph that is its own
    executable (with the user's line), and what the runtime memoises of it (Entry's parts).
    `recordable`: a recording mode may take it into a graph; `cpu_draw`: it may, except that
    it draws from the CPU's generator when it runs (dropout without a generator)."""

    graph: Graph
    debug: graph_pb2.GraphDebug
    node: Node
    returns: list[Return]
    dynamic: bool
    out_args: list[int]
    fresh: list[Meta]
    recordable: bool
    cpu_draw: bool
    takes: tuple[int, ...] | None


def one_node(spec: OpSpec, args: Args, kwargs: Kwargs, tensors: list[Tensor]) -> OneNode | None:
    """The translation of an op call met for the first time with this signature; None when
    it makes sparse tensors from strided ones (it runs as a sparse op, never as a node)."""
    check_devices(spec, tensors)
    meta_out, dynamic = _meta_outputs(spec, args, kwargs)
    if _makes_sparse(spec, meta_out):
        return None
    inputs: list[TensorType] = []
    counter = [0]
    named: list[tuple[str, ArgValue]] = []
    tensor_index: dict[str, int] = {}  # argument name -> its tensor index
    for i, value in enumerate(args):
        name = spec.positional_names[i] if i < len(spec.positional_names) else f"arg{i}"
        if isinstance(value, Tensor):
            tensor_index[name] = len(inputs)
        named.append((name, graph_arg(value, inputs, counter)))
    for name, value in kwargs.items():
        if isinstance(value, Tensor):
            tensor_index[name] = len(inputs)
        named.append((name, graph_arg(value, inputs, counter)))
    outs = _Outputs(spec, kwargs, inputs, tensor_index, {n: i for i, (n, _) in enumerate(named)})
    for j in range(len(spec.returns_tensor)):
        outs.add(j, meta_out[j] if meta_out is not None and j < len(meta_out) else None, dynamic)
    op_name = spec.name if "::" in spec.name else f"aten::{spec.name}"
    node = Node(
        op_name,
        tuple(named),
        tuple(outs.types),
        tuple(outs.aliases),
        tuple(k for k, (name, _) in enumerate(named) if name in spec.mutated),
        kernel_costs.cost_of(op_name, args, kwargs),  # (custom kernels only)
    )
    graph, takes = _one_node_graph(node, inputs, len(outs.types), counter[0], tensors)
    path, line, function = user_frame()
    debug = graph_pb2.GraphDebug(name=spec.name)
    debug.node_locations.add(file=path, line=line, function=function)
    # Random ops without a generator argument draw from the CPU's global generator when
    # they run: recording would move that draw. (The others get the device generator.)
    cpu_draw = op_table.is_random(node.op) and "generator" not in spec.argument_names
    recordable = (
        not dynamic
        and not outs.out_args
        and all(r.kind is not VALUE for r in outs.returns)
        and op_table.fusible(node.op)
    )
    return OneNode(
        graph, debug, node, outs.returns, dynamic, outs.out_args, outs.fresh,
        recordable and not cpu_draw, recordable and cpu_draw, takes,
    )  # fmt: skip


class _Outputs:
    """The node's outputs, return by return: their types, aliases of written arguments, and
    how each becomes the op's return value."""

    def __init__(
        self,
        spec: OpSpec,
        kwargs: Kwargs,
        inputs: list[TensorType],
        tensor_index: dict[str, int],
        position: dict[str, int],
    ) -> None:
        self.spec, self.kwargs, self.inputs = spec, kwargs, inputs
        self.tensor_index, self.position = tensor_index, position
        self.returns: list[Return] = []
        self.types: list[TensorType] = []
        self.aliases: list[Alias] = []
        self.out_args: list[int] = []
        self.fresh: list[Meta] = []

    def add(self, j: int, meta: OpValue, dynamic: bool) -> None:
        spec = self.spec
        written = spec.writes.get(j)
        if written is not None and written in self.tensor_index:
            index = self.tensor_index[written]
            self.returns.append(Return.written(index))
            self.aliases.append(Alias(len(self.types), self.position[written], writes=True))
            if written in self.kwargs:  # out=: kwarg-only in every schema
                self.out_args.append(index)
            self.types.append(tensor_type(meta) if isinstance(meta, Tensor) else self.inputs[index])
        elif isinstance(meta, (list, tuple)):
            self.returns.append(Return.items([tensor_type(m).nbytes for m in meta]))
            self.types.extend(tensor_type(m) for m in meta)
            self.fresh.extend(meta_of(m) for m in meta)
        elif isinstance(meta, Tensor):
            self.returns.append(Return.fresh(tensor_type(meta).nbytes))
            self.types.append(tensor_type(meta))
            self.fresh.append(meta_of(meta))
        elif spec.returns_tensor[j] and not dynamic:
            self.returns.append(Return(NONE))  # an optional output the op did not produce
            self.types.append(DYNAMIC)
        elif spec.returns_tensor[j]:
            self.returns.append(Return.fresh(0))  # data-dependent: sized after the run
            self.types.append(DYNAMIC)
        else:
            self.returns.append(Return(VALUE))


def meta_of(t: Tensor) -> Meta:
    return tuple(t.shape), tuple(t.stride()), t.dtype


def repeats(tensors: list[Tensor]) -> tuple[int, ...]:
    """Per tensor argument, the index of its first occurrence (the same tensor passed twice)."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t), k) for k, t in enumerate(tensors))


def _to_meta(value: OpValue) -> OpValue:
    if isinstance(value, Tensor):
        if value.is_cpu and value.dim() == 0:
            return value  # CPU scalars mix with device tensors, as on CUDA
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        check_device_index(value)
        return torch.device("meta") if value.type == "neuron" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _meta_outputs(spec: OpSpec, args: Args, kwargs: Kwargs) -> tuple[Args | None, bool]:
    """(output values on meta, dynamic). Dynamic: the output shape depends on the data."""
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    try:
        out = spec.op(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001
        # No meta kernel, a data-dependent shape, or bad arguments: the real run decides
        # (and names the op and the user's line if it fails too).
        return None, True
    if not isinstance(out, tuple):
        out = (out,)
    if layouts.chooses_layout(spec.name):  # (the CPU's layout, where Meta's differs)
        out = layouts.as_on_cpu(spec.op, args, kwargs, out)
    if spec.name in META_IGNORES_MASK:  # (the CPU's outputs, where Meta's differ)
        out = _masked(spec, args, kwargs, out)
    return out, False


# Backward ops whose Meta kernel makes every output whatever their output_mask says, where the
# CPU kernel makes none for an output the mask leaves out (batch norm's input gradient when
# only its weight and bias need one). Others agree with the CPU: layer and group norm and
# convolution make none either, and grid_sampler_2d_backward makes both on both.
META_IGNORES_MASK = frozenset(["aten::native_batch_norm_backward.default"])


def _masked(spec: OpSpec, args: Args, kwargs: Kwargs, out: tuple[OpValue, ...]) -> Args:
    """The Meta outputs with None for those the op's output_mask leaves out: optional
    outputs the CPU kernel does not make."""
    names = spec.positional_names[: len(args)]
    mask = kwargs.get(
        "output_mask", args[names.index("output_mask")] if "output_mask" in names else None
    )
    if not isinstance(mask, (list, tuple)):
        return out
    return tuple(None if j < len(mask) and not mask[j] else o for j, o in enumerate(out))


def _makes_sparse(spec: OpSpec, meta_out: Args | None) -> bool:
    """Whether the op makes sparse tensors from strided ones (to_sparse): by its Meta
    kernel's outputs, or by its name where their number of nonzeros needs the data."""
    if meta_out is None:
        return "sparse" in spec.name
    return any(isinstance(m, Tensor) and m.layout != torch.strided for m in meta_out)


def _one_node_graph(
    node: Node,
    inputs: list[TensorType],
    n_outputs: int,
    n_scalars: int,
    tensors: list[Tensor],
) -> tuple[Graph, tuple[int, ...] | None]:
    """The op's executable graph, and which tensor arguments it takes (None: all, in order).
    A tensor passed twice is one input, read twice, unless the op writes an argument."""
    outputs = tuple(Value(0, j) for j in range(n_outputs))
    first = repeats(tensors)
    if list(first) == list(range(len(tensors))) or node.writes():
        return Graph(tuple(inputs), (node,), outputs, num_scalar_inputs=n_scalars), None
    takes = tuple(k for k, f in enumerate(first) if f == k)
    position = {k: i for i, k in enumerate(takes)}
    mapping = {Value(None, k): Value(None, position[f]) for k, f in enumerate(first)}
    graph = Graph(
        tuple(inputs[k] for k in takes),
        (remap_node(node, mapping),),
        outputs,
        num_scalar_inputs=n_scalars,
    )
    return graph, takes


# Ops that take CPU tensors next to device tensors on CUDA too: indices (moved by the op),
# split points and bins that must be on the CPU, copies between devices.
_TAKES_CPU_TENSORS = frozenset(
    [
        "aten::index.Tensor",
        "aten::_unsafe_index.Tensor",
        "aten::index_put.default",
        "aten::index_put_.default",
        "aten::_index_put_impl_.default",
        "aten::_unsafe_index_put.default",
        "aten::copy_.default",
        "aten::_to_copy.default",
        "aten::tensor_split.tensor_indices_or_sections",
        "aten::histogramdd.default",
        "aten::histogramdd.int_bins",
        "aten::histogramdd.TensorList_bins",
        "aten::_histogramdd_from_bin_tensors.default",
        "aten::_histogramdd_from_bin_cts.default",
        "aten::_histogramdd_bin_edges.default",
    ]
)


def check_devices(spec: OpSpec, tensors: list[Tensor]) -> None:
    """A CPU tensor (other than a 0-dim scalar) next to a neuron tensor is an error, as on
    CUDA, except for the ops that take them there too."""
    if spec.name in _TAKES_CPU_TENSORS or all(t.is_cpu for t in tensors):
        return
    if any(t.is_cpu and t.dim() > 0 for t in tensors):
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"neuron:0 and cpu! (in {spec.name}, called at {user_location()}). Move the CPU "
            f"tensor with .to('neuron') first."
        )
