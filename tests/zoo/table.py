"""Plain text tables for the zoo's command lines."""

from __future__ import annotations

from collections.abc import Sequence


def yes_no(value: bool | None) -> str:
    """yes / NO / - (not compared)."""
    return "-" if value is None else ("yes" if value else "NO")


def table(rows: Sequence[Sequence[str]], columns: Sequence[str]) -> str:
    """A plain text table with a | between columns."""
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    header = " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    rule = "-+-".join("-" * w for w in widths)
    return "\n".join(line.rstrip() for line in [header, rule, *lines])
