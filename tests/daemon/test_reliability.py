"""The daemon under faults and attacks: every scenario ends with every request answered and
the daemon up (or the client compiling in process, saying why). Real daemons, real worker
processes, real disks (a tmpfs where a disk must fill up or turn read-only), real users."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
import pytest
from trnsim import compiler
from trnsim.cli import main as cli
from trnsim.client.core.compile_client import CompileJob, DaemonCompileClient
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.daemon import launcher
from trnsim.daemon.config import ConfigError, default_address
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
    worker_processes,
)

pytestmark = pytest.mark.timeout(300)
FAKE_SERVER = Path(__file__).with_name("fake_server.py")


def _until(condition, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.05)


def _ok(result: svc.CompileResult) -> bool:
    return result.WhichOneof("outcome") == "executable"


def _workers(daemon_pid: int) -> list[psutil.Process]:
    return worker_processes(daemon_pid)


# -- workers ----------------------------------------------------------------------------------
def test_idle_workers_killed_are_replaced_and_compiles_go_on(daemon):
    assert _ok(answers(daemon.address, request(1))[0])
    _until(lambda: len(_workers(daemon.pid())) == 2, "two workers")
    for worker in _workers(daemon.pid()):
        worker.kill()  # idle: as the OOM killer would
    _until(lambda: daemon_stats(daemon.address).worker_restarts >= 2, "both deaths noticed")
    stats = daemon_stats(daemon.address)
    assert stats.workers_alive == stats.workers == 2
    assert all(_ok(r) for r in answers(daemon.address, *[request(i) for i in range(2, 8)]))


# -- the disk tier ----------------------------------------------------------------------------
def test_a_cache_that_refuses_writes_then_takes_them_again(short_tmp):
    """Writes to the cache fail under the daemon (RLIMIT_FSIZE 0: every write that grows a
    file fails, as on a read-only or full filesystem; a mode change would not stop root):
    compiles are answered, not kept; once writes work again, they are kept again."""
    d = start_daemon(short_tmp, "--workers", "1")

    def file_size_limit(soft: str) -> None:  # (the soft limit: root may not raise a hard one)
        subprocess.run(["prlimit", f"--pid={d.pid()}", f"--fsize={soft}:unlimited"], check=True)

    try:
        assert _ok(answers(d.address, request(1))[0])
        file_size_limit("0")
        results = answers(d.address, *[request(i) for i in range(2, 6)])
        assert all(_ok(r) for r in results), "compiled and answered; only not kept on disk"
        assert daemon_stats(d.address).disk_errors > 0
        file_size_limit("unlimited")
        assert _ok(answers(d.address, request(6))[0])
    finally:
        d.stop()
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        assert answers(d.address, request(6))[0].tier == svc.DISK, "writes work again"
    finally:
        d.stop()


def test_a_full_disk(short_tmp, tmpfs):
    disk = tmpfs("full", size="256k")
    d = start_daemon(short_tmp, "--workers", "2", cache_dir=disk / "cache")
    try:
        results = answers(d.address, *[request(i) for i in range(60)])
        assert all(_ok(r) for r in results)
        stats = daemon_stats(d.address)
        # (full while serving: errors; or already while opening: the disk tier off)
        assert stats.disk_errors > 0 or "full" in stats.disk_tier_off, "the disk did fill up"
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_cache_db_deleted_while_serving(daemon):
    assert all(_ok(r) for r in answers(daemon.address, request(1), request(2)))
    (daemon.cache_dir / "executables" / "cache.db").unlink()
    mixed = [request(i % 8) for i in range(16)]
    assert all(_ok(r) for r in answers(daemon.address, *mixed)), "all 16 answered"
    _until(lambda: (daemon.cache_dir / "executables" / "cache.db").exists(), "a new cache.db")
    assert daemon.proc.poll() is None


def test_a_damaged_cache_db_is_moved_aside_and_the_daemon_starts_empty(short_tmp):
    """cache.db garbled on disk (not a database at all): the daemon moves it aside (kept for
    a post-mortem, named in its log), starts on an empty one, and that one works: its
    entries are served from disk after a restart."""
    executables = short_tmp / "cache" / "executables"
    executables.mkdir(parents=True, mode=0o700)
    (executables / "cache.db").write_bytes(b"not a database, " * 512)
    d = start_daemon(short_tmp, "--workers", "1")
    try:
        assert all(_ok(r) for r in answers(d.address, request(1), request(2)))
        aside = sorted(executables.glob("cache.db.damaged-*"))
        assert len(aside) == 1 and aside[0].read_bytes().startswith(b"not a database")
        assert "damaged" in d.log.read_text()
    finally:
        d.stop()
    d = start_daemon(short_tmp, "--workers", "1")
    try:
        again = answers(d.address, request(1), request(2))
        assert [r.tier for r in again] == [svc.DISK, svc.DISK], again
    finally:
        d.stop()


def test_swapped_entries_are_never_served(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    assert all(_ok(r) for r in answers(d.address, request(1), request(2)))
    d.stop()
    (a_id, _, a_value), (b_id, _, b_value) = cache_rows(d.cache_dir)
    set_row(d.cache_dir, a_id, value=b_value)
    set_row(d.cache_dir, b_id, value=a_value)
    assert cli(["cache", "--cache-dir", str(d.cache_dir), "verify"]) == 1
    # verify dropped them; swap two fresh ones and let the daemon meet them instead
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        assert all(_ok(r) for r in answers(d.address, request(3), request(4)))
    finally:
        d.stop()
    (a_id, _, a_value), (b_id, _, b_value) = cache_rows(d.cache_dir)
    set_row(d.cache_dir, a_id, value=b_value)
    set_row(d.cache_dir, b_id, value=a_value)
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        results = answers(d.address, request(3), request(4))
        assert [r.tier for r in results] == [svc.COMPILED, svc.COMPILED]
        assert daemon_stats(d.address).corrupt_entries == 2
    finally:
        d.stop()


class _Planted:
    """Unpickling this runs a command: what a planted cache row would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_row_never_runs(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    assert _ok(answers(d.address, request(1))[0])
    d.stop()
    marker = short_tmp / "pwned"
    key = "ab" * 32
    payload = pickle.dumps(_Planted(marker))
    (rowid, _, _) = cache_rows(d.cache_dir)[0]
    set_row(d.cache_dir, rowid, key="exe:" + key, value=payload, mode=4)  # MODE_PICKLE
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    try:
        with grpc.insecure_channel(d.address) as ch:
            found = svc_grpc.CompileServiceStub(ch).Lookup(
                svc.LookupRequest(
                    cache_keys=[key],
                    compiler_version=compiler.compiler_version(),
                    format_version=compiler.FORMAT_VERSION,
                )
            )
        assert not found.entries[0].found
        assert d.proc.poll() is None
    finally:
        d.stop()
    assert cli(["cache", "--cache-dir", str(d.cache_dir), "verify"]) in (0, 1)
    assert not marker.exists(), "the pickle was never loaded"


# -- the socket and its directory -------------------------------------------------------------
def test_a_squatted_runtime_dir_gets_no_graphs(short_tmp, other_user):
    """In a shared, sticky temp directory another local user created the daemon's directory
    first and listens in it: the client refuses it before sending anything, compiles in
    process, and the user's op works."""
    uid, gid = other_user
    os.chmod(short_tmp, 0o1777)  # (a /tmp of its own)
    squat = short_tmp / "squat"
    squat.mkdir()
    os.chown(squat, uid, gid)
    os.chmod(squat, 0o755)
    address = f"unix:{squat / 'compiler.sock'}"
    received = short_tmp / "received.log"
    fake = subprocess.Popen([sys.executable, str(FAKE_SERVER), address, str(received)])
    try:
        _until(lambda: (squat / "compiler.sock").exists(), "the squatter's socket")
        with pytest.raises(launcher.UntrustedDaemon, match="not to you"):
            launcher.get_info(address)
        code = (
            "import torch, warnings; warnings.simplefilter('always'); "
            "print(torch.relu(torch.tensor([-1.0, 2.0], device='neuron')).cpu().tolist())"
        )
        env = {**os.environ, "NEURON_COMPILE_DAEMON": address}
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[0.0, 2.0]"
        assert "compiling in process" in out.stderr and "not to you" in out.stderr
        assert not received.exists(), "the squatter received no graph"
    finally:
        fake.kill()
        fake.wait()


def test_a_socket_another_user_listens_on_is_refused(short_tmp, other_user):
    """Our own directory, but the process behind the socket runs as someone else (SO_PEERCRED)."""
    listener = Path("/usr/bin/python3")  # (a system interpreter another user may run)
    if not listener.exists():
        pytest.skip("no system python3 to listen as another user")
    uid, gid = other_user
    os.chmod(short_tmp, 0o711)
    run = short_tmp / "run"
    run.mkdir(mode=0o700)
    sock = run / "compiler.sock"
    holder = short_tmp / "holder"
    holder.mkdir()
    os.chown(holder, uid, gid)
    code = (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
        "s.listen(); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [str(listener), "-c", code, str(holder / "s.sock")], user=uid, group=gid
    )
    try:
        _until(lambda: (holder / "s.sock").exists(), "the other user's socket")
        os.link(holder / "s.sock", sock)  # (our directory, their listening socket)
        assert launcher.peer_uid(sock) == uid
        # (the socket file is theirs too: whichever check speaks first, it is refused)
        with pytest.raises(launcher.UntrustedDaemon, match=f"uid {uid}"):
            launcher.check_trusted(f"unix:{sock}")
    finally:
        proc.kill()
        proc.wait()


def test_a_symlinked_runtime_dir_is_neither_followed_nor_chmodded(short_tmp):
    real = short_tmp / "real"
    real.mkdir(mode=0o755)
    link = short_tmp / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        launcher.ensure_daemon(f"unix:{link / 'c.sock'}")
    assert stat.S_IMODE(real.stat().st_mode) == 0o755
    assert not (real / "c.sock").exists()


def test_a_shared_cache_dir_keeps_its_mode_and_a_symlinked_one_is_refused(short_tmp):
    shared = short_tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=shared)
    try:
        assert _ok(answers(d.address, request(1))[0])
    finally:
        d.stop()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "executables").stat().st_mode) == 0o700
    elsewhere = short_tmp / "elsewhere"
    elsewhere.mkdir()
    planted = short_tmp / "planted"
    planted.mkdir()
    (planted / "executables").symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="symbolic link"):
        start_daemon(short_tmp / "second", "--workers", "1", cache_dir=planted)
    assert list(elsewhere.iterdir()) == []


# -- what a request may carry -----------------------------------------------------------------
def test_debug_info_and_test_hooks_stay_with_their_requester(daemon):
    from trnsim.protos import graph_pb2

    mine = graph_pb2.GraphDebug(name="A")
    mine.node_locations.add(file="/home/a/secret.py", line=7, function="f")
    client = DaemonCompileClient(daemon.address, auto_start=False)
    try:
        a = request(31)
        options = executable_pb2.CompileOptions(emit_debug_info=True)
        exe_a = client.compile(CompileJob(a.graph, "trn2", options, mine)).executable
        exe_b = client.compile(
            CompileJob(a.graph, "trn2", executable_pb2.CompileOptions())
        ).executable
        assert exe_a.debug.graph.node_locations[0].file == "/home/a/secret.py"
        assert "secret" not in exe_b.SerializeToString().decode("latin-1")
        crash = client.submit(request(32, debug_crash_worker=True))
        plain = client.submit(request(32))
        assert _ok(plain.result(timeout=120)), "an identical request never joins a crash test"
        assert crash.result(timeout=120).error.error_class == svc.TRANSIENT
    finally:
        client.close()


def _graph_with(outputs: int = 1, size: int = 8, nodes: int = 1) -> svc.CompileRequest:
    b = GraphBuilder("big")
    x = b.input([size])
    for _ in range(nodes):
        x = b.op("aten::relu.default", x, out=TensorType.contiguous([size]))
    r = request(0)
    r.graph.CopyFrom(to_proto(b.build(x)))
    if outputs > 1:
        node = r.graph.nodes[0]
        for _ in range(outputs - 1):
            node.outputs.add().CopyFrom(node.outputs[0])
    return r


def test_oversized_work_is_refused_or_bounded(daemon):
    huge = _graph_with()
    huge.graph.inputs[0].shape[0] = 1 << 62
    huge.graph.nodes[0].outputs[0].shape[0] = 1 << 62
    wide = _graph_with(outputs=5000)
    deep = _graph_with(nodes=2000)
    results = answers(daemon.address, huge, wide, deep)
    assert (
        results[0].error.error_class == svc.INVALID_REQUEST
        and "elements" in results[0].error.message
    )
    assert results[1].WhichOneof("outcome") in ("executable", "error")
    assert _ok(results[2])
    assert daemon.proc.poll() is None


def test_a_huge_graph_is_hashed_off_the_event_loop(short_tmp, monkeypatch):
    """The event loop answers memory hits for every client: a large graph is never hashed
    there (100k nodes took 6 s), it goes to the I/O threads whole; a small one missed there
    is not hashed a second time on the slow path."""
    from trnsim.daemon import service as service_module
    from trnsim.daemon.config import DaemonConfig

    config = DaemonConfig(cache_dir=short_tmp / "cache", workers=1)
    service = service_module.build_service(config)
    try:
        hashed: list[int] = []
        real = service_module.compiler.cache_key_from_proto
        monkeypatch.setattr(
            service_module.compiler,
            "cache_key_from_proto",
            lambda g, *a: hashed.append(len(g.nodes)) or real(g, *a),
        )
        big = _graph_with(nodes=service_module.FAST_PATH_MAX_NODES + 1)
        small = _graph_with(nodes=3)
        assert service._answer_fast(1, big, lambda r: None) is False
        key = service._answer_fast(1, small, lambda r: None)  # a miss: hashed, key passed on
        assert isinstance(key, str) and hashed == [len(small.graph.nodes)]
        answers: list[svc.CompileResult] = []
        service.inflight.open_stream(1)
        service._handle(1, small, answers.append, key)
        _until(lambda: len(answers) == 1, "the small graph compiled")
        assert answers[0].cache_key == key and hashed == [len(small.graph.nodes)], "hashed once"
    finally:
        service.close()


def test_requests_of_a_closed_stream_or_cancelled_on_their_way_start_no_compile(short_tmp):
    """A request still going through the I/O threads (hashing a large graph, reading the
    disk) when its stream ends, or when the client cancels it, is never queued: no compile
    runs for nobody. A later request reusing a cancelled id is served."""
    from trnsim.daemon import service as service_module
    from trnsim.daemon.config import DaemonConfig

    service = service_module.build_service(DaemonConfig(cache_dir=short_tmp / "c", workers=1))
    answers: list[svc.CompileResult] = []
    try:
        service.inflight.open_stream(1)
        service.inflight.close_stream(1)  # (the client went away meanwhile)
        orphan = request(81)
        orphan.id = 1
        service._handle(1, orphan, answers.append)
        service.inflight.open_stream(2)
        cancelled = request(82)
        cancelled.id = 7
        service.inflight.expect(2, 7)
        service.inflight.withdraw(2, 7)  # the cancel overtakes it on the event loop
        service._handle(2, cancelled, answers.append)
        assert service.inflight.counts() == (0, 0, 0) and service.inflight.refused == 2
        again = request(83)
        again.id = 7
        service.inflight.expect(2, 7)  # the id sent again, after its cancel: a new request
        service._handle(2, again, answers.append)
        _until(lambda: len(answers) == 1, "the reused id answered")
        assert [a.id for a in answers] == [7] and _ok(answers[0])
        assert service.stats.compiles == 1, "only the live request was compiled"
    finally:
        service.close()


def test_undecodable_messages_get_the_right_status(daemon):
    with grpc.insecure_channel(daemon.address) as ch:
        lookup = ch.unary_unary("/trnsim.service.CompileService/Lookup")
        with pytest.raises(grpc.RpcError) as e:
            lookup(b"\xff\xff\xff garbage", timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stream = ch.stream_stream(
            "/trnsim.service.CompileService/Compile",
            response_deserializer=svc.CompileResult.FromString,
        )
        good = request(1)
        good.id = 5
        answers = list(stream(iter([b"\x0a\xff garbage", good.SerializeToString()]), timeout=60))
    assert [a.id for a in answers] == [0, 5]
    assert answers[0].error.error_class == svc.INVALID_REQUEST
    assert _ok(answers[1]), "the stream stayed open after the bad message"


def test_a_daemon_that_never_answers_costs_a_deadline_not_a_hang(short_tmp):
    """A server that takes the stream and never answers: the client compiles in process once
    its deadline (NEURON_COMPILE_DEADLINE) passes."""
    sock = short_tmp / "mute.sock"
    mute = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), f"unix:{sock}", str(short_tmp / "got.log"), "--mute"]
    )
    try:
        _until(sock.exists, "the mute server")
        client_code = (
            "import sys, time; from trnsim.client.core.compile_client import DaemonCompileClient; "
            "from tests.daemon.helpers import job; "
            f"c = DaemonCompileClient('unix:{sock}', auto_start=False); t = time.monotonic(); "
            "exe = c.compile(job(1)).executable; "
            "print(bool(exe.cache_key), round(time.monotonic() - t))"
        )
        env = {**os.environ, "NEURON_COMPILE_DEADLINE": "2", "PYTHONPATH": pythonpath(Path.cwd())}
        out = subprocess.run(
            [sys.executable, "-c", client_code],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == "True" and "did not answer within 2 s" in out.stderr
    finally:
        mute.kill()
        mute.wait()


def test_a_daemon_slow_to_say_who_it_is_is_still_used(short_tmp):
    """GetInfo answered after 3 s (a daemon loaded by many starting processes): the client
    waits for it rather than taking the daemon for absent (which compiled in process, or
    with auto-start could start a second daemon)."""
    sock = short_tmp / "slow.sock"
    got = short_tmp / "got.log"
    slow = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), f"unix:{sock}", str(got), "--slow-info"]
    )
    try:
        _until(sock.exists, "the slow server")
        client = DaemonCompileClient(f"unix:{sock}", auto_start=False)
        try:
            future = client.submit(request(1))
            assert future.result(timeout=60).id == 1  # (answered by the server, not here)
            assert got.read_text().count("received graph") == 1
        finally:
            client.close()
    finally:
        slow.kill()
        slow.wait()


def test_a_compile_over_the_daemon_limit_is_not_retried_in_process(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1", "--compile-timeout", "1")
    client = DaemonCompileClient(d.address, auto_start=False)
    try:
        slow = request(41, debug_sleep_ms=5000)
        with pytest.raises(compiler.CompileError, match="limit"):
            client.compile(CompileJob(slow.graph, "trn2", slow.options))
        assert client.local.compiles == 0
    finally:
        client.close()
        d.stop()


def test_sigkill_of_the_daemon_mid_stream_fails_over_to_in_process(daemon):
    client = DaemonCompileClient(daemon.address, auto_start=False)
    try:
        slow = client.submit(request(51, debug_sleep_ms=3000))
        _until(lambda: daemon_stats(daemon.address).in_flight == 1, "the compile to start")
        os.kill(daemon.pid(), signal.SIGKILL)
        with pytest.raises(Exception, match="went away"):
            slow.result(timeout=60)
        with pytest.warns(RuntimeWarning, match="compiling in process"):
            exe = client.compile(job(52)).executable
        assert exe.cache_key and client.local.compiles == 1
    finally:
        client.close()


def test_the_socket_is_private(daemon):
    path = Path(daemon.address[len("unix:") :])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        assert launcher.peer_uid(path) == os.getuid()
    finally:
        probe.close()


def test_a_daemon_that_cannot_be_started_leaves_compiles_in_process(short_tmp):
    """The lock file next to the socket cannot be opened (a directory squats its name): the
    auto-start fails with an OSError, which is the daemon's trouble, never the op's."""
    run = short_tmp / "run"
    run.mkdir(mode=0o700)
    (run / "compiler.lock").mkdir()
    client = DaemonCompileClient(f"unix:{run / 'c.sock'}", auto_start=True)
    try:
        with pytest.warns(RuntimeWarning, match="compiling in process.*unavailable"):
            exe = client.compile(job(61)).executable
        assert exe.cache_key and client.local.compiles == 1
        future = client.compile_async(job(62))
        assert future.result(timeout=60).executable.cache_key and client.local.compiles == 2
    finally:
        client.close()


def test_a_daemon_that_exits_at_start_says_why_to_the_client(short_tmp, monkeypatch):
    """The auto-started daemon refuses a cache directory open to other users and exits: the
    client compiles in process and its warning carries the daemon's reason (not only "no
    compile daemon"), once; it does not respawn a daemon on every compile, but tries again
    after its back-off, and uses the daemon once the directory is fixed."""
    import trnsim.client.core.compile_client as cc

    cache = short_tmp / "cache"
    (cache / "executables").mkdir(parents=True)
    (cache / "executables").chmod(0o755)
    (short_tmp / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp / "xdg"))
    monkeypatch.setenv("NEURON_CACHE_DIR", str(cache))
    monkeypatch.setattr(cc, "RECONNECT_AFTER_S", 1.0)
    client = DaemonCompileClient(default_address(), auto_start=True)
    try:
        with pytest.warns(RuntimeWarning, match="exited at start.*open to other users"):
            client.compile(job(91))
        log = short_tmp / "xdg" / "trnsim" / "daemon.log"
        starts = log.read_text().count("open to other users")
        client.compile(job(92))
        assert client.local.compiles == 2
        assert log.read_text().count("open to other users") == starts, "no second start"
        (cache / "executables").chmod(0o700)
        time.sleep(1.1)  # (the back-off after one failed start)
        client.compile(job(93))
        assert client.local.compiles == 2 and client.tiers == {"COMPILED": 1}, client.tiers
    finally:
        client.close()
        info = launcher.get_info(default_address(), timeout=2)
        if info is not None:
            os.kill(info.pid, signal.SIGTERM)


def test_a_background_compile_the_daemon_cannot_do_is_done_here(daemon, monkeypatch):
    """Adaptive mode's background compiles fall back like blocking ones: an answer the daemon
    gives for its own trouble (here VERSION_MISMATCH) means compiling here, in the
    background; the graph's own error is passed on as it is."""
    import trnsim.client.core.compile_client as cc

    client = DaemonCompileClient(daemon.address, auto_start=False)
    made = cc.compile_request

    def from_another_version(*args, **kwargs):  # type: ignore[no-untyped-def]
        r = made(*args, **kwargs)
        r.compiler_version = "0.0-another"
        return r

    try:
        compiled = client.compile_async(job(71)).result(60)
        assert compiled.tier is cc.Tier.COMPILED and compiled.waited_seconds > 0
        assert client.local.compiles == 0 and client.tiers == {"COMPILED": 1}
        monkeypatch.setattr(cc, "compile_request", from_another_version)
        with pytest.warns(RuntimeWarning, match="compiling in process"):
            compiled = client.compile_async(job(72)).result(60)
        assert compiled.executable.cache_key and compiled.tier is cc.Tier.IN_PROCESS
        assert client.local.compiles == 1 and client.fallbacks == 1
        monkeypatch.setattr(cc, "compile_request", made)
        huge = to_proto(graph(73, size=200_000))  # 160 GB per matrix: more than HBM holds
        with pytest.raises(compiler.GraphTooLargeError):
            client.compile_async(CompileJob(huge, "trn2", executable_pb2.CompileOptions())).result(
                60
            )
        assert client.local.compiles == 1
    finally:
        client.close()
