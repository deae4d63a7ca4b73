"""A complex Python number as an op argument (x * 1j, WavTokenizer's rotary embedding) is a
constant of the graph, as an int is: every mode gives the CPU's values and gradients, and the
shape registry records and replays it."""

from __future__ import annotations

import pytest
import torch
from trnsim.client.api import registry
from trnsim.client.core import shapes

from tests.client.differential import run_in_mode


def _rotate(x: torch.Tensor) -> torch.Tensor:
    z = x * 1j + x.roll(1, dims=-1)  # a real tensor times a complex number: complex64
    return torch.view_as_real(z * (0.5 - 2j)).square().sum(-1).sqrt()


def _run(device: str, compiled: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=g).to(device).requires_grad_()
    fn = torch.compile(_rotate, backend="neuron") if compiled else _rotate
    out = fn(x)
    out.sum().backward()
    assert x.grad is not None
    return [out.detach().cpu(), x.grad.cpu()]


@pytest.mark.parametrize(
    ("mode", "compiled"), [("eager", False), ("adaptive", False), ("eager", True)]
)
def test_a_complex_scalar_gives_the_cpus_values_and_gradients(mode: str, compiled: bool) -> None:
    runs, _counts = run_in_mode(mode, lambda: _run("neuron", compiled), repeats=3)
    for got in runs:  # (adaptive mode: op by op first, then recorded)
        for name, a, b in zip(("out", "grad"), got, _run("cpu", False), strict=True):
            torch.testing.assert_close(a, b, msg=name)


def test_the_registry_records_and_rebuilds_a_complex_scalar() -> None:
    encoded = shapes.encode(2 - 0.5j)
    assert encoded == {"complex": [2.0, -0.5]}
    assert registry._make(encoded, "neuron", 4, torch.Generator()) == 2 - 0.5j
    assert shapes.encode(complex(float("inf"), 1.0)) == {"complex": [{"float": "inf"}, 1.0]}
