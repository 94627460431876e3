"""submit / result, exceptions, keyword arguments and per-job options, on every database."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
from sqlalchemy import select

import jobs
from dbexecutor import JobFuture


def test_submit_returns_result(db):
    ex = db.executor()
    fut = ex.submit(jobs.add, 2, 3)
    assert isinstance(fut, JobFuture) and isinstance(fut, cf.Future)
    assert isinstance(fut.job_id, int)
    assert fut.result(timeout=60) == 5
    assert fut.done() and not fut.cancelled() and fut.exception() is None


def test_every_keyword_but_after_reaches_fn(db):
    ex = db.executor()
    # Names that could collide with executor options go to fn untouched.
    kw = {"key": 1, "group": 2, "timeout": 3, "priority": 4, "weight": 5, "fn": 6, "retries": 7}
    assert ex.submit(jobs.echo_kwargs, **kw).result(timeout=60) == kw


def test_exception_keeps_type_and_remote_traceback(db):
    ex = db.executor()
    fut = ex.submit(jobs.fail, "exploded")
    with pytest.raises(jobs.CustomError, match="exploded") as info:
        fut.result(timeout=60)
    cause = info.value.__cause__
    assert cause is not None and type(cause).__name__ == "RemoteTraceback"
    assert "in fail" in str(cause) and "CustomError: exploded" in str(cause)
    assert isinstance(fut.exception(), jobs.CustomError)


def test_rows_store_options_fn_name_and_result(db):
    ex = db.executor()
    fut = ex.options(key="k-1", group="ingest", weight=3, priority=7, timeout=30).submit(jobs.square, 9)
    assert fut.result(timeout=60) == 81
    store = db.store()
    j = store.tables.jobs
    with store.engine.connect() as conn:
        row = conn.execute(select(j).where(j.c.id == fut.job_id)).one()
    assert row.state == "done"
    assert row.fn_name == "jobs.square"
    assert (row.job_key, row.group_key, row.priority, row.timeout) == ("k-1", "ingest", 7, 30.0)
    assert {g.name: g.weight for g in ex.groups()} == {"default": 1, "ingest": 3}
    assert row.result is not None and row.finished_at >= row.created_at
    store.close()


def test_same_key_returns_the_existing_job(db):
    ex = db.executor()
    first = ex.options(key="only-once").submit(jobs.square, 3)
    assert first.result(timeout=60) == 9
    again = ex.options(key="only-once").submit(jobs.square, 1000)
    assert again.job_id == first.job_id
    assert again.result(timeout=60) == 9


def test_unpicklable_result_fails_the_job(db):
    ex = db.executor()
    with pytest.raises(Exception, match="pickle"):
        ex.submit(jobs.unpicklable_result).result(timeout=60)


def test_many_jobs(db):
    ex = db.executor()
    futs = [ex.submit(jobs.square, i) for i in range(200)]
    assert [f.result(timeout=120) for f in futs] == [i * i for i in range(200)]
