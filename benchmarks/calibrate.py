"""The simulator against a published Trainium training run: HuggingFace BERT-Large phase-1
pre-training on one trn1.32xlarge.

    python benchmarks/calibrate.py [--modes compiled,eager]

AWS publishes (Neuron 2.27 training benchmark tables) 3836.5 sequences/s for one
trn1.32xlarge: 32 NeuronCores data-parallel, BF16 autocast with stochastic rounding,
micro-batch 16, sequence 128, AdamW, global batch 16384, so each core accumulates
gradients over 16384 / (32 x 16) = 32 micro-batches per optimizer step: 119.9 sequences/s
per NeuronCore.

This simulates that core shape-only (NEURON_SIM_NUMERICS=off) on the trn1 target, with the
published chip figures and nothing fitted: a micro-batch (forward and backward), then the
optimizer step, each timed warm on the simulated clock. (The micro-batch writes fresh
gradients: adding them to the accumulated ones, which XLA fuses into the backward graph,
is not simulated, and holding both would not fit the 16 GiB of a core here, as compiled
mode's backward region keeps every saved activation until it ends.) The step's
gradient all-reduce over the 32 cores is priced by the same collective cost model the
neuron process group uses. Per core:

    sequences/s = 16 / (micro-batch + (optimizer step + all-reduce) / 32)

Printed next to 119.9, with where the micro-batch's time goes: each engine's busy time,
DMA, launch overhead, the host, and the waits. In compiled mode the model and the
optimizer step are torch.compile'd, as the published run compiles its graphs (XLA).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PUBLISHED_PER_NODE = 3836.5  # sequences/s, trn1.32xlarge, Neuron 2.27
CORES = 32
PUBLISHED = PUBLISHED_PER_NODE / CORES  # 119.9 per NeuronCore
MICRO_BATCH, SEQ, ACCUMULATION = 16, 128, 32


def measure(mode: str) -> dict[str, Any]:
    """This process: BERT-Large on a simulated trn1 core, warm micro-batch and update."""
    import warnings

    import torch
    import transformers
    from transformers import BertConfig, BertForPreTraining
    from trnsim.simulator import config, cost_model

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.neuron.set_eager_mode("eager" if mode == "compiled" else mode)
    bert = BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    )
    with torch.device("neuron"):
        model = BertForPreTraining(bert)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.zeros(MICRO_BATCH, SEQ, dtype=torch.long, device="neuron")
    nsp = torch.zeros(MICRO_BATCH, dtype=torch.long, device="neuron")
    forward = torch.compile(model, backend="neuron") if mode == "compiled" else model

    def update() -> None:
        opt.step()

    apply = torch.compile(update, backend="neuron") if mode == "compiled" else update

    def micro_batch() -> None:
        with torch.autocast("neuron", dtype=torch.bfloat16):
            loss = forward(input_ids=ids, labels=ids, next_sentence_label=nsp).loss
        loss.backward()

    def timed(work: Any) -> dict[str, int]:
        torch.neuron.synchronize()
        before = torch.neuron.metrics()
        work()
        torch.neuron.synchronize()
        after = torch.neuron.metrics()
        return {k: after[k] - before.get(k, 0) for k in after}

    for _ in range(2):  # (compiles, and the optimizer's state exists: the steady state)
        micro_batch()
        apply()
        opt.zero_grad(set_to_none=True)
    micro = timed(micro_batch)
    step = timed(apply)
    target = config.get_target("trn1")
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    topology = cost_model.Topology(CORES, 1, CORES)
    all_reduce = cost_model.collective_cost(target, "all_reduce", grads, topology).ns
    per_sequence = micro["wall_ns"] + (step["wall_ns"] + all_reduce) / ACCUMULATION
    return {
        "mode": mode,
        "micro_ms": micro["wall_ns"] / 1e6,
        "update_ms": step["wall_ns"] / 1e6,
        "all_reduce_ms": all_reduce / 1e6,
        "seq_per_s": MICRO_BATCH / (per_sequence / 1e9),
        "micro": {k: v for k, v in micro.items() if v and (k.endswith("_ns") or k in _COUNTS)},
        "launch_overhead_ns": target.launch_overhead_ns,
    }


_COUNTS = ("launches", "hbm_bytes")


def breakdown(r: dict[str, Any]) -> list[str]:
    m = r["micro"]
    engines = ", ".join(
        f"{e} {m.get(f'{e}_busy_ns', 0) / 1e6:.1f}"
        for e in ("tensor", "vector", "scalar", "gpsimd")
    )
    launches = m.get("launches", 0)
    return [
        f"  engines busy (ms): {engines}",
        (
            f"  DMA busy {m.get('dma_busy_ns', 0) / 1e6:.1f} ms, HBM traffic "
            f"{m.get('hbm_bytes', 0) / 1e9:.2f} GB"
        ),
        (
            f"  launches {launches} x {r['launch_overhead_ns'] / 1e3:.0f} us overhead = "
            f"{launches * r['launch_overhead_ns'] / 1e6:.2f} ms"
        ),
        (
            f"  host busy {m.get('host_busy_ns', 0) / 1e6:.2f} ms; device busy (streams summed) "
            f"{m.get('device_busy_ns', 0) / 1e6:.1f} ms; the host waited on the device "
            f"{m.get('sync_wait_ns', 0) / 1e6:.1f} ms"
        ),
        (
            f"  per optimizer step: update {r['update_ms']:.1f} ms + all-reduce of the gradients "
            f"over {CORES} cores {r['all_reduce_ms']:.1f} ms, spread over {ACCUMULATION} "
            "micro-batches"
        ),
    ]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2])), flush=True)
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--modes", default="compiled,eager", help="compiled,eager,adaptive")
    args = p.parse_args()
    env = {
        **os.environ,
        "NEURON_SIM_NUMERICS": "off",
        "NEURON_SIM_TARGET": "trn1",
        "NEURON_SIM_COMPILE_SCALE": "0",
        "NEURON_COMPILE_DAEMON": os.environ.get("NEURON_COMPILE_DAEMON", "off"),
        "NEURON_LOG_LEVEL": "warning",
    }
    print(
        f"HuggingFace BERT-Large phase 1, trn1, micro-batch {MICRO_BATCH} x {SEQ}, bf16 "
        f"autocast, AdamW, {ACCUMULATION} micro-batches per step; published "
        f"{PUBLISHED_PER_NODE} seq/s per trn1.32xlarge = {PUBLISHED:.1f} per NeuronCore"
    )
    for mode in args.modes.split(","):
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--one", mode],
            check=False,
            env=env,
            capture_output=True,
            text=True,
        )
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if not lines:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            print(f"{mode}: failed: {tail[0]}")
            continue
        r = json.loads(lines[-1])
        gap = 100 * (r["seq_per_s"] / PUBLISHED - 1)
        print(
            f"{mode}: {r['seq_per_s']:.1f} seq/s per NeuronCore against {PUBLISHED:.1f} "
            f"published ({gap:+.1f} %); micro-batch {r['micro_ms']:.1f} ms"
        )
        print("\n".join(breakdown(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
