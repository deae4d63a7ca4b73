"""The C++ door (client/door/fast.py): warm eager calls served without the Python door give
the values, counters, simulated time and memory the Python door gives, and the calls it must
not serve (recording modes, shape-only runs) still reach Python."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from trnsim.client.core import runtime
from trnsim.client.door import fast

from tests.client.differential import fresh_core

pytestmark = pytest.mark.skipif(
    fast.module() is None, reason="the C++ door is not built here (NEURON_FAST_DOOR=off?)"
)


def _program() -> list[torch.Tensor]:
    """A few training steps of a small MLP, on ops the door serves (mm, mul, add, relu and
    their backward, views, sum over dims, floats, in-place mul_ and add_, layer_norm and
    topk with several outputs, empty tensors and copies between neuron tensors: clone,
    contiguous; arange, cat, stack and indexing) and ops it does not (the optimizer's
    foreach updates)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).to("neuron")
    x = torch.randn(5, 8).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(3):
        y = model(x)
        h = y.detach().clone().mul_(2).add_(y.detach())  # (in-place ops, served too)
        top = y.topk(2, dim=1).values.sum() + y.t().contiguous()[1].sum()
        strided = torch.empty_strided((4, 5), (1, 4), device="neuron").copy_(y.t())
        rows = torch.arange(1, 5, 2, device="neuron")  # (a factory, and lists of tensors)
        picked = torch.cat([y[rows], torch.stack([y[0], y[4]])]).sum()
        top = top + strided.sum() + picked
        loss = (y * 0.5).sum(dim=1, keepdim=True).mean() + y.t().pow(2).sum() + h.sum() + top
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach().cpu())
    out.extend(p.detach().cpu() for p in model.parameters())
    return out


def _run(
    program: Callable[[], list[torch.Tensor]], served: bool
) -> tuple[list[torch.Tensor], dict[str, object], dict[str, int]]:
    before = fast.stats()
    with fresh_core() as rt, contextlib.nullcontext() if served else fast.python_door_only():
        values = program()
        rt.flush("sync")
        metrics: dict[str, object] = dict(torch.neuron.metrics())
        metrics["memory_allocated"] = torch.neuron.memory_allocated()
        metrics.update(rt.memory.memory_stats())  # (the allocator's: OOMs, flushes...)
    after = fast.stats()
    return values, metrics, {k: after[k] - before[k] for k in after}


def _same_as_the_python_door(program: Callable[[], list[torch.Tensor]]) -> dict[str, int]:
    """The program through the C++ door and through the Python door alone: the same values
    bit for bit, and every counter, simulated clock, launch, HBM figure and allocator
    statistic equal. The C++ door's counts of served and handed-on calls."""
    python_values, python_metrics, python_door = _run(program, served=False)
    values, metrics, door = _run(program, served=True)
    assert python_door["served"] == 0
    for got, want in zip(values, python_values, strict=True):
        assert torch.equal(got, want)
    changed = {
        k: (metrics[k], python_metrics[k]) for k in metrics if metrics[k] != python_metrics[k]
    }
    assert not changed
    return door


def test_calls_served_in_cpp_equal_the_python_doors_bit_for_bit() -> None:
    door = _same_as_the_python_door(_program)
    assert door["served"] > 50  # (most of the warm calls)


def _errors(*calls: Callable[[], object]) -> list[torch.Tensor]:
    """Each call's error, as its type and message in a tensor of bytes (compared above)."""
    out = []
    for call in calls:
        try:
            call()
            said = "no error"
        except Exception as e:  # noqa: BLE001
            said = f"{type(e).__name__}: {str(e).split(' (issued at')[0]}"
        out.append(torch.tensor(list(said.encode())))
    return out


def _edges() -> list[torch.Tensor]:
    """Calls at the door's edges: 'neuron' and 'neuron:0' (two signatures in Python), an
    in-place op refused while collectives are awaited (nothing written twice), an in-place
    op failing halfway (index_put_ out of range: written once, the Python door's error),
    arguments that overlap (PyTorch's error), batch norm's running statistics (written
    arguments: not served), layer_norm's backward with output masks (None outputs), gelu's
    approximate (a string), and running out of HBM in a served empty (counted once)."""
    torch.manual_seed(0)
    rt = runtime.get()
    out = []
    for device in ("neuron:0", "neuron:0", "neuron", "neuron"):
        out.append(torch.arange(7, device=device).cpu())
    x, y = torch.ones(4).to("neuron"), torch.ones(4).to("neuron")
    for _ in range(2):
        x.add_(y)
    rt.awaiting[1] = 10**18
    x.add_(y)
    rt.awaiting.clear()
    z, v = torch.zeros(4).to("neuron"), torch.ones(2).to("neuron")
    good, bad = torch.tensor([0, 1]).to("neuron"), torch.tensor([0, 7]).to("neuron")
    for _ in range(2):
        z.index_put_((good,), v, accumulate=True)
    w = torch.arange(6.0).to("neuron")
    for _ in range(2):
        w[1:].copy_(x[:3].repeat(2)[:5])
    out += _errors(lambda: z.index_put_((bad,), v, accumulate=True), lambda: w[1:].copy_(w[:-1]))
    out += [x.cpu(), z.cpu(), w.cpu()]
    bn = torch.nn.BatchNorm1d(4).to("neuron")
    for _ in range(3):
        out.append(bn(torch.randn(8, 4).to("neuron")).detach().cpu())
    out += [bn.running_mean.cpu(), bn.running_var.cpu()]
    g, h = torch.randn(4, 16).to("neuron"), torch.randn(4, 16).to("neuron")
    _, mean, rstd = torch.native_layer_norm(h, [16], None, None, 1e-5)
    for mask in ([True, False, False], [False, True, True], [True, True, True]) * 2:
        grads = torch.ops.aten.native_layer_norm_backward(g, h, [16], mean, rstd, h[0], h[1], mask)
        out += [t.cpu() if t is not None else torch.tensor([]) for t in grads]  # (Nones)
    for approximate in ("tanh", "none", "tanh"):  # (a string argument)
        out.append(torch.nn.functional.gelu(h, approximate=approximate).cpu())
    for _ in range(2):
        torch.empty(4, device="neuron")
    rt.memory.set_memory_limit(rt.memory.reserved_bytes() + (4 << 20))
    kept = []
    out += _errors(lambda: [kept.append(torch.empty(1 << 18, device="neuron")) for _ in range(64)])
    rt.memory.set_memory_limit(rt.memory.memory_capacity())
    return out


def test_calls_at_the_doors_edges_equal_the_python_doors() -> None:
    _same_as_the_python_door(_edges)


def test_memory_of_a_served_output_goes_back_when_it_dies() -> None:
    with fresh_core():
        a, b = torch.randn(64).to("neuron"), torch.randn(64).to("neuron")
        torch.add(a, b)  # (the Python door, then offered)
        base = torch.neuron.memory_allocated()
        served = fast.stats()["served"]
        c = torch.add(a, b)
        assert fast.stats()["served"] == served + 1
        assert torch.neuron.memory_allocated() == base + 512
        assert torch.equal(c.cpu(), a.cpu() + b.cpu())
        x = torch.randn(4, 16).to("neuron")
        torch.native_layer_norm(x, [16], None, None, 1e-5)  # (three outputs: offered)
        base, served = torch.neuron.memory_allocated(), fast.stats()["served"]
        out, mean, _rstd = torch.native_layer_norm(x, [16], None, None, 1e-5)
        assert fast.stats()["served"] == served + 1
        assert torch.neuron.memory_allocated() == base + 3 * 512  # (512-byte blocks)
        del out, mean
        assert torch.neuron.memory_allocated() == base + 512
        del c
        assert torch.neuron.memory_allocated() == base


def test_adaptive_mode_takes_every_call_through_the_python_door() -> None:
    with fresh_core() as rt:
        a = torch.randn(16).to("neuron")
        for _ in range(2):
            torch.relu(a * 2)  # (served from the second call on, in eager mode)
        rt.set_mode("adaptive")
        served = fast.stats()["served"]
        recorded = torch.neuron.metrics()["ops_recorded"]
        for _ in range(3):
            r = torch.relu(a * 2)
        assert torch.equal(r.cpu(), torch.relu(a.cpu() * 2))
        assert fast.stats()["served"] == served
        assert torch.neuron.metrics()["ops_recorded"] > recorded


def test_a_fresh_process_whose_first_op_is_an_empty_counts_as_the_python_door() -> None:
    """The first neuron op of a process goes to Python (which registers its direct kernels:
    mm's own, not its composite's), even when a runtime exists already and the C++ door
    could make that empty."""
    code = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.empty(4, 4, device='neuron')\n"
        "w = w @ w\n"
        "m = torch.neuron.metrics()\n"
        "print(m['ops_dispatched'], m['hbm_bytes'])\n"
    )
    assert _printed(code, door="on") == _printed(code, door="off")


def test_without_the_cpp_door_every_op_takes_the_python_door() -> None:
    code = (
        "import torch\n"
        "from trnsim.client.door import fast\n"
        "a = torch.ones(4, device='neuron')\n"
        "assert fast.module() is None and fast.stats() == {}\n"
        "print((a + a).cpu().tolist())\n"
    )
    assert _printed(code, door="off") == "[2.0, 2.0, 2.0, 2.0]"


def _printed(code: str, door: str) -> str:
    """What a fresh process running `code` prints, with NEURON_FAST_DOOR=door."""
    env = dict(os.environ, NEURON_FAST_DOOR=door, NEURON_COMPILE_DAEMON="off")
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_served_call_reads_its_inputs_where_python_does() -> None:
    """An op given a storage offset reads from the input's storage, not its first element."""
    with fresh_core():
        x = torch.arange(8.0)
        t = x.to("neuron")[1:]
        want = torch.as_strided_copy(x[1:], (3,), (1,), 2)
        served = fast.stats()["served"]
        for _ in range(3):
            got = torch.as_strided_copy(t, (3,), (1,), 2)
            assert torch.equal(got.cpu(), want)
        assert fast.stats()["served"] >= served + 2


def test_allocations_the_door_does_not_make_get_the_python_doors_answer() -> None:
    """empty on another device index, in pinned memory or in channels_last, and one larger
    than the door makes (its HBM is taken first, in Python: out of memory before the host
    allocates) are made, or refused, by the Python door."""
    with fresh_core() as rt:
        for _ in range(2):
            torch.empty(4, device="neuron")
        with pytest.raises(RuntimeError, match="pin_memory is not available"):
            torch.empty(4, device="neuron", pin_memory=True)
        with pytest.raises((RuntimeError, ValueError), match="neuron:1"):
            torch.empty(4, device="neuron:1")
        nhwc = torch.empty(2, 3, 4, 5, device="neuron", memory_format=torch.channels_last)
        assert nhwc.stride() == (60, 1, 15, 3)
        rt.memory.set_memory_limit(32 << 20)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(128 << 20, dtype=torch.uint8, device="neuron")


def test_autograd_accumulates_gradients_in_place_as_on_the_cpu() -> None:
    """A device tensor's storage holds no reference a real device's would not (no Python
    storage object per output): autograd, which adds a gradient into the one it holds in
    place only when it holds the last reference to its storage, does so as on the CPU, in
    both doors (before, every accumulation was out of place: one allocation more)."""
    from torch.autograd import profiler

    def adds(device: str) -> list[str]:
        w = torch.ones(4, 3, device=device, requires_grad=True)
        x = torch.ones(2, 4, device=device)
        for _ in range(3):  # (warm: the door serves the last ones)
            loss = (x @ w).sum() + (x @ w).pow(2).sum() + w.sum()
            with profiler.profile() as prof:
                loss.backward()
            w.grad = None
        names = [e.name for e in prof.function_events if e.name.startswith("aten::add")]
        # (on neuron an op is recorded twice: the neuron call, and the CPU kernel computing it)
        return [n for k, n in enumerate(names) if k == 0 or names[k - 1] != n]

    cpu = adds("cpu")
    assert cpu == ["aten::add", "aten::add_"], cpu
    with fresh_core():
        assert adds("neuron") == cpu
    with fresh_core(), fast.python_door_only():
        assert adds("neuron") == cpu
