"""python -m trnsim.daemon: the same as `trnsim daemon serve` (how a client starts one)."""

from __future__ import annotations

import argparse
import sys

from trnsim.daemon import options
from trnsim.daemon.config import ConfigError
from trnsim.daemon.server import serve_in_foreground


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trnsim daemon serve")
    options.add_server_options(p)
    args = p.parse_args(argv)
    try:
        return serve_in_foreground(options.config_from(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
