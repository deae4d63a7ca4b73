"""Custom kernels: a torch.library.custom_op with a neuron kernel and a declared cost is one
node in eager, adaptive and compiled mode, computes what the op computes on CPU, and takes
the time it declares."""

from __future__ import annotations

import pytest
import torch
from trnsim.client.core import runtime

NS_PER_ELEMENT = 0.25


@torch.library.custom_op("trnsim_test::scaled_rms_norm", mutates_args=())
def scaled_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@scaled_rms_norm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _cost(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.neuron.KernelCost:
    return torch.neuron.KernelCost(
        "vector", ns=x.numel() * NS_PER_ELEMENT, hbm_bytes=2 * x.nbytes + w.nbytes
    )


torch.neuron.register_kernel(scaled_rms_norm, cost=_cost)


def _delta(before: dict[str, int], key: str) -> int:
    return torch.neuron.metrics()[key] - before[key]


def test_one_launch_in_eager_mode_with_the_declared_time() -> None:
    x, w = torch.randn(8, 512), torch.randn(512)
    expected = scaled_rms_norm(x, w, 1e-6)
    dx, dw = x.to("neuron"), w.to("neuron")
    before = torch.neuron.metrics()
    y = scaled_rms_norm(dx, dw, 1e-6)
    assert _delta(before, "launches") == 1
    assert _delta(before, "vector_busy_ns") == int(x.numel() * NS_PER_ELEMENT)
    assert torch.equal(y.cpu(), expected)


def test_recorded_as_one_node_in_adaptive_mode() -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    expected = (scaled_rms_norm(x, w, 1e-5) * 2).sum()
    dx, dw = x.to("neuron"), w.to("neuron")
    torch.neuron.set_eager_mode("adaptive")
    try:
        (scaled_rms_norm(dx, dw, 1e-5) * 2).sum()  # first sight of each op: on its own
        before = torch.neuron.metrics()
        got = (scaled_rms_norm(dx, dw, 1e-5) * 2).sum()
        assert _delta(before, "ops_recorded") == 3
        assert torch.equal(got.cpu(), expected)
    finally:
        torch.neuron.set_eager_mode("eager")


def test_one_node_of_a_compiled_region() -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    f = torch.compile(lambda a, b: scaled_rms_norm(a, b, 1e-5) + 1, backend="neuron")
    dx, dw = x.to("neuron"), w.to("neuron")
    for _ in range(3):
        assert torch.equal(f(dx, dw).cpu(), scaled_rms_norm(x, w, 1e-5) + 1)
    before = torch.neuron.metrics()
    f(dx, dw)
    assert _delta(before, "launches") == 1


def test_a_cost_function_returning_nonsense_is_refused() -> None:
    @torch.library.custom_op("trnsim_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch.neuron.register_kernel(twice, cost=lambda x: 7)
    with pytest.raises(ValueError, match="must return torch.neuron.KernelCost"):
        twice(torch.ones(3, device="neuron"))
    with pytest.raises(TypeError, match="custom_op"):
        torch.neuron.register_kernel(lambda x: x, cost=_cost)
    assert runtime.get() is not None
