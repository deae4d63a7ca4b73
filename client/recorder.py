"""Adaptive eager mode (NEURON_EAGER=adaptive): ops are recorded into a buffer and cut into
small graphs (scheduler/boundaries.py). A graph seen for the first time runs op by op
(per-op executables) while its fused executable compiles in the background
(scheduler/compile_policy.py); when the graph recurs and the executable is ready, it runs
fused, as one launch. Results equal eager mode bit for bit: both run the same ATen ops on
the CPU in the same order.

Recorded outputs are real device tensors from the start (their memory exists); they are
computed when the buffer is cut. Outputs nobody can observe after the graph (no live
reference) stay internal to the fused executable: no HBM accounted, no copy back.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from trnsim.client.errors import execution_error, user_frame
from trnsim.client.memory import to_device
from trnsim.compiler.graph import (
    Alias,
    ArgValue,
    Graph,
    Node,
    ScalarInput,
    TensorType,
    Value,
    remap_node,
    to_proto,
)
from trnsim.protos import graph_pb2
from trnsim.scheduler import boundaries, compile_policy
from trnsim.simulator import dtypes, execute
from trnsim.simulator.execute import ExecutionError

NOT_RECORDED = object()
Tensor = torch.Tensor


@dataclass(eq=False, slots=True)
class RecOp:
    """One recorded op: its per-op entry, its tensor arguments and where each came from."""

    name: str
    # Where each tensor argument comes from (a buffer input or an earlier node's output) and
    # where this op's floats start among the graph's scalars: the node is built from these
    # only when a fused compile is asked for.
    wiring: tuple[Value, ...]
    scalar_offset: int
    entry: Any  # runtime.Entry (None for views)
    tensors: list[Tensor]
    scalars: list[Any]
    # The new tensors this op made, held weakly: a strong reference would keep a gradient
    # from being stolen by AccumulateGrad (it clones tensors someone else holds).
    refs: list[weakref.ref[Tensor]]
    storages: list[Any]  # their storages (held: an alias may outlive the tensor)
    hosts: list[Tensor]  # the CPU tensors whose memory those outputs are
    types: list[Any]  # views: (sizes, strides, offset) per output; the node's types follow
    location: tuple[str, int, str]
    view: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None  # views: (spec, args, kwargs)

    def node(self) -> Node:
        if self.view is not None:
            return _view_node(self)
        wiring = {Value(None, k): v for k, v in enumerate(self.wiring)}
        return _shift_scalars(remap_node(self.entry.node, wiring), self.scalar_offset)


@dataclass
class GraphState:
    """What the runtime knows of one graph signature."""

    history: compile_policy.GraphHistory = field(default_factory=compile_policy.GraphHistory)
    future: Future[Any] | None = None
    loaded: execute.LoadedExecutable | None = None


class Recorder:
    def __init__(self, runtime: Any) -> None:
        self.rt = runtime
        self.policy = boundaries.Policy()
        self.graphs: dict[tuple[Any, ...], GraphState] = {}
        self._reset()
        self._compiles: Any = None  # a one-thread pool for in-process background compiles

    def _reset(self) -> None:
        self.ops: list[RecOp] = []
        # id(tensor) -> (the graph value it holds now, a weak reference to check the id)
        self.values: dict[int, tuple[Value, weakref.ref[Tensor]]] = {}
        self.inputs: list[Tensor] = []
        self.input_hosts: list[Tensor] = []
        self.input_index: dict[int, int] = {}
        self.storages: set[int] = set()  # storages of tensors made in this buffer
        # (storage, sizes, strides, offset, dtype) -> the value a tensor of that geometry
        # holds: an alias made without us (autograd's detached gradients) is the same value.
        self.geometry: dict[tuple[Any, ...], Value] = {}
        self.bases: dict[int, tuple[Value, torch.dtype]] = {}  # storage -> the value owning it
        self.parts: list[Any] = []  # the graph's signature, op by op
        self.n_scalars = 0
        self.stream = self.rt.stream

    # -- recording ------------------------------------------------------------------------------
    def offer(self, spec: Any, entry: Any, tensors: list[Tensor], scalars: list[Any]) -> Any:
        """Records the op, or cuts the buffer first; NOT_RECORDED: the caller runs it eagerly."""
        hazard = any(
            not t.is_cpu and not self._known(t) and not self._adopt_alias(t) for t in tensors
        )
        op = boundaries.NextOp(entry.fusible, entry.dynamic, self.rt.stream, hazard)
        cut = boundaries.decide(
            len(self.ops), self.stream, op, self.rt.timeline.queue_depth(), self.policy
        )
        if cut is not boundaries.Cut.NONE:
            self.flush(cut.value)
        if cut.runs_op_eagerly:
            return NOT_RECORDED
        if not self.ops:
            self.stream = self.rt.stream
        return self._record(spec, entry, tensors, scalars)

    def _adopt_alias(self, t: Tensor) -> bool:
        """False when t shares memory with this buffer in a way the graph cannot name."""
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.storages:
            return True  # memory from before the buffer: a plain input
        if t.is_conj() or t.is_neg():
            return False  # a lazily conjugated/negated alias: not the same value
        value = self.geometry.get(_geometry(t, ptr))
        if value is not None:
            self.values[id(t)] = (value, weakref.ref(t))
            return True
        base = self.bases.get(ptr)
        if base is None or t.dtype != base[1]:
            return False
        # A view made beneath the dispatcher (autograd's reshapes): name it as as_strided of
        # the tensor that owns the storage, which reproduces it exactly.
        spec = _as_strided_spec()
        args = (t, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        i = len(self.ops)
        self.ops.append(
            RecOp(
                spec.name,
                (base[0],),
                0,
                None,
                [t],
                [],
                [weakref.ref(t)],
                [t.untyped_storage()],
                [],
                [(t.shape, t.stride(), t.storage_offset(), t.dtype)],
                ("", 0, ""),
                (spec, args, {}),
            )
        )
        self.parts.append((spec.op, (base[0],), ((t.shape, t.stride(), t.storage_offset()),)))
        self.values[id(t)] = (Value(i, 0), weakref.ref(t))
        self.geometry[_geometry(t, ptr)] = Value(i, 0)
        return True

    def _known(self, t: Tensor) -> bool:
        entry = self.values.get(id(t))
        return entry is not None and entry[1]() is t

    def _wire(self, t: Tensor) -> Value:
        entry = self.values.get(id(t))
        if entry is not None and entry[1]() is t:  # (an id can be reused once its tensor dies)
            return entry[0]
        index = self.input_index.get(id(t))
        if index is None:
            index = self.input_index[id(t)] = len(self.inputs)
            self.inputs.append(t)
            # Its memory as it is now: `p.data = ...` (Module.to/half) may swap the tensor's
            # storage before the buffer runs, and recorded ops must read what they saw.
            self.input_hosts.append(t if t.is_cpu else self.rt.host_alias(t))
        return Value(None, index)

    def _record(self, spec: Any, entry: Any, tensors: list[Tensor], scalars: list[Any]) -> Any:
        rt = self.rt
        i = len(self.ops)
        wire = self._wire
        wiring = tuple([wire(t) for t in tensors])
        hosts = [
            torch.empty_strided(shape, stride, dtype=dtype) for shape, stride, dtype in entry.fresh
        ]
        outputs = [to_device(h) for h in hosts]
        self.ops.append(
            RecOp(
                spec.name,
                wiring,
                self.n_scalars,
                entry,
                tensors,
                scalars,
                [weakref.ref(t) for t in outputs],
                [t.untyped_storage() for t in outputs],
                hosts,
                [],
                user_frame(),
            )
        )
        self.n_scalars += len(scalars)
        self.parts.append((id(entry), wiring))
        results = self._returns(entry, tensors, outputs, i)
        rt.timeline.host_work(rt.target.host_record_op_ns)
        rt.metrics.counts["ops_recorded"] += 1
        return results

    def _returns(self, entry: Any, tensors: list[Tensor], outputs: list[Tensor], i: int) -> Any:
        """The op's return value; every tensor it returns now names this node's output."""
        results: list[Any] = []
        made = iter(outputs)
        j = 0
        for kind, size in entry.returns:
            if kind == "fresh":
                t = next(made)
                self._define(t, Value(i, j))
                results.append(t)
                j += 1
            elif kind == "list":
                items = []
                for _ in size:
                    t = next(made)
                    self._define(t, Value(i, j))
                    items.append(t)
                    j += 1
                results.append(items)
            elif kind == "none":
                results.append(None)
                j += 1
            else:  # write: the argument itself, now holding this node's result
                written = tensors[size]
                self.values[id(written)] = (Value(i, j), weakref.ref(written))
                ptr = written.untyped_storage().data_ptr()
                if ptr in self.storages:
                    self.geometry[_geometry(written, ptr)] = Value(i, j)
                results.append(tensors[size])
                j += 1
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _define(self, t: Tensor, value: Value) -> None:
        self.values[id(t)] = (value, weakref.ref(t))
        ptr = t.untyped_storage().data_ptr()
        self.storages.add(ptr)
        self.geometry[_geometry(t, ptr)] = value
        self.bases[ptr] = (value, t.dtype)

    def view(self, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """A view of a tensor made in this buffer becomes a node, so later ops find it."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not any(self._known(t) for t in tensors):
            if not all(self._adopt_alias(t) for t in tensors):
                self.flush("hazard")  # a view of buffer memory through an alias we never saw
                return
            if not any(self._known(t) for t in tensors):
                return
        outs = result if isinstance(result, (list, tuple)) else (result,)
        wiring = tuple([self._wire(t) for t in tensors])
        i = len(self.ops)
        refs = [weakref.ref(o) for o in outs]
        storages = [o.untyped_storage() for o in outs]
        shapes = tuple([(o.shape, o.stride(), o.storage_offset(), o.dtype) for o in outs])
        self.ops.append(
            RecOp(
                spec.name,
                wiring,
                0,
                None,
                tensors,
                [],
                refs,
                storages,
                [],
                list(shapes),
                ("", 0, ""),
                (spec, args, kwargs),
            )
        )
        # Same inputs and same output geometry: the same view (its arguments follow).
        self.parts.append((spec.op, wiring, shapes))
        values, geometry = self.values, self.geometry
        for j, (o, ref, storage, shape) in enumerate(
            zip(outs, refs, storages, shapes, strict=True)
        ):
            value = Value(i, j)
            values[id(o)] = (value, ref)
            geometry[(storage.data_ptr(), *shape, o.is_conj(), o.is_neg())] = value

    # -- cutting and running --------------------------------------------------------------------
    def flush(self, reason: str) -> None:
        if not self.ops:
            return
        ops, inputs, parts, stream = self.ops, self.inputs, self.parts, self.stream
        input_hosts = self.input_hosts
        observable = self._observable(ops)
        self._reset()
        counts = self.rt.metrics.counts
        counts["graphs_formed"] += 1
        counts[f"cut_{reason}"] = counts.get(f"cut_{reason}", 0) + 1
        signature = (tuple(parts), tuple(observable))
        state = self.graphs.get(signature)
        if state is None:
            state = self.graphs[signature] = GraphState()
        state.history.seen += 1
        self._collect(state)
        current, self.rt.stream = self.rt.stream, stream  # the work goes where it was issued
        try:
            if state.loaded is not None:
                self._run_fused(state.loaded, ops, input_hosts, observable)
            else:
                self._run_op_by_op(ops, input_hosts)
                self._maybe_request(state, ops, inputs, observable)
        finally:
            self.rt.stream = current
        self._account(ops, observable)

    def _observable(self, ops: list[RecOp]) -> list[bool]:
        """Per new output: can anything outside the buffer see it after the graph? Its tensor
        is referenced from outside (or a live view of it is), or another tensor shares its
        storage (an alias made without us: autograd's detached gradients, .data)."""
        held: dict[int, int] = {}  # ops later in the buffer hold their input tensors
        for op in ops:
            for t in op.tensors:
                held[id(t)] = held.get(id(t), 0) + 1
        alive: list[list[bool]] = []
        for op in ops:
            flags = []
            for ref in op.refs:
                live = ref()
                # getrefcount counts its argument and our local `live`
                flags.append(live is not None and sys.getrefcount(live) - 2 > held.get(id(live), 0))
                del live
            alive.append(flags)
        index = {
            id(r()): (o, k)
            for o, op in enumerate(ops)
            for k, r in enumerate(op.refs)
            if r() is not None
        }
        for o in range(len(ops) - 1, -1, -1):  # a live view keeps its base observable
            if ops[o].entry is None and any(alive[o]):
                for t in ops[o].tensors:
                    if id(t) in index:
                        b, k = index[id(t)]
                        alive[b][k] = True
        users: dict[int, int] = {}  # storage -> tensors of this buffer still on it
        for op in ops:
            for ref, storage in zip(op.refs, op.storages, strict=True):
                if ref() is not None:
                    users[storage.data_ptr()] = users.get(storage.data_ptr(), 0) + 1
        for o, op in enumerate(ops):
            for k, storage in enumerate(op.storages):
                ptr = storage.data_ptr()
                # + 1: the storage object we hold
                if ptr == 0 or torch._C._storage_Use_Count(storage._cdata) > users.get(ptr, 0) + 1:
                    alive[o][k] = True
        return [
            flag
            for op, flags in zip(ops, alive, strict=True)
            if op.entry is not None
            for flag in flags
        ]

    def _run_op_by_op(self, ops: list[RecOp], input_hosts: list[Tensor]) -> None:
        rt = self.rt
        counts = rt.metrics.counts
        counts["op_by_op_graphs"] += 1
        for op in ops:
            if op.entry is None:
                continue  # views exist already: same storage, new metadata
            inputs = [
                input_hosts[v.index] if v.node is None else rt.host_alias(t)
                for t, v in zip(op.tensors, op.wiring, strict=True)
            ]
            try:
                results = op.entry.loaded.run(inputs, op.scalars, rt.generator)
            except ExecutionError as e:
                raise _located(op, e.cause) from e.cause
            made = iter(op.hosts)
            kinds = _flat_kinds(op.entry.returns)
            assert len(kinds) == len(results), (op.name, op.entry.returns, len(results))
            for (kind, _), result in zip(kinds, results, strict=True):
                if kind == "fresh":
                    next(made).copy_(result)
            rt.launch(op.entry.loaded)
            counts["op_by_op_ops"] += 1

    def _run_fused(
        self,
        loaded: execute.LoadedExecutable,
        ops: list[RecOp],
        input_hosts: list[Tensor],
        observable: list[bool],
    ) -> None:
        rt = self.rt
        host = input_hosts
        scalars = [s for op in ops for s in op.scalars]
        hosts = [h for op in ops if op.entry is not None for h in op.hosts]
        seen_hosts = [h for h, seen in zip(hosts, observable, strict=True) if seen]
        try:
            results = loaded.run(host, scalars, rt.generator, seen_hosts)
        except ExecutionError as e:
            raise _located(_op_named(ops, e.op), e.cause) from e.cause
        for h, result in zip(seen_hosts, results, strict=True):
            if result is not h:  # computed elsewhere (no in-place out= kernel): copy it in
                h.copy_(result)
        timeline = rt.timeline
        timeline.host_work(rt.target.host_submit_ns)
        timeline.enqueue(loaded.modelled_ns, rt.stream, loaded.engine_ns)
        rt.metrics.counts["launches"] += 1
        rt.metrics.counts["hbm_bytes"] += loaded.hbm_bytes
        rt.metrics.counts["fused_executions"] += 1
        rt.metrics.counts["fused_ops"] += sum(1 for op in ops if op.entry is not None)

    def _account(self, ops: list[RecOp], observable: list[bool]) -> None:
        """HBM for the outputs that outlive the graph; the others were internal."""
        rt = self.rt
        made = [
            (storage, h)
            for op in ops
            if op.entry is not None
            for storage, h in zip(op.storages, op.hosts, strict=True)
        ]
        for (storage, host), seen in zip(made, observable, strict=True):
            if seen:
                rt.adopt_storage(storage, rt.allocate(host.untyped_storage().nbytes()), host)
            else:
                rt.metrics.counts["internal_outputs"] += 1

    # -- fused compiles -------------------------------------------------------------------------
    def _maybe_request(
        self, state: GraphState, ops: list[RecOp], inputs: list[Tensor], observable: list[bool]
    ) -> None:
        rt = self.rt
        n = sum(1 for op in ops if op.entry is not None)
        if n < 2:
            return
        t = rt.target
        saving = compile_policy.predicted_saving_ns(
            n, t.launch_overhead_ns, t.host_dispatch_op_ns, t.host_record_op_ns
        )
        shared = hasattr(rt.compiler, "submit")
        if not compile_policy.should_request(
            state.history, saving, compile_policy.predicted_compile_ns(len(ops)), shared
        ):
            return
        state.history.requested = True
        rt.metrics.counts["fused_compiles_requested"] += 1
        graph, debug = _graph(ops, inputs, observable)
        state.future = self._compile_async(graph, debug)

    def _compile_async(self, graph: Graph, debug: graph_pb2.GraphDebug) -> Future[Any]:
        rt = self.rt
        proto = to_proto(graph)
        if hasattr(rt.compiler, "submit"):  # the daemon: low priority, answered when done
            from trnsim.client.compile_client import compile_request

            request = compile_request(proto, rt.target.name, rt.options, debug, background=True)
            future: Future[Any] = rt.compiler.submit(request)
            return future
        if self._compiles is None:
            from concurrent.futures import ThreadPoolExecutor

            self._compiles = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trnsim-fuse")
        return self._compiles.submit(rt.compiler.compile, proto, rt.target.name, rt.options, debug)  # type: ignore[no-any-return]

    def _collect(self, state: GraphState) -> None:
        """A finished background compile becomes the graph's executable (or a failure)."""
        future = state.future
        if future is None or not future.done():
            return
        state.future = None
        counts = self.rt.metrics.counts
        try:
            exe = _executable(future.result())
        except Exception:  # noqa: BLE001  (any failure: remember it and keep running op by op)
            exe = None
        if exe is None:
            state.history.failed = True
            counts["fused_compiles_failed"] += 1
            return
        state.loaded = execute.load(exe)
        state.history.ready = True
        counts["fused_compiles_ready"] += 1


def _executable(result: Any) -> Any:
    """An Executable from an in-process compile or a daemon CompileResult (None: failed)."""
    from trnsim.protos import compile_service_pb2 as svc
    from trnsim.protos import executable_pb2

    if isinstance(result, executable_pb2.Executable):
        return result
    if isinstance(result, svc.CompileResult) and result.WhichOneof("outcome") == "executable":
        from trnsim.daemon.cache import blob_ok

        if blob_ok(result.executable):
            return executable_pb2.Executable.FromString(result.executable.data)
    return None


def _graph(
    ops: list[RecOp], inputs: list[Tensor], observable: list[bool]
) -> tuple[Graph, graph_pb2.GraphDebug]:
    from trnsim.client.dispatch import tensor_type  # (dispatch imports this module)

    made = [
        Value(i, j)
        for i, op in enumerate(ops)
        if op.entry is not None
        for j in _fresh_slots(op.entry)
    ]
    outputs = tuple(v for v, seen in zip(made, observable, strict=True) if seen)
    graph = Graph(
        tuple(tensor_type(t) for t in inputs),
        tuple(op.node() for op in ops),
        outputs,
        num_scalar_inputs=sum(len(op.scalars) for op in ops),
    )
    debug = graph_pb2.GraphDebug(name="adaptive")
    for op in ops:
        debug.node_locations.add(file=op.location[0], line=op.location[1], function=op.location[2])
    return graph, debug


def _view_node(op: RecOp) -> Node:
    assert op.view is not None
    spec, args, kwargs = op.view
    wiring = iter(op.wiring)
    named: list[tuple[str, ArgValue]] = []
    for k, a in enumerate(args):
        name = spec.positional_names[k] if k < len(spec.positional_names) else f"arg{k}"
        named.append((name, next(wiring) if isinstance(a, Tensor) else _constant(a)))
    named += [(name, _constant(v)) for name, v in kwargs.items()]
    types = tuple(
        TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), offset)
        for shape, stride, offset, dtype in op.types
    )
    return Node(spec.name, tuple(named), types, tuple(Alias(j, 0) for j in range(len(types))))


def _as_strided_spec() -> Any:
    from trnsim.client.dispatch import _SPECS, OpSpec

    op = torch.ops.aten.as_strided.default
    spec = _SPECS.get(op)
    if spec is None:
        spec = _SPECS[op] = OpSpec(op)
    return spec


def _geometry(t: Tensor, storage_ptr: int) -> tuple[Any, ...]:
    return (storage_ptr, t.shape, t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())


def _fresh_slots(entry: Any) -> list[int]:
    """The node output index of each new tensor the op makes (in-place results and absent
    optional outputs take output slots too)."""
    return [j for j, (kind, _) in enumerate(_flat_kinds(entry.returns)) if kind == "fresh"]


def _flat_kinds(returns: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for kind, size in returns:
        if kind == "list":
            out.extend(("fresh", n) for n in size)
        else:
            out.append((kind, size))
    return out


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


def _constant(value: Any) -> ArgValue:
    """A view op's non-tensor argument, as the graph carries it (floats stay constants)."""
    from trnsim.client.dispatch import _graph_arg

    if isinstance(value, float):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_constant(v) for v in value)
    return _graph_arg(value, [], [0])


def _op_named(ops: list[RecOp], name: str) -> RecOp:
    """The recorded op a fused executable's failing node came from. Node indices change in
    the compiler's rewrites, so the op is found by name: the first recorded one (a later op
    of the same name cannot have run before it)."""
    for op in ops:
        if op.entry is not None and op.name == name:
            return op
    return ops[-1]


def _located(op: RecOp, cause: BaseException) -> BaseException:
    """The error of a recorded op, raised where the buffer was cut, naming where it was issued."""
    path, line, _ = op.location
    return execution_error(op.name, cause, f"{path}:{line}")
