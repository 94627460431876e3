"""Job functions for the tests: importable by name from the children."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def add(a: Any, b: Any) -> Any:
    return a + b


def identity(x: Any) -> Any:
    return x


def square(x: int) -> int:
    return x * x


def total(*xs: Any, **kw: Any) -> Any:
    return sum(xs) + sum(kw.values())


def echo_kwargs(**kw: Any) -> dict[str, Any]:
    return kw


def echo_args(*args: Any, **kw: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kw


class CustomError(Exception):
    """An application exception type that must come back as itself."""


def fail(message: str = "boom") -> None:
    raise CustomError(message)


def sleep(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def pid() -> int:
    return os.getpid()


def ppid() -> int:
    return os.getppid()


def exit_now(code: int) -> None:
    os._exit(code)


def record(path: str, item: Any) -> Any:
    """Append ``item`` to a file (one line per run), to count how often a job ran."""
    with open(path, "a") as f:
        f.write(f"{item}\n")
    return item


def wait_for_file(path: str, value: Any = None, timeout: float = 60.0) -> Any:
    """Block until ``path`` exists (lets a test hold a job in the running state)."""
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(path)
        time.sleep(0.02)
    return value


_initialized: list[Any] = []


def init(value: Any) -> None:
    _initialized.append(value)


def initialized() -> list[Any]:
    return list(_initialized)


def failing_init() -> None:
    raise RuntimeError("initializer failed on purpose")


def unpicklable_result() -> Any:
    return threading.Lock()


# -- added for the dependency, map/wait, shutdown, children and sharing tests --


def sleep_record(path: str, item: Any, seconds: float) -> Any:
    """Sleep, then append ``item`` to ``path`` (a slow upstream for ordering tests)."""
    time.sleep(seconds)
    return record(path, item)


def timed(seconds: float, value: Any = None) -> tuple[float, float, Any]:
    """Sleep and return (start, end, value) wall-clock times."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time(), value


def sum_list(xs: Any) -> Any:
    return sum(xs)


def fail_on(x: Any, bad: Any) -> Any:
    """Return ``x``, or raise ``CustomError`` when ``x == bad``."""
    if x == bad:
        raise CustomError(f"bad item {x}")
    return x


def fail_first_time(marker: str, value: Any) -> Any:
    """Fail (and create ``marker``) on the first run, return ``value`` on later runs."""
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("1")
        raise CustomError("first attempt fails")
    return value


def record_ppid(path: str, item: Any) -> tuple[Any, int, int]:
    """Record ``item`` and return (item, parent pid, pid) of the child that ran it."""
    record(path, item)
    return item, os.getppid(), os.getpid()
