"""Llama generate() with a KV cache on CPU, neuron eager and neuron adaptive; compares tokens.

    NEURON_COMPILE_DAEMON=off .venv/bin/python tests/zoo/generate.py [--shared-runtime]

In one process, deep copies of the zoo's Llama (eval mode) run, in each mode in turn: greedy
generate() (max_new_tokens=8, use_cache=True) three times in a row, sampling generate()
(do_sample=True, torch.manual_seed before each call) three times, and a plain forward with
use_cache=True twice. Adaptive must equal eager bit for bit (tokens and logits); eager is
compared with CPU. In adaptive mode the harness waits for background compiles after each call,
so the later calls run fused graphs. Prints a table, then one JSON line per call.
Exit status 1 when any adaptive call differs from eager or fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from models import VOCAB, ZOO, Batch
from neuron_helpers import (
    counter_deltas,
    first_line,
    fresh_runtime,
    neuron_counters,
    quiet_transformers,
    recover_runtime,
    use_in_process_compiles,
    wait_for_fused_compiles,
)
from table import table, yes_no
from tensors import max_abs_diff, same_bits
from torch import nn
from training import RUN_SEED, to_device

# generate() with a KV cache in eager and adaptive mode; under torch.compile (a static cache)
# it is tests/client/test_compiled.py's.
MODES = ("cpu", "eager", "adaptive")

CALLS = 3
FORWARDS = 2
NEW_TOKENS = 8
PROMPT_LEN = 8
LEFT_PADS = 3  # the second prompt row starts with this many pad tokens
SAMPLE_SEED = 42

Outputs = dict[str, torch.Tensor]  # "tokens" and/or "logits", on CPU


def prompt() -> Batch:
    """2 x PROMPT_LEN token ids; the second row is left-padded (as generate() expects)."""
    ids = torch.randint(3, VOCAB, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, PROMPT_LEN, dtype=torch.long)
    mask[1, :LEFT_PADS] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def generated(model: nn.Module, inputs: Batch, **options: Any) -> Outputs:
    """generate() with a KV cache: the new tokens and the logits of every step, on CPU."""
    out = model.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        use_cache=True,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
        **options,
    )
    return {"tokens": out.sequences.cpu(), "logits": torch.stack(out.logits, dim=1).cpu()}


def greedy(model: nn.Module, inputs: Batch) -> Outputs:
    """Greedy decoding."""
    return generated(model, inputs, do_sample=False)


def sample(model: nn.Module, inputs: Batch) -> Outputs:
    """Sampling (top-k 50, temperature 1) after torch.manual_seed(SAMPLE_SEED)."""
    torch.manual_seed(SAMPLE_SEED)
    return generated(model, inputs, do_sample=True, top_k=50, temperature=1.0)


def cached_forward(model: nn.Module, inputs: Batch) -> Outputs:
    """One forward with use_cache=True: its logits."""
    return {"logits": model(**inputs, use_cache=True).logits.cpu()}


# name, function, how many calls in a row
CALL_KINDS: tuple[tuple[str, Callable[[nn.Module, Batch], Outputs], int], ...] = (
    ("greedy", greedy, CALLS),
    ("sample", sample, CALLS),
    ("forward", cached_forward, FORWARDS),
)


@dataclass
class GenRun:
    """What one mode produced, call by call ("greedy 0", ...), or the error of a kind of call."""

    mode: str
    outputs: dict[str, Outputs] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    compile_timeouts: int = 0  # calls after which fused compiles were still pending (adaptive)

    def calls_done(self, kind: str) -> int:
        """How many calls of this kind returned."""
        return sum(name.split()[0] == kind for name in self.outputs)


def run_calls(
    run: GenRun,
    kind: str,
    call: Callable[[nn.Module, Batch], Outputs],
    times: int,
    model: nn.Module,
    inputs: Batch,
) -> None:
    """Calls `call` several times in a row and records the outputs; raises what a call raises."""
    start = time.perf_counter()
    for i in range(times):
        run.outputs[f"{kind} {i}"] = call(model, inputs)
        if run.mode == "adaptive" and not wait_for_fused_compiles():
            run.compile_timeouts += 1
    if run.mode != "cpu":
        torch.neuron.synchronize()
    run.seconds[kind] = round(time.perf_counter() - start, 2)


def record_error(run: GenRun, kind: str, where: str, error: Exception, show: bool) -> None:
    """Notes the error of a kind of call; on neuron, runs or drops what was recorded."""
    run.errors[kind] = f"{where}: {first_line(error)}"
    if show:
        traceback.print_exc()
    if run.mode != "cpu":
        note = recover_runtime()
        run.errors[kind] += f" [{note}]" if note else ""


def run_mode(initial: nn.Module, inputs: Batch, mode: str, show_traceback: bool) -> GenRun:
    """Every kind of call in one mode, on a deep copy of initial; never raises."""
    run = GenRun(mode)
    device = "cpu" if mode == "cpu" else "neuron"
    before: dict[str, int] = {}
    try:
        if device == "neuron":
            torch.neuron.set_eager_mode(mode)
            before = neuron_counters()
        torch.manual_seed(RUN_SEED)
        model = copy.deepcopy(initial).to(device).eval()
        on_device = to_device(inputs, device)
    except Exception as e:  # noqa: BLE001  (reported for every kind of call)
        for kind, _, _ in CALL_KINDS:
            record_error(run, kind, "setup", e, show_traceback)
        return run
    for kind, call, times in CALL_KINDS:
        try:
            with torch.no_grad():
                run_calls(run, kind, call, times, model, on_device)
        except Exception as e:  # noqa: BLE001  (reported; the next kind of call still runs)
            record_error(run, kind, f"call {run.calls_done(kind)}", e, show_traceback)
    if device == "neuron":
        run.counters = counter_deltas(before, neuron_counters())
    return run


@dataclass
class CallReport:
    """One call compared: adaptive against eager (bit for bit), eager against CPU."""

    call: str
    eager_vs_cpu: dict[str, float]  # max |diff| of logits; tokens: number of tokens differing
    tokens_equal: bool | None  # adaptive == eager; None without tokens or when a run failed
    logits_equal: bool | None
    adaptive_vs_eager_logits_max_diff: float | None
    errors: dict[str, str]


def tokens_differing(a: torch.Tensor, b: torch.Tensor) -> float:
    """How many token positions differ (inf when the shapes differ)."""
    return float((a != b).sum()) if a.shape == b.shape else float("inf")


def vs(a: Outputs | None, b: Outputs | None, key: str) -> bool | None:
    """Whether a[key] equals b[key] (None when either is missing)."""
    if a is None or b is None or key not in a or key not in b:
        return None
    return same_bits(a[key], b[key])


def logits_diff(a: Outputs | None, b: Outputs | None) -> float | None:
    """Max |a - b| of the logits (None when either is missing)."""
    if a is None or b is None:
        return None
    return max_abs_diff(a["logits"], b["logits"])


def eager_vs_cpu(cpu: Outputs | None, eager: Outputs | None) -> dict[str, float]:
    """Max |diff| of the logits and the count of differing tokens, where both ran."""
    if cpu is None or eager is None:
        return {}
    facts = {"logits": max_abs_diff(cpu["logits"], eager["logits"])}
    if "tokens" in cpu:
        facts["tokens"] = tokens_differing(cpu["tokens"], eager["tokens"])
    return facts


def judge_call(call: str, runs: dict[str, GenRun]) -> CallReport:
    """Compares one call across the modes."""
    cpu, eager, adaptive = (runs[m].outputs.get(call) for m in MODES)
    kind = call.split()[0]
    return CallReport(
        call=call,
        eager_vs_cpu=eager_vs_cpu(cpu, eager),
        tokens_equal=vs(eager, adaptive, "tokens"),
        logits_equal=vs(eager, adaptive, "logits"),
        adaptive_vs_eager_logits_max_diff=logits_diff(eager, adaptive),
        errors={m: r.errors[kind] for m, r in runs.items() if kind in r.errors},
    )


def call_names() -> list[str]:
    """Every call, in order: "greedy 0", ..., "forward 1"."""
    return [f"{kind} {i}" for kind, _, times in CALL_KINDS for i in range(times)]


COLUMNS = (
    "call",
    "eager==cpu tokens",
    "eager==cpu logits (max diff)",
    "adaptive==eager tokens",
    "logits",
    "errors",
)


def row(report: CallReport) -> list[str]:
    """The table cells of one call."""
    tokens = report.eager_vs_cpu.get("tokens")
    logits = report.eager_vs_cpu.get("logits")
    return [
        report.call,
        "-" if tokens is None else ("yes" if tokens == 0 else f"no ({tokens:.0f} differ)"),
        "-" if logits is None else f"{'yes' if logits == 0 else 'no'} ({logits:.1e})",
        yes_no(report.tokens_equal),
        yes_no(report.logits_equal),
        "; ".join(f"{mode} at {msg}" for mode, msg in report.errors.items()),
    ]


def matches(report: CallReport) -> bool:
    """True when adaptive ran and equals eager."""
    return report.logits_equal is True and report.tokens_equal is not False


def compare_generation(
    fresh: bool = True, show_traceback: bool = False
) -> tuple[list[CallReport], dict[str, GenRun]]:
    """Runs every call in every mode: one report per call, and the runs (timings, counters)."""
    if fresh:
        fresh_runtime()
    initial = ZOO["llama"].build_model()
    inputs = prompt()
    runs = {mode: run_mode(initial, inputs, mode, show_traceback) for mode in MODES}
    return [judge_call(call, runs) for call in call_names()], runs


def mode_summary(run: GenRun) -> dict[str, Any]:
    """Seconds per kind of call and the adaptive counters of one mode."""
    return {
        "mode": run.mode,
        "seconds": run.seconds,
        "counters": run.counters,
        "compile_timeouts": run.compile_timeouts,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Compares generation; the exit status is 1 when any adaptive call differs."""
    use_in_process_compiles()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared-runtime", action="store_true", help="do not start a new runtime")
    parser.add_argument("--traceback", action="store_true", help="print each error's traceback")
    args = parser.parse_args(argv)
    quiet_transformers()
    reports, runs = compare_generation(not args.shared_runtime, args.traceback)
    print(table([row(r) for r in reports], COLUMNS))
    for run in runs.values():
        print(json.dumps(mode_summary(run)))
    for report in reports:
        print(json.dumps({**asdict(report), "adaptive_matches": matches(report)}))
    return 0 if all(matches(r) for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
