"""PostgreSQL LISTEN/NOTIFY: one notification per transaction, never one per job."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import event

import jobs
from dbexecutor.dialects import resolve
from seams import scheduler_of

pytestmark = pytest.mark.databases("postgresql")


def _listen(db):
    url = resolve(db.url).url
    conn = psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database, autocommit=True
    )
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{db.prefix}dbexecutor")))
    return conn


def _drain(conn, quiet: float = 0.5) -> list[str]:
    """Notifications until none arrives for ``quiet`` seconds."""
    got: list[str] = []
    while True:
        before = len(got)
        got += [n.payload for n in conn.notifies(timeout=quiet)]
        if len(got) == before:
            return got


def test_one_notification_per_transaction(db):
    ex = db.executor(max_workers=1, poll_interval=5.0)
    db.executor(max_workers=1, poll_interval=5.0, run_jobs=False)  # another executor, to whom ex notifies
    ex.submit(jobs.identity, 0).result(timeout=30)
    ex.configure_group("held", limit=0)  # ready rows that nobody may start
    listener = _listen(db)
    try:
        _drain(listener, 0.3)
        # 400 rows in one insert transaction: one notification, saying "ready".
        # map() queues its rows; holding the writer while it does, then
        # flushing, writes all 400 in one transaction.
        with scheduler_of(ex).hold_writes():
            results = ex.options(group="held").map(jobs.identity, range(400))
            ex.flush()
        notes = _drain(listener)
        assert len(notes) == 1, notes
        sender, flags, ids = notes[0].split("\t")
        assert flags == "r" and ids == ""
        # Cancelling all 400 (one transaction): one notification listing the finished ids.
        ex.shutdown(wait=True, cancel_futures=True)
        notes = _drain(listener)
        assert len(notes) == 1, notes
        _, flags, ids = notes[0].split("\t")
        assert flags == "f" and len(ids.split(",")) == 400
        del results
    finally:
        listener.close()


def test_finishing_a_job_elsewhere_resolves_the_future_without_polling(db):
    # Both executors poll only every 30 s: the future can follow only through NOTIFY.
    runner = db.executor(max_workers=1, poll_interval=30.0)
    runner.submit(jobs.identity, 0).result(timeout=30)
    submitter = db.executor(max_workers=1, poll_interval=30.0, run_jobs=False)
    t0 = time.monotonic()
    fut = submitter.submit(jobs.square, 7)
    assert fut.result(timeout=10) == 49
    assert time.monotonic() - t0 < 5.0


def test_an_executor_alone_sends_no_notification_until_another_registers(db):
    """Nobody else hears a NOTIFY: an executor alone on its tables sends none (each costs a statement and
    work at commit, per tick). Another executor says hello as it registers, and the next finish is notified."""
    ex = db.executor(max_workers=1, poll_interval=5.0)
    ex.submit(jobs.identity, 0).result(timeout=30)
    sent: list[str] = []

    def seen(conn, cursor, statement, parameters, *args):
        if "pg_notify" in statement:
            sent.append(statement)

    engine = scheduler_of(ex).store.engine
    event.listen(engine, "before_cursor_execute", seen)
    listener = _listen(db)
    try:
        assert [f.result(timeout=30) for f in [ex.submit(jobs.identity, i) for i in range(20)]] == list(range(20))
        # Written in this thread too (a flush, a durable submit): its INSERT carries no pg_notify() either.
        flushed = ex.submit(jobs.identity, 20)
        ex.flush()
        assert flushed.result(timeout=30) == 20
        assert sent == [] and _drain(listener, 0.3) == []
        other = db.executor(max_workers=1, poll_interval=30.0, run_jobs=False)
        hello = _drain(listener, 0.3)
        assert [n.split("\t")[1] for n in hello] == ["h"], hello
        # The runner heard the hello: its next finish is notified at once, and the other's future follows.
        started = time.monotonic()
        assert other.submit(jobs.identity, 7).result(timeout=10) == 7
        assert time.monotonic() - started < 5, "the finish was not notified: the other waited for its poll"
        assert sent and any("f" in n.split("\t")[1] for n in _drain(listener))
    finally:
        event.remove(engine, "before_cursor_execute", seen)
        listener.close()
