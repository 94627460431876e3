"""A claim that expects work in the one group it last found leases it in one statement fewer.

The whole claim reads which groups have runnable work, then leases the best
rows of the one group it found (or shares the slots out when it found
several, or a group with a limit). When the caller knows of runnable work (a
release, new rows, a probe that saw some) and the last claim of its scope
found one group without a limit, the store leases that group's rows at once,
by a statement that leases nothing unless the group is still the only choice;
only then does the whole claim follow. These tests check both halves: the read
is skipped when the group is alone, and fair share and limits hold when it is
not alone any more.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import insert

from conftest import statements
from dbexecutor import schema
from dbexecutor.records import NewJob, Report

TTL = 30.0


@pytest.fixture
def group_reads(db: Any) -> Iterator[list[str]]:
    """Every statement of this process that starts by reading this test's groups table (the claim's look)."""
    table = f"{db.prefix}groups".lower()
    with statements(lambda text: text.startswith(f"select {table}.name")) as seen:
        yield seen


def _ready(store: Any, group: str, n: int, priority: int = 0) -> None:
    now = time.time() - 1
    rows = [
        {"state": schema.READY, "fn_name": "f", "payload": b"x", "created_at": now, "group_key": group, "priority": priority}
        for _ in range(n)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(store.tables.jobs), rows)


def _job(n: int, **options: Any) -> NewJob:
    return NewJob(fn_name=f"tests.job{n}", payload=b"payload %d" % n, deps=options.pop("deps", ()), **options)


def _done(job_id: int, attempt: int = 1) -> Report:
    return Report(job_id, attempt, True, b"result", "ok", ended_at=time.time())


def _groups_of(db: Any, claimed: list[Any]) -> Counter[str]:
    ids = {c.job_id for c in claimed}
    return Counter(row.group_key for row in db.jobs() if row.id in ids)


def test_a_lone_group_is_leased_without_reading_the_groups_first(db, group_reads):
    store = db.store()
    try:
        _ready(store, schema.DEFAULT_GROUP, 6)
        _ready(store, schema.DEFAULT_GROUP, 1, priority=5)
        first = store.claim("alone-test", 2, TTL, time.time(), probe=False)
        assert len(first) == 2 and len(group_reads) == 1  # the whole claim: it knew no group yet
        group_reads.clear()
        second = store.claim("alone-test", 3, TTL, time.time(), probe=False)
        assert group_reads == []
        assert len(second) == 3 and not store.drained
        # The same rows, in the same order, as the whole claim takes: priority, then age.
        rows = {r.id: r for r in db.jobs()}
        assert rows[first[0].job_id].priority == 5
        taken = [c.job_id for c in first + second]
        assert taken == sorted(taken, key=lambda i: (-rows[i].priority, i))
        assert all(rows[i].state == schema.LEASED and rows[i].lease_owner == "alone-test" for i in taken)
        # Fewer rows than slots: nothing is left, and the store says so without another look.
        third = store.claim("alone-test", 4, TTL, time.time(), probe=False)
        assert len(third) == 2 and store.drained and group_reads == []
    finally:
        store.close()


def _alone_once(store: Any) -> None:
    """Ready rows in the default group only, and a claim that finds them there: the next claim takes the hint."""
    _ready(store, schema.DEFAULT_GROUP, 6)
    assert len(store.claim("alone-test", 1, TTL, time.time(), probe=False)) == 1


def test_another_group_with_work_gets_its_fair_share(db, group_reads):
    store = db.store()
    try:
        _alone_once(store)
        store.configure_group("other", weight=1)
        _ready(store, "other", 6)
        group_reads.clear()
        claimed = store.claim("alone-test", 4, TTL, time.time(), probe=False)
        # The lone group's statement leased nothing; the whole claim shared the slots.
        assert group_reads and _groups_of(db, claimed) == {schema.DEFAULT_GROUP: 2, "other": 2}
        # The hint is gone with two groups: the next claim looks first.
        group_reads.clear()
        store.claim("alone-test", 2, TTL, time.time(), probe=False)
        assert group_reads
    finally:
        store.close()


def test_a_limit_set_since_the_last_claim_holds(db, group_reads):
    store = db.store()
    try:
        _alone_once(store)
        store.configure_group(schema.DEFAULT_GROUP, limit=2)
        group_reads.clear()
        claimed = store.claim("alone-test", 4, TTL, time.time(), probe=False)
        assert len(claimed) == 1 and group_reads  # one running already: one more, by the whole claim
    finally:
        store.close()


def test_a_released_dependent_is_leased_by_the_finish_without_reading_the_groups(db, group_reads):
    """A chain's link: the finish that releases the next job leases it with the statement that leases."""
    store = db.store()
    try:
        first, second = store.insert_jobs([_job(1), _job(2)], time.time())
        (third,) = store.insert_jobs([_job(3, deps=(second.job_id,))], time.time())
        claimed = store.claim("alone-test", 2, TTL, time.time(), probe=False)
        assert sorted(c.job_id for c in claimed) == [first.job_id, second.job_id]
        group_reads.clear()
        _, done, claimed = store.finish_and_claim([_done(second.job_id)], "alone-test", 1, TTL, time.time(), look=False)
        assert done.released == 1 and [c.job_id for c in claimed] == [third.job_id]
        assert group_reads == []
        assert db.row(third.job_id).state == schema.LEASED
    finally:
        store.close()
