"""Running the ``dbexecutor`` command line, for the CLI, worker and security tests.

:func:`cli` runs a command in the test's own process (``dbexecutor.cli.main``,
as the entry point calls it): a fresh interpreter per command cost 0.5-0.9 s
of imports, most of the CLI tests' time. :func:`cli_process` and
:func:`start_worker` run the real ``python -m dbexecutor`` where the process
itself is under test (the entry point, signals, a worker's life).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from dbexecutor.cli import main as cli_main

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


@contextlib.contextmanager
def _dbexecutor_environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ``'s ``DBEXECUTOR_*`` variables as in ``env`` for a while (the others stay: threads may read them)."""
    names = {n for n in (*os.environ, *env) if n.startswith("DBEXECUTOR_")}
    saved = {n: os.environ.get(n) for n in names}
    for name in names:
        if name in env:
            os.environ[name] = env[name]
        else:
            os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_main(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``dbexecutor ARGS`` in this process, with ``env``'s ``DBEXECUTOR_*`` variables (default :func:`cli_env`'s)."""
    out, err = io.StringIO(), io.StringIO()
    with _dbexecutor_environment(env or cli_env()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(list(args), out=out)
        except SystemExit as stopped:  # argparse's usage errors, as the entry point would exit
            code = 0 if stopped.code is None else stopped.code if isinstance(stopped.code, int) else 1
    return subprocess.CompletedProcess(["dbexecutor", *args], code, out.getvalue(), err.getvalue())


def cli(db: Any, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``dbexecutor ARGS --url URL --prefix PREFIX``, run in this process (:func:`run_main`)."""
    return run_main(*args, "--url", db.url, "--prefix", db.prefix, env=env)


def cli_process(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m dbexecutor ARGS`` in a fresh interpreter, waited for."""
    return subprocess.run(
        [sys.executable, "-m", "dbexecutor", *args],
        capture_output=True, text=True, env=dict(env or cli_env()), timeout=timeout,
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
