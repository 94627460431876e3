"""Retention and purge: finished jobs go, with their edges and attempts; what unfinished jobs need stays."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select

import jobs
from clitools import cli

T = 60


def _count(db, table: str) -> int:
    return db._select(lambda t: select(func.count()).select_from(getattr(t, table)))[0][0]


def test_purge_keeps_upstreams_of_unfinished_jobs(db, tmp_path):
    ex = db.executor(2)
    a = ex.submit(jobs.add, 1, 2)  # done, and upstream of a job that has not run
    c = ex.submit(jobs.add, 2, 2)  # done, nothing depends on it
    f = ex.submit(jobs.fail, "x")  # failed
    assert a.result(timeout=T) == 3 and c.result(timeout=T) == 4
    with pytest.raises(jobs.CustomError):
        f.result(timeout=T)
    later = ex.options(delay=3600).submit(jobs.identity, 1)  # ready, not runnable for an hour
    w = ex.submit(jobs.add, a, later)  # waits: a done, later not
    assert db.states([w]) == {w.job_id: "waiting"}

    store = db.store()
    try:
        assert store.purge(time.time() + 1, batch=1) == 2  # c and f, one per transaction
    finally:
        store.close()
    assert {r.id for r in db.jobs()} == {a.job_id, later.job_id, w.job_id}
    assert {x.job_id for x in db.attempts()} == {a.job_id}
    assert _count(db, "deps") == 2

    # Once the waiting job is finished (cancelled with its upstream), everything can go.
    assert later.cancel()
    deleted = cli(db, "purge", "--older-than", "0s", "--json")
    assert deleted.returncode == 0 and '"deleted": 3' in deleted.stdout
    assert db.jobs() == [] and db.attempts() == [] and _count(db, "deps") == 0


def test_purge_respects_the_age_bound(db, tmp_path):
    ex = db.executor(2)
    futs = [ex.submit(jobs.add, i, i) for i in range(5)]
    assert [f.result(timeout=T) for f in futs] == [0, 2, 4, 6, 8]
    # A dependent finished recently keeps its old upstream too.
    assert cli(db, "purge", "--older-than", "1h").stdout.startswith("deleted 0 ")
    assert len(db.jobs()) == 5
    store = db.store()
    try:
        now = time.time()
        assert store.purge_batch(now - 3600) == 0
        assert store.purge_batch(now + 1, limit=3) == 3
        assert store.purge_batch(now + 1, limit=3) == 2
        assert store.purge_batch(now + 1) == 0
    finally:
        store.close()


def test_retention_setting_deletes_old_finished_jobs(db, tmp_path):
    ex = db.executor(2, retention=timedelta(seconds=0.5))
    done = [ex.submit(jobs.add, i, 1) for i in range(6)]
    assert [f.result(timeout=T) for f in done] == [1, 2, 3, 4, 5, 6]
    later = ex.options(delay=3600).submit(jobs.identity, 1)
    upstream = done[0]
    w = ex.submit(jobs.add, upstream, later)  # keeps done[0] alive while it waits
    deadline = time.monotonic() + 20
    while len(db.jobs()) > 3:
        assert time.monotonic() < deadline, [(r.id, r.state) for r in db.jobs()]
        time.sleep(0.2)
    assert {r.id for r in db.jobs()} == {upstream.job_id, later.job_id, w.job_id}
    assert {a.job_id for a in db.attempts()} == {upstream.job_id}


def test_retention_must_be_positive(db):
    with pytest.raises(ValueError, match="retention"):
        db.executor(1, retention=0)
