"""The differential fuzzer: random programs (tests/client/programs.py) give bit-identical
observable results in eager and adaptive mode, on every repetition (the later ones run
fused executables). A bounded, derandomised run in `make test`; a large one in
`make test-slow` (`--hypothesis-show-statistics` prints how many programs ran)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.client.differential import first_difference, run_in_mode
from tests.client.programs import Instruction, programs, run_program

REPEATS = 4  # first sight, op by op (the fused compile is asked for), fused, fused
_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}

# Programs the fuzzer found, shrunk: each showed a bug, now fixed.
FOUND: dict[str, list[Instruction]] = {
    # A 3-D linear's mm output, aliased beneath the dispatcher and saved by silu for backward,
    # was judged internal when .item() cut the graph before the backward.
    "alias_saved_for_backward": [
        *[("unary", 0, 0, 0)] * 8,
        ("layer", 0, 0, 8),
        ("autograd", 0, 0, 0),
    ],
    # `p.data = u` between two recorded reads of p: the second read named p's old memory
    # (tables keyed by the tensor, not by what it points at).
    "data_swap_between_reads": [
        *[("unary", 0, 0, 0)] * 4,
        ("reduce", 0, 0, 0),
        ("storage", 0, 0, 20),
    ],
    # `p.data = p.t()`: the same memory seen transposed, which a check of the data pointer
    # alone took for the tensor the buffer had already read.
    "data_swap_to_its_own_transpose": [
        ("unary", 0, 0, 0),
        ("view", 7, 1, 0),
        ("storage", 0, 3, 50),
    ],
    # A tensor grown by out= (a new allocation, flat) given to `p.data`, then p given another
    # storage: the buffer's DLPack alias of p held p's TensorImpl, not the memory, which was
    # freed before the recorded read ran (garbage values in adaptive mode).
    "data_swap_away_from_a_grown_out": [
        *[("unary", 0, 0, 0)] * 2,
        ("out", 0, 0, 0),
        ("storage", 0, 0, 2),
        ("storage", 0, 0, 2),
    ],
}

# Programs that caught a deliberately broken runtime (mutation checks of the fuzzer itself).
GUARDS: dict[str, list[Instruction]] = {
    # CSE merging the same op before and after a write through a view.
    "twins_across_a_write": [("twins", 0, 0, 1)],
}


def check(program: list[Instruction]) -> dict[str, int]:
    eager, _ = run_in_mode("eager", lambda: run_program(program, "neuron"), REPEATS)
    adaptive, counts = run_in_mode("adaptive", lambda: run_program(program, "neuron"), REPEATS)
    k = first_difference(eager, adaptive)
    assert k is None, f"repetition {k} differs (0: first sight, {REPEATS - 1}: fused)"
    return counts


@pytest.mark.parametrize("name", [*FOUND, *GUARDS])
def test_programs_the_fuzzer_found(name):
    counts = check({**FOUND, **GUARDS}[name])
    assert counts["fused_executions"] + counts["op_by_op_graphs"] > 0


@settings(max_examples=300, derandomize=True, database=None, **_SETTINGS)
@given(programs)
def test_random_programs_equal_in_eager_and_adaptive_mode(program):
    check(program)


@pytest.mark.slow
@settings(max_examples=4000, **_SETTINGS)
@given(programs)
def test_many_random_programs_equal_in_eager_and_adaptive_mode(program):
    check(program)
