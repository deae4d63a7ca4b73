"""`trnsim doctor`: is this host ready to train on the simulated chip? One line per check,
each failure with the fix. Torch's side (its version, the device's autoload, the NEURON_*
variables) runs in a process of its own (client/api/doctor.py): a broken or hanging torch must
not break the doctor, and the probe runs an op with none of the user's NEURON_* variables
set. Then the daemon (reachable, the same compiler version), the socket's and the cache's
directories (private to the user), the cache's database, free disk and memory."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
from trnsim import compiler
from trnsim.daemon import launcher
from trnsim.daemon.config import ConfigError, DaemonConfig, check_private_dir, socket_path
from trnsim.daemon.options import config_from

MIN_FREE_DISK = 1 << 30  # the cache's disk tier needs room to grow
MIN_FREE_MEMORY = 2 << 30  # torch, a model and the daemon's workers


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def torch_checks() -> tuple[list[Check], str]:
    """The client probe's checks, and the NEURON_COMPILE_DAEMON setting it read."""
    # The probe runs an op: it must start no daemon and write none of a run's files. The
    # variables it checks are the user's, handed over apart.
    variables = {k: v for k, v in os.environ.items() if k.startswith("NEURON_")}
    probe_env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}
    probe_env.update(NEURON_COMPILE_DAEMON="off", TRNSIM_DOCTOR_VARIABLES=json.dumps(variables))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "trnsim.client.api.doctor"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=probe_env,
        )
    except subprocess.TimeoutExpired:
        return [
            Check("torch", False, "importing torch took over 300 s", "check the machine's load")
        ], "auto"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [
            Check(
                "torch",
                False,
                f"import torch with trnsim failed: {last}",
                "pip install torch==2.13.0 -e . (in trnsim's checkout), in this Python "
                f"({sys.executable})",
            )
        ], "auto"
    checks, setting = [], "auto"
    for line in out.stdout.splitlines():
        item = json.loads(line)
        if item["name"] == "compile daemon setting":
            setting = item["detail"]
            continue
        checks.append(Check(item["name"], item["ok"], item["detail"], item["fix"]))
    return checks, setting


def daemon_check(setting: str, config: DaemonConfig) -> Check:
    if setting == "off":
        return Check(
            "daemon",
            True,
            "NEURON_COMPILE_DAEMON=off: compiles run in each process; nothing is shared "
            "between processes and no executable is kept on disk",
        )
    address = config.address if setting == "auto" else setting
    if ":" not in address:
        address = f"unix:{address}"
    try:
        info = launcher.get_info(
            address, version=compiler.compiler_version(), fmt=compiler.FORMAT_VERSION
        )
    except Exception as e:  # noqa: BLE001  (an untrusted socket, a bad address: reported)
        return Check("daemon", False, f"{address}: {e}", "remove the socket or set another address")
    if info is None:
        if setting == "auto":
            return Check(
                "daemon",
                True,
                f"none running on {address}; the first compile starts one (it exits after "
                f"600 s idle)",
            )
        return Check(
            "daemon",
            False,
            f"nothing answers on {address} (NEURON_COMPILE_DAEMON={setting})",
            f"trnsim daemon start --address {address}, or unset NEURON_COMPILE_DAEMON",
        )
    if not info.compatible:
        return Check(
            "daemon",
            False,
            f"pid {info.pid} on {address} runs compiler {info.compiler_version}, this "
            f"install {compiler.compiler_version()}: clients compile in process",
            f"trnsim daemon stop --address {address}; the next compile starts a current one",
        )
    return Check(
        "daemon",
        True,
        f"pid {info.pid} on {address}, compiler {info.compiler_version}, same version",
    )


def directory_check(name: str, path: Path | None) -> Check:
    if path is None:
        return Check(name, True, "not a Unix socket (TCP)")
    if not path.exists():
        return Check(name, True, f"{path} (made on first use)")
    try:
        check_private_dir(path)
    except ConfigError as e:
        return Check(name, False, str(e), f"chmod 700 {path}")
    if not os.access(path, os.W_OK | os.X_OK):
        return Check(name, False, f"{path} is not writable by you", f"chmod u+rwx {path}")
    return Check(name, True, f"{path} (private to you)")


def cache_health_check(cache_dir: Path) -> Check:
    db = cache_dir / "executables" / "cache.db"
    if not db.exists():
        return Check("cache", True, f"{db.parent} (empty: made on first compile)")
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            result = conn.execute("PRAGMA quick_check").fetchone()[0]
            entries = conn.execute("SELECT COUNT(*) FROM Cache").fetchone()[0]
    except sqlite3.Error as e:
        return Check(
            "cache", False, f"{db}: {e}", "trnsim cache verify (moves a damaged database aside)"
        )
    if result != "ok":
        return Check(
            "cache",
            False,
            f"{db}: {result}",
            "trnsim cache verify (moves a damaged database aside)",
        )
    return Check("cache", True, f"{db.parent}: {entries} entries, database intact")


def resource_checks(cache_dir: Path) -> list[Check]:
    existing = cache_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    available = psutil.virtual_memory().available
    return [
        Check(
            "disk",
            free >= MIN_FREE_DISK,
            f"{free / 2**30:.1f} GiB free at {existing}",
            "" if free >= MIN_FREE_DISK else "free space there, or set NEURON_CACHE_DIR elsewhere",
        ),
        Check(
            "memory",
            available >= MIN_FREE_MEMORY,
            f"{available / 2**30:.1f} GiB available",
            "" if available >= MIN_FREE_MEMORY else "stop other work; trnsim needs about 2 GiB",
        ),
    ]


def run(config: DaemonConfig) -> list[Check]:
    checks, setting = torch_checks()
    address = config.address if setting in ("auto", "off") else setting
    if ":" not in address:
        address = f"unix:{address}"
    socket = socket_path(address)
    checks += [
        daemon_check(setting, config),
        directory_check("socket directory", socket.parent if socket else None),
        directory_check("cache directory", config.cache_dir),
        cache_health_check(config.cache_dir),
        *resource_checks(config.cache_dir),
    ]
    return checks


def report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"      fix: {c.fix}")
    failed = sum(not c.ok for c in checks)
    lines.append(f"{len(checks)} checks, {failed} failed")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = run(config_from(args))
    print(report(checks))
    return 0 if all(c.ok for c in checks) else 1
