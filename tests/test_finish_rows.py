"""Finishing a tick's attempts writes each job's own result and changes nothing for a lost lease.

The finish statement runs once per attempt (SQLite binds each set as a plain
tuple, with the statement's own values such as ``state = 'done'`` and
``error = NULL`` between them); these tests read the rows back.
"""

from __future__ import annotations

import threading
import time

import pytest

from sqlalchemy import select

from dbexecutor import schema
from dbexecutor.records import NewJob, Report


def test_a_tick_of_finishes_writes_each_row_and_skips_a_lost_lease(store):
    now = time.time()
    store.insert_jobs([NewJob("tests.f", b"call %d" % i, ()) for i in range(6)], now)
    claimed = store.claim("owner-1", 6, 30.0, now)
    assert len(claimed) == 6
    lost, failed = claimed[2], claimed.pop()
    reports = [
        # The third report names an attempt its job no longer holds (its lease was lost).
        Report(c.job_id, c.attempt + (1 if c is lost else 0), True, b"result %d" % c.job_id, "ok",
               worker="w:1", started_at=now, ended_at=now + 0.5)
        for c in claimed
    ] + [  # and one attempt failed, in the same tick (no retries left: the job fails)
        Report(failed.job_id, failed.attempt, False, b"error", "exception", "ValueError: no",
               worker="w:1", started_at=now, ended_at=now + 0.5)
    ]
    _, done, _ = store.finish_and_claim(reports, "owner-1", 0, 30.0, now + 1.0)
    won = [c.job_id for c in claimed if c is not lost]
    assert sorted(f.job_id for f in done.finals if f.state == schema.DONE) == won and done.lost == [lost.job_id]
    assert [(f.job_id, f.state) for f in done.finals if f.state != schema.DONE] == [(failed.job_id, schema.FAILED)]
    j, a = store.tables.jobs, store.tables.attempts
    with store.engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(j).where(j.c.id.in_([c.job_id for c in claimed])))}
        attempts = {(r.job_id, r.outcome) for r in conn.execute(select(a.c.job_id, a.c.outcome))}
    for job_id in won:
        r = rows[job_id]
        assert (r.state, r.result, r.error, r.lease_owner, r.lease_expires) == (
            schema.DONE, b"result %d" % job_id, None, None, None
        )
        assert r.finished_at == now + 1.0
    kept = rows[lost.job_id]
    assert (kept.state, kept.result, kept.lease_owner) == (schema.LEASED, None, "owner-1")
    assert attempts == {(i, "ok") for i in won} | {(lost.job_id, "lease lost (ok)"), (failed.job_id, "exception")}


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_one_finish_alone(store, likely):
    # A tick with a single report binds one set rather than a list of them.
    now = time.time()
    (row,) = store.insert_jobs([NewJob("tests.f", b"call", ())], now)
    (c,) = store.claim("owner-1", 1, 30.0, now)
    store.ctx.dependents_likely = likely
    _, done, _ = store.finish_and_claim(
        [Report(c.job_id, c.attempt, True, b"alone", "ok", ended_at=now)], "owner-1", 0, 30.0, now
    )
    assert [(f.job_id, f.state, f.result) for f in done.finals] == [(row.job_id, schema.DONE, b"alone")]
    # No dependents: the next finish reads the edges first (the cheaper way when there are none).
    assert not store.ctx.dependents_likely


def _rows_by_id(store, ids):
    j = store.tables.jobs
    with store.engine.connect() as conn:
        return {r.id: r for r in conn.execute(select(j).where(j.c.id.in_(ids)))}


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_finishing_upstreams_counts_down_their_dependents(store, likely):
    """Each dependent loses one open dependency per upstream finished; a lost lease counts nothing; a batch rolls up.

    On PostgreSQL the finish and its attempt rows are one statement. The
    edges out are read, then counted down; or, when the last finished jobs
    had dependents (``likely``), read and counted down by one ``UPDATE ...
    RETURNING``: on SQLite after the finish has answered, on PostgreSQL sent
    with it in one pipeline, reading for itself which upstreams the finish
    won (u4's lost lease must not count d3 down). The rows must say the same.
    """
    now = time.time()
    ups = [s.job_id for s in store.insert_jobs([NewJob("tests.f", b"up %d" % i, ()) for i in range(4)], now)]
    u1, u2, u3, u4 = ups
    d1, d2, d3, b = (
        s.job_id
        for s in store.insert_jobs(
            [
                NewJob("tests.f", b"d1", (u1, u2)),
                NewJob("tests.f", b"d2", (u1, u2, u3, u4)),
                NewJob("tests.f", b"d3", (u4,)),
                NewJob("tests.batch", b"b", (u1, u3), batch=True),
            ],
            now,
        )
    )
    claimed = {c.job_id: c for c in store.claim("owner-1", 4, 30.0, now)}
    assert sorted(claimed) == ups
    reports = [
        Report(i, claimed[i].attempt + (1 if i == u4 else 0), True, b"result %d" % i, "ok", ended_at=now)
        for i in ups  # u4's report names an attempt it no longer holds: its lease was lost
    ]
    store.ctx.dependents_likely = likely
    _, done, _ = store.finish_and_claim(reports, "owner-1", 0, 30.0, now + 1.0)
    assert done.lost == [u4]
    # d1 became ready; d2 was only counted down, and d3's only upstream lost its
    # lease. With the edges read first the store does not tell d2 from d1.
    returning = likely and store.driver.update_returning
    assert done.released == (1 if returning else 2)
    assert store.ctx.dependents_likely  # these jobs had dependents: the next finish expects some too
    assert {f.job_id: f.state for f in done.finals} == {u1: schema.DONE, u2: schema.DONE, u3: schema.DONE, b: schema.DONE}
    rows = _rows_by_id(store, [d1, d2, d3, b])
    assert (rows[d1].state, rows[d1].open_deps) == (schema.READY, 0)
    assert (rows[d2].state, rows[d2].open_deps) == (schema.WAITING, 1)
    assert (rows[d3].state, rows[d3].open_deps) == (schema.WAITING, 1)
    assert (rows[b].state, rows[b].open_deps) == (schema.DONE, 0)


def _finish_behind(store, other, report, now):
    """Finish ``report`` in a thread while ``other`` (a connection in an open transaction) holds what it needs.

    Checks that the finish waits, commits ``other``, and returns what the finish did.
    """
    result: dict[str, object] = {}

    def finish() -> None:
        result["done"] = store.finish_and_claim([report], "owner-1", 0, 30.0, now + 1.0)[1]

    worker = threading.Thread(target=finish)
    try:
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive(), "the finish did not wait for the other transaction"
        other.commit()
    finally:
        other.close()
    worker.join(30)
    assert not worker.is_alive()
    return result["done"]


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_a_count_down_waits_for_another_finisher_of_the_same_dependent(store, likely):
    """Two transactions finishing two upstreams of one job: the second, blocked on the first's lock, subtracts from what it left."""
    now = time.time()
    u1, u2 = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"u1", ()), NewJob("tests.f", b"u2", ())], now))
    (dep,) = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"dep", (u1, u2))], now))
    claimed = {c.job_id: c for c in store.claim("owner-1", 2, 30.0, now)}
    other = store.engine.connect()
    other.begin()
    # Another finisher of u2 got there first and holds the dependent's row until it commits.
    other.execute(store.ctx.sql.count_down, {"p_ids": [dep], "p_k": 1})
    store.ctx.dependents_likely = likely
    done = _finish_behind(store, other, Report(u1, claimed[u1].attempt, True, b"r1", "ok", ended_at=now), now)
    assert done.released == 1
    row = _rows_by_id(store, [dep])[dep]
    assert (row.state, row.open_deps) == (schema.READY, 0)


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_a_finish_waiting_for_a_submit_that_holds_its_row_sees_the_new_edge(store, likely):
    """A dependent submitted in a transaction that holds the upstream's row is counted down by the finish that waited for it.

    The finish's UPDATE waits for that transaction; the edges out must then be
    read by a statement that starts after it committed. Read in the same
    statement as the UPDATE (PostgreSQL, one data-modifying CTE: one snapshot,
    taken before the wait), the new edge was not seen and the dependent
    waited forever (caught by CI in test_submit_in_transaction).
    """
    now = time.time()
    (up,) = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"up", ())], now))
    (c,) = store.claim("owner-1", 1, 30.0, now)
    submitter = store.engine.connect()
    submitter.begin()
    (dep,), _, _ = store.insert_through(submitter, [NewJob("tests.f", b"dep", (up,))], now)  # holds up's row
    store.ctx.dependents_likely = likely
    done = _finish_behind(store, submitter, Report(up, c.attempt, True, b"r", "ok", ended_at=now), now)
    assert [f.job_id for f in done.finals] == [up]
    row = _rows_by_id(store, [dep.job_id])[dep.job_id]
    assert (row.state, row.open_deps) == (schema.READY, 0)
