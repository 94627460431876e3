"""Durations as people write them on a command line: ``7d``, ``12h``, ``1h30m``, ``90s``."""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_duration"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s|)", re.IGNORECASE)
_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_duration(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``1h30m``, ``90s``, ``2w`` or a plain number of seconds."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION_RE.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 7d, 12h, 30m, 90s or 1h30m)")
    return sum(float(n) * _UNITS[u.lower()] for n, u in parts)
