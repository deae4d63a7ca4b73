"""Meta kernels for ATen ops that have none in PyTorch but that the device runs
(simulator/kernels.py): recording in adaptive mode hands out outputs before anything runs,
so it needs their shapes. Registered only where PyTorch has no Meta kernel of its own."""

from __future__ import annotations

import torch

Tensor = torch.Tensor
_CONTIGUOUS = torch.contiguous_format


def gru_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    hx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    workspace = hx.new_empty((hx.shape[0], hx.shape[1] * 5))
    return torch.empty_like(hx, memory_format=_CONTIGUOUS), workspace


def gru_cell_backward(
    grad_hy: Tensor, workspace: Tensor, has_bias: bool
) -> tuple[Tensor | None, ...]:
    gates = (workspace.shape[0], workspace.shape[1] // 5 * 3)
    grad_input, grad_hidden = workspace.new_empty(gates), workspace.new_empty(gates)
    grad_hx = torch.empty_like(grad_hy, memory_format=_CONTIGUOUS)
    if not has_bias:
        return grad_input, grad_hidden, grad_hx, None, None
    return grad_input, grad_hidden, grad_hx, grad_input.sum(0), grad_hidden.sum(0)


KERNELS = {"_thnn_fused_gru_cell": gru_cell, "_thnn_fused_gru_cell_backward": gru_cell_backward}


def register() -> torch.library.Library:
    lib = torch.library.Library("aten", "IMPL")
    for name, kernel in KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, kernel, "Meta")
    return lib
