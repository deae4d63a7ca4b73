"""Daemon tests run real daemons on temporary sockets and caches (never the user's)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .helpers import DaemonProcess, start_daemon


@pytest.fixture
def short_tmp():
    """A short temporary directory: Unix socket paths are limited to ~107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="trn-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(short_tmp):
    d: DaemonProcess = start_daemon(short_tmp, "--workers", "2")
    yield d
    d.stop()


@pytest.fixture
def tmpfs(short_tmp):
    """A mounted tmpfs of a given size under short_tmp (needs root): for a full disk and a
    read-only remount. Skips, with the reason, where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "16m") -> Path:
        path = short_tmp / name
        path.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


OTHER_USER = "trnsim-other"


@pytest.fixture(scope="session")
def other_user():
    """(uid, gid) of a second local account, created when the tests run as root; without
    root there is no other account to act as, and the test is skipped with that reason."""
    if os.getuid() != 0:
        pytest.skip("acting as another local user needs root (to create and become one)")
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(OTHER_USER)
    return entry.pw_uid, entry.pw_gid
