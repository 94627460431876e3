"""Waiting in tests for something another thread or process does: one helper, not a loop per test."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.01) -> bool:
    """Whether ``predicate()`` holds within ``timeout`` seconds (checked every ``step``; once more at the end)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
