"""One rank of a full-size model trained shape-only under torchrun (benchmarks/scale.py
--ranks, benchmarks/ttfs.py --model): the model is built on the meta device, laid out over
the ranks (FSDP2: every decoder layer and the root fully_shard'ed; TP: Megatron-style
column/row parallel attention and MLP over all ranks), materialised on the neuron device
with to_empty, and trained with AdamW under bf16 autocast.

    torchrun --nproc-per-node N benchmarks/scale_rank.py MODEL LAYOUT MODE STEPS OUT_DIR

MODE: eager, adaptive, compiled, or env (NEURON_EAGER's). LAYOUT: fsdp, tp, or tpN+fsdp
(tensor parallelism over groups of N ranks, FSDP2 across the groups).

Writes $OUT_DIR/rank-$RANK.json: the simulated clock after each step, real seconds per step
and to the end of the first step (from the launcher's TTFS_T0), the wall time spent in
blocking compiles, HBM peak and peak RSS (what benchmarks/ttfs.py reads too), or the error.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

LAUNCHED = float(os.environ.get("TTFS_T0", time.time()))

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_wait import time_compiles
from scale import SPECS, batch_for, model_flops_per_step


def fsdp(model: Any, world: int, mesh: Any = None) -> None:
    from torch.distributed.fsdp import fully_shard

    mesh = mesh if mesh is not None else init_device_mesh("neuron", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def tp_fsdp(model: Any, world: int, degree: int) -> None:
    """Tensor parallelism over `degree` ranks (a NeuronLink group) and FSDP2 over the
    world / degree groups: a 2-D mesh, as torchtitan lays out a large model."""
    mesh = init_device_mesh("neuron", (world // degree, degree), mesh_dim_names=("dp", "tp"))
    tp(model, degree, mesh["tp"])
    fsdp(model, world, mesh["dp"])


def tp(model: Any, world: int, mesh: Any = None) -> None:
    """Attention heads and the MLP's width split over the ranks (q/k/v/gate/up by column,
    o/down by row): each layer's forward has two all-reduces, as in Megatron-LM. Untied
    embeddings and LM head are split over the vocabulary (the logits all-gathered); norms
    stay whole on every rank."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = mesh if mesh is not None else init_device_mesh("neuron", (world,))
    if not model.config.tie_word_embeddings:
        parallelize_module(
            model,
            mesh,
            {
                "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                "lm_head": ColwiseParallel(output_layouts=Replicate()),
            },
        )
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    config = model.config
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
        attn = layer.self_attn  # (its forward views heads from its config: local counts)
        attn.config = type(config).from_dict(
            config.to_dict()
            | {
                "num_attention_heads": config.num_attention_heads // world,
                "num_key_value_heads": config.num_key_value_heads // world,
            }
        )


def main() -> None:
    name, layout, mode, steps, out_dir = sys.argv[1:6]
    if mode == "env":  # (benchmarks/ttfs.py sets the mode in NEURON_EAGER)
        mode = os.environ.get("NEURON_EAGER", "eager")
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("neuron")
    spec = SPECS[name]
    out: dict[str, Any] = {"rank": rank}
    torch.neuron.set_eager_mode("eager" if mode == "compiled" else mode)
    compile_wait = time_compiles()
    try:
        with torch.device("meta"):
            model = spec.build()
        flops = model_flops_per_step(model, spec)
        out["params"] = sum(p.numel() for p in model.parameters())
        if layout.startswith("tp") and "+fsdp" in layout:  # tp8+fsdp: TP over 8, FSDP across
            tp_fsdp(model, world, int(layout[2 : layout.index("+")]))
        else:
            {"fsdp": fsdp, "tp": tp}[layout](model, world)
        model.to_empty(device="neuron")
        # (TP leaves norms as plain tensors: a foreach op cannot mix them with DTensors, so
        # each kind has its own AdamW)
        from torch.distributed.tensor import DTensor

        params = list(model.parameters())
        kinds = [[p for p in params if isinstance(p, DTensor) == d] for d in (True, False)]
        optimizers = [torch.optim.AdamW(ps, lr=1e-4) for ps in kinds if ps]
        forward = torch.compile(model, backend="neuron") if mode == "compiled" else model

        def update() -> None:
            for opt in optimizers:
                opt.step()

        apply = torch.compile(update, backend="neuron") if mode == "compiled" else update
        batch = batch_for(spec)
        walls, reals = [], []
        for step in range(int(steps)):
            real = time.perf_counter()
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = forward(**batch).loss
            loss.backward()
            apply()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.item()
            torch.neuron.synchronize()
            walls.append(torch.neuron.metrics()["wall_ns"])
            reals.append(time.perf_counter() - real)
            if step == 0:
                out["ttfs_wall_s"] = time.time() - LAUNCHED
                out["compile_wait_wall_s"] = compile_wait[0]
        m = torch.neuron.metrics()
        out |= {
            "first_step_wall_s": reals[0],
            "steady_step_wall_s": min(reals[1:]),
            "ttfs_sim_s": walls[0] / 1e9,
            "steady_step_sim_us": (walls[-1] - walls[-2]) / 1e3,
            "compile_wait_sim_s": m["compile_wait_ns"] / 1e9,
            "executables_compiled": m["executables_compiled"],
            "executables_fetched": m["executables_fetched"],
            "fused_compiles_requested": m["fused_compiles_requested"],
            "walls_ns": walls,
            "reals_s": reals,
            "flops": flops,
            "hbm_peak": torch.neuron.max_memory_allocated(),
            "launches": m["launches"],
            "collectives": m["collectives"],
        }
    except torch.OutOfMemoryError as e:
        out["error"] = f"OutOfMemoryError: {str(e).splitlines()[0][:200]}"
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
