"""A compiled region prepared as one callable: after a region has run once as one fused graph,
its later calls with inputs of the same geometry skip the trace. No op of the graph reaches
the dispatcher again: the inputs' memory goes straight to the region's executable, its outputs
are made where the trace made them, and the launch and the memory are accounted as the traced
run accounts them (client/modes/region.py, recording.py), so simulated time, counters of the
chip (launches, HBM) and values are those of the traced run. The host's Python cost of a call
scales with the region's inputs and outputs, not with its ops.

A region is prepared only when what its trace did is fully known: every op it dispatched was
recorded, it stayed one graph (cut only at its end) and ran fused, and every tensor the graph
read or returned is one of its inputs (or memory within one) or one of the graph's outputs.
Anything else (a cut, an op run on its own, a constant tensor, a CPU result, pending
collectives, NEURON_RECORD_SHAPES) keeps the traced path, which is always correct.

What the graph computes on the CPU (an optimizer's step counts: ops that do not go through
the device) runs in the graph's Python, which a replay does not run: a replay runs those ops
first, as a graph of their own (client/modes/compiled.py, _CpuPart), and the values they
make are inputs of the executable, or returned. CPU ops that read a device value or draw
random numbers keep the region traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from trnsim.client.core import runtime, shapes
from trnsim.client.core.errors import execution_error
from trnsim.client.core.memory import to_device
from trnsim.client.core.types import OpValue
from trnsim.client.modes.recording import GraphState
from trnsim.client.modes.tape import Cut
from trnsim.simulator import execute, shape_only
from trnsim.simulator.execute import ExecutionError

Tensor = torch.Tensor
MISSED = object()  # replay()'s answer when the call is not the prepared one: trace it
_PENDING = torch.empty(0)  # (an input the CPU part computes, in its place until it has)
# A tensor argument's guard: (device type, sizes, strides, storage offset, dtype).
Guard = tuple[str, torch.Size, tuple[int, ...], int, torch.dtype]
# Sizes, strides, and storage offset from the tensor it is seen in (None: that tensor as it is).
Geometry = tuple[tuple[int, ...], tuple[int, ...], int] | None


def _guard(t: Tensor) -> Guard:
    return (t.device.type, t.shape, t.stride(), int(t.storage_offset()), t.dtype)


def _geometry(t: Tensor, like: Tensor) -> Geometry:
    """t as seen in like's memory (its offset counted from like's), or None when it is
    like's own geometry."""
    offset = int(t.storage_offset() - like.storage_offset())
    if offset == 0 and t.shape == like.shape and t.stride() == like.stride():
        return None
    return (tuple(t.shape), tuple(t.stride()), offset)


def _seen(t: Tensor, g: Geometry) -> Tensor:
    """t seen with geometry g (see _geometry)."""
    return t if g is None else t.as_strided(g[0], g[1], t.storage_offset() + g[2])


@dataclass(frozen=True)
class _Source:
    """Where a graph input or a returned tensor comes from: argument `arg` (or, when arg < 0,
    the graph's `fresh`-th observable output, or with `scratch` the scratch-th allocation the
    graph made, or `constant`), seen with `geometry` (None: as it is). `clone`: a CPU
    tensor, read as it is now (the trace copied it)."""

    arg: int
    fresh: int
    geometry: Geometry
    clone: bool = False
    scratch: int = -1
    constant: Tensor | None = None
    cpu: tuple[int, int] | None = None  # (the CPU part's output, element or -1): see compiled


@dataclass
class _Returned:
    """How to build the region's return value: its container, and per item a _Source, a
    constant (non-tensor) or the index of an earlier item that is the same tensor."""

    container: type
    items: list[tuple[str, object]]


class Prepared:
    """A region's trace, kept to run its later calls without tracing (see the module)."""

    def __init__(
        self,
        state: GraphState,
        cut: Cut,
        guards: list[Guard | object],
        aliases: tuple[int, ...],
        inputs: list[_Source],
        returned: _Returned,
        numerics: bool,
        scratch: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]],
        freed: tuple[list[int], list[int]],
    ) -> None:
        self.state = state
        # Device memory the traced run allocated while tracing (zeros that a backward
        # scatters into), in allocation order, and the order it was freed in: at the cut,
        # and after the run (see _inputs).
        self.scratch = scratch
        self.freed, self.freed_late = freed
        self.guards = guards
        self.aliases = aliases
        self.inputs = inputs
        self.returned = returned
        self.numerics = numerics
        self.bucket_run = False  # (its trace ran in a shape bucket's executable: counted so)
        # The graph's CPU work as a graph of its own, run before the executable: the CPU
        # values it reads (inputs whose source has `cpu`), and the CPU inputs it writes.
        self.cpu_part: Callable[..., tuple[object, ...]] | None = None
        ops = cut.ops
        self.scalars = [s for op in ops for s in op.scalars]
        hosts = [h for op in ops if op.entry is not None for h in op.hosts]
        self.fresh = [
            (tuple(h.shape), tuple(h.stride()), h.dtype)
            for h, seen in zip(hosts, cut.observable, strict=True)
            if seen
        ]
        self.n_ops = sum(1 for op in ops if op.entry is not None)
        self.op_names = [op.name for op in ops if op.entry is not None]
        self.op_locations = [op.location for op in ops if op.entry is not None]
        self.locations = [op.location for op in ops]

    def replay(self, rt: runtime.Runtime, flat: list[OpValue]) -> OpValue:
        """The region's results for these arguments, or MISSED if they are not the ones it
        was prepared for (then the caller traces it)."""
        state = self.state
        if (
            state.loaded is None
            or state.fallback
            or rt.awaiting
            or shapes.active is not None
            or rt.numerics != self.numerics
            or not self._holds(flat)
        ):
            return MISSED
        rt.flush("compiled_region")  # (what the mode's own recorder holds runs first)
        rt.count("graphs_formed")
        rt.count("cut_region_end")
        state.history.seen += 1
        scratch = self._allocate(rt)
        hosts = self._input_hosts(rt, flat, scratch)  # (CPU arguments copied as they are now)
        cpu = self.cpu_part(*flat) if self.cpu_part is not None else ()
        for k, source in enumerate(self.inputs):
            if source.cpu is not None:
                hosts[k] = _cpu_value(cpu, source.cpu)
        for k in self.freed:  # (their memory is freed where the traced run's buffer let go)
            scratch[k] = None
        made = self._fresh_hosts(rt.numerics)
        self._run(rt, state.loaded, hosts, made)
        devices = self._account(rt, made)
        for k in self.freed_late:
            scratch[k] = None
        rt.count("compiled_replays")
        if self.bucket_run:
            rt.count("compiled_bucket_runs")
        return self._returns(flat, devices, scratch, cpu)

    def _holds(self, flat: list[OpValue]) -> bool:
        guards = self.guards
        if len(flat) != len(guards):
            return False
        for value, guard in zip(flat, guards, strict=True):
            if isinstance(value, Tensor):
                if not isinstance(guard, tuple) or _guard(value) != guard:
                    return False
            elif type(value) is not type(guard) or value != guard:
                return False
        return _aliases(flat)[0] == self.aliases

    def _allocate(self, rt: runtime.Runtime) -> list[Tensor | None]:
        """The scratch allocations, as the door's empty() makes them (client/door/special.py)."""
        memory = rt.memory
        out: list[Tensor | None] = []
        for shape, stride, dtype in self.scratch:
            if rt.numerics:
                host = torch.empty_strided(shape, stride, dtype=dtype)
            else:
                host = shape_only.empty(shape, stride, dtype)
                shape_only.forget(host)
            block = memory.allocate(host.untyped_storage().nbytes())
            out.append(memory.adopt(to_device(host), block, host))
        return out

    def _input_hosts(
        self, rt: runtime.Runtime, flat: list[OpValue], scratch: list[Tensor | None]
    ) -> list[Tensor]:
        """The executable's inputs; those the CPU part computes are left for replay()."""
        hosts: list[Tensor] = []
        host_alias = rt.memory.host_alias
        for source in self.inputs:
            if source.cpu is not None:  # (computed by the CPU part: see replay)
                hosts.append(_PENDING)
                continue
            if source.constant is not None:
                t = source.constant
            elif source.scratch >= 0:
                t = scratch[source.scratch]  # type: ignore[assignment]
            else:
                t = flat[source.arg]  # type: ignore[assignment]
            assert isinstance(t, Tensor)
            if source.clone:
                hosts.append(t.clone())
                continue
            hosts.append(_seen(host_alias(t), source.geometry))
        return hosts

    def _fresh_hosts(self, numerics: bool) -> list[Tensor]:
        """The memory of each output the graph lets out, as the trace made it."""
        if numerics:
            return [
                torch.empty_strided(shape, stride, dtype=dt) for shape, stride, dt in self.fresh
            ]
        made = [shape_only.empty(shape, stride, dtype=dt) for shape, stride, dt in self.fresh]
        for h in made:
            shape_only.forget(h)
        return made

    def _run(
        self,
        rt: runtime.Runtime,
        loaded: execute.LoadedExecutable,
        hosts: list[Tensor],
        made: list[Tensor],
    ) -> None:
        """One launch of the region's executable, as a traced region's fused run does."""
        try:
            results = loaded.run(hosts, self.scalars, rt.generator, made)
        except ExecutionError as e:  # (named as a traced region names it: op, user's line)
            raise execution_error(e.op, e.cause, self._where(e.op)) from e.cause
        if len(results) != len(made):
            raise RuntimeError(f"{len(results)} outputs, {len(made)} expected")
        for h, result in zip(made, results, strict=True):
            if result is not h:  # computed elsewhere (no in-place out= kernel): copy it in
                h.copy_(result)
        locations = self.locations
        rt.launch(loaded, rt.target.host_submit_ns, lambda: locations)
        rt.count("fused_executions")
        rt.count("fused_ops", self.n_ops)

    def _where(self, op: str) -> str | None:
        """The user's line of the first recorded op of that name (see recording._op_named)."""
        for name, (path, line, _) in zip(self.op_names, self.op_locations, strict=True):
            if name == op and path:
                return f"{path}:{line}"
        return None

    def _account(self, rt: runtime.Runtime, made: list[Tensor]) -> list[Tensor]:
        """The device tensor of each output, with its HBM (as the traced run accounts it)."""
        devices = []
        memory = rt.memory
        for h in made:
            devices.append(
                memory.adopt(to_device(h), memory.allocate(h.untyped_storage().nbytes()), h)
            )
        return devices

    def _returns(
        self,
        flat: list[OpValue],
        devices: list[Tensor],
        scratch: list[Tensor | None],
        cpu: tuple[object, ...],
    ) -> OpValue:
        items: list[OpValue] = []
        for kind, what in self.returned.items:
            if kind == "cpu":
                items.append(_cpu_value(cpu, what))  # type: ignore[arg-type]
            elif kind == "constant":
                items.append(what)  # type: ignore[arg-type]
            elif kind == "same":
                items.append(items[what])  # type: ignore[call-overload]
            else:
                assert isinstance(what, _Source)
                if what.scratch >= 0:
                    base = scratch[what.scratch]
                else:
                    base = devices[what.fresh] if what.arg < 0 else flat[what.arg]
                assert isinstance(base, Tensor)
                items.append(_seen(base, what.geometry))
        return self.returned.container(items)


def _cpu_value(cpu: tuple[object, ...], where: tuple[int, int]) -> Tensor:
    """The CPU part's output `where` names (see _Source.cpu)."""
    k, j = where
    value = cpu[k] if j < 0 else cpu[k][j]  # type: ignore[index]
    assert isinstance(value, Tensor)
    return value


# -- preparing: what the traced call did, read back --------------------------------------------
@dataclass(frozen=True, slots=True)
class Read:
    """A tensor the buffer read, described when the buffer was cut (holding it would keep it
    alive longer than the traced run does): its id, where it lies and, when its storage is a
    device allocation, that allocation's (sizes, strides, dtype, place in allocation order)."""

    ident: int
    cpu: bool
    storage: int
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    plain: bool  # no lazy conjugate or negative bit
    allocation: tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int] | None


@dataclass
class Traced:
    """What a traced region call did (the region recorder fills it): each flush's reason,
    cut, graph state and what its buffer read (in wiring order); how many ops the recorder
    was offered and did not record; and the counters it is checked against."""

    dispatched: int = 0  # ops_dispatched when the region began
    views: int = 0  # view_ops then
    allocations: int = 0  # allocations then; at the first cut, how many were made since
    offered: int = 0
    not_recorded: int = 0
    # (reason, the cut without its host aliases, its graph, what it read); the cut is kept
    # for a region's end only
    flushes: list[tuple[str, Cut | None, GraphState, list[Read]]] = field(default_factory=list)

    def read(self, tensors: list[Tensor], rt: runtime.Runtime) -> list[Read]:
        """The buffer's inputs described (before it is cut)."""
        if not self.flushes:
            self.allocations = rt.metrics.counts["allocations"] - self.allocations
        hosts = rt.memory.hosts
        order: dict[int, int] | None = None
        out = []
        for t in tensors:
            ptr = t.untyped_storage().data_ptr()
            allocation = None
            held = None if t.is_cpu else hosts.get(ptr)
            base = held.host if held is not None else None
            if base is not None:
                if order is None:
                    order = {p: k for k, p in enumerate(hosts)}
                allocation = (tuple(base.shape), tuple(base.stride()), base.dtype, order[ptr])
            plain = not (t.is_conj() or t.is_neg())
            out.append(
                Read(
                    id(t), t.is_cpu, ptr, t.shape, t.stride(), int(t.storage_offset()), t.dtype,
                    plain, allocation,
                )
            )  # fmt: skip
        return out


def prepare(
    rt: runtime.Runtime,
    traced: Traced,
    flat: list[OpValue],
    result: OpValue,
    constants: dict[int, Tensor],
    cpu_fed: dict[int, tuple[int, int]] | None = None,
) -> Prepared | str:
    """The traced call as a Prepared region, or why it cannot be one. `constants`: the
    graph's own tensors (get_attr), by id; `cpu_fed`: the values its CPU part computes, by
    id (see compiled._CpuSeen)."""
    cpu_fed = cpu_fed or {}
    counts = rt.metrics.counts
    flushes = traced.flushes
    if len(flushes) != 1 or flushes[0][0] != "region_end":
        return f"{len(flushes)} graphs" if len(flushes) != 1 else f"cut ({flushes[0][0]})"
    _, cut, state, read = flushes[0]
    assert cut is not None
    # Every op dispatched was offered to the recorder and recorded, or was a view, or an
    # allocation (the door's empty(): each allocates once; see _inputs).
    views = counts["view_ops"] - traced.views
    if traced.not_recorded or counts["ops_dispatched"] - traced.dispatched != (
        traced.offered + views + traced.allocations
    ):
        return "an op ran on its own"
    if state.loaded is None or state.fallback or not state.verified:
        return "not run fused"
    if cut.stream != rt.stream:
        return "issued on another stream"
    if not isinstance(result, (tuple, list)):
        return f"returns {type(result).__name__}"
    guards: list[Guard | object] = []
    for value in flat:
        if isinstance(value, Tensor):
            guards.append(_guard(value))
        elif value is None or type(value) in (int, float, bool):
            guards.append(value)
        else:
            return f"an argument of type {type(value).__name__}"
    aliases, by_storage = _aliases(flat)
    made = _inputs(flat, read, by_storage, constants, cpu_fed)
    if isinstance(made, str):
        return made
    inputs, scratch = made
    if len(scratch.place) != traced.allocations:
        return f"{traced.allocations} allocations while tracing, {len(scratch.place)} read"
    ordered = scratch.ordered()
    index = {ptr: n for n, ptr in enumerate(ordered)}
    inputs = [
        s if s.scratch < 0 else dataclasses.replace(s, scratch=index[s.scratch]) for s in inputs
    ]
    hosts = [h for op in cut.ops if op.entry is not None for h in op.hosts]
    seen = [h for h, s in zip(hosts, cut.observable, strict=True) if s]
    fresh = {h.untyped_storage().data_ptr(): k for k, h in enumerate(seen)}
    if 0 in fresh or len(fresh) != len(seen):
        return "outputs without memory of their own"
    allocated = {ptr: (index[ptr], scratch.made[ptr]) for ptr in ordered}
    returned = _returned(result, flat, by_storage, seen, allocated, cpu_fed)
    if isinstance(returned, str):
        return returned
    kept = {
        what.scratch
        for kind, what in returned.items
        if kind == "tensor" and isinstance(what, _Source) and what.scratch >= 0
    }
    made_scratch = [scratch.made[ptr] for ptr in ordered]
    frees = scratch.frees(index, kept)
    return Prepared(state, cut, guards, aliases, inputs, returned, rt.numerics, made_scratch, frees)


def _aliases(flat: list[OpValue]) -> tuple[tuple[int, ...], dict[int, list[int]]]:
    """Per argument, the first neuron argument on the same storage (itself if none), and
    each neuron argument's storage with the arguments on it, in order."""
    by_storage: dict[int, list[int]] = {}
    aliases = []
    for i, value in enumerate(flat):
        if isinstance(value, Tensor) and not value.is_cpu:
            ptr = value.untyped_storage().data_ptr()
            if ptr:
                on = by_storage.setdefault(ptr, [])
                on.append(i)
                aliases.append(on[0])
                continue
        aliases.append(i)
    return tuple(aliases), by_storage


def _extent(shape: Sequence[int], stride: Sequence[int], offset: int) -> tuple[int, int]:
    """The first and last element of its storage a tensor of that geometry covers (last <
    first: it has no elements)."""
    low = high = offset
    for n, step in zip(shape, stride, strict=True):
        if n == 0:
            return offset, offset - 1
        if step > 0:
            high += (n - 1) * step
        else:
            low += (n - 1) * step
    return low, high


def _holder(
    flat: list[OpValue], on_storage: list[int], shape: Sequence[int], stride: Sequence[int],
    offset: int,
) -> int | None:  # fmt: skip
    """The first of the arguments on a storage whose memory spans all a tensor of that
    geometry covers there, or None. Only memory within an argument is found again at a later
    call: its guard fixes that argument's geometry, not what else its storage holds."""
    low, high = _extent(shape, stride, offset)
    for i in on_storage:
        t = flat[i]
        assert isinstance(t, Tensor)
        if high < low:
            return i
        first, last = _extent(t.shape, t.stride(), int(t.storage_offset()))
        if first <= low and high <= last:
            return i
    return None


@dataclass
class _Scratch:
    """The memory a traced region allocated while tracing (the door's empty(): zeros a
    backward scatters into, a mask it fills), each read by the buffer: by storage, its place
    in allocation order and its allocation's (sizes, strides, dtype), the first input on it,
    and the first one seen through a DLPack alias (which holds the device storage)."""

    place: dict[int, int] = field(default_factory=dict)
    made: dict[int, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = field(
        default_factory=dict
    )
    first_read: dict[int, int] = field(default_factory=dict)
    first_alias: dict[int, int] = field(default_factory=dict)

    def ordered(self) -> list[int]:
        return sorted(self.place, key=self.place.__getitem__)

    def frees(self, index: dict[int, int], kept: set[int]) -> tuple[list[int], list[int]]:
        """The order the trace freed them in, of those it did not return (kept): the cut
        drops its list of inputs last to first, so an allocation is freed with the first
        input on it, unless an input seen through a DLPack alias of it holds it: then with
        the first of those, when the cut's host aliases go, after its run."""
        reads, aliases = self.first_read, self.first_alias
        early = [p for p in reads if p not in aliases and index[p] not in kept]
        late = [p for p in aliases if index[p] not in kept]
        return (
            [index[p] for p in sorted(early, key=lambda p: -reads[p])],
            [index[p] for p in sorted(late, key=lambda p: -aliases[p])],
        )


def _inputs(
    flat: list[OpValue],
    read: list[Read],
    by_storage: dict[int, list[int]],
    constants: dict[int, Tensor],
    cpu_fed: dict[int, tuple[int, int]],
) -> tuple[list[_Source], _Scratch] | str:
    """Where each tensor the buffer read comes from: an argument (or memory within one), a
    constant of the graph, or memory allocated while tracing (its storage, for now)."""
    identity = {id(v): i for i, v in enumerate(flat) if isinstance(v, Tensor)}
    inputs = []
    scratch = _Scratch()
    for k, r in enumerate(read):
        i = identity.get(r.ident)
        constant = constants.get(r.ident) if i is None else None
        if r.cpu:
            if i is None and constant is None:
                made_by = cpu_fed.get(r.ident)
                if made_by is None:
                    return "a CPU tensor made in the graph, not by its CPU ops"
                inputs.append(_Source(-1, 0, None, cpu=made_by))
                continue
            inputs.append(_Source(-1 if i is None else i, 0, None, True, constant=constant))
            continue
        if not r.plain:
            return "a lazily conjugated or negated view"
        if constant is not None:
            inputs.append(_Source(-1, 0, None, constant=constant))
            continue
        on_storage = by_storage.get(r.storage) if i is None else None
        if on_storage:
            i = _holder(flat, on_storage, r.shape, r.stride, r.offset)
            if i is None:
                return "reads memory of an argument's storage outside the argument"
        if i is not None:
            like = flat[i]
            assert isinstance(like, Tensor)
            if r.dtype != like.dtype or r.offset < like.storage_offset():
                return "an argument read as another dtype, or before its first element"
            inputs.append(
                _Source(
                    i, 0, _read_geometry(r, like.shape, like.stride(), int(like.storage_offset()))
                )
            )
            continue
        if r.allocation is None:
            return "a tensor that is none of the graph's arguments or constants"
        shape, stride, dtype, place = r.allocation
        if r.dtype != dtype:
            return "an allocation read as another dtype"
        scratch.place.setdefault(r.storage, place)
        scratch.made.setdefault(r.storage, (shape, stride, dtype))
        scratch.first_read.setdefault(r.storage, k)
        geometry = _read_geometry(r, shape, stride, 0)
        if geometry is not None:  # (its host alias holds the device storage)
            scratch.first_alias.setdefault(r.storage, k)
        inputs.append(_Source(-1, 0, geometry, scratch=r.storage))
    return inputs, scratch


def _described(t: Tensor) -> Read:
    return Read(
        id(t), t.is_cpu, t.untyped_storage().data_ptr(), t.shape, t.stride(),
        int(t.storage_offset()), t.dtype, True, None,
    )  # fmt: skip


def _read_geometry(
    r: Read, shape: tuple[int, ...] | torch.Size, stride: tuple[int, ...], offset: int
) -> Geometry:
    """r as seen in a tensor of that geometry (see _geometry)."""
    if r.offset == offset and r.shape == shape and r.stride == tuple(stride):
        return None
    return (tuple(r.shape), tuple(r.stride), r.offset - offset)


def _returned(
    result: tuple[OpValue, ...] | list[OpValue],
    flat: list[OpValue],
    by_storage: dict[int, list[int]],
    seen: list[Tensor],
    allocated: dict[int, tuple[int, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]],
    cpu_fed: dict[int, tuple[int, int]],
) -> _Returned | str:
    """How each returned item is rebuilt: from an argument, an output, an allocation made
    while tracing (`allocated`: by storage, its index and allocation), or as a constant."""
    fresh = {h.untyped_storage().data_ptr(): k for k, h in enumerate(seen)}
    identity = {id(v): i for i, v in enumerate(flat) if isinstance(v, Tensor)}
    items: list[tuple[str, object]] = []
    first: dict[int, int] = {}
    used: set[int] = set()
    for k, value in enumerate(result):
        if not isinstance(value, Tensor):
            if value is not None and type(value) not in (int, float, bool):
                return f"returns a {type(value).__name__}"
            items.append(("constant", value))
            continue
        if id(value) in first:
            items.append(("same", first[id(value)]))
            continue
        first[id(value)] = k
        if value.is_cpu and id(value) in cpu_fed:  # (computed by the CPU part)
            items.append(("cpu", cpu_fed[id(value)]))
            continue
        if value.is_cpu or value.is_conj() or value.is_neg():
            return "returns a CPU tensor" if value.is_cpu else "returns a lazily conjugated view"
        ptr = value.untyped_storage().data_ptr()
        j = fresh.get(ptr)
        i = identity.get(id(value)) if j is None else None
        on_storage = by_storage.get(ptr) if j is None and i is None else None
        if on_storage:
            i = _holder(flat, on_storage, value.shape, value.stride(), int(value.storage_offset()))
            if i is None:
                return "returns memory of an argument's storage outside the argument"
        if j is None and i is None and ptr in allocated:
            n, (shape, stride, dtype) = allocated[ptr]
            if value.dtype != dtype:
                return "returns an allocation as another dtype"
            geometry = _read_geometry(_described(value), shape, stride, 0)
            items.append(("tensor", _Source(-1, 0, geometry, scratch=n)))
            continue
        if j is None and i is None:
            return "returns a tensor made outside the graph's trace"
        like = seen[j] if j is not None else flat[i]  # type: ignore[index]
        assert isinstance(like, Tensor)
        if value.dtype != like.dtype or value.storage_offset() < like.storage_offset():
            return "returns a view of another dtype, or before its base's first element"
        items.append(("tensor", _Source(-1 if i is None else i, j or 0, _geometry(value, like))))
        if j is not None:
            used.add(j)
    if used != set(fresh.values()):
        return "an output something else holds"
    return _Returned(type(result), items)
