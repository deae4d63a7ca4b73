"""Full-size models on one simulated NeuronCore, shape-only (NEURON_SIM_NUMERICS=off).

    python benchmarks/scale.py [--targets trn2,trn1] [--models gpt2-124m,bert-large,...]
                               [--modes eager,adaptive,compiled] [--steps 4] [--json FILE]
                               [--parallel llama-3.2-1b:fsdp:8,llama-3.1-8b:tp:8]

Each model is built from its published config (transformers' config classes, offline, no
weights) directly on the device (`with torch.device("neuron")`), and trained with AdamW
under bf16 autocast on a fixed batch; one process per model, target and mode. Nothing is
computed: the simulator prices every launch as it would with values (tests/zoo/
invariant.py proves the clock identical), so the table answers how fast the step would
be, whether the model fits one core's HBM, and what the first step costs in compiles.

Per row: the micro-batch (sequences x tokens), the warm step's simulated time, tokens/s,
MFU (the model's FLOPs per step over the core's peak bf16 FLOPs in that time), the HBM
peak, time to first step on the simulated clock (model build, the compiles of the real
graphs at their modelled compile time, the step), the real host seconds per warm step and
the process's peak RSS. A model that does not fit raises the simulator's OutOfMemoryError;
the row then says how much model state it has and the smallest data-parallel sharding
(FSDP/ZeRO-3) whose per-core state fits. Compiles burn no CPU here
(NEURON_SIM_COMPILE_SCALE=0): their modelled time is on the simulated clock only.

In compiled mode the model's forward and backward and the optimizer step are each
torch.compile'd (backend="neuron"), as a real Trainium run compiles the whole step.

--parallel adds rows trained under the real torchrun, one process per NeuronCore
(benchmarks/scale_rank.py: FSDP2 or tensor parallelism over N ranks); their tokens/s and
MFU are per core, their RSS the largest rank's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("eager", "adaptive", "compiled")
TARGETS = ("trn2", "trn1")
GiB = 1 << 30
STATE_BYTES_PER_PARAM = 16  # fp32 weight, fp32 gradient, AdamW's two fp32 moments


@dataclass(frozen=True)
class Spec:
    """A published model's shapes and the micro-batch it trains at."""

    name: str
    build: Callable[[], Any]  # the model, built under torch.device("neuron")
    batch: int
    seq: int
    kind: str  # causal | bert
    reduced: str = ""  # what was reduced from the published model, if anything


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())  # 124M: 12 layers, 768 wide, 1024 positions


def _bert_large() -> Any:
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    )
    return BertForPreTraining(config)


def _llama(hidden: int, intermediate: int, layers: int, tied: bool) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=128256,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            tie_word_embeddings=tied,
        )
        return LlamaForCausalLM(config)

    return build


def _mixtral(layers: int) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=layers,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
        )
        return MixtralForCausalLM(config)

    return build


SPECS = {
    s.name: s
    for s in (
        Spec("gpt2-124m", _gpt2, 2, 1024, "causal"),
        Spec("bert-large", _bert_large, 16, 128, "bert"),
        Spec("llama-3.2-1b", _llama(2048, 8192, 16, True), 1, 1024, "causal"),
        Spec("llama-3.1-8b", _llama(4096, 14336, 32, False), 1, 2048, "causal"),
        Spec(
            "mixtral-8x7b-1layer",
            _mixtral(1),
            1,
            2048,
            "causal",
            "32 layers -> 1 (every shape of a layer as published)",
        ),
    )
}


def model_flops_per_step(model: Any, spec: Spec) -> float:
    """Training FLOPs of one step: 6 per weight per token for the matmuls (forward and
    backward; the experts a token is routed to only), plus attention's 12 x layers x width
    x sequence per token."""
    import torch

    config = model.config
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    multiplied = {  # (transformers' GPT-2 multiplies with Conv1D modules)
        id(m.weight)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    }
    dense = experts = 0
    for name, p in model.named_parameters():  # (each parameter once: tied ones too)
        if ".experts." in name:
            experts += p.numel()
        elif p.dim() == 2 and (id(p) not in lookups or id(p) in multiplied):
            dense += p.numel()
    active = (
        experts
        * getattr(config, "num_experts_per_tok", 1)
        / getattr(config, "num_local_experts", 1)
    )
    tokens = spec.batch * spec.seq
    attention = 12 * config.num_hidden_layers * config.hidden_size * spec.seq
    return float((6 * (dense + active) + attention) * tokens)


def batch_for(spec: Spec) -> dict[str, Any]:
    import torch

    ids = torch.zeros(spec.batch, spec.seq, dtype=torch.long, device="neuron")
    if spec.kind == "bert":
        nsp = torch.zeros(spec.batch, dtype=torch.long, device="neuron")
        return {"input_ids": ids, "labels": ids, "next_sentence_label": nsp}
    return {"input_ids": ids, "labels": ids}


def run_one(name: str, mode: str, steps: int) -> dict[str, Any]:
    """Builds, trains `steps` steps and measures (this process: one model, target, mode)."""
    import resource
    import warnings

    import torch
    import transformers

    warnings.simplefilter("ignore")  # (shape-only mode warns where the host reads a value)
    transformers.logging.set_verbosity_error()
    spec = SPECS[name]
    target = torch.neuron.get_device_properties()
    out: dict[str, Any] = {"model": name, "target": os.environ["NEURON_SIM_TARGET"], "mode": mode}
    torch.neuron.set_eager_mode("eager" if mode == "compiled" else mode)
    try:
        with torch.device("neuron"):
            model = spec.build()
    except torch.OutOfMemoryError as e:
        return out | _does_not_fit(None, spec, target.total_memory, e)
    params = sum(p.numel() for p in model.parameters())
    out |= {"params": params, "batch": f"{spec.batch}x{spec.seq}", "reduced": spec.reduced}
    flops = model_flops_per_step(model, spec)
    batch = batch_for(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model, backend="neuron") if mode == "compiled" else model

    def update() -> None:
        opt.step()

    apply = torch.compile(update, backend="neuron") if mode == "compiled" else update
    walls, reals = [], []
    try:
        for _ in range(steps):
            real = time.perf_counter()
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = forward(**batch).loss
            loss.backward()
            apply()
            opt.zero_grad(set_to_none=True)
            torch.neuron.synchronize()
            walls.append(torch.neuron.metrics()["wall_ns"])
            reals.append(time.perf_counter() - real)
    except torch.OutOfMemoryError as e:
        return out | _does_not_fit(params, spec, target.total_memory, e)
    step_s = (walls[-1] - walls[-2]) / 1e9
    tokens = spec.batch * spec.seq
    peak = target.peak_bf16_tflops * 1e12
    m = torch.neuron.metrics()
    return out | {
        "step_ms": step_s * 1e3,
        "tokens_per_s": tokens / step_s,
        "sequences_per_s": spec.batch / step_s,
        "mfu": flops / step_s / peak,
        "hbm_peak_gib": torch.neuron.max_memory_allocated() / GiB,
        "ttfs_sim_s": walls[0] / 1e9,
        "real_s_per_step": min(reals[1:]),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "launches": m["launches"],
    }


def _does_not_fit(
    params: int | None, spec: Spec, hbm: int, error: Exception | str, shards: int = 1, how: str = ""
) -> dict[str, Any]:
    """The row of a model that raised OutOfMemoryError: its model state per core (already
    split `shards` ways by `how`), and the smallest power-of-two FSDP (ZeRO-3) sharding on
    top whose per-core model state fits in 80 % of HBM (activations at this micro-batch
    come on top)."""
    first = str(error).splitlines()[0].removeprefix("OutOfMemoryError: ")
    row: dict[str, Any] = {"error": f"OutOfMemoryError: {first[:160]}"}
    if params is None:
        return row
    state = params * STATE_BYTES_PER_PARAM / shards
    cores = 1
    while state / cores > 0.8 * hbm and cores < 1024:
        cores *= 2
    layout = f"FSDP over {cores} cores" if not how else f"{how} x FSDP over {cores}"
    fits = f"{layout} ({state / cores / GiB:.1f} GiB of state per core)"
    if cores == 1:  # (the state fits: what does not is the step's activations)
        fits = "the model state fits; the activations at this micro-batch do not (a smaller "
        fits += "micro-batch, activation checkpointing, or sequence/tensor parallelism)"
    return row | {"params": params, "state_gib": state / GiB, "fits": fits}


def shape_only_env(target: str) -> dict[str, str]:
    """A run's environment: shape-only on `target`, compiles on the simulated clock only."""
    return {
        **os.environ,
        "NEURON_SIM_NUMERICS": "off",
        "NEURON_SIM_TARGET": target,
        "NEURON_SIM_COMPILE_SCALE": "0",
        "NEURON_COMPILE_DAEMON": os.environ.get("NEURON_COMPILE_DAEMON", "off"),
        "NEURON_LOG_LEVEL": "warning",
    }


def launch(name: str, target: str, mode: str, steps: int, timeout: float) -> dict[str, Any]:
    env = shape_only_env(target)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, mode, str(steps)]
    try:
        done = subprocess.run(
            cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"model": name, "target": target, "mode": mode, "error": f"timeout {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
    return {"model": name, "target": target, "mode": mode, "error": tail[0][:200]}


def launch_ranks(
    name: str, target: str, mode: str, steps: int, layout: str, ranks: int, timeout: float
) -> dict[str, Any]:
    """One row trained by `ranks` processes under torchrun (benchmarks/scale_rank.py)."""
    import shutil
    import tempfile

    spec = SPECS[name]
    out = Path(tempfile.mkdtemp(prefix="scale-"))
    env = shape_only_env(target) | {"OMP_NUM_THREADS": "1", "TTFS_T0": repr(time.time())}
    here = Path(__file__).resolve().parent
    cmd = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        f"--nproc-per-node={ranks}",
        str(here / "scale_rank.py"),
        name,
        layout,
        mode,
        str(steps),
        str(out),
    ]
    how = f"{layout.upper()} over {ranks}"
    row: dict[str, Any] = {"model": f"{name} {how}", "target": target, "mode": mode}
    try:
        subprocess.run(cmd, check=False, env=env, capture_output=True, timeout=timeout)
        results = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    except subprocess.TimeoutExpired:
        return row | {"error": f"timeout {timeout} s"}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if len(results) != ranks:
        return row | {"error": f"{ranks - len(results)} of {ranks} ranks died (see torchrun)"}
    first = results[0]
    row |= {"batch": f"{spec.batch}x{spec.seq}", "reduced": spec.reduced}
    if "error" in first:
        props_hbm = _HBM[target]
        fit = _does_not_fit(first.get("params"), spec, props_hbm, first["error"], ranks, how)
        return row | fit | {"rss_mib": max(r["rss_mib"] for r in results)}
    walls = first["walls_ns"]
    step_s = (walls[-1] - walls[-2]) / 1e9
    tokens = spec.batch * spec.seq
    peak = _PEAK_BF16[target] * 1e12
    return row | {
        "params": first["params"],
        "step_ms": step_s * 1e3,
        "tokens_per_s": tokens / step_s,
        "sequences_per_s": spec.batch / step_s,
        "mfu": first["flops"] / step_s / peak,
        "hbm_peak_gib": max(r["hbm_peak"] for r in results) / GiB,
        "ttfs_sim_s": max(r["ttfs_sim_s"] for r in results),
        "real_s_per_step": max(min(r["reals_s"][1:]) for r in results),
        "rss_mib": max(r["rss_mib"] for r in results),
        "launches": first["launches"],
    }


# One NeuronCore's HBM and peak bf16 TFLOPS per target (simulator/config.py; read here so
# the driver needs no torch).
_HBM = {"trn2": 96 * GiB // 8, "trn1": 32 * GiB // 2}
_PEAK_BF16 = {"trn2": 79.0, "trn1": 92.0}


COLUMNS = (
    "model",
    "target",
    "mode",
    "batch",
    "step ms",
    "tokens/s",
    "MFU",
    "HBM peak GiB",
    "TTFS sim s",
    "host s/step",
    "RSS MiB",
)


def cells(r: dict[str, Any]) -> list[str]:
    head = [r["model"], r["target"], r["mode"], r.get("batch", "-")]
    if "error" in r:
        fits = f"; fits: {r['fits']}" if "fits" in r else ""
        state = f"model state {r['state_gib']:.1f} GiB; " if "state_gib" in r else ""
        rss = f"{r['rss_mib']:.0f}" if "rss_mib" in r else ""
        return [*head, f"does not run: {state}{r['error'][:90]}{fits}", *[""] * 5, rss]
    return [
        *head,
        f"{r['step_ms']:.1f}",
        f"{r['tokens_per_s']:.0f}",
        f"{100 * r['mfu']:.1f}%",
        f"{r['hbm_peak_gib']:.2f}",
        f"{r['ttfs_sim_s']:.1f}",
        f"{r['real_s_per_step']:.2f}",
        f"{r['rss_mib']:.0f}",
    ]


def table(rows: list[dict[str, Any]]) -> str:
    grid = [list(COLUMNS), *(cells(r) for r in rows)]
    widths = [max(len(g[i]) for g in grid if len(g[i]) < 40) for i in range(len(COLUMNS))]
    lines = []
    for g in grid:
        lines.append(" | ".join(c.ljust(w) for c, w in zip(g, widths, strict=True)).rstrip())
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--targets", default=",".join(TARGETS), help="trn2,trn1 (default both)")
    p.add_argument(
        "--models",
        default="gpt2-124m,bert-large,llama-3.2-1b,mixtral-8x7b-1layer",
        help=f"of {', '.join(SPECS)}",
    )
    p.add_argument("--modes", default=",".join(MODES), help="eager,adaptive,compiled")
    p.add_argument("--steps", type=int, default=4, help="steps per run (the last one is timed)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--json", metavar="FILE", help="also write every row as a JSON line")
    p.add_argument(
        "--parallel",
        default="llama-3.2-1b:fsdp:8,llama-3.1-8b:tp:8:eager,llama-3.1-8b:tp8+fsdp:16:eager",
        help="MODEL:LAYOUT:RANKS[:MODE/MODE],... rows under torchrun (fsdp, tp, or tpN+fsdp: "
        "TP over N ranks, FSDP2 across; the modes of --modes, or only those listed; '' for "
        "none)",
    )
    args = p.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step compiles)")
    rows = []
    for target in args.targets.split(","):
        for name in names:
            for mode in args.modes.split(","):
                start = time.monotonic()
                rows.append(launch(name, target, mode, args.steps, args.timeout))
                print(
                    f"{name} {target} {mode}: {time.monotonic() - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        for item in filter(None, args.parallel.split(",")):
            name, layout, ranks, *only = item.split(":")
            if name not in SPECS or not (layout in ("fsdp", "tp") or layout.endswith("+fsdp")):
                p.error(f"--parallel {item}: expected MODEL:fsdp|tp|tpN+fsdp:RANKS[:MODES]")
            modes = [m for m in args.modes.split(",") if not only or m in only[0].split("/")]
            for mode in modes:
                start = time.monotonic()
                rows.append(
                    launch_ranks(name, target, mode, args.steps, layout, int(ranks), args.timeout)
                )
                print(
                    f"{name} {layout} {ranks} {target} {mode}: {time.monotonic() - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print(table(rows))
    reduced = {r["model"]: r["reduced"] for r in rows if r.get("reduced")}
    for model, what in reduced.items():
        print(f"{model}: reduced from the published model: {what}")
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
