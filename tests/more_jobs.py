"""Job functions for the tests of what a new user trips on (issue 20): importable by name from the children."""

from __future__ import annotations


class NeedsCode(Exception):
    """An exception whose ``__init__`` takes an extra required argument: pickles, but cannot be unpickled."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_needs_code(message: str, code: int) -> None:
    raise NeedsCode(message, code)
