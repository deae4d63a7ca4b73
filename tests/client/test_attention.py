"""scaled_dot_product_attention on neuron takes the backend the CPU takes, gradients included:
a float mask that requires gradients (BEiT's relative position bias) goes to math, where flash
attention would refuse it, in every mode, with the CPU's results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _inputs(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 17, 16, generator=g) for _ in range(3))
    bias = torch.randn(1, 4, 17, 17, generator=g)
    return [t.to(device).requires_grad_() for t in (q, k, v, bias)]


def _attention(q, k, v, bias):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _run(device: str, compiled: bool) -> list[torch.Tensor]:
    tensors = _inputs(device)
    fn = torch.compile(_attention, backend="neuron") if compiled else _attention
    out = fn(*tensors)
    out.square().sum().backward()
    return [t.detach().cpu() for t in [out, *(t.grad for t in tensors)]]


@pytest.mark.parametrize(
    ("mode", "compiled"), [("eager", False), ("adaptive", False), ("eager", True)]
)
def test_a_mask_that_requires_gradients_gets_them_as_on_the_cpu(mode: str, compiled: bool) -> None:
    torch.neuron.set_eager_mode(mode)
    try:
        got = _run("neuron", compiled)
        torch.neuron.synchronize()
    finally:
        torch.neuron.set_eager_mode("eager")
    expected = _run("cpu", False)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dmask"), got, expected, strict=True):
        torch.testing.assert_close(a, b, msg=name)
