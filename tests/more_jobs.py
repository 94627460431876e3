"""Job functions for the tests of what a new user trips on (issue 20): importable by name from the children."""

from __future__ import annotations

import threading
from typing import Any


class NeedsCode(Exception):
    """An exception whose ``__init__`` takes an extra required argument: pickles, but cannot be unpickled."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_needs_code(message: str, code: int) -> None:
    raise NeedsCode(message, code)


class Token:
    """A result object a test can take a weak reference to."""

    def __init__(self, value: int) -> None:
        self.value = value


def make_token(i: int) -> Token:
    return Token(i)


class Counted:
    """An iterable that counts how many items have been taken from it (thread-safe)."""

    def __init__(self, items: Any) -> None:
        self._items = iter(items)
        self._lock = threading.Lock()
        self.taken = 0

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Any:
        with self._lock:
            item = next(self._items)
            self.taken += 1
            return item
