"""Finishing a tick's attempts writes each job's own result and changes nothing for a lost lease.

The finish statement runs once per attempt (SQLite binds each set as a plain
tuple, with the statement's own values such as ``state = 'done'`` and
``error = NULL`` between them); these tests read the rows back.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from dbexecutor import schema
from dbexecutor.records import NewJob, Report


def test_a_tick_of_finishes_writes_each_row_and_skips_a_lost_lease(store):
    now = time.time()
    store.insert_jobs([NewJob("tests.f", b"call %d" % i, ()) for i in range(5)], now)
    claimed = store.claim("owner-1", 5, 30.0, now)
    assert len(claimed) == 5
    lost = claimed[2]
    reports = [
        # The third report names an attempt its job no longer holds (its lease was lost).
        Report(c.job_id, c.attempt + (1 if c is lost else 0), True, b"result %d" % c.job_id, "ok",
               worker="w:1", started_at=now, ended_at=now + 0.5)
        for c in claimed
    ]
    _, done, _ = store.finish_and_claim(reports, "owner-1", 0, 30.0, now + 1.0)
    won = [c.job_id for c in claimed if c is not lost]
    assert sorted(f.job_id for f in done.finals) == won and done.lost == [lost.job_id]
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
    assert attempts == {(i, "ok") for i in won} | {(lost.job_id, "lease lost (ok)")}


def test_one_finish_alone(store):
    # A tick with a single report binds one set rather than a list of them.
    now = time.time()
    (row,) = store.insert_jobs([NewJob("tests.f", b"call", ())], now)
    (c,) = store.claim("owner-1", 1, 30.0, now)
    _, done, _ = store.finish_and_claim(
        [Report(c.job_id, c.attempt, True, b"alone", "ok", ended_at=now)], "owner-1", 0, 30.0, now
    )
    assert [(f.job_id, f.state, f.result) for f in done.finals] == [(row.job_id, schema.DONE, b"alone")]
