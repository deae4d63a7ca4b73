"""Compiled mode's prepared regions (client/modes/prepared.py): a region traced once as one
fused graph replays its later calls without tracing, with the values, simulated time,
launches and memory of a traced call; a call it was not prepared for is traced."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from trnsim.client.modes import compiled

from tests.client.differential import fresh_core

TRIES = compiled.PREPARE_TRIES
N = "neuron"
STEP_METRICS = ("wall_ns", "device_busy_ns", "host_busy_ns", "launches", "hbm_bytes", "allocations")


class _Sliced(nn.Module):
    """A backward that scatters into zeros it allocates (slice_backward), and a view returned."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(ids))
        return torch.nn.functional.gelu(h[:, 1:]).sum(-1)


def _train(
    tries: int, monkeypatch: pytest.MonkeyPatch, lengths: tuple[int, ...] = (5, 5, 5, 5)
) -> tuple[list[Any], dict[str, int]]:
    """Steps on batches of these lengths (several: compiled with dynamic sizes)."""
    monkeypatch.setattr(compiled, "PREPARE_TRIES", tries)
    torch._dynamo.reset()
    with fresh_core():
        torch.manual_seed(0)
        model = _Sliced().to("neuron")
        forward = torch.compile(model, backend="neuron", dynamic=len(set(lengths)) > 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        batches = [torch.randint(0, 20, (3, n)).to("neuron") for n in lengths]
        steps: list[Any] = []
        for ids in batches:
            before = torch.neuron.metrics()
            loss = forward(ids).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item()
            after = torch.neuron.metrics()
            deltas = [after[k] - before[k] for k in STEP_METRICS]
            memory = [torch.neuron.memory_allocated(), torch.neuron.max_memory_allocated()]
            steps.append([value, *deltas, *memory])
        steps.append([p.detach().cpu() for p in model.parameters()])
        return steps, dict(torch.neuron.metrics())


def test_a_replayed_region_is_its_trace_in_values_time_and_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traced, traced_counts = _train(0, monkeypatch)
    replayed, counts = _train(TRIES, monkeypatch)
    assert traced_counts["compiled_replays"] == 0
    assert counts["compiled_replays"] == counts["compiled_calls"] - 2  # (each graph traced once)
    for a, b in zip(traced[:-1], replayed[:-1], strict=True):
        assert a == b  # loss, simulated times, launches, HBM bytes, allocations, memory
    for a, b in zip(traced[-1], replayed[-1], strict=True):
        assert torch.equal(a, b)


def test_a_region_in_a_shape_bucket_replays_as_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamic sizes: each size of a bucket is traced once, then replayed, in the bucket's
    executable, with the values, simulated time and memory of a traced call."""
    lengths = (5, 7, 5, 7, 5, 7)
    traced, traced_counts = _train(0, monkeypatch, lengths)
    replayed, counts = _train(TRIES, monkeypatch, lengths)
    assert traced_counts["compiled_replays"] == 0
    assert counts["compiled_replays"] == counts["compiled_calls"] - 4  # (each graph, each size)
    assert counts["compiled_bucket_runs"] == traced_counts["compiled_bucket_runs"] > 0
    for a, b in zip(traced[:-1], replayed[:-1], strict=True):
        assert a == b  # loss, simulated times, launches, HBM bytes, allocations, memory
    for a, b in zip(traced[-1], replayed[-1], strict=True):
        assert torch.equal(a, b)


def test_a_call_it_was_not_prepared_for_is_traced() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.ops.aten.relu.default(torch.ops.aten.mm.default(x, w))
        return y, torch.ops.aten.t.default(y)  # (a view of an output)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8, device=N), torch.randn(8, 3, device=N))
    run = compiled._region("forward", gm, None, True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 3, generator=g)
    xs = [
        torch.randn(4, 8, generator=g),
        torch.randn(4, 8, generator=g),
        torch.randn(8, 4, generator=g).t(),  # another layout: not the prepared call
        torch.randn(4, 8, generator=g),
    ]
    with fresh_core():
        replays = []
        for x in xs:
            before = torch.neuron.metrics()["compiled_replays"]
            y, yt = run([x.to("neuron"), w.to("neuron")])
            replays.append(torch.neuron.metrics()["compiled_replays"] - before)
            expected = torch.relu(x @ w)
            assert torch.equal(y.cpu(), expected)
            assert torch.equal(yt.cpu(), expected.t()) and yt.stride() == (1, 3)
        assert replays == [0, 1, 0, 1]  # (the third is traced, and prepared for that layout too)


def test_a_view_made_in_the_region_of_an_argument_sharing_a_storage_replays() -> None:
    """Two arguments on one storage (a packed weight's parts, as nn.MultiheadAttention's
    backward gets them): a view the graph makes of the second is found again within the
    second, not past the end of the first (whose memory alone a replay can see)."""

    def f(x: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.ops.aten.t.default
        return torch.ops.aten.mm.default(x, q), torch.ops.aten.mm.default(t(kv), t(x))

    w = torch.randn(96, 8, device=N)  # (traced on the device, as AOTAutograd's graphs are)
    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8, device=N), w[:32].t(), w[32:].t())
    run = compiled._region("backward", gm, None, True)
    g = torch.Generator().manual_seed(0)
    with fresh_core():
        replays = []
        for _ in range(3):
            x, w = torch.randn(4, 8, generator=g), torch.randn(96, 8, generator=g)
            d = w.to("neuron")
            before = torch.neuron.metrics()["compiled_replays"]
            a, b = run([x.to("neuron"), d[:32].t(), d[32:].t()])
            replays.append(torch.neuron.metrics()["compiled_replays"] - before)
            assert torch.equal(a.cpu(), x @ w[:32].t()) and torch.equal(b.cpu(), w[32:] @ x.t())
        assert replays == [0, 1, 1]


def test_explain_names_a_region_traced_on_every_call() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0).sum() + x  # (a data-dependent size: a cut in the region)

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        model = torch.compile(f, backend="neuron")
        x = torch.randn(6).to("neuron")
        for _ in range(compiled.PREPARE_TRIES + 1):
            assert torch.equal(model(x).cpu(), f(x.cpu()))
    rows = [r["unprepared"] for r in compiled.explain() if "unprepared" in r]
    assert any("test_prepared.py" in r and "traced every call (2 graphs)" in r for r in rows)


def test_a_graph_that_writes_a_cpu_argument_replays_its_cpu_ops() -> None:
    """The graph's CPU ops run in its Python, not through the device: a replay runs them
    first, as a graph of their own, so the CPU argument it writes is written every call."""

    def f(x: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step.add_(1)  # (as an optimizer counts its steps on the CPU)
        return x * step, step * 3  # (a CPU value read by the device, and one returned)

    torch._dynamo.reset()
    with fresh_core():
        run = torch.compile(f, backend="neuron")
        x, step = torch.ones(4).to("neuron"), torch.zeros(())
        for n in range(1, 6):
            y, z = run(x, step)
            assert step.item() == n and z.item() == 3 * n
            assert torch.equal(y.cpu(), torch.full((4,), float(n)))
        assert torch.neuron.metrics()["compiled_replays"] == 4  # (the first call traced)


def test_a_view_of_a_cpu_argument_the_graph_then_writes_keeps_the_region_traced() -> None:
    """The device reads the view where it stands in the graph, before the write; the CPU part
    runs whole before the executable, so its view would show the written value."""

    def f(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        y = x * step[0]
        step.add_(1)
        return y

    torch._dynamo.reset()
    with fresh_core():
        run = torch.compile(f, backend="neuron")
        x, step = torch.ones(4).to("neuron"), torch.zeros(1)
        for n in range(4):
            assert torch.equal(run(x, step).cpu(), torch.full((4,), float(n)))
        assert step.item() == 4 and torch.neuron.metrics()["compiled_replays"] == 0


def test_cpu_ops_fed_by_a_device_value_keep_the_region_traced() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.sum().cpu() + 1

    torch._dynamo.reset()
    with fresh_core():
        run = torch.compile(f, backend="neuron")
        for n in range(4):
            y, z = run(torch.full((4,), float(n)).to("neuron"))
            assert z.item() == 4 * n + 1 and torch.equal(y.cpu(), torch.full((4,), 2.0 * n))
        assert torch.neuron.metrics()["compiled_replays"] == 0
        why = [e["unprepared"] for e in torch.neuron.compiled_explain() if "unprepared" in e]
        assert any("from a device value" in w for w in why), why


def _adam(tries: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, int]]:
    """torch.optim.Adam's step compiled, its step counts on the CPU (capturable=False)."""
    monkeypatch.setattr(compiled, "PREPARE_TRIES", tries)
    torch._dynamo.reset()
    with fresh_core():
        g = torch.Generator().manual_seed(0)
        params = [nn.Parameter(torch.randn(5, 3, generator=g).to("neuron")) for _ in range(2)]
        opt = torch.optim.Adam(params, lr=0.1)
        step = torch.compile(opt.step, backend="neuron")
        steps: list[Any] = []
        for _ in range(4):
            for p in params:
                p.grad = torch.randn(5, 3, generator=g).to("neuron")
            before = torch.neuron.metrics()
            step()
            torch.neuron.synchronize()
            after = torch.neuron.metrics()
            steps.append([after[k] - before[k] for k in STEP_METRICS])
        steps.append([p.detach().cpu() for p in params] + [opt.state[p]["step"] for p in params])
        return steps, dict(torch.neuron.metrics())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (dynamo meets jit.script_method)
def test_a_compiled_adam_step_replays_as_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    traced, traced_counts = _adam(0, monkeypatch)
    replayed, counts = _adam(TRIES, monkeypatch)
    assert traced_counts["compiled_replays"] == 0 and counts["compiled_replays"] == 3
    assert traced[:-1] == replayed[:-1]  # simulated times, launches, HBM bytes, allocations
    for a, b in zip(traced[-1], replayed[-1], strict=True):
        assert torch.equal(a, b)  # parameters and step counts
    assert [int(s) for s in replayed[-1][2:]] == [4, 4]
