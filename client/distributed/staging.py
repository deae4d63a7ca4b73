"""Host staging: a collective's device tensors as CPU tensors over their memory, for gloo."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from trnsim.client.core import runtime
from trnsim.client.distributed.errors import CollectiveError

Tensor = torch.Tensor
NAME = "neuron"  # the c10d backend's name, and the device type of the tensors it stages


class Staged:
    """CPU tensors over the given tensors' memory; a non-contiguous one goes through a
    contiguous copy that is written back after the collective (back())."""

    def __init__(self) -> None:
        self._back: list[tuple[Tensor, Tensor]] = []
        self.device = False

    def host(self, t: Tensor, write: bool = True, any_order: bool = False) -> Tensor:
        """t's memory as a CPU tensor gloo can take. any_order: the collective is
        elementwise (all-reduce, broadcast), so a dense tensor of another layout (a
        transposed view) goes as its memory, in memory order, as gloo takes it on CPU."""
        if t.device.type == NAME:
            self.device = True
            if not runtime.get().numerics:  # shape-only mode: priced, no data moves
                return torch.empty(0, dtype=t.dtype)
            h = runtime.get().memory.host_alias(t)
        elif t.device.type == "cpu":
            h = t
        else:
            raise CollectiveError(
                f"the neuron process group takes neuron and CPU tensors, not {t.device.type}"
            )
        if h.is_complex():
            h = torch.view_as_real(h)
        if h.is_contiguous():
            return h
        if any_order and dense(h):
            return h.as_strided((h.numel(),), (1,), h.storage_offset())
        c = h.contiguous()
        if write:
            self._back.append((h, c))
        return c

    def back(self) -> None:
        for h, c in self._back:
            h.copy_(c)


@dataclasses.dataclass(frozen=True)
class Staging:
    """A collective's tensors staged: what gloo reads, what it writes, and their copies."""

    reads: list[Tensor]
    writes: list[Tensor]
    staged: Staged

    @property
    def device(self) -> bool:
        """Whether any of the tensors is on the device (else gloo alone runs it)."""
        return self.staged.device


def stage(
    what: str,
    reads: Sequence[Tensor],
    writes: Sequence[Tensor],
    any_order: bool = False,
    check: bool = True,
) -> Staging:
    """Stages the tensors a collective reads and those it writes (in place: `writes` only,
    read too). `any_order`: see Staged.host. `check`: every tensor on one device."""
    if check:
        check_same_device([*reads, *writes], what)
    staged = Staged()
    host_reads = [staged.host(t, write=False) for t in reads]
    host_writes = [staged.host(t, any_order=any_order) for t in writes]
    return Staging(host_reads, host_writes, staged)


def dense(t: Tensor) -> bool:
    """Whether t's elements fill a block of memory with no gaps or overlaps, in some order
    of its dimensions (a permutation of a contiguous tensor)."""
    expected = 1
    for stride, size in sorted(
        (st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def check_same_device(tensors: Sequence[Tensor], what: str) -> None:
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:
        raise CollectiveError(
            f"{what}: all tensors must be on one device (got {sorted(kinds)}); move them "
            f"with .to('neuron') first"
        )


def nbytes(tensors: Sequence[Tensor]) -> int:
    """The bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def on_device(t: Tensor) -> bool:
    return t.device.type == NAME


def storage_ptr(t: Tensor) -> int:
    return int(t.untyped_storage().data_ptr())
