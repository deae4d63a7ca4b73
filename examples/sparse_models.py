"""Sparse tensors on the simulated chip: a DLRM-style recommender (sparse embedding gradients,
SparseAdam) and a two-layer graph convolutional network (a sparse adjacency matrix,
torch.sparse.mm), each trained on the CPU and on neuron in eager, adaptive and compiled mode.

    python examples/sparse_models.py [--steps 5]

Prints each model's losses per mode, the largest parameter difference from the CPU after
training, and the sparse ops each neuron run launched (each one launch, priced by the
sparse cost model: indirect DMA over the nonzeros).
"""

from __future__ import annotations

import argparse
import copy
import os
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")  # steady state

import torch
from torch import nn

MODES = ("cpu", "eager", "adaptive", "compiled")


class DLRM(nn.Module):
    """Bottom MLP over dense features, an embedding table per categorical feature and a
    pooled multi-hot one (EmbeddingBag), their pairwise dot products, a top MLP: the shape of
    Meta's DLRM, at toy size. The tables' gradients are sparse (sparse=True)."""

    def __init__(self, dense: int = 4, tables: int = 3, rows: int = 100, dim: int = 8) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(rows, dim, sparse=True) for _ in range(tables))
        self.bag = nn.EmbeddingBag(rows // 2, dim, mode="sum", sparse=True)
        self.bottom = nn.Sequential(nn.Linear(dense, dim), nn.ReLU())
        features = tables + 2
        pairs = features * (features - 1) // 2
        self.top = nn.Sequential(nn.Linear(dim * features + pairs, 16), nn.ReLU(), nn.Linear(16, 1))
        self.features = features

    def forward(
        self, dense: torch.Tensor, ids: torch.Tensor, bag: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        looked_up = [table(ids[:, i]) for i, table in enumerate(self.embeddings)]
        t = torch.stack([self.bottom(dense), *looked_up, self.bag(bag, offsets)], 1)
        dots = torch.bmm(t, t.transpose(1, 2))
        upper = torch.triu_indices(self.features, self.features, 1, device=t.device)
        z = torch.cat([t.flatten(1), dots[:, upper[0], upper[1]]], 1)
        return self.top(z).squeeze(1)

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [*self.embeddings.parameters(), *self.bag.parameters()]


class GCN(nn.Module):
    """Kipf and Welling's graph convolutional network: two layers of A @ (X W), A the
    normalised adjacency matrix with self loops, sparse."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(features, hidden)
        self.layer2 = nn.Linear(hidden, classes)

    def forward(self, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.sparse.mm(adjacency, self.layer1(x)))
        return torch.sparse.mm(adjacency, self.layer2(h))


def dlrm_data(batch: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    hot = 40
    return {
        "dense": torch.randn(batch, 4, generator=g),
        "ids": torch.randint(0, 100, (batch, 3), generator=g),
        "bag": torch.randint(0, 50, (hot,), generator=g),
        "offsets": torch.arange(0, hot, hot // batch)[:batch],
        "clicks": torch.rand(batch, generator=g).round(),
    }


def graph_data(nodes: int = 30, edges: int = 90) -> dict[str, torch.Tensor]:
    """A random undirected graph: its normalised adjacency D^-1/2 (A + I) D^-1/2 (sparse COO,
    coalesced), node features and labels."""
    g = torch.Generator().manual_seed(0)
    pairs = torch.randint(0, nodes, (2, edges), generator=g)
    loops = torch.arange(nodes).repeat(2, 1)
    index = torch.cat([pairs, pairs.flip(0), loops], 1)
    degree = torch.zeros(nodes).index_add_(0, index[0], torch.ones(index.shape[1]))
    weights = (degree[index[0]] * degree[index[1]]).rsqrt()
    adjacency = torch.sparse_coo_tensor(index, weights, (nodes, nodes)).coalesce()
    return {
        "adjacency": adjacency,
        "x": torch.randn(nodes, 12, generator=g),
        "labels": torch.randint(0, 4, (nodes,), generator=g),
    }


def train_dlrm(
    model: DLRM, data: dict[str, torch.Tensor], device: str, mode: str, steps: int
) -> tuple[list[float], nn.Module]:
    """SparseAdam on the tables, Adam on the MLPs, binary cross-entropy on clicks."""
    model = copy.deepcopy(model).to(device)
    d = {k: v.to(device) for k, v in data.items()}
    forward = _compiled(model, device, mode)
    sparse = model.sparse_parameters()
    dense = [p for p in model.parameters() if all(p is not q for q in sparse)]
    optimizers = [torch.optim.SparseAdam(sparse, lr=0.01), torch.optim.Adam(dense, lr=0.01)]
    losses = []
    for _ in range(steps):
        for opt in optimizers:
            opt.zero_grad()
        logits = forward(d["dense"], d["ids"], d["bag"], d["offsets"])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, d["clicks"])
        loss.backward()
        for opt in optimizers:
            opt.step()
        losses.append(loss.item())
    return losses, model


def train_gcn(
    model: GCN, data: dict[str, torch.Tensor], device: str, mode: str, steps: int
) -> tuple[list[float], nn.Module]:
    """SGD on node classification over the whole graph."""
    model = copy.deepcopy(model).to(device)
    d = {k: v.to(device) for k, v in data.items()}
    forward = _compiled(model, device, mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(forward(d["adjacency"], d["x"]), d["labels"])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _compiled(model: nn.Module, device: str, mode: str) -> Callable[..., Any]:
    if device == "neuron":
        torch.neuron.set_eager_mode("eager" if mode == "compiled" else mode)
    return torch.compile(model, backend="neuron") if mode == "compiled" else model


def worst_difference(a: nn.Module, b: nn.Module) -> float:
    """The largest difference between two models' parameters and buffers."""
    ours, theirs = a.state_dict(), b.state_dict()
    return max(float((ours[k].cpu() - theirs[k].cpu()).abs().max()) for k in ours)


def compare(
    name: str,
    train: Callable[..., tuple[list[float], nn.Module]],
    model: nn.Module,
    data: dict[str, torch.Tensor],
    steps: int,
) -> dict[str, Any]:
    """The model trained in every mode; per mode its losses, its worst parameter difference
    from the CPU, and the sparse ops it launched."""
    cpu_losses, cpu_model = train(model, data, "cpu", "cpu", steps)
    rows: dict[str, Any] = {"cpu": (cpu_losses, 0.0, 0)}
    for mode in MODES[1:]:
        torch._dynamo.reset()
        before = torch.neuron.metrics()["sparse_ops"]
        losses, trained = train(model, data, "neuron", mode, steps)
        sparse_ops = torch.neuron.metrics()["sparse_ops"] - before
        rows[mode] = (losses, worst_difference(trained, cpu_model), sparse_ops)
    torch.neuron.set_eager_mode("eager")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per mode")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    torch.manual_seed(0)
    runs = {
        "DLRM": compare("DLRM", train_dlrm, DLRM(), dlrm_data(), args.steps),
        "GCN": compare("GCN", train_gcn, GCN(12, 16, 4), graph_data(), args.steps),
    }
    for name, rows in runs.items():
        print(f"{name}:")
        print(f"  {'mode':9} {'worst |param - cpu|':>20} {'sparse ops':>10}  losses")
        for mode, (losses, worst, ops) in rows.items():
            shown = " ".join(f"{v:.6f}" for v in losses)
            print(f"  {mode:9} {worst:20.3e} {ops:10d}  {shown}")


if __name__ == "__main__":
    main()
