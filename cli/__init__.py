"""The `trnsim` command, the floor above the client and the daemon: it imports both, and
imports the client (and so torch) only in the commands that run it."""

from __future__ import annotations

from trnsim.cli.main import main

__all__ = ["main"]
