"""The neuron device is registered by `import torch` (entry point); tests use it directly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture
def metrics_delta():
    """Returns a function giving counters since the fixture was created."""
    torch.neuron.synchronize()
    before = torch.neuron.metrics()

    def delta() -> dict[str, int]:
        now = torch.neuron.metrics()
        return {k: now[k] - before.get(k, 0) for k in now}

    return delta
