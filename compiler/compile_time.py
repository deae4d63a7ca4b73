"""Modelled compile time: what compiling this graph at this level costs on the real compiler,
as a deterministic function of the work the compiler does (instructions emitted, kernels
formed, schedules the search evaluated). Clocks charge it (client/runtime.py: the simulated
host waits for a compile it needs; adaptive graphs become usable when theirs ends) and
NEURON_SIM_COMPILE_SCALE burns it on a CPU (daemon workers, in-process compiles).

Calibration [E], against what is published (docs/chip.md, "Launches and the host":
minutes for typical graphs, up to an hour for large models; -O1 compiles fast, -O3 slowest):
- a fixed cost per compile (start-up, parsing, the graph passes, code generation and
  packaging of one NEFF): 50 ms, so that one per-op kernel (1 kernel, ~3 instructions)
  costs ~0.2 s: "tens to hundreds of milliseconds";
- per emitted instruction (tiling, allocation, scheduling, codegen): 20 ms; per kernel
  (loop fusion and tiling of its loop nest): 100 ms. A transformer model's fused training
  graph (the GPT example's: ~300 instructions, ~35-75 kernels) then costs tens of seconds;
- per whole schedule the search evaluates beyond the first: 4 ms per instruction (list
  scheduling and allocation again), so -O2 costs more than -O1 and -O3 more than -O2 on the
  same graph, for the reason the real compiler does: it tries more schedules.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time

# NEURON_SIM_COMPILE_SCALE's default: CPU seconds a compile burns per modelled second. 1/20:
# the GPT example's fused graph (~22 s modelled at -O2) keeps a CPU busy ~1.1 s, a per-op
# kernel ~10 ms; time to first step then shows the cost of compiling, in minutes not hours.
DEFAULT_SCALE = 0.05


def parse_scale(value: str) -> float:
    """A NEURON_SIM_COMPILE_SCALE value ("": the default); ValueError for anything but a
    factor >= 0. (The client and the daemon both read the variable, each in its config.)"""
    if not value.strip():
        return DEFAULT_SCALE
    try:
        scale = float(value)
    except ValueError:
        scale = -1.0
    if not scale >= 0:  # (NaN too)
        raise ValueError(f"NEURON_SIM_COMPILE_SCALE={value!r}: expected a factor >= 0, e.g. 0.05")
    return scale


FIXED_S = 0.05
PER_INSTRUCTION_S = 0.02
PER_KERNEL_S = 0.1
PER_SEARCHED_INSTRUCTION_S = 0.004


def modelled_compile_seconds(instructions: int, kernels: int, schedules_searched: int) -> float:
    """Seconds the real compiler would take for this work (deterministic)."""
    return (
        FIXED_S
        + PER_INSTRUCTION_S * instructions
        + PER_KERNEL_S * kernels
        + PER_SEARCHED_INSTRUCTION_S * instructions * max(0, schedules_searched - 1)
    )


_BLOCK = bytes(1 << 20)


def burn(seconds: float, background: bool = False) -> None:
    """Keeps a CPU busy for `seconds` of CPU time (what a real compile costs the host,
    NEURON_SIM_COMPILE_SCALE x the modelled time). Hashing large blocks releases the GIL, so
    a compile on a background thread burns a CPU without stalling the others. A background
    compile (adaptive mode's fused graphs) burns at the lowest CPU priority, on a thread of
    its own (Linux niceness is per thread, and that thread ends with it): it takes what the
    training processes and the blocking compiles leave."""
    if seconds <= 0:
        return
    if not background:
        _spin(seconds)
        return

    def low() -> None:
        with contextlib.suppress(OSError):  # (no per-thread niceness here: normal priority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        _spin(seconds)

    thread = threading.Thread(target=low, name="compile-burn", daemon=True)
    thread.start()
    thread.join()


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        hashlib.sha256(_BLOCK).digest()
