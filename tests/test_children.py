"""Child processes: initializer, max_tasks_per_child, dying children, retries and per-job timeouts."""

from __future__ import annotations

import collections
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

import jobs
from dbexecutor import JobTimeoutError, WorkerDied

T = 60


# -- initializer -------------------------------------------------------------------------------


def test_initializer_runs_once_in_each_child(db):
    ex = db.executor(2, initializer=jobs.init, initargs=("hello", ))
    futs = [ex.submit(jobs.initialized) for _ in range(6)]
    # Once per child, not once per job: every job sees exactly the one value.
    assert [f.result(timeout=T) for f in futs] == [["hello"]] * 6


def test_initializer_is_not_run_in_the_parent(db):
    ex = db.executor(1, initializer=jobs.init, initargs=("parent?",))
    assert ex.submit(jobs.initialized).result(timeout=T) == ["parent?"]
    assert jobs.initialized() == []


def test_failing_initializer_breaks_the_pool(db):
    ex = db.executor(1, initializer=jobs.failing_init)
    fut = ex.submit(jobs.add, 1, 2)
    with pytest.raises(BrokenProcessPool):
        fut.result(timeout=T)
    # As ProcessPoolExecutor: a broken executor refuses new work.
    with pytest.raises(BrokenProcessPool):
        ex.submit(jobs.add, 1, 2)


# -- max_tasks_per_child ----------------------------------------------------------------------------


def test_max_tasks_per_child(db):
    ex = db.executor(1, max_tasks_per_child=2)
    futs = [ex.submit(jobs.pid) for _ in range(6)]
    pids = [f.result(timeout=T) for f in futs]
    per_pid = collections.Counter(pids)
    assert len(per_pid) >= 3, pids
    assert max(per_pid.values()) <= 2, pids


def test_max_tasks_per_child_one_at_a_time(db):
    ex = db.executor(1, max_tasks_per_child=2)
    pids = [ex.submit(jobs.pid).result(timeout=T) for _ in range(6)]
    per_pid = collections.Counter(pids)
    assert len(per_pid) >= 3, pids
    assert max(per_pid.values()) <= 2, pids


def test_children_are_reused_without_max_tasks_per_child(db):
    ex = db.executor(1)
    pids = [ex.submit(jobs.pid).result(timeout=T) for _ in range(4)]
    assert len(set(pids)) == 1, pids


# -- a child that dies ---------------------------------------------------------------------------


def test_child_exit_fails_only_that_job(db):
    ex = db.executor(1)
    fut = ex.submit(jobs.exit_now, 3)
    with pytest.raises(WorkerDied) as info:
        fut.result(timeout=T)
    assert isinstance(info.value, BrokenProcessPool)
    assert "exit code 3" in str(info.value)
    # The executor replaces the child and carries on.
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    assert [f.result(timeout=T) for f in [ex.submit(jobs.square, i) for i in range(4)]] == [0, 1, 4, 9]
    row = db.row(fut.job_id)
    assert row.state == "failed"
    attempts = db.attempts(fut.job_id)
    assert [a.outcome for a in attempts] == ["exit code 3"]


# -- retries ------------------------------------------------------------------------------------------


def test_retry_after_a_failure(db, tmp_path):
    ex = db.executor(1, retry_delay=0.05)
    marker = str(tmp_path / "first-attempt")
    fut = ex.options(retries=1).submit(jobs.fail_first_time, marker, "second time lucky")
    assert fut.result(timeout=T) == "second time lucky"
    row = db.row(fut.job_id)
    assert row.state == "done" and row.attempt == 2
    attempts = db.attempts(fut.job_id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "exception"), (2, "ok")]
    assert "first attempt fails" in (attempts[0].detail or "")


def test_no_retry_by_default(db, tmp_path):
    ex = db.executor(1, retry_delay=0.05)
    marker = str(tmp_path / "first-attempt")
    fut = ex.submit(jobs.fail_first_time, marker, "never")
    with pytest.raises(jobs.CustomError):
        fut.result(timeout=T)
    assert [a.outcome for a in db.attempts(fut.job_id)] == ["exception"]
    assert db.row(fut.job_id).state == "failed"


def test_retries_exhausted(db):
    ex = db.executor(1, retry_delay=0.05)
    fut = ex.options(retries=2).submit(jobs.fail, "always")
    with pytest.raises(jobs.CustomError, match="always"):
        fut.result(timeout=T)
    assert [(a.attempt, a.outcome) for a in db.attempts(fut.job_id)] == [
        (1, "exception"),
        (2, "exception"),
        (3, "exception"),
    ]
    assert db.row(fut.job_id).state == "failed"


# -- per-job timeout -------------------------------------------------------------------------------------


def test_job_timeout(db):
    ex = db.executor(1)
    start = time.monotonic()
    fut = ex.options(timeout=1).submit(jobs.sleep, 30, "too late")
    with pytest.raises(JobTimeoutError) as info:
        fut.result(timeout=T)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert elapsed < 6, f"the timeout fired after {elapsed:.1f} s"
    # The executor keeps working (a new child replaces the killed one).
    assert ex.submit(jobs.add, 2, 3).result(timeout=T) == 5
    assert db.row(fut.job_id).state == "failed"
    assert [a.outcome for a in db.attempts(fut.job_id)] == ["timeout"]


def test_executor_default_timeout(db):
    ex = db.executor(1, timeout=1)
    slow = ex.submit(jobs.sleep, 30)
    fast = ex.submit(jobs.sleep, 0.05, "fast")
    with pytest.raises(JobTimeoutError):
        slow.result(timeout=T)
    assert fast.result(timeout=T) == "fast"
