"""A custom kernel on the simulated chip: a fused RMSNorm, written as a torch.library custom
op with a declared cost, used in a small Llama-style MLP block, in every mode.

    python examples/custom_kernel.py [--profile trace.json]

PyTorch's RMSNorm is six ops (pow, mean, add, rsqrt, mul, mul): six launches in eager mode,
six HBM round trips. The custom op is one: one pass over its input on the Vector engine,
priced by its cost function (elements / lanes per cycle, plus the first tile's DMA). The
script trains the block with each norm in eager, adaptive and compiled mode (the losses
agree), then times a warm forward without gradients: launches and simulated time, and
prints its profile, where the kernel is one instruction on the Vector engine. (The
kernel's backward here is PyTorch's ops, recomputing the norm: a custom backward kernel
would be registered the same way.)
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")  # steady state

import torch
from torch import nn

VECTOR_LANES = 128  # elements the Vector engine takes per cycle (one per partition)


@torch.library.custom_op("examples::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The kernel's numerics (run by the simulator on the tensors' memory)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
    eps = ctx.eps  # type: ignore[attr-defined]
    with torch.enable_grad():  # the backward through PyTorch's ops (not fused here)
        x_ = x.detach().requires_grad_()
        w_ = weight.detach().requires_grad_()
        y = x_ * torch.rsqrt(x_.pow(2).mean(-1, keepdim=True) + eps) * w_
        gx, gw = torch.autograd.grad(y, (x_, w_), grad)
    return gx, gw, None


def _setup(ctx: object, inputs: tuple[torch.Tensor, torch.Tensor, float], output: object) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)  # type: ignore[attr-defined]
    ctx.eps = eps  # type: ignore[attr-defined]


rms_norm.register_autograd(_backward, setup_context=_setup)


def rms_norm_cost(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.neuron.KernelCost:
    """One pass on the Vector engine at 0.96 GHz: a square-and-sum and a scale per element."""
    cycles = 2 * x.numel() / VECTOR_LANES
    return torch.neuron.KernelCost(
        engine="vector",
        ns=cycles / 0.96,
        flops=4 * x.numel(),
        hbm_bytes=2 * x.numel() * x.element_size() + weight.numel() * weight.element_size(),
    )


torch.neuron.register_kernel(rms_norm, cost=rms_norm_cost)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, fused: bool, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.fused, self.eps = fused, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return rms_norm(x, self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, fused: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, fused)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def run(model: nn.Module, mode: str, steps: int = 6) -> tuple[list[float], int, float, Any]:
    """Trains `steps` SGD steps (the losses), then times and profiles one warm forward
    without gradients (launches, simulated microseconds, the profile): the norm's own share
    shows there."""
    compiled = mode == "compiled"
    torch.neuron.set_eager_mode("adaptive" if mode == "adaptive" else "eager")
    model = model.to("neuron")
    forward = torch.compile(model, backend="neuron") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=g).to("neuron")
    losses = []
    for _ in range(steps):
        loss = forward(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        for _ in range(3):  # first sight, compile, warm
            forward(x)
        torch.neuron.synchronize()
        before = torch.neuron.metrics()
        with torch.neuron.profile() as prof:
            forward(x)
        torch.neuron.synchronize()
        after = torch.neuron.metrics()
    torch.neuron.set_eager_mode("eager")
    launches = after["launches"] - before["launches"]
    return losses, launches, (after["wall_ns"] - before["wall_ns"]) / 1e3, prof


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", help="write the compiled forward's trace here (Chrome JSON)")
    args = p.parse_args()
    torch.manual_seed(0)
    base = Block(256, fused=False)
    print(f"{'norm':<10} {'mode':<9} {'forward launches':>17} {'forward us':>11}  training losses")
    results, profiles = {}, {}
    for fused in (False, True):
        for mode in ("eager", "adaptive", "compiled"):
            model = copy.deepcopy(base)
            model.norm.fused = fused
            losses, launches, wall, profiles[fused, mode] = run(model, mode)
            results[fused, mode] = losses
            name = "fused" if fused else "pytorch"
            print(
                f"{name:<10} {mode:<9} {launches:>17} {wall:>11.1f}  {[round(v, 5) for v in losses]}"
            )
    ref = results[False, "eager"]
    worst = max(
        abs(a - b) / max(abs(b), 1e-12)
        for losses in results.values()
        for a, b in zip(losses, ref, strict=True)
    )
    print(f"largest relative loss difference from PyTorch's RMSNorm in eager mode: {worst:.1e}")
    for mode in ("eager", "compiled"):  # the kernel in the profile: one instruction, its line
        print(f"\nprofile of the fused block's warm forward, {mode} mode:")
        print(profiles[True, mode].summary(top=6))
    if args.profile:
        prof = profiles[True, "compiled"]
        prof.path = Path(args.profile)
        print(f"\ntrace of the compiled forward: {prof.write()} (ui.perfetto.dev)")


if __name__ == "__main__":
    main()
