"""torch.distributed on the neuron backend through real torchrun launches (and, for a dying
rank, plain processes): collectives against gloo on CPU, the ranks' agreed timeline, DDP /
FSDP2 / tensor-parallel parity with one CPU process, two simulated hosts, a dead rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from trnsim.simulator import cost_model
from trnsim.simulator.config import TRN2

HERE = Path(__file__).parent
EXAMPLES = HERE.parent.parent / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = HERE) -> str:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc.stdout


def _reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize(("world", "mode"), [(2, "eager"), (4, "adaptive")])
def test_every_collective_equals_gloo_on_cpu_and_ends_at_one_time_on_every_rank(
    tmp_path: Path, world: int, mode: str
) -> None:
    _run(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            str(world),
            "collectives_rank.py",
            str(tmp_path),
        ],
        {"NEURON_EAGER": mode},
    )
    reports = _reports(tmp_path, world)
    checked = reports[0]["checked"]
    assert len(checked) == 36, checked  # 11 collectives x 3 dtypes, AVG, a view, send/recv
    assert all(r["checked"] == checked for r in reports)
    assert {r["backend"] for r in reports} == {"neuron"}
    assert {r["mode"] for r in reports} == {mode}
    timed = [r["timed"] for r in reports]
    # rank r did r + 1 matmuls first: the ranks arrive in order, and start at the last arrival
    arrivals = [t["arrival"] for t in timed]
    assert arrivals == sorted(arrivals) and arrivals[0] < arrivals[-1]
    assert {t["start"] for t in timed} == {max(arrivals)}
    expected = cost_model.collective_cost(
        TRN2, "all_reduce", timed[0]["nbytes"], cost_model.Topology(world)
    )
    assert {t["end"] - t["start"] for t in timed} == {int(expected.ns)}
    assert {(t["hosts"], t["local"]) for t in timed} == {(1, world)}
    assert all(t["host_after_sync"] >= t["end"] for t in timed)


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("example", ["ddp", "fsdp", "tp"])
def test_parallel_training_matches_one_cpu_process(tmp_path: Path, example: str, mode: str) -> None:
    out = tmp_path / "rank0.json"
    _run(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            f"train_{example}.py",
            "--steps",
            "4",
            "--json",
            str(out),
        ],
        {"NEURON_EAGER": mode},
        cwd=EXAMPLES,
    )
    report = json.loads(out.read_text())
    assert report["ok"], report
    assert len(report["losses"]) == 4
    for cpu, neuron in zip(report["cpu"], report["losses"], strict=True):
        assert neuron == pytest.approx(cpu, rel=1e-4)
    assert all(s["collective_busy_ns"] > 0 for s in report["steps"])


def test_ddp_no_sync_accumulates_and_unused_parameter_search_is_refused_clearly(
    tmp_path: Path,
) -> None:
    _run(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "ddp_features_rank.py", str(tmp_path)]
    )
    report = json.loads((tmp_path / "ddp.json").read_text())
    assert report["collectives_per_micro_batch"][:2] == [0, 0]
    assert report["refused"] == ["find_unused_parameters", "static_graph"]


def test_ddp_on_four_ranks_overlaps_all_reduce_with_backward(tmp_path: Path) -> None:
    """Adaptive mode, a model whose buckets fill during backward: once the fused graphs run,
    the step takes less than its compute and collective busy time added up."""
    out = tmp_path / "rank0.json"
    args = ["--steps", "5", "--embd", "256", "--layers", "4", "--json", str(out)]
    ranks = ["--standalone", "--nproc-per-node", "4"]
    _run([*TORCHRUN, *ranks, "train_ddp.py", *args], {"NEURON_EAGER": "adaptive"}, cwd=EXAMPLES)
    report = json.loads(out.read_text())
    assert report["ok"], report
    last = report["steps"][-1]
    compute = last["device_busy_ns"] - last["collective_busy_ns"]
    assert last["wall_ns"] < compute + last["collective_busy_ns"], last
    assert last["collective_overlap_ns"] > 0, last


def test_two_torchrun_nodes_are_two_hosts_with_their_own_daemons(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700)
    port = _free_port()
    env = {
        **os.environ,
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "NEURON_COMPILE_DAEMON": "auto",  # each node starts its own
        "NEURON_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = tmp_path / "out"
    out.mkdir()
    nodes = [
        subprocess.Popen(
            [
                *TORCHRUN,
                "--nnodes",
                "2",
                "--node-rank",
                str(n),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "trnsim-two-nodes",
                "collectives_rank.py",
                str(out),
            ],
            cwd=HERE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    try:
        results = [p.communicate(timeout=280) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
        sockets = sorted(p.name for p in (runtime_dir / "trnsim").glob("*.sock"))
        for name in sockets:
            address = f"unix:{runtime_dir / 'trnsim' / name}"
            trnsim = str(Path(sys.executable).parent / "trnsim")
            stop = [trnsim, "daemon", "stop", "--address", address]
            subprocess.run(stop, env=env, capture_output=True, timeout=60, check=False)
    for p, (_, stderr) in zip(nodes, results, strict=True):
        assert p.returncode == 0, stderr[-5000:]
    assert sockets == ["compiler-node0.sock", "compiler-node1.sock"]
    reports = _reports(out, 2)
    assert [r["node"] for r in reports] == ["0", "1"]
    timed = [r["timed"] for r in reports]
    assert {(t["hosts"], t["local"]) for t in timed} == {(2, 1)}
    efa = cost_model.collective_cost(
        TRN2, "all_reduce", timed[0]["nbytes"], cost_model.Topology(2, 2)
    )
    assert efa.link == "efa"
    assert {t["end"] - t["start"] for t in timed} == {int(efa.ns)}
    one_host = cost_model.collective_cost(
        TRN2, "all_reduce", timed[0]["nbytes"], cost_model.Topology(2)
    )
    assert efa.ns > one_host.ns


def test_a_rank_that_dies_gives_the_others_a_clear_error(tmp_path: Path) -> None:
    port = _free_port()
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "dies_rank.py"],
            cwd=HERE,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        (out0, err0), (_, _) = (p.communicate(timeout=120) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 3
    assert procs[0].returncode != 0, out0
    assert "CollectiveError: all_reduce on the neuron process group failed on rank 0 of 2" in err0
    assert "Another rank may have died or timed out" in err0
    assert "returned" not in out0
