"""Adaptive eager mode: recorded graphs, fused when they recur; results equal eager mode."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from train_gpt import GPT, GPTConfig, make_batches, train
from trnsim.client.core import env, runtime

from tests.client.differential import assert_modes_agree, wait_for_fused_compiles

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def adaptive():
    """This process's runtime in adaptive mode for the test (a fresh simulated core)."""
    saved = runtime._runtime
    runtime._runtime = runtime.Runtime(replace(env.read(), eager_mode="adaptive"))
    try:
        yield runtime._runtime
    finally:
        runtime._runtime.close()
        runtime._runtime = saved


def test_gpt_trains_bit_identically_and_runs_fused(adaptive):
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    eager_model = copy.deepcopy(model)
    batches = make_batches(cfg, 12, 8)
    saved, runtime._runtime = runtime._runtime, None
    try:
        runtime._runtime = saved_eager = runtime.Runtime(replace(env.read(), eager_mode="eager"))
        eager_losses = train(eager_model, batches, "neuron")
    finally:
        runtime._runtime = saved
    assert saved_eager.recorder is None
    counts = []

    def on_step(step: int, loss: float) -> None:
        wait_for_fused_compiles(adaptive)
        counts.append(dict(adaptive.metrics.counts))

    losses = train(model, batches, "neuron", on_step=on_step)
    assert losses == eager_losses, "bit-for-bit in fp32"
    for a, b in zip(eager_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    late = {k: counts[-1][k] - counts[5][k] for k in ("ops_recorded", "fused_ops", "op_by_op_ops")}
    assert late["fused_ops"] >= 0.9 * late["ops_recorded"], late
    m = adaptive.metrics.counts
    assert m["graphs_formed"] > 0 and m["fused_compiles_ready"] > 0 and m["internal_outputs"] > 0
    # Every step after the first ends its graph at .item() (the first step runs each new
    # op signature on its own, to check its outputs, before recording it).
    assert m["cut_sync"] >= 11 and m["cut_first_sight"] > 0


def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    )


def _train_cnn(model, device, steps=6):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 3, 16, 16, generator=g).to(device)
        y = torch.randint(0, 5, (4,), generator=g).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_cnn_trains_like_eager(adaptive):
    torch.manual_seed(1)
    cpu = _cnn()
    dev = copy.deepcopy(cpu).to("neuron")
    assert _train_cnn(dev, "neuron") == _train_cnn(cpu, "cpu")
    assert adaptive.metrics.counts["ops_recorded"] > 0


def _views_and_in_place(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 8, generator=g).to(device)
    w = torch.randn(8, 8, generator=g).to(device)
    out = []
    for _ in range(4):
        y = x @ w
        v = y[:, 2:6]  # a view of a recorded output
        v.mul_(2.0)  # in place through the view
        t = y.t()
        t[0].add_(1.0)
        z = torch.zeros_like(y)
        z[1:3] = y[1:3].relu()  # index_put / copy into a slice
        s = (z + y).sum(dim=1, keepdim=True)
        x = x + s * 0.01
        out.append(x.clone())
    return [o.cpu() for o in out]


def test_views_in_place_and_aliasing_match_eager(adaptive):
    expected = _views_and_in_place("cpu")
    got = _views_and_in_place("neuron")
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
    assert (
        adaptive.metrics.counts["fused_executions"] + adaptive.metrics.counts["op_by_op_graphs"] > 0
    )


def test_a_failed_fused_compile_keeps_running_op_by_op(adaptive, monkeypatch):
    real = adaptive.compiler.compile

    def failing(job, background=False):
        if len(job.graph.nodes) > 1:
            raise RuntimeError("injected: the fused compile failed")
        return real(job, background)

    monkeypatch.setattr(adaptive.compiler, "compile", failing)
    x = torch.randn(64).to("neuron")
    results = []
    for _ in range(6):
        y = ((x * 2 + 1).relu() * 3).sum()
        results.append(y.item())
        wait_for_fused_compiles(adaptive)
    expected = ((x.cpu() * 2 + 1).relu() * 3).sum().item()
    assert results == [expected] * 6
    m = adaptive.metrics.counts
    assert m["fused_compiles_failed"] == 1 and m["fused_executions"] == 0
    assert m["op_by_op_graphs"] == 5, "the first time, each op ran on its own (first sight)"


def test_errors_surface_at_the_next_sync_with_the_ops_line(adaptive):
    x = torch.ones(3, device="neuron")
    for bad in (False, True):  # the first time, each op runs on its own (first sight)
        idx = torch.tensor([0, 9 if bad else 1]).to("neuron")
        y = x * 2
        z = y.t()[idx]  # recorded the second time: fails only when the graph runs  # noqa: F841
        if not bad:
            torch.neuron.synchronize()
    with pytest.raises(IndexError) as e:
        (y + 1).cpu()
    assert "aten::index" in str(e.value) and "test_adaptive.py" in str(e.value)


SCRIPT = """
import json, sys, time, torch
sys.path.insert(0, {examples!r})
from train_gpt import GPT, GPTConfig, make_batches, train
from trnsim.client.core import runtime
torch.manual_seed(0)
cfg = GPTConfig(n_layer=1)
model = GPT(cfg)
def pause(step, loss):
    time.sleep(0.3)  # real time for background compiles to come back
train(model, make_batches(cfg, 5, 4), "neuron", on_step=pause)
rt = runtime.get()
print(json.dumps({{"counts": rt.metrics.counts, "graphs": len(rt.recorder.graphs)}}))
"""


def test_second_process_with_a_warm_daemon_runs_fused_from_its_first_sight(tmp_path):
    from tests.daemon.helpers import start_daemon

    root = Path(os.path.realpath("/tmp")) / f"trn-ad-{os.getpid()}"
    d = start_daemon(root, "--workers", "2")
    try:
        env_vars = {**os.environ, "NEURON_EAGER": "adaptive", "NEURON_COMPILE_DAEMON": d.address}
        code = SCRIPT.format(examples=str(REPO / "examples"))
        runs = []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, "-c", code],
                check=False,
                capture_output=True,
                text=True,
                env=env_vars,
                timeout=300,
            )
            assert out.returncode == 0, out.stderr[-2000:]
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        second = runs[1]["counts"]
        assert second["fused_graphs_fetched"] > 0
        # A graph the first run compiled runs fused at its first sight (the daemon's cache is
        # asked first); each other ran op by op once at most, and fused from then on.
        assert second["op_by_op_graphs"] < runs[1]["graphs"], runs[1]
        assert second["fused_executions"] > 0
    finally:
        d.stop()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def _train_mlp(model, device, steps=8):
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(64, 256, generator=g), torch.randn(64, 10, generator=g)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if device == "neuron":
            wait_for_fused_compiles(runtime.get())
    return losses


def test_mlp_with_a_fused_backward_matches_eager(adaptive):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.LayerNorm(512),
        torch.nn.Linear(512, 10),
    )
    expected = _train_mlp(copy.deepcopy(model), "cpu")
    assert _train_mlp(model.to("neuron"), "neuron") == expected
    assert adaptive.metrics.counts["fused_executions"] > 0


def _repeat(fn, times: int = 4) -> list:
    """Runs fn several times so its graph runs op by op first and fused after."""
    out = []
    for _ in range(times):
        out.append(fn())
        wait_for_fused_compiles(runtime.get())
    return out


def test_cases_a_review_found(adaptive):
    a = torch.ones(4, device="neuron")

    def reseeded():
        torch.neuron.manual_seed(1)
        r1 = torch.rand(4, device="neuron") + a
        torch.neuron.manual_seed(1)
        r2 = torch.rand(4, device="neuron") + a
        return torch.equal(r1.cpu(), r2.cpu())

    assert all(_repeat(reseeded))

    def dead_after_in_place():
        x = torch.ones(4, device="neuron")
        x.mul_(2)
        y = x + 1
        del y
        torch.neuron.synchronize()
        return x.cpu().tolist()

    assert _repeat(dead_after_in_place) == [[2.0] * 4] * 4

    z = torch.randn(3, 3, dtype=torch.complex64)
    zd = z.to("neuron")
    expected = (z * 2).conj() @ (z * 2)
    assert all(
        torch.allclose(r, expected) for r in _repeat(lambda: ((zd * 2).conj() @ (zd * 2)).cpu())
    )

    x = torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3)
    ref = torch.nn.functional.conv2d(x, w).relu()[:, :, 0].sum(1)
    xd, wd = x.to("neuron"), w.to("neuron")
    got = _repeat(lambda: torch.nn.functional.conv2d(xd, wd).relu()[:, :, 0].sum(1).cpu())
    assert all(torch.equal(r, ref) for r in got)

    def foreach_after_twins():
        p = torch.ones(4, device="neuron")
        t1, t2 = p * 2, p * 2
        torch._foreach_add_([t1], 1.0)
        return t1.cpu().tolist(), t2.cpu().tolist()

    assert _repeat(foreach_after_twins) == [([3.0] * 4, [2.0] * 4)] * 4


def test_batch_norm_running_stats_survive_fusion(adaptive):
    torch.manual_seed(2)
    cpu = torch.nn.BatchNorm1d(4)
    dev = torch.nn.BatchNorm1d(4).to("neuron")
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(8, 4, generator=g)
        cpu(x)
        dev(x.to("neuron"))
        torch.neuron.synchronize()
        wait_for_fused_compiles(adaptive)
    assert torch.equal(dev.running_mean.cpu(), cpu.running_mean)
    assert torch.equal(dev.running_var.cpu(), cpu.running_var)


def test_recorded_ops_read_inputs_as_they_were_when_recorded(adaptive):
    lin = torch.nn.Linear(4, 3).to("neuron")
    x = torch.randn(2, 4)
    expected = torch.nn.functional.linear(x, lin.weight.detach().cpu(), lin.bias.detach().cpu())
    y = lin(x.to("neuron"))
    lin.double()  # swaps every parameter's storage (p.data = ...) before y was computed
    assert y.dtype == torch.float32 and torch.equal(y.cpu(), expected)


def test_only_in_place_out_kernels_write_device_memory_directly():
    from trnsim.simulator.execute import _out_variant

    aten = torch.ops.aten
    assert _out_variant(aten.mm.default) is aten.mm.out
    assert _out_variant(aten.add.Tensor) is aten.add.out
    assert _out_variant(aten.mul.Scalar) is None, "its out= takes a Tensor `other`"
    assert _out_variant(aten.mse_loss.default) is None, "its out= kernel resizes `out`"


# -- regressions: each the smallest op sequence that showed a bug ---------------------------
def test_output_whose_alias_autograd_saved_outlives_the_graph():
    """Llama trained to NaN: a 3-D linear's mm output is aliased beneath the dispatcher
    (_unsafe_view); mul saves that alias for backward; a sync cut the graph before backward.
    The mm output was judged internal (never written), and backward read garbage."""
    w, x = torch.randn(8, 4), torch.randn(2, 3, 4)
    wd, xd = w.to("neuron").requires_grad_(), x.to("neuron")

    def program():
        wd.grad = None
        h = torch.nn.functional.linear(xd, wd)
        loss = (h * h).sum()
        loss.item()  # cuts the graph between forward and backward
        loss.backward()
        return [loss, wd.grad]

    counts = assert_modes_agree(program)
    assert counts["fused_executions"] > 0


def test_ops_whose_meta_outputs_differ_from_the_cpus_run_on_their_own():
    """BatchNorm in eval: the Meta kernel gives save_mean (C,), the CPU kernel (0,).
    Recording handed out the Meta shape and failed at .item() copying the result in."""
    bn = torch.nn.BatchNorm2d(8).eval().to("neuron")
    x = torch.randn(2, 8, 4, 4).to("neuron")

    def program():
        y = bn(x)
        return [y.sum().item(), y]

    assert_modes_agree(program)


def test_embedding_bag_matches_eager():
    weight = torch.randn(10, 3).to("neuron")
    index = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]).to("neuron")
    offsets = torch.tensor([0, 4]).to("neuron")

    def program():
        return torch.nn.functional.embedding_bag(index, weight * 2, offsets, mode="max")

    assert_modes_agree(program)


def _broken_fused_exp(monkeypatch) -> None:
    """exp fails inside fused executables only (a fault of the fused path, injected)."""
    from trnsim.simulator import execute

    real = execute._program

    def fail(*args, **kwargs):
        raise RuntimeError("injected: the fused exp is broken")

    def broken(exe):  # (only executables of several ops are run as a program)
        for step in exe.steps:
            if step.name == "aten::exp.default":
                step.call_op = step.out_op = fail
        return real(exe)

    monkeypatch.setattr(execute, "_program", broken)


def test_a_fused_graph_that_fails_falls_back_to_op_by_op(adaptive, monkeypatch, caplog):
    """A fault of the fused path (injected: exp fails inside fused executables only) costs
    the graph its fusion, not the user's step: inputs the failed run wrote are put back, the
    graph runs op by op from then on, counted and logged once."""
    _broken_fused_exp(monkeypatch)
    x = torch.zeros(4, device="neuron")
    results = []
    for _ in range(6):
        x.add_(1.0)  # written before the failing node: must not be written twice
        results.append(((x.exp() * 2).sum().item(), x.cpu().tolist()))
        wait_for_fused_compiles(adaptive)
    expected = [
        ((torch.full((4,), n + 1.0).exp() * 2).sum().item(), [n + 1.0] * 4) for n in range(6)
    ]
    assert results == expected
    m = adaptive.metrics.counts
    assert m["fused_fallbacks"] == 1 and m["fused_compiles_ready"] == 1
    assert m["fused_executions"] == 0
    assert sum("runs op by op from now on" in r.message for r in caplog.records) == 1


def test_outputs_take_the_declared_layout_in_both_modes():
    """max_unpool2d's CPU kernel lays its output out otherwise than its Meta kernel, which
    adaptive mode hands out before running. Eager mode takes the declared layout too (and the
    op stays fusible), so strides and views of the result agree."""
    x = torch.randn(1, 2, 4, 6)
    pooled, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    pooled = pooled.to(memory_format=torch.channels_last).to("neuron")
    indices = indices.to("neuron")

    def program():
        y = torch.nn.functional.max_unpool2d(pooled * 2, indices, 2)
        return [tuple(y.stride()), y, y.reshape(-1)[:7]]

    assert_modes_agree(program)


def test_a_data_swap_to_the_same_memory_seen_otherwise_is_noticed():
    """`p.data = p.t()` between two recorded reads of p: same data pointer, other strides."""
    w = torch.randn(4, 4)

    def program():
        p = w.to("neuron").requires_grad_()
        before = p * 2
        p.data = p.detach().t()
        return [before, p * 2]

    assert_modes_agree(program)


def test_cpu_scalars_and_indices_are_read_as_they_were_when_the_op_was_issued():
    """A CPU scalar or index tensor the host changes after a recorded op used it: the op
    reads it as it was (as on a device), not as it is when the graph runs."""
    x = torch.ones(4).to("neuron")

    def program():
        s = torch.tensor(2.0)
        y = x * s
        s.add_(1)
        idx = torch.tensor([0, 1])
        z = x.cumsum(0)[idx]
        idx[0] = 3
        return [y, z, x * s]

    assert_modes_agree(program)


@pytest.mark.filterwarnings("ignore")
def test_a_fallback_restores_the_generator_and_expanded_inputs(monkeypatch):
    """The failed fused run drew random numbers and read an expanded view: the rerun op by
    op draws the same numbers, and putting the inputs back does not trip on the view."""
    _broken_fused_exp(monkeypatch)
    w = torch.randn(3).to("neuron")

    def program():
        e = w.expand(4, 3)
        noise = torch.empty(4, 3, device="neuron").uniform_()
        return ((e * 2).exp() * 3 + noise).sum()

    counts = assert_modes_agree(program, repeats=5)
    assert counts["fused_fallbacks"] == 1


def test_graph_inputs_are_typed_as_the_tensors_were_when_read(adaptive):
    """`p.data = ...` to another shape after p was read: the fused graph declares p's input
    as the op saw it."""
    from tests.client.differential import wait_for_fused_compiles

    for _ in range(4):
        q = torch.ones(2, 3, device="neuron")
        y = (q * 2 + 1).sum()
        q.data = torch.zeros(5, device="neuron")
        z = q.zero_().sum()
        assert (y.item(), z.item()) == (18.0, 0.0)
        wait_for_fused_compiles(adaptive)
    graphs = [s for s in adaptive.recorder.graphs.values() if s.loaded is not None]
    inputs = [[tuple(t.shape) for t in s.loaded.executable.graph.inputs] for s in graphs]
    assert any((2, 3) in shapes and (5,) in shapes for shapes in inputs), inputs


def test_switching_to_eager_twice_keeps_the_adaptive_graphs() -> None:
    """eager -> eager -> adaptive finds the graphs adaptive mode had (they were dropped)."""
    from trnsim.client.core import runtime

    rt = runtime.get()
    torch.neuron.set_eager_mode("adaptive")
    try:
        recorder = rt.recorder
        assert recorder is not None
        torch.neuron.set_eager_mode("eager")
        torch.neuron.set_eager_mode("eager")
        torch.neuron.set_eager_mode("adaptive")
        assert rt.recorder is recorder
    finally:
        torch.neuron.set_eager_mode("eager")


def test_a_graph_seen_before_replays_its_trace(adaptive, monkeypatch):
    """The same ops again follow the trace an earlier run recorded: each op is the buffer's
    next step (no op recorded anew, no step added), each graph the same state as before. A
    tensor swapped with `.data` (one the buffer made, or an input) is not the value the step
    reads: those ops are recorded, and the results agree with eager mode."""
    from trnsim.client.modes import tape

    recorded = []
    real = tape.Tape.record
    monkeypatch.setattr(
        tape.Tape, "record", lambda self, *a: recorded.append(a[0].name) or real(self, *a)
    )

    def steps(tree: tape.Step) -> int:
        return 1 + sum(steps(s) for same in tree.children.values() for s in same)

    w = torch.arange(16.0, device="neuron").reshape(4, 4) / 16

    def program(swap: bool = False) -> float:
        x = torch.ones(4, 4, device="neuron")
        y = (x @ w).relu()
        other = y + 1
        if swap:  # (y now points at other's memory: same sizes, another value)
            y.data = other
        z = (y * 2).t().reshape(16)
        return (z + w.reshape(16)).sum().item()

    first = program()  # (ops never run before run on their own first: FIRST_SIGHT)
    assert program() == first
    recorder = adaptive.recorder
    trace, graphs = steps(recorder.tape.root), len(recorder.graphs)
    seen = {id(s): s.history.seen for s in recorder.graphs.values()}
    recorded.clear()
    assert program() == first
    assert recorded == [] and steps(recorder.tape.root) == trace
    assert len(recorder.graphs) == graphs
    assert all(s.history.seen == seen[id(s)] + 1 for s in recorder.graphs.values())
    results = [program(swap=True)]
    assert "aten::mul.Tensor" in recorded
    recorded.clear()
    w.data = w.t().contiguous()  # (an input, now other memory: its reads are recorded)
    results.append(program())
    assert "aten::mm.default" in recorded
    torch.neuron.set_eager_mode("eager")
    try:
        w.data = w.t().contiguous()
        expected = [program(swap=True)]
        w.data = w.t().contiguous()
        expected.append(program())
    finally:
        torch.neuron.set_eager_mode("adaptive")
    assert results == expected
