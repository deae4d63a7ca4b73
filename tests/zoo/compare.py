"""Trains zoo models on CPU, neuron eager and neuron adaptive; adaptive must equal eager bit for bit.

    NEURON_COMPILE_DAEMON=off .venv/bin/python tests/zoo/compare.py [NAME ...] [--steps 6]

With no NAME, every model of models.ZOO runs. For each model, in this one process: the same
initial weights (deep copies) train STEPS steps of SGD on CPU, then on neuron in eager mode,
then in adaptive mode, each after torch.manual_seed(0). Each model starts with a fresh neuron
runtime unless --shared-runtime. Prints a table, then one JSON line per model. An exception in
a mode is reported (with the step it happened at), and the next mode or model still runs.
Weights that model.to("neuron") unties (tied embeddings) are tied again and counted in the
"ties lost" column (--keep-untied: left untied). Exit status 1 when any adaptive run differs
from eager or fails.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from models import ZOO, Batch, Case
from torch import nn

STEPS = 6
LR = 1e-3
MOMENTUM = 0.9
RUN_SEED = 0
COMPILE_TIMEOUT_S = 60.0
MODES = ("cpu", "eager", "adaptive")
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


# -- the neuron runtime ------------------------------------------------------------------------
def use_in_process_compiles() -> None:
    """NEURON_COMPILE_DAEMON=off unless the caller chose otherwise (before the runtime starts)."""
    os.environ.setdefault("NEURON_COMPILE_DAEMON", "off")


def wait_for_fused_compiles(timeout_s: float = COMPILE_TIMEOUT_S) -> bool:
    """Waits until no background fused compile is pending; False on timeout."""
    from trnsim.client import runtime

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
    from trnsim.client import runtime

    old, runtime._runtime = runtime._runtime, None
    if old is not None:
        # Its recorded work may fail again here: that was reported where it failed first.
        with contextlib.suppress(Exception):
            old.close()


def recover_runtime() -> str | None:
    """After an exception: run what was recorded; a fresh runtime if that fails too."""
    try:
        torch.neuron.synchronize()
        return None
    except Exception as e:  # noqa: BLE001  (the recorded ops cannot run: start over)
        fresh_runtime()
        return f"synchronize after the error failed too ({first_line(e)}); runtime replaced"


# -- comparing tensors -------------------------------------------------------------------------
def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, except that NaNs in the same places count as equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b|; NaN in both places counts 0, NaN in one counts inf."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    x, y = a.detach().double(), b.detach().double()
    equal = (x == y) | (x.isnan() & y.isnan())  # infinities of one sign count as equal too
    diff = torch.where(equal, torch.zeros_like(x), (x - y).abs())
    return float(torch.nan_to_num(diff, nan=math.inf).max())


def first_differing(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> int | None:
    """The first index where two lists of tensors differ, over the steps both have."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if not same(x, y):
            return i
    return None


def differing_keys(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ (or exist on one side only)."""
    keys = list(a) + [k for k in b if k not in a]
    return [k for k in keys if k not in a or k not in b or not same(a[k], b[k])]


def dict_max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest max_abs_diff over the tensors of two state dicts."""
    if a.keys() != b.keys():
        return math.inf
    return max((max_abs_diff(a[k], b[k]) for k in a), default=0.0)


def worst_key(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """The state-dict entry with the largest difference (None when nothing differs)."""
    diffs = {k: max_abs_diff(a[k], b[k]) for k in a if k in b}
    name = max(diffs, key=lambda k: diffs[k], default=None)
    return name if name is not None and diffs[name] > 0 else None


def first_line(error: BaseException) -> str:
    """The exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


# -- one run -----------------------------------------------------------------------------------
@dataclass
class Run:
    """What one mode produced: per-step losses, final outputs and state, or its error."""

    mode: str
    seconds: float = 0.0
    losses: list[torch.Tensor] = field(default_factory=list)
    output: torch.Tensor | None = None
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    ties_lost: int = 0  # tied weights that model.to(device) untied (re-tied unless asked not to)
    compile_timeouts: int = 0  # steps after which fused compiles were still pending (adaptive)

    @property
    def complete(self) -> bool:
        """True when every step and the final forward ran."""
        return self.error is None and self.output is not None


def distinct_parameters(model: nn.Module) -> int:
    """How many distinct Parameter objects the model holds (tied weights count once)."""
    return len({id(p) for _, p in model.named_parameters(remove_duplicate=False)})


def move(model: nn.Module, device: str, retie: bool = True) -> tuple[nn.Module, int]:
    """model.to(device) and how many tied weights that untied; re-tied unless retie is False."""
    # PyTorch does not treat PrivateUse1 tensors as shallow-copy compatible with CPU ones, so
    # Module.to("neuron") gives every module a new Parameter: weights shared between modules
    # (tied embeddings) become separate copies, and one of them misses part of its gradient.
    before = distinct_parameters(model)
    model = model.to(device)
    lost = distinct_parameters(model) - before
    if lost and retie and hasattr(model, "tie_weights"):
        model.tie_weights()
    return model, lost


def to_device(batch: Batch, device: str) -> Batch:
    """The batch's tensors on device."""
    return {k: v.to(device) for k, v in batch.items()}


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy."""
    return t.detach().to("cpu", copy=True)


def train(
    model: nn.Module,
    case: Case,
    batch: Batch,
    steps: int,
    losses: list[torch.Tensor],
    on_step: Callable[[], None],
) -> None:
    """SGD with momentum on the same batch; appends each step's loss (on CPU) to losses."""
    model.train(case.train_mode)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for _ in range(steps):
        loss = case.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(to_cpu(loss))
        on_step()


def final_output(model: nn.Module, case: Case, batch: Batch) -> torch.Tensor:
    """One more forward in eval mode without gradients; its output on CPU."""
    model.eval()
    with torch.no_grad():
        return to_cpu(case.output(model, batch))


def final_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers (BatchNorm statistics included) on CPU."""
    return {k: to_cpu(v) for k, v in model.state_dict().items()}


def run_mode(
    case: Case,
    initial: nn.Module,
    batch: Batch,
    mode: str,
    steps: int,
    show_traceback: bool = False,
    retie: bool = True,
) -> Run:
    """Trains a deep copy of initial in one mode (cpu, eager or adaptive); never raises."""
    run = Run(mode)
    device = "cpu" if mode == "cpu" else "neuron"
    before: dict[str, int] = {}

    def on_step() -> None:
        if mode == "adaptive" and not wait_for_fused_compiles():
            run.compile_timeouts += 1

    phase = "setup"
    start = time.perf_counter()
    try:
        if device == "neuron":
            torch.neuron.set_eager_mode(mode)
            before = neuron_counters()
        torch.manual_seed(RUN_SEED)
        model, run.ties_lost = move(copy.deepcopy(initial), device, retie)
        inputs = to_device(batch, device)
        phase = "train"
        train(model, case, inputs, steps, run.losses, on_step)
        phase = "final forward"
        run.output = final_output(model, case, inputs)
        run.state = final_state(model)
        phase = "synchronize"
        if device == "neuron":
            torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001  (reported; the next mode still runs)
        where = f"step {len(run.losses)}" if phase == "train" else phase
        run.error = f"{where}: {first_line(e)}"
        if show_traceback:
            traceback.print_exc()
        if device == "neuron":
            note = recover_runtime()
            run.error += f" [{note}]" if note else ""
    run.seconds = time.perf_counter() - start
    if device == "neuron" and before:
        run.counters = counter_deltas(before, neuron_counters())
    return run


# -- one model ---------------------------------------------------------------------------------
@dataclass
class Report:
    """The verdict on one model: eager against CPU, adaptive against eager."""

    model: str
    eager_vs_cpu: dict[str, float | None]  # max |diff| of losses, output, state
    eager_vs_cpu_worst_state: str | None  # the parameter or buffer that differs most
    losses_equal: bool | None  # adaptive == eager; None when a run did not finish
    output_equal: bool | None
    state_equal: bool | None
    first_differing_step: int | None  # first step whose loss differs (adaptive vs eager)
    adaptive_vs_eager_max_diff: dict[str, float | None]
    differing_state: list[str]  # state-dict entries that differ (adaptive vs eager), first few
    n_differing_state: int
    errors: dict[str, str]
    ties_lost: int  # tied weights that .to("neuron") untied
    compile_timeouts: int  # adaptive steps after which compiles were still pending (60 s)
    seconds: dict[str, float]
    counters: dict[str, int]  # adaptive run
    losses: dict[str, list[float]]

    @property
    def adaptive_matches(self) -> bool:
        """True when adaptive finished and equals eager in losses, output and state."""
        return bool(self.losses_equal and self.output_equal and self.state_equal)


def loss_diff(a: Run, b: Run) -> float | None:
    """The largest loss difference over the steps both runs finished."""
    pairs = list(zip(a.losses, b.losses, strict=False))
    return max((max_abs_diff(x, y) for x, y in pairs), default=None)


def output_diff(a: Run, b: Run) -> float | None:
    """Max |a - b| of the final outputs (None unless both runs finished)."""
    if a.output is None or b.output is None or not (a.complete and b.complete):
        return None
    return max_abs_diff(a.output, b.output)


def outputs_same(a: Run, b: Run) -> bool | None:
    """Whether the final outputs are equal (None unless both runs finished)."""
    if a.output is None or b.output is None or not (a.complete and b.complete):
        return None
    return same(a.output, b.output)


def diffs(a: Run, b: Run) -> dict[str, float | None]:
    """Max |a - b| of losses, final output and final state (None where a run has none)."""
    both = a.complete and b.complete
    return {
        "losses": loss_diff(a, b),
        "output": output_diff(a, b),
        "state": dict_max_diff(a.state, b.state) if both else None,
    }


def judge(name: str, runs: dict[str, Run]) -> Report:
    """Compares the runs of one model."""
    cpu, eager, adaptive = runs["cpu"], runs["eager"], runs["adaptive"]
    both = eager.complete and adaptive.complete
    bad_state = differing_keys(eager.state, adaptive.state) if both else []
    first = first_differing(eager.losses, adaptive.losses)
    return Report(
        model=name,
        eager_vs_cpu=diffs(cpu, eager),
        eager_vs_cpu_worst_state=worst_key(cpu.state, eager.state),
        losses_equal=(first is None) if both else None,
        output_equal=outputs_same(eager, adaptive),
        state_equal=not bad_state if both else None,
        first_differing_step=first,
        adaptive_vs_eager_max_diff=diffs(eager, adaptive),
        differing_state=bad_state[:5],
        n_differing_state=len(bad_state),
        errors={r.mode: r.error for r in runs.values() if r.error},
        ties_lost=max(r.ties_lost for r in runs.values()),
        compile_timeouts=adaptive.compile_timeouts,
        seconds={r.mode: round(r.seconds, 2) for r in runs.values()},
        counters=adaptive.counters,
        losses={r.mode: [float(x) for x in r.losses] for r in runs.values()},
    )


def compare(
    name: str,
    steps: int = STEPS,
    fresh: bool = True,
    show_traceback: bool = False,
    retie: bool = True,
) -> Report:
    """Builds zoo model `name`, trains it in every mode in turn and compares the runs."""
    # fresh: a new neuron runtime first, so that graphs recorded for other models do not count.
    # retie: tie the weights again that model.to("neuron") untied (see move).
    if fresh:
        fresh_runtime()
    case = ZOO[name]
    initial = case.build_model()
    batch = case.build_batch()
    runs = {
        mode: run_mode(case, initial, batch, mode, steps, show_traceback, retie) for mode in MODES
    }
    return judge(name, runs)


# -- output ------------------------------------------------------------------------------------
COLUMNS = (
    "model",
    "eager==cpu (max diff)",
    "adaptive==eager losses",
    "outputs",
    "params",
    "first diff step",
    "ties lost",
    "fused",
    "op-by-op",
    "cpu s",
    "eager s",
    "adaptive s",
    "errors",
)


def yes_no(value: bool | None) -> str:
    """yes / NO / - (not compared)."""
    return "-" if value is None else ("yes" if value else "NO")


def eager_cpu_cell(report: Report) -> str:
    """'yes (0)' when eager equals CPU exactly, else 'no (largest difference)'."""
    values = [v for v in report.eager_vs_cpu.values() if v is not None]
    if not values:
        return "-"
    worst = max(values)
    return f"{'yes' if worst == 0 else 'no'} ({worst:.1e})"


def first_step_cell(report: Report) -> str:
    """The first differing step, 'final' when only the end state differs, else '-'."""
    if report.first_differing_step is not None:
        return str(report.first_differing_step)
    if report.losses_equal and not report.adaptive_matches:
        return "final"
    return "-"


def row(report: Report) -> list[str]:
    """The table cells of one report."""
    errors = "; ".join(f"{mode} at {msg}" for mode, msg in report.errors.items())
    return [
        report.model,
        eager_cpu_cell(report),
        yes_no(report.losses_equal),
        yes_no(report.output_equal),
        yes_no(report.state_equal),
        first_step_cell(report),
        str(report.ties_lost),
        str(report.counters.get("fused_executions", "-")),
        str(report.counters.get("op_by_op_graphs", "-")),
        *(f"{report.seconds.get(m, 0.0):.1f}" for m in MODES),
        errors,
    ]


def table(rows: list[list[str]], columns: Sequence[str] = COLUMNS) -> str:
    """A plain text table with a | between columns."""
    widths = [max(len(r[i]) for r in [list(columns), *rows]) for i in range(len(columns))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    header = " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    rule = "-+-".join("-" * w for w in widths)
    return "\n".join(line.rstrip() for line in [header, rule, *lines])


def json_line(report: Report) -> str:
    """One JSON object with every fact of the report."""
    facts: dict[str, Any] = asdict(report)
    facts["adaptive_matches"] = report.adaptive_matches
    return json.dumps(facts)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """NAME ... (default: the whole zoo) and the options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(ZOO)}")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument(
        "--shared-runtime",
        action="store_true",
        help="one neuron runtime for all models (graphs recorded for one are reused by the next)",
    )
    parser.add_argument("--traceback", action="store_true", help="print each error's traceback")
    parser.add_argument(
        "--keep-untied",
        action="store_true",
        help='do not re-tie the weights that model.to("neuron") untied',
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    return args


def quiet_transformers() -> None:
    """Only transformers' errors (its config warnings are noise here)."""
    import transformers

    transformers.logging.set_verbosity_error()


def main(argv: Sequence[str] | None = None) -> int:
    """Compares the named models; the exit status is 1 when any adaptive run differs."""
    use_in_process_compiles()
    args = parse_args(argv)
    quiet_transformers()
    reports = []
    for name in args.names or list(ZOO):
        report = compare(
            name, args.steps, not args.shared_runtime, args.traceback, not args.keep_untied
        )
        reports.append(report)
        print(f"{name}: done in {sum(report.seconds.values()):.1f} s", file=sys.stderr)
    print(table([row(r) for r in reports]))
    for report in reports:
        print(json_line(report))
    return 0 if all(r.adaptive_matches for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
