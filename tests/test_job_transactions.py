"""Jobs whose writes commit with their completion: ``dbexecutor.transaction()``, on every database.

Each test has a user table of its own (``<prefix>items``); the faults kill or
freeze the real child that holds the transaction, then count the rows.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import pytest
from sqlalchemy import create_engine, text

import jobs
import txn_jobs
from dbexecutor import serialization
from dbexecutor.dialects import resolve
from dbexecutor.records import NewJob, Report
from test_faults import FAULT, LONG_LEASE, T, _attempts, _read_pids, _warm_up


@pytest.fixture
def items(db) -> Any:
    """The name of an empty user table ``(v)`` on the test's database, dropped afterwards."""
    name = f"{db.prefix}items"
    engine = create_engine(resolve(db.url).url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (v VARCHAR(100))"))
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {name}"))
    engine.dispose()


def _values(db, table: str) -> list[str]:
    engine = create_engine(resolve(db.url).url)
    try:
        with engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(text(f"SELECT v FROM {table}")))
    finally:
        engine.dispose()


def test_writes_commit_with_the_completion(db, items):
    ex = db.executor(2)
    fut = ex.submit(txn_jobs.insert, items, "a")
    assert fut.result(timeout=T) == "a"
    assert _values(db, items) == ["a"]
    row = db.row(fut.job_id)
    assert (row.state, row.attempt, row.lease_owner) == ("done", 1, None)
    assert serialization.loads(row.result) == "a"
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, "ok")]  # written once, by the child


def test_a_completion_whose_commit_answer_was_lost_counts_once(db, items):
    """The child's ``COMMIT`` is made, its answer lost: the child finds its attempt row and reports the job done.

    Reported as a failure (the commit's error), the parent would record a
    second outcome (``lease lost (exception)``) beside the child's ``ok``.
    """
    ex = db.executor(2)
    fut = ex.submit(txn_jobs.insert_commit_unanswered, items, "c")
    assert fut.result(timeout=T) == "c"
    assert _values(db, items) == ["c"]
    assert db.row(fut.job_id).state == "done"
    ex.shutdown()  # every report recorded
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, "ok")]


def test_a_completion_whose_commit_failed_fails_the_attempt_and_keeps_nothing(db, items):
    """The same lost connection before the ``COMMIT`` reached the server: nothing committed, the attempt failed."""
    ex = db.executor(2)
    fut = ex.submit(txn_jobs.insert_commit_unanswered, items, "f", False)
    with pytest.raises(Exception, match="connection|Lost connection|database is locked"):
        fut.result(timeout=T)
    assert _values(db, items) == []
    assert db.row(fut.job_id).state == "failed"
    assert [a for _, a, _ in _attempts(db, fut.job_id)] == [1]


def test_dependents_of_a_job_finalized_in_its_child_run(db, items):
    ex = db.executor(2)
    up = ex.submit(txn_jobs.insert, items, 5)
    down = ex.submit(jobs.add, up, 1)
    assert down.result(timeout=T) == 6
    assert _values(db, items) == ["5"]


def test_a_job_that_raises_rolls_its_writes_back(db, items):
    ex = db.executor(2)
    fut = ex.submit(txn_jobs.insert, items, "x", True)
    with pytest.raises(ValueError, match="failed after writing"):
        fut.result(timeout=T)
    assert _values(db, items) == []
    assert db.row(fut.job_id).state == "failed"


def test_a_retried_job_writes_once(db, items):
    # Fails on its first run after writing: that write is rolled back; the retry's stays.
    ex = db.executor(2, retries=1, retry_delay=0.05)
    fut = ex.submit(txn_jobs.insert, items, "r", True)
    with pytest.raises(ValueError):
        fut.result(timeout=T)
    assert _values(db, items) == []
    assert [o for _, _, o in _attempts(db, fut.job_id)] == ["exception", "exception"]


def test_an_exception_leaving_the_block_rolls_it_back(db, items):
    ex = db.executor(2)
    assert ex.submit(txn_jobs.block_raises, items, "gone").result(timeout=T) == "caught"
    assert _values(db, items) == []


def test_sqlalchemy_loads_in_a_child_only_when_a_job_asks(db, items):
    ex = db.executor(1)
    assert ex.submit(jobs.modules_seen).result(timeout=T)[0] is False
    assert ex.submit(txn_jobs.modules_after_transaction, items).result(timeout=T) is True


def test_sigkill_before_completion_leaves_nothing_and_the_rerun_writes_once(db, items, tmp_path):
    ex = db.executor(1, **{**FAULT, **LONG_LEASE, "retries": 1})
    _warm_up(ex, 1)
    marker, pid_path, gate = str(tmp_path / "ran"), str(tmp_path / "pid"), str(tmp_path / "gate")
    fut = ex.submit(txn_jobs.insert_then_wait, items, "once", marker, pid_path, gate)
    (pid,) = _read_pids(pid_path)
    os.kill(pid, signal.SIGKILL)  # mid-job: its row is written, not committed
    assert fut.result(timeout=T) == "once"
    assert _values(db, items) == ["once"]
    outcomes = [(a, o) for _, a, o in _attempts(db, fut.job_id)]
    assert outcomes == [(1, "signal 9 (SIGKILL)"), (2, "ok")], outcomes


@pytest.mark.parametrize("write_first", [False, True])
def test_a_fenced_out_attempt_commits_nothing(db, items, tmp_path, write_first):
    if write_first and db.kind == "sqlite":
        pytest.skip("on SQLite a frozen open transaction holds the one write lock: nobody could take the job over")
    a = db.executor(1, **FAULT)
    _warm_up(a, 1)
    marker, pid_path = str(tmp_path / "first-run"), str(tmp_path / "pid")
    fut = a.submit(txn_jobs.frozen_first, items, marker, pid_path, 4.0, write_first)
    (pid,) = _read_pids(pid_path)
    os.kill(pid, signal.SIGSTOP)  # past the lease: another executor takes the job over
    try:
        _warm_up(db.executor(1, **FAULT), 1)
        assert fut.result(timeout=30) == "second"
        row = db.row(fut.job_id)
        assert (row.state, row.attempt) == ("done", 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    # The woken attempt 1 writes, returns, and its completion matches no row: all rolled back.
    end = time.monotonic() + 20
    while not any(a == 1 and o.startswith("lease lost") for _, a, o in _attempts(db, fut.job_id)):
        assert time.monotonic() < end, f"the late attempt never reported: {_attempts(db, fut.job_id)}"
        time.sleep(0.1)
    assert _values(db, items) == ["second"]
    row = db.row(fut.job_id)
    assert (row.state, row.attempt) == ("done", 2)
    assert serialization.loads(row.result) == "second"


def test_a_renewal_does_not_call_a_lease_lost_that_its_own_attempt_finished(db):
    # The window between a child's commit and its Result: the parent's renewal finds the row done.
    store = db.store()
    try:
        now = store.now()
        store.insert_jobs([NewJob("f", b"", ())], now)
        (claimed,) = store.claim("me", 1, 30.0, now)
        store.finish_and_claim([Report(claimed.job_id, 1, True, b"x", "ok")], "me", 0, 30.0, now)
        renewal = store.renew_leases([(claimed.job_id, 1)], set(), 30.0, now)
        assert renewal.done == {claimed.job_id} and not renewal.lost
        assert store.renew_leases([(claimed.job_id, 2)], set(), 30.0, now).lost == {claimed.job_id}
    finally:
        store.close()


def test_no_lease_lost_warning_for_jobs_finalized_in_their_children(db, items, caplog):
    ex = db.executor(2, heartbeat_interval=0.05, lease_ttl=5.0)
    with caplog.at_level(logging.WARNING, logger="dbexecutor"):
        assert [f.result(timeout=T) for f in [ex.submit(txn_jobs.insert, items, i) for i in range(30)]] == list(range(30))
        ex.shutdown()
    assert not [r for r in caplog.records if "lost its lease" in r.getMessage()]
    assert len(_values(db, items)) == 30


def test_transaction_outside_a_job_raises():
    import dbexecutor

    with pytest.raises(RuntimeError, match="only inside a job"):
        with dbexecutor.transaction():
            pass
