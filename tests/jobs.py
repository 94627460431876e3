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


def sleep_if(x: Any, slow: Any, seconds: float) -> Any:
    """Return ``x`` at once, or after ``seconds`` when ``x == slow`` (one slow job among short ones)."""
    if x == slow:
        time.sleep(seconds)
    return x


def wait_if(x: Any, slow: Any, path: str) -> Any:
    """Return ``x`` at once, or once ``path`` exists when ``x == slow`` (one held job among short ones)."""
    if x == slow:
        wait_for_file(path)
    return x


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


# -- added for the fault-injection tests (test_faults.py, fault_driver.py) --


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def fault_dag_node(i: int, pause: float, *deps: int) -> int:
    """One node of the crash-test DAG: ``(i + sum(deps)) % 1_000_003`` after a short pause."""
    time.sleep(pause)
    return (i + sum(deps)) % 1_000_003


def fault_pid_then_sleep(pid_path: str, seconds: float) -> int:
    """Write this child's pid to ``pid_path``, then sleep (a test kills or stops it)."""
    _write_atomically(pid_path, str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def fault_segfault() -> None:
    """Crash the child with SIGSEGV."""
    import ctypes

    ctypes.string_at(0)


def fault_die_first_time(marker: str, how: str, value: Any) -> Any:
    """On the first run (no ``marker`` yet) create it and die (``how``: 'exit' or 'kill'); later return ``value``."""
    if not os.path.exists(marker):
        _write_atomically(marker, str(os.getpid()))
        if how == "exit":
            os._exit(3)
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    return value


def fault_spawn_and_hang(pid_path: str, grandchildren: int = 2, seconds: float = 10_000.0) -> None:
    """Start ``sleep 1000`` subprocesses, write "own_pid grandchild_pid..." to ``pid_path``, then sleep."""
    import subprocess

    procs = [subprocess.Popen(["sleep", "1000"]) for _ in range(grandchildren)]
    _write_atomically(pid_path, " ".join(str(p) for p in [os.getpid()] + [p.pid for p in procs]))
    time.sleep(seconds)


def fault_frozen_first(marker: str, pid_path: str, seconds: float) -> str:
    """First run: create ``marker``, write the pid, sleep, return 'first'; later runs return 'second'."""
    if os.path.exists(marker):
        return "second"
    _write_atomically(marker, "1")
    _write_atomically(pid_path, str(os.getpid()))
    time.sleep(seconds)
    return "first"


def fault_record_then_sleep(path: str, item: Any, seconds: float) -> Any:
    """Append ``item`` to ``path`` first, then sleep (a crash mid-sleep leaves the record)."""
    record(path, item)
    time.sleep(seconds)
    return item


# -- added for the process-side tests (children that never touch the database) --


def modules_seen(*_: Any) -> tuple[bool, list[str]]:
    """Whether SQLAlchemy is imported in this child, and which dbexecutor modules are."""
    import sys

    return "sqlalchemy" in sys.modules, sorted(m for m in sys.modules if m.split(".")[0] == "dbexecutor")


def total_here(*xs: Any, **kw: Any) -> tuple[Any, bool]:
    """``total(*xs, **kw)`` and whether SQLAlchemy is imported in the child that computed it."""
    import sys

    return total(*xs, **kw), "sqlalchemy" in sys.modules


_STUBBORN = """
import signal, sys, time
def noted(signum, frame):
    with open(sys.argv[1], "a") as f:
        f.write(repr(time.time()) + "\\n")
signal.signal(signal.SIGTERM, noted)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def fault_spawn_stubborn(pid_path: str, term_path: str, seconds: float = 10_000.0) -> None:
    """Start a subprocess that ignores SIGTERM (noting when it came in ``term_path``); write "own_pid its_pid"; sleep."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN, term_path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    _write_atomically(pid_path, f"{os.getpid()} {proc.pid}")
    time.sleep(seconds)


def hold_until(gate: str, started_dir: str, i: int) -> int:
    """Note that job ``i`` started (a file in ``started_dir``), then wait for ``gate`` to exist."""
    _write_atomically(os.path.join(started_dir, f"started-{i}"), str(os.getpid()))
    wait_for_file(gate, None, 120.0)
    return i


def record_then_sleep_once(path: str, seconds: float) -> int:
    """Append a line to ``path``; only the first run then sleeps (a rerun ends at once). Returns the run's number."""
    runs = len(open(path).read().splitlines()) if os.path.exists(path) else 0
    record(path, f"run {runs + 1}")
    if runs == 0:
        time.sleep(seconds)
    return runs + 1


def record_start_end(path: str, value: Any, seconds: float) -> Any:
    """Append ``start:<pid>`` to ``path``, sleep, append ``end:<pid>``: a run killed midway leaves only its start."""
    record(path, f"start:{os.getpid()}")
    time.sleep(seconds)
    record(path, f"end:{os.getpid()}")
    return value
