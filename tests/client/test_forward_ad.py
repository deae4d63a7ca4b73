"""Forward-mode AD on neuron, in every mode: dual tensors, torch.func.jvp, jacfwd, hessian
(forward over reverse) and linearize equal the CPU's. (Every OpInfo op's forward-mode
derivative: `python tests/conformance.py --forward-ad`.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fw
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 3))


def _loss(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() * x.exp()).sum() + (x @ x.t()).logsumexp(0).sum()


def _dual(x: torch.Tensor, t: torch.Tensor) -> Any:
    with fw.dual_level():
        out = fw.unpack_dual(torch.nn.functional.gelu(fw.make_dual(x, t)) * 3)
        return out.primal, out.tangent


def _jvp_of_a_module(x: torch.Tensor, t: torch.Tensor) -> Any:
    model = _model().to(x.device)
    params = dict(model.named_parameters())
    return torch.func.jvp(lambda a: torch.func.functional_call(model, params, (a,)), (x,), (t,))


CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "dual_tensors": _dual,
    "jvp": lambda x, t: torch.func.jvp(lambda a: a.sin() * 2, (x,), (t,)),
    "jvp_of_a_module": _jvp_of_a_module,
    "jacfwd": lambda x, t: torch.func.jacfwd(lambda a: (a * a.cos()).sum(1))(x),
    "hessian": lambda x, t: torch.func.hessian(_loss)(x),
    "linearize": lambda x, t: torch.func.linearize(lambda a: a.tanh() * a, x)[1](t),
    "jvp_of_grad": lambda x, t: torch.func.jvp(torch.func.grad(_loss), (x,), (t,)),
}


# Where torch.compile itself fails, with PyTorch's own backends on the CPU too (and leaves
# functorch's interpreter stack behind for later compiles in the process).
NOT_UNDER_COMPILE = {
    "jvp_of_a_module": (
        "dynamo's fake-tensor run of layer_norm on a jvp's dual tensor hits an internal assert "
        "(_fw_primal), with torch.compile(backend='eager') on the CPU too"
    ),
}


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return [_cpu(v) for v in value]


# PyTorch's own: linearize's constant folding, and its jvp decompositions' first import.
@pytest.mark.filterwarnings("ignore:Attempted to insert a get_attr Node")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", ["eager", "adaptive", "compiled"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_mode_ad_equals_the_cpu(name: str, mode: str) -> None:
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    fn = CASES[name]
    expected = _cpu(fn(x, t))
    if mode == "compiled" and name in NOT_UNDER_COMPILE:
        pytest.skip(NOT_UNDER_COMPILE[name])
    if mode == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="neuron")
    torch.neuron.set_eager_mode("adaptive" if mode == "adaptive" else "eager")
    try:
        got = [_cpu(fn(x.to("neuron"), t.to("neuron"))) for _ in range(2)]
    finally:
        torch.neuron.set_eager_mode("eager")
    for run in got:
        torch.testing.assert_close(run, expected, rtol=1e-5, atol=1e-6)
