"""What both recording modes do with what they record (adaptive mode: client/modes/adaptive.py;
compiled regions: client/modes/region.py): offer each op to the buffer or cut it first, and run a
cut, fused (one launch of its graph's executable) or op by op (one launch per op), then
account the memory of the outputs that outlive it. Results equal eager mode bit for bit:
every path runs the same ATen ops on the CPU in the same order.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from trnsim.client.core import runtime
from trnsim.client.core.compile_client import Compiled
from trnsim.client.core.errors import execution_error
from trnsim.client.core.ops import FRESH, NOT_RECORDED, Entry, OpSpec
from trnsim.client.core.types import Args, Kwargs, OpValue
from trnsim.client.modes.tape import Cut, RecOp, Step, Tape
from trnsim.compiler.graph import Value
from trnsim.policy import boundaries, compile_policy
from trnsim.simulator import execute, shape_only
from trnsim.simulator.execute import ExecutionError

log = logging.getLogger(__name__)
Tensor = torch.Tensor


@dataclass
class GraphState:
    """What the runtime knows of one graph signature."""

    history: compile_policy.GraphHistory = field(default_factory=compile_policy.GraphHistory)
    future: Future[Compiled] | None = None
    submitted_ns: int = 0  # the simulated host time the compile was asked for
    arrived: Compiled | None = None  # compiled, not yet usable (sim. time)
    ready_at_ns: int = 0
    loaded: execute.LoadedExecutable | None = None
    verified: bool = False  # the fused executable ran once without failing
    fallback: bool = False  # it failed where op by op did not: this graph runs op by op


class Recorder:
    """A recording mode over the shared buffer: the runtime's recorder slot holds one."""

    defers_op_compiles = False  # an op first met here compiles its own executable only if run

    def __init__(self, rt: runtime.Runtime, policy: boundaries.Policy) -> None:
        self.rt = rt
        self.policy = policy
        self.tape = Tape(rt)
        self.graphs: dict[tuple[object, ...], GraphState] = {}
        # The graph whose ops are the path to a step of the trace, by which outputs of it
        # were observable: its signature, known without hashing it again.
        self._ends: dict[Step, dict[tuple[bool, ...], GraphState]] = {}
        self._next_ops: dict[tuple[bool, bool, int, bool, bool], boundaries.NextOp] = {}
        self._warned_fallback = False

    @property
    def pending(self) -> bool:
        return bool(self.tape.steps)

    def offer(
        self, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[float]
    ) -> OpValue:
        """Records the op, or cuts the buffer first; NOT_RECORDED: the caller runs it eagerly.
        The op replays the trace's next step when it is that step (Tape.follow): then no
        argument is a hazard, and recording it would give the same node."""
        tape, policy = self.tape, self.policy
        replay = tape.follow(entry, tensors)
        hazard = replay is None and any(not t.is_cpu and not tape.nameable(t) for t in tensors)
        n = len(tape.steps)
        # (the queue's depth matters to long buffers only: a shorter one is told the depth
        # at which nothing is drained)
        depth = policy.low_water if n < policy.drain_min_ops else self.rt.queue_depth()
        cut = boundaries.decide(
            n, tape.issued_on, self._next_op(spec, entry, hazard), depth, policy
        )
        if cut is not boundaries.Cut.NONE:
            self._cutting(spec, cut)
            self.flush(cut.value)
            if cut.runs_op_eagerly:
                return NOT_RECORDED
            replay = tape.follow(entry, tensors)
        if replay is None:
            results = tape.record(spec, entry, tensors, scalars)
        else:
            results = tape.replay(replay, entry, tensors, scalars)
        self._recorded()
        return results

    def _next_op(self, spec: OpSpec, entry: Entry, hazard: bool) -> boundaries.NextOp:
        """What the policy is told of the op (one object per distinct answer)."""
        key = (
            self._fusible(entry),
            entry.dynamic,
            self.rt.stream,
            hazard,
            self._verified(spec, entry),
        )
        op = self._next_ops.get(key)
        if op is None:
            op = self._next_ops[key] = boundaries.NextOp(*key[:3], hazard=hazard, verified=key[4])
        return op

    def _fusible(self, entry: Entry) -> bool:
        return entry.fusible

    def _verified(self, spec: OpSpec, entry: Entry) -> bool:
        return entry.verified

    def _cutting(self, spec: OpSpec, cut: boundaries.Cut) -> None:
        """The buffer is about to be cut before `spec` (a mode may refuse)."""

    def _recorded(self) -> None:
        self.rt.count("ops_recorded")

    def view(self, spec: OpSpec, args: Args, kwargs: Kwargs, result: OpValue) -> None:
        if not self.tape.view(spec, args, kwargs, result):
            self.flush("hazard")

    def flush(self, reason: str) -> None:
        raise NotImplementedError

    def _state(self, cut: Cut) -> GraphState:
        """What is known of the cut's graph, seen once more. Found by the step its ops end
        at and which outputs are observable; the first time there, by its signature."""
        ends = self._ends.get(cut.steps[-1])
        if ends is None:
            ends = self._ends[cut.steps[-1]] = {}
        observable = tuple(cut.observable)
        state = ends.get(observable)
        if state is None:
            signature = cut.signature
            state = self.graphs.get(signature)
            if state is None:
                state = self.graphs[signature] = GraphState()
            ends[observable] = state
        state.history.seen += 1
        return state

    def _run(self, state: GraphState, cut: Cut) -> bool:
        """Runs the cut on the stream it was issued on, fused when its executable is there;
        True when it ran op by op. Then the memory of its outputs is accounted."""
        with self.rt.on_stream(cut.stream):  # the work goes where it was issued
            fused = state.loaded is not None and not state.fallback
            if fused:
                self._run_fused(state, cut)
            else:
                self._run_op_by_op(cut)
        return not fused

    def _run_op_by_op(self, cut: Cut) -> None:
        """Each op on its own executable, over the CPU memory its arguments name: the same
        values a fused run computes, one launch per op."""
        rt, ops, input_hosts = self.rt, cut.ops, cut.input_hosts
        rt.count("op_by_op_graphs")
        if rt.executables.shared:  # (the executables it lacks, read from the cache at once)
            deferred = [op.entry.deferred for op in ops if op.entry is not None]
            wanted = [(graph, debug, False) for graph, debug in filter(None, deferred)]
            if len(wanted) > 1:
                rt.executables.prefetch(wanted)
        env: dict[Value, Tensor] = {}
        seen = iter(cut.observable)
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

    def _run_fused(self, state: GraphState, cut: Cut) -> None:
        """One launch of the graph's fused executable. Its first run keeps a copy of what it
        may change (the inputs' memory, the generator): if it fails, that is put back and the
        ops run one by one. If they succeed, the fused path was at fault, and the graph runs
        op by op from then on; if they fail too, the fault was the user's, named by op."""
        rt, steps, input_hosts = self.rt, cut.steps, cut.input_hosts
        loaded = state.loaded
        assert loaded is not None
        seen_hosts = [h for h, seen in zip(cut.hosts, cut.observable, strict=True) if seen]
        # (shape-only mode: no values to put back; a failure is named by op)
        saved = (
            None
            if state.verified or not rt.numerics
            else _Snapshot(input_hosts, rt.generator, steps[-1].cpu_draws)
        )
        try:
            results = loaded.run(input_hosts, cut.scalars, rt.generator, seen_hosts)
            if len(results) != len(seen_hosts):
                raise RuntimeError(f"{len(results)} outputs, {len(seen_hosts)} expected")
        except Exception as e:  # noqa: BLE001  (whatever failed, op by op decides)
            if saved is None:
                cause = e.cause if isinstance(e, ExecutionError) else e
                ops = cut.ops
                raise _located(_op_named(ops, getattr(e, "op", "")), cause, ops) from cause
            saved.restore()
            self._run_op_by_op(cut)
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
                "its Meta kernel (add it to region.SHAPES_DIFFER_FROM_META)"
            )
        state.verified = True
        for h, result in zip(seen_hosts, results, strict=True):
            if result is not h:  # computed elsewhere (no in-place out= kernel): copy it in
                h.copy_(result)
        rt.launch(loaded, rt.target.host_submit_ns, lambda: [s.location for s in steps])
        rt.count("fused_executions")
        rt.count("fused_ops", steps[-1].launches)

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

    def _account(self, cut: Cut) -> None:
        """HBM for the outputs that outlive the graph; the others were internal."""
        memory, internal = self.rt.memory, 0
        for storage, host, seen in zip(cut.storages, cut.hosts, cut.observable, strict=True):
            if seen:
                memory.adopt_storage(
                    storage, memory.allocate(host.untyped_storage().nbytes()), host
                )
            else:
                internal += 1
        if internal:
            self.rt.count("internal_outputs", internal)


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
