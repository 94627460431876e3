"""Jobs submitted to an idle executor are leased by the statement that inserts them.

When the tick that writes runnable jobs (no upstream, no key, no delay, all of
one group) has free slots, and nothing else could be claimed first (no other
row is runnable, the group has no concurrency limit), the rows go in leased to
this executor: a single job by one INSERT that checks and leases, a burst
(a ``map``) by one cheap read and the insert. Otherwise the rows go in
``ready`` and the claim decides, as it would for any other row: older or
higher-priority work first, fair share across groups, limits counted under
the group's lock.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import event

import jobs
from dbexecutor.records import NewJob
from dbexecutor.store import Store

TTL = 30.0
T = 60


def _job(n: int = 0, **options: Any) -> NewJob:
    return NewJob(fn_name=f"tests.job{n}", payload=b"payload %d" % n, deps=(), **options)


def _statements(store: Store) -> list[str]:
    """The statements the store runs from now on (not SQLite's BEGIN IMMEDIATE)."""
    seen: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if not statement.lstrip().upper().startswith("BEGIN"):
            seen.append(statement.split(None, 1)[0].upper())

    return seen


def _tick(store: Store, new: list[NewJob], limit: int = 2, owner: str = "me") -> Any:
    return store.finish_and_claim([], owner, limit, TTL, time.time(), new)


def test_an_idle_submit_is_leased_by_its_own_insert(db, store):
    # The group's row exists from here on, as in a running executor; a
    # delayed row is not runnable, so it does not count as work waiting.
    (delayed,) = _tick(store, [_job(0, run_after=time.time() + 3600)])[0]
    seen = _statements(store)
    before = time.time()
    inserted, done, claimed = _tick(store, [_job(1, timeout=5.0, priority=3)])
    assert seen == ["INSERT"], "one statement, then the commit"
    (row,) = [r for r in db.jobs() if r.id != delayed.job_id]
    assert [s.job_id for s in inserted] == [int(row.id)] and inserted[0].state == "leased"
    assert [(c.job_id, c.attempt, c.payload, c.fn_name, c.timeout) for c in claimed] == [
        (int(row.id), 1, b"payload 1", "tests.job1", 5.0)
    ]
    assert (row.state, row.attempt, row.lease_owner, row.priority, row.timeout) == ("leased", 1, "me", 3, 5.0)
    assert before <= row.started_at <= time.time()
    assert row.lease_expires == pytest.approx(row.started_at + TTL)
    assert not done.finals


def test_a_new_job_waits_behind_runnable_work(db, store):
    (older,) = store.insert_jobs([_job(0)], time.time())
    inserted, _, claimed = _tick(store, [_job(1)], limit=1)
    assert inserted[0].state == "ready"
    assert [c.job_id for c in claimed] == [older.job_id], "the older row goes first"
    assert db.row(inserted[0].job_id).state == "ready"
    # With a slot for each, a claim takes both, the older first.
    (third,) = _tick(store, [_job(2)], limit=0)[0]  # stored, not claimed
    claimed = store.claim("me", 2, TTL, time.time())
    assert [c.job_id for c in claimed] == [inserted[0].job_id, third.job_id]
    assert {db.row(c.job_id).attempt for c in claimed} == {1}


def test_work_of_another_group_is_not_overtaken(db, store):
    (other,) = store.insert_jobs([_job(0, group="zz")], time.time())
    inserted, _, claimed = _tick(store, [_job(1)], limit=2)
    assert inserted[0].state == "ready", "another group's runnable row: the claim shares the slots"
    assert sorted(c.job_id for c in claimed) == sorted([other.job_id, inserted[0].job_id])


def test_a_group_limit_is_left_to_the_claim(db, store):
    store.configure_group("capped", limit=1)
    (first,) = _tick(store, [_job(0, group="capped")])[2]
    assert db.row(first.job_id).state == "leased"
    inserted, _, claimed = _tick(store, [_job(1, group="capped")])
    assert inserted[0].state == "ready" and claimed == [], "the group is at its limit"
    store.configure_group("capped", limit=2)
    (second,) = _tick(store, [_job(2, group="unlimited")], limit=0)[0]  # stored, not claimed
    assert [c.job_id for c in store.claim("me", 3, TTL, time.time())] == [inserted[0].job_id, second.job_id]


def test_delayed_jobs_and_full_executors_are_not_leased_on_insert(db, store):
    inserted, _, claimed = _tick(store, [_job(0, run_after=time.time() + 3600)])
    assert (inserted[0].state, claimed) == ("ready", [])
    inserted, _, claimed = _tick(store, [_job(1)], limit=0)
    assert (inserted[0].state, claimed) == ("ready", [])
    assert db.row(inserted[0].job_id).attempt == 0


@pytest.mark.databases("sqlite", "mariadb")  # psycopg has no last row id: PostgreSQL always returns it
def test_without_returning_the_insert_reads_its_row_back(db, store, monkeypatch):
    """MySQL has no INSERT ... RETURNING: the id comes from the driver and the state is read back."""
    assert store.driver.insert_returning  # SQLite and MariaDB have it; MySQL is what this imitates
    monkeypatch.setattr(store.driver, "insert_returning", False)
    (waiting,) = store.insert_jobs([_job(0, run_after=time.time() + 3600)], time.time())
    inserted, _, claimed = _tick(store, [_job(1)])
    assert inserted[0].state == "leased" and [c.job_id for c in claimed] == [inserted[0].job_id]
    assert inserted[0].job_id == waiting.job_id + 1 == int(db.row(inserted[0].job_id).id)
    store.insert_jobs([_job(2)], time.time())
    inserted, _, claimed = _tick(store, [_job(3)], limit=1)
    assert inserted[0].state == "ready" and db.row(inserted[0].job_id).fn_name == "tests.job3"


def test_an_executor_runs_idle_submits_through_it(db):
    ex = db.executor(2)
    assert ex.submit(jobs.identity, 0).result(timeout=T) == 0  # children started
    for i in range(1, 6):
        time.sleep(0.05)  # idle again: the previous job is recorded
        assert ex.submit(jobs.identity, i).result(timeout=T) == i
    rows = db.jobs()
    assert [r.state for r in rows] == ["done"] * 6 and {r.attempt for r in rows} == {1}
    assert [a.outcome for a in db.attempts()] == ["ok"] * 6
    # Leased by the statement that inserted them: the lease was taken at the insert's own
    # time. A claim stamps its lease after it took its locks, later than any insert before it.
    assert [r.started_at == r.created_at for r in rows[1:]] == [True] * 5


def test_a_burst_into_an_idle_executor_goes_in_leased(db, store):
    seen = _statements(store)
    burst = [_job(0, priority=0), _job(1, priority=5), _job(2, priority=0), _job(3, priority=5), _job(4, priority=1)]
    inserted, _, claimed = _tick(store, burst, limit=3)
    ids = [s.job_id for s in inserted]
    assert [s.state for s in inserted] == ["ready", "leased", "ready", "leased", "leased"]
    assert [c.job_id for c in claimed] == [ids[1], ids[3], ids[4]], "priority, then order, as a claim takes them"
    assert [c.payload for c in claimed] == [b"payload 1", b"payload 3", b"payload 4"]
    assert "UPDATE" not in seen, "no claim: the rows went in leased"
    for c in claimed:
        row = db.row(c.job_id)
        assert (row.state, row.attempt, row.lease_owner) == ("leased", 1, "me")
        assert row.lease_expires == pytest.approx(row.started_at + TTL)
    assert {db.row(i).attempt for i in (ids[0], ids[2])} == {0}
    # Two rows were left ready: the next burst is claimed as usual, behind them.
    inserted, _, claimed = _tick(store, [_job(5), _job(6)], limit=3)
    assert [s.state for s in inserted] == ["ready", "ready"]
    assert [c.job_id for c in claimed] == [ids[0], ids[2], inserted[0].job_id]


def test_a_burst_behind_runnable_work_or_across_groups_is_claimed_as_usual(db, store):
    (older,) = store.insert_jobs([_job(0)], time.time())
    inserted, _, claimed = _tick(store, [_job(1), _job(2)], limit=2)
    assert [s.state for s in inserted] == ["ready", "ready"]
    assert [c.job_id for c in claimed] == [older.job_id, inserted[0].job_id]
    other = db.store()  # no backlog seen by this one: it looks before inserting
    try:
        inserted, _, claimed = _tick(other, [_job(3, group="a"), _job(4, group="b")], limit=1)
        assert [s.state for s in inserted] == ["ready", "ready"], "two groups: fair share is the claim's"
        waiting = {inserted[0].job_id - 1, inserted[0].job_id, inserted[1].job_id}  # job 2 is still ready too
        assert len(claimed) == 1 and claimed[0].job_id in waiting
    finally:
        other.close()


def test_a_burst_into_a_limited_group_is_claimed_under_the_limit(db, store):
    store.configure_group("capped", limit=2)
    inserted, _, claimed = _tick(store, [_job(i, group="capped") for i in range(4)], limit=4)
    assert [s.state for s in inserted] == ["ready"] * 4
    assert [c.job_id for c in claimed] == [s.job_id for s in inserted[:2]]


def test_an_idle_map_runs_through_it(db):
    ex = db.executor(2)
    assert list(ex.map(jobs.identity, range(40), chunksize=4)) == list(range(40))
    time.sleep(0.2)
    assert list(ex.map(jobs.identity, range(40), chunksize=4)) == list(range(40))
    rows = db.jobs()
    assert {r.state for r in rows} == {"done"} and {r.attempt for r in rows} == {1}
    assert len(db.attempts()) == len(rows)
    # Each map's first chunks (as many as the executor had free slots) went in
    # leased by their insert, stamped with the insert's time; the rest were claimed.
    for first, second in ((rows[0], rows[1]), (rows[10], rows[11])):
        assert first.started_at == first.created_at and second.started_at == second.created_at
    assert all(r.started_at > r.created_at for r in rows[2:10])
