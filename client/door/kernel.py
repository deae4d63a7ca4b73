"""The one PrivateUse1 door: every ATen op on neuron tensors enters here, whatever the mode.

The door finds the op's spec and handler (a special op's own, a view's, or the generic
path), keys the call by its signature (op, shapes, strides, dtypes, constant arguments) and
memoises one Entry per signature: the op translated once (ops.one_node) with its one-op
executable. Then the current recording mode (adaptive, or a compiled region) may take the
call; otherwise eager mode runs it now (client/modes/eager.py).

View ops stay metadata-only (the Meta kernel builds an aliasing tensor on the same
storage); float arguments are runtime scalars, so a changing learning rate reuses one
executable.
"""

from __future__ import annotations

import torch
from trnsim.client.core import memory, runtime, shapes
from trnsim.client.core.notes import note_placeholder
from trnsim.client.core.ops import (
    NOT_RECORDED,
    Entry,
    OpSpec,
    one_node,
    repeats,
    spec_for,
)
from trnsim.client.core.pinned import is_pinned
from trnsim.client.core.types import Args, Kwargs, Op, OpValue
from trnsim.client.door import buckets, fast, sparse, special
from trnsim.client.modes import eager
from trnsim.simulator import shape_only

Tensor = torch.Tensor
_READY: dict[Op, OpSpec] = {}  # op -> its spec, with the handler that runs it here


def kernel(op: Op, *args: OpValue, **kwargs: OpValue) -> OpValue:
    """The PrivateUse1 kernel of every ATen op (direct registrations; the fallback, which
    keeps each op's spec, calls enter)."""
    spec = _READY.get(op) or ready(op)
    if shapes.active is not None:  # NEURON_RECORD_SHAPES
        shapes.active.add(spec.name, signature(spec, args, kwargs)[0], args, kwargs)
    return spec.handler(spec, args, kwargs)  # type: ignore[misc]


def ready(op: Op) -> OpSpec:
    """The op layer's one spec of the op, given the handler that runs it here (memoised)."""
    spec = _READY.get(op)
    if spec is None:
        spec = _READY[op] = spec_for(op)
        handler = _copy_from if spec.name == "aten::_copy_from.default" else None
        spec.handler = handler or special.HANDLERS.get(spec.name, _view if spec.is_view else run_op)
    return spec


def enter(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    """kernel(), given the op's spec (from ready)."""
    if shapes.active is not None:  # NEURON_RECORD_SHAPES
        shapes.active.add(spec.name, signature(spec, args, kwargs)[0], args, kwargs)
    return spec.handler(spec, args, kwargs)  # type: ignore[misc]


def _view(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    rt = runtime.get()
    counts = rt.counts
    counts["ops_dispatched"] += 1
    counts["view_ops"] += 1
    # (OpOverload.redispatch without its Python frame: a third of the ops are views)
    result = spec.op._handle.redispatch_boxed(special.META, *args, **kwargs)
    if rt.recorder is not None and rt.recorder.pending:
        rt.recorder.view(spec, args, kwargs, result)
    elif rt.recorder is None and shapes.active is None:
        fast.offer_view(spec)  # (the C++ door makes this op's views from now on)
    return result


# -- signatures ---------------------------------------------------------------------------------
def _walk(value: OpValue, key: list[object], tensors: list[Tensor], scalars: list[float]) -> None:
    t = type(value)
    if t is Tensor or isinstance(value, Tensor):
        tensors.append(value)
        key.append((value.shape, value.stride(), value.dtype, value.is_cpu))
    elif t is float:
        scalars.append(value)
        key.append(float)
    elif t is list or t is tuple:
        key.append(len(value))
        for item in value:
            _walk(item, key, tensors, scalars)
    else:
        key.append((t, value))


def signature(
    spec: OpSpec, args: Args, kwargs: Kwargs
) -> tuple[tuple[object, ...], list[Tensor], list[float]]:
    """(the call's key, its tensor arguments, its float arguments) in argument order. The
    key starts with the op's spec, one per op, whose hash is its identity (an OpOverload's
    is a Python method)."""
    key: list[object] = [spec]
    tensors: list[Tensor] = []
    scalars: list[float] = []
    for value in args:  # the common cases inline (this runs for every op)
        if isinstance(value, Tensor):
            tensors.append(value)
            key.append((value.shape, value.stride(), value.dtype, value.is_cpu))
        else:
            _walk(value, key, tensors, scalars)
    if kwargs:
        for name, value in kwargs.items():
            key.append(name)
            _walk(value, key, tensors, scalars)
    if spec.shape_from_scalars:
        key.append(tuple(scalars))
    n = len(tensors)
    if n > 1 and (tensors[0] is tensors[1] if n == 2 else len(set(map(id, tensors))) < n):
        key.append(repeats(tensors))  # (a * a is another executable than a * b)
    return tuple(key), tensors, scalars


# -- the generic path ---------------------------------------------------------------------------
def run_op(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    """An op through its signature's entry: taken by the recording mode, or run now."""
    rt = runtime.get()
    counts = rt.counts
    counts["ops_dispatched"] += 1
    key, tensors, scalars = signature(spec, args, kwargs)
    if rt.awaiting:  # collectives' outputs nobody waited for (client/distributed/)
        rt.await_collectives(tensors)
    entry = rt.signatures.get(key)
    if entry is None:
        counts["cache_misses"] += 1
        entry = rt.signatures[key] = _entry(rt, spec, key, args, kwargs, tensors)
    else:
        counts["cache_hits"] += 1
    if entry.sparse_out:
        return sparse.launch(spec.op, args, kwargs)
    recorder = rt.recorder
    if recorder is not None:
        result = recorder.offer(spec, entry, tensors, scalars)
        if result is not NOT_RECORDED:
            return result
    result = eager.run(rt, spec, entry, tensors, scalars)
    if entry.fast is not False and recorder is None:  # (a recording mode: the door is off)
        fast.offer(rt, spec, entry, args, kwargs, tensors, scalars)  # (served in C++ next?)
    return result


def _entry(
    rt: runtime.Runtime,
    spec: OpSpec,
    key: tuple[object, ...],
    args: Args,
    kwargs: Kwargs,
    tensors: list[Tensor],
) -> Entry:
    """A signature met for the first time: the op translated, with its one-op executable
    (compiled later, if ever, when the recording mode runs recordable ops inside its own),
    or its shape bucket's when sizes of it change with the data (client/door/buckets.py)."""
    made = one_node(spec, args, kwargs, tensors)
    if made is None:
        return Entry(None, [], False, [], sparse_out=True)
    graph, debug = made.graph, made.debug
    # (a CPU-generator draw too: a region whose draws run in order records it)
    recordable = made.recordable or made.cpu_draw
    lazy = recordable and rt.recorder is not None and rt.recorder.defers_op_compiles
    loaded = None
    if not lazy:  # (its shape bucket's executable when sizes of it are dynamic)
        loaded = buckets.executable(rt, spec, key, args, kwargs, made) or rt.executables.get(
            graph, debug
        )
    return Entry(
        loaded,
        made.returns,
        made.dynamic,
        made.out_args,
        made.node,
        made.fresh,
        made.recordable,
        compile_later=(lambda: rt.executables.get(graph, debug)) if lazy else None,
        deferred=(graph, debug) if lazy else None,
        cpu_draw=made.cpu_draw,
        takes=made.takes,
        metas=[(t.shape, t.stride(), t.dtype, t.is_cpu) for t in tensors],
    )


# -- the one op between host and device ---------------------------------------------------------
def _copy_from(spec: OpSpec, args: Args, kwargs: Kwargs) -> OpValue:
    src, dst = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    rt = runtime.get()
    if not src.is_cpu and not dst.is_cpu:
        return kernel(torch.ops.aten.copy_.default, dst, src, non_blocking)
    rt.count("ops_dispatched")
    from trnsim.simulator.execute import transfer

    if dst.is_cpu:  # device -> host: the host needs the device's results
        rt.device_to_host(src.numel() * src.element_size(), non_blocking and is_pinned(dst))
        if rt.numerics or shape_only.is_real(src):
            transfer(dst, memory.to_host_alias(src))
        else:
            note_placeholder("a copy to the host (.cpu(), .tolist(), print)")
            dst.zero_()
    else:  # host -> device: recorded ops must not see the new data early, or late
        rt.flush("hazard")
        rt.host_to_device(src.numel() * src.element_size(), non_blocking and is_pinned(src))
        if rt.numerics:
            transfer(memory.to_host_alias(dst), src, non_blocking)
        elif shape_only.host_supplied(dst):  # (ids, masks: the model's control flow reads them)
            transfer(memory.to_host_alias(dst), src)
            shape_only.mark_real([dst])
        else:
            shape_only.forget(dst)
    return dst
