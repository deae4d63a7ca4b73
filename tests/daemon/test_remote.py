"""The cluster tier (daemon/remote.py) against a real Redis server the tests start on a Unix
socket: entries signed and bound to their key, a forged one never served, a flushed, full,
killed or paused (SIGSTOP) store costing at most one deadline and never failing a compile,
and two hosts' daemons, each with its own cache, sharing what either compiled."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from trnsim import compiler
from trnsim.daemon import launcher, service
from trnsim.daemon.cache import ExecutableCache
from trnsim.daemon.config import ConfigError, DaemonConfig
from trnsim.daemon.remote import (
    PREFIX,
    RedisStore,
    RemoteTier,
    read_cluster_key,
    seal,
)
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import executable_pb2 as exe_pb2
from trnsim.protos.blobs import make_blob

from .helpers import answers, daemon_stats, gone, graph, pythonpath, request, start_daemon

pytestmark = pytest.mark.timeout(120)
DEADLINE_S = 0.3
VERSION = compiler.compiler_version()
REPO = Path(__file__).resolve().parents[2]


class Redis:
    """A redis-server of the test's own, on a Unix socket in a temporary directory."""

    def __init__(self, root: Path, *config: str) -> None:
        server = shutil.which("redis-server")
        if server is None:
            pytest.fail("redis-server is missing: `make setup` installs it (Debian's package)")
        self.root = root
        self.socket = root / "redis.sock"
        self.url = f"unix://{self.socket}?db=0"
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        cmd = [
            "redis-server", "--port", "0", "--unixsocket", str(self.socket),
            "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
            "--dir", str(self.root), *self.config,
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                RedisStore(self.url, 1.0).ping()
                return
            except Exception:  # noqa: BLE001  (not listening yet)
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def client(self):  # the raw store, as another writer of it (or an attacker) sees it
        import redis

        return redis.Redis(unix_socket_path=str(self.socket))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(short_tmp):
    r = Redis(short_tmp)
    yield r
    r.stop()


@pytest.fixture
def key_file(short_tmp):
    path = short_tmp / "cluster.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def _tier(url: str, secret: bytes = b"k" * 32, max_entry: int = 1 << 20) -> RemoteTier:
    return RemoteTier(RedisStore(url, DEADLINE_S), secret, VERSION, max_entry, retry_s=0.2)


def _blob(i: int) -> tuple[str, svc.ExecutableBlob]:
    exe = compiler.compile(graph(i), "trn2", exe_pb2.CompileOptions())
    return exe.cache_key, make_blob(exe.SerializeToString(), compiler.FORMAT_VERSION, exe.cache_key)


def test_an_entry_put_is_got_back_checked_and_a_forged_one_never(redis_server):
    tier = _tier(redis_server.url)
    try:
        key, blob = _blob(1)
        assert tier.get(key) is None and tier.misses == 1
        tier.put_later(key, blob)
        assert tier.flush()
        assert tier.puts == 1 and tier.get(key) == blob and tier.hits == 1
        raw = redis_server.client()
        # Another key's signed entry under this key: signed, but not this key's executable.
        other, other_blob = _blob(2)
        raw.set(PREFIX + key, seal(b"k" * 32, other, VERSION, other_blob))
        assert tier.get(key) is None and tier.forged == 1  # (the key is in the signature)
        # Signed with another key (an attacker's), or not an entry at all.
        raw.set(PREFIX + key, seal(b"x" * 32, key, VERSION, blob))
        assert tier.get(key) is None
        raw.set(PREFIX + key, b"\x00garbage")
        assert tier.get(key) is None
        assert tier.forged == 3 and tier.hits == 1
        # Signed by us, by another compiler version: a miss, not a forgery.
        raw.set(PREFIX + key, seal(b"k" * 32, key, "other-version", blob))
        assert tier.get(key) is None and tier.refused == 1 and tier.forged == 3
        assert any("signature" in e for e in tier.to_proto().recent_errors)
        raw.flushdb()
        assert tier.get(key) is None and tier.misses == 2
    finally:
        tier.close()


def test_lookups_of_a_key_being_read_wait_for_that_read(redis_server):
    class Slow(RedisStore):
        reads = 0

        def get(self, key: str, limit: int) -> bytes | None:
            Slow.reads += 1
            time.sleep(0.2)
            return super().get(key, limit)

    key, blob = _blob(1)
    tier = RemoteTier(Slow(redis_server.url, 1.0), b"k" * 32, VERSION, 1 << 20)
    try:
        tier.put_later(key, blob)
        assert tier.flush()
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: tier.get(key), range(4)))
        assert got == [blob] * 4
        assert Slow.reads == 1 and tier.joined == 3 and tier.hits == 1
    finally:
        tier.close()


def test_an_entry_larger_than_the_bound_is_neither_written_nor_read_whole(redis_server):
    key, blob = _blob(1)
    tier = _tier(redis_server.url, max_entry=64)
    try:
        tier.put_later(key, blob)
        assert tier.flush() and tier.puts == 0 and tier.puts_dropped == 1
        redis_server.client().set(PREFIX + key, seal(b"k" * 32, key, VERSION, blob))
        assert tier.get(key) is None and tier.refused == 1
    finally:
        tier.close()


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_dead_or_paused_store_costs_one_deadline_then_nothing_until_it_is_back(
    redis_server, fault
):
    tier = _tier(redis_server.url)
    try:
        key, blob = _blob(1)
        tier.put_later(key, blob)
        assert tier.flush()
        proc = redis_server.proc
        assert proc is not None
        if fault == "killed":
            redis_server.stop()
        else:
            proc.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        assert tier.get(key) is None
        first = time.monotonic() - began
        assert first < DEADLINE_S + 0.5, first
        assert tier.down and tier.errors == 1
        began = time.monotonic()
        for _ in range(20):
            assert tier.get(key) is None
        assert time.monotonic() - began < 0.05, "off: not asked"
        assert tier.skipped == 20
        tier.put_later(*_blob(2))  # (dropped while off, never blocking)
        assert tier.puts_dropped == 1
        if fault == "killed":
            redis_server.start()  # (empty: nothing was saved)
        else:
            proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while tier.down and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not tier.down, "the background retry turns it back on"
        assert (tier.get(key) is None) == (fault == "killed")
    finally:
        tier.close()


@pytest.mark.parametrize("policy", ["noeviction", "allkeys-lru"])
def test_a_full_store_costs_writes_or_old_entries_never_the_tier(redis_server, policy):
    """maxmemory reached: with noeviction each write is refused (counted; the tier stays on
    for reads), with an eviction policy Redis makes room and the write lands."""
    raw = redis_server.client()
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory-policy", policy)
    raw.config_set("maxmemory", used + 200_000)
    import redis

    for n in range(12):  # (past the limit: 600 kB of others' entries)
        try:
            raw.set(f"other:{n}", b"x" * 50_000)
        except redis.OutOfMemoryError:  # (noeviction: full)
            break
    tier = _tier(redis_server.url)
    try:
        key, blob = _blob(1)
        tier.put_later(key, blob)
        assert tier.flush() and not tier.down
        if policy == "noeviction":
            assert tier.put_errors == 1 and tier.puts == 0
            assert tier.get(key) is None and tier.misses == 1, "still asked: it answers"
        else:
            assert tier.puts == 1 and tier.get(key) == blob
            assert raw.dbsize() < 13, "older entries were evicted"
    finally:
        tier.close()


def test_the_cluster_key_must_be_private_and_long_enough(short_tmp):
    path = short_tmp / "key"
    with pytest.raises(ConfigError, match="head -c 32"):
        read_cluster_key(path)
    path.write_bytes(os.urandom(32))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_cluster_key(path)
    path.chmod(0o600)
    assert len(read_cluster_key(path)) == 32
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match="fewer than 16"):
        read_cluster_key(path)
    config = DaemonConfig(remote="redis://127.0.0.1:1/0", remote_key_file=None)
    with pytest.raises(ConfigError, match="NEURON_CACHE_REMOTE_KEY_FILE"):
        service.remote_tier(config, VERSION)


def test_a_cache_fills_its_disk_and_memory_from_the_remote_tier(short_tmp, redis_server):
    key, blob = _blob(1)
    first = ExecutableCache(short_tmp / "a", 1 << 20, 64 << 20, retry_s=None)
    second = ExecutableCache(short_tmp / "b", 1 << 20, 64 << 20, retry_s=None)
    first.remote, second.remote = _tier(redis_server.url), _tier(redis_server.url)
    try:
        first.put(key, blob)
        assert first.remote.flush()
        assert second.get(key) == (blob, svc.REMOTE)
        second.remote.close()
        second.remote = None
        assert second.get(key) == (blob, svc.MEMORY)
        second.memory.clear()
        assert second.get(key) == (blob, svc.DISK), "kept on disk"
    finally:
        first.close()
        second.close()


def test_two_hosts_daemons_compile_a_graph_once(short_tmp, redis_server, key_file):
    """Each host: its own daemon, socket and cache; one store and one key between them. The
    second host's daemon compiles nothing the first compiled, and says where it came from."""
    env = {"NEURON_CACHE_REMOTE": redis_server.url, "NEURON_CACHE_REMOTE_KEY_FILE": str(key_file)}
    hosts = [start_daemon(short_tmp / f"h{n}", "--workers", "1", env=env) for n in (1, 2)]
    try:
        first, second = hosts
        requests = [request(i) for i in range(3)]
        assert all(r.tier == svc.COMPILED for r in answers(first.address, *requests))
        deadline = time.monotonic() + 10
        while daemon_stats(first.address).remote.puts < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = answers(second.address, *requests)
        assert [r.tier for r in got] == [svc.REMOTE] * 3
        stats = daemon_stats(second.address)
        assert stats.compiles == 0 and stats.remote.hits == 3
        assert stats.remote.store.startswith("unix://")
        # Now in the second host's own cache: the store is not asked again.
        assert [r.tier for r in answers(second.address, *requests)] == [svc.MEMORY] * 3
        assert daemon_stats(second.address).remote.hits == 3
    finally:
        for h in hosts:
            h.stop()


def test_a_daemon_whose_store_is_gone_serves_and_compiles_within_the_deadline(
    short_tmp, redis_server, key_file
):
    env = {
        "NEURON_CACHE_REMOTE": redis_server.url,
        "NEURON_CACHE_REMOTE_KEY_FILE": str(key_file),
        "NEURON_CACHE_REMOTE_DEADLINE": str(DEADLINE_S),
    }
    d = start_daemon(short_tmp / "h", "--workers", "1", env=env)
    try:
        redis_server.proc.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        (result,) = answers(d.address, request(7))
        assert result.tier == svc.COMPILED and result.WhichOneof("outcome") == "executable"
        stats = daemon_stats(d.address)
        assert stats.remote.off and stats.remote.errors >= 1
        assert time.monotonic() - began < 30
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
        d.stop()


def test_every_command_finds_the_simulated_hosts_own_daemon(monkeypatch, capsys, short_tmp):
    """NEURON_SIM_NODE names the host a client auto-starts its daemon for (compiler-<node>.sock):
    `trnsim stats` and `trnsim daemon status` look there too."""
    from trnsim.cli.main import main

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    monkeypatch.setenv("NEURON_SIM_NODE", "n1")
    assert main(["stats"]) == 3
    assert f"{short_tmp}/trnsim/compiler-n1.sock" in capsys.readouterr().err
    main(["daemon", "status"])
    said = capsys.readouterr()
    assert "compiler-n1.sock" in said.out + said.err


def _train_on_host(node: str, work: Path, remote: dict[str, str]) -> svc.StatsResponse:
    """A training process on simulated host `node` (its own auto-started daemon and cache),
    its losses and weights checked against CPU's by the script; the host daemon's counters."""
    env = {
        **os.environ,
        **remote,
        "NEURON_COMPILE_DAEMON": "auto",
        "NEURON_SIM_NODE": node,
        "NEURON_CACHE_DIR": str(work / node),
        "XDG_RUNTIME_DIR": str(work),
        "PYTHONPATH": pythonpath(REPO),
    }
    script = REPO / "tests" / "daemon" / "train_client.py"
    done = subprocess.run(
        [sys.executable, str(script), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-2000:]
    return daemon_stats(_address(work, node))


def test_a_second_host_trains_on_what_the_first_compiled(short_tmp, redis_server, key_file):
    """Two simulated hosts train the same model one after the other (each checked equal to
    CPU, loss by loss): the second host's daemon compiles nothing, every executable it
    serves comes from the cluster tier."""
    remote = {
        "NEURON_CACHE_REMOTE": redis_server.url,
        "NEURON_CACHE_REMOTE_KEY_FILE": str(key_file),
    }
    try:
        first = _train_on_host("h1", short_tmp, remote)
        assert first.compiles > 0 and first.remote.misses > 0
        deadline = time.monotonic() + 10
        while daemon_stats(_address(short_tmp, "h1")).remote.puts < first.compiles:
            assert time.monotonic() < deadline, "the first host's compiles reach the store"
            time.sleep(0.05)
        second = _train_on_host("h2", short_tmp, remote)
        assert second.compiles == 0, second
        assert second.remote.hits == first.compiles
        assert second.remote.signature_failures == 0
    finally:
        for node in ("h1", "h2"):
            _stop(_address(short_tmp, node))


def _address(work: Path, node: str) -> str:
    return f"unix:{work / 'trnsim' / f'compiler-{node}.sock'}"


def _stop(address: str) -> None:
    """Stops an auto-started daemon (SIGTERM drains it) and waits for it to be gone."""
    info = launcher.get_info(address, timeout=2)
    if info is None:
        return
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while not gone(info.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["killed", "paused", "forged", "flushed"])
def test_a_host_trains_right_whatever_befalls_the_store(short_tmp, redis_server, key_file, fault):
    """The second host trains (losses and weights equal CPU's, checked by the script) after the
    store was killed, paused past its deadline, had every entry replaced by a forgery, or was
    flushed: it compiles what it cannot get, and serves no forged entry."""
    remote = {
        "NEURON_CACHE_REMOTE": redis_server.url,
        "NEURON_CACHE_REMOTE_KEY_FILE": str(key_file),
        "NEURON_CACHE_REMOTE_DEADLINE": str(DEADLINE_S),
    }
    try:
        first = _train_on_host("h1", short_tmp, remote)
        deadline = time.monotonic() + 10
        while daemon_stats(_address(short_tmp, "h1")).remote.puts < first.compiles:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        raw = redis_server.client()
        assert redis_server.proc is not None
        if fault == "killed":
            redis_server.stop()
        elif fault == "paused":
            redis_server.proc.send_signal(signal.SIGSTOP)
        elif fault == "forged":
            for name in raw.keys(PREFIX + "*"):
                entry = svc.RemoteEntry.FromString(raw.get(name))
                raw.set(name, seal(b"not the cluster key, 32 bytes...", name.decode()[len(PREFIX) :],
                                   entry.compiler_version, svc.ExecutableBlob.FromString(entry.blob)))  # fmt: skip
        else:
            raw.flushdb()
        began = time.monotonic()
        second = _train_on_host("h2", short_tmp, remote)
        took = time.monotonic() - began
        assert second.compiles == first.compiles and second.remote.hits == 0
        if fault in ("killed", "paused"):
            assert second.remote.off and second.remote.errors >= 1
            assert second.remote.skipped > 0, "one deadline, then not asked"
        if fault == "forged":
            assert second.remote.signature_failures == first.compiles
        print(f"{fault}: second host trained in {took:.1f} s; {second.remote}")
    finally:
        if redis_server.proc is not None:
            redis_server.proc.send_signal(signal.SIGCONT)
        for node in ("h1", "h2"):
            _stop(_address(short_tmp, node))
