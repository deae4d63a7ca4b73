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

import sys
import threading
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


@dataclass(eq=False)
class RecOp:
    """One recorded op: its per-op entry, its tensor arguments and where each came from."""

    name: str
    node: Node  # wired into the buffer: inputs are buffer inputs or earlier nodes' outputs
    entry: Any  # runtime.Entry (None for views)
    tensors: list[Tensor]
    scalars: list[Any]
    outputs: list[Tensor]  # new tensors this op made (preallocated), in output order
    hosts: list[Tensor]  # the CPU tensors whose memory those outputs are
    location: tuple[str, int, str]


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
        self._lock = threading.Lock()

    def _reset(self) -> None:
        self.ops: list[RecOp] = []
        self.values: dict[int, Value] = {}  # id(tensor) -> the graph value it holds now
        self.inputs: list[Tensor] = []
        self.input_index: dict[int, int] = {}
        self.storages: set[int] = set()  # storages of tensors made in this buffer
        self.parts: list[Any] = []  # the graph's signature, op by op
        self.stream = self.rt.stream

    # -- recording ------------------------------------------------------------------------------
    def offer(self, spec: Any, entry: Any, tensors: list[Tensor], scalars: list[Any]) -> Any:
        """Records the op, or cuts the buffer first; NOT_RECORDED: the caller runs it eagerly."""
        hazard = any(
            id(t) not in self.values
            and not t.is_cpu
            and t.untyped_storage().data_ptr() in self.storages
            for t in tensors
        )
        op = boundaries.NextOp(entry.fusible, entry.dynamic, self.rt.stream, hazard)
        cut = boundaries.decide(
            len(self.ops), self.stream, op, self.rt.timeline.queue_depth(), self.policy
        )
        if cut is not boundaries.Cut.NONE:
            self.flush(cut.value)
        if cut.runs_op_eagerly:
            return NOT_RECORDED
        return self._record(spec, entry, tensors, scalars)

    def _wire(self, t: Tensor) -> Value:
        value = self.values.get(id(t))
        if value is not None:
            return value
        index = self.input_index.get(id(t))
        if index is None:
            index = self.input_index[id(t)] = len(self.inputs)
            self.inputs.append(t)
        return Value(None, index)

    def _record(self, spec: Any, entry: Any, tensors: list[Tensor], scalars: list[Any]) -> Any:
        rt = self.rt
        i = len(self.ops)
        wiring = {Value(None, k): self._wire(t) for k, t in enumerate(tensors)}
        offset = sum(len(op.scalars) for op in self.ops)
        node = _shift_scalars(remap_node(entry.node, wiring), offset)
        hosts = [
            torch.empty_strided(shape, stride, dtype=dtype) for shape, stride, dtype in entry.fresh
        ]
        outputs = [to_device(h) for h in hosts]
        self.ops.append(
            RecOp(spec.name, node, entry, tensors, scalars, outputs, hosts, user_frame())
        )
        self.parts.append((id(entry), tuple(wiring.values())))
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
                self.values[id(tensors[size])] = Value(i, j)
                results.append(tensors[size])
                j += 1
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _define(self, t: Tensor, value: Value) -> None:
        self.values[id(t)] = value
        self.storages.add(t.untyped_storage().data_ptr())

    def view(self, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """A view of a tensor made in this buffer becomes a node, so later ops find it."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not any(id(t) in self.values for t in tensors):
            if any(t.untyped_storage().data_ptr() in self.storages for t in tensors):
                self.flush("hazard")  # a view of buffer memory through an alias we never saw
            return
        outs = list(result) if isinstance(result, (list, tuple)) else [result]
        named: list[tuple[str, ArgValue]] = []
        for k, a in enumerate(args):
            name = spec.positional_names[k] if k < len(spec.positional_names) else f"arg{k}"
            named.append((name, self._wire(a) if isinstance(a, Tensor) else _constant(a)))
        named += [(name, _constant(v)) for name, v in kwargs.items()]
        types = tuple(_tensor_type(o) for o in outs)
        node = Node(spec.name, tuple(named), types, tuple(Alias(j, 0) for j in range(len(outs))))
        i = len(self.ops)
        self.ops.append(RecOp(spec.name, node, None, tensors, [], outs, [], user_frame()))
        self.parts.append(
            (
                spec.name,
                tuple(self._wire(t) for t in tensors),
                tuple((o.shape, o.stride()) for o in outs),
            )
        )
        for j, o in enumerate(outs):
            self.values[id(o)] = Value(i, j)

    # -- cutting and running --------------------------------------------------------------------
    def flush(self, reason: str) -> None:
        if not self.ops:
            return
        ops, inputs, parts = self.ops, self.inputs, self.parts
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
        if state.loaded is not None:
            self._run_fused(state.loaded, ops, inputs, observable)
        else:
            self._run_op_by_op(ops)
            self._maybe_request(state, ops, inputs, observable)
        self._account(ops, observable)

    def _observable(self, ops: list[RecOp]) -> list[bool]:
        """Per new output: is anything outside the buffer holding it (or a view of it)?"""
        held: dict[int, int] = {}  # references the buffer itself holds to each tensor
        for op in ops:
            for t in op.outputs:
                held[id(t)] = held.get(id(t), 0) + 1
            for t in op.tensors:
                if id(t) in held:
                    held[id(t)] += 1
        alive: dict[int, bool] = {}
        for op in ops:
            outputs = op.outputs
            for k in range(len(outputs)):
                # getrefcount counts its own argument too
                alive[id(outputs[k])] = sys.getrefcount(outputs[k]) - 1 > held[id(outputs[k])]
        for op in reversed(ops):  # a live view keeps its base observable
            if op.entry is None and any(alive.get(id(t)) for t in op.outputs):
                for t in op.tensors:
                    if id(t) in alive:
                        alive[id(t)] = True
        # A tensor made elsewhere on the same storage (autograd's detached aliases, .data)
        # also observes it: the storage has more users than this buffer's tensors.
        by_storage: dict[int, list[Tensor]] = {}
        for op in ops:
            for t in op.outputs:
                by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
        for ptr, tensors in by_storage.items():
            users = torch._C._storage_Use_Count(tensors[0].untyped_storage()._cdata)
            if ptr == 0 or users > len(tensors) + 1:  # + 1: the storage object asked
                for t in tensors:
                    alive[id(t)] = True
        return [alive[id(t)] for op in ops if op.entry is not None for t in op.outputs]

    def _run_op_by_op(self, ops: list[RecOp]) -> None:
        rt = self.rt
        counts = rt.metrics.counts
        counts["op_by_op_graphs"] += 1
        for op in ops:
            if op.entry is None:
                continue  # views exist already: same storage, new metadata
            inputs = [t if t.is_cpu else rt.host_alias(t) for t in op.tensors]
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
        inputs: list[Tensor],
        observable: list[bool],
    ) -> None:
        rt = self.rt
        host = [t if t.is_cpu else rt.host_alias(t) for t in inputs]
        scalars = [s for op in ops for s in op.scalars]
        try:
            results = loaded.run(host, scalars, rt.generator)
        except ExecutionError as e:
            raise _located(_op_of_node(ops, e.node), e.cause) from e.cause
        hosts = [h for op in ops if op.entry is not None for h in op.hosts]
        for h, result in zip(
            [h for h, seen in zip(hosts, observable, strict=True) if seen], results, strict=True
        ):
            h.copy_(result)
        timeline = rt.timeline
        timeline.host_work(rt.target.host_submit_ns)
        timeline.enqueue(loaded.modelled_ns, rt.stream, loaded.engine_ns)
        rt.metrics.counts["launches"] += 1
        rt.metrics.counts["fused_executions"] += 1
        rt.metrics.counts["fused_ops"] += sum(1 for op in ops if op.entry is not None)

    def _account(self, ops: list[RecOp], observable: list[bool]) -> None:
        """HBM for the outputs that outlive the graph; the others were internal."""
        rt = self.rt
        made = [
            (t, h)
            for op in ops
            if op.entry is not None
            for t, h in zip(op.outputs, op.hosts, strict=True)
        ]
        for (t, host), seen in zip(made, observable, strict=True):
            if seen:
                rt.adopt(t, rt.allocate(host.untyped_storage().nbytes()), host)
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
    made = [
        Value(i, j)
        for i, op in enumerate(ops)
        if op.entry is not None
        for j in range(len(op.outputs))
    ]
    outputs = tuple(v for v, seen in zip(made, observable, strict=True) if seen)
    graph = Graph(
        tuple(_tensor_type(t) for t in inputs),
        tuple(op.node for op in ops),
        outputs,
        num_scalar_inputs=sum(len(op.scalars) for op in ops),
    )
    debug = graph_pb2.GraphDebug(name="adaptive")
    for op in ops:
        debug.node_locations.add(file=op.location[0], line=op.location[1], function=op.location[2])
    return graph, debug


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

    return Node(node.op, tuple((n, shift(v)) for n, v in node.args), node.outputs, node.aliases)


def _constant(value: Any) -> ArgValue:
    """A view op's non-tensor argument, as the graph carries it (floats stay constants)."""
    from trnsim.client.dispatch import _graph_arg

    if isinstance(value, float):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_constant(v) for v in value)
    return _graph_arg(value, [], [0])


def _tensor_type(t: Tensor) -> TensorType:
    return TensorType(tuple(t.shape), tuple(t.stride()), dtypes.from_name(str(t.dtype)), 0)


def _op_of_node(ops: list[RecOp], node: int) -> RecOp:
    return ops[node] if 0 <= node < len(ops) else ops[-1]


def _located(op: RecOp, cause: BaseException) -> BaseException:
    """The error of a recorded op, raised where the buffer was cut, naming where it was issued."""
    path, line, _ = op.location
    error = execution_error(op.name, cause)
    message = f"{op.name} failed on the neuron device (issued at {path}:{line}): {cause}"
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001
        return RuntimeError(message)
