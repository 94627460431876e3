"""Batch futures: a set of jobs with one future that rolls up when its last child finishes."""

from __future__ import annotations

from concurrent.futures import CancelledError

import pytest

import jobs
from dbexecutor import DBExecutor, DependencyFailed
from dbexecutor import Batch


def test_a_batch_resolves_to_its_childrens_results_in_order(db):
    ex = db.executor()
    with ex.batch() as batch:
        for i in range(4):
            batch.submit(jobs.sleep, 0.05 * (4 - i), i)  # later children finish first
        batch.map(jobs.square, [5, 6])
    assert isinstance(batch, Batch) and batch.job_id is not None
    assert batch.result(timeout=30) == [0, 1, 2, 3, 25, 36]
    assert [c.result() for c in batch.children] == [0, 1, 2, 3, 25, 36]
    row = db.row(batch.job_id)
    assert (row.state, row.batch, row.attempt) == ("done", 1, 0)  # rolled up, never run
    assert db.attempts(batch.job_id) == []
    assert row.finished_at >= max(db.row(c.job_id).finished_at for c in batch.children)


def test_jobs_can_wait_for_a_batch_or_take_its_result(db):
    ex = db.executor()
    with ex.batch() as batch:
        batch.map(jobs.sleep, [0.1, 0.2, 0.05], [1, 2, 3])
    total = ex.submit(jobs.sum_list, batch)  # the list of results, as an argument
    after = ex.submit(jobs.identity, "after", after=[batch])
    assert total.result(timeout=30) == 6
    assert after.result(timeout=30) == "after"
    last_child = max(db.row(c.job_id).finished_at for c in batch.children)
    assert db.row(after.job_id).started_at >= last_child


def test_a_batch_of_finished_children_and_an_empty_batch_are_done_at_once(db):
    ex = db.executor()
    first = ex.submit(jobs.square, 3)
    first.result(timeout=30)
    with ex.batch() as empty:
        pass
    assert empty.result(timeout=5) == []
    batch = ex.batch()
    batch.children.append(first)  # an already finished job as the only child
    batch.seal()
    assert batch.result(timeout=5) == [9]


def test_the_first_child_failure_fails_the_batch_and_its_dependents(db):
    ex = db.executor(max_workers=3)
    with ex.batch() as batch:
        ok = batch.submit(jobs.identity, "ok")
        bad = batch.submit(jobs.fail_on, 2, 2)
        slow = batch.submit(jobs.sleep, 2.0, "slow")
    downstream = ex.submit(jobs.identity, "never", after=[batch])
    with pytest.raises(jobs.CustomError, match="bad item 2"):
        batch.result(timeout=30)
    # The batch failed as soon as its child did; the other children go on.
    assert not slow.done()
    with pytest.raises(DependencyFailed) as info:
        downstream.result(timeout=30)
    assert info.value.upstream_job_id == batch.job_id
    assert slow.result(timeout=30) == "slow" and ok.result() == "ok"
    assert isinstance(bad.exception(), jobs.CustomError)
    states = db.states([batch, ok, bad, slow, downstream])
    assert states == {
        batch.job_id: "failed", ok.job_id: "done", bad.job_id: "failed", slow.job_id: "done", downstream.job_id: "failed"
    }
    assert "batch child job" in db.row(batch.job_id).error


def test_a_batch_sealed_after_a_child_failed_fails_at_once(db):
    ex = db.executor()
    batch = ex.batch()
    bad = batch.submit(jobs.fail, "early")
    with pytest.raises(jobs.CustomError):
        bad.result(timeout=30)
    batch.submit(jobs.identity, 1)
    batch.seal()
    with pytest.raises(jobs.CustomError, match="early"):
        batch.result(timeout=5)


def test_cancelling_a_batch_cancels_its_children_that_have_not_started(db):
    ex = db.executor(max_workers=1)
    with ex.options(delay=30).batch() as batch:
        children = batch.map(jobs.identity, range(3))
    after = ex.submit(jobs.identity, 0, after=[batch])
    assert batch.cancel()
    assert batch.cancelled() and all(c.cancelled() for c in children) and after.cancelled()
    assert set(db.states([batch, *children, after]).values()) == {"cancelled"}


def test_an_error_inside_the_block_cancels_the_children(db):
    ex = db.executor(max_workers=1)
    with pytest.raises(RuntimeError, match="changed my mind"):
        with ex.options(delay=30).batch() as batch:
            child = batch.submit(jobs.identity, 1)
            raise RuntimeError("changed my mind")
    assert batch.cancelled() and batch.job_id is None
    with pytest.raises(CancelledError):
        child.result(timeout=5)
    assert db.row(child.job_id).state == "cancelled"


def test_an_unsealed_batch_cannot_be_a_dependency(db):
    ex = db.executor()
    batch = ex.batch()
    batch.submit(jobs.identity, 1)
    with pytest.raises(TypeError, match="sealed"):
        ex.submit(jobs.identity, 2, after=[batch])
    batch.seal()
    with pytest.raises(RuntimeError, match="sealed"):
        batch.submit(jobs.identity, 3)
    assert ex.submit(jobs.identity, 2, after=[batch]).result(timeout=30) == 2


def test_a_batch_resolves_from_its_row_in_another_executor(db):
    ex = db.executor()
    with ex.options(delay=0.5).batch() as batch:
        batch.map(jobs.square, range(3))
    other = DBExecutor(db.url, 1, **db.options)
    try:
        assert other.future(batch.job_id).result(timeout=30) == [0, 1, 4]
    finally:
        other.shutdown()
    assert batch.result(timeout=30) == [0, 1, 4]


def test_signed_batches_check_every_childs_result(db, tmp_path):
    from sqlalchemy import update

    from dbexecutor import PayloadRejected

    ex = db.executor(secret="batch secret")
    gate = str(tmp_path / "go")
    with ex.batch() as good:
        good.map(jobs.square, [2, 3])
    assert good.result(timeout=30) == [4, 9]
    assert ex.submit(jobs.sum_list, good).result(timeout=30) == 13  # the child checks the batch's signature
    with ex.batch() as batch:
        quick = batch.submit(jobs.square, 4)
        batch.submit(jobs.wait_for_file, gate, "slow")
    assert quick.result(timeout=30) == 16
    # Someone rewrites a finished child's result while the batch still waits.
    store = db.store()
    j = store.tables.jobs
    blob = bytearray(db.row(quick.job_id).result)
    blob[-2] ^= 0xFF
    with store.engine.begin() as conn:
        conn.execute(update(j).where(j.c.id == quick.job_id).values(result=bytes(blob)))
    store.close()
    open(gate, "w").close()
    with pytest.raises(PayloadRejected):
        batch.result(timeout=30)
    assert db.row(batch.job_id).state == "failed"
