"""A daemon that stops answering (SIGSTOP: it holds its socket, the kernel accepts
connections, nothing answers) costs a client seconds, not the hang; a daemon busy with a
long compile is not taken for a hung one; the client goes back to the daemon once it
answers again; `trnsim daemon status` tells a hung daemon from an absent one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from trnsim.cli import main as cli
from trnsim.client.core import compile_client as cc
from trnsim.client.core.compile_client import DaemonCompileClient, Tier
from trnsim.daemon import launcher

from .helpers import DaemonProcess, job, start_daemon

H = cc.HEALTH_DEADLINE_S  # 1 s unless NEURON_COMPILE_HEALTH_DEADLINE says otherwise


@contextmanager
def stopped(d: DaemonProcess) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) for the block; continued after it, whatever happens (a
    stopped process does not act on SIGTERM: the fixture could not stop it)."""
    os.kill(d.pid(), signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(d.pid(), signal.SIGCONT)


def timed_compile(client: DaemonCompileClient, i: int) -> tuple[cc.Compiled, float]:
    t = time.monotonic()
    compiled = client.compile(job(i))
    return compiled, time.monotonic() - t


def until_due(client: DaemonCompileClient) -> None:
    """Sleeps until the client's back-off lets it ask the daemon again."""
    time.sleep(max(0.0, client._backoff.retry_at - time.monotonic()) + 0.05)


def test_a_compile_waiting_on_a_hung_daemon_is_compiled_here_within_seconds(daemon):
    """The stream is open and a compile waits when the daemon stops: the watchdog's health
    check goes unanswered and the compile is done here, once, with the right executable;
    a background compile waiting on the same stream is done here too. After SIGCONT and
    the back-off, compiles go to the daemon again."""
    client = DaemonCompileClient(daemon.address, auto_start=False)
    try:
        assert client.compile(job(1)).tier is Tier.COMPILED
        with stopped(daemon):
            background = client.compile_async(job(2))
            with pytest.warns(RuntimeWarning, match="did not answer a health check"):
                compiled, seconds = timed_compile(client, 3)
            assert seconds <= 2 * H + 1.0, f"{seconds:.1f} s waiting on a hung daemon"
            assert compiled.tier is Tier.IN_PROCESS and compiled.executable.cache_key == job(3).key
            assert background.result(timeout=10).tier is Tier.IN_PROCESS
            assert client.local.compiles == 2 and client.fallbacks == 2
        until_due(client)
        compiled, _ = timed_compile(client, 3)
        assert compiled.tier is not Tier.IN_PROCESS, "back to the daemon after SIGCONT"
        assert client.local.compiles == 2 and client.tiers.get("COMPILED", 0) >= 2, client.tiers
    finally:
        client.close()


def test_a_daemon_busy_with_a_long_compile_is_not_taken_for_hung(short_tmp):
    """A compile of several seconds (the worker burns CPU for it) while the daemon's event
    loop answers health checks: the client waits for the daemon's answer, compiles nothing
    itself and warns of nothing."""
    d = start_daemon(short_tmp, "--workers", "1", env={"NEURON_SIM_COMPILE_SCALE": "15"})
    client = DaemonCompileClient(d.address, auto_start=False)
    try:
        compiled, seconds = timed_compile(client, 4)  # (0.23 modelled s: ~3.5 s burnt)
        assert seconds > 2 * H + 0.5, f"the compile took only {seconds:.1f} s: not a test"
        assert compiled.tier is Tier.COMPILED and client.fallbacks == 0
    finally:
        client.close()
        d.stop()


@pytest.mark.parametrize(
    "auto_start",
    [pytest.param(False, marks=pytest.mark.slow), True],  # (auto covers the address case too)
    ids=["address", "auto"],
)
def test_a_client_started_during_a_hang_pays_the_health_deadline_at_most(daemon, auto_start):
    """A process that starts while the daemon is stopped: its first compile waits out one
    short handshake (not the 10 s GetInfo), the next ones none until the back-off ends,
    which grows; in auto mode no second daemon is started beside the stopped one, and the
    process does not give the daemon up for good. After SIGCONT it goes back to it."""
    client = DaemonCompileClient(daemon.address, auto_start=auto_start)
    spawned_log = daemon.address.removeprefix("unix:").rsplit("/", 1)[0] + "/daemon.log"
    try:
        with stopped(daemon):
            with pytest.warns(RuntimeWarning, match="did not answer within"):
                _, first = timed_compile(client, 5)
            assert first <= H + 1.0, f"first compile during the hang: {first:.1f} s"
            times = [timed_compile(client, 6 + i)[1] for i in range(3)]
            assert max(times) < 0.5 * H, f"compiles within the back-off waited: {times}"
            assert client._backoff.failures == 1 and client._backoff.retry_at < float("inf")
            until_due(client)
            _, again = timed_compile(client, 9)
            assert again <= H + 1.0 and client._backoff.failures == 2, "asked again, backed off"
            assert client.local.compiles == 5 and client.tiers == {}
        assert not os.path.exists(spawned_log), "no daemon was started beside the stopped one"
        until_due(client)
        compiled, _ = timed_compile(client, 5)
        assert compiled.tier is Tier.COMPILED and client.tiers == {"COMPILED": 1}
        assert launcher.get_info(daemon.address, timeout=2).pid == daemon.pid()
    finally:
        client.close()


def test_status_tells_a_hung_daemon_from_an_absent_one(daemon, capsys):
    with stopped(daemon):
        t = time.monotonic()
        assert cli(["daemon", "status", "--address", daemon.address]) == 1
        assert time.monotonic() - t < 5
        out = capsys.readouterr().out
        assert f"running (pid {daemon.pid()}, stopped), not answering" in out, out
        assert f"kill -CONT {daemon.pid()}" in out
    assert cli(["daemon", "status", "--address", daemon.address]) == 0
    assert "running: pid" in capsys.readouterr().out
    daemon.stop()
    assert cli(["daemon", "status", "--address", daemon.address]) == 3
    assert "not running" in capsys.readouterr().out


def test_the_health_deadline_is_read_in_env(monkeypatch):
    from trnsim.client.core import env

    monkeypatch.delenv("NEURON_COMPILE_HEALTH_DEADLINE", raising=False)
    assert env.health_deadline_s() == 1.0
    monkeypatch.setenv("NEURON_COMPILE_HEALTH_DEADLINE", "2.5")
    assert env.health_deadline_s() == 2.5
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("NEURON_COMPILE_HEALTH_DEADLINE", bad)
        with pytest.raises(env.ConfigError, match="expected seconds"):
            env.health_deadline_s()


def test_a_running_daemon_slow_to_answer_is_not_taken_for_hung_until_wedged():
    """A silent daemon whose process runs is loaded (64 clients on 2 cores kept health checks
    waiting over 1 s): it is asked again, and taken for hung only after wedged_s; one whose
    process is stopped is taken for hung at the first unanswered check."""
    from trnsim.client.core.daemon_health import Watchdog

    def watch(stopped: bool) -> tuple[list[float], Watchdog]:
        hung: list[float] = []
        start = time.monotonic()
        dog = Watchdog(
            0.2,
            check=lambda: time.sleep(0.2) or False,  # (no answer within the deadline)
            waiting=lambda: True,
            hung=lambda why: hung.append(time.monotonic() - start),
            stopped=lambda: stopped,
            wedged_s=2.0,
        )
        dog.request_sent()
        return hung, dog

    stopped, dog1 = watch(True)
    running, dog2 = watch(False)
    try:
        time.sleep(1.2)
        assert len(stopped) == 1 and stopped[0] < 1.0, stopped
        assert running == [], "a running daemon is given wedged_s"
        time.sleep(1.8)
        assert len(running) == 1 and 2.0 <= running[0] < 3.0, running
    finally:
        dog1.stop()
        dog2.stop()
