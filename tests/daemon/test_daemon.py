"""The compile daemon, end to end: real processes, real sockets, real disk cache."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from trnsim import compiler
from trnsim.cli import main as cli
from trnsim.client.core.compile_client import DaemonCompileClient
from trnsim.daemon import launcher
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos import executable_pb2

from .helpers import (
    answers,
    cache_rows,
    daemon_stats,
    graph,
    job,
    pythonpath,
    request,
    set_row,
    start_daemon,
)

REPO = Path(__file__).resolve().parents[2]


def test_eight_processes_same_twenty_graphs_compile_once(daemon):
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.daemon.dedupe_client", daemon.address, "20", "200"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    digests = [dict(line.split() for line in out.splitlines()) for out in outputs]
    assert all(d == digests[0] for d in digests), "every process got the same executables"
    for i in range(20):  # ...and they are what the compiler makes of the graph
        local = compiler.compile(
            graph(i), "trn2", executable_pb2.CompileOptions(debug_sleep_ms=200)
        )
        import hashlib

        assert digests[0][str(i)] == hashlib.sha256(local.SerializeToString()).hexdigest()
    stats = daemon_stats(daemon.address)
    assert stats.compiles == 20, stats
    assert stats.requests == 160
    assert stats.joins + stats.memory.hits + stats.disk.hits == 140
    assert stats.joins > 0, "requests arriving while a graph compiled joined it"
    assert stats.seconds_saved > 0


def test_kill_9_while_four_clients_train(daemon):
    env = {**os.environ, "NEURON_COMPILE_DAEMON": daemon.address, "PYTHONPATH": pythonpath(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "daemon" / "train_client.py"), "12"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    assert procs[0].stdout is not None
    assert procs[0].stdout.readline().startswith("step 0")  # training is under way
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert out.strip().endswith("OK")


def test_a_crashing_worker_fails_only_its_request(daemon):
    crash, fine = request(1, debug_crash_worker=True), request(2)
    results = answers(daemon.address, crash, fine)
    assert results[0].WhichOneof("outcome") == "error"
    assert (
        results[0].error.error_class == svc.TRANSIENT and "died twice" in results[0].error.message
    )
    assert results[1].WhichOneof("outcome") == "executable"
    after = answers(daemon.address, request(3), request(4))
    assert all(r.WhichOneof("outcome") == "executable" for r in after)
    stats = daemon_stats(daemon.address)
    assert stats.worker_restarts == 2, "the crashing request was retried once"
    assert stats.failures["TRANSIENT"] == 1
    # Transient failures are not cached: the same request is compiled (and crashes) again.
    again = answers(daemon.address, crash)
    assert again[0].error.error_class == svc.TRANSIENT
    assert daemon_stats(daemon.address).worker_restarts == 4


def test_deterministic_errors_are_cached(daemon):
    """A graph the target cannot hold is its own class of deterministic error (the client
    turns it into torch.OutOfMemoryError), cached like the others."""
    bad = request(5, hbm_budget_bytes=1024)
    first = answers(daemon.address, bad)[0]
    assert first.error.error_class == svc.OUT_OF_DEVICE_MEMORY and "budget" in first.error.message
    compiles = daemon_stats(daemon.address).compiles
    second = answers(daemon.address, bad)[0]
    assert second.error.error_class == svc.OUT_OF_DEVICE_MEMORY
    assert daemon_stats(daemon.address).compiles == compiles, "answered from the error cache"


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_disk_entries_are_detected_and_recompiled(short_tmp, damage):
    d = start_daemon(short_tmp, "--workers", "1")
    assert answers(d.address, request(7))[0].tier == svc.COMPILED
    d.stop()
    rows = cache_rows(d.cache_dir)
    assert len(rows) == 1
    rowid, _, data = rows[0]
    damaged = (
        data[: len(data) // 2]
        if damage == "truncate"
        else bytes(b ^ 0xFF for b in data[:64]) + data[64:]
    )
    set_row(d.cache_dir, rowid, value=damaged)
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        result = answers(d.address, request(7))[0]
        assert result.WhichOneof("outcome") == "executable" and result.tier == svc.COMPILED
        stats = daemon_stats(d.address)
        assert stats.corrupt_entries == 1 and stats.compiles == 1
        assert answers(d.address, request(7))[0].tier == svc.MEMORY
    finally:
        d.stop()


def test_restart_serves_from_disk_and_cache_commands(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    assert all(r.tier == svc.COMPILED for r in answers(d.address, request(1), request(2)))
    d.stop()
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        results = answers(d.address, request(1), request(2))
        assert [r.tier for r in results] == [svc.DISK, svc.DISK]
        assert daemon_stats(d.address).compiles == 0
    finally:
        d.stop()
    cache = ["cache", "--cache-dir", str(d.cache_dir)]
    assert cli([*cache, "verify"]) == 0
    assert cli([*cache, "prune"]) == 0
    assert len(cache_rows(d.cache_dir)) == 2, "entries of this compiler version survive prune"
    assert len(cache_rows(d.cache_dir, "parts:")) == 2, "and the parts of their keys"
    assert cli([*cache, "clear"]) == 0
    assert cache_rows(d.cache_dir, "") == []


def test_bad_requests_get_the_right_status_and_the_daemon_stays_up(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    try:
        old = request(1)
        old.compiler_version = "0.0.0+old"
        malformed = request(2)
        malformed.graph.nodes[0].args[0].tensor.input = 9
        huge_nodes = request(3)
        results = answers(d.address, old, malformed)
        assert (
            results[0].error.error_class == svc.VERSION_MISMATCH
            and "differs" in results[0].error.message
        )
        assert (
            results[1].error.error_class == svc.INVALID_REQUEST
            and "malformed" in results[1].error.message
        )
        with grpc.insecure_channel(d.address) as ch:
            stub = svc_grpc.CompileServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.Lookup(
                    svc.LookupRequest(
                        cache_keys=["nope"],
                        compiler_version=compiler.compiler_version(),
                        format_version=compiler.FORMAT_VERSION,
                    )
                )
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as e:
                stub.Lookup(
                    svc.LookupRequest(
                        cache_keys=["0" * 64], compiler_version="other", format_version=1
                    )
                )
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.RpcError) as e:
                stub.Lookup(
                    svc.LookupRequest(
                        cache_keys=["0" * 64] * 10_001,
                        compiler_version=compiler.compiler_version(),
                        format_version=compiler.FORMAT_VERSION,
                    )
                )
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            oversized = svc.CompileRequest()
            oversized.CopyFrom(huge_nodes)
            oversized.debug.name = "x" * (65 * 1024 * 1024)
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Compile(iter([oversized]), timeout=60))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = stub.GetInfo(
                svc.GetInfoRequest(client_compiler_version="0.0.0+old", client_format_version=1)
            )
            assert not info.compatible and info.compiler_version == compiler.compiler_version()
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert answers(d.address, request(4))[0].WhichOneof("outcome") == "executable"
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_permissions_of_socket_and_cache(daemon):
    sock = Path(daemon.address[len("unix:") :])
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(daemon.cache_dir.stat().st_mode) == 0o700


def test_lookup_by_key_hits_after_a_compile(daemon):
    result = answers(daemon.address, request(11))[0]
    key = compiler.cache_key(graph(11), compiler_target(), executable_pb2.CompileOptions()).digest
    assert result.cache_key == key, "client and daemon agree on keys"
    with grpc.insecure_channel(daemon.address) as ch:
        resp = svc_grpc.CompileServiceStub(ch).Lookup(
            svc.LookupRequest(
                cache_keys=[key, "f" * 64],
                compiler_version=compiler.compiler_version(),
                format_version=compiler.FORMAT_VERSION,
            )
        )
    assert [e.found for e in resp.entries] == [True, False]
    assert resp.entries[0].executable.data == result.executable.data
    with grpc.insecure_channel(daemon.address) as ch:  # (trnsim precompile's question)
        resp = svc_grpc.CompileServiceStub(ch).Lookup(
            svc.LookupRequest(
                cache_keys=[key, "f" * 64],
                compiler_version=compiler.compiler_version(),
                format_version=compiler.FORMAT_VERSION,
                presence_only=True,
            )
        )
    assert [e.found for e in resp.entries] == [True, False]
    assert not resp.entries[0].HasField("executable"), "presence only: no executable sent"


def compiler_target():
    from trnsim.simulator.config import get_target

    return get_target("trn2")


def test_sigterm_drains_and_systemd_readiness(short_tmp):
    notify = short_tmp / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify))
    listener.settimeout(30)
    try:
        d = start_daemon(short_tmp, "--workers", "1", env={"NOTIFY_SOCKET": str(notify)})
        assert b"READY=1" in listener.recv(4096)
        client = DaemonCompileClient(d.address, auto_start=False)
        slow = client.submit(request(20, debug_sleep_ms=1500))
        deadline = time.monotonic() + 30
        while daemon_stats(d.address).in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # SIGTERM must arrive while the compile runs
        d.proc.send_signal(signal.SIGTERM)
        result = slow.result(timeout=60)
        assert result.WhichOneof("outcome") == "executable", (
            "in-flight work finished during the drain"
        )
        assert d.proc.wait(timeout=60) == 0
        assert b"STOPPING=1" in listener.recv(4096)
        assert not Path(d.address[len("unix:") :]).exists()
        client.close()
    finally:
        listener.close()


def test_auto_started_daemon_is_one_and_exits_when_idle(short_tmp):
    address = f"unix:{short_tmp / 'auto' / 'c.sock'}"
    code = (
        "import sys; from trnsim.daemon import launcher; "
        "info = launcher.ensure_daemon(sys.argv[1], idle_exit_s=2.0); print(info.pid)"
    )
    env = {**os.environ, "NEURON_CACHE_DIR": str(short_tmp / "cache")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, address], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(4)
    ]
    pids = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(pids) == 1, f"one daemon for four racing clients, got {pids}"
    pid = int(pids.pop())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and launcher.get_info(address, timeout=0.3) is not None:
        time.sleep(0.2)
    assert launcher.get_info(address, timeout=0.3) is None, "idle daemon exited"
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_client_without_daemon_compiles_in_process(short_tmp):
    client = DaemonCompileClient(f"unix:{short_tmp / 'none.sock'}", auto_start=False)
    with pytest.warns(RuntimeWarning, match="compiling in process"):
        exe = client.compile(job(1)).executable
    assert exe.modelled_ns > 0 and client.fallbacks == 1
    client.compile(job(2))  # no second warning
    assert client.fallbacks == 2


def test_cli_status_and_stats(daemon, capsys):
    assert cli(["daemon", "status", "--address", daemon.address]) == 0
    assert "running" in capsys.readouterr().out
    answers(daemon.address, request(30))
    assert cli(["--address", daemon.address, "stats"]) == 0
    assert "compiles" in capsys.readouterr().out
    assert cli(["--address", daemon.address, "stats", "--json"]) == 0
    assert '"compiles": "1"' in capsys.readouterr().out


def test_client_reconnects_after_the_daemon_returns(short_tmp, monkeypatch):
    import trnsim.client.core.compile_client as cc

    monkeypatch.setattr(cc, "RECONNECT_AFTER_S", 0.2)
    d = start_daemon(short_tmp, "--workers", "1")
    client = DaemonCompileClient(d.address, auto_start=False)
    client.compile(job(1))
    assert client.fallbacks == 0 and client.tiers == {"COMPILED": 1}
    d.stop()
    with pytest.warns(RuntimeWarning, match="compiling in process"):
        client.compile(job(2))
    assert client.fallbacks == 1
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        time.sleep(0.3)
        client.compile(job(1))  # (read from the disk tier the daemon's handshake names)
        assert client.fallbacks == 1 and client.tiers.get("DIRECT") == 1, client.tiers
    finally:
        client.close()
        d.stop()


def test_an_auto_started_daemon_of_another_version_is_replaced(short_tmp, monkeypatch):
    import trnsim.client.core.compile_client as cc

    d = start_daemon(short_tmp, "--workers", "1")
    old_pid = launcher.get_info(d.address).pid
    client = cc.DaemonCompileClient(d.address, auto_start=True)
    # The running daemon plays one from an older installation.
    monkeypatch.setattr(cc, "_same_version", lambda info, version: info.pid != old_pid)
    try:
        client.compile(job(1))
        info = launcher.get_info(d.address)
        assert info is not None and info.pid != old_pid, "a fresh daemon took over the socket"
        assert d.proc.wait(timeout=60) == 0, "the old one drained and exited"
    finally:
        client.close()
        new = launcher.get_info(d.address)
        if new is not None:
            os.kill(new.pid, signal.SIGTERM)
