"""Judging a model's three runs: eager and adaptive against CPU within tolerance, and adaptive
against eager bit for bit. Verdicts are plain dicts, ready for JSON."""

from __future__ import annotations

import math
from typing import Any

from tensors import FLOOR_FRACTION, error_ratio, magnitude, same_bits
from training import Record

MAX_LISTED = 5  # differing tensors named in a verdict


def _names(a: Record, b: Record, common: bool) -> list[str]:
    """The tensors of both runs in recording order: all of them, or only those both have."""
    if common:
        return [n for n in a.tensors if n in b.tensors]
    return list(dict.fromkeys([*a.tensors, *b.tensors]))


def _kind(name: str) -> str:
    """What a recorded tensor is ("grad", "param", "out"...): the part before the slash."""
    return name.split("/", 1)[0]


def _floors(ref: Record) -> dict[str, float]:
    """Per kind of tensor, FLOOR_FRACTION of the largest of that kind in the reference."""
    largest: dict[str, float] = {}
    for name, t in ref.tensors.items():
        largest[_kind(name)] = max(largest.get(_kind(name), 0.0), magnitude(t))
    return {kind: FLOOR_FRACTION * m for kind, m in largest.items()}


def _ratio(got: Record, ref: Record, name: str, floors: dict[str, float]) -> float:
    """The error ratio of one tensor; inf when one run lacks it."""
    if name not in got.tensors or name not in ref.tensors:
        return math.inf
    return error_ratio(got.tensors[name], ref.tensors[name], floors.get(_kind(name), 0.0))


def _error(got: Record, ref: Record) -> str | None:
    """The run's own error, else that of the CPU reference."""
    return got.error or (f"cpu run: {ref.error}" if ref.error else None)


def against_cpu(got: Record, cpu: Record) -> dict[str, Any]:
    """passed, the worst error ratio (error / tolerance) and its tensor, and any error."""
    # A failed run is compared on what it recorded before it failed; its error fails it.
    error = _error(got, cpu)
    floors = _floors(cpu)
    ratios = {name: _ratio(got, cpu, name, floors) for name in _names(got, cpu, error is not None)}
    worst = max(ratios, key=lambda name: ratios[name], default=None)
    ratio = ratios[worst] if worst is not None else 0.0
    return {
        "passed": error is None and ratio <= 1.0,
        "worst_ratio": ratio,
        "worst_tensor": worst,
        "tensors": len(ratios),
        "error": error,
    }


def compiled_verdict(compiled: Record, cpu: Record, aot_eager: Record | None) -> dict[str, Any]:
    """Compiled mode against CPU eager; where it is not within tolerance of it, against
    PyTorch's aot_eager backend on the CPU, if aot_eager is not within tolerance of CPU eager
    either (then the difference is PyTorch's own compiled graphs'). `reference` names the
    run it was judged against."""
    verdict = against_cpu(compiled, cpu) | {"reference": "cpu"}
    if verdict["passed"] or aot_eager is None or aot_eager.error:
        return verdict
    own = against_cpu(aot_eager, cpu)
    if own["passed"]:
        return verdict  # PyTorch's compiled graphs are as close as eager: so must ours be
    return against_cpu(compiled, aot_eager) | {
        "reference": "aot_eager",
        "aot_eager_vs_cpu": own["worst_ratio"],
    }


def _differs(name: str, a: Record, b: Record) -> bool:
    """True when one run lacks the tensor or their bits differ."""
    if name not in a.tensors or name not in b.tensors:
        return True
    return not same_bits(a.tensors[name], b.tensors[name])


def bits(adaptive: Record, eager: Record) -> dict[str, Any]:
    """equal (None when both runs failed), the first differing step and the tensors that differ."""
    both_failed = bool(adaptive.error) and bool(eager.error)
    names = _names(eager, adaptive, common=both_failed)
    differing = [name for name in names if _differs(name, adaptive, eager)]
    steps = [eager.steps.get(name, adaptive.steps.get(name, 0)) for name in differing]
    one_failed = bool(adaptive.error) != bool(eager.error)
    return {
        "equal": None if both_failed else not (differing or one_failed),
        "first_step": min(steps, default=None),
        "differing": differing[:MAX_LISTED],
        "n_differing": len(differing),
        "tensors": len(names),
    }
