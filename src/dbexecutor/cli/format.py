"""Text for the terminal and for ``--json``: tables, ages, times, progress bars and percentages, one JSON document per line."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

from ..durations import format_age


def _age(seconds: float | None) -> str:
    return format_age(seconds)


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out.write("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip() + "\n")
    for r in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = 0 if total == 0 else round(width * done / total)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _json(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, default=str, sort_keys=True) + "\n")
