"""The compiler's graph IR, its proto form (protos/graph.proto) and its canonical bytes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

from trnsim.protos import graph_pb2
from trnsim.simulator import dtypes


class GraphError(ValueError):
    """Unrecoverable for this graph: it is malformed; the message says which node and why."""


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: int  # graph_pb2.DType value
    storage_offset: int = 0

    @staticmethod
    def contiguous(shape: Sequence[int], dtype: int | str = "float32") -> TensorType:
        shape = tuple(int(s) for s in shape)
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= max(size, 1)
        dt = dtypes.from_name(dtype) if isinstance(dtype, str) else dtype
        return TensorType(shape, tuple(reversed(strides)), dt)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return dtypes.itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements the tensor can address (its storage span, offset excluded)."""
        if any(s <= 0 for s in self.shape):  # empty, or a data-dependent shape (dims of -1)
            return 0
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides, strict=True))
        return span * self.itemsize

    def is_contiguous(self) -> bool:
        return self == replace(
            TensorType.contiguous(self.shape, self.dtype), storage_offset=self.storage_offset
        )


@dataclass(frozen=True)
class Value:
    """A graph input (node is None) or output `index` of node `node`."""

    node: int | None
    index: int

    def __str__(self) -> str:
        return f"%in{self.index}" if self.node is None else f"%{self.node}.{self.index}"


@dataclass(frozen=True)
class ScalarInput:
    """A runtime scalar argument: index into the launch's scalars (numbered by first use)."""

    index: int


@dataclass(frozen=True)
class DTypeArg:
    dtype: int


@dataclass(frozen=True)
class MemoryFormatArg:
    value: int


@dataclass(frozen=True)
class LayoutArg:
    value: int


@dataclass(frozen=True)
class DeviceArg:
    type: str


ArgValue: TypeAlias = (
    Value
    | ScalarInput
    | int
    | float
    | complex
    | bool
    | str
    | None
    | DTypeArg
    | MemoryFormatArg
    | LayoutArg
    | DeviceArg
    | tuple["ArgValue", ...]
)


@dataclass(frozen=True)
class Alias:
    output: int
    argument: int
    writes: bool = False


KERNEL_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass(frozen=True)
class KernelCost:
    """A custom kernel's declared cost: its engine, its time there, flops and HBM bytes."""

    engine: str
    ns: float
    flops: int = 0
    hbm_bytes: int = 0


@dataclass(frozen=True)
class Node:
    op: str  # overload name, "aten::add.Tensor"
    args: tuple[tuple[str, ArgValue], ...]
    outputs: tuple[TensorType, ...]
    aliases: tuple[Alias, ...] = ()
    mutated_args: tuple[int, ...] = ()  # written but not returned (running stats, foreach lists)
    cost: KernelCost | None = None  # declared by a custom kernel (client/kernels.py)

    @property
    def name(self) -> str:
        """The op without its overload: "aten::add"."""
        return self.op.split(".", 1)[0]

    def tensor_args(self) -> Iterator[Value]:
        for _, value in self.args:
            yield from values_in(value)

    def arg(self, name: str, default: ArgValue = None) -> ArgValue:
        for arg_name, value in self.args:
            if arg_name == name:
                return value
        return default

    def writes(self) -> bool:
        return bool(self.mutated_args) or any(a.writes for a in self.aliases)

    def written_values(self) -> Iterator[Value]:
        """Every tensor value the node writes (through aliases or mutated arguments)."""
        for a in self.aliases:
            if a.writes:
                yield from values_in(self.args[a.argument][1])
        for i in self.mutated_args:
            yield from values_in(self.args[i][1])


def values_in(value: ArgValue) -> Iterator[Value]:
    """The tensor values in an argument (a value, or lists of them)."""
    if isinstance(value, Value):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from values_in(item)


def _scalars_in(value: ArgValue) -> Iterator[ScalarInput]:
    if isinstance(value, ScalarInput):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _scalars_in(item)


@dataclass(frozen=True)
class Graph:
    inputs: tuple[TensorType, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    name: str = field(default="", compare=False)
    num_scalar_inputs: int = 0
    # Per node: its index in the graph the compiler was given (the rewrites drop nodes);
    # empty: the same. Profiles and errors name a node's source line through it.
    origin: tuple[int, ...] = field(default=(), compare=False)

    def type_of(self, value: Value) -> TensorType:
        if value.node is None:
            return self.inputs[value.index]
        return self.nodes[value.node].outputs[value.index]

    def users(self) -> dict[Value, list[int]]:
        """Node indices that read each value, in program order."""
        users: dict[Value, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for v in node.tensor_args():
                users.setdefault(v, []).append(i)
        return users

    def validate(self) -> None:
        """Raises GraphError unless the graph is well formed and within the limits: every
        reference points at an earlier value, every type is a real tensor type, every op a
        plausible name. What a request may ask of the compiler is bounded here (LIMITS)."""
        for k, t in enumerate(self.inputs):
            _check_type(t, f"input {k}")
        for i, node in enumerate(self.nodes):
            _check_node(node, i)
            for v in node.tensor_args():
                self._check_ref(v, i, f"node {i} ({node.op})")
            for alias in node.aliases:
                if alias.output >= len(node.outputs) or alias.argument >= len(node.args):
                    raise GraphError(f"node {i} ({node.op}): alias {alias} is out of range")
                if not isinstance(node.args[alias.argument][1], Value):
                    raise GraphError(f"node {i} ({node.op}): alias {alias} names a non-tensor")
            for _, value in node.args:
                for s in _scalars_in(value):
                    if s.index >= self.num_scalar_inputs:
                        raise GraphError(f"node {i} ({node.op}): scalar input {s.index} undeclared")
        for v in self.outputs:
            self._check_ref(v, len(self.nodes), "graph outputs")

    def _check_ref(self, v: Value, before: int, where: str) -> None:
        if v.node is None:
            ok = 0 <= v.index < len(self.inputs)
        else:
            ok = 0 <= v.node < before and 0 <= v.index < len(self.nodes[v.node].outputs)
        if not ok:
            raise GraphError(f"{where}: reference {v} is not an earlier value of the graph")


@dataclass(frozen=True)
class Limits:
    max_rank: int = 64  # PyTorch's own limit on dimensions
    max_elements: int = 1 << 48  # per tensor (beyond any device's memory)
    max_outputs_per_node: int = 16_384  # foreach ops over every parameter of a large model
    max_args_per_node: int = 16_384
    max_name_length: int = 256  # op names are data here (never looked up): well formed, short


LIMITS = Limits()
_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?")
_UNKNOWN_SHAPE = ((-1,), (1,))  # a data-dependent output, sized when it has run


def _check_type(t: TensorType, where: str, unknown_ok: bool = False) -> None:
    if not dtypes.known(t.dtype):
        raise GraphError(f"{where}: unknown dtype code {t.dtype}")
    if unknown_ok and (t.shape, t.strides) == _UNKNOWN_SHAPE:
        return
    if len(t.shape) > LIMITS.max_rank:
        raise GraphError(f"{where}: {len(t.shape)} dimensions, over the limit of {LIMITS.max_rank}")
    if len(t.strides) != len(t.shape):
        raise GraphError(f"{where}: {len(t.strides)} strides for {len(t.shape)} dimensions")
    if any(s < 0 for s in t.shape) or any(s < 0 for s in t.strides) or t.storage_offset < 0:
        raise GraphError(f"{where}: negative size, stride or offset in {t}")
    numel = 1
    for s in t.shape:
        numel *= s
    if numel > LIMITS.max_elements:
        raise GraphError(f"{where}: {numel} elements, over the limit of {LIMITS.max_elements}")


def _check_node(node: Node, i: int) -> None:
    if len(node.op) > LIMITS.max_name_length or not _OP_NAME.fullmatch(node.op):
        raise GraphError(f"node {i}: {node.op[:80]!r} is not an operator name (ns::op.overload)")
    where = f"node {i} ({node.op})"
    if len(node.outputs) > LIMITS.max_outputs_per_node:
        raise GraphError(f"{where}: {len(node.outputs)} outputs, over the limit")
    if len(node.args) > LIMITS.max_args_per_node:
        raise GraphError(f"{where}: {len(node.args)} arguments, over the limit")
    for k, t in enumerate(node.outputs):
        _check_type(t, f"{where} output {k}", unknown_ok=True)
    cost = node.cost
    if cost is not None and (
        cost.engine not in KERNEL_ENGINES or not 0 <= cost.ns < 1e12 or cost.flops < 0
    ):
        raise GraphError(
            f"{where}: declared cost {cost} (engine one of {KERNEL_ENGINES}, 0 <= ns < 1e12)"
        )
    for name, value in node.args:
        if len(name) > LIMITS.max_name_length:
            raise GraphError(f"{where}: an argument name of {len(name)} characters")
        for d in _dtypes_in(value):
            if not dtypes.known(d):
                raise GraphError(f"{where}: argument {name!r} has unknown dtype code {d}")
    if any(not 0 <= k < len(node.args) for k in node.mutated_args):
        raise GraphError(f"{where}: a mutated argument index is out of range")


def _dtypes_in(value: ArgValue) -> Iterator[int]:
    if isinstance(value, DTypeArg):
        yield value.dtype
    elif isinstance(value, tuple):
        for item in value:
            yield from _dtypes_in(item)


# -- proto conversion -------------------------------------------------------------------------
def type_to_proto(t: TensorType) -> graph_pb2.TensorType:
    return graph_pb2.TensorType(
        shape=t.shape,
        strides=t.strides,
        dtype=t.dtype,  # type: ignore[arg-type]
        storage_offset=t.storage_offset,
    )


def type_from_proto(p: graph_pb2.TensorType) -> TensorType:
    return TensorType(tuple(p.shape), tuple(p.strides), int(p.dtype), int(p.storage_offset))


def value_to_proto(v: Value) -> graph_pb2.ValueRef:
    if v.node is None:
        return graph_pb2.ValueRef(input=v.index)
    return graph_pb2.ValueRef(node_output=graph_pb2.NodeOutput(node=v.node, output=v.index))


def value_from_proto(p: graph_pb2.ValueRef) -> Value:
    kind = p.WhichOneof("kind")
    if kind == "input":
        return Value(None, p.input)
    if kind == "node_output":
        return Value(p.node_output.node, p.node_output.output)
    raise GraphError("a ValueRef names neither an input nor a node output")


def arg_to_proto(name: str, value: ArgValue) -> graph_pb2.Argument:
    a = graph_pb2.Argument(name=name)
    if isinstance(value, Value):
        a.tensor.CopyFrom(value_to_proto(value))
    elif value is None:
        a.none.SetInParent()
    elif isinstance(value, bool):
        a.bool = value
    elif isinstance(value, int):
        a.int = value
    elif isinstance(value, float):
        a.float = value
    elif isinstance(value, complex):
        a.complex.real, a.complex.imag = value.real, value.imag
    elif isinstance(value, str):
        a.string = value
    elif isinstance(value, ScalarInput):
        a.scalar_input = value.index
    elif isinstance(value, DTypeArg):
        a.dtype = value.dtype  # type: ignore[assignment]
    elif isinstance(value, MemoryFormatArg):
        a.memory_format = value.value  # type: ignore[assignment]
    elif isinstance(value, LayoutArg):
        a.layout = value.value  # type: ignore[assignment]
    elif isinstance(value, DeviceArg):
        a.device = value.type
    elif isinstance(value, tuple):
        a.list.SetInParent()
        a.list.items.extend(arg_to_proto("", item) for item in value)
    else:
        raise GraphError(f"argument {name!r} has a type the graph cannot carry: {type(value)}")
    return a


def arg_from_proto(a: graph_pb2.Argument) -> tuple[str, ArgValue]:
    kind = a.WhichOneof("value")
    value: ArgValue
    if kind == "tensor":
        value = value_from_proto(a.tensor)
    elif kind == "none":
        value = None
    elif kind is None:  # (our encoder sets `none`: anything else would hash two ways)
        raise GraphError(f"argument {a.name!r} has no value")
    elif kind == "list":
        value = tuple(arg_from_proto(item)[1] for item in a.list.items)
    elif kind == "scalar_input":
        value = ScalarInput(a.scalar_input)
    elif kind == "dtype":
        value = DTypeArg(int(a.dtype))
    elif kind == "memory_format":
        value = MemoryFormatArg(int(a.memory_format))
    elif kind == "layout":
        value = LayoutArg(int(a.layout))
    elif kind == "device":
        value = DeviceArg(a.device)
    elif kind == "complex":
        value = complex(a.complex.real, a.complex.imag)
    else:
        value = getattr(a, kind)
    return a.name, value


def node_to_proto(n: Node) -> graph_pb2.Node:
    return graph_pb2.Node(
        op=n.op,
        args=[arg_to_proto(name, v) for name, v in n.args],
        outputs=[type_to_proto(t) for t in n.outputs],
        aliases=[
            graph_pb2.Alias(output=a.output, argument=a.argument, writes=a.writes)
            for a in n.aliases
        ],
        mutated_args=n.mutated_args,
        cost=None
        if n.cost is None
        else graph_pb2.KernelCost(
            engine=n.cost.engine, ns=n.cost.ns, flops=n.cost.flops, hbm_bytes=n.cost.hbm_bytes
        ),
    )


def node_from_proto(p: graph_pb2.Node) -> Node:
    cost = None
    if p.HasField("cost"):
        cost = KernelCost(p.cost.engine, p.cost.ns, p.cost.flops, p.cost.hbm_bytes)
    return Node(
        op=p.op,
        args=tuple(arg_from_proto(a) for a in p.args),
        outputs=tuple(type_from_proto(t) for t in p.outputs),
        aliases=tuple(Alias(a.output, a.argument, a.writes) for a in p.aliases),
        mutated_args=tuple(p.mutated_args),
        cost=cost,
    )


def to_proto(g: Graph) -> graph_pb2.Graph:
    return graph_pb2.Graph(
        inputs=[type_to_proto(t) for t in g.inputs],
        nodes=[node_to_proto(n) for n in g.nodes],
        outputs=[value_to_proto(v) for v in g.outputs],
        num_scalar_inputs=g.num_scalar_inputs,
    )


def from_proto(p: graph_pb2.Graph) -> Graph:
    g = Graph(
        inputs=tuple(type_from_proto(t) for t in p.inputs),
        nodes=tuple(node_from_proto(n) for n in p.nodes),
        outputs=tuple(value_from_proto(v) for v in p.outputs),
        num_scalar_inputs=p.num_scalar_inputs,
    )
    g.validate()
    return g


# -- canonical form ---------------------------------------------------------------------------
def input_order(g: Graph) -> list[int]:
    """Graph inputs in order of first use (nodes, then outputs); unused inputs last."""
    order: list[int] = []
    seen: set[int] = set()
    uses = [v for n in g.nodes for v in n.tensor_args()] + list(g.outputs)
    for v in uses:
        if v.node is None and v.index not in seen:
            seen.add(v.index)
            order.append(v.index)
    order += [i for i in range(len(g.inputs)) if i not in seen]
    return order


def remap_node(n: Node, mapping: dict[Value, Value]) -> Node:
    """The node with every reference in `mapping` replaced."""

    def sub(value: ArgValue) -> ArgValue:
        if isinstance(value, Value):
            return mapping.get(value, value)
        if isinstance(value, tuple):
            return tuple(sub(v) for v in value)
        return value

    return replace(n, args=tuple((name, sub(v)) for name, v in n.args))


def remap_values(g: Graph, mapping: dict[Value, Value]) -> Graph:
    """The graph with every reference in `mapping` replaced (used by the rewriting passes)."""
    nodes = tuple(remap_node(n, mapping) for n in g.nodes)
    outputs = tuple(mapping.get(v, v) for v in g.outputs)
    return replace(g, nodes=nodes, outputs=outputs)


def canonicalize(g: Graph) -> tuple[Graph, list[int]]:
    """Renumbers inputs by first use; returns the graph and old input index per new index."""
    order = input_order(g)
    if order == list(range(len(g.inputs))):
        return g, order
    mapping = {Value(None, old): Value(None, new) for new, old in enumerate(order)}
    g = remap_values(g, mapping)
    return replace(g, inputs=tuple(g.inputs[old] for old in order)), order


def canonical_bytes(g: Graph) -> bytes:
    """Deterministic bytes of the canonical graph: what the cache key hashes."""
    canonical, _ = canonicalize(g)
    return to_proto(canonical).SerializeToString(deterministic=True)


# -- a small builder, and the JSON form of hand-written graphs --------------------------------
class GraphBuilder:
    """Builds a graph op by op: b.op("aten::mm.default", a, w, out=TensorType...)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._inputs: list[TensorType] = []
        self._nodes: list[Node] = []

    def input(self, shape: Sequence[int], dtype: str = "float32") -> Value:
        self._inputs.append(TensorType.contiguous(shape, dtype))
        return Value(None, len(self._inputs) - 1)

    def op(
        self,
        op: str,
        *args: ArgValue,
        out: TensorType | Sequence[TensorType],
        names: Sequence[str] = (),
        aliases: Sequence[Alias] = (),
    ) -> Value:
        outs = (out,) if isinstance(out, TensorType) else tuple(out)
        named = tuple((names[i] if i < len(names) else "", a) for i, a in enumerate(args))
        self._nodes.append(Node(op, named, outs, tuple(aliases)))
        return Value(len(self._nodes) - 1, 0)

    def outputs_of(self, v: Value) -> list[Value]:
        assert v.node is not None
        return [Value(v.node, i) for i in range(len(self._nodes[v.node].outputs))]

    def build(self, *outputs: Value) -> Graph:
        g = Graph(tuple(self._inputs), tuple(self._nodes), tuple(outputs), self.name)
        g.validate()
        return g


def _json_type(spec: dict[str, Any]) -> TensorType:
    t = TensorType.contiguous(spec["shape"], spec.get("dtype", "float32"))
    if "strides" in spec:
        t = replace(t, strides=tuple(spec["strides"]))
    return t


def _json_arg(value: Any, names: dict[str, Value]) -> ArgValue:
    if isinstance(value, str) and value.startswith("%"):
        if value[1:] not in names:
            raise GraphError(f"{value} is used before it is defined")
        return names[value[1:]]
    if isinstance(value, list):
        return tuple(_json_arg(v, names) for v in value)
    if isinstance(value, dict):
        if "dtype" in value:
            return DTypeArg(dtypes.from_name(value["dtype"]))
        if "device" in value:
            return DeviceArg(value["device"])
        raise GraphError(f"unknown argument object {value}; use {{'dtype': ...}}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise GraphError(f"unsupported JSON argument {value!r}")


def load_json(path: str | Path) -> Graph:
    """Reads a hand-written graph: named inputs, nodes with "%name" arguments, outputs.

    {"inputs": {"x": {"shape": [64, 128]}}, "nodes": [{"name": "y", "op": "aten::relu.default",
     "args": ["%x"], "outputs": [{"shape": [64, 128]}]}], "outputs": ["%y"]}
    """
    spec = json.loads(Path(path).read_text())
    b = GraphBuilder(spec.get("name", Path(path).stem))
    names: dict[str, Value] = {}
    for name, t in spec["inputs"].items():
        names[name] = b.input(t["shape"], t.get("dtype", "float32"))
    for i, n in enumerate(spec["nodes"]):
        args = [_json_arg(a, names) for a in n.get("args", [])]
        kwargs = n.get("kwargs", {})
        args += [_json_arg(v, names) for v in kwargs.values()]
        arg_names = [""] * len(n.get("args", [])) + list(kwargs)
        outs = [_json_type(t) for t in n["outputs"]]
        aliases = [Alias(**a) for a in n.get("aliases", [])]
        v = b.op(n["op"], *args, out=outs, names=arg_names, aliases=aliases)
        name = n.get("name", f"n{i}")
        for j, out_value in enumerate(b.outputs_of(v)):
            names[name if j == 0 else f"{name}.{j}"] = out_value
    outputs = [_json_arg(o, names) for o in spec["outputs"]]
    if not all(isinstance(o, Value) for o in outputs):
        raise GraphError(f"outputs must all be %names: {spec['outputs']}")
    return b.build(*(o for o in outputs if isinstance(o, Value)))
