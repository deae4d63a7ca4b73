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

Every recorded op is a Step of a trace: a tree of the op sequences recorded so far, whose
paths from the root are graphs (and their prefixes). An op that is the next step of the
buffer's path, with each tensor argument holding the value that step reads, replays it: a
guard per argument (this tensor is the one named that value, at the memory it was named at;
or a buffer input, as recording would make it), then only what each call needs (its output
tensors, their names); the graph's signature is the path's, known without hashing it. Any
other op is recorded (names worked out from the tables, a new step if the path has none), and
the buffer follows the trace again from wherever that op is a step. Either way the tables
that name tensors end up the same. A replayed op keeps the source line its step was first
recorded at (no stack walk per op).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

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
    """One recorded op of a cut: its per-op entry, where each tensor argument comes from (a
    buffer input or an earlier node's output), and the memory of the tensors it made.

    Nothing here holds a tensor the op made or read from the buffer: what outlives the
    graph is read off the storages' reference counts (see _observable)."""

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
        return _node(self.entry, self.view, self.wiring, self.scalar_offset)


# What a tensor points at: (data_ptr, sizes, strides, dtype, version of a CPU tensor).
Where = tuple[int, torch.Size | tuple[int, ...], tuple[int, ...], torch.dtype, int]
# A Where without its pointer: what a tensor is laid out as, over its memory.
Meta = tuple[torch.Size | tuple[int, ...], tuple[int, ...], torch.dtype, int]
# A tensor's geometry on its storage but the storage: (sizes, strides, offset, dtype, conj,
# neg). The buffer's geometry table is keyed by this, then by the storage's data pointer.
Shape = tuple[
    torch.Size | tuple[int, ...], tuple[int, ...], int | torch.SymInt, torch.dtype, bool, bool
]


def _where(t: Tensor) -> Where:
    """What a tensor points at, and for a CPU tensor what it holds: `t.data = u` changes
    the first without any op reaching us (to other memory, or to the same memory seen
    otherwise: p.data = p.t()), and the host writes CPU tensors (a scalar, indices) freely."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t._version if t.is_cpu else 0)


def _meta(t: Tensor) -> Meta:
    return (t.shape, t.stride(), t.dtype, t._version if t.is_cpu else 0)


def _shape(t: Tensor) -> Shape:
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())


class _Known(weakref.ref[Tensor]):
    """A tensor the buffer can name: the value it holds now, checked on use (a weak
    reference, because ids are reused once a tensor dies; where it points, because `.data`
    assignments swap that without an op). One object per named tensor: the buffer's
    objects live as long as it does, and each one the garbage collector tracks brings its
    next full collection nearer."""

    __slots__ = ("meta", "ptr", "storage", "value")
    value: Value
    ptr: int  # its data_ptr() when named
    meta: Meta  # the rest of its Where then
    storage: int  # its storage's data pointer then


def _known(t: Tensor, value: Value, ptr: int, meta: Meta, storage: int) -> _Known:
    known = _Known(t)
    known.value, known.ptr, known.meta, known.storage = value, ptr, meta, storage
    return known


# A new output's names, fixed by its step: (its Meta, its Shape, (its value, its dtype)).
Fresh = tuple[Meta, Shape, tuple[Value, torch.dtype]]


@dataclass(eq=False, slots=True)
class Step:
    """One recorded op at its place in the trace: what a buffer whose ops so far are the
    path to this step's parent records next, and what replaying it needs. Everything here
    follows from the path and the op's signature entry (or view call); nothing is a tensor."""

    parent: Step | None
    index: int  # its node index in the graph (the path's length before it)
    name: str
    wiring: tuple[Value, ...]
    entry: Entry | None  # (None for views)
    view: ViewCall | None
    location: tuple[str, int, str]
    part: object  # its part of the graph's signature
    scalar_offset: int
    n_scalars: int
    fresh_offset: int  # its first new output's index among the graph's
    n_fresh: int
    launches: int  # ops up to here with an executable of their own (views have none)
    cpu_draws: bool  # an op up to here draws from the CPU's generator
    # Per tensor argument: the value it must hold (an earlier node's output), or the index
    # of the buffer input it is; and for device arguments their Meta (CPU ones: None).
    expect: tuple[Value | int, ...]
    metas: tuple[Meta | None, ...]
    outputs: tuple[Value, ...]  # the value of each output slot
    fresh: tuple[Fresh, ...]
    # What makes the common cases quick to replay: an op whose tensor arguments are all
    # device tensors holding earlier nodes' outputs (`internal`), that returns one new tensor
    # and nothing else (`single`); a view whose one tensor is its first argument and that
    # has no keyword arguments (`rest`: its other arguments); a view's outputs' Meta and
    # Shape (if neither conjugate nor negative: no other is ever looked up).
    internal: bool = False
    single: bool = False
    rest: tuple[object, ...] | None = None
    offset: int = 0  # (with rest: its tensor's storage offset)
    view_names: tuple[tuple[Meta, Shape], ...] = ()
    children: dict[int, list[Step]] = dataclasses.field(default_factory=dict)
    path: list[object] | None = None  # the graph's parts up to here, once asked for

    def node(self) -> Node:
        return _node(self.entry, self.view, self.wiring, self.scalar_offset)

    def parts(self) -> list[object]:
        """The signature parts of the graph of the ops up to here, in order."""
        if self.path is None:
            parts = []
            step: Step | None = self
            while step is not None and step.parent is not None:
                parts.append(step.part)
                step = step.parent
            self.path = parts[::-1]
        return self.path


def _root() -> Step:
    return Step(
        None, -1, "", (), None, None, ("", 0, ""), None, 0, 0, 0, 0, 0, False, (), (), (), ()
    )


def _child(parent: Step, key: int, wiring: tuple[Value, ...], view: ViewCall | None) -> Step | None:
    """The step after `parent` that reads these values (with this view call)."""
    for step in parent.children.get(key, ()):
        if step.wiring == wiring and (
            view is None
            or (
                step.view is not None
                and step.view.args == view.args
                and step.view.kwargs == view.kwargs
                and step.view.types == view.types
            )
        ):
            return step
    return None


def _step(
    parent: Step,
    key: int,
    name: str,
    wiring: tuple[Value, ...],
    entry: Entry | None,
    view: ViewCall | None,
    location: tuple[str, int, str],
    part: object,
    metas: tuple[Meta | None, ...],
    n_scalars: int,
    n_outputs: int,
    offset: int = 0,
) -> Step:
    """A new step after `parent`, in the tree (a view's: `offset`, its first argument's
    storage offset)."""
    i = parent.index + 1
    outputs = tuple(Value(i, j) for j in range(n_outputs))
    fresh: tuple[Fresh, ...] = ()
    if entry is not None:
        made = [outputs[j] for j in _fresh_slots(entry)]
        fresh = tuple(
            ((shape, stride, dtype, 0), (shape, stride, 0, dtype, False, False), (value, dtype))
            for (shape, stride, dtype), value in zip(entry.fresh, made, strict=True)
        )
    step = Step(
        parent,
        i,
        name,
        wiring,
        entry,
        view,
        location,
        part,
        parent.scalar_offset + parent.n_scalars,
        n_scalars,
        parent.fresh_offset + parent.n_fresh,
        len(fresh),
        parent.launches + (entry is not None),
        parent.cpu_draws or (entry is not None and entry.cpu_draw),
        tuple(v.index if v.node is None else v for v in wiring),
        metas,
        outputs,
        fresh,
    )
    if entry is not None:
        step.internal = all(v.node is not None for v in wiring) and None not in metas
        step.single = len(entry.returns) == 1 and entry.returns[0].kind is FRESH
    if view is not None:
        if (
            not view.kwargs
            and view.args[:1] == (TENSOR,)
            and not any(_takes_tensor(a) for a in view.spec.op._schema.arguments[1:])
        ):
            step.rest, step.offset = tuple(view.args[1:]), offset
        step.view_names = tuple(
            ((shape, stride, dtype, 0), (shape, stride, offset, dtype, False, False))
            for shape, stride, offset, dtype in view.types
        )
    parent.children.setdefault(key, []).append(step)
    return step


class Tape:
    """The buffer of recorded ops, and what names the tensors they read and made."""

    def __init__(self, rt: runtime.Runtime) -> None:
        self.rt = rt
        self.root = _root()  # the trace: every op sequence recorded, as a tree
        self._reset()

    def _reset(self) -> None:
        self.steps: list[Step] = []  # the buffer's ops: a path down the trace
        self.at = self.root  # its last step
        # Per new output, in order: its device storage (held, not its tensor) and the CPU
        # tensor whose memory it is; and the ops' floats, in order.
        self.storages: list[torch.UntypedStorage] = []
        self.hosts: list[Tensor] = []
        self.scalars: list[float] = []
        self.values: dict[int, _Known] = {}  # id(tensor) -> what it holds in the graph
        self.inputs: list[Tensor] = []
        self.input_hosts: list[Tensor] = []
        self.input_types: list[Where] = []  # _where of each input when wired
        self.input_index: dict[int, int] = {}  # id -> its latest input index
        self.ptrs: set[int] = set()  # data pointers of the storages made in this buffer
        # Shape -> storage pointer -> the value a tensor of that geometry holds: an alias
        # made without us (autograd's detached gradients) is it.
        self.geometry: dict[Shape, dict[int, Value]] = {}
        self.bases: dict[int, tuple[Value, torch.dtype]] = {}  # storage -> the value owning it
        self.issued_on = self.rt.stream  # the stream the buffer's ops were issued on

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def ops(self) -> list[RecOp]:
        """The buffer's ops as a cut would give them (built on each call: use len(tape))."""
        return _rec_ops(self.steps, self.scalars, self.storages, self.hosts)

    def take(self) -> Cut:
        """The buffer, whole, as a Cut; the tape starts empty."""
        steps, stream, storages = self.steps, self.issued_on, self.storages
        scalars, hosts = self.scalars, self.hosts
        input_hosts, input_types = self.input_hosts, self.input_types
        self._reset()  # (first: the inputs it held must not count as holders of outputs)
        return Cut(
            steps, stream, input_hosts, input_types, _observable(storages), scalars, storages, hosts
        )

    # -- names ----------------------------------------------------------------------------------
    def _known(self, t: Tensor) -> Value | None:
        known = self.values.get(id(t))
        if (
            known is not None
            and known() is t
            and known.ptr == t.data_ptr()
            and known.meta == _meta(t)
        ):
            return known.value
        return None

    def _name(self, t: Tensor, value: Value, storage: int, meta: Meta | None = None) -> None:
        """t holds `value` (its storage's data pointer given)."""
        meta = _meta(t) if meta is None else meta
        self.values[id(t)] = _known(t, value, t.data_ptr(), meta, storage)

    def _place(self, shape: Shape, ptr: int, value: Value) -> None:
        """A tensor of this geometry on the storage at `ptr` holds `value`."""
        at = self.geometry.get(shape)
        if at is None:
            at = self.geometry[shape] = {}
        at[ptr] = value

    def nameable(self, t: Tensor) -> bool:
        """False when t shares memory with this buffer in a way the graph cannot name."""
        if self._known(t) is not None:
            return True
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr or ptr not in self.ptrs:
            return True  # memory from before the buffer (or none at all): a plain input
        if t.is_conj() or t.is_neg():
            return False  # a lazily conjugated/negated alias: not the same value
        value = self.geometry.get(_shape(t), {}).get(ptr)
        if value is not None:
            self._name(t, value, ptr)
            return True
        base = self.bases.get(ptr)
        if base is None or t.dtype != base[1]:
            return False
        # A view made beneath the dispatcher (autograd's reshapes, _unsafe_view): name it as
        # as_strided of the value that owns the storage, which reproduces it exactly.
        spec = _as_strided_spec()
        shape, stride, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        types = ((t.shape, stride, offset, t.dtype),)
        call = ViewCall(spec, (TENSOR, shape, stride, offset), {}, types)
        self._add_view(spec, call, (base[0],), [t], 0)  # (the owner: a new output, offset 0)
        return True

    def _wire(self, t: Tensor) -> Value:
        value = self._known(t)
        if value is not None:
            return value
        where = _where(t)
        k = self.input_index.get(id(t))
        if k is None or self.input_types[k] != where:  # (new, or it points elsewhere since)
            k = self._add_input(t, where)
        return Value(None, k)

    def _add_input(self, t: Tensor, where: Where) -> int:
        k = len(self.inputs)
        self.input_index[id(t)] = k
        self.inputs.append(t)  # held: its id and memory stay its own until the flush
        self.input_types.append(where)
        # Its memory as it is now: `p.data = ...` (Module.to/half) may swap the tensor's
        # storage before the buffer runs, and recorded ops must read what they saw. A
        # CPU tensor is copied: the op reads it as it is now, as on a device.
        self.input_hosts.append(t.clone() if t.is_cpu else self.rt.memory.host_alias(t))
        return k

    # -- ops ------------------------------------------------------------------------------------
    def follow(self, entry: Entry, tensors: list[Tensor]) -> Replay | None:
        """The buffer's next step in the trace if this op is it: a step of its entry after
        the buffer's last, each tensor argument holding the value the step reads. Changes
        nothing (a cut may come first)."""
        steps = self.at.children.get(id(entry))
        if steps is None:
            return None
        values = self.values
        for step in steps:
            if step.internal:  # (the common case, inline: see _guard)
                for t, want in zip(tensors, step.expect, strict=True):
                    known = values.get(id(t))
                    if (
                        known is None
                        or known.value is not want
                        or known() is not t
                        or known.ptr != t.data_ptr()
                    ):
                        break
                else:
                    return step, ()
                continue
            new = self._guard(step, tensors)
            if new is not None:
                return step, new
        return None

    def _guard(self, step: Step, tensors: list[Tensor]) -> list[tuple[Tensor, Where]] | None:
        """The buffer inputs this op adds when recording would wire it as `step` does (and
        find no hazard), else None. Same entry, so the same sizes, strides and dtypes: a
        tensor holds the value it was named when it is that tensor at the same memory, and
        is the input the step reads when that input is it, pointing where it did."""
        values, index, types = self.values, self.input_index, self.input_types
        new: list[tuple[Tensor, Where]] = []
        added: dict[int, int] = {}  # id -> input index, of the inputs this op adds
        for t, want, meta in zip(tensors, step.expect, step.metas, strict=True):
            known = values.get(id(t))
            if want.__class__ is not int:  # an earlier node's output
                if (
                    known is None
                    or known.value is not want
                    or known() is not t
                    or known.ptr != t.data_ptr()
                ):
                    return None
                if meta is None and known.meta != _meta(t):
                    return None  # (a CPU tensor: the host may have written it)
                continue
            if known is not None and known() is t:
                return None  # (named in this buffer: recording decides)
            k = added.get(id(t)) if added else None
            if k is None:
                k = index.get(id(t))
                # (an input since before this op, still pointing where it did; its memory is
                # held by the buffer, so no storage made since can be it)
                if k is not None and (
                    types[k][0] != t.data_ptr() or (meta is None and types[k][4] != t._version)
                ):
                    k = None
                if k is None:  # a new input: recording checks it is not this buffer's memory
                    if meta is None:
                        where = _where(t)
                    else:
                        ptr = t.untyped_storage().data_ptr()
                        if ptr and ptr in self.ptrs:
                            return None  # (an alias, or a hazard: recording decides)
                        where = (t.data_ptr(), *meta)
                    k = added[id(t)] = len(self.inputs) + len(new)
                    new.append((t, where))
            if k != want:
                return None
        return new

    def replay(
        self, replay: Replay, entry: Entry, tensors: list[Tensor], scalars: list[float]
    ) -> OpValue:
        """The op as the buffer's next node, being the step `follow` found."""
        step, new = replay
        if not self.steps:
            self.issued_on = self.rt.stream
        for t, where in new:
            self._add_input(t, where)
        return self._append(step, entry, tensors, scalars)

    def record(
        self, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[float]
    ) -> OpValue:
        """The op as the buffer's next node; its results are device tensors not yet computed."""
        if not self.steps:
            self.issued_on = self.rt.stream
        wiring = tuple([self._wire(t) for t in tensors])
        step = _child(self.at, id(entry), wiring, None)
        if step is None:
            metas = tuple(None if t.is_cpu else _meta(t) for t in tensors)
            step = _step(
                self.at,
                id(entry),
                spec.name,
                wiring,
                entry,
                None,
                user_frame(),
                (id(entry), wiring),
                metas,
                len(scalars),
                len(entry.outputs),
            )
        return self._append(step, entry, tensors, scalars)

    def _append(
        self, step: Step, entry: Entry, tensors: list[Tensor], scalars: list[float]
    ) -> OpValue:
        """The step's outputs made and named; its return value."""
        rt = self.rt
        if entry.fresh_nbytes > rt.memory.allocator.capacity:  # never fits: the device's error now
            rt.memory.allocate(entry.fresh_nbytes)
        if step.single and rt.numerics:  # (the common case, inline)
            shape, stride, dtype = entry.fresh[0]
            host = torch.empty_strided(shape, stride, dtype=dtype)
            t = to_device(host)
            storage = t.untyped_storage()
            self.steps.append(step)
            self.at = step
            self.storages.append(storage)
            self.hosts.append(host)
            if scalars:
                self.scalars += scalars
            return self._define(t, storage, step.fresh[0])
        if rt.numerics:
            hosts = [torch.empty_strided(*meta[:2], dtype=meta[2]) for meta in entry.fresh]
        else:  # (memory never written, and nothing known of what lived there)
            hosts = [shape_only.empty(*meta[:2], dtype=meta[2]) for meta in entry.fresh]
            for h in hosts:
                shape_only.forget(h)
        outputs = [to_device(h) for h in hosts]
        storages = [t.untyped_storage() for t in outputs]
        self.steps.append(step)
        self.at = step
        self.storages += storages
        self.hosts += hosts
        self.scalars += scalars
        return self._returns(step, entry, tensors, outputs, storages)

    def _returns(
        self,
        step: Step,
        entry: Entry,
        tensors: list[Tensor],
        outputs: list[Tensor],
        storages: list[torch.UntypedStorage],
    ) -> OpValue:
        """The op's return value; every tensor it returns now names this node's output."""
        results: list[Tensor | list[Tensor] | None] = []
        made = iter(zip(outputs, storages, step.fresh, strict=True))
        names = step.outputs
        j = 0
        for r in entry.returns:
            kind = r.kind
            if kind is FRESH:
                results.append(self._define(*next(made)))
                j += 1
            elif kind is LIST:
                items = []
                for _ in r.sizes:
                    items.append(self._define(*next(made)))
                    j += 1
                results.append(items)
            elif kind is NONE:
                results.append(None)
                j += 1
            else:  # write: the argument itself, now holding this node's result
                written = tensors[r.arg]
                ptr = written.untyped_storage().data_ptr()
                self._name(written, names[j], ptr, step.metas[r.arg])
                if ptr in self.ptrs:
                    self._place(_shape(written), ptr, names[j])
                results.append(written)
                j += 1
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _define(self, t: Tensor, storage: torch.UntypedStorage, fresh: Fresh) -> Tensor:
        meta, shape, base = fresh
        ptr = storage.data_ptr()
        known = _Known(t)
        known.value, known.ptr, known.meta, known.storage = base[0], ptr, meta, ptr
        self.values[id(t)] = known
        if ptr:  # (empty tensors have no memory to alias)
            self.ptrs.add(ptr)
            at = self.geometry.get(shape)
            if at is None:
                at = self.geometry[shape] = {}
            at[ptr] = base[0]
            self.bases[ptr] = base
        return t

    # -- views ----------------------------------------------------------------------------------
    def view(self, spec: OpSpec, args: Args, kwargs: Kwargs, result: OpValue) -> bool:
        """A view of a tensor this buffer can name becomes a node, so later ops find it.
        False: it views buffer memory through an alias never seen (the buffer must run)."""
        outs = result if isinstance(result, (list, tuple)) else (result,)
        steps = self.at.children.get(id(spec))
        if steps is not None:
            for step in steps:
                if step.rest is not None:
                    if self._replay_view(step, args, kwargs, outs):
                        return True
                elif self._same_view(step, args, kwargs, outs):
                    self._append_view(step, outs)
                    return True
        tensors = [a for a in args if isinstance(a, Tensor)]
        tensors += [v for v in kwargs.values() if isinstance(v, Tensor)]
        if not any(self._known(t) is not None for t in tensors):
            if not all(self.nameable(t) for t in tensors):
                return False  # a view of buffer memory through an alias we never saw
            if not any(self._known(t) is not None for t in tensors):
                return True  # a view of memory from before the buffer: an input when used
        wiring = tuple([self._wire(t) for t in tensors])
        types = tuple([(o.shape, o.stride(), o.storage_offset(), o.dtype) for o in outs])
        call = ViewCall(
            spec,
            tuple(TENSOR if isinstance(a, Tensor) else a for a in args),
            {k: TENSOR if isinstance(v, Tensor) else v for k, v in kwargs.items()},
            types,
        )
        first = args[0] if args else None
        offset = int(first.storage_offset()) if isinstance(first, Tensor) else 0
        self._add_view(spec, call, wiring, outs, offset)
        return True

    def _replay_view(
        self, step: Step, args: Args, kwargs: Kwargs, outs: tuple[Tensor, ...] | list[Tensor]
    ) -> bool:
        """The step, if this view call is it (a view whose one tensor comes first): the same
        other arguments, its tensor holding the value the step reads, laid out as then (so
        its outputs are too); and then the view appended. False changes nothing."""
        rest = step.rest
        assert rest is not None
        if kwargs or len(args) != len(rest) + 1 or args[1:] != rest:
            return False
        t = cast(Tensor, args[0])
        known = self.values.get(id(t))
        if (
            known is None
            or known.value is not step.expect[0]
            or known() is not t
            or known.ptr != t.data_ptr()
            or known.meta != _meta(t)
            or t.storage_offset() != step.offset
            or len(outs) != len(step.outputs)
        ):
            return False  # (an input, or another value: recording decides)
        self.steps.append(step)
        self.at = step
        values, geometry, storage = self.values, self.geometry, known.storage
        for o, value, (meta, shape) in zip(outs, step.outputs, step.view_names, strict=True):
            named = _Known(o)
            named.value, named.ptr, named.meta, named.storage = value, o.data_ptr(), meta, storage
            values[id(o)] = named
            if o.is_conj() or o.is_neg():
                continue  # (a Shape never looked up: nameable refuses such tensors first)
            at = geometry.get(shape)
            if at is None:
                at = geometry[shape] = {}
            at[storage] = value
        return True

    def _same_view(
        self, step: Step, args: Args, kwargs: Kwargs, outs: tuple[Tensor, ...] | list[Tensor]
    ) -> bool:
        """This view call is the step's: the same arguments, each tensor holding the value the
        step reads, and outputs of the same geometry."""
        call = step.view
        assert call is not None
        if not self._same_arguments(step, args, kwargs) or len(outs) != len(call.types):
            return False
        for o, (shape, stride, offset, dtype) in zip(outs, call.types, strict=True):
            if (
                o.shape != shape
                or o.stride() != stride
                or o.storage_offset() != offset
                or o.dtype != dtype
            ):
                return False
        return True

    def _same_arguments(self, step: Step, args: Args, kwargs: Kwargs) -> bool:
        call = step.view
        assert call is not None
        if len(args) != len(call.args) or tuple(kwargs) != tuple(call.kwargs):
            return False
        expect = iter(step.expect)
        given = [*args, *kwargs.values()]
        recorded = [*call.args, *call.kwargs.values()]
        for a, c in zip(given, recorded, strict=True):
            if c is TENSOR:
                if not isinstance(a, Tensor):
                    return False
                want, value = next(expect), self._known(a)
                if value is None or (value is not want and value != want):
                    return False  # (an input, or another value: recording decides)
            elif isinstance(a, Tensor) or a != c:
                return False
        return True

    def _add_view(
        self,
        spec: OpSpec,
        call: ViewCall,
        wiring: tuple[Value, ...],
        outs: tuple[Tensor, ...] | list[Tensor],
        offset: int,
    ) -> None:
        step = _child(self.at, id(spec), wiring, call)
        if step is None:
            # Same inputs and same output geometry: the same view (its arguments follow).
            part = (spec.op, wiring, call.types)
            metas = tuple(None for _ in wiring)  # (never replayed with an input: not needed)
            step = _step(
                self.at,
                id(spec),
                spec.name,
                wiring,
                None,
                call,
                ("", 0, ""),
                part,
                metas,
                0,
                len(call.types),
                offset,
            )
        self._append_view(step, outs)

    def _append_view(self, step: Step, outs: tuple[Tensor, ...] | list[Tensor]) -> None:
        self.steps.append(step)
        self.at = step
        for o, value, (meta, shape) in zip(outs, step.outputs, step.view_names, strict=True):
            storage = o.untyped_storage().data_ptr()
            self._name(o, value, storage, meta)
            if not (o.is_conj() or o.is_neg()):  # (no other Shape is ever looked up)
                self._place(shape, storage, value)


# What `follow` found: the step, and the buffer inputs the op adds (each with its Where).
Replay = tuple[Step, Sequence[tuple[Tensor, Where]]]


@dataclass(frozen=True, eq=False)
class Cut:
    """A cut of the buffer: its steps in order (its ops: `ops`), the stream they were issued
    on, the memory and types of its inputs as first read, per new output whether anything
    outlives the graph to see it (`observable`), and the ops' floats, new outputs' storages
    and CPU tensors, flat and in order."""

    steps: list[Step]
    stream: int
    input_hosts: list[Tensor]
    input_types: list[Where]
    observable: list[bool]
    scalars: list[float]
    storages: list[torch.UntypedStorage]
    hosts: list[Tensor]

    @functools.cached_property
    def ops(self) -> list[RecOp]:
        """The cut's ops, each with its floats, storages and CPU tensors."""
        return _rec_ops(self.steps, self.scalars, self.storages, self.hosts)

    @property
    def parts(self) -> list[object]:
        return self.steps[-1].parts()

    @property
    def signature(self) -> tuple[object, ...]:
        """What makes two cuts the same graph."""
        return (tuple(self.parts), tuple(self.observable))

    @property
    def launches(self) -> int:
        """How many of the recorded ops launch an executable of their own (views do not)."""
        return self.steps[-1].launches

    def graph(self, name: str = "adaptive") -> tuple[Graph, graph_pb2.GraphDebug]:
        """The cut as one graph (its observable outputs only), with each node's source line."""
        steps = self.steps
        made = [
            Value(s.index, j) for s in steps if s.entry is not None for j in _fresh_slots(s.entry)
        ]
        outputs = tuple(v for v, seen in zip(made, self.observable, strict=True) if seen)
        graph = Graph(
            tuple(_input_type(where) for where in self.input_types),
            tuple(s.node() for s in steps),
            outputs,
            num_scalar_inputs=len(self.scalars),
        )
        debug = graph_pb2.GraphDebug(name=name)
        for s in steps:
            loc = s.location
            debug.node_locations.add(file=loc[0], line=loc[1], function=loc[2])
        return graph, debug


def _rec_ops(
    steps: list[Step],
    scalars: list[float],
    storages: list[torch.UntypedStorage],
    hosts: list[Tensor],
) -> list[RecOp]:
    ops = []
    for s in steps:
        a, b = s.scalar_offset, s.scalar_offset + s.n_scalars
        c, d = s.fresh_offset, s.fresh_offset + s.n_fresh
        ops.append(
            RecOp(
                s.name,
                s.wiring,
                a,
                s.entry,
                scalars[a:b],
                storages[c:d],
                hosts[c:d],
                s.location,
                s.view,
            )
        )
    return ops


def _observable(storages: list[torch.UntypedStorage]) -> list[bool]:
    """Per new output: can anything see its memory after the graph? Exactly when something
    besides the recorder holds its storage: a tensor on it (the output itself, a view, an
    alias made beneath the dispatcher, a tensor autograd saved for backward) or the storage
    object. The recorder holds no tensor of the buffer, only the storage, once."""
    # refs to the storage object: the list, the comprehension's name, the call's argument
    return [_use_count(s._cdata) > 1 or _getrefcount(s) > 3 for s in storages]


def _input_type(where: Where) -> TensorType:
    """A graph input's type as the tensor was when first read (it may have changed since)."""
    _, shape, stride, dtype, _ = where
    return TensorType(tuple(shape), tuple(stride), dtypes.from_name(str(dtype)), 0)


def _node(
    entry: Entry | None, view: ViewCall | None, wiring: tuple[Value, ...], scalar_offset: int
) -> Node:
    if view is not None:
        return _view_node(view, wiring)
    assert entry is not None and entry.node is not None  # (recorded: fusible)
    remap = {Value(None, k): v for k, v in enumerate(wiring)}
    return _shift_scalars(remap_node(entry.node, remap), scalar_offset)


def _view_node(call: ViewCall, wiring: tuple[Value, ...]) -> Node:
    given = iter(wiring)
    spec = call.spec

    def arg(value: OpValue) -> ArgValue:
        return next(given) if value is TENSOR else _constant(value)

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


def _takes_tensor(argument: torch._C.Argument) -> bool:
    """A schema argument that may be given a tensor (comparing one with == runs an op)."""
    return "Tensor" in str(argument.type)


def _as_strided_spec() -> OpSpec:
    return spec_for(torch.ops.aten.as_strided.default)


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
