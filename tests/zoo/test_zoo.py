"""Zoo models trained 6 steps on CPU and on neuron in eager, adaptive and compiled mode, each in
its own worker process: every mode is close to CPU, adaptive equals eager bit for bit.

A representative slice runs in `make test`; the whole zoo in `make test-slow`."""

from __future__ import annotations

from typing import Any

import pytest
from generate import compare_generation, matches
from models import ZOO
from neuron_helpers import quiet_transformers
from pool import run_worker

# One of each kind, together well under a minute: a padded GQA decoder, tied embeddings, an
# encoder with an MLM head, an encoder-decoder, BatchNorm in training, a packed GRU.
FAST = ("llama", "gpt2", "bert", "t5", "resnet_train", "gru")


def _params(names: list[str]) -> list[Any]:
    """One pytest param per model; those outside FAST are marked slow."""
    return [
        pytest.param(name, marks=() if name in FAST else pytest.mark.slow, id=name)
        for name in names
    ]


@pytest.mark.parametrize("name", _params(list(ZOO)))
def test_model_trains_alike_in_every_mode(name: str) -> None:
    """Eager, adaptive and compiled pass against CPU (compiled: or against aot_eager on the
    CPU where that is itself out of tolerance of CPU eager); adaptive == eager; ties kept;
    fused graphs ran."""
    result = run_worker(name)
    assert "died" not in result, f"{result['died']}\n{result['stderr']}"
    for mode in ("eager", "adaptive", "compiled"):
        assert result[mode]["passed"], (mode, result[mode], result["tracebacks"].get(mode))
    assert result["bits"]["equal"], result["bits"]
    assert not any(result["ties_lost"].values()), result["ties_lost"]
    assert result["counters"]["fused_executions"] > 0, result["counters"]


def test_generate_with_a_kv_cache_matches_eager() -> None:
    """Greedy and seeded sampling, three calls each, and cached forwards."""
    quiet_transformers()
    reports, runs = compare_generation()
    bad = [r for r in reports if not matches(r)]
    assert not bad, bad
    assert all(r.eager_vs_cpu.get("tokens", 0) == 0 for r in reports)
    assert runs["adaptive"].counters["fused_executions"] > 0
