"""Real host time per training step on zoo models: CPU, neuron eager, adaptive and compiled.

    python benchmarks/host.py [--models llama,gpt2,...|all] [--steps 8] [--warmup 4]
    python benchmarks/host.py --profile adaptive --models llama [--steps 20]

What a user waits for, not what the chip would take: the zoo's models (tests/zoo, built from
small transformers configs and plain torch.nn) trained with SGD on their fixed batch, one step
at a time with the loss read back (a sync), in four modes: PyTorch on the CPU, neuron eager,
neuron adaptive (NEURON_EAGER=adaptive) and compiled (torch.compile(backend="neuron")). Every
mode is warmed up first (every executable compiled, adaptive graphs fused), then the modes take
turns step by step, so that the shared machine's load falls on all of them alike; the median
of each mode's steps is printed with the ratios eager/CPU, adaptive/eager and compiled/eager.

--python-door adds eager mode with the C++ door stepping aside (every op through the Python
door, client/door/fast.py) as one more alternated mode, and the ratio of the two eagers.

--profile MODE runs only that mode's warm steps under cProfile and prints where the host time
goes, by part of trnsim (the table in docs/ARCHITECTURE.md, "Where the host time goes").

Needs the test extra (transformers). Compiles run in this process unless
NEURON_COMPILE_DAEMON says otherwise, and stay off the simulated clock.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NEURON_COMPILE_DAEMON", "off")
os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")

import torch
from trnsim.client.door import fast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "zoo"))
from modes import wait_for_fused_compiles  # (benchmarks/modes.py)

MODES = ("cpu", "eager", "adaptive", "compiled")
# With --python-door: eager mode again with the C++ door stepping aside (client/door/fast.py).
PYTHON_DOOR = "python door"
DEFAULT_MODELS = ("llama", "gpt2", "bert", "t5", "vit", "mixtral")
Step = Callable[[], float]


def _set_mode(mode: str) -> None:
    if mode != "cpu":
        torch.neuron.set_eager_mode("adaptive" if mode == "adaptive" else "eager")


def stepper(case: Any, initial: torch.nn.Module, mode: str) -> Step:
    """One SGD step of a copy of the model in this mode; returns the loss (read back)."""
    device = "cpu" if mode == "cpu" else "neuron"
    _set_mode(mode)
    model = copy.deepcopy(initial).to(device)
    model.train(case.train_mode)
    batch = {
        k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.build_batch().items()
    }
    forward = torch.compile(model, backend="neuron") if mode == "compiled" else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> float:
        loss = forward(**batch)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())

    if mode == "python door":  # eager mode with every op through the Python door

        def python_door_step() -> float:
            with fast.python_door_only():
                return step()

        return python_door_step
    return step


# Counters that move while a mode still compiles or takes compiled graphs in.
SETTLING = (
    "executables_compiled",
    "executables_fetched",
    "fused_compiles_requested",
    "fused_compiles_ready",
    "compiled_graphs_ready",
)


def warm(steps: dict[str, Step], warmup: int, most: int = 20) -> None:
    """`warmup` steps of each mode, then more (up to `most` in all) until one step compiles
    nothing and takes no newly compiled graph in: a fused graph asked for late would
    otherwise load during the timed steps."""
    for mode, step in steps.items():
        _set_mode(mode)
        for n in range(most):
            before = torch.neuron.metrics() if mode != "cpu" else {}
            step()
            if mode == "adaptive":
                wait_for_fused_compiles()
            after = torch.neuron.metrics() if mode != "cpu" else {}
            if n + 1 >= warmup and all(after[k] == before[k] for k in before if k in SETTLING):
                break


def measure(name: str, modes: tuple[str, ...], n_steps: int, warmup: int) -> dict[str, float]:
    """Median real ms per step of each mode, the modes alternating step by step."""
    from models import ZOO

    case = ZOO[name]
    initial = case.build_model()
    # (a fresh dynamo per model: code shared with the models before, transformers' own
    # wrappers, would otherwise be recompiled with dynamic sizes)
    torch._dynamo.reset()
    steps = {mode: stepper(case, initial, mode) for mode in modes}
    warm(steps, warmup)
    compiled_before = torch.neuron.metrics()["executables_compiled"]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(n_steps):
        for mode, step in steps.items():
            _set_mode(mode)
            start = time.perf_counter()
            step()
            times[mode].append((time.perf_counter() - start) * 1e3)
    compiled = torch.neuron.metrics()["executables_compiled"] - compiled_before
    med = {mode: statistics.median(t) for mode, t in times.items()}
    if compiled:
        print(f"  ({name}: {compiled} executables compiled during the timed steps)")
    return med


def table(models: list[str], n_steps: int, warmup: int, python_door: bool = False) -> None:
    print(f"real ms per training step (median of {n_steps}, modes alternated), and ratios")
    print(
        f"{'model':<14} {'cpu':>8} {'eager':>8} {'adaptive':>9} {'compiled':>9}"
        f" {'eager/cpu':>10} {'adapt/eager':>12} {'comp/eager':>11}"
        + (f" {'py door':>8} {'eager/py door':>14}" if python_door else "")
    )
    ratios: dict[str, list[float]] = {"eager/cpu": [], "adaptive/eager": [], "compiled/eager": []}
    for name in models:
        m = measure(name, MODES + ((PYTHON_DOOR,) if python_door else ()), n_steps, warmup)
        r = (m["eager"] / m["cpu"], m["adaptive"] / m["eager"], m["compiled"] / m["eager"])
        for key, value in zip(ratios, r, strict=True):
            ratios[key].append(value)
        print(
            f"{name:<14} {m['cpu']:>8.2f} {m['eager']:>8.2f} {m['adaptive']:>9.2f}"
            f" {m['compiled']:>9.2f} {r[0]:>10.2f} {r[1]:>12.2f} {r[2]:>11.2f}"
            + (
                f" {m[PYTHON_DOOR]:>8.2f} {m['eager'] / m[PYTHON_DOOR]:>14.2f}"
                if python_door
                else ""
            ),
            flush=True,
        )
    print(
        "worst: "
        + ", ".join(f"{key} {max(values):.2f}" for key, values in ratios.items())
        + "; median: "
        + ", ".join(f"{key} {statistics.median(values):.2f}" for key, values in ratios.items())
    )


# -- where the time goes ---------------------------------------------------------------------------
# A function's own time is charged to the first part whose pattern its file:function matches.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("signature and dispatch (door)", ("client/door/", "client/api/backend.py")),
    ("recording (tape, cuts, guards)", ("client/modes/tape.py", "client/modes/recording.py",
                                        "client/modes/adaptive.py", "policy/")),
    ("compiled regions", ("client/modes/compiled.py", "client/modes/region.py")),
    ("eager run (outputs, memory)", ("client/modes/eager.py", "client/core/memory.py",
                                     "client/core/device_memory.py", "simulator/memory.py")),
    ("executing numerics (executor)", ("simulator/execute.py", "simulator/kernels.py")),
    ("launch accounting (timeline)", ("client/core/runtime.py", "simulator/device.py",
                                      "simulator/cost_model.py", "simulator/trace.py",
                                      "client/core/profiler.py", "client/core/metrics.py")),
    ("metadata (Meta kernels, op layer)", ("client/core/ops.py", "client/core/layouts.py",
                                           "client/core/", "compiler/")),
    ("torch: ATen kernels and autograd", ("{built-in method", "{method", "torch/")),
    ("Python and the model's code", ("",)),
)  # fmt: skip


def _part(file: str, function: str) -> str:
    where = f"{file}:{function}"
    for part, patterns in PARTS:
        if any(p in where for p in patterns):
            return part
    return PARTS[-1][0]


def profile(name: str, mode: str, n_steps: int, warmup: int) -> None:
    from models import ZOO

    case = ZOO[name]
    step = stepper(case, case.build_model(), mode)
    warm({mode: step}, warmup)
    _set_mode(mode)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    # (the backward pass on the calling thread: cProfile sees one thread, and the autograd
    # engine would run a device's backward ops on a thread of its own)
    with torch.autograd.set_multithreading_enabled(False):
        profiler.enable()
        for _ in range(n_steps):
            step()
        profiler.disable()
    wall = (time.perf_counter() - start) / n_steps * 1e3
    stats = pstats.Stats(profiler)
    by_part: dict[str, float] = {}
    for (file, _, function), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        part = _part(file, function)
        by_part[part] = by_part.get(part, 0.0) + own
    total = sum(by_part.values())
    print(f"{name}, {mode}: {wall:.1f} ms per step under cProfile (its overhead included)")
    print(f"{'part':<36} {'ms/step':>8} {'share':>6}")
    for part, _ in PARTS:
        own = by_part.get(part, 0.0)
        print(f"{part:<36} {own / n_steps * 1e3:>8.2f} {own / total:>6.1%}")
    if os.environ.get("HOST_PROFILE_TOP"):
        stats.sort_stats("tottime").print_stats(int(os.environ["HOST_PROFILE_TOP"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Real host ms per training step on zoo models, CPU and the neuron modes."
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated zoo names (tests/zoo/hf_models.py, nn_models.py), or 'all' "
        f"(default: {','.join(DEFAULT_MODELS)})",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per mode (default 8)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="untimed steps per mode first, at least (default 4; more, up to 20, until a "
        "step compiles nothing and takes no newly compiled graph in)",
    )
    parser.add_argument(
        "--python-door",
        action="store_true",
        help="also time eager mode with every op through the Python door (the C++ door "
        "stepping aside), alternated with the others: the column 'py door'",
    )
    parser.add_argument(
        "--profile",
        choices=MODES,
        help="profile one mode's warm steps instead, by part of trnsim "
        "(HOST_PROFILE_TOP=N also prints the N costliest functions)",
    )
    args = parser.parse_args()
    from models import ZOO

    models = list(ZOO) if args.models == "all" else args.models.split(",")
    unknown = [m for m in models if m not in ZOO]
    if unknown:
        parser.error(f"unknown zoo models {unknown}; choose among {', '.join(ZOO)}")
    if args.profile:
        for name in models:
            profile(name, args.profile, args.steps, args.warmup)
        return
    table(models, args.steps, args.warmup, args.python_door)


if __name__ == "__main__":
    main()
