"""The neuron runtime as the zoo uses it: in-process compiles, counters, background compiles."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import MutableMapping

import torch

COMPILE_TIMEOUT_S = 60.0
# Adaptive-mode counters reported as deltas over the adaptive run.
ADAPTIVE_COUNTERS = (
    "fused_executions",
    "op_by_op_graphs",
    "fused_ops",
    "op_by_op_ops",
    "graphs_formed",
    "fused_compiles_requested",
    "fused_compiles_ready",
    "fused_compiles_failed",
)


def use_in_process_compiles(env: MutableMapping[str, str] = os.environ) -> None:
    """NEURON_COMPILE_DAEMON=off unless the caller chose otherwise (before the runtime starts)."""
    env.setdefault("NEURON_COMPILE_DAEMON", "off")


def wait_for_fused_compiles(timeout_s: float = COMPILE_TIMEOUT_S) -> bool:
    """Waits until no background fused compile is pending; False on timeout."""
    from trnsim.client.core import runtime

    recorder = runtime.get().recorder
    if recorder is None:
        return True
    deadline = time.monotonic() + timeout_s
    while any(s.future is not None and not s.future.done() for s in recorder.graphs.values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def neuron_counters() -> dict[str, int]:
    """torch.neuron.metrics() (flushes what adaptive mode recorded)."""
    return dict(torch.neuron.metrics())


def counter_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The adaptive counters' growth between two snapshots."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in ADAPTIVE_COUNTERS}


def fresh_runtime() -> None:
    """Drops this process's neuron runtime (caches, recorded graphs); the next use starts anew."""
    from trnsim.client.core import runtime

    old, runtime._runtime = runtime._runtime, None
    if old is not None:
        # Its recorded work may fail again here: that was reported where it failed first.
        with contextlib.suppress(Exception):
            old.close()


def first_line(error: BaseException) -> str:
    """The exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def recover_runtime() -> str | None:
    """After an exception: run what was recorded; a fresh runtime if that fails too."""
    try:
        torch.neuron.synchronize()
        return None
    except Exception as e:  # noqa: BLE001  (the recorded ops cannot run: start over)
        fresh_runtime()
        return f"synchronize after the error failed too ({first_line(e)}); runtime replaced"


def quiet_transformers() -> None:
    """Only transformers' errors (its config warnings are noise here)."""
    import transformers

    transformers.logging.set_verbosity_error()
