"""nn.LSTM / nn.GRU and their cells on the device: ATen runs the fused cells it calls for
every non-CPU device (simulator/kernels.py); results and gradients match the CPU's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from tests.client.differential import assert_modes_agree


def _run(model, x, device, packed_lengths=None):
    model = copy.deepcopy(model).to(device)
    x = x.detach().to(device).requires_grad_()
    if packed_lengths is not None:
        out, _ = model(pack_padded_sequence(x, packed_lengths, enforce_sorted=False))
        out, _ = pad_packed_sequence(out)
    else:
        out, _ = model(x)
    out.square().sum().backward()
    grads = [p.grad.cpu() for p in model.parameters()]
    return out.detach().cpu(), x.grad.cpu(), grads


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_recurrent_layers_match_cpu(cls, packed):
    torch.manual_seed(0)
    model = cls(6, 8, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 6)
    lengths = torch.tensor([5, 3, 2]) if packed else None
    expected = _run(model, x.clone(), "cpu", lengths)
    got = _run(model, x, "neuron", lengths)
    for e, g in zip(expected[:2] + tuple(expected[2]), got[:2] + tuple(got[2]), strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_cells_without_bias_match_cpu_and_agree_across_modes(cls):
    torch.manual_seed(1)
    cell = cls(4, 5, bias=False)
    x = torch.randn(3, 4)
    expected = cell(x)
    on_device = copy.deepcopy(cell).to("neuron")
    got = on_device(x.to("neuron"))
    for e, g in zip(
        expected if isinstance(expected, tuple) else (expected,),
        got if isinstance(got, tuple) else (got,),
        strict=True,
    ):
        torch.testing.assert_close(g.detach().cpu(), e.detach(), rtol=1e-5, atol=1e-6)

    def program():
        on_device.zero_grad()
        out = on_device(x.to("neuron"))
        h = out[0] if isinstance(out, tuple) else out
        h.sum().backward()
        return [h, *[p.grad for p in on_device.parameters()]]

    assert_modes_agree(program)
