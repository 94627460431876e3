"""Multi-row inserts store each row's own values, whatever repeats across rows.

PostgreSQL binds a column whose value is the same in every row once, as a
scalar, and the others as arrays; these tests write rows where some, all or
none of the columns repeat (None, text, numbers, bytes) and read them back.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from dbexecutor.records import NewJob


def _attempt(job_id: int, n: int, worker: str | None, outcome: str, detail: str | None, at: float) -> dict:
    return {"job_id": job_id, "attempt": n, "worker": worker, "started_at": at, "ended_at": at + 1.0,
            "outcome": outcome, "detail": detail}


def test_rows_with_repeated_columns_read_back_as_written(db):
    store = db.store()
    try:
        (owner,) = store.insert_jobs([NewJob("tests.f", b"x", ())], time.time())
        j = owner.job_id
        batches = [
            [_attempt(j, 1, "w1", "ok", None, 1.5)],  # one row
            [_attempt(j, i, f"w{i}", f"o{i}", f"d{i}", 10.0 + i) for i in range(5)],  # nothing repeats
            [_attempt(j, 1, "w", "ok", None, 20.0 + i) for i in range(4)],  # all but the times repeat
            [_attempt(j, 7, None, "same", None, 30.0) for _ in range(3)],  # identical rows
            [_attempt(j, 2, "w", "ok", "x" if i == 2 else None, 40.0) for i in range(4)],  # one text among Nones
        ]
        written = []
        for rows in batches:
            with store.engine.begin() as conn:
                store.driver.insert_rows(conn, store.tables.attempts, [dict(r) for r in rows])
            written += rows
        a = store.tables.attempts
        with store.engine.connect() as conn:
            got = conn.execute(select(*[a.c[c] for c in written[0]]).order_by(a.c.id)).all()
        assert [dict(r._mapping) for r in got] == written
    finally:
        store.close()


def test_a_burst_of_alike_jobs_keeps_each_payload(db):
    store = db.store()
    try:
        now = time.time()
        burst = [NewJob("tests.same", b"payload %d" % (i % 3), (), priority=1, timeout=2.5) for i in range(9)]
        rows = store.insert_jobs(burst, now)
        j = store.tables.jobs
        with store.engine.connect() as conn:
            got = conn.execute(
                select(j.c.id, j.c.fn_name, j.c.payload, j.c.priority, j.c.timeout, j.c.run_after, j.c.created_at)
                .order_by(j.c.id)
            ).all()
        assert [r.id for r in got] == [r.job_id for r in rows]
        assert [r.payload for r in got] == [job.payload for job in burst]
        assert {(r.fn_name, r.priority, r.timeout, r.run_after, r.created_at) for r in got} == {
            ("tests.same", 1, 2.5, None, now)
        }
    finally:
        store.close()
