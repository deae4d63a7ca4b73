"""Collecting a model's tensors, and comparing two of them: within tolerance, or bit for bit."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

# Tolerance of a device tensor against its CPU reference, relative to the reference's largest
# magnitude (not element by element: small elements pick up the rounding of the large ones
# they were reduced with). The device runs float32 with other reduction orders and fused
# kernels (SDPA...), a few ulps (1.2e-7) per op; through a few layers, a backward and 6 SGD
# steps that grows to 1e-6..1e-5 of a tensor's scale, so RTOL = 1e-4 leaves a margin of 10
# while a wrong kernel (an error of order 1) fails by orders of magnitude.
RTOL = 1e-4
# The smallest scale a tensor is judged against: FLOOR_FRACTION of the largest tensor of its
# kind (outputs, gradients, parameters). A gradient that is zero up to rounding (a key
# projection's bias, which softmax ignores: opt, vit, clip) holds only the rounding noise of
# the large terms that cancelled in it, on the CPU as on the device; measured against its own
# near-zero scale, that noise looked like an error 100 times the tolerance.
FLOOR_FRACTION = 1e-3
FLOOR = 1e-12  # (and never below this: a kind that is all zero)
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MAX_DEPTH = 8


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU copy."""
    return t.detach().to("cpu", copy=True).contiguous()


def _is_transformers_object(value: Any) -> bool:
    """An object of transformers (a KV cache...) whose attributes may hold output tensors."""
    module = type(value).__module__
    return module.startswith("transformers.") and not isinstance(value, nn.Module)


def _children(value: Any) -> list[tuple[str, Any]]:
    """The named parts of a mapping, sequence, or transformers object; nothing otherwise."""
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [(str(i), v) for i, v in enumerate(value)]
    if _is_transformers_object(value) and hasattr(value, "__dict__"):
        return [(k, v) for k, v in vars(value).items() if not k.startswith("_")]
    return []


def floating_tensors(value: Any, prefix: str, depth: int = 0) -> dict[str, torch.Tensor]:
    """Every floating tensor in a model output (nested outputs, tuples, caches), by path."""
    if isinstance(value, torch.Tensor):
        return {prefix: value} if value.is_floating_point() else {}
    found: dict[str, torch.Tensor] = {}
    if depth < _MAX_DEPTH:
        for name, child in _children(value):
            found.update(floating_tensors(child, f"{prefix}.{name}", depth + 1))
    return found


def distinct_parameters(model: nn.Module) -> int:
    """How many distinct Parameter objects the model holds (tied weights count once)."""
    return len({id(p) for _, p in model.named_parameters(remove_duplicate=False)})


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b|; NaN in both places (or the same infinity) counts 0, NaN in one inf."""
    if a.shape != b.shape:
        return math.inf
    x, y = a.detach().double(), b.detach().double()
    if not torch.equal(x.isnan(), y.isnan()):
        return math.inf
    equal = (x == y) | x.isnan()
    diff = torch.where(equal, torch.zeros_like(x), (x - y).abs())
    return float(diff.max()) if diff.numel() else 0.0


def magnitude(t: torch.Tensor) -> float:
    """The largest finite |element| (0 for none)."""
    finite = t.detach().double()
    finite = finite[finite.isfinite()].abs()
    return float(finite.max()) if finite.numel() else 0.0


def error_ratio(got: torch.Tensor, ref: torch.Tensor, floor: float = FLOOR) -> float:
    """max|got - ref| / (RTOL * max(max|ref|, floor)): at most 1 within tolerance."""
    return max_abs_diff(got, ref) / (RTOL * max(magnitude(ref), floor, FLOOR))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (-0.0 is not 0.0), except that NaNs in the same places are equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    view = _INT_VIEW[a.element_size()]
    bits = a.contiguous().view(view) == b.contiguous().view(view)
    return bool((bits | (a.isnan() & b.isnan())).all())
