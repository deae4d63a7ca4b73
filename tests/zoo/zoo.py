"""Trains every zoo model on CPU and on neuron in eager, adaptive and compiled mode, one
process per model.

    .venv/bin/python tests/zoo/zoo.py [NAME ...] [--jobs 2] [--timeout 300] [--json FILE]

With no NAME, the whole zoo runs. Each model runs in its own worker process (worker.py), jobs
at a time; a crash or a hang (--timeout) is that model's result. Prints a table: eager,
adaptive and compiled against CPU (pass/FAIL and the worst error / tolerance), adaptive ==
eager bit for bit (and the first differing step), what compiled mode was judged against (CPU
eager, or PyTorch's aot_eager backend on the CPU where that is itself out of tolerance of CPU
eager), then `N passed, M failed` (a model passes when eager passes against CPU). Exit status
0 when every model passes in all three modes, adaptive equals eager bit for bit and no tied
weight was untied; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from models import ZOO
from pool import JOBS, TIMEOUT_S, run_all
from table import table
from training import END

COLUMNS = (
    "model",
    "family",
    "params",
    "eager",
    "adaptive",
    "adaptive==eager",
    "compiled",
    "compiled vs",
    "seconds",
    "reason",
)


def vs_cpu_cell(verdict: dict[str, Any] | None) -> str:
    """'pass 3.1e-03' or 'FAIL 2.0e+01' (worst error / tolerance), 'FAIL error'; dead: 'FAIL'."""
    if verdict is None:
        return "FAIL"
    word = "pass" if verdict["passed"] else "FAIL"
    return f"{word} error" if verdict["error"] else f"{word} {verdict['worst_ratio']:.1e}"


def reference_cell(verdict: dict[str, Any] | None) -> str:
    """What compiled mode was judged against: 'cpu' (eager on the CPU) or 'aot_eager
    (cpu: 1.2e+00)' (PyTorch's aot_eager backend on the CPU, itself that far from CPU eager)."""
    if verdict is None:
        return "-"
    if verdict.get("reference") == "aot_eager":
        return f"aot_eager (cpu: {verdict['aot_eager_vs_cpu']:.1e})"
    return "cpu"


def step_name(step: int | None) -> str:
    """'step N', or 'end' for what is recorded after training."""
    return "end" if step == END else f"step {step}"


def bits_cell(bits: dict[str, Any] | None) -> str:
    """'yes', 'NO (step N)' or '-' (not compared)."""
    if bits is None or bits["equal"] is None:
        return "-"
    return "yes" if bits["equal"] else f"NO ({step_name(bits['first_step'])})"


def cpu_reason(mode: str, verdict: dict[str, Any]) -> str | None:
    """Why a mode failed against CPU: its error, or its worst tensor."""
    if verdict["passed"]:
        return None
    if verdict["error"]:
        return f"{mode}: {verdict['error']}"
    against = (
        f" (against {verdict['reference']})" if verdict.get("reference", "cpu") != "cpu" else ""
    )
    return (
        f"{mode}: {verdict['worst_tensor']} off by {verdict['worst_ratio']:.1e} x tolerance"
        f"{against}"
    )


def bits_reason(bits: dict[str, Any]) -> str | None:
    """Which tensors differ between adaptive and eager."""
    if bits["equal"] is not False or not bits["n_differing"]:
        return None
    more = bits["n_differing"] - len(bits["differing"])
    listed = ", ".join(bits["differing"]) + (f" (+{more})" if more else "")
    return f"adaptive != eager from {step_name(bits['first_step'])}: {listed}"


def reason(result: dict[str, Any]) -> str:
    """Every failure of one model, most telling first."""
    if "died" in result:
        last = result["stderr"].splitlines()[-1:] or ["no stderr"]
        return f"worker {result['died']}: {last[0]}"
    ties = {mode: n for mode, n in result["ties_lost"].items() if n}
    parts = [
        cpu_reason("eager", result["eager"]),
        cpu_reason("adaptive", result["adaptive"]),
        bits_reason(result["bits"]),
        cpu_reason("compiled", result["compiled"]),
        f"ties lost: {ties}" if ties else None,
    ]
    return "; ".join(p for p in parts if p)


def row(result: dict[str, Any]) -> list[str]:
    """The table cells of one model."""
    name = result["name"]
    return [
        name,
        ZOO[name].family,
        str(result.get("params", "-")),
        vs_cpu_cell(result.get("eager")),
        vs_cpu_cell(result.get("adaptive")),
        bits_cell(result.get("bits")),
        vs_cpu_cell(result.get("compiled")),
        reference_cell(result.get("compiled")),
        f"{result['seconds']:.1f}",
        reason(result),
    ]


def passed(result: dict[str, Any], mode: str) -> bool:
    """Whether the model passed against CPU in that mode."""
    return bool(result.get(mode, {}).get("passed"))


def bit_identical(result: dict[str, Any]) -> bool:
    """Whether adaptive equals eager bit for bit."""
    return bool(result.get("bits", {}).get("equal"))


def summary(results: list[dict[str, Any]], seconds: float) -> str:
    """`N passed, M failed` (eager against CPU), then adaptive's counts and the time."""
    n = len(results)
    eager = sum(passed(r, "eager") for r in results)
    adaptive = sum(passed(r, "adaptive") for r in results)
    same = sum(bit_identical(r) for r in results)
    compiled = sum(passed(r, "compiled") for r in results)
    against_aot = sum(
        passed(r, "compiled") and r["compiled"].get("reference") == "aot_eager" for r in results
    )
    return (
        f"{eager} passed, {n - eager} failed\n"
        f"adaptive: {adaptive} of {n} pass against CPU, {same} of {n} bit-identical to eager\n"
        f"compiled: {compiled} of {n} pass ({compiled - against_aot} against CPU eager, "
        f"{against_aot} against aot_eager on the CPU)\n"
        f"zoo: {n} models in {seconds:.0f} s"
    )


def all_good(result: dict[str, Any]) -> bool:
    """Eager, adaptive and compiled pass, adaptive equals eager, and no tie was lost."""
    ties = result.get("ties_lost", {"?": 1})
    modes = all(passed(result, mode) for mode in ("eager", "adaptive", "compiled"))
    return modes and bit_identical(result) and not any(ties.values())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """NAME ... (default: the whole zoo) and the options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(ZOO)}")
    parser.add_argument("--jobs", type=int, default=JOBS, help="workers at a time")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per model")
    parser.add_argument("--json", metavar="FILE", help="write every result as a JSON line")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    return args


def progress(result: dict[str, Any]) -> None:
    """One line on stderr as each model finishes."""
    print(f"{result['name']}: {result['seconds']:.1f} s", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the named models (default: all) and prints the table and the summary."""
    args = parse_args(argv)
    start = time.monotonic()
    results = run_all(args.names or list(ZOO), args.jobs, args.timeout, progress)
    print(table([row(r) for r in results], COLUMNS))
    print(summary(results, time.monotonic() - start))
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    return 0 if all(all_good(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
