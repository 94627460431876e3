"""A ``COMMIT`` whose answer never arrived: the tick is written again, and nothing it did counts twice.

A connection can drop after the server committed a transaction and before
its answer reached us. The store cannot tell that from a commit that failed:
it runs the transaction again (``Database.txn``), and the loop keeps the
reports until a commit is confirmed. Every write of a report is fenced by
its attempt's token, so the second try finds the finish made already; what
must not happen again is what the first try did beside it: counting the
dependents down (a job with two upstreams would become ready when only one
was done), writing a second attempt row. These tests make the first
``COMMIT`` succeed on the server and then fail in the client, as a dropped
connection does, and read the rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import func, select

import jobs
from dbexecutor import schema
from dbexecutor.records import NewJob, Report
from dbexecutor.store import Store
from dbexecutor.store import database as database_module
from dbexecutor.store import finish as finish_module


def _dropped(store) -> BaseException:
    """The error each driver raises for a connection lost while reading the server's answer (transient for the store)."""
    kind = store.engine.dialect.name
    if kind == "sqlite":
        import sqlite3

        return sqlite3.OperationalError("database is locked")  # SQLite has no connection to lose: its transient error
    if kind == "postgresql":
        import psycopg

        return psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    import pymysql

    return pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")


@contextmanager
def answer_lost(store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """The next ``COMMIT`` is made on the server, then fails in the client; yields the count of commits lost so."""
    dialect = store.engine.dialect
    real = dialect.do_commit
    lost = []

    def do_commit(dbapi_connection) -> None:
        real(dbapi_connection)
        if not lost:
            lost.append(1)
            raise _dropped(store)

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    try:
        yield lambda: len(lost)
    finally:
        monkeypatch.setattr(dialect, "do_commit", real)


def _ok(claimed, now: float, blob: bytes) -> Report:
    return Report(claimed.job_id, claimed.attempt, True, blob, "ok", worker="host:1", started_at=now, ended_at=now + 0.5)


def _state(store, job_id: int) -> tuple[str, int]:
    j = store.tables.jobs
    with store.engine.connect() as conn:
        row = conn.execute(select(j.c.state, j.c.open_deps).where(j.c.id == job_id)).one()
    return row.state, row.open_deps


def _attempt_rows(store, job_id: int) -> list[str]:
    a = store.tables.attempts
    with store.engine.connect() as conn:
        return list(conn.execute(select(a.c.outcome).where(a.c.job_id == job_id).order_by(a.c.id)).scalars())


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_a_finish_committed_without_an_answer_counts_its_dependents_down_once(store, monkeypatch, likely):
    """The finish of ``a`` commits, its answer is lost, the transaction runs again: ``d`` still waits for ``c``.

    ``likely``: the count-down reads the edges itself (on PostgreSQL, sent
    in the finish's pipeline); else the edges are read first (with the
    finish, on PostgreSQL).
    """
    now = time.time()
    a, c = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"a", ()), NewJob("tests.f", b"c", ())], now))
    (d,) = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"d", (a, c))], now))
    claimed = {x.job_id: x for x in store.claim("owner-1", 2, 30.0, now)}
    assert sorted(claimed) == [a, c]
    store.ctx.dependents_likely = likely
    with answer_lost(store, monkeypatch) as lost:
        _, done, _ = store.finish_and_claim([_ok(claimed[a], now, b"A")], "owner-1", 0, 30.0, now + 1.0)
    assert lost() == 1  # the first try's COMMIT was made, and looked failed
    # The future of a is resolved: its finish was made (by the first try).
    assert [(f.job_id, f.state, f.result) for f in done.finals] == [(a, schema.DONE, b"A")]
    assert done.lost == []
    assert _state(store, a) == (schema.DONE, 0)
    assert _state(store, d) == (schema.WAITING, 1)  # counted down once: c is not done
    assert _attempt_rows(store, a) == ["ok"]  # one row for the one attempt
    # c's finish releases d, as it would have without the lost answer.
    _, done, _ = store.finish_and_claim([_ok(claimed[c], now, b"C")], "owner-1", 0, 30.0, now + 2.0)
    assert [f.job_id for f in done.finals] == [c] and done.released == 1
    assert _state(store, d) == (schema.READY, 0)


def test_a_failure_committed_without_an_answer_is_not_recorded_twice(store, monkeypatch):
    """A retry (attempt failed, retries left) commits, its answer is lost: one attempt row, the job ready once."""
    now = time.time()
    (a,) = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"a", (), retries=2)], now))
    (claimed,) = store.claim("owner-1", 1, 30.0, now)
    failed = Report(a, claimed.attempt, False, b"err", "exception", "ValueError: no", worker="host:1",
                    started_at=now, ended_at=now + 0.5)
    with answer_lost(store, monkeypatch) as lost:
        _, done, _ = store.finish_and_claim([failed], "owner-1", 0, 30.0, now + 1.0)
    assert lost() == 1
    assert done.lost == [] and done.finals == []
    assert _state(store, a)[0] == schema.READY
    assert _attempt_rows(store, a) == ["exception"]
    j = store.tables.jobs
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(j).where(j.c.id == a, j.c.attempt == claimed.attempt)).scalar() == 1


def _count(store) -> int:
    j = store.tables.jobs
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(j)).scalar_one())


def test_a_submit_committed_without_an_answer_is_stored_once(store, monkeypatch):
    """Jobs without keys whose insert commits, its answer lost: the second try finds them and stores none again."""
    now = time.time()
    with answer_lost(store, monkeypatch) as lost:
        out = store.insert_jobs([NewJob("tests.f", b"x%d" % i, ()) for i in range(3)], now)
    assert lost() == 1
    assert _count(store) == 3
    j = store.tables.jobs
    with store.engine.connect() as conn:
        stored = list(conn.execute(select(j.c.id).order_by(j.c.id)).scalars())
    assert [s.job_id for s in out] == stored  # the futures get the rows that are there


def test_a_one_row_submit_committed_without_an_answer_is_found_by_its_submitter(store, monkeypatch):
    """A submit of one job (on PostgreSQL a statement in autocommit) lands, its answer lost: found, not stored again.

    Found by its submitter and creation time, not by what the try returned:
    in autocommit the statement commits as it runs, and the answer lost may
    be the statement's own.
    """
    now = time.time()
    store.insert_jobs([NewJob("tests.f", b"first", (), submitted_by="me-1")], now)  # the group is written
    with answer_lost(store, monkeypatch) as lost:
        (row,) = store.insert_jobs([NewJob("tests.f", b"x", (), submitted_by="me-1")], now + 1.0)
    assert lost() == 1
    assert _count(store) == 2
    assert _state(store, row.job_id)[0] == schema.READY and row.state == schema.READY


def test_a_tick_committed_without_an_answer_is_not_written_again(store, monkeypatch):
    """A tick that inserts, records and claims commits, its answer lost: its rows, leases and reports stand once."""
    now = time.time()
    (a,) = (s.job_id for s in store.insert_jobs([NewJob("tests.f", b"a", ())], now))
    (held,) = store.claim("owner-1", 1, 30.0, now)
    report = _ok(held, now, b"A")
    new = [NewJob("tests.f", b"n%d" % i, ()) for i in range(2)]
    with answer_lost(store, monkeypatch) as lost:
        inserted, done, claimed = store.finish_and_claim([report], "owner-1", 2, 30.0, now + 1.0, new)
    assert lost() == 1
    assert _count(store) == 3  # a and the two new rows, once
    assert sorted(c.job_id for c in claimed) == sorted(s.job_id for s in inserted)
    for c in claimed:  # what the caller was told it holds is what the rows say
        assert _state(store, c.job_id)[0] == schema.LEASED
    assert [f.job_id for f in done.finals] == [a]
    assert _attempt_rows(store, a) == ["ok"]


def test_a_claim_committed_without_an_answer_returns_the_leases_it_took(store, monkeypatch):
    """A claim commits, its answer lost: the caller gets the jobs leased then, not a second claim that finds none."""
    now = time.time()
    ids = [s.job_id for s in store.insert_jobs([NewJob("tests.f", b"c%d" % i, ()) for i in range(2)], now)]
    with answer_lost(store, monkeypatch) as lost:
        claimed = store.claim("owner-1", 1, 30.0, now, probe=False)  # no read first: the claim's is the COMMIT lost
    assert lost() == 1
    assert [c.job_id for c in claimed] == [ids[0]]
    j = store.tables.jobs
    with store.engine.connect() as conn:
        leased = conn.execute(select(j.c.id, j.c.attempt).where(j.c.state == schema.LEASED)).all()
    assert [(r.id, r.attempt) for r in leased] == [(c.job_id, c.attempt) for c in claimed]


def _refused_answer(store) -> BaseException:
    """An error the store does not retry by itself (not a lost connection): the loop's next tick writes again."""
    kind = store.engine.dialect.name
    if kind == "sqlite":
        import sqlite3

        return sqlite3.DatabaseError("the answer to COMMIT was lost")
    if kind == "postgresql":
        import psycopg

        return psycopg.DatabaseError("the answer to COMMIT was lost")
    import pymysql

    return pymysql.err.DatabaseError("the answer to COMMIT was lost")


def test_the_loop_writes_reports_again_without_counting_twice_what_an_unconfirmed_commit_did(db, monkeypatch, tmp_path):
    """An executor's tick that finishes ``a`` commits, and its COMMIT raises: the next tick must not release ``d``.

    The store does not run the transaction again itself here (the error is
    not one it retries): the loop keeps the reports and writes them in a
    later tick, which must leave out what the first one recorded.
    """
    ex = db.executor(2)
    store = ex._store
    gate, gate_a = tmp_path / "gate", tmp_path / "gate-a"
    a = ex.submit(jobs.wait_for_file, str(gate_a), "a")
    c = ex.submit(jobs.wait_for_file, str(gate), "c")
    target = a.job_id
    finishing = threading.Event()  # a transaction sent a's report, and has not committed yet
    lost = []

    def watching(real):
        def wrapped(ctx, conn, reports, *args, **kwargs):
            if any(r.job_id == target for r in reports):
                finishing.set()
            return real(ctx, conn, reports, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(finish_module, "finish", watching(finish_module.finish))
    monkeypatch.setattr(finish_module, "finish_pipelined", watching(finish_module.finish_pipelined))
    dialect = store.engine.dialect
    real_commit = dialect.do_commit

    def do_commit(dbapi_connection) -> None:
        real_commit(dbapi_connection)
        if finishing.is_set() and not lost:
            finishing.clear()
            lost.append(1)
            raise _refused_answer(store)

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    d = ex.submit(jobs.add, a, c)
    ex.flush()  # d's row is written (waiting for both) before a may finish
    gate_a.write_text("go")
    assert a.result(timeout=30) == "a"
    assert lost == [1]
    try:
        time.sleep(0.5)  # ticks after the lost answer: d must still wait for c
        assert (db.row(d.job_id).state, db.row(d.job_id).open_deps) == (schema.WAITING, 1)
        assert [r.outcome for r in db.attempts(target)] == ["ok"]
    finally:
        gate.write_text("go")
    assert d.result(timeout=30) == "ac"
    assert [r.outcome for r in db.attempts(c.job_id)] == ["ok"]


def _writes_fail(store, monkeypatch, names, when, *, made=True):
    """From the first call of ``Store.<name>`` (``names``) for which ``when(*args)`` holds, its every ``COMMIT`` fails in the client.

    ``made``: each ``COMMIT`` is made on the server before it fails (its
    answer lost), else it is not made (a failure). Every try the store makes
    of that call fails so, and then the store gives up. Returns the calls so
    affected and the ``COMMIT``s failed (lists, filled as it goes).
    """
    affected = threading.Event()
    calls: list[int] = []
    lost: list[int] = []
    for name in names:

        def wrapped(self, *args, _real=getattr(Store, name), **kwargs):
            if not lost and when(*args, **kwargs):
                affected.set()
                calls.append(1)
            try:
                return _real(self, *args, **kwargs)
            finally:
                affected.clear()

        monkeypatch.setattr(Store, name, wrapped)
    dialect = store.engine.dialect
    real_commit = dialect.do_commit

    def do_commit(dbapi_connection) -> None:
        if not affected.is_set():
            real_commit(dbapi_connection)
            return
        if made:
            real_commit(dbapi_connection)
        lost.append(1)
        raise _dropped(store)

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    # Each of the store's tries fails: its backoff (2.3 s, for a server's restart) only slows the test.
    monkeypatch.setattr(database_module, "RETRY_DELAY_MAX", 0.05)
    return calls, lost


def _inserting(reports, owner, limit, ttl, now, new=(), *args, **kwargs) -> bool:
    """A tick (``Store.finish_and_claim``'s arguments) that inserts rows."""
    return bool(new)


def _inserting_and_claiming(reports, owner, limit, ttl, now, new=(), *args, **kwargs) -> bool:
    """A tick that inserts rows and may claim them."""
    return bool(new) and limit > 0


def _recording(reports, *args, **kwargs) -> bool:
    """A tick that records a success."""
    return any(r.ok for r in reports)


def test_the_loop_does_not_store_again_the_jobs_of_a_tick_whose_commit_it_could_not_confirm(db, monkeypatch):
    """A tick that inserts submitted jobs commits, its answer is lost, and the store's retries all fail: the next tick finds the rows.

    The store gives up (the database looks down for all its tries), and the
    jobs go back to the submit queue with the failed write's time; the next
    writer reads their rows by submitter and that time, gives the futures
    those ids, and writes none of them again. What that tick leased is
    reclaimed when its leases expire (short here).
    """
    ex = db.executor(2, lease_ttl=2.0)
    _, lost = _writes_fail(ex._store, monkeypatch, ["finish_and_claim"], _inserting)
    futures = [ex.submit(jobs.square, i) for i in range(5)]
    assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9, 16]
    assert len(lost) > 1  # the store tried again, and gave up
    assert len(db.jobs()) == 5  # each stored once
    assert sorted(f.job_id for f in futures) == [r.id for r in db.jobs()]


def test_a_durable_submit_whose_commit_could_not_be_confirmed_is_stored_once(db, monkeypatch):
    """A durable submit's insert commits, its answer is lost and the store's retries fail: the submit raises, the job is stored once.

    The job stays queued, as for a database that cannot be reached; the
    loop's next write finds its row instead of writing it again, and runs it.
    Where the row went in leased to the executor (SQLite's durable submit to
    a free slot), the loop gives that lease back at once rather than letting
    it expire (10 s here): the job is done well before.
    """
    ex = db.executor(2, durable_submit=True)
    ex.submit(jobs.square, 1).result(timeout=30)  # started, its group written
    # SQLite's durable submit goes in leased when a slot is free (insert_leasing); the servers' as a plain insert.
    _, lost = _writes_fail(ex._store, monkeypatch, ["insert_jobs", "insert_leasing"], lambda *args, **kwargs: True)
    with pytest.raises(Exception):
        ex.submit(jobs.square, 7)
    assert len(lost) > 1
    deadline = time.monotonic() + 8  # before a lease of 10 s could expire
    while time.monotonic() < deadline and not any(r.state == schema.DONE and r.id != 1 for r in db.jobs()):
        time.sleep(0.05)
    time.sleep(0.3)  # the loop's ticks after it
    rows = db.jobs()
    assert len(rows) == 2 and all(r.state == schema.DONE for r in rows)
    assert "lease expired" not in [a.outcome for a in db.attempts()]


def test_leases_taken_by_a_tick_whose_commit_could_not_be_confirmed_are_given_back(db, monkeypatch):
    """The tick that inserts and leases jobs commits, its answer is lost, the store's retries all fail: the next tick gives them back.

    Nobody knows of those leases (the children that started them early were
    killed when the commit looked failed); without the executor giving them
    back, the jobs would wait for the leases to expire (10 s here). Each
    such attempt is recorded as ``released``, none as ``lease expired``.
    """
    ex = db.executor(2)  # lease_ttl 10 s: longer than this test waits for any result
    _, lost = _writes_fail(ex._store, monkeypatch, ["finish_and_claim"], _inserting_and_claiming)
    futures = [ex.submit(jobs.square, i) for i in range(3)]
    assert [f.result(timeout=8) for f in futures] == [0, 1, 4]  # before any lease of 10 s could expire
    assert len(lost) > 1
    outcomes = [r.outcome for r in db.attempts()]
    assert "released" in outcomes and "lease expired" not in outcomes
    assert outcomes.count("ok") == 3 and len(db.jobs()) == 3


def test_a_tick_that_failed_gives_back_no_lease_whose_report_waits(db, monkeypatch):
    """The tick that records a finished job fails for real (nothing committed, every retry): the job is recorded once, not rerun.

    The loop then gives back the leases nobody knows of (see above); a job
    whose report waits to be written again is still this executor's.
    """
    ex = db.executor(1)
    # The COMMIT is not made: the transaction is rolled back, every try.
    failed, _ = _writes_fail(ex._store, monkeypatch, ["finish_and_claim"], _recording, made=False)
    future = ex.submit(jobs.square, 3)
    assert future.result(timeout=30) == 9
    assert failed == [1]
    assert [r.outcome for r in db.attempts(future.job_id)] == ["ok"]
