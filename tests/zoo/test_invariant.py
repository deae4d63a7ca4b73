"""Shape-only mode is faithful: with numerics off a training step has the same simulated
time, launches, executables, HBM peak and traffic as with numerics on, in every mode (one
model here; the whole zoo: make zoo-invariant)."""

from __future__ import annotations

from invariant import check


def test_numerics_off_leaves_the_simulated_step_unchanged_in_every_mode() -> None:
    rows = check("llama")
    assert [r["verdict"] for r in rows] == ["same"] * 3, [(r["mode"], r["why"]) for r in rows]
