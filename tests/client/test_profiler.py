"""The profiler: each launch and each instruction of it on its engine, named by its ops and
the user's source lines, in every mode; NEURON_PROFILE writes the trace at exit and
`trnsim profile` prints its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn
from trnsim.client.core import env, profiler, runtime
from trnsim.simulator import trace

from tests.client.differential import wait_for_fused_compiles
from tests.client.test_kernels import scaled_rms_norm

HERE = str(Path(__file__).resolve())


def _line(marker: str) -> str:
    """'<this file>:<line>' of the line ending in `# <marker>`."""
    for k, text in enumerate(Path(HERE).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return f"{HERE}:{k}"
    raise AssertionError(marker)


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = scaled_rms_norm(x, self.w, 1e-5)  # kernel line
        return (y * 2).relu()  # elementwise line


def _instructions(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in events if e["cat"] == trace.INSTRUCTION]


def test_eager_ops_are_launches_with_their_instructions_and_source_lines() -> None:
    x = torch.randn(4, 64, device="neuron")
    with torch.neuron.profile() as prof:
        (x @ x.T).relu()  # eager line
    launches = [e for e in prof.events if e["cat"] == trace.LAUNCH]
    assert [e["name"] for e in launches] == ["aten::mm.default", "aten::relu.default"]
    ins = _instructions(prof.events)
    assert {e["tid"] for e in ins} >= {"tensor", "dma"}
    assert {e["args"]["source"] for e in ins} == {_line("eager line")}  # type: ignore[index]
    # Each instruction lies inside its launch, on the simulated clock.
    mm = launches[0]
    for e in ins:
        if e["args"]["launch"] == "aten::mm.default":  # type: ignore[index]
            assert mm["ts"] <= e["ts"] and e["ts"] + e["dur"] <= mm["ts"] + mm["dur"] + 1e-6  # type: ignore[operator]
    table = prof.summary()
    assert "aten::mm.default" in table and _line("eager line") in table


@pytest.mark.parametrize("mode", ["compiled", "adaptive"])
def test_a_custom_kernel_is_one_instruction_at_its_line_in_fused_graphs(mode: str) -> None:
    saved = runtime._runtime
    if mode == "adaptive":  # (a fresh core whose fused compiles are usable once back)
        settings = replace(env.read(), eager_mode="adaptive", compile_clock=False)
        runtime._runtime = runtime.Runtime(settings)
    try:
        model = _Norm().to("neuron")
        x = torch.randn(8, 64, device="neuron")
        forward = torch.compile(model, backend="neuron") if mode == "compiled" else model
        with torch.no_grad():
            for _ in range(4):  # (adaptive: first sight, op by op, then fused)
                y = forward(x)  # (held: an output nothing reads is never computed)
                torch.neuron.synchronize()
                wait_for_fused_compiles(runtime.get())
            with torch.neuron.profile() as prof:
                y = forward(x)
            del y
    finally:
        if runtime._runtime is not saved:
            runtime._runtime.close()
            runtime._runtime = saved
    launches = [e for e in prof.events if e["cat"] == trace.LAUNCH]
    assert len(launches) == 1 and "graph" in str(launches[0]["name"])
    ins = _instructions(prof.events)
    kernel = [e for e in ins if e["name"] == "trnsim_test::scaled_rms_norm.default"]
    assert len(kernel) == 1 and kernel[0]["tid"] == "vector"
    assert kernel[0]["args"]["source"] == _line("kernel line")  # type: ignore[index]
    sources = {e["args"]["source"] for e in ins if e["name"] == "aten::relu.default"}  # type: ignore[index]
    assert sources == {_line("elementwise line")}


def test_neuron_profile_writes_the_trace_at_exit_and_trnsim_profile_reads_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Linear(16, 4).to("neuron")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                loss = model(torch.randn(8, 16, device="neuron")).pow(2).mean()
                loss.backward()
                opt.step()
            print(loss.item())
            """
        )
    )
    path = tmp_path / "trace.json"
    env = {**os.environ, "NEURON_PROFILE": str(path), "NEURON_COMPILE_DAEMON": "off"}
    out = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert f"profile written to {path}" in out.stderr
    data = json.loads(path.read_text())
    names = {e["name"] for e in data["traceEvents"] if e.get("cat") == trace.LAUNCH}
    assert {"aten::addmm.default", "aten::mm.default"} <= names
    table = subprocess.run(
        [sys.executable, "-m", "trnsim.cli", "profile", str(path), "--top", "5"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    assert "engine time by op" in table.stdout and "train.py:" in table.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    refused = subprocess.run(
        [sys.executable, "-m", "trnsim.cli", "profile", str(bad)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "is not a trnsim profile" in refused.stderr


def test_each_rank_writes_its_own_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert profiler.trace_path("/t/p.json") == "/t/p.json"
    monkeypatch.setenv("RANK", "3")
    assert profiler.trace_path("/t/p.json") == "/t/p-rank3.json"
    assert profiler.trace_path("/t/p{rank}.json") == "/t/p3.json"


def _two_lines(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = (x @ w).relu()  # matmul line
    return (y * 3).sum(dim=1)  # reduce line


def test_dma_time_is_credited_to_the_op_and_line_that_needed_the_data() -> None:
    x, w = torch.randn(64, 64, device="neuron"), torch.randn(64, 64, device="neuron")
    f = torch.compile(_two_lines, backend="neuron")
    f(x, w)  # compiled: one graph, one launch
    with torch.neuron.profile() as prof:
        f(x, w)
    dma = [e for e in _instructions(prof.events) if e["tid"] == "dma"]
    assert dma, "a fused graph loads its inputs and stores its outputs"
    assert all(str(e["name"]).endswith("(dma)") and "aten::" in str(e["name"]) for e in dma)
    sources = {e["args"]["source"] for e in dma}  # type: ignore[index]
    assert (
        sources <= {_line("matmul line"), _line("reduce line")} and _line("matmul line") in sources
    )
    assert "\n-   " not in prof.summary(), "no engine time without a source line"


def test_torch_profiler_gives_each_op_its_device_time_and_ranges_reach_the_device_row(
    tmp_path: Path,
) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    lin = nn.Linear(32, 32).to("neuron")
    x = torch.randn(8, 32, device="neuron")
    activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    with (
        profile(activities=activities) as prof,
        torch.neuron.profile() as ours,
        record_function("step"),
    ):
        with record_function("forward"):
            y = lin(x).relu().sum()
        forward = [e for e in ours.events if e["cat"] == trace.LAUNCH]
        y.backward()
    launches = [e for e in ours.events if e["cat"] == trace.LAUNCH]
    rows = {r.key: r for r in prof.key_averages() if r.device_type.name == "CPU"}
    # Each launch is a kernel of the op that issued it: its simulated duration, to the ns.
    assert rows["aten::addmm"].self_device_time_total == pytest.approx(
        sum(e["dur"] for e in launches if e["name"] == "aten::addmm.default")
    )
    # A range's device time is that of the launches it issued (the backward runs on autograd's
    # thread, as with CUDA).
    assert rows["forward"].device_time_total == pytest.approx(sum(e["dur"] for e in forward))
    assert rows["neuron::launch"].count == len(launches)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    device = [e for e in events if e.get("cat") == trace.LAUNCH]
    assert len(device) == len(launches)
    ranges = {e["name"]: e for e in events if e.get("cat") == "neuron_user_annotation"}
    step = ranges["step"]
    (host_step,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "step"]
    # One time axis: no launch starts on the device before the host issued it.
    assert step["ts"] >= host_step["ts"]
    assert min(e["ts"] for e in device) == pytest.approx(step["ts"])
    assert max(e["ts"] + e["dur"] for e in device) == pytest.approx(step["ts"] + step["dur"])
    flows = [e for e in events if e.get("cat") == "ac2g"]
    assert len(flows) == 2 * len(launches)


def test_a_cpu_only_torch_profiler_session_shows_launch_markers_without_device_time() -> None:
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(8, 8, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x + 1).sum().item()
    names = {r.key for r in prof.key_averages()}
    assert "neuron::launch" in names
    assert not any(n.startswith("neuron::launch#") for n in names)
    assert all(r.device_type.name == "CPU" for r in prof.key_averages())


def test_each_cycle_of_a_scheduled_torch_profiler_keeps_its_device_time(tmp_path: Path) -> None:
    import gzip

    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    x = torch.randn(8, 8, device="neuron")
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
        schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
        on_trace_ready=tensorboard_trace_handler(str(tmp_path), use_gzip=True),
        acc_events=True,
    ) as prof:
        for _ in range(4):  # warm-up, active, warm-up, active
            (x @ x).relu()
            prof.step()
    traces = sorted(tmp_path.glob("*.json.gz"))
    assert len(traces) == 2
    mm = []
    for path in traces:
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        launches = [e for e in events if e.get("cat") == trace.LAUNCH]
        assert [e["name"] for e in launches] == ["aten::mm.default", "aten::relu.default"]
        mm.append(launches[0]["dur"])
    rows = {r.key: r for r in prof.key_averages() if r.device_type.name == "CPU"}
    assert rows["aten::mm"].self_device_time_total == pytest.approx(sum(mm))
