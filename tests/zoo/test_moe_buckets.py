"""MoE models in eager mode: once their routing's sizes run in shape buckets, a step compiles
nothing (client/door/buckets.py); compiles_per_step.py prints the same per step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pool import last_json, worker_env

SCRIPT = Path(__file__).resolve().parent / "compiles_per_step.py"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral", "mixtral_loop"])
def test_an_moe_model_in_eager_mode_compiles_nothing_after_its_third_step(name: str) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), name, "--steps", "6"],
        check=False,  # (its stderr says why, below)
        capture_output=True,
        text=True,
        env=worker_env(name),
        timeout=600,
    )
    result = last_json(run.stdout)
    assert result is not None, run.stderr[-2000:]
    later = result["steps"][3:]
    assert [r["compiled"] for r in later] == [0, 0, 0], result["steps"]
    assert sum(r["bucketed"] for r in later) > 0, "the routing's sizes changed: buckets ran"
