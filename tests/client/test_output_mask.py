"""A backward op whose output_mask leaves an output out (BatchNorm's input gradient when only its
weight and bias need one: a first layer normalising its input, CLAP's audio front-end) returns
no tensor there, as the CPU kernel does, though the Meta kernel makes one: every mode trains it
and gives the CPU's gradients."""

from __future__ import annotations

import pytest
import torch

from tests.client.differential import run_in_mode


def _normalise(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, 1, generator=g).to(device)  # (no gradient wanted for the input)
    norm = torch.nn.BatchNorm2d(4).to(device)
    layer = torch.nn.LayerNorm(1).to(device)
    out = layer(norm(x)) * torch.arange(6.0, device=device).view(1, 1, 6, 1)
    out.square().sum().backward()
    grads = [norm.weight.grad, norm.bias.grad, layer.weight.grad, layer.bias.grad]
    assert all(grad is not None for grad in grads)
    return [out.detach().cpu(), *(grad.cpu() for grad in grads if grad is not None)]


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_an_output_the_mask_leaves_out_is_not_made(mode: str) -> None:
    runs, _counts = run_in_mode(mode, lambda: _normalise("neuron"), repeats=3)
    for got in runs:  # (adaptive mode: op by op first, then recorded)
        for a, b in zip(got, _normalise("cpu"), strict=True):
            torch.testing.assert_close(a, b)
