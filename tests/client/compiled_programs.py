"""Random programs for compiled mode's differential check: a program is a list of
instructions, each an opcode and three numbers, interpreted by a function that
torch.compile traces. Every instruction becomes a valid op on the values alive at that point
whatever their sizes, so one program runs at several sequence lengths (dynamic shapes) and
shrinks to a small readable one.

Values are (2, 4, L) signals (batch, channels, length) and the ops a real network puts on
them: convolutions with groups, strides, dilations and padding, transposed convolutions,
LayerNorm over channels of a transposed view (its backward's gradient lies in another layout
than the CPU gives it), GroupNorm and BatchNorm (running statistics: buffers written by the
graph), channel mixing by matmul, pooling and interpolation, softmax, cumsum and other
reductions, in-place ops on views of a clone, reshapes, concatenation, and graph breaks
(dynamo's own, and a branch on a value read with .item()).

A program's inputs and parameters come from a fixed generator, so they are the same on every
device; `run` trains it: forward, a loss, backward, at each length in turn, and returns the
outputs and every gradient and buffer of each call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.client.differential import fresh_core

Instruction = tuple[str, int, int, int]
CHANNELS = 4
MAX_VALUES = 6
UNARY: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.relu,
    F.gelu,
    torch.tanh,
    torch.sigmoid,
    torch.neg,
    torch.sin,
    F.silu,
]
BINARY: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = [
    torch.add,
    torch.mul,
    torch.sub,
]
GROUPS = (1, 2, 4)


@dataclass
class Parameters:
    """A program's parameters and buffers, the same values on every device."""

    tensors: dict[str, torch.Tensor]

    @classmethod
    def make(cls, device: str) -> Parameters:
        g = torch.Generator().manual_seed(4321)
        shapes: dict[str, tuple[int, ...]] = {
            "mix": (CHANNELS, CHANNELS),
            "norm_weight": (CHANNELS,),
            "norm_bias": (CHANNELS,),
            "bias": (CHANNELS,),
        }
        for groups in GROUPS:
            shapes[f"conv{groups}"] = (CHANNELS, CHANNELS // groups, 3)
            shapes[f"up{groups}"] = (CHANNELS, CHANNELS // groups, 2)
        tensors = {
            name: (torch.randn(shape, generator=g) * 0.5).to(device).requires_grad_()
            for name, shape in shapes.items()
        }
        tensors["running_mean"] = torch.zeros(CHANNELS, device=device)
        tensors["running_var"] = torch.ones(CHANNELS, device=device)
        return cls(tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


class Interpreter:
    """Runs a program on one input: every instruction appends a value (or replaces one)."""

    def __init__(self, program: Sequence[Instruction], p: Parameters) -> None:
        self.program = list(program)
        self.p = p

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values = [x]
        for op, a, b, c in self.program:
            out = OPS[op](self.p, values, a, b, c)
            if len(values) < MAX_VALUES:
                values.append(out)
            else:
                values[(a + b + c) % MAX_VALUES] = out
        return values[-1], values[len(values) // 2]


def _pick(values: list[torch.Tensor], n: int) -> torch.Tensor:
    return values[n % len(values)]


def _same_shape(values: list[torch.Tensor], t: torch.Tensor, n: int) -> torch.Tensor | None:
    candidates = [v for v in values if v.shape == t.shape]
    return candidates[n % len(candidates)] if candidates else None


def unary(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    return UNARY[b % len(UNARY)](_pick(values, a))


def binary(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    t = _pick(values, a)
    u = _same_shape(values, t, b)
    return BINARY[c % len(BINARY)](t, u if u is not None else t.flip(-1))


def mix(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """Channel mixing: a matmul over the channels of a transposed view, back again."""
    t = _pick(values, a)
    y = t.transpose(1, 2) @ p["mix"]
    if c % 2:
        y = y + p["bias"]
    return y.transpose(1, 2)


def layer_norm(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """LayerNorm over the channels of a transposed view (wav2vec2's and canine's layout)."""
    t = _pick(values, a).transpose(1, 2)
    y = F.layer_norm(t, (CHANNELS,), p["norm_weight"], p["norm_bias"] if b % 2 else None)
    return y.transpose(1, 2) if c % 2 else y.transpose(1, 2).contiguous()


def group_norm(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    return F.group_norm(_pick(values, a), GROUPS[b % 3], p["norm_weight"], p["norm_bias"])


def batch_norm(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """Training-mode BatchNorm: its running statistics are buffers the graph writes."""
    return F.batch_norm(
        _pick(values, a),
        p["running_mean"],
        p["running_var"],
        p["norm_weight"],
        p["norm_bias"],
        training=True,
        momentum=0.1,
    )


def conv(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """A 1-d convolution: groups, stride, dilation and padding from the numbers; the length
    it leaves is at least one."""
    t = _pick(values, a)
    groups = GROUPS[b % 3]
    stride, dilation, padding = 1 + c % 2, 1 + (c // 2) % 2, (c // 4) % 3
    length = t.shape[-1]
    if length + 2 * padding - dilation * 2 - 1 < 0:
        padding = dilation  # (keeps the length: kernel 3 reaches dilation to each side)
        stride = 1
    bias = p["bias"] if b % 2 else None
    return F.conv1d(t, p[f"conv{groups}"], bias, stride, padding, dilation, groups)


def conv_transpose(
    p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int
) -> torch.Tensor:
    """A strided transposed convolution: the length doubles (canine's upsampling)."""
    t = _pick(values, a)
    groups = GROUPS[b % 3]
    if t.shape[-1] > 24:
        return F.avg_pool1d(t, 2)
    return F.conv_transpose1d(t, p[f"up{groups}"], None, stride=2, groups=groups)


def in_place_on_view(
    p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int
) -> torch.Tensor:
    """A clone written through a view of it: a transpose, every other step, a narrowed half."""
    y = _pick(values, a).clone()
    kind = b % 3
    if kind == 0:
        view = y.transpose(1, 2)
    elif kind == 1:
        view = y[:, :, ::2]
    else:
        view = y.narrow(1, 1, 2)
    if c % 3 == 0:
        view.mul_(0.5)
    elif c % 3 == 1:
        view.add_(1.0)
    else:
        view.relu_()
    return y


def reshape(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    t = _pick(values, a)
    kind = b % 3
    if kind == 0:
        return t.reshape(t.shape[0], -1).reshape(t.shape) * 1.5
    if kind == 1:
        return t.permute(0, 2, 1).contiguous().permute(0, 2, 1) + 0.25
    return t.flatten(1).unflatten(1, (CHANNELS, -1)).exp2()


def reduce(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    t = _pick(values, a)
    kind = b % 5
    if kind == 0:
        return t - t.mean(dim=-1, keepdim=True)
    if kind == 1:
        return torch.softmax(t, dim=1 + c % 2)
    if kind == 2:
        return torch.cumsum(t, dim=-1) * 0.1
    if kind == 3:
        return t * torch.logsumexp(t, dim=1, keepdim=True)
    return t / (t.norm(dim=1, keepdim=True) + 1.0)


def resample(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    t = _pick(values, a)
    kind = b % 4
    if kind == 0 and t.shape[-1] >= 2:
        return F.max_pool1d(t, 2)
    if kind == 1 and t.shape[-1] >= 2:
        return F.avg_pool1d(t, 2, ceil_mode=True)
    if kind == 2 and t.shape[-1] <= 24:
        return F.interpolate(t, scale_factor=2, mode="linear", align_corners=False)
    return F.interpolate(t, size=t.shape[-1] + 1, mode="nearest")


def cat(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    t, u = _pick(values, a), _pick(values, b)
    if t.shape[-1] + u.shape[-1] > 32:
        return t + 0.5
    return torch.cat([t, u], dim=-1)


def graph_break(p: Parameters, values: list[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """A break in dynamo's graph: its own marker, or a branch on a value read on the host."""
    t = _pick(values, a)
    if b % 2:
        torch._dynamo.graph_break()
        return t * 0.75
    if t.sum().item() > 0:
        return t - 1.0
    return t + 1.0


OPS: dict[str, Callable[[Parameters, list[torch.Tensor], int, int, int], torch.Tensor]] = {
    "unary": unary,
    "binary": binary,
    "mix": mix,
    "layer_norm": layer_norm,
    "group_norm": group_norm,
    "batch_norm": batch_norm,
    "conv": conv,
    "conv_transpose": conv_transpose,
    "in_place_on_view": in_place_on_view,
    "reshape": reshape,
    "reduce": reduce,
    "resample": resample,
    "cat": cat,
    "graph_break": graph_break,
}

_number = st.integers(0, 63)
instructions = st.tuples(st.sampled_from(sorted(OPS)), _number, _number, _number)


@dataclass(frozen=True)
class Program:
    """Instructions, the lengths of the calls, and whether dynamo treats sizes as dynamic."""

    instructions: tuple[Instruction, ...]
    lengths: tuple[int, ...]
    dynamic: bool

    def __repr__(self) -> str:
        body = ",\n    ".join(repr(i) for i in self.instructions)
        return f"Program((\n    {body},\n), lengths={self.lengths}, dynamic={self.dynamic})"


programs = st.builds(
    Program,
    st.lists(instructions, min_size=1, max_size=10).map(tuple),
    st.sampled_from([(8, 8), (8, 8, 11), (9, 12, 9)]),
    st.booleans(),
)


def run(program: Program, device: str, backend: str | None) -> list[Any]:
    """Trains the program once per length (forward, loss, backward) on `device`, compiled
    with `backend` (None: eagerly); per call, its outputs, every gradient and the buffers,
    moved to the CPU. On neuron, on a fresh core (nothing carries over from an earlier run)."""
    if device == "cpu":
        return _run(program, device, backend)
    with fresh_core():
        return _run(program, device, backend)


def _run(program: Program, device: str, backend: str | None) -> list[Any]:
    p = Parameters.make(device)
    fn: Callable[[torch.Tensor], Any] = Interpreter(program.instructions, p)
    if backend is not None:
        torch._dynamo.reset()  # (every program is new code to dynamo)
        fn = torch.compile(fn, backend=backend, dynamic=program.dynamic)
    g = torch.Generator().manual_seed(99)
    results: list[Any] = []
    for length in program.lengths:
        x = torch.randn(2, CHANNELS, length, generator=g).to(device).requires_grad_()
        for t in p.tensors.values():
            t.grad = None
        outputs = fn(x)
        loss = sum(o.square().mean() for o in outputs)
        loss.backward()
        grads = {name: t.grad for name, t in p.tensors.items() if t.grad is not None}
        buffers = {name: p[name] for name in ("running_mean", "running_var")}
        results.append(_cpu({"out": outputs, "x.grad": x.grad, **grads, **buffers}))
    return results


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cpu(v) for v in value]
    return value
