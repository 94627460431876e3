"""Many executors on one database: one clock (the server's), and a registry that finds the dead quickly.

A process whose ``time.time()`` runs 90 s ahead or behind (shifted by a
``sitecustomize`` in its environment, children included) must behave exactly
like one in sync; an executor killed on this machine has its jobs rescued
within seconds, not a lease TTL.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import event

import jobs
from clitools import cli, cli_env, start_worker
from dbexecutor import DBExecutor
from test_faults import DRIVER, _tail

T = 60


def _shifted(tmp_path: Path, seconds: float) -> dict[str, str]:
    """An environment whose Python processes read a wall clock ``seconds`` off (time.time and time.time_ns)."""
    site = tmp_path / f"shift{int(seconds)}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time\n"
        f"_off = {float(seconds)!r}\n"
        "_time, _time_ns = time.time, time.time_ns\n"
        "time.time = lambda: _time() + _off\n"
        "time.time_ns = lambda: _time_ns() + int(_off * 1e9)\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(predicate: Any, timeout: float, what: str, log: str | None = None) -> float:
    """Seconds until ``predicate()`` holds (fails after ``timeout``)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what} within {timeout:g} s" + (f"\n{_tail(log)}" if log else ""))
        time.sleep(0.05)
    return time.monotonic() - start


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _signal_tree(pid: int, sig: int) -> None:
    for proc in _tree(pid):
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _freeze_between_transactions(db: Any, pid: int, tries: int = 200) -> None:
    """SIGSTOP the process tree of ``pid`` at a moment it holds no write lock.

    On SQLite a process frozen inside a write transaction (a lease renewal,
    a poll that writes) holds the file's one write lock: nobody could take
    its job over, whatever the leases say (as ``test_job_transactions``
    skips for SQLite). On the servers a transaction locks rows, and the
    executor's are short; there it is frozen wherever it is.
    """
    for _ in range(tries):
        _signal_tree(pid, signal.SIGSTOP)
        if db.kind != "sqlite":
            return
        probe = sqlite3.connect(db.url.removeprefix("sqlite:///"), timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            _signal_tree(pid, signal.SIGCONT)  # frozen mid-write: let it finish, and try again
            time.sleep(0.01)
        finally:
            probe.close()
    raise AssertionError(f"could not freeze process {pid} outside a write transaction in {tries} tries")


def _driver(db: Any, tmp_path: Path, name: str, *args: Any, **options: Any) -> tuple[subprocess.Popen[bytes], str]:
    log = str(tmp_path / f"{name}.log")
    opts = {**db.options, "max_workers": 1, **options}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, DRIVER, args[0], db.url, json.dumps(opts), *[str(a) for a in args[1:]]],
            stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp_path), env=cli_env(),
        )
    return proc, log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        _signal_tree(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_worker_whose_clock_runs_ahead_never_reruns_a_live_job(db, tmp_path):
    record = tmp_path / "runs"
    ex = db.executor(1, lease_ttl=3.0)
    assert ex.submit(jobs.identity, 0).result(timeout=T) == 0  # its child is up
    # A worker 90 s ahead, looking for expired leases every second: with its own
    # clock, every lease of this executor would look long expired.
    log = str(tmp_path / "ahead.log")
    worker = start_worker(db, log, "--max-workers", "1", "--lease-ttl", "2", env=_shifted(tmp_path, 90))
    store = db.store()
    try:
        kinds = lambda: {e.kind for e in store.executors() if e.alive}  # noqa: E731
        _wait_for(lambda: kinds() == {"executor", "worker"}, T, "the worker registering", log)
        # Submitted to an idle executor: leased by its own insert, so the worker cannot claim it.
        fut = ex.submit(jobs.fault_record_then_sleep, str(record), "run", 3.0)
        assert fut.result(timeout=T) == "run"
        assert _lines(record) == ["run"], "the live job ran a second time"
        assert [a.outcome for a in db.attempts(fut.job_id)] == ["ok"]
        assert db.row(fut.job_id).lease_owner is None and "reclaimed" not in open(log).read()
    finally:
        store.close()
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)


def test_a_worker_whose_clock_runs_behind_rescues_a_frozen_executors_job_within_the_ttl(db, tmp_path):
    record = tmp_path / "runs"
    ttl = 3.0
    frozen, log = _driver(db, tmp_path, "frozen", "record", record, 30, lease_ttl=ttl)
    worker = None
    try:
        _wait_for(lambda: _lines(record), T, "the job starting", log)
        # Frozen, not dead: its process exists, so only its lapsed lease can tell.
        _freeze_between_transactions(db, frozen.pid)
        stopped = time.monotonic()
        worker = start_worker(db, str(tmp_path / "behind.log"), "--max-workers", "1", env=_shifted(tmp_path, -90))
        # A worker 90 s behind would think the lease had 93 s left; on the server's clock it has ttl.
        _wait_for(lambda: len(_lines(record)) == 2, ttl + 15, "the frozen executor's job rerun", str(tmp_path / "behind.log"))
        assert time.monotonic() - stopped < ttl + 15
        outcomes = [a.outcome for a in db.attempts()]
        assert outcomes[0] == "lease expired", outcomes
    finally:
        _stop(frozen)
        if worker is not None:
            _stop(worker)


def test_a_killed_executors_job_on_this_host_is_rerun_within_seconds(db, tmp_path):
    record = tmp_path / "runs"
    # A lease that would keep the job for a minute: only the registry can tell sooner.
    victim, log = _driver(db, tmp_path, "victim", "record", record, 60, lease_ttl=60.0)
    try:
        _wait_for(lambda: _lines(record), T, "the job starting", log)
    except BaseException:
        _stop(victim)
        raise
    _signal_tree(victim.pid, signal.SIGKILL)
    victim.wait(10)
    # Before anyone rescues it, status says whose job it is and that it will be rescued at once.
    status = cli(db, "status", "--json")
    (held,) = json.loads(status.stdout)["running"]
    assert (held["worker_alive"], held["rescue_in"]) == (False, 0.0), held
    assert "(dead; rescued at the next look)" in cli(db, "status").stdout
    ex = DBExecutor.attach(db.url, max_workers=1, **{**db.options, "lease_ttl": 60.0})
    db.executors.append(ex)
    took = _wait_for(lambda: len(_lines(record)) == 2, 5.0, "the job rerun after its executor was killed")
    assert took < 5.0
    (job,) = db.jobs()
    (first, *_) = db.attempts(job.id)
    assert first.outcome == "executor died" and first.attempt == 1
    store = db.store()
    try:
        listed = {e.name: e for e in store.executors()}
    finally:
        store.close()
    dead = [e for e in listed.values() if not e.alive]
    assert len(dead) == 1 and dead[0].stopped_at is not None and dead[0].pid == victim.pid
    assert any(e.alive and e.pid == os.getpid() for e in listed.values())


def test_work_submitted_elsewhere_starts_without_waiting_for_a_poll(db, tmp_path):
    """Each side polls only every 30 s: a job that runs and comes back within seconds was woken up.

    On PostgreSQL a NOTIFY does it; on SQLite and MariaDB a datagram to each
    registered executor (``dbexecutor.doorbell``).
    """
    slow = {**db.options, "poll_interval": 30.0}
    code = (
        "import sys, time\n"
        "from dbexecutor import DBExecutor\n"
        f"ex = DBExecutor({db.url!r}, 1, queues='*', **{slow!r})\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    log = tmp_path / "executor.log"
    with open(log, "wb") as out:
        runner = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    try:
        store = db.store()
        try:
            _wait_for(lambda: any(e.alive and e.kind == "executor" for e in store.executors()), T, "the executor up", str(log))
        finally:
            store.close()
        submitter = DBExecutor(db.url, 1, **{**slow, "run_jobs": False})
        db.executors.append(submitter)
        for i in range(3):
            started = time.monotonic()
            assert submitter.submit(jobs.identity, i).result(timeout=20) == i
            assert time.monotonic() - started < 10, "nothing woke the other side: it waited for its poll"
    finally:
        _stop(runner)


def test_an_executor_that_just_registered_hears_of_the_next_finish(db):
    """A job of this executor finished by another, which had read whom to ring a moment before this one started.

    Both poll only every 30 s. An executor reuses its list of peers for a
    couple of seconds: without the newcomer's hello (``dbexecutor.doorbell``)
    the finish would not reach it, and its future would wait for its poll.
    On PostgreSQL the NOTIFY reaches every listener anyway.
    """
    slow = {"poll_interval": 30.0}
    runner = db.executor(1, **slow)
    runner.submit(jobs.identity, 0).result(timeout=T)  # its last ring read the peers: itself alone
    submitter = db.executor(1, run_jobs=False, **slow)
    fut = submitter.submit(jobs.sleep, 0.3, "x")
    started = time.monotonic()
    assert fut.result(timeout=10) == "x"  # its poll would come after 30 s
    assert time.monotonic() - started < 5, "the finish did not reach the new executor: it waited for its poll"


def test_a_durable_submit_is_one_statement_and_still_wakes_the_others(db):
    """A durable submit of one job runs one statement, its ``INSERT``, and an executor elsewhere starts it at once.

    On PostgreSQL the notification rides in the ``INSERT`` (``pg_notify()``
    in its ``RETURNING``) instead of a statement of its own; on SQLite and
    MariaDB it is a datagram sent after the commit. Both sides poll only
    every 30 s.
    """
    slow = {"poll_interval": 30.0}
    runner = db.executor(1, **slow)
    runner.submit(jobs.identity, 0).result(timeout=T)
    submitter = db.executor(1, run_jobs=False, durable_submit=True, **slow)
    submitter.submit(jobs.identity, 1).result(timeout=T)  # its group row is written once, with its first job
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # Not counted: BEGIN, and the look at whether another executor is alive to hear a NOTIFY
        # (PostgreSQL, at most every 2 s, in whichever transaction notifies next).
        if threading.current_thread() is threading.main_thread() and not statement.lstrip().upper().startswith("BEGIN"):
            if "_executors" not in statement:
                statements.append(statement)

    engine = submitter._store.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        for i in range(3):
            statements.clear()
            started = time.monotonic()
            fut = submitter.submit(jobs.identity, i)
            assert len(statements) == 1 and statements[0].lstrip().upper().startswith("INSERT"), statements
            assert fut.result(timeout=20) == i
            assert time.monotonic() - started < 10, "nothing woke the other side: it waited for its poll"
    finally:
        event.remove(engine, "before_cursor_execute", seen)
