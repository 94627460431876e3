"""Stopping a running job wherever it runs, and progress reported from inside a job, on every database.

``JobFuture.terminate()`` and ``dbexecutor cancel --running`` mark the row;
the owner sees the mark at its next beat, kills the job's process tree and
records the job ``cancelled`` with a ``terminated`` attempt. A job asked to
stop never goes back to ready, whatever ends its attempt.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import CancelledError

import psutil
import pytest

import jobs
import ops_jobs
from clitools import cli
from dbexecutor import report_progress, schema
from dbexecutor.records import NewJob, Report

T = 60
BEAT = 0.3  # heartbeat interval: the owner sees a stop request within about this long


def _pids(path: str) -> list[int]:
    end = time.monotonic() + T
    while not os.path.exists(path):
        assert time.monotonic() < end, "the job never started"
        time.sleep(0.02)
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def test_terminate_kills_the_process_tree_and_cancels_the_job_and_its_dependents(db, tmp_path):
    ex = db.executor(1, heartbeat_interval=BEAT)
    pid_path = str(tmp_path / "pids")
    fut = ex.options(retries=3).submit(jobs.fault_spawn_and_hang, pid_path, 2)
    below = ex.submit(jobs.add, fut, 1)
    pids = _pids(pid_path)
    started = time.monotonic()
    assert fut.terminate() is True
    with pytest.raises(CancelledError):
        fut.result(timeout=T)
    assert time.monotonic() - started < 15
    assert below.cancelled() or isinstance(below.exception(timeout=T), CancelledError)
    end = time.monotonic() + 10
    while not _gone(pids):
        assert time.monotonic() < end, f"processes left: {[p for p in pids if psutil.pid_exists(p)]}"
        time.sleep(0.05)
    row = db.row(fut.job_id)
    assert (row.state, row.lease_owner) == ("cancelled", None) and row.error.startswith("Terminated:")
    assert row.terminate_requested is not None
    assert [(a.attempt, a.outcome) for a in db.attempts(fut.job_id)] == [(1, "terminated")]  # never retried
    assert db.row(below.job_id).state == "cancelled"
    assert fut.terminate() is False  # finished already
    # The executor goes on: a new child replaces the killed one.
    assert ex.submit(jobs.add, 2, 2).result(timeout=T) == 4


def test_cancel_running_from_the_command_line(db, tmp_path):
    ex = db.executor(1, heartbeat_interval=BEAT)
    pid_path = str(tmp_path / "pids")
    fut = ex.submit(jobs.fault_spawn_and_hang, pid_path, 1)
    pids = _pids(pid_path)
    plain = cli(db, "cancel", str(fut.job_id))
    assert plain.returncode == 1 and "--running" in plain.stdout  # without --running a running job is left alone
    out = cli(db, "cancel", "--running", str(fut.job_id), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"cancelled": [], "terminating": [fut.job_id], "not_cancelled": {}}
    with pytest.raises(CancelledError):
        fut.result(timeout=T)
    end = time.monotonic() + 10
    while not _gone(pids):
        assert time.monotonic() < end
        time.sleep(0.05)
    shown = json.loads(cli(db, "show", str(fut.job_id), "--json").stdout)
    assert shown["state"] == "cancelled" and [a["outcome"] for a in shown["attempts"]] == ["terminated"]
    again = cli(db, "cancel", "--running", str(fut.job_id), "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["not_cancelled"] == {str(fut.job_id): "it is cancelled already"}


def test_terminating_a_job_that_has_not_started_cancels_it(db):
    ex = db.executor(1)
    later = ex.options(delay=3600).submit(jobs.add, 1, 2)
    after = ex.submit(jobs.add, later, 1)
    assert later.terminate() is True
    assert later.cancelled() and after.cancelled()
    assert db.states([later, after]) == {later.job_id: "cancelled", after.job_id: "cancelled"}
    assert db.attempts(later.job_id) == []


def _claimed(store, **job):
    (row,) = store.insert_jobs([NewJob("tests.f", b"x", (), **job)], store.now())
    (got,) = store.claim("ghost:1:x", 1, 30.0, store.now())
    assert got.job_id == row.job_id
    return got


def test_a_job_asked_to_stop_never_goes_back_to_ready(db):
    store = db.store()
    try:
        # Its owner died: the lease expires, and reclaiming cancels it instead of rerunning it.
        a = _claimed(store)
        assert store.request_stop([a.job_id]).terminating == [a.job_id]
        assert store.renew_leases([(a.job_id, a.attempt)], {a.job_id}, 30.0, store.now()).stop == {a.job_id}
        assert store.reclaim_expired(store.now() + 100) == []
        assert db.row(a.job_id).state == "cancelled" and [x.outcome for x in db.attempts(a.job_id)] == ["terminated"]
        # It failed on its own before the kill: failed, not retried.
        b = _claimed(store, retries=5)
        store.request_stop([b.job_id])
        fail = Report(b.job_id, b.attempt, False, b"", "exception", "ValueError: x", ended_at=store.now())
        store.finish_and_claim([fail], "ghost:1:x", 0, 30.0, store.now())
        assert db.row(b.job_id).state == "failed"
        # Its worker stops and gives its jobs back: a job asked to stop is cancelled instead.
        c = _claimed(store)
        store.request_stop([c.job_id])
        assert store.release_running([(c.job_id, c.attempt, None)], "ghost:1:x", store.now(), "stopping") == []
        assert db.row(c.job_id).state == "cancelled"
        # A stop request for a finished job changes nothing.
        refused = store.request_stop([a.job_id, 987654]).refused
        assert refused == {a.job_id: "it is cancelled already", 987654: "no such job"}
    finally:
        store.close()


def test_progress_reaches_the_row_the_future_status_and_show(db, tmp_path):
    ex = db.executor(1, heartbeat_interval=BEAT)
    gate = str(tmp_path / "gate")
    fut = ex.submit(ops_jobs.progress_then_wait, gate, 0.25, "loading   rows\n")
    end = time.monotonic() + T
    while fut.progress is None:
        assert time.monotonic() < end, "no progress arrived"
        time.sleep(0.05)
    got = fut.progress
    assert (got.fraction, got.message) == (0.25, "loading rows") and got.at is not None
    shown = json.loads(cli(db, "show", str(fut.job_id), "--json").stdout)
    assert shown["progress"]["fraction"] == 0.25 and shown["progress"]["message"] == "loading rows"
    status = json.loads(cli(db, "status", "--json").stdout)
    assert [(r["id"], r["progress"], r["progress_message"]) for r in status["running"]] == [(fut.job_id, 0.25, "loading rows")]
    assert "25% loading rows" in cli(db, "status").stdout
    open(gate, "w").close()
    assert fut.result(timeout=T) is True  # report_progress said it was delivered
    # Many reports in a tight loop: the latest one wins.
    many = ex.submit(ops_jobs.progress_steps, 20_000)
    assert many.result(timeout=T) == 20_000


def test_report_progress_outside_a_job_and_bad_values():
    assert report_progress(0.5, "not in a job") is False
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            report_progress(bad)
    with pytest.raises(ValueError):
        report_progress()


def test_a_new_attempt_starts_without_the_last_ones_progress(db):
    store = db.store()
    try:
        a = _claimed(store, retries=1)
        store.renew_leases([(a.job_id, a.attempt)], {a.job_id}, 30.0, store.now(), {(a.job_id, a.attempt): (0.5, "half")})
        assert store.progress(a.job_id).fraction == 0.5
        store.renew_leases([(a.job_id, a.attempt - 1)], set(), 30.0, store.now(), {(a.job_id, a.attempt - 1): (0.9, "stale")})
        assert store.progress(a.job_id).message == "half"  # a superseded attempt writes nothing
        fail = Report(a.job_id, a.attempt, False, b"", "exception", "ValueError: x", ended_at=store.now(), retry_delay=0.0)
        store.finish_and_claim([fail], "ghost:1:x", 0, 30.0, store.now())
        assert db.row(a.job_id).state == schema.READY and store.progress(a.job_id) is None
    finally:
        store.close()
