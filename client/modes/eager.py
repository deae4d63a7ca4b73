"""Eager mode: one op's signature entry run now, as its own executable, one launch.

The door (client/door/kernel.py) hands every op here that no recording mode took. The op's CPU
kernel runs over the memory its device tensors live in (the simulator's numerics); its new
outputs get device memory; the launch goes on the current stream.
"""

from __future__ import annotations

import torch
from trnsim.client.core import runtime
from trnsim.client.core.device_memory import Block
from trnsim.client.core.errors import execution_error, user_location
from trnsim.client.core.memory import to_device
from trnsim.client.core.ops import FRESH, LIST, NONE, WRITE, Entry, OpSpec
from trnsim.client.core.types import OpValue
from trnsim.simulator import shape_only
from trnsim.simulator.execute import ExecutionError

Tensor = torch.Tensor


def run(
    rt: runtime.Runtime, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[float]
) -> OpValue:
    """The op's results, computed now."""
    nbytes = entry.one_fresh_output
    if nbytes is None:
        return _execute(rt, spec, entry, tensors, scalars)
    # the hot path: one new tensor out
    memory = rt.memory
    alias = memory.host_alias_as
    metas = entry.metas
    if entry.takes is not None:
        tensors, metas = entry.inputs_of(tensors), entry.inputs_of(metas)
    inputs = [t if meta[3] else alias(t, meta) for t, meta in zip(tensors, metas, strict=True)]
    block = memory.allocate(nbytes)
    try:
        loaded = entry.loaded or entry.executable()
        out = loaded.run(inputs, scalars, rt.generator)[0]
    except ExecutionError as e:
        memory.free_unadopted([block])
        raise execution_error(spec.name, e.cause) from e.cause
    rt.launch(loaded)
    if not entry.verified:
        _verify(entry, [out])
    return memory.adopt(to_device(out), block, out)


def _verify(entry: Entry, made: list[Tensor]) -> None:
    """A signature's first run: do the tensors it made have the metadata the Meta kernels
    gave (what adaptive mode hands out before running anything)? If not, it is never
    recorded: it runs on its own, as here."""
    entry.verified = True
    if len(made) != len(entry.fresh) or any(
        tuple(t.shape) != shape or tuple(t.stride()) != stride or t.dtype != dtype
        for t, (shape, stride, dtype) in zip(made, entry.fresh, strict=False)
    ):
        entry.fusible = False


def _execute(
    rt: runtime.Runtime, spec: OpSpec, entry: Entry, tensors: list[Tensor], scalars: list[float]
) -> OpValue:
    """The general case: several outputs, written arguments, out=, Python values, and
    data-dependent shapes (a sync point)."""
    alias = rt.memory.host_alias_as
    inputs = [
        t if meta[3] else alias(t, meta)
        for t, meta in zip(entry.inputs_of(tensors), entry.inputs_of(entry.metas), strict=True)
    ]
    # The CPU kernel may resize out=: give it a CPU tensor. (An op writing an argument takes
    # every tensor argument, so `takes` never renumbers out_args.)
    for index in entry.out_args:
        inputs[index] = torch.empty(0, dtype=tensors[index].dtype)
    sizes: list[int | None] = [n for r in entry.returns for n in r.sizes]
    blocks = [b for b in rt.memory.allocate_each(sizes) if b is not None]
    loaded = entry.loaded or entry.executable()
    try:
        outs = loaded.run(inputs, scalars, rt.generator)
    except ExecutionError as e:
        rt.memory.free_unadopted(blocks)
        raise execution_error(spec.name, e.cause) from e.cause
    if entry.dynamic and not rt.numerics and any(o is None for o in outs):
        rt.memory.free_unadopted(
            blocks
        )  # (shape-only mode: a data-dependent op with no assumption)
        raise shape_only.unsupported(f"{spec.name} (called at {user_location()})")
    _write_out_args(rt, entry, inputs, tensors)
    rt.launch(loaded)
    if entry.dynamic:
        rt.synchronize()
        rt.count("dynamic_shape_ops")
    return _results(rt, entry, outs, blocks, tensors)


def _write_out_args(
    rt: runtime.Runtime, entry: Entry, inputs: list[Tensor], tensors: list[Tensor]
) -> None:
    for index in entry.out_args:
        result, out = inputs[index], tensors[index]
        if out.shape != result.shape:
            out.resize_(result.shape)
        if rt.numerics:
            rt.memory.host_alias(out).copy_(result)
        else:  # (a computed result is copied in; else out's memory stays unwritten)
            shape_only.settle(rt.memory.host_alias(out), result)


def _results(
    rt: runtime.Runtime,
    entry: Entry,
    outs: list[OpValue],
    blocks: list[Block],
    tensors: list[Tensor],
) -> OpValue:
    """The op's return value from the executable's outputs (lists flattened)."""
    results: list[OpValue] = []
    made: list[Tensor] = []
    next_block = iter(blocks)
    flat = iter(outs)
    for r in entry.returns:
        kind = r.kind
        if kind is FRESH:
            made.append(_adopt(rt, next(flat), next(next_block), entry.dynamic))
            results.append(made[-1])
        elif kind is LIST:
            items = [_adopt(rt, next(flat), next(next_block), entry.dynamic) for _ in r.sizes]
            made.extend(items)
            results.append(items)
        elif kind is WRITE:
            next(flat)
            results.append(tensors[r.arg])
        elif kind is NONE:
            next(flat)
            results.append(None)
        else:  # a Python value: the host needed the device's answer
            rt.synchronize()
            results.append(next(flat))
    if not entry.verified:
        _verify(entry, made)
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)


def _adopt(rt: runtime.Runtime, out: Tensor, block: Block, dynamic: bool) -> Tensor:
    if dynamic:  # the size was unknown until now: account for what the op produced
        rt.memory.free_unadopted([block])
        block = rt.memory.allocate(out.untyped_storage().nbytes())
    return rt.memory.adopt(to_device(out), block, out)
