"""Benchmark job functions (importable by name from children)."""

from __future__ import annotations

import os
import time


def noop(x: int) -> int:
    return x


def inc(x: int) -> int:
    """One link of a chain: the previous job's result plus one."""
    return x + 1


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def stamp() -> float:
    """When the job started, by the wall clock (compared with the submit time in another process)."""
    return time.time()


def wait_for_file(path: str, limit: float) -> bool:
    """Occupy a worker until ``path`` exists (at most ``limit`` seconds)."""
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def sleep_tree(seconds: float, pidfile: str) -> float:
    """Start a ``sleep`` subprocess (a grandchild the timeout must kill too), note its pid, sleep."""
    import subprocess

    proc = subprocess.Popen(["sleep", str(int(seconds) + 1)])
    with open(pidfile, "w") as f:
        f.write(str(proc.pid))
    time.sleep(seconds)
    return seconds
