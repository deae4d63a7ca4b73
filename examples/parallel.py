"""What train_ddp.py, train_fsdp.py and train_tp.py share: the GPT of train_gpt.py trained
on N ranks of the simulated chip, next to one CPU process training the same model on the
same global batch.

Each rank drives one simulated NeuronCore (LOCAL_RANK picks it). Rank 0 prints, per step,
the CPU loss, the parallel loss and their relative difference, and the step's simulated
time beside the device's compute and collective busy time and the compute time that ran
while a collective did (from the timeline): when the step takes less than compute and
collectives added up, communication was hidden behind compute. At the end the parameters are compared
with the CPU run's. The exit status is 1 if the losses or parameters are not within
tolerance.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections.abc import Callable
from datetime import timedelta

os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")  # steady state, as train_gpt.py

import torch
import torch.distributed as dist
from torch import nn
from train_gpt import GPT, GPTConfig, make_batches

LOSS_RTOL = 1e-4  # float32, reductions split differently across ranks than on one CPU
PARAM_ATOL = 1e-3  # AdamW: a near-zero gradient of other rounding moves a weight by up to lr
Wrap = Callable[[nn.Module, int], nn.Module]  # (model on neuron, world size) -> parallel model


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="global batch (all ranks)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--json", help="rank 0 writes its numbers here")
    return parser.parse_args()


def train_cpu(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    for x, y in batches:
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def full(t: torch.Tensor) -> torch.Tensor:
    """A parameter as one CPU tensor (a sharded DTensor is gathered first)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu()


def run(
    name: str, wrap: Wrap, split_batch: bool, description: str, foreach: bool | None = None
) -> None:
    """Trains with `wrap`'s parallelism: the global batch is split across ranks when
    split_batch (data parallel), else every rank sees all of it (tensor parallel)."""
    args = parse_args(description)
    dist.init_process_group("neuron", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must divide by the {world} ranks")
    cfg = GPTConfig(n_layer=args.layers, n_embd=args.embd)
    torch.manual_seed(0)
    cpu_model = GPT(cfg)
    model = wrap(copy.deepcopy(cpu_model).to("neuron"), world)
    batches = make_batches(cfg, args.steps, args.batch)
    cpu_losses = train_cpu(cpu_model, batches) if rank == 0 else []

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=foreach)
    rows = args.batch // world
    losses: list[float] = []
    steps: list[dict[str, int]] = []
    before = torch.neuron.metrics()
    for x, y in batches:
        if split_batch:
            x, y = x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
        loss = model(x.to("neuron"), y.to("neuron"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        if split_batch:
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())  # (a sync point: the step's work is all done)
        after = torch.neuron.metrics()
        steps.append(
            {
                k: after[k] - before[k]
                for k in (
                    "wall_ns",
                    "device_busy_ns",
                    "collective_busy_ns",
                    "collective_overlap_ns",
                )
            }
        )
        before = after

    params = [full(p) for p in model.parameters()]
    if rank != 0:
        dist.destroy_process_group()
        return
    mode = torch.neuron.get_eager_mode()
    print(
        f"{name}: {world} ranks, {mode} mode, global batch {args.batch}, GPT {sum(p.numel() for p in params)} parameters"
    )
    print(
        f"{'step':>4} {'cpu loss':>10} {name + ' loss':>10} {'rel diff':>9} {'step us':>9} {'compute us':>11} {'comm us':>8} {'overlapped us':>14}"
    )
    worst = 0.0
    for i, (c, p, s) in enumerate(zip(cpu_losses, losses, steps, strict=True)):
        rel = abs(c - p) / max(abs(c), 1e-12)
        worst = max(worst, rel)
        compute = s["device_busy_ns"] - s["collective_busy_ns"]
        comm = s["collective_busy_ns"]
        overlap = s["collective_overlap_ns"]
        print(
            f"{i:>4} {c:>10.6f} {p:>10.6f} {rel:>9.1e} {s['wall_ns'] / 1e3:>9.1f} {compute / 1e3:>11.1f} {comm / 1e3:>8.1f} {overlap / 1e3:>14.1f}"
        )
    cpu_params = [q.detach() for q in cpu_model.parameters()]
    param_diff = max(float((a - b).abs().max()) for a, b in zip(params, cpu_params, strict=True))
    ok = worst <= LOSS_RTOL and param_diff <= PARAM_ATOL
    print(
        f"{name}: largest relative loss difference from CPU {worst:.2e}, largest parameter "
        f"difference {param_diff:.2e} ({'within' if ok else 'OUTSIDE'} tolerance {LOSS_RTOL:g} / {PARAM_ATOL:g})"
    )
    last = steps[-1]
    compute = last["device_busy_ns"] - last["collective_busy_ns"]
    comm = last["collective_busy_ns"]
    relation = "<" if last["wall_ns"] < compute + comm else ">="
    print(
        f"{name}: last step {last['wall_ns'] / 1e3:.1f} us simulated {relation} compute "
        f"{compute / 1e3:.1f} us + collectives {comm / 1e3:.1f} us = {(compute + comm) / 1e3:.1f} us; "
        f"{last['collective_overlap_ns'] / 1e3:.1f} us of compute ran while collectives did"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "cpu": cpu_losses,
                    "losses": losses,
                    "steps": steps,
                    "param_diff": param_diff,
                    "ok": ok,
                },
                f,
            )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)
