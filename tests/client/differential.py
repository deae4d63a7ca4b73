"""Runs one program in eager and in adaptive mode, each on a fresh simulated core, and
compares everything it returns bit for bit: the harness of the differential tests."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from trnsim.client.core import env, runtime


def wait_for_fused_compiles(rt: runtime.Runtime, timeout_s: float = 60.0) -> None:
    """Until every background fused compile has come back (ready or failed)."""
    if rt.recorder is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(
        s.future is not None and not s.future.done() for s in rt.recorder.graphs.values()
    ):
        time.sleep(0.005)


@contextlib.contextmanager
def fresh_core(mode: str = "eager") -> Iterator[runtime.Runtime]:
    """A new simulated core (runtime) in `mode` for the block, as a new process gets: nothing
    an earlier run learnt of an op (its metadata checked on a real run, its executables)
    carries over. The process's own core is back after.

    Deterministic algorithms are on: new memory is filled with NaN (the largest integer), so
    memory read before it is written shows, instead of holding an earlier run's values."""
    saved = runtime._runtime
    rt = runtime._runtime = runtime.Runtime(replace(env.read(), eager_mode=mode))
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # (for the fill, not the checks)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")
    # Warned once per process by autograd (so in one mode only) when `p.data` is swapped for
    # a tensor of another layout: not something the program observes.
    warnings.filterwarnings("ignore", message=".*do not obey the gradient layout contract")
    try:
        yield rt
        rt.flush("sync")
    finally:
        caught.__exit__(None, None, None)
        torch.use_deterministic_algorithms(deterministic)
        rt.close()
        runtime._runtime = saved


def run_in_mode(
    mode: str, program: Callable[[], Any], repeats: int = 4, seed: int = 0
) -> tuple[list[Any], dict[str, int]]:
    """program() `repeats` times on a fresh core in `mode` (fresh_core), its results moved to
    the CPU after each repetition (a sync point), and the core's counters at the end.
    Repetitions let adaptive mode run its graphs op by op first and fused once their
    compiles are in."""
    with fresh_core(mode) as rt:
        torch.manual_seed(seed)
        results = []
        for _ in range(repeats):
            results.append(to_cpu(program()))
            wait_for_fused_compiles(rt)
        rt.flush("sync")
        return results, dict(rt.metrics.counts)


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type == "neuron" else value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [to_cpu(v) for v in value]
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def same_bits(a: Any, b: Any) -> bool:
    """Equal values, dtypes, shapes and bits (NaN payloads included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
            return False
        if a.layout != torch.strided:  # (sparse: the same values where they are)
            return torch.equal(_bits(a.to_dense()), _bits(b.to_dense()))
        return torch.equal(_bits(a), _bits(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=t.dtype)  # standard strides, whatever t's are
    flat.copy_(t.resolve_conj().resolve_neg().reshape(-1))
    if t.dtype == torch.bool or t.numel() == 0:
        return flat
    return flat.view(torch.uint8)


def first_difference(a: list[Any], b: list[Any]) -> int | None:
    """The first repetition whose results differ, or None."""
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if not same_bits(x, y):
            return k
    return None


def assert_modes_agree(program: Callable[[], Any], repeats: int = 4) -> dict[str, int]:
    """Eager and adaptive mode give bit-identical results on every repetition; returns the
    adaptive core's counters."""
    eager, _ = run_in_mode("eager", program, repeats)
    adaptive, counts = run_in_mode("adaptive", program, repeats)
    k = first_difference(eager, adaptive)
    assert k is None, f"repetition {k}: eager {eager[k]!r} != adaptive {adaptive[k]!r}"
    return counts
