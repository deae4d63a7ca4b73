"""Every zoo entry by name: transformers architectures and plain torch.nn models."""

from __future__ import annotations

from batches import VOCAB, Batch
from cases import FAMILIES, Case
from hf_models import hf_cases
from nn_models import nn_cases

__all__ = ["VOCAB", "ZOO", "Batch", "Case"]


def _by_family(cases: list[Case]) -> list[Case]:
    """The cases grouped by family, in the order of FAMILIES (stable within a family)."""
    return sorted(cases, key=lambda case: FAMILIES.index(case.family))


ZOO: dict[str, Case] = {case.name: case for case in _by_family(hf_cases() + nn_cases())}
