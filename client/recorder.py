"""Adaptive eager mode (NEURON_EAGER=adaptive): ops are recorded into a buffer and cut into
small graphs (scheduler/boundaries.py). A graph seen for the first time runs op by op
(per-op executables) while its fused executable compiles in the background
(scheduler/compile_policy.py); when the graph recurs and the executable is ready, it runs
fused, as one launch. Results equal eager mode bit for bit: both run the same ATen ops on
the CPU in the same order.

Recorded outputs are real device tensors from the start (their memory exists); they are
computed when the buffer is cut. The recorder holds no tensor of the buffer, only the new
storages: an output whose storage nothing else holds when the graph is cut (no tensor, view,
alias or autograd-saved tensor on it) can never be observed, and stays internal to the
fused executable: no HBM accounted, no copy back. Values are named by the memory they live
in, so both paths (op by op, fused) run the same ATen ops on the same memory in order.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from trnsim.client import explain, runtime
from trnsim.client.errors import execution_error, user_frame
from trnsim.client.memory import to_device
from trnsim.client.ops import (
    FRESH,
    LIST,
    NONE,
    NOT_RECORDED,
    Entry,
    OpSpec,
    graph_arg,
    spec_for,
)
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
from trnsim.policy import boundaries, compile_policy
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator import dtypes, execute, shape_only
from trnsim.simulator.execute import ExecutionError

log = logging.getLogger(__name__)
Tensor = torch.Tensor
_use_count = torch._C._storage_Use_Count
_getrefcount = sys.getrefcount


class _Placeholder:
    """Where a view call's tensor argument was (its value comes from the op's wiring)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Placeholder()


@dataclass(frozen=True, slots=True)
class ViewCall:
    """A recorded view: the call with its tensors replaced by TENSOR, and each output's
    (sizes, strides, storage offset, dtype)."""

    spec: OpSpec
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    types: tuple[tuple[Any, ...], ...]

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
    scalars: list[Any]
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


class _Snapshot:
    """A copy of the memory a graph's inputs live in (each storage once, whole: inputs may
    overlap, or be expanded views no copy_ can write) and of the generator's state."""

    def __init__(self, inputs: list[Tensor], generator: torch.Generator, cpu: bool) -> None:
        """cpu: the graph draws from the CPU's generator too (a region's dropout)."""
        self.generator, self.state = generator, generator.get_state()
        self.cpu_state = torch.default_generator.get_state() if cpu else None
        storages = {h.untyped_storage().data_ptr(): h.untyped_storage() for h in inputs}
        self.saved = [(_bytes(s), _bytes(s).clone()) for s in storages.values()]

    def restore(self) -> None:
        for memory, copy in self.saved:
            memory.copy_(copy)
        self.generator.set_state(self.state)
        if self.cpu_state is not None:
            torch.default_generator.set_state(self.cpu_state)


def _bytes(storage: torch.UntypedStorage) -> Tensor:
    """A storage's whole memory as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


@dataclass
class GraphState:
    """What the runtime knows of one graph signature."""

    history: compile_policy.GraphHistory = field(default_factory=compile_policy.GraphHistory)
    future: Future[executable_pb2.Executable] | None = None
    submitted_ns: int = 0  # the simulated host time the compile was asked for
    arrived: executable_pb2.Executable | None = None  # compiled, not yet usable (sim. time)
    ready_at_ns: int = 0
    loaded: execute.LoadedExecutable | None = None
    verified: bool = False  # the fused executable ran once without failing
    fallback: bool = False  # it failed where op by op did not: this graph runs op by op


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


# Ops whose CPU kernels can return outputs of other shapes than their Meta kernels say
# (batch norm in eval returns empty save_mean/save_invstd on the CPU, embedding_bag empty
# offsets...): found by running every OpInfo sample (forward and backward) on the CPU and on
# meta. A region runs each on its own the first time, to see what it really returns.
SHAPES_DIFFER_FROM_META = frozenset(
    [
        "aten::native_batch_norm.default",
        "aten::_native_batch_norm_legit.default",
        "aten::_native_batch_norm_legit.no_stats",
        "aten::_native_batch_norm_legit_no_training.default",
        "aten::_embedding_bag_forward_only.default",
        "aten::_embedding_bag.default",
    ]
)


class Recorder:
    def __init__(self, rt: runtime.Runtime, region: bool = False) -> None:
        """region: the recorder of compiled mode's regions (client/compiled.py). A region
        (one FX graph's run) is recorded whole, cut only where it must be (a hazard, a
        data-dependent shape, an op the compiler cannot take, an op signature never run),
        and at its end compiled at once at the fused level if it is new, then launched.
        Its ops cost the simulated host nothing to record: a native compiled runtime
        launches the graph, it does not trace it again."""
        self.rt = rt
        self.region = region
        self.policy = (
            boundaries.Policy(size_cap=1 << 30, drain_min_ops=1 << 30)
            if region
            else boundaries.Policy()
        )
        self.graphs: dict[tuple[Any, ...], GraphState] = {}
        self._reset()
        self._warned_fallback = False

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
        self.parts: list[Any] = []  # the graph's signature, op by op
        self.n_scalars = 0
        self.issued_on = self.rt.stream  # the stream the buffer's ops were issued on

    # -- recording ------------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return bool(self.ops)

    def offer(self, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[Any]) -> Any:
        """Records the op, or cuts the buffer first; NOT_RECORDED: the caller runs it eagerly."""
        hazard = any(not t.is_cpu and not self._nameable(t) for t in tensors)
        # A region records an op signature never run too (its metadata is the Meta
        # kernels', as the compiled graph's is), unless the CPU kernel may give outputs of
        # other shapes: then it runs on its own first, as in adaptive mode.
        verified = entry.verified or (self.region and spec.name not in SHAPES_DIFFER_FROM_META)
        # A draw from the CPU's generator keeps its place in a region nothing else in which
        # draws from it: the region runs at its end, in order, with no user code between.
        fusible = entry.fusible or (entry.cpu_draw and self.region and self.rt.region_draws)
        op = boundaries.NextOp(fusible, entry.dynamic, self.rt.stream, hazard, verified)
        cut = boundaries.decide(
            len(self.ops), self.issued_on, op, self.rt.queue_depth(), self.policy
        )
        if cut is not boundaries.Cut.NONE:
            bound = self.rt.bound if self.region else None
            if bound is not None and bound.compile_only:  # (nothing of that trace may run)
                bound.cut = f"cut ({cut.value})"
                raise runtime.RegionCut(f"{spec.name} cuts the region ({cut.value})")
            self.flush(cut.value)
        if cut.runs_op_eagerly:
            return NOT_RECORDED
        if not self.ops:
            self.issued_on = self.rt.stream
        return self._record(spec, entry, tensors, scalars)

    def _known(self, t: Tensor) -> Value | None:
        known = self.values.get(id(t))
        if known is not None and known.ref() is t and known.where == _where(t):
            return known.value
        return None

    def _nameable(self, t: Tensor) -> bool:
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
            self.input_hosts.append(t.clone() if t.is_cpu else self.rt.host_alias(t))
            return Value(None, k)
        return Value(None, index[0])

    def _record(self, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[Any]) -> Any:
        rt = self.rt
        i = len(self.ops)
        wire = self._wire
        wiring = tuple([wire(t) for t in tensors])
        if entry.fresh_nbytes > rt.allocator.capacity:  # never fits: the device's error now
            rt.allocate(entry.fresh_nbytes)
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
        results = self._returns(entry, tensors, outputs, i)
        if not self.region:
            rt.host_work(rt.target.host_record_op_ns)
        rt.count("ops_recorded")
        return results

    def _returns(self, entry: Entry, tensors: list[Tensor], outputs: list[Tensor], i: int) -> Any:
        """The op's return value; every tensor it returns now names this node's output."""
        results: list[Any] = []
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

    def view(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        """A view of a tensor this buffer can name becomes a node, so later ops find it."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        tensors += [v for v in kwargs.values() if isinstance(v, Tensor)]
        if not any(self._known(t) is not None for t in tensors):
            if not all(self._nameable(t) for t in tensors):
                self.flush("hazard")  # a view of buffer memory through an alias we never saw
                return
            if not any(self._known(t) is not None for t in tensors):
                return  # a view of memory from before the buffer: an input when used
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

    # -- cutting and running --------------------------------------------------------------------
    def flush(self, reason: str) -> None:
        if not self.ops:
            return
        ops, parts, stream = self.ops, self.parts, self.issued_on
        input_hosts, input_types = self.input_hosts, self.input_types
        self._reset()
        observable = _observable(ops)
        bound = self.rt.bound if self.region else None
        if bound is not None and (reason != "region_end" or bound.cut):
            bound.cut = bound.cut or f"cut ({reason})"
            if bound.compile_only:  # (a trace at the bucket's sizes: nothing of it runs)
                if reason == "region_end":
                    return
                raise runtime.RegionCut(f"the region is cut before its end ({reason})")
            bound = None  # it runs as regions without a bucket do
        if bound is not None and bound.compile_only:
            graph, debug = _graph(ops, input_types, observable, "compiled")
            bound.executable = self.rt.executable_for(graph, debug, self.rt.fused_options)
            self.rt.count("compiled_buckets")
            return
        self.rt.count("graphs_formed")
        self.rt.count(f"cut_{reason}")
        if not self.region:
            explain.note_cut(reason, ops[-1].name)
        signature = (tuple(parts), tuple(observable))
        state = self.graphs.get(signature)
        if state is None:
            state = self.graphs[signature] = GraphState()
        state.history.seen += 1
        self._collect(state)
        if state.history.seen == 1 and not self.region and self.rt.compiles_shared:
            self._fetch(state, ops, input_types, observable)
        if self.region and state.loaded is None and not state.fallback:
            if bound is not None and bound.executable is not None:
                # A size inside a compiled bucket: the bucket's executable, run at this size
                # (the graph as recorded here gives its numerics; nothing compiles).
                graph, debug = _graph(ops, input_types, observable, "compiled")
                state.loaded = bound.executable.at_size(to_proto(graph), debug)
                state.history.requested = state.history.ready = True
            else:
                self._compile_now(state, ops, input_types, observable)
        if bound is not None:
            self.rt.count("compiled_bucket_runs")
        with self.rt.on_stream(stream):  # the work goes where it was issued
            if state.loaded is not None and not state.fallback:
                self._run_fused(state, ops, input_hosts, observable)
            else:
                self._run_op_by_op(ops, input_hosts, observable)
                self._maybe_request(state, ops, input_types, observable)
        self._account(ops, observable)

    def _run_op_by_op(
        self, ops: list[RecOp], input_hosts: list[Tensor], observable: list[bool]
    ) -> None:
        """Each op on its own executable, over the CPU memory its arguments name: the same
        values a fused run computes, one launch per op."""
        rt = self.rt
        rt.count("op_by_op_graphs")
        env: dict[Value, Any] = {}
        seen = iter(observable)
        for i, op in enumerate(ops):
            args = [input_hosts[v.index] if v.node is None else env[v] for v in op.wiring]
            entry = op.entry
            try:
                if entry is None:  # a view: no launch, only metadata
                    assert op.view is not None
                    for j, out in enumerate(op.view.run(args)):
                        env[Value(i, j)] = out
                    continue
                loaded = entry.executable()
                if not rt.numerics:  # (what shape-only mode assumes is told at op's line)
                    shape_only.issued.where = f"{op.location[0]}:{op.location[1]}"
                results = loaded.run(entry.inputs_of(args), op.scalars, rt.generator)
                shape_only.issued.where = ""
                made = iter(op.hosts)
                kinds = entry.outputs
                if len(kinds) != len(results):
                    raise RuntimeError(f"{len(results)} results where {len(kinds)} were recorded")
                for j, (r, result) in enumerate(zip(kinds, results, strict=True)):
                    if r.kind is FRESH:
                        host, seen_out = next(made), next(seen)
                        if rt.numerics:
                            result = _settle(host, result, seen_out)
                        else:
                            result = shape_only.settle(host, result)
                    env[Value(i, j)] = result
            except Exception as e:  # noqa: BLE001  (named with the op and its source line)
                cause = e.cause if isinstance(e, ExecutionError) else e
                raise _located(op, cause, ops) from cause
            rt.launch(loaded, where=lambda op=op: [op.location])  # type: ignore[misc]
            rt.count("op_by_op_ops")

    def _run_fused(
        self,
        state: GraphState,
        ops: list[RecOp],
        input_hosts: list[Tensor],
        observable: list[bool],
    ) -> None:
        """One launch of the graph's fused executable. Its first run keeps a copy of what it
        may change (the inputs' memory, the generator): if it fails, that is put back and the
        ops run one by one. If they succeed, the fused path was at fault, and the graph runs
        op by op from then on; if they fail too, the fault was the user's, named by op."""
        rt = self.rt
        loaded = state.loaded
        assert loaded is not None
        scalars = [s for op in ops for s in op.scalars]
        hosts = [h for op in ops if op.entry is not None for h in op.hosts]
        seen_hosts = [h for h, seen in zip(hosts, observable, strict=True) if seen]
        cpu = any(op.entry is not None and op.entry.cpu_draw for op in ops)
        # (shape-only mode: no values to put back; a failure is named by op)
        saved = (
            None if state.verified or not rt.numerics else _Snapshot(input_hosts, rt.generator, cpu)
        )
        try:
            results = loaded.run(input_hosts, scalars, rt.generator, seen_hosts)
            if len(results) != len(seen_hosts):
                raise RuntimeError(f"{len(results)} outputs, {len(seen_hosts)} expected")
        except Exception as e:  # noqa: BLE001  (whatever failed, op by op decides)
            if saved is None:
                cause = e.cause if isinstance(e, ExecutionError) else e
                raise _located(_op_named(ops, getattr(e, "op", "")), cause, ops) from cause
            saved.restore()
            self._run_op_by_op(ops, input_hosts, observable)
            self._fall_back(state, e)
            return
        mismatch = saved is not None and next(  # (the first run: a signature's shapes hold)
            (
                (h, r)
                for h, r in zip(seen_hosts, results, strict=True)
                if r is not h and (r.shape != h.shape or r.dtype != h.dtype)
            ),
            None,
        )
        if mismatch:  # (an op whose CPU kernel disagrees with its Meta kernel)
            h, r = mismatch
            raise RuntimeError(
                f"a fused graph computed an output of shape {tuple(r.shape)} {r.dtype} where "
                f"{tuple(h.shape)} {h.dtype} was recorded: an op's CPU kernel disagrees with "
                "its Meta kernel (add it to recorder.SHAPES_DIFFER_FROM_META)"
            )
        state.verified = True
        for h, result in zip(seen_hosts, results, strict=True):
            if result is not h:  # computed elsewhere (no in-place out= kernel): copy it in
                h.copy_(result)
        rt.launch(loaded, rt.target.host_submit_ns, lambda: [op.location for op in ops])
        rt.count("fused_executions")
        rt.count("fused_ops", sum(1 for op in ops if op.entry is not None))

    def _fall_back(self, state: GraphState, error: BaseException) -> None:
        state.fallback = True
        self.rt.count("fused_fallbacks")
        if not self._warned_fallback:
            self._warned_fallback = True
            log.warning(
                "a fused graph failed where its ops run one by one may not (%s); this graph "
                "runs op by op from now on (counter fused_fallbacks)",
                error,
            )

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
                rt.count("internal_outputs")

    # -- fused compiles -------------------------------------------------------------------------
    def _maybe_request(
        self,
        state: GraphState,
        ops: list[RecOp],
        input_types: list[Where],
        observable: list[bool],
    ) -> None:
        rt = self.rt
        n = _launches(ops)
        if n < 2 or state.fallback:
            return
        t = rt.target
        saving = compile_policy.predicted_saving_ns(
            n, t.launch_overhead_ns, t.host_dispatch_op_ns, t.host_record_op_ns
        )
        if not compile_policy.should_request(
            state.history,
            saving,
            compile_policy.predicted_compile_ns(len(ops)),
            rt.compiles_shared,
        ):
            return
        state.history.requested = True
        rt.count("fused_compiles_requested")
        graph, debug = _graph(ops, input_types, observable)
        state.future, state.submitted_ns = rt.submit(graph, debug)

    def _fetch(
        self,
        state: GraphState,
        ops: list[RecOp],
        input_types: list[Where],
        observable: list[bool],
    ) -> None:
        """A graph met the first time whose fused executable a shared cache already holds
        (`trnsim precompile`, another process, an earlier run) runs fused at once: no
        compile stands between it and its use."""
        if _launches(ops) < 2:
            return
        graph, debug = _graph(ops, input_types, observable)
        loaded = self.rt.fetch(graph, debug, self.rt.fused_options)
        if loaded is None:
            return
        state.loaded = loaded
        state.history.requested = state.history.ready = True
        self.rt.count("fused_graphs_fetched")

    def _compile_now(
        self,
        state: GraphState,
        ops: list[RecOp],
        input_types: list[Where],
        observable: list[bool],
    ) -> None:
        """A region's graph, compiled now at the fused level (the step waits, as for a
        torch.compile'd graph). If the compiler refuses it, it runs op by op from now on."""
        if not any(op.entry is not None for op in ops):
            return
        graph, debug = _graph(ops, input_types, observable, "compiled")
        try:
            loaded = self.rt.executable_for(graph, debug, self.rt.fused_options)
        except Exception as e:  # noqa: BLE001  (a graph the compiler cannot take: op by op)
            self._fall_back(state, e)
            return
        self.rt.count("compiled_graphs_ready")
        state.loaded = loaded
        state.history.requested = state.history.ready = True

    def _collect(self, state: GraphState) -> None:
        """A background compile becomes the graph's executable (or a failure) once it has
        finished and, on the simulated clock, once the modelled compile time it waited for
        has passed since it was asked for (NEURON_SIM_COMPILE_CLOCK): until then the graph
        runs op by op, as on the chip while the compiler works."""
        future = state.future
        if future is not None and future.done():
            state.future = None
            try:
                exe = future.result()
            except Exception:  # noqa: BLE001  (any failure: remember it, go on op by op)
                state.history.failed = True
                self.rt.count("fused_compiles_failed")
                return
            state.arrived = exe
            state.ready_at_ns = state.submitted_ns + self.rt.compile_delay_ns(
                exe.waited_compile_seconds
            )
        if state.arrived is None or self.rt.host_ns < state.ready_at_ns:
            return
        state.loaded, state.arrived = execute.load(state.arrived), None
        state.history.ready = True
        self.rt.count("fused_compiles_ready")


def _launches(ops: list[RecOp]) -> int:
    """How many of the recorded ops launch an executable of their own (views do not)."""
    return sum(1 for op in ops if op.entry is not None)


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


def _settle(host: Tensor, result: Tensor, seen: bool) -> Tensor:
    """Where an op-by-op result lives from now on: the output's device memory when the
    output outlives the graph or the kernel's layout differs from the declared one, else
    the kernel's own result (no copy)."""
    if (
        not seen
        and result.stride() == host.stride()
        and result.shape == host.shape
        and result.dtype == host.dtype
        and result.storage_offset() == 0
    ):
        return result
    return host.copy_(result)


def _input_type(where: Where) -> TensorType:
    """A graph input's type as the tensor was when first read (it may have changed since)."""
    _, shape, stride, dtype, _ = where
    return TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), 0)


def _graph(
    ops: list[RecOp], input_types: list[Where], observable: list[bool], name: str = "adaptive"
) -> tuple[Graph, graph_pb2.GraphDebug]:
    made = [
        Value(i, j)
        for i, op in enumerate(ops)
        if op.entry is not None
        for j in _fresh_slots(op.entry)
    ]
    outputs = tuple(v for v, seen in zip(made, observable, strict=True) if seen)
    graph = Graph(
        tuple(_input_type(where) for where in input_types),
        tuple(op.node() for op in ops),
        outputs,
        num_scalar_inputs=sum(len(op.scalars) for op in ops),
    )
    debug = graph_pb2.GraphDebug(name=name)
    for op in ops:
        debug.node_locations.add(file=op.location[0], line=op.location[1], function=op.location[2])
    return graph, debug


def _view_node(op: RecOp) -> Node:
    call = op.view
    assert call is not None
    wiring = iter(op.wiring)
    spec = call.spec

    def arg(value: Any) -> ArgValue:
        return next(wiring) if value is TENSOR else _constant(value)

    named: list[tuple[str, ArgValue]] = []
    for k, a in enumerate(call.args):
        name = spec.positional_names[k] if k < len(spec.positional_names) else f"arg{k}"
        named.append((name, arg(a)))
    named += [(name, arg(v)) for name, v in call.kwargs.items()]
    types = tuple(
        TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), offset)
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


def _constant(value: Any) -> ArgValue:
    """A view op's non-tensor argument, as the graph carries it (floats stay constants)."""
    if isinstance(value, float):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_constant(v) for v in value)
    return graph_arg(value, [], [0])


def _op_named(ops: list[RecOp], name: str) -> RecOp:
    """The recorded op a fused executable's failing node came from. Node indices change in
    the compiler's rewrites, so the op is found by name: the first recorded one (a later op
    of the same name cannot have run before it)."""
    for op in ops:
        if op.entry is not None and op.name == name:
            return op
    return ops[-1]


def _located(op: RecOp, cause: BaseException, ops: list[RecOp]) -> BaseException:
    """The error of a recorded op, raised where the buffer was cut, naming where it was
    issued (a view, which keeps no location, by the op that recorded before it)."""
    path, line = op.location[0], op.location[1]
    if not path:
        before = [o for o in ops[: ops.index(op)] if o.location[0]]
        path, line = before[-1].location[:2] if before else ("<unknown>", 0)
    return execution_error(op.name, cause, f"{path}:{line}")


runtime.RECORDING_MODES["adaptive"] = Recorder
runtime.REGION_RECORDER.append(lambda rt: Recorder(rt, region=True))
