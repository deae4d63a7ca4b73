"""The functional collectives (DTensor, tensor parallel) on neuron tensors.

PyTorch's functional collectives call a group's all_gather_single and friends from C++,
which a Python group cannot override: kernels for neuron tensors call the group here
instead (all_reduce and broadcast reach the group's own methods from C++).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReduceScatterOptions
from trnsim.client.distributed.errors import CollectiveError
from trnsim.client.distributed.group import NeuronProcessGroup
from trnsim.client.distributed.reductions import functional_op
from trnsim.client.distributed.work import NeuronWork

Tensor = torch.Tensor
_state: dict[str, torch.library.Library] = {}


def register() -> None:
    """Kernels of the `_c10d_functional` ops for neuron tensors (kept alive in _state)."""
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for name, fn in KERNELS.items():
        lib.impl(name, fn, "PrivateUse1")
    _state["lib"] = lib


def _group(name: str) -> NeuronProcessGroup:
    pg = dist.distributed_c10d._resolve_process_group(name)  # type: ignore[arg-type]
    if not isinstance(pg, NeuronProcessGroup):
        raise CollectiveError(
            f"a functional collective on neuron tensors needs a neuron process group; "
            f"group {name!r} is {type(pg).__name__}. Use init_process_group('neuron')"
        )
    return pg


def _registered(out: Tensor, work: NeuronWork) -> Tensor:
    """out, with the work that writes it registered (wait_tensor(out) waits for it)."""
    torch._C._distributed_c10d._register_work(out, work)
    return out


def _rs_opts(reduce_op: str) -> ReduceScatterOptions:
    opts = ReduceScatterOptions()
    opts.reduceOp = functional_op(reduce_op)
    return opts


def all_gather_into_tensor(t: Tensor, group_size: int, group_name: str) -> Tensor:
    out = t.new_empty((t.shape[0] * group_size, *t.shape[1:]))
    return _registered(out, _group(group_name).all_gather_single(out, t.contiguous()))


def all_gather_into_tensor_out(
    t: Tensor, group_size: int, group_name: str, *, out: Tensor
) -> Tensor:
    return _registered(out, _group(group_name).all_gather_single(out, t.contiguous()))


def all_gather_into_tensor_coalesced(
    ts: list[Tensor], group_size: int, group_name: str
) -> list[Tensor]:
    return [all_gather_into_tensor(t, group_size, group_name) for t in ts]


def reduce_scatter_tensor(t: Tensor, reduce_op: str, group_size: int, group_name: str) -> Tensor:
    out = t.new_empty((t.shape[0] // group_size, *t.shape[1:]))
    pg = _group(group_name)
    return _registered(out, pg.reduce_scatter_single(out, t.contiguous(), _rs_opts(reduce_op)))


def reduce_scatter_tensor_out(
    t: Tensor, reduce_op: str, group_size: int, group_name: str, *, out: Tensor
) -> Tensor:
    pg = _group(group_name)
    return _registered(out, pg.reduce_scatter_single(out, t.contiguous(), _rs_opts(reduce_op)))


def reduce_scatter_tensor_coalesced(
    ts: list[Tensor], reduce_op: str, group_size: int, group_name: str
) -> list[Tensor]:
    return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in ts]


def all_to_all_single(
    t: Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group_name: str
) -> Tensor:
    rows = sum(output_split_sizes) if output_split_sizes else t.shape[0]
    out = t.new_empty((rows, *t.shape[1:]))
    pg = _group(group_name)
    work = pg.all_to_all_single(out, t.contiguous(), output_split_sizes, input_split_sizes)
    return _registered(out, work)


# The _c10d_functional ops given a neuron kernel, by name.
KERNELS: dict[str, Callable[..., Tensor | list[Tensor]]] = {
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "all_to_all_single": all_to_all_single,
}
