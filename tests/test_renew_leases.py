"""The executor renews the leases of every job it holds in one statement, guarded by the attempt token."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import event, update

import jobs
from dbexecutor import schema
from dbexecutor.records import NewJob
from dbexecutor.store import Store

TTL = 30.0


def _claim_three(store: Store) -> list[Any]:
    now = time.time()
    store.insert_jobs([NewJob(fn_name=f"tests.job{i}", payload=b"p", deps=()) for i in range(3)], now)
    claimed = store.claim("me", 3, TTL, now)
    assert len(claimed) == 3
    return claimed


def test_one_statement_renews_every_held_lease_and_marks_started_ones_running(db, store):
    a, b, c = _claim_three(store)
    updates: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE"):
            updates.append(statement)

    later = time.time() + 100
    lost = store.renew_leases([(a.job_id, a.attempt), (b.job_id, b.attempt), (c.job_id, c.attempt)], {b.job_id}, TTL, later).lost
    assert lost == set()
    assert len(updates) == 1
    rows = {r.id: r for r in db.jobs()}
    assert [rows[x.job_id].state for x in (a, b, c)] == [schema.LEASED, schema.RUNNING, schema.LEASED]
    assert all(rows[x.job_id].lease_expires == pytest.approx(later + TTL) for x in (a, b, c))


def test_a_lease_that_is_gone_is_reported_and_not_renewed(db, store):
    a, b, c = _claim_three(store)
    j = store.tables.jobs
    with store.engine.begin() as conn:  # b was reclaimed meanwhile: back to ready, lease cleared
        conn.execute(update(j).where(j.c.id == b.job_id).values(state=schema.READY, lease_owner=None, lease_expires=None))
    before = db.row(c.job_id).lease_expires
    # a stale token for c: an attempt that is not the one holding the lease
    lost = store.renew_leases([(a.job_id, a.attempt), (b.job_id, b.attempt), (c.job_id, c.attempt - 1)], set(), TTL, time.time() + 50).lost
    assert lost == {b.job_id, c.job_id}
    assert db.row(b.job_id).state == schema.READY and db.row(b.job_id).lease_expires is None
    assert db.row(c.job_id).lease_expires == before


def test_hundreds_of_leases_are_renewed_by_their_own_tokens_only(db, store):
    # More pairs than one statement takes (the renewal goes in parts), every seventh with a stale token.
    now = time.time()
    store.insert_jobs([NewJob(fn_name="tests.job", payload=b"p", deps=()) for _ in range(620)], now)
    claimed = store.claim("me", 620, TTL, now)
    assert len(claimed) == 620
    stale = {job.job_id for i, job in enumerate(claimed) if i % 7 == 0}
    held = [(job.job_id, job.attempt - (job.job_id in stale)) for job in claimed]
    started = {job.job_id for job in claimed[::2]}
    later = time.time() + 100
    assert store.renew_leases(held, started, TTL, later).lost == stale
    rows = {r.id: r for r in db.jobs()}
    for job in claimed:
        row = rows[job.job_id]
        if job.job_id in stale:
            assert row.state == schema.LEASED and row.lease_expires == pytest.approx(now + TTL)
        else:
            assert row.lease_expires == pytest.approx(later + TTL)
            assert row.state == (schema.RUNNING if job.job_id in started else schema.LEASED)


def test_upstream_results_of_rows_that_did_not_record_their_refs(db):
    ex = db.executor()
    a = ex.submit(jobs.add, 1, 1)
    b = ex.submit(jobs.add, 2, 2)
    assert a.result(timeout=60) == 2 and b.result(timeout=60) == 4
    ex.configure_group("held", limit=0)  # its jobs stay ready: nothing claims them
    c = ex.options(group="held").submit(jobs.add, a, b)
    d = ex.options(group="held").submit(jobs.identity, 0)
    ex.flush()
    store = db.store()
    try:
        got = store.upstream_results([c.job_id, d.job_id])
    finally:
        store.close()
    assert set(got) == {c.job_id, d.job_id}
    assert set(got[c.job_id]) == {a.job_id, b.job_id} and got[d.job_id] == {}
