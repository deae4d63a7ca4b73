"""Sparse tensors on neuron: COO (the SparsePrivateUse1 key) and CSR/CSC/BSR/BSC (the
SparseCsrPrivateUse1 key).

A sparse neuron tensor is PyTorch's own sparse tensor (SparseTensorImpl, SparseCsrTensorImpl)
whose index and value tensors are dense neuron tensors in device memory. Two kinds of op
reach it here:

- structure: reading or setting what the sparse tensor is made of (its index and value
  tensors, sizes, nnz, the coalesced flag), or making one from its parts. The CPU's sparse
  kernel does only that, whatever the device of the parts: it runs as it is (STRUCTURE);
- the rest (coalesce, add, mul, mm, index_select, sum, to_dense...): one launch. Its
  numerics are the CPU's sparse kernel over CPU tensors aliasing the device memory; new
  parts land in new device memory, accounted in the simulated HBM like any op's outputs;
  its time is the sparse cost model's (simulator/cost_model.py sparse_op: indirect DMA
  gathers and scatters over the nonzeros, GpSimd index work, and a sort to coalesce).

Sparse ops are not compiled into executables (the compiler's graphs hold strided tensors
only): each is its own launch, and adaptive mode cuts its graph before one (cut_sparse),
so recorded ops and sparse ops run in program order. An op the CPU has no sparse kernel for
raises PyTorch's error for it, naming the op (NotImplementedError), as on the CPU.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_map
from trnsim.client.core import runtime
from trnsim.client.core.memory import to_device
from trnsim.client.core.types import Args, Kwargs, Op, OpValue
from trnsim.simulator import cost_model

Tensor = torch.Tensor
SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)
SPARSE_CSR_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrCPU)
DEVICE = "neuron"
COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)

# Ops that only read or set a sparse tensor's structure, or make one from its parts: the
# CPU's sparse kernels do that for parts on any device.
STRUCTURE = frozenset(
    [
        "_indices",
        "_values",
        "indices",
        "values",
        "_nnz",
        "sparse_dim",
        "dense_dim",
        "_dimI",
        "_dimV",
        "is_coalesced",
        "_coalesced_",
        "_sparse_coo_tensor_with_dims_and_tensors",
        "_sparse_coo_tensor_with_dims",
        "sparse_resize_",
        "sparse_resize_and_clear_",
        "crow_indices",
        "col_indices",
        "ccol_indices",
        "row_indices",
        "is_pinned",
    ]
)


def _structure_op(op: Op) -> bool:
    return op._schema.name.split("::", 1)[1] in STRUCTURE


def coo_kernel(op: Op, *args: OpValue, **kwargs: OpValue) -> OpValue:
    """The SparsePrivateUse1 fallback: every op on a sparse COO neuron tensor."""
    if _structure_op(op):
        return op.redispatch(SPARSE_CPU, *args, **kwargs)
    return launch(op, args, kwargs)


def compressed_kernel(op: Op, *args: OpValue, **kwargs: OpValue) -> OpValue:
    """The SparseCsrPrivateUse1 fallback: every op on a sparse compressed neuron tensor."""
    if _structure_op(op):
        return op.redispatch(SPARSE_CSR_CPU, *args, **kwargs)
    return launch(op, args, kwargs)


def is_sparse_neuron(t: object) -> bool:
    return isinstance(t, Tensor) and t.layout != torch.strided and t.device.type == DEVICE


# -- one sparse op, run over the CPU's kernels ------------------------------------------------------
class _Aliases:
    """The CPU tensors a sparse op runs on, each over the device memory of the neuron tensor
    it stands for, and the way back: which CPU result is which neuron tensor."""

    def __init__(self, rt: runtime.Runtime) -> None:
        self.rt = rt
        self.neuron_of: dict[int, Tensor] = {}  # id(CPU alias) -> its neuron tensor
        self.keep: list[Tensor] = []  # (the aliases, alive while ids are looked up)
        self.memory: dict[int, tuple[Tensor, Tensor]] = {}  # storage ptr -> (alias, neuron)
        self.cpu_inputs: set[int] = set()  # storage pointers of the caller's CPU tensors
        self.nnz = 0
        self.row_elements = 1
        self.dense_bytes = 0
        self.coalesce = False
        self.itemsize = 4  # of the nonzeros' values

    # to the CPU
    def to_cpu(self, value: OpValue) -> OpValue:
        if not isinstance(value, Tensor):
            if isinstance(value, torch.device) and value.type == DEVICE:
                return torch.device("cpu")
            return value
        if value.device.type != DEVICE:
            if value.layout == torch.strided and value.untyped_storage().nbytes():
                self.cpu_inputs.add(value.untyped_storage().data_ptr())
            return value
        if value.layout == torch.strided:
            alias = self.dense(value)
            self.dense_bytes += value.numel() * value.element_size()
            return alias
        alias = self.sparse(value)
        self.nnz += value._nnz()
        self.row_elements = max(self.row_elements, _row_elements(value))
        self.coalesce |= value.layout == torch.sparse_coo and not value.is_coalesced()
        self.itemsize = value.element_size()
        return alias

    def dense(self, t: Tensor) -> Tensor:
        alias = self.rt.memory.host_alias(t)
        self._remember(alias, t)
        return alias

    def sparse(self, t: Tensor) -> Tensor:
        if t.layout == torch.sparse_coo:
            indices = self.dense(torch.ops.aten._indices.default.redispatch(SPARSE_CPU, t))
            values = self.dense(torch.ops.aten._values.default.redispatch(SPARSE_CPU, t))
            alias = torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default(
                t.sparse_dim(),
                t.dense_dim(),
                list(t.shape),
                indices,
                values,
                dtype=t.dtype,
                layout=torch.sparse_coo,
                device="cpu",
                is_coalesced=t.is_coalesced(),
            )
        else:
            compressed, plain = _compressed_parts(t)
            values = torch.ops.aten.values.default.redispatch(SPARSE_CSR_CPU, t)
            alias = torch.ops.aten._sparse_compressed_tensor_unsafe.default(
                self.dense(compressed),
                self.dense(plain),
                self.dense(values),
                list(t.shape),
                dtype=t.dtype,
                layout=t.layout,
                device="cpu",
            )
        self._remember(alias, t)
        return alias  # type: ignore[no-any-return]

    def _remember(self, alias: Tensor, t: Tensor) -> None:
        self.neuron_of[id(alias)] = t
        self.keep.append(alias)
        if alias.layout == torch.strided and alias.untyped_storage().nbytes():
            self.memory.setdefault(alias.untyped_storage().data_ptr(), (alias, t))

    # back to the device
    def to_neuron(self, value: OpValue) -> OpValue:
        if not isinstance(value, Tensor):
            return value
        known = self.neuron_of.get(id(value))
        if known is not None:
            return known  # (an argument, returned as it is: in-place ops, out=)
        if value.device.type != "cpu":
            return value
        if value.layout == torch.strided:
            return self.dense_result(value)
        if value.layout == torch.sparse_coo:
            self.nnz += value._nnz()
            return torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default(
                value.sparse_dim(),
                value.dense_dim(),
                list(value.shape),
                self.dense_result(value._indices()),
                self.dense_result(value._values()),
                dtype=value.dtype,
                layout=torch.sparse_coo,
                device=DEVICE,
                is_coalesced=value.is_coalesced(),
            )
        self.nnz += value._nnz()
        compressed, plain = _compressed_parts(value)
        return torch.ops.aten._sparse_compressed_tensor_unsafe.default(
            self.dense_result(compressed),
            self.dense_result(plain),
            self.dense_result(value.values()),
            list(value.shape),
            dtype=value.dtype,
            layout=value.layout,
            device=DEVICE,
        )

    def dense_result(self, r: Tensor) -> Tensor:
        """A CPU result as a neuron tensor: a view of the device memory it lies in, or new
        device memory (accounted in HBM) holding it."""
        if not r.untyped_storage().nbytes():
            return _empty_on_device(r)
        ptr = r.untyped_storage().data_ptr()
        same = self.memory.get(ptr)
        if same is not None and same[0].dtype == r.dtype:
            alias, t = same
            offset = t.storage_offset() + (r.data_ptr() - alias.data_ptr()) // r.element_size()
            return torch.as_strided(t, r.shape, r.stride(), offset)
        if ptr in self.cpu_inputs or same is not None:
            r = r.clone()  # (the caller's CPU memory, or device memory seen as another dtype)
        self.dense_bytes += r.numel() * r.element_size()
        block = self.rt.memory.allocate(r.untyped_storage().nbytes())
        return self.rt.memory.adopt(to_device(r), block, r)

    def write_back(self, args: list[OpValue], written: list[int]) -> None:
        """Sparse neuron arguments an in-place op wrote: the CPU's kernel may have given the
        CPU alias new parts; the neuron tensor takes them."""
        for i in written:
            t = args[i] if i < len(args) else None
            if t is None or not is_sparse_neuron(t):
                continue
            alias = next((a for a in self.keep if self.neuron_of.get(id(a)) is t), None)
            if alias is None:
                continue
            fresh = _Aliases(self.rt)
            fresh.memory, fresh.cpu_inputs = self.memory, self.cpu_inputs
            source = fresh.to_neuron(_detached_sparse(alias))
            # (the CPU's own copy kernels, which copy the parts on the device; copy_'s COO
            # kernel would dispatch copy_sparse_to_sparse_ back to this module)
            if t.layout == torch.sparse_coo:
                torch.ops.aten.copy_sparse_to_sparse_.default.redispatch(SPARSE_CPU, t, source)
            else:  # (compressed copy_ wants the same nnz: the parts are resized first)
                torch.ops.aten.resize_as_sparse_.default.redispatch(SPARSE_CSR_CPU, t, source)
                torch.ops.aten.copy_.default.redispatch(SPARSE_CSR_CPU, t, source)


def launch(op: Op, args: Args, kwargs: Kwargs) -> OpValue:
    """Runs one op on sparse neuron tensors (or one that makes them) as one launch."""
    rt = runtime.get()
    rt.flush("sparse")  # (recorded ops first: they may write what this op reads)
    rt.count("ops_dispatched")
    rt.count("sparse_ops")
    aliases = _Aliases(rt)
    cpu_args = [tree_map(aliases.to_cpu, a) for a in args]
    cpu_kwargs = {k: tree_map(aliases.to_cpu, v) for k, v in kwargs.items()}
    try:
        result = op(*cpu_args, **cpu_kwargs)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"{op._schema.name} is not supported for sparse {_layouts(args, kwargs)} tensors: "
            f"the CPU has no kernel for it either ({str(e).splitlines()[0][:160]}). Convert "
            f"with .to_dense() first, or use an op the CPU supports on this layout."
        ) from e
    aliases.write_back(list(args), _written(op))
    out = tree_map(aliases.to_neuron, result)
    cost = cost_model.sparse_op(
        rt.target,
        nnz=aliases.nnz,
        row_elements=aliases.row_elements,
        itemsize=aliases.itemsize,
        dense_bytes=aliases.dense_bytes,
        sort=aliases.coalesce or "coalesce" in op._schema.name,
    )
    rt.launch_priced(op._schema.name, int(cost.ns), cost.engine_ns, aliases.dense_bytes)
    return out


def _written(op: Op) -> list[int]:
    """Positions of the arguments the op writes (in-place, out=)."""
    return [
        i
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
    ]


def _row_elements(t: Tensor) -> int:
    """Elements per nonzero: the dense part of a hybrid COO tensor, a block of a BSR one."""
    if t.layout == torch.sparse_coo:
        values = torch.ops.aten._values.default.redispatch(SPARSE_CPU, t)
    else:
        values = torch.ops.aten.values.default.redispatch(SPARSE_CSR_CPU, t)
    n = max(1, values.shape[0]) if values.dim() else 1
    return max(1, int(values.numel()) // n)


def _compressed_parts(t: Tensor) -> tuple[Tensor, Tensor]:
    key = SPARSE_CSR_CPU if t.device.type == DEVICE else None
    names = (
        ("crow_indices", "col_indices")
        if t.layout in (torch.sparse_csr, torch.sparse_bsr)
        else ("ccol_indices", "row_indices")
    )
    ops = [getattr(torch.ops.aten, n).default for n in names]
    if key is None:
        return ops[0](t), ops[1](t)
    return ops[0].redispatch(key, t), ops[1].redispatch(key, t)


def _detached_sparse(t: Tensor) -> Tensor:
    return t.detach() if t.requires_grad else t


def _empty_on_device(r: Tensor) -> Tensor:
    return torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=DEVICE)


def _layouts(args: Args, kwargs: Kwargs) -> str:
    found = {
        str(a.layout).removeprefix("torch.")
        for a in [*args, *kwargs.values()]
        if isinstance(a, Tensor) and a.layout != torch.strided
    }
    return "/".join(sorted(found)) or "strided"


def register() -> list[torch.library.Library]:
    """The fallbacks of both sparse keys, and a direct kernel for every op the CPU has a
    sparse kernel for: on the CPU that kernel is chosen over an op's composite one (which
    would reach here decomposed, or refuse the layout), and so it is here (called by
    backend.register)."""
    fallbacks = torch.library.Library("_", "IMPL")
    fallbacks.fallback(coo_kernel, "SparsePrivateUse1")
    fallbacks.fallback(compressed_kernel, "SparseCsrPrivateUse1")
    direct = torch.library.Library("aten", "IMPL")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys = (
        ("SparseCPU", "SparsePrivateUse1", coo_kernel),
        ("SparseCsrCPU", "SparseCsrPrivateUse1", compressed_kernel),
    )
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        for cpu, ours, kernel in keys:
            if has(name, cpu) and not has(name, ours):
                base, _, overload = name[len("aten::") :].partition(".")
                op = getattr(getattr(torch.ops.aten, base), overload or "default")
                direct.impl(name[len("aten::") :], functools.partial(kernel, op), ours)
    return [fallbacks, direct]


__all__ = ["COMPRESSED", "STRUCTURE", "is_sparse_neuron", "launch", "register"]
