"""A zoo entry: a named, seeded model builder, its batch, and the family it stands for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from batches import Batch
from torch import nn

MODEL_SEED = 1234
FAMILIES = (
    "decoder",
    "encoder",
    "encoder-decoder",
    "vision",
    "speech",
    "ssm",
    "moe",
    "multimodal",
    "rnn",
    "nn",
)


@dataclass(frozen=True)
class Case:
    """One zoo entry; model(**batch) returns a mapping with a "loss" (and other outputs)."""

    name: str
    family: str
    build_model: Callable[[], nn.Module]
    build_batch: Callable[[], Batch]
    train_mode: bool = True  # False: the training steps run with model.eval() (e.g. BatchNorm)

    def __post_init__(self) -> None:
        """Checks the family label."""
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown family {self.family!r}")


def seeded(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """build, with its weights drawn after torch.manual_seed(MODEL_SEED)."""

    def build_seeded() -> nn.Module:
        """The model built after the seed."""
        torch.manual_seed(MODEL_SEED)
        return build()

    return build_seeded
