"""The recording buffer both recording modes share (adaptive mode, compiled regions): ops
recorded as graph nodes, the tensors they read named by where their values come from (a
buffer input or an earlier node's output), and at a cut the buffer taken whole as a Cut,
with its graph.

Recorded outputs are real device tensors from the start (their memory exists); they are
computed when the buffer is cut. The buffer holds no tensor it made, only the new storages:
an output whose storage nothing else holds when the graph is cut (no tensor, view, alias or
autograd-saved tensor on it) can never be observed, and stays internal to the fused
executable: no HBM accounted, no copy back. Values are named by the memory they live in, so
both ways of running a cut (op by op, fused) run the same ATen ops on the same memory in order.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from dataclasses import dataclass

import torch
from trnsim.client.core import runtime
from trnsim.client.core.errors import user_frame
from trnsim.client.core.memory import to_device
from trnsim.client.core.ops import FRESH, LIST, NONE, Entry, OpSpec, graph_arg, spec_for
from trnsim.client.core.types import Args, Kwargs, OpValue
from trnsim.compiler.graph import (
    Alias,
    ArgValue,
    Graph,
    Node,
    ScalarInput,
    TensorType,
    Value,
    remap_node,
)
from trnsim.protos import graph_pb2
from trnsim.simulator import dtypes, shape_only

Tensor = torch.Tensor
_use_count = torch._C._storage_Use_Count
_getrefcount = sys.getrefcount


class _Placeholder:
    """Where a view call's tensor argument was (its value comes from the op's wiring)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Placeholder()
# A view's output: (sizes, strides, storage offset, dtype).
ViewOutput = tuple[torch.Size, tuple[int, ...], int | torch.SymInt, torch.dtype]


@dataclass(frozen=True, slots=True)
class ViewCall:
    """A recorded view: the call with its tensors replaced by TENSOR, and each output's
    (sizes, strides, storage offset, dtype)."""

    spec: OpSpec
    args: Args
    kwargs: Kwargs
    types: tuple[ViewOutput, ...]

    def run(self, tensors: list[Tensor]) -> list[Tensor]:
        """The view of CPU tensors: the same geometry the device view has."""
        given = iter(tensors)
        args = [next(given) if a is TENSOR else a for a in self.args]
        kwargs = {k: next(given) if v is TENSOR else v for k, v in self.kwargs.items()}
        out = self.spec.op(*args, **kwargs)
        return list(out) if isinstance(out, (list, tuple)) else [out]


@dataclass(eq=False, slots=True)
class RecOp:
    """One recorded op: its per-op entry, where each tensor argument comes from (a buffer
    input or an earlier node's output), and the memory of the tensors it made.

    Nothing here holds a tensor the op made or read from the buffer: what outlives the
    graph is read off the storages' reference counts (see Recorder._observable)."""

    name: str
    wiring: tuple[Value, ...]
    # Where this op's floats start among the graph's scalars: the node is built from these
    # only when a fused compile is asked for.
    scalar_offset: int
    entry: Entry | None  # (None for views)
    scalars: list[float]
    # The device storage of each new tensor (held, not its tensor).
    storages: list[torch.UntypedStorage]
    hosts: list[Tensor]  # the CPU tensors whose memory those storages are
    location: tuple[str, int, str]
    view: ViewCall | None = None

    def node(self) -> Node:
        if self.view is not None:
            return _view_node(self)
        assert self.entry is not None and self.entry.node is not None  # (recorded: fusible)
        wiring = {Value(None, k): v for k, v in enumerate(self.wiring)}
        return _shift_scalars(remap_node(self.entry.node, wiring), self.scalar_offset)


# What a tensor points at: (data_ptr, sizes, strides, dtype, version of a CPU tensor).
Where = tuple[int, torch.Size, tuple[int, ...], torch.dtype, int]
# A tensor's whole geometry on its storage: (storage, sizes, strides, offset, dtype, conj, neg).
Geometry = tuple[int, torch.Size, tuple[int, ...], int | torch.SymInt, torch.dtype, bool, bool]


def _where(t: Tensor) -> Where:
    """What a tensor points at, and for a CPU tensor what it holds: `t.data = u` changes
    the first without any op reaching us (to other memory, or to the same memory seen
    otherwise: p.data = p.t()), and the host writes CPU tensors (a scalar, indices) freely."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t._version if t.is_cpu else 0)


@dataclass(slots=True)
class _Known:
    """A tensor the buffer can name: the value it holds now, checked on use (a weak
    reference, because ids are reused once a tensor dies; where it points, because `.data`
    assignments swap that without an op)."""

    value: Value
    ref: weakref.ref[Tensor]
    where: Where


class Tape:
    """The buffer of recorded ops, and what names the tensors they read and made."""

    def __init__(self, rt: runtime.Runtime) -> None:
        self.rt = rt
        self._reset()

    def _reset(self) -> None:
        self.ops: list[RecOp] = []
        self.values: dict[int, _Known] = {}  # id(tensor) -> what it holds in the graph
        self.inputs: list[Tensor] = []
        self.input_hosts: list[Tensor] = []
        self.input_types: list[Where] = []  # _where of each input when wired
        self.input_index: dict[int, tuple[int, Where]] = {}  # id -> (index, _where)
        self.storages: set[int] = set()  # data pointers of the storages made in this buffer
        # (storage, sizes, strides, offset, dtype, conj, neg) -> the value a tensor of that
        # geometry holds: an alias made without us (autograd's detached gradients) is it.
        self.geometry: dict[Geometry, Value] = {}
        self.bases: dict[int, tuple[Value, torch.dtype]] = {}  # storage -> the value owning it
        self.parts: list[object] = []  # the graph's signature, op by op
        self.n_scalars = 0
        self.issued_on = self.rt.stream  # the stream the buffer's ops were issued on

    def take(self) -> Cut:
        """The buffer, whole, as a Cut; the tape starts empty."""
        ops, parts, stream = self.ops, self.parts, self.issued_on
        input_hosts, input_types = self.input_hosts, self.input_types
        self._reset()  # (first: the inputs it held must not count as holders of outputs)
        return Cut(ops, parts, stream, input_hosts, input_types, _observable(ops))

    def _known(self, t: Tensor) -> Value | None:
        known = self.values.get(id(t))
        if known is not None and known.ref() is t and known.where == _where(t):
            return known.value
        return None

    def nameable(self, t: Tensor) -> bool:
        """False when t shares memory with this buffer in a way the graph cannot name."""
        if self._known(t) is not None:
            return True
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr or ptr not in self.storages:
            return True  # memory from before the buffer (or none at all): a plain input
        if t.is_conj() or t.is_neg():
            return False  # a lazily conjugated/negated alias: not the same value
        value = self.geometry.get(_geometry(t, ptr))
        if value is not None:
            self._name(t, value)
            return True
        base = self.bases.get(ptr)
        if base is None or t.dtype != base[1]:
            return False
        # A view made beneath the dispatcher (autograd's reshapes, _unsafe_view): name it as
        # as_strided of the value that owns the storage, which reproduces it exactly.
        spec = _as_strided_spec()
        shape, stride, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        i = len(self.ops)
        types = ((t.shape, stride, offset, t.dtype),)
        call = ViewCall(spec, (TENSOR, shape, stride, offset), {}, types)
        self.ops.append(RecOp(spec.name, (base[0],), 0, None, [], [], [], ("", 0, ""), call))
        self.parts.append((spec.op, (base[0],), types))
        self._name(t, Value(i, 0))
        self.geometry[_geometry(t, ptr)] = Value(i, 0)
        return True

    def _name(self, t: Tensor, value: Value) -> None:
        self.values[id(t)] = _Known(value, weakref.ref(t), _where(t))

    def _wire(self, t: Tensor) -> Value:
        value = self._known(t)
        if value is not None:
            return value
        index = self.input_index.get(id(t))
        where = _where(t)
        if index is None or index[1] != where:  # (new, or it points elsewhere since)
            k = len(self.inputs)
            self.input_index[id(t)] = (k, where)
            self.inputs.append(t)  # held: its id and memory stay its own until the flush
            self.input_types.append(where)
            # Its memory as it is now: `p.data = ...` (Module.to/half) may swap the tensor's
            # storage before the buffer runs, and recorded ops must read what they saw. A
            # CPU tensor is copied: the op reads it as it is now, as on a device.
            self.input_hosts.append(t.clone() if t.is_cpu else self.rt.memory.host_alias(t))
            return Value(None, k)
        return Value(None, index[0])

    def record(
        self, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[float]
    ) -> OpValue:
        """The op as the buffer's next node; its results are device tensors not yet computed."""
        rt = self.rt
        if not self.ops:
            self.issued_on = rt.stream
        i = len(self.ops)
        wire = self._wire
        wiring = tuple([wire(t) for t in tensors])
        if entry.fresh_nbytes > rt.memory.allocator.capacity:  # never fits: the device's error now
            rt.memory.allocate(entry.fresh_nbytes)
        if rt.numerics:
            hosts = [torch.empty_strided(*meta[:2], dtype=meta[2]) for meta in entry.fresh]
        else:  # (memory never written, and nothing known of what lived there)
            hosts = [shape_only.empty(*meta[:2], dtype=meta[2]) for meta in entry.fresh]
            for h in hosts:
                shape_only.forget(h)
        outputs = [to_device(h) for h in hosts]
        self.ops.append(
            RecOp(
                spec.name,
                wiring,
                self.n_scalars,
                entry,
                scalars,
                [t.untyped_storage() for t in outputs],
                hosts,
                user_frame(),
            )
        )
        self.n_scalars += len(scalars)
        self.parts.append((id(entry), wiring))
        return self._returns(entry, tensors, outputs, i)

    def _returns(
        self, entry: Entry, tensors: list[Tensor], outputs: list[Tensor], i: int
    ) -> OpValue:
        """The op's return value; every tensor it returns now names this node's output."""
        results: list[Tensor | list[Tensor] | None] = []
        made = iter(outputs)
        j = 0
        for r in entry.returns:
            kind = r.kind
            if kind is FRESH:
                t = next(made)
                self._define(t, Value(i, j))
                results.append(t)
                j += 1
            elif kind is LIST:
                items = []
                for _ in r.sizes:
                    t = next(made)
                    self._define(t, Value(i, j))
                    items.append(t)
                    j += 1
                results.append(items)
            elif kind is NONE:
                results.append(None)
                j += 1
            else:  # write: the argument itself, now holding this node's result
                written = tensors[r.arg]
                self._name(written, Value(i, j))
                ptr = written.untyped_storage().data_ptr()
                if ptr in self.storages:
                    self.geometry[_geometry(written, ptr)] = Value(i, j)
                results.append(written)
                j += 1
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _define(self, t: Tensor, value: Value) -> None:
        self._name(t, value)
        ptr = t.untyped_storage().data_ptr()
        if ptr:  # (empty tensors have no memory to alias)
            self.storages.add(ptr)
            self.geometry[_geometry(t, ptr)] = value
            self.bases[ptr] = (value, t.dtype)

    def view(self, spec: OpSpec, args: Args, kwargs: Kwargs, result: OpValue) -> bool:
        """A view of a tensor this buffer can name becomes a node, so later ops find it.
        False: it views buffer memory through an alias never seen (the buffer must run)."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        tensors += [v for v in kwargs.values() if isinstance(v, Tensor)]
        if not any(self._known(t) is not None for t in tensors):
            if not all(self.nameable(t) for t in tensors):
                return False  # a view of buffer memory through an alias we never saw
            if not any(self._known(t) is not None for t in tensors):
                return True  # a view of memory from before the buffer: an input when used
        outs = result if isinstance(result, (list, tuple)) else (result,)
        wiring = tuple([self._wire(t) for t in tensors])
        i = len(self.ops)
        types = tuple([(o.shape, o.stride(), o.storage_offset(), o.dtype) for o in outs])
        call = ViewCall(
            spec,
            tuple(TENSOR if isinstance(a, Tensor) else a for a in args),
            {k: TENSOR if isinstance(v, Tensor) else v for k, v in kwargs.items()},
            types,
        )
        self.ops.append(RecOp(spec.name, wiring, 0, None, [], [], [], ("", 0, ""), call))
        # Same inputs and same output geometry: the same view (its arguments follow).
        self.parts.append((spec.op, wiring, types))
        for j, o in enumerate(outs):
            value = Value(i, j)
            self._name(o, value)
            self.geometry[_geometry(o, o.untyped_storage().data_ptr())] = value
        return True


@dataclass(frozen=True)
class Cut:
    """A cut of the buffer: its ops in order, the stream they were issued on, the memory and
    types of its inputs as first read, and per new output whether anything outlives the
    graph to see it (`observable`)."""

    ops: list[RecOp]
    parts: list[object]
    stream: int
    input_hosts: list[Tensor]
    input_types: list[Where]
    observable: list[bool]

    @property
    def signature(self) -> tuple[object, ...]:
        """What makes two cuts the same graph."""
        return (tuple(self.parts), tuple(self.observable))

    @property
    def launches(self) -> int:
        """How many of the recorded ops launch an executable of their own (views do not)."""
        return sum(1 for op in self.ops if op.entry is not None)

    def graph(self, name: str = "adaptive") -> tuple[Graph, graph_pb2.GraphDebug]:
        """The cut as one graph (its observable outputs only), with each node's source line."""
        ops = self.ops
        made = [
            Value(i, j)
            for i, op in enumerate(ops)
            if op.entry is not None
            for j in _fresh_slots(op.entry)
        ]
        outputs = tuple(v for v, seen in zip(made, self.observable, strict=True) if seen)
        graph = Graph(
            tuple(_input_type(where) for where in self.input_types),
            tuple(op.node() for op in ops),
            outputs,
            num_scalar_inputs=sum(len(op.scalars) for op in ops),
        )
        debug = graph_pb2.GraphDebug(name=name)
        for op in ops:
            loc = op.location
            debug.node_locations.add(file=loc[0], line=loc[1], function=loc[2])
        return graph, debug


def _observable(ops: list[RecOp]) -> list[bool]:
    """Per new output: can anything see its memory after the graph? Exactly when something
    besides the recorder holds its storage: a tensor on it (the output itself, a view, an
    alias made beneath the dispatcher, a tensor autograd saved for backward) or the storage
    object. The recorder holds no tensor of the buffer, only the storage, once."""
    flags = []
    for op in ops:
        if op.entry is None:
            continue
        for storage in op.storages:
            # refs to the storage object: op.storages, this loop's name, the call's argument
            flags.append(_use_count(storage._cdata) > 1 or _getrefcount(storage) > 3)
    return flags


def _input_type(where: Where) -> TensorType:
    """A graph input's type as the tensor was when first read (it may have changed since)."""
    _, shape, stride, dtype, _ = where
    return TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), 0)


def _view_node(op: RecOp) -> Node:
    call = op.view
    assert call is not None
    wiring = iter(op.wiring)
    spec = call.spec

    def arg(value: OpValue) -> ArgValue:
        return next(wiring) if value is TENSOR else _constant(value)

    named: list[tuple[str, ArgValue]] = []
    for k, a in enumerate(call.args):
        name = spec.positional_names[k] if k < len(spec.positional_names) else f"arg{k}"
        named.append((name, arg(a)))
    named += [(name, arg(v)) for name, v in call.kwargs.items()]
    types = tuple(
        TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), int(offset))
        for shape, stride, offset, dtype in call.types
    )
    return Node(spec.name, tuple(named), types, tuple(Alias(j, 0) for j in range(len(types))))


def _as_strided_spec() -> OpSpec:
    return spec_for(torch.ops.aten.as_strided.default)


def _geometry(t: Tensor, storage_ptr: int) -> Geometry:
    return (storage_ptr, t.shape, t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())


def _fresh_slots(entry: Entry) -> list[int]:
    """The node output index of each new tensor the op makes (in-place results and absent
    optional outputs take output slots too)."""
    return [j for j, r in enumerate(entry.outputs) if r.kind is FRESH]


def _shift_scalars(node: Node, offset: int) -> Node:
    if not offset:
        return node

    def shift(v: ArgValue) -> ArgValue:
        if isinstance(v, ScalarInput):
            return ScalarInput(v.index + offset)
        if isinstance(v, tuple):
            return tuple(shift(x) for x in v)
        return v

    return dataclasses.replace(node, args=tuple((n, shift(v)) for n, v in node.args))


def _constant(value: OpValue) -> ArgValue:
    """A view op's non-tensor argument, as the graph carries it (floats stay constants)."""
    if isinstance(value, float):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_constant(v) for v in value)
    return graph_arg(value, [], [0])
