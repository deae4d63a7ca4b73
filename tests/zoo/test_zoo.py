"""Real transformers models trained a few steps on neuron: adaptive mode equals eager mode
bit for bit (losses, final outputs, parameters and buffers), and eager is close to CPU.

A slice runs in `make test`; the whole zoo in `make test-slow`."""

from __future__ import annotations

import pytest
from compare import ZOO, compare, quiet_transformers
from generate import compare_generation, matches

FAST = ("llama", "gpt2", "t5", "resnet_eval", "mamba")
# Eager against CPU: the same ATen kernels, but SDPA and a few fused CPU kernels take
# other paths on a non-CPU device; 6 steps of SGD keep the difference at this order.
CPU_TOLERANCE = 1e-4


def _params(names):
    return [
        pytest.param(name, marks=() if name in FAST else pytest.mark.slow, id=name)
        for name in names
    ]


@pytest.mark.parametrize("name", _params(ZOO))
def test_adaptive_trains_like_eager(name):
    quiet_transformers()
    report = compare(name)
    assert not report.errors, report.errors
    assert report.adaptive_matches, (
        f"adaptive differs from eager from step {report.first_differing_step}: "
        f"{report.adaptive_vs_eager_max_diff}, state {report.differing_state}"
    )
    assert report.counters["fused_executions"] > 0, "fused graphs ran"
    worst = max(v for v in report.eager_vs_cpu.values() if v is not None)
    assert worst <= CPU_TOLERANCE, report.eager_vs_cpu


def test_generate_with_a_kv_cache_matches_eager():
    """Greedy and seeded sampling, three calls each, and cached forwards."""
    quiet_transformers()
    reports, runs = compare_generation()
    bad = [r for r in reports if not matches(r)]
    assert not bad, bad
    assert all(r.eager_vs_cpu.get("tokens", 0) == 0 for r in reports)
    assert runs["adaptive"].counters["fused_executions"] > 0
