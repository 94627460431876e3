"""Running the real ``dbexecutor`` command line as a subprocess, for the CLI, worker and security tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# The worktree's src: the package may not be installed (here), or installed editable (CI).
SRC_DIR = os.path.join(os.path.dirname(TESTS_DIR), "src")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI subprocess: ours, with src and tests (job functions) importable."""
    env = dict(os.environ)
    parts = [SRC_DIR, TESTS_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("DBEXECUTOR_SECRET", None)
    env.pop("DBEXECUTOR_URL", None)
    env.update(extra)
    return env


def cli(db: Any, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m dbexecutor ARGS --url URL --prefix PREFIX``, waited for."""
    return subprocess.run(
        [sys.executable, "-m", "dbexecutor", *args, "--url", db.url, "--prefix", db.prefix],
        capture_output=True, text=True, env=env or cli_env(), timeout=timeout,
    )


def start_worker(db: Any, log_path: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``dbexecutor worker`` on the test's tables, logging to ``log_path`` (a file: a full pipe would block it)."""
    # A worker refuses an SQLite file that does not exist: create the tables first, as a deployment would.
    db.store().close()
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dbexecutor", "worker", db.url, "--prefix", db.prefix,
             "--poll-interval", "0.05", "--log-level", "DEBUG", *args],
            stdout=out, stderr=subprocess.STDOUT, env=env or cli_env(),
        )


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def wait_for_log(path: str, text: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Wait until ``text`` appears in the log (fails early if the process exits)."""
    end = time.monotonic() + timeout
    while text not in read(path):
        assert proc.poll() is None, f"worker exited with {proc.returncode}:\n{read(path)[-3000:]}"
        assert time.monotonic() < end, f"{text!r} not logged within {timeout} s:\n{read(path)[-3000:]}"
        time.sleep(0.05)


def running_on_worker(db: Any, log_path: str, proc: subprocess.Popen[bytes], fn: Any, *args: Any,
                      states: tuple[str, ...] = ("running",), timeout: float = 60) -> Any:
    """Submit ``fn(*args)`` from a submit-only executor and wait until the worker ``proc`` holds it in ``states``.

    Returns the job's future; fails early if the worker exits.
    """
    wait_for_log(log_path, "serving", proc)
    fut = db.executor(1, run_jobs=False).submit(fn, *args)
    end = time.monotonic() + timeout
    while db.row(fut.job_id).state not in states:
        assert proc.poll() is None, f"worker exited with {proc.returncode}:\n{read(log_path)[-3000:]}"
        assert time.monotonic() < end, f"job {fut.job_id} not {'/'.join(states)} within {timeout} s:\n{read(log_path)[-3000:]}"
        time.sleep(0.05)
    return fut


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """SIGTERM a worker and wait for it; kill it if it does not stop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the worker did not stop on SIGTERM")
    return proc.returncode
