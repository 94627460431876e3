"""The scheduler's loop holds one connection for its transactions instead of taking one from the pool per tick.

Taking a connection from the pool and giving it back cost about a tenth of
a SQLite tick's time in the scheduler thread (a chain of 1,000 links, where
that thread is the bottleneck). ``Store.holding_connection`` keeps one per
thread while inside; a transaction that fails gives it up, so that the next
one (the retry, or the loop's next tick) starts on a fresh connection, as a
transaction from the pool would.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.pool import Pool

import jobs

T = 30


@pytest.fixture
def checkouts() -> Iterator[Counter[str]]:
    """Pool checkouts of this process, by the name of the thread that took the connection."""
    seen: Counter[str] = Counter()

    def record(dbapi_conn, record, proxy):  # type: ignore[no-untyped-def]
        seen[threading.current_thread().name] += 1

    event.listen(Pool, "checkout", record)
    yield seen
    event.remove(Pool, "checkout", record)


def test_the_schedulers_ticks_share_one_connection(db, checkouts):
    ex = db.executor(2)
    assert ex.submit(jobs.add, 0, 1).result(timeout=T) == 1
    checkouts.clear()
    for i in range(30):  # each at least two ticks: the submit and the result
        assert ex.submit(jobs.add, i, 1).result(timeout=T) == i + 1
    fut = ex.submit(jobs.add, 0, 0)
    for _ in range(30):  # a chain: a tick per link
        fut = ex.submit(jobs.add, fut, 1)
    assert fut.result(timeout=T) == 30
    # Before: one checkout per transaction, more than 90 here.
    assert checkouts["dbexecutor-scheduler"] <= 3, checkouts


def test_an_executor_running_jobs_opens_one_connection(db):
    """The loop's held connection is the only one it opens: its read-only looks run on it too."""
    opened: list[int] = []

    def record(dbapi_conn, record):  # type: ignore[no-untyped-def]
        opened.append(id(dbapi_conn))

    event.listen(Pool, "connect", record)
    try:
        ex = db.executor(2, poll_interval=0.05)  # idle looks (read-only probes) between the jobs
        for i in range(10):
            assert ex.submit(jobs.add, i, 1).result(timeout=T) == i + 1
            threading.Event().wait(0.06)
        ex.shutdown()
    finally:
        event.remove(Pool, "connect", record)
    # Before: a second one, for the probes that went to the pool while the loop held the first.
    assert len(opened) == 1, opened


def _connection(conn: Any) -> Any:
    return conn


def _read_only(conn: Any) -> Any:
    return conn.get_execution_options().get("dbexecutor_read_only")


def test_a_failed_transaction_gives_up_the_held_connection(db):
    store = db.store()
    try:
        with store.holding_connection():
            first = store.transaction(_connection)
            assert store.transaction(_connection) is first  # held
            # Read-only and one-write transactions too: the thread never holds two connections.
            assert store.transaction(_connection, read_only=True) is first
            assert store.transaction(_connection, one_write=True) is first
            # A read-only transaction says so (SQLite then takes no write lock), for itself only.
            assert store.transaction(_read_only, read_only=True) is True
            assert not store.transaction(_read_only)

            def fails(conn: Any) -> None:
                conn.execute(text("SELECT 1"))
                raise ValueError("the work failed")

            with pytest.raises(ValueError):
                store.transaction(fails)
            second = store.transaction(_connection)
            assert second is not first and first.closed  # given up, and a fresh one after the failure
            assert store.transaction(_connection) is second
        assert second.closed  # back to the pool when the thread stops holding
    finally:
        store.close()


def test_durable_submits_share_the_writers_connection(db, checkouts):
    """Durable submits from several threads, one after another, reuse one connection (the submit queue's writer's)."""
    ex = db.executor(2, durable_submit=True, run_jobs=False)
    # The writer takes its connection (the first submit also writes the group: several writes,
    # which take their own connection where the writer's is in autocommit).
    ex.submit(jobs.add, 0, 1)
    ex.submit(jobs.add, 0, 1)
    checkouts.clear()

    def submit_some() -> None:
        for i in range(10):
            ex.submit(jobs.add, i, 1)

    threads = [threading.Thread(target=submit_some, name=f"submitter-{n}") for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submit_some()
    # Before: a checkout per submit, 40 here (the loop's own looks, if any, take theirs on its thread).
    mine = sum(n for name, n in checkouts.items() if name != "dbexecutor-scheduler")
    assert mine == 0, checkouts
    assert db.counts() == {"ready": 42}
    ex.shutdown(wait=False, cancel_futures=True)


def test_a_hold_outlives_its_block_until_released(db):
    store = db.store()
    try:
        hold = store.new_hold(autocommit=True)
        with store.holding_connection(hold):
            first = store.transaction(_connection, one_write=True)
        assert not first.closed  # kept for the next block that names it
        with store.holding_connection(hold):
            assert store.transaction(_connection, one_write=True) is first
            # Several writes take a connection of their own where the hold is in autocommit,
            # and run on the hold where it is not (there it is a plain hold).
            several = store.transaction(_connection)
            assert (several is first) is not store.driver.autocommits_one_write
        store.release_hold(hold)
        assert first.closed
    finally:
        store.close()
