"""Writes daemon/op_schemas.txt: every operator torch registers, with its arguments, from the
installed torch (the daemon checks requests' op names against it and never imports torch).

    python tests/daemon/op_schemas.py            # rewrite the file
    python tests/daemon/op_schemas.py --check    # exit 1 when it differs from torch's registry

Each line: "ns::op.overload" then its argument names, tab-separated; "name=" marks an argument
with a default, a trailing "*" an op that takes more arguments than it names (varargs). The
first line names the torch version it was made from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed  # (registers the c10d ops)

OUT = Path(__file__).resolve().parents[2] / "daemon" / "op_schemas.txt"


def schema_lines() -> list[str]:
    lines = []
    for name in sorted(set(torch._C._dispatch_get_all_op_names())):
        qualified, _, overload = name.partition(".")
        try:
            handle = torch._C._dispatch_find_schema_or_throw(qualified, overload)
            schema = handle.schema()
        except RuntimeError:
            continue  # (a name with kernels but no schema: nothing can call it)
        args = [f"{a.name}=" if a.has_default_value() else a.name for a in schema.arguments]
        if "..." in str(schema).split(" -> ")[0]:
            args.append("*")
        lines.append("\t".join([f"{qualified}.{overload or 'default'}", *args]))
    return [f"# torch {torch.__version__}", *lines]


def text() -> str:
    return "\n".join(schema_lines()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        same = OUT.read_text() == text()
        print("daemon/op_schemas.txt matches torch" if same else "daemon/op_schemas.txt is stale")
        return 0 if same else 1
    OUT.write_text(text())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
