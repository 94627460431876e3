"""A durable submit goes in leased when its executor has a free slot: it starts without a claim of its own.

Where the driver says it pays (``leases_durable_submits``: SQLite), the loop
lends its free slots to submitting threads (``dbexecutor.lending``);
the insert of a durable submit then leases its row in the same statement,
when a claim could have picked nothing else, and the loop only hands it to a
child. Checked here: the jobs run once each and their rows say they went in
leased (``started_at`` is the insert's time, and no claim statement ran for
them), from several threads at once; a job that something else runnable comes
before is not leased on insert; nothing stays leased once the executor stops;
and the lending's own accounting (a slot is never lent twice).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait
from typing import Any

from conftest import statements
from dbexecutor.lending import Lending
from dbexecutor.records import Claimed
from dbexecutor.store.sql import Scope

import jobs

T = 30


def _claim_updates(db: Any) -> Any:
    """The claim's leasing statements of this test's table (an UPDATE that counts an attempt; a finish does not)."""
    table = f"{db.prefix}jobs".lower()
    return statements(lambda text: text.startswith(f"update {table} set") and "attempt=" in text.split(" where ")[0])


def test_a_durable_submit_to_an_executor_with_a_free_slot_starts_without_a_claim(db):
    """Where the driver says it pays (SQLite: writers take turns); on a server the loop claims the row beside the submit."""
    ex = db.executor(2, durable_submit=True)
    lends = ex._store.driver.leases_durable_submits
    try:
        assert ex.submit(jobs.add, 0, 1).result(timeout=T) == 1  # the children are up, the group written
        with _claim_updates(db) as claims:
            futures = []
            for i in range(20):
                futures.append(ex.submit(jobs.add, i, 1))
                assert futures[-1].result(timeout=T) == i + 1  # one at a time: a slot is always free
        # Before, and on a server: a claim transaction per job.
        assert (claims == []) is lends, claims
        for fut in futures:
            row = db.row(fut.job_id)
            assert row.attempt == 1 and (row.started_at == row.created_at) is lends, row  # leased by its insert
    finally:
        ex.shutdown()


def test_durable_submits_from_several_threads_run_once_each(db):
    ex = db.executor(2, durable_submit=True)
    results: dict[int, list[Any]] = {}

    def submit_some(n: int) -> None:
        results[n] = [ex.submit(jobs.add, n * 100, i) for i in range(25)]

    try:
        threads = [threading.Thread(target=submit_some, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for n, futures in results.items():
            assert [f.result(timeout=T) for f in futures] == [n * 100 + i for i in range(25)]
    finally:
        ex.shutdown()
    assert db.counts() == {"done": 100}
    # Leased on insert or claimed by the loop, each ran once.
    assert sorted(a.job_id for a in db.attempts()) == sorted(f.job_id for fs in results.values() for f in fs)


def test_a_job_that_something_else_comes_before_is_not_leased_on_insert(db):
    ex = db.executor(2, durable_submit=True)
    try:
        ex.submit(jobs.add, 0, 1).result(timeout=T)
        # Both slots busy, and runnable work waiting behind them.
        blockers = [ex.submit(jobs.sleep, 0.5, i) for i in range(2)]
        waiting = ex.options(priority=5).submit(jobs.add, 1, 1)
        later = ex.submit(jobs.add, 2, 1)
        assert waiting.result(timeout=T) == 2 and later.result(timeout=T) == 3
        wait(blockers, timeout=T)
        for fut in (waiting, later):
            row = db.row(fut.job_id)
            # Claimed by the loop (at the time its tick began, which may be before the insert's).
            assert row.attempt == 1 and row.started_at != row.created_at, row
        assert db.row(waiting.job_id).started_at <= db.row(later.job_id).started_at  # in priority order
    finally:
        ex.shutdown()


def test_nothing_stays_leased_after_shutdown(db):
    ex = db.executor(2, durable_submit=True)
    stop = threading.Event()
    submitted: list[Any] = []

    def keep_submitting() -> None:
        while not stop.is_set():
            try:
                submitted.append(ex.submit(jobs.add, 1, 1))
            except RuntimeError:
                return  # shut down

    t = threading.Thread(target=keep_submitting)
    t.start()
    time.sleep(0.3)
    ex.shutdown(wait=True, cancel_futures=True)
    stop.set()
    t.join(timeout=T)
    counts = db.counts()
    assert not {"leased", "running"} & set(counts), counts
    assert sum(counts.values()) == len(submitted)


def _claimed(job_id: int) -> Claimed:
    return Claimed(job_id, 1, b"", "f", None)


def test_a_slot_is_lent_once_until_the_loop_publishes_again():
    lending = Lending("me", 30.0)
    assert lending.lend() is None  # nothing published yet
    scope = Scope(("default",))
    lending.publish(2, scope)
    first, second = lending.lend(), lending.lend()
    assert first is not None and second is not None and first.scope == scope
    assert lending.lend() is None
    # The loop counts while both are out: they are not free again.
    lending.publish(2, scope)
    assert lending.lend() is None and lending.in_use() == 2
    assert lending.land(_claimed(1))  # went in leased: the loop takes it
    assert lending.land(None)  # went in ready: the slot is free again
    assert lending.in_use() == 1
    assert lending.lend() is not None
    assert lending.land(None)
    assert [c.job_id for c in lending.take()] == [1] and lending.in_use() == 0
    lending.publish(1, scope)
    lent = lending.lend()
    assert lent is not None
    assert lending.close() == []
    assert not lending.land(_claimed(2))  # the loop stopped: the caller gives the lease back
    assert lending.lend() is None and lending.in_use() == 0
