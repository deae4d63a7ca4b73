"""One training run of a zoo model in one mode (cpu, eager, adaptive or compiled), and what it
records.

The run trains a deep copy of the initial model STEPS steps of SGD on a fixed batch. Recorded,
as CPU copies: every step's loss; at step 0 (before the first optimizer step) every floating
tensor of the forward's output and every parameter's gradient; after training every parameter
and floating buffer, and every floating output of one more forward, in eval mode, no_grad.
"""

from __future__ import annotations

import copy
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from cases import Case
from neuron_helpers import (
    counter_deltas,
    first_line,
    fresh_runtime,
    neuron_counters,
    recover_runtime,
    wait_for_fused_compiles,
)
from tensors import distinct_parameters, floating_tensors, to_cpu
from torch import nn

STEPS = 6
END = STEPS  # the step of what is recorded after training
LR = 1e-3
MOMENTUM = 0.9
RUN_SEED = 0
MODES = ("cpu", "eager", "adaptive", "compiled")  # compiled: torch.compile(backend="neuron")
# torch.compile(backend="aot_eager") on the CPU: PyTorch's own AOTAutograd graphs, run eagerly.
# Compiled mode is judged against it where it is not within tolerance of CPU eager.
AOT_EAGER = "aot_eager"
BACKENDS = {"compiled": "neuron", "aot_eager": "aot_eager"}
ON_CPU = ("cpu", "aot_eager")
TRACEBACK_LINES = 16


@dataclass
class Record:
    """What one mode produced: named CPU tensors and the step of each, or where it failed."""

    mode: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # name -> step (END after training)
    phase: str = "setup"  # where the run is: setup, step N, final forward, synchronize
    error: str | None = None
    trace: str | None = None  # the last lines of the error's traceback
    seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)  # neuron modes: adaptive counters
    ties_lost: int = 0  # tied weights that model.to(device) untied
    n_steps: int = STEPS  # training steps (what is recorded after training is at this step)
    compile_timeouts: int = 0  # adaptive steps after which fused compiles were still pending

    def add(self, step: int, tensors: dict[str, torch.Tensor]) -> None:
        """Records CPU copies of tensors, all at one step."""
        for name, t in tensors.items():
            self.tensors[name] = to_cpu(t)
            self.steps[name] = step

    def losses(self) -> list[float]:
        """The loss of every step that finished."""
        return [
            float(self.tensors[f"loss/{s}"])
            for s in range(self.n_steps)
            if f"loss/{s}" in self.tensors
        ]


def seed_everything() -> None:
    """torch.manual_seed(RUN_SEED), and numpy's and random's seeds (wav2vec2 masks with numpy)."""
    torch.manual_seed(RUN_SEED)
    np.random.seed(RUN_SEED)
    random.seed(RUN_SEED)


def to_device(batch: dict[str, Any], device: str) -> dict[str, Any]:
    """The batch with its tensors on device (flags stay as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, by parameter name (parameters without one are left out)."""
    return {f"grad/{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}


def final_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and floating buffer (BatchNorm running statistics...)."""
    params = {f"param/{n}": p for n, p in model.named_parameters()}
    buffers = {f"buffer/{n}": b for n, b in model.named_buffers() if b.is_floating_point()}
    return params | buffers


def train(
    model: nn.Module, case: Case, batch: dict[str, Any], record: Record, forward: Any = None
) -> None:
    """record.n_steps steps of SGD with momentum on the same batch, recording as it goes;
    forward (default: the model) computes the outputs: compiled mode's torch.compile'd model."""
    model.train(case.train_mode)
    forward = model if forward is None else forward
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(record.n_steps):
        record.phase = f"step {step}"
        output = forward(**batch)
        opt.zero_grad(set_to_none=True)
        output["loss"].backward()
        record.add(step, {f"loss/{step}": output["loss"]})
        if step == 0:
            record.add(0, floating_tensors(output, "output"))
            record.add(0, gradients(model))
        opt.step()
        if record.mode == "adaptive" and not wait_for_fused_compiles():
            record.compile_timeouts += 1


def evaluate(model: nn.Module, batch: dict[str, Any], record: Record, forward: Any = None) -> None:
    """One more forward in eval mode without gradients; records its floating outputs."""
    record.phase = "final forward"
    model.eval()
    with torch.no_grad():
        output = (model if forward is None else forward)(**batch)
        record.add(record.n_steps, floating_tensors(output, "eval"))


def move(initial: nn.Module, device: str, record: Record) -> nn.Module:
    """A deep copy of initial on device; counts the ties that the move lost."""
    model = copy.deepcopy(initial)
    before = distinct_parameters(model)
    model = model.to(device)
    record.ties_lost = distinct_parameters(model) - before
    return model


def run_steps(case: Case, initial: nn.Module, batch: dict[str, Any], record: Record) -> None:
    """Seeds, moves, trains, evaluates and records the final state; raises what they raise."""
    device = "cpu" if record.mode in ON_CPU else "neuron"
    if device == "neuron":
        torch.neuron.set_eager_mode("eager" if record.mode == "compiled" else record.mode)
    seed_everything()
    model = move(initial, device, record)
    inputs = to_device(batch, device)
    backend = BACKENDS.get(record.mode)
    if record.mode == AOT_EAGER:  # (numpy.random as compiled mode sets it: wav2vec2's masks)
        torch._dynamo.config.use_numpy_random_stream = True
    if backend is not None:
        # Dynamo's caches start empty, as in a new process: the modes before this one compiled
        # the same code objects, and past its recompile limit Dynamo runs a frame uncompiled
        # (aot_eager then left None where torch.compile's graphs give zero gradients).
        torch._dynamo.reset()
    forward = model if backend is None else torch.compile(model, backend=backend)
    train(model, case, inputs, record, forward)
    evaluate(model, inputs, record, forward)
    record.add(record.n_steps, final_state(model))
    record.phase = "synchronize"
    if device == "neuron":
        torch.neuron.synchronize()


def fail(record: Record, error: Exception) -> None:
    """Notes the error, its traceback's last lines and, on neuron, the runtime's recovery."""
    record.error = f"{record.phase}: {first_line(error)}"
    lines = traceback.format_exc().strip().splitlines()
    record.trace = "\n".join(lines[-TRACEBACK_LINES:])
    if record.mode not in ON_CPU:
        note = recover_runtime()
        record.error += f" [{note}]" if note else ""


def run_mode(
    case: Case, initial: nn.Module, batch: dict[str, Any], mode: str, steps: int = STEPS
) -> Record:
    """Trains a deep copy of initial in one mode, steps steps; never raises (the error is
    recorded)."""
    record = Record(mode, n_steps=steps)
    if mode not in ON_CPU:
        # Each mode meets every op signature for the first time, as a new process does: what
        # an earlier mode learnt of an op (its Meta metadata checked on a real run) must not
        # change how this one runs it.
        fresh_runtime()
    before = neuron_counters() if mode not in ON_CPU else {}
    start = time.perf_counter()
    try:
        run_steps(case, initial, batch, record)
    except Exception as e:  # noqa: BLE001  (reported; the next mode still runs)
        fail(record, e)
    record.seconds = time.perf_counter() - start
    if mode not in ON_CPU:
        record.counters = counter_deltas(before, neuron_counters())
    return record
