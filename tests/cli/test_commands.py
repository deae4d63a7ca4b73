"""The `trnsim` command's floor: every command's --help, and the commands that need no
client (the daemon's, its cache, its counters) never import torch (it takes seconds)."""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE = """
import sys
from trnsim.cli import main

for argv in (
    ["--help"],
    *[["daemon", name, "--help"] for name in ("serve", "start", "stop", "status")],
    *[[name, "--help"] for name in ("daemon", "stats", "cache", "profile", "precompile", "doctor")],
):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code == 0, argv
        continue
    raise AssertionError(f"{argv}: --help did not exit")
socket = f"unix:{sys.argv[1]}/none.sock"
assert main(["cache", "--cache-dir", sys.argv[1], "ls"]) == 2
assert main(["daemon", "status", "--address", socket]) == 3
assert main(["--address", socket, "stats"]) == 3
assert "torch" not in sys.modules, "a command that needs no client imported torch"
"""

TORCH_HELP = """
from trnsim.cli import main

for argv in (["explain", "--help"], ["registry", "--help"], ["registry", "test", "--help"]):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code == 0, argv
"""


def test_the_daemon_commands_never_import_torch(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: trnsim [-h] [--version]")
    for usage in ("trnsim daemon serve [-h] [--address ADDRESS]", "trnsim precompile [-h]"):
        assert f"usage: {usage}" in out.stdout
    assert "not running (nothing answers on unix:" in out.stdout


def test_the_client_commands_parse_their_own_arguments():
    out = subprocess.run(
        [sys.executable, "-c", TORCH_HELP], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    for usage in ("trnsim explain [-h] file", "trnsim registry [-h]", "trnsim registry test"):
        assert f"usage: {usage}" in out


def test_python_m_trnsim_daemon_is_trnsim_daemon_serve():
    """How a client starts a daemon (daemon/launcher.py): the same options."""
    out = subprocess.run(
        [sys.executable, "-m", "trnsim.daemon", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.startswith("usage: trnsim daemon serve [-h] [--address ADDRESS]")
    assert "--idle-exit IDLE_EXIT" in out and "--system" in out
