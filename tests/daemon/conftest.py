"""Daemon tests run real daemons on temporary sockets and caches (never the user's)."""

from __future__ import annotations

import os
import shutil
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
