"""Parameters and buffers shared between modules stay shared through Module._apply, and lazy
modules' uninitialized parameters stay uninitialized.

`Module._apply` (behind .to(), .cuda(), .half()...) swaps a converted parameter's data in
place only when PyTorch deems the old and new tensors shallow-copy compatible, which it
never does between CPU and a PrivateUse1 device. Otherwise each module slot gets a new
Parameter, so weights tied between two modules (input and output embeddings) come back as
two independent copies and training silently diverges. On CUDA the ties survive because
the data is swapped in place; here the slots that held one object before the conversion
are given one object after it (the first converted copy). No PyTorch flag changes: a
conversion that already kept the ties is left exactly as it was.

A parameter moved to or from neuron also stays the same Python object, as on CUDA: the
converted contents are swapped into it, so an optimizer built before `model.to("neuron")`
(or by accelerate before `prepare`) steps the parameters the model uses.

The same swap keeps a lazy module's UninitializedParameter (and UninitializedBuffer) what it
is on CUDA: converted, still uninitialized, materialised with its real shape on the first
forward. A new plain Parameter around the converted empty tensor would instead look
initialized with 0 elements, and the first forward would fail on its shape.

client/api/patches.py puts keep_ties in place of Module._apply.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

_state = threading.local()
Table = dict[str, Any]  # a module's _parameters or _buffers (values: Parameter, Tensor, None)
Slot = tuple[Table, str, torch.Tensor]  # (table, name, the tensor it held before)
Apply = Callable[..., torch.nn.Module]  # Module._apply(self, fn, recurse=True)


def _slots(module: torch.nn.Module) -> list[Slot]:
    """Every (table, name, tensor) of the module tree: parameters and buffers, one entry
    per module slot (a shared submodule's slots once)."""
    slots: list[Slot] = []
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            slots.extend((table, name, t) for name, t in table.items() if t is not None)
    return slots


def _retie(slots: list[Slot]) -> None:
    """Slots that held one tensor before the conversion get one tensor after it."""
    first: dict[int, torch.Tensor] = {}
    for table, name, before in slots:
        now = table.get(name)
        if now is None:
            continue
        kept = first.setdefault(id(before), now)  # (`before` is alive in slots: ids hold)
        if kept is not now and _same_kind(kept, now):
            table[name] = kept


def _keep_uninitialized(slots: list[Slot]) -> None:
    """A lazy module's uninitialized tensors, converted, are uninitialized ones again."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    for table, name, before in slots:
        now = table.get(name)
        if (
            now is None
            or now is before
            or not isinstance(before, UninitializedBuffer | UninitializedParameter)
        ):
            continue
        if isinstance(now, UninitializedBuffer | UninitializedParameter):
            continue
        kind = type(before)
        table[name] = kind(  # type: ignore[call-arg]  # (stubs omit the factory kwargs)
            requires_grad=before.requires_grad, device=now.device, dtype=now.dtype
        )


def _keep_identity(slots: list[Slot]) -> None:
    """A parameter converted to or from neuron stays the same Python object, as on CUDA
    (where its data is swapped in place): the converted tensor's contents are swapped into
    it (torch.utils.swap_tensors). An optimizer made before `model.to("neuron")`, or
    accelerate preparing one, then updates the parameters the model uses."""
    from torch.nn.parameter import UninitializedParameter

    kept: dict[int, torch.Tensor] = {}
    for table, name, before in slots:
        now = table.get(name)
        if (
            now is None
            or now is before
            or type(now) is not type(before)
            or not isinstance(before, torch.nn.Parameter)
            or isinstance(before, UninitializedParameter)
            or "neuron" not in (before.device.type, now.device.type)
        ):
            continue
        if id(before) not in kept:
            attributes = dict(before.__dict__)  # (swap_tensors swaps them too; CUDA keeps them)
            try:
                torch.utils.swap_tensors(before, now)
            except RuntimeError as e:  # (someone holds its autograd state): a new object
                warnings.warn(
                    f"trnsim: parameter {name!r} moved to {now.device} as a new object "
                    f"({e}); an optimizer built before the move still holds the old one: "
                    f"build it after .to()",
                    RuntimeWarning,
                    stacklevel=4,
                )
                continue
            before.__dict__.update(attributes)
            kept[id(before)] = before
        table[name] = kept[id(before)]


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
    return type(a) is type(b) and a.device == b.device and a.dtype == b.dtype


def keep_ties(real_apply: Apply) -> Apply:
    """Wraps Module._apply: the outermost call re-ties what the conversion untied."""

    def _apply(
        self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> torch.nn.Module:
        if getattr(_state, "inside", False) or not recurse:
            return real_apply(self, fn, recurse)
        slots = _slots(self)
        _state.inside = True
        try:
            result = real_apply(self, fn, recurse)
        finally:
            _state.inside = False
        _keep_uninitialized(slots)
        _keep_identity(slots)
        _retie(slots)
        return result

    _apply.__wrapped__ = real_apply  # type: ignore[attr-defined]
    return _apply
