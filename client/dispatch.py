"""Eager dispatch: every ATen op on neuron tensors becomes a one-node graph, compiled once
per signature (op, shapes, strides, dtypes, constant arguments) and launched on the core.

View ops stay metadata-only (the Meta kernel builds an aliasing tensor on the same
storage); float arguments are runtime scalars, so a changing learning rate reuses one
executable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from trnsim.client import explain as explaining
from trnsim.client import kernels, layouts, memory, runtime, shapes, sparse
from trnsim.client.errors import check_device_index, execution_error, user_frame, user_location
from trnsim.client.memory import to_device
from trnsim.client.ops import (
    DYNAMIC,
    FRESH,
    LIST,
    NONE,
    NOT_RECORDED,
    VALUE,
    WRITE,
    Entry,
    OpSpec,
    Return,
    graph_arg,
    spec_for,
    tensor_type,
)
from trnsim.client.pinned import is_pinned
from trnsim.compiler import op_table
from trnsim.compiler.graph import (
    Alias,
    ArgValue,
    Graph,
    Node,
    TensorType,
    Value,
    remap_node,
)
from trnsim.protos import graph_pb2
from trnsim.simulator import shape_only
from trnsim.simulator.execute import ExecutionError

META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# set_ and resize_ only edit TensorImpl metadata; the CPU kernels do that for any device
# (the Meta ones try to grow the storage, which device storages cannot).
CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
Tensor = torch.Tensor
_READY: dict[Any, OpSpec] = {}  # op -> its spec, with the handler that runs it here


def kernel(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 kernel of every ATen op (fallback and direct registrations)."""
    spec = _READY.get(op)
    if spec is None:  # (the op layer's one spec of the op, given the handler that runs it here)
        spec = _READY[op] = spec_for(op)
        spec.handler = _SPECIAL.get(spec.name, _view if spec.is_view else run_op)
    if shapes.active is not None:  # NEURON_RECORD_SHAPES
        shapes.active.add(spec.name, signature(spec, args, kwargs)[0], args, kwargs)
    return spec.handler(spec, args, kwargs)  # type: ignore[misc]


def _view(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rt = runtime.get()
    rt.metrics.counts["ops_dispatched"] += 1
    rt.metrics.counts["view_ops"] += 1
    result = spec.op.redispatch(META, *args, **kwargs)
    if rt.recorder is not None and rt.recorder.pending:
        rt.recorder.view(spec, args, kwargs, result)
    return result


# -- signatures ---------------------------------------------------------------------------------
def _walk(value: Any, key: list[Any], tensors: list[Tensor], scalars: list[Any]) -> None:
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
    spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], list[Tensor], list[Any]]:
    key: list[Any] = [spec.op]
    tensors: list[Tensor] = []
    scalars: list[Any] = []
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


def repeats(tensors: list[Tensor]) -> tuple[int, ...]:
    """Per tensor argument, the index of its first occurrence (the same tensor passed twice)."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t), k) for k, t in enumerate(tensors))


# -- the generic path ---------------------------------------------------------------------------
def run_op(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rt = runtime.get()
    counts = rt.metrics.counts
    counts["ops_dispatched"] += 1
    key, tensors, scalars = signature(spec, args, kwargs)
    if rt.awaiting:  # collectives' outputs nobody waited for (client/distributed.py)
        rt.await_collectives(tensors)
    entry = rt.signatures.get(key)
    if entry is None:
        counts["cache_misses"] += 1
        entry = _build(rt, spec, args, kwargs, tensors)
        rt.signatures[key] = entry
    else:
        counts["cache_hits"] += 1
    if entry.sparse_out:
        return sparse.launch(spec.op, args, kwargs)
    recorder = rt.recorder
    if recorder is not None:
        result = recorder.offer(spec, entry, tensors, scalars)
        if result is not NOT_RECORDED:
            return result
    nbytes = entry.one_fresh_output
    if nbytes is not None:  # the hot path: one new tensor out
        host = rt.host_alias
        if entry.takes is not None:
            tensors = entry.inputs_of(tensors)
        inputs = [t if t.is_cpu else host(t) for t in tensors]
        block = rt.allocate(nbytes)
        try:
            loaded = entry.loaded or entry.executable()
            out = loaded.run(inputs, scalars, rt.generator)[0]
        except ExecutionError as e:
            rt.allocator.free(block)
            raise execution_error(spec.name, e.cause) from e.cause
        rt.launch(loaded)
        if not entry.verified:
            _verify(entry, [out])
        return rt.adopt(to_device(out), block, out)
    return _execute(rt, spec, entry, tensors, scalars)


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
    rt: runtime.Runtime,
    spec: OpSpec,
    entry: Entry,
    tensors: list[Tensor],
    scalars: list[Any],
) -> Any:
    inputs = [t if t.is_cpu else rt.host_alias(t) for t in entry.inputs_of(tensors)]
    # The CPU kernel may resize out=: give it a CPU tensor. (An op writing an argument takes
    # every tensor argument, so `takes` never renumbers out_args.)
    for index in entry.out_args:
        inputs[index] = torch.empty(0, dtype=tensors[index].dtype)
    blocks = [rt.allocate(n) for r in entry.returns for n in r.sizes]
    loaded = entry.loaded or entry.executable()
    try:
        outs = loaded.run(inputs, scalars, rt.generator)
    except ExecutionError as e:
        rt.free_unadopted(blocks)
        raise execution_error(spec.name, e.cause) from e.cause
    if entry.dynamic and not rt.numerics and any(o is None for o in outs):
        rt.free_unadopted(blocks)  # (shape-only mode: a data-dependent op with no assumption)
        raise shape_only.unsupported(f"{spec.name} (called at {user_location()})")
    for index in entry.out_args:
        result, out = inputs[index], tensors[index]
        if out.shape != result.shape:
            out.resize_(result.shape)
        if rt.numerics:
            rt.host_alias(out).copy_(result)
        else:  # (a computed result is copied in; else out's memory stays unwritten)
            shape_only.settle(rt.host_alias(out), result)
    rt.launch(loaded)
    if entry.dynamic:
        rt.synchronize()
        rt.metrics.counts["dynamic_shape_ops"] += 1
    results: list[Any] = []
    made: list[Tensor] = []
    next_block = iter(blocks)
    flat = iter(outs)  # the executable's outputs, lists flattened
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


def _adopt(rt: runtime.Runtime, out: Tensor, block: Any, dynamic: bool) -> Tensor:
    if dynamic:  # the size was unknown until now: account for what the op produced
        rt.free_unadopted([block])
        block = rt.allocate(out.untyped_storage().nbytes())
    return rt.adopt(to_device(out), block, out)


# -- building the one-node graph on a signature miss -------------------------------------------
def _to_meta(value: Any) -> Any:
    if isinstance(value, Tensor):
        if value.is_cpu and value.dim() == 0:
            return value  # CPU scalars mix with device tensors, as on CUDA
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        check_device_index(value)
        return torch.device("meta") if value.type == "neuron" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _meta_outputs(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """(output values on meta, dynamic). Dynamic: the output shape depends on the data."""
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    try:
        out = spec.op(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001
        # No meta kernel, a data-dependent shape, or bad arguments: the real run decides
        # (and names the op and the user's line if it fails too).
        return None, True
    if not isinstance(out, tuple):
        out = (out,)
    if layouts.chooses_layout(spec.name):  # (the CPU's layout, where Meta's differs)
        out = layouts.as_on_cpu(spec.op, args, kwargs, out)
    return out, False


def _makes_sparse(spec: OpSpec, meta_out: Any) -> bool:
    """Whether the op makes sparse tensors from strided ones (to_sparse): by its Meta
    kernel's outputs, or by its name where their number of nonzeros needs the data."""
    if meta_out is None:
        return "sparse" in spec.name
    return any(isinstance(m, Tensor) and m.layout != torch.strided for m in meta_out)


def _build(
    rt: runtime.Runtime,
    spec: OpSpec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    tensors: list[Tensor],
) -> Entry:
    _check_devices(spec, tensors)
    meta_out, dynamic = _meta_outputs(spec, args, kwargs)
    if _makes_sparse(spec, meta_out):
        return Entry(None, [], False, [], sparse_out=True)
    inputs: list[TensorType] = []
    counter = [0]
    named: list[tuple[str, ArgValue]] = []
    arg_tensor_index: dict[str, int] = {}
    for i, value in enumerate(args):
        name = spec.positional_names[i] if i < len(spec.positional_names) else f"arg{i}"
        if isinstance(value, Tensor):
            arg_tensor_index[name] = len(inputs)
        named.append((name, graph_arg(value, inputs, counter)))
    for name, value in kwargs.items():
        if isinstance(value, Tensor):
            arg_tensor_index[name] = len(inputs)
        named.append((name, graph_arg(value, inputs, counter)))
    arg_position = {name: i for i, (name, _) in enumerate(named)}
    returns: list[Return] = []
    out_types: list[TensorType] = []
    aliases: list[Alias] = []
    out_args: list[int] = []
    fresh: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = []
    n_returns = len(spec.returns_tensor)
    for j in range(n_returns):
        meta = meta_out[j] if meta_out is not None and j < len(meta_out) else None
        if j in spec.writes and spec.writes[j] in arg_tensor_index:
            index = arg_tensor_index[spec.writes[j]]
            returns.append(Return.written(index))
            aliases.append(Alias(len(out_types), arg_position[spec.writes[j]], writes=True))
            if spec.writes[j] in kwargs:  # out=: kwarg-only in every schema
                out_args.append(index)
            out_types.append(tensor_type(meta) if isinstance(meta, Tensor) else inputs[index])
        elif isinstance(meta, (list, tuple)):
            returns.append(Return.items([tensor_type(m).nbytes for m in meta]))
            out_types.extend(tensor_type(m) for m in meta)
            fresh.extend(_meta_of(m) for m in meta)
        elif isinstance(meta, Tensor):
            returns.append(Return.fresh(tensor_type(meta).nbytes))
            out_types.append(tensor_type(meta))
            fresh.append(_meta_of(meta))
        elif spec.returns_tensor[j] and not dynamic:
            returns.append(Return(NONE))  # an optional output the op did not produce
            out_types.append(DYNAMIC)
        elif spec.returns_tensor[j]:
            returns.append(Return.fresh(0))  # data-dependent: sized after the run
            out_types.append(DYNAMIC)
        else:
            returns.append(Return(VALUE))
    op_name = spec.name if "::" in spec.name else f"aten::{spec.name}"
    node = Node(
        op_name,
        tuple(named),
        tuple(out_types),
        tuple(aliases),
        tuple(k for k, (name, _) in enumerate(named) if name in spec.mutated),
        kernels.cost_of(op_name, args, kwargs),  # (custom kernels only)
    )
    graph, takes = _one_node_graph(node, inputs, len(out_types), counter[0], tensors)
    path, line, function = user_frame()
    debug = graph_pb2.GraphDebug(name=spec.name)
    debug.node_locations.add(file=path, line=line, function=function)
    # Random ops without a generator argument draw from the CPU's global generator when
    # they run: recording would move that draw. (The others get the device generator.)
    cpu_draw = op_table.is_random(node.op) and "generator" not in spec.argument_names
    recordable = (
        not dynamic
        and not out_args
        and all(r.kind is not VALUE for r in returns)
        and op_table.fusible(node.op)
    )
    # An op met while recording a compiled region runs inside the region's executable: its
    # own is compiled only if it is ever run on its own.
    lazy = recordable and rt.recorder is not None and rt.recorder.region
    return Entry(
        None if lazy else rt.executables.get(graph, debug),
        returns,
        dynamic,
        out_args,
        node,
        fresh,
        recordable and not cpu_draw,
        compile_later=(lambda: rt.executables.get(graph, debug)) if lazy else None,
        cpu_draw=recordable and cpu_draw,
        takes=takes,
    )


def _one_node_graph(
    node: Node,
    inputs: list[TensorType],
    n_outputs: int,
    n_scalars: int,
    tensors: list[Tensor],
) -> tuple[Graph, tuple[int, ...] | None]:
    """The op's executable graph, and which tensor arguments it takes (None: all, in order).
    A tensor passed twice is one input, read twice, unless the op writes an argument."""
    outputs = tuple(Value(0, j) for j in range(n_outputs))
    first = repeats(tensors)
    if list(first) == list(range(len(tensors))) or node.writes():
        return Graph(tuple(inputs), (node,), outputs, num_scalar_inputs=n_scalars), None
    takes = tuple(k for k, f in enumerate(first) if f == k)
    position = {k: i for i, k in enumerate(takes)}
    mapping = {Value(None, k): Value(None, position[f]) for k, f in enumerate(first)}
    graph = Graph(
        tuple(inputs[k] for k in takes),
        (remap_node(node, mapping),),
        outputs,
        num_scalar_inputs=n_scalars,
    )
    return graph, takes


# Ops that take CPU tensors next to device tensors on CUDA too: indices (moved by the op),
# split points and bins that must be on the CPU, copies between devices.
_TAKES_CPU_TENSORS = frozenset(
    [
        "aten::index.Tensor",
        "aten::_unsafe_index.Tensor",
        "aten::index_put.default",
        "aten::index_put_.default",
        "aten::_index_put_impl_.default",
        "aten::_unsafe_index_put.default",
        "aten::copy_.default",
        "aten::_to_copy.default",
        "aten::tensor_split.tensor_indices_or_sections",
        "aten::histogramdd.default",
        "aten::histogramdd.int_bins",
        "aten::histogramdd.TensorList_bins",
        "aten::_histogramdd_from_bin_tensors.default",
        "aten::_histogramdd_from_bin_cts.default",
        "aten::_histogramdd_bin_edges.default",
    ]
)


def _check_devices(spec: OpSpec, tensors: list[Tensor]) -> None:
    """A CPU tensor (other than a 0-dim scalar) next to a neuron tensor is an error, as on
    CUDA, except for the ops that take them there too."""
    if spec.name in _TAKES_CPU_TENSORS or all(t.is_cpu for t in tensors):
        return
    if any(t.is_cpu and t.dim() > 0 for t in tensors):
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"neuron:0 and cpu! (in {spec.name}, called at {user_location()}). Move the CPU "
            f"tensor with .to('neuron') first."
        )


def _meta_of(t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype]:
    return tuple(t.shape), tuple(t.stride()), t.dtype


# -- ops with their own handling ----------------------------------------------------------------
def _copy_from(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    src, dst = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    rt = runtime.get()
    if not src.is_cpu and not dst.is_cpu:
        return kernel(torch.ops.aten.copy_.default, dst, src, non_blocking)
    rt.metrics.counts["ops_dispatched"] += 1
    from trnsim.simulator.execute import transfer

    if dst.is_cpu:  # device -> host: the host needs the device's results
        rt.device_to_host(src.numel() * src.element_size(), non_blocking and is_pinned(dst))
        if rt.numerics or shape_only.is_real(src):
            transfer(dst, memory.to_host_alias(src))
        else:
            explaining.note_placeholder("a copy to the host (.cpu(), .tolist(), print)")
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


def _local_scalar_dense(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rt = runtime.get()
    rt.metrics.counts["ops_dispatched"] += 1
    rt.device_to_host(args[0].element_size())
    if not rt.numerics and not shape_only.is_real(args[0]):
        explaining.note_placeholder(".item() (a Python number or truth value of a tensor)")
        return _placeholder(args[0].dtype)
    return memory.to_host_alias(args[0]).item()


def _placeholder(dtype: torch.dtype) -> Any:
    """Shape-only mode's value for a tensor read as a Python number (explain.PLACEHOLDER)."""
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


def empty_device_tensor(
    shape: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype | None
) -> Tensor:
    rt = runtime.get()
    dtype = dtype or torch.get_default_dtype()
    strides = _contiguous_strides(shape) if stride is None else list(stride)
    # The simulated HBM first: a tensor the device cannot hold is its OutOfMemoryError, never
    # the host allocator's error about the memory that backs it.
    block = rt.allocate(_span(shape, strides) * dtype.itemsize)
    if rt.numerics:
        host = torch.empty_strided(shape, strides, dtype=dtype)
    else:  # (never filled, even with deterministic algorithms on)
        host = shape_only.empty(shape, strides, dtype)
        shape_only.forget(host)
    return rt.adopt(to_device(host), block, host)


def _span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements a tensor of this geometry addresses in its storage."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))


def _empty(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rt = runtime.get()
    rt.metrics.counts["ops_dispatched"] += 1
    check_device_index(kwargs.get("device"))
    if kwargs.get("pin_memory"):
        raise RuntimeError(
            "pin_memory is not available for neuron tensors (they are not host tensors)"
        )
    memory_format = kwargs.get("memory_format")
    if spec.name == "aten::empty_strided.default":
        return empty_device_tensor(args[0], args[1], kwargs.get("dtype"))
    t = empty_device_tensor(args[0], None, kwargs.get("dtype"))
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        host = torch.empty(args[0], dtype=t.dtype, memory_format=memory_format)
        return empty_device_tensor(host.shape, host.stride(), host.dtype)
    return t


def _zero_tensor(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """_efficientzerotensor (forward-mode AD's zero tangents): a ZeroTensor is a tensor
    without memory that only C++ backends can make; here it is zeros in device memory, which
    every op reads as the zeros it stands for."""
    check_device_index(kwargs.get("device"))
    t = empty_device_tensor(list(args[0]), None, kwargs.get("dtype"))
    return t.zero_()


def _whole_storage(t: Tensor, numel: int) -> Tensor:
    """The tensor's whole storage (numel elements) as a 1-D CPU view."""
    flat = torch.ops.aten.as_strided.default.redispatch(META, t, (numel,), (1,), 0)
    return memory.to_host_alias(flat)


def _contiguous_strides(size: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for s in reversed(size):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


def _resize(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """resize_: metadata only when the storage is big enough, else a new storage that keeps
    the old contents (device storages cannot grow in place)."""
    self, size = args[0], list(args[1])
    runtime.get().flush("hazard")
    runtime.get().metrics.counts["ops_dispatched"] += 1
    numel = 1
    for s in size:
        numel *= s
    if (self.storage_offset() + numel) * self.element_size() <= self.untyped_storage().nbytes():
        return spec.op.redispatch(CPU_KERNEL, *args, **kwargs)
    fresh = empty_device_tensor([self.storage_offset() + numel], None, self.dtype)
    old_numel = self.untyped_storage().nbytes() // self.element_size()
    if old_numel and runtime.get().numerics:
        _whole_storage(fresh, old_numel).copy_(_whole_storage(self, old_numel))
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        CPU_KERNEL,
        self,
        fresh.untyped_storage(),
        self.storage_offset(),
        size,
        _contiguous_strides(size),
    )
    return self


def _metadata(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    runtime.get().flush("hazard")  # recorded ops read the tensor as it is now
    runtime.get().metrics.counts["ops_dispatched"] += 1
    return spec.op.redispatch(CPU_KERNEL, *args, **kwargs)


def _no_op(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return None


def _inplace_view(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """t_, transpose_, squeeze_...: change the tensor's own sizes and strides, no data."""
    runtime.get().flush("hazard")  # recorded ops read the tensor as it is now
    runtime.get().metrics.counts["ops_dispatched"] += 1
    runtime.get().metrics.counts["view_ops"] += 1
    return spec.op.redispatch(META, *args, **kwargs)


_INPLACE_VIEWS = "t_ transpose_ squeeze_ unsqueeze_ as_strided_ swapdims_ swapaxes_ detach_"


def _no_nested_fast_path(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """neuron has no nested tensors. nn.TransformerEncoder asks this before building one for
    its fast path: "no" sends it down its regular path (outputs at padded positions are not
    zeroed there, as PyTorch documents for that path)."""
    runtime.get().metrics.counts["ops_dispatched"] += 1
    return False


def _nested(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise NotImplementedError(
        f"{spec.name}: nested tensors are not supported on the neuron device; use padded "
        f"tensors with a mask (for nn.TransformerEncoder: enable_nested_tensor=False)"
    )


_SPECIAL: dict[str, Callable[[OpSpec, tuple[Any, ...], dict[str, Any]], Any]] = {
    "aten::_copy_from.default": _copy_from,
    "aten::_local_scalar_dense.default": _local_scalar_dense,
    "aten::empty.memory_format": _empty,
    "aten::empty_strided.default": _empty,
    "aten::resize_.default": _resize,
    "aten::set_.source_Storage_storage_offset": _metadata,
    "aten::set_.source_Storage": _metadata,
    "aten::set_.source_Tensor": _metadata,
    "aten::record_stream.default": _no_op,
    "aten::_efficientzerotensor.default": _zero_tensor,
    "aten::_nested_tensor_from_mask_left_aligned.default": _no_nested_fast_path,
    "aten::_nested_tensor_from_mask.default": _nested,
    "aten::_nested_tensor_from_tensor_list.default": _nested,
}
for _name in _INPLACE_VIEWS.split():
    _packet = getattr(torch.ops.aten, _name)
    for _overload in _packet.overloads():
        _SPECIAL[f"aten::{_name}.{_overload}"] = _inplace_view
