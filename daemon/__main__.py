"""python -m trnsim.daemon: the same as `trnsim daemon serve`."""

from __future__ import annotations

import sys

from trnsim.daemon.cli import main

if __name__ == "__main__":
    sys.exit(main(["daemon", "serve", *sys.argv[1:]]))
