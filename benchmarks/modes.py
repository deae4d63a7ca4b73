"""Execution modes side by side, warm caches, measured in one run on one simulated chip.

    python benchmarks/modes.py [--steps 10] [--warmup 6]

For the GPT example, an MLP and a Llama-style model (transformers' LlamaForCausalLM, small),
per mode (eager, adaptive, compiled: the model and the optimizer step under
torch.compile(backend="neuron"), the rest eager): simulated step time, device busy time,
simulated host busy time (dispatching, recording, launching), real host time per step, launches per step and HBM bytes per step, then the ratios adaptive
/ eager, adaptive / compiled and eager / compiled. Steps alternate between the modes so all
see the same machine load. Steady state: the
compiles are off the simulated clock (NEURON_SIM_COMPILE_CLOCK=off unless set), so adaptive
graphs run fused once compiled; benchmarks/ttfs.py measures the first step, compiles on it.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_gpt import GPT, GPTConfig, make_batches

MODES = ("eager", "adaptive", "compiled")
Stepper = Callable[[torch.nn.Module, bool], Callable[[], float]]


def _compiled(fn: Callable[..., object], compiled: bool) -> Callable[..., object]:
    return torch.compile(fn, backend="neuron") if compiled else fn


def gpt_workload() -> tuple[Callable[[], torch.nn.Module], Stepper]:
    cfg = GPTConfig()
    batches = make_batches(cfg, 64, 8)

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT(cfg)

    def stepper(model: torch.nn.Module, compiled: bool) -> Callable[[], float]:
        model.to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        it = iter(batches * 4)
        forward = _compiled(model, compiled)

        def update() -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        apply = _compiled(update, compiled)

        def step() -> float:
            x, y = next(it)
            loss = forward(x.to("neuron"), y.to("neuron"))
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[union-attr]
            apply()
            return loss.item()  # type: ignore[union-attr]

        return step

    return make, stepper


def mlp_workload() -> tuple[Callable[[], torch.nn.Module], Stepper]:
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(64, 256, generator=g), torch.randn(64, 10, generator=g)) for _ in range(16)
    ]

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(256, 512),
            torch.nn.GELU(),
            torch.nn.Linear(512, 512),
            torch.nn.GELU(),
            torch.nn.LayerNorm(512),
            torch.nn.Linear(512, 10),
        )

    def stepper(model: torch.nn.Module, compiled: bool) -> Callable[[], float]:
        model.to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        it = iter(data * 64)
        forward = _compiled(model, compiled)
        apply = _compiled(opt.step, compiled)

        def step() -> float:
            x, y = next(it)
            out = forward(x.to("neuron"))
            loss = torch.nn.functional.mse_loss(out, y.to("neuron"))  # type: ignore[arg-type]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            apply()
            return loss.item()

        return step

    return make, stepper


def llama_workload() -> tuple[Callable[[], torch.nn.Module], Stepper]:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        use_cache=False,  # training: no KV cache
    )
    g = torch.Generator().manual_seed(2)
    data = [torch.randint(0, 256, (4, 32), generator=g) for _ in range(16)]

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config)

    def stepper(model: torch.nn.Module, compiled: bool) -> Callable[[], float]:
        model.to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        it = iter(data * 64)
        forward = _compiled(model, compiled)
        apply = _compiled(opt.step, compiled)

        def step() -> float:
            ids = next(it).to("neuron")
            loss = forward(input_ids=ids, labels=ids).loss  # type: ignore[union-attr]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            apply()
            return float(loss.item())

        return step

    return make, stepper


def wait_for_fused_compiles() -> None:
    from trnsim.client.core import runtime

    recorder = runtime.get().recorder
    deadline = time.monotonic() + 120
    while recorder is not None and time.monotonic() < deadline:
        if all(s.future is None or s.future.done() for s in recorder.graphs.values()):
            return
        time.sleep(0.01)


def measure(name: str, workload: tuple, steps: int, warmup: int) -> None:
    make, stepper = workload
    base = make()
    models = {mode: copy.deepcopy(base) for mode in MODES}
    steps_of = {}
    for mode in MODES:
        torch.neuron.set_eager_mode("adaptive" if mode == "adaptive" else "eager")
        steps_of[mode] = stepper(models[mode], mode == "compiled")
        for _ in range(warmup):  # compile everything; let fused graphs come back
            steps_of[mode]()
            wait_for_fused_compiles()
        steps_of[mode]()
    rows: dict[str, dict[str, list[float]]] = {
        m: {k: [] for k in ("sim", "busy", "hostsim", "host", "launch", "hbm")} for m in MODES
    }
    losses: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(steps):
        for mode in MODES:
            torch.neuron.set_eager_mode("adaptive" if mode == "adaptive" else "eager")
            before = torch.neuron.metrics()
            start = time.perf_counter()
            losses[mode].append(steps_of[mode]())
            host = time.perf_counter() - start
            after = torch.neuron.metrics()
            r = rows[mode]
            r["sim"].append((after["wall_ns"] - before["wall_ns"]) / 1e3)
            r["busy"].append((after["device_busy_ns"] - before["device_busy_ns"]) / 1e3)
            r["hostsim"].append((after["host_busy_ns"] - before["host_busy_ns"]) / 1e3)
            r["host"].append(host * 1e3)
            r["launch"].append(after["launches"] - before["launches"])
            r["hbm"].append((after["hbm_bytes"] - before["hbm_bytes"]) / 2**20)
    same = losses["eager"] == losses["adaptive"]
    worst = max(
        abs(c - e) / max(abs(e), 1e-12)
        for c, e in zip(losses["compiled"], losses["eager"], strict=True)
    )
    print(
        f"\n{name}: {steps} warm steps per mode (losses: adaptive identical to eager: {same}; "
        f"compiled within {worst:.1e} of eager)"
    )
    print(
        f"{'mode':<9} {'sim step us':>12} {'device busy us':>15} {'sim host busy us':>17} {'host ms/step':>13} {'launches':>9} {'HBM MiB':>8}"
    )
    med = {m: {k: statistics.median(v) for k, v in rows[m].items()} for m in MODES}
    for mode in MODES:
        r = med[mode]
        print(
            f"{mode:<9} {r['sim']:>12.1f} {r['busy']:>15.1f} {r['hostsim']:>17.1f} {r['host']:>13.2f} {r['launch']:>9.0f} {r['hbm']:>8.2f}"
        )
    for top, bottom in (("adaptive", "eager"), ("adaptive", "compiled"), ("eager", "compiled")):
        a, b = med[top], med[bottom]
        print(
            f"{top} / {bottom}: simulated step {a['sim'] / b['sim']:.2f}, device busy "
            f"{a['busy'] / b['busy']:.2f}, real host time {a['host'] / b['host']:.2f}, launches "
            f"{a['launch'] / b['launch']:.3f}, HBM bytes {a['hbm'] / b['hbm']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=6)
    args = parser.parse_args()
    with torch.no_grad():
        pass
    measure("GPT example", gpt_workload(), args.steps, args.warmup)
    measure("MLP", mlp_workload(), args.steps, args.warmup)
    measure(
        "Llama-style (transformers LlamaForCausalLM)", llama_workload(), args.steps, args.warmup
    )


if __name__ == "__main__":
    main()
