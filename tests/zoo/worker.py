"""Runs one zoo model on CPU and in neuron eager, adaptive and compiled mode (and, where compiled
mode is not within tolerance of CPU eager, PyTorch's aot_eager backend on the CPU); prints one
JSON line.

    .venv/bin/python tests/zoo/worker.py NAME

In this one process the same initial model (deep copies) trains in each mode in turn; then
eager and adaptive are judged against CPU, and adaptive against eager bit for bit. The JSON
line is the verdict (see result()); the exit status is 0 whatever the verdict, so that only a
crash makes it non-zero.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from models import ZOO
from neuron_helpers import quiet_transformers, use_in_process_compiles
from training import AOT_EAGER, MODES, Record, run_mode
from verdict import against_cpu, bits, compiled_verdict


def result(name: str, params: int, runs: dict[str, Record]) -> dict[str, Any]:
    """The verdict on one model, with what explains it (errors, counters, losses, timings)."""
    cpu, eager, adaptive, compiled = (runs[mode] for mode in MODES)
    return {
        "name": name,
        "family": ZOO[name].family,
        "params": params,
        "eager": against_cpu(eager, cpu),
        "adaptive": against_cpu(adaptive, cpu),
        "compiled": compiled_verdict(compiled, cpu, runs.get(AOT_EAGER)),
        "bits": bits(adaptive, eager),
        "ties_lost": {mode: run.ties_lost for mode, run in runs.items()},
        "counters": adaptive.counters,
        "compile_timeouts": adaptive.compile_timeouts,
        "seconds": {mode: round(run.seconds, 2) for mode, run in runs.items()},
        "losses": {mode: run.losses() for mode, run in runs.items()},
        "tracebacks": {mode: run.trace for mode, run in runs.items() if run.trace},
    }


def evaluate(name: str) -> dict[str, Any]:
    """Builds the model and batch, runs every mode in turn and judges the runs."""
    case = ZOO[name]
    initial = case.build_model()
    params = sum(p.numel() for p in initial.parameters())
    batch = case.build_batch()
    runs = {mode: run_mode(case, initial, batch, mode) for mode in MODES}
    if not against_cpu(runs["compiled"], runs["cpu"])["passed"] and not runs["compiled"].error:
        # Before compiled mode's difference is called PyTorch's own: PyTorch's compiled graphs
        # on the CPU, the reference it is then judged against if they differ from eager too.
        runs[AOT_EAGER] = run_mode(case, initial, batch, AOT_EAGER)
    return result(name, params, runs)


def main(argv: Sequence[str]) -> int:
    """Prints the verdict on the named model as one JSON line."""
    if len(argv) != 1 or argv[0] not in ZOO:
        print(f"usage: worker.py NAME, one of {', '.join(ZOO)}", file=sys.stderr)
        return 2
    use_in_process_compiles()
    quiet_transformers()
    start = time.perf_counter()
    verdict = evaluate(argv[0])
    verdict["worker_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(verdict), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
