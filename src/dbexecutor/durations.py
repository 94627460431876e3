"""Durations as people write them: ``90``, ``90s``, ``30m``, ``1h30m``, ``7d``, ``2w``.

One parser for the command line and the Python API, so that ``--timeout 30m``
and ``ex.options(timeout="30m")`` mean the same thing::

    "1h30m" ──parse_duration──► 5400.0
    5400, 5400.0, "1h30m", timedelta(hours=1.5) ──seconds──► 5400.0
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

from .errors import ConfigurationError

__all__ = ["DurationError", "parse_duration", "seconds", "Duration", "format_age"]

#: What the API accepts wherever it takes a duration.
Duration = float | int | str | timedelta

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s|)", re.IGNORECASE)
_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}
_EXAMPLES = "e.g. 90, 90s, 30m, 12h, 7d, 2w or 1h30m"


class DurationError(ConfigurationError, argparse.ArgumentTypeError):
    """A duration that cannot be read.

    A :class:`~dbexecutor.ConfigurationError` (so a ``ValueError``) for the
    API; an ``argparse.ArgumentTypeError`` too, so that the command line
    prints this message rather than argparse's generic "invalid value".
    """


def parse_duration(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``1h30m``, ``90s``, ``2w`` or a plain number of seconds.

    Units: ``w`` weeks, ``d`` days, ``h`` hours, ``m`` minutes, ``s`` (or
    none) seconds, combined largest first or in any order; spaces are ignored.
    Raises :class:`DurationError` for anything else.
    """
    compact = text.strip().replace(" ", "")
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise DurationError(f"not a duration: {text!r} (use {_EXAMPLES})")
    return sum(float(n) * _UNITS[u.lower()] for n, u in parts)


def seconds(value: Duration | None, name: str) -> float | None:
    """``value`` in seconds: a number, a duration string (see :func:`parse_duration`) or a ``timedelta``.

    ``None`` stays ``None``. ``name`` is the option's name, for the error:
    :class:`DurationError` for a string that is not a duration, ``TypeError``
    for anything that is not a number, a string or a ``timedelta``. Ranges
    (> 0, finite ...) are the caller's to check: they differ per option.
    """
    if value is None:
        return None
    # bool is an int, but timeout=True is a mistake, not one second.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except DurationError as error:
            raise DurationError(f"{name}: {error}") from None
    raise TypeError(
        f"{name} must be a number of seconds, a duration string ({_EXAMPLES}) or a timedelta, "
        f"not {type(value).__name__}"
    )


def format_age(seconds: float | None) -> str:
    """A duration in a few characters, for people: ``4.2s``, ``3m05s``, ``2h10m``, ``3d04h`` (``-`` for None)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"
