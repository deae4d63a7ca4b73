"""Runs zoo workers as subprocesses, a few at a time; a crash or a hang is the model's result."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from neuron_helpers import use_in_process_compiles

WORKER = Path(__file__).resolve().parent / "worker.py"
TIMEOUT_S = 300.0
JOBS = 2  # the machine has 2 cores
STDERR_LINES = 5  # of a dead worker's stderr, in its result


def worker_env(name: str) -> dict[str, str]:
    """This environment, with in-process compiles unless the caller chose otherwise; op
    signatures recorded (NEURON_RECORD_SHAPES) are credited to the model."""
    env = dict(os.environ)
    use_in_process_compiles(env)
    env["NEURON_RECORD_SOURCE"] = name
    return env


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last line of stdout that is a JSON object, or None."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                return None
    return None


def died(name: str, reason: str, stderr: str) -> dict[str, Any]:
    """The result of a worker that printed no verdict: the reason and its stderr's last lines."""
    tail = stderr.strip().splitlines()[-STDERR_LINES:]
    return {"name": name, "died": reason, "stderr": "\n".join(tail)}


def exit_reason(code: int) -> str:
    """'exit code N', or the signal's name when a signal killed the worker."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def run_worker(
    name: str,
    timeout_s: float = TIMEOUT_S,
    command: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One model in its own process (default: the zoo's worker.py NAME, in worker_env): its
    verdict, or why the process gave none; with seconds."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(command) if command is not None else [sys.executable, str(WORKER), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else worker_env(name),
        start_new_session=True,  # its own process group: a hang is killed with its children
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        verdict = last_json(stdout) or died(name, exit_reason(proc.returncode), stderr)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        verdict = died(name, f"timed out after {timeout_s:.0f} s", stderr)
    verdict["seconds"] = round(time.monotonic() - start, 1)
    return verdict


def run_all(
    names: Sequence[str],
    jobs: int = JOBS,
    timeout_s: float = TIMEOUT_S,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every named model's result, in the order given; jobs workers at a time."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_worker, name, timeout_s) for name in names]
        for future in as_completed(futures):
            if on_done is not None:
                on_done(future.result())
    return [future.result() for future in futures]
