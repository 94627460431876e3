"""Statements sent together (``Driver.pipelined``) and the tick that uses them.

On PostgreSQL a batch of statements goes out in one psycopg pipeline and the
answers are read at one sync; elsewhere they run one after another. Either
way: in order, in the caller's transaction (each sees what the ones before
it wrote), their rows returned with their column names, and an error raised
as SQLAlchemy raises it, so that the store's retry can judge it, with
nothing of the batch left once the transaction rolls back.

A scheduler tick that only records successes sends its finish, the
count-down of their dependents and the lone group's lease in one pipeline
(``test_finish_rows.py`` checks the rows, lost leases included); here: that
the lease sent ahead takes the dependent the count-down released, and that
the claim still runs when it leased nothing.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from dbexecutor import schema
from dbexecutor.records import NewJob, Report


def _meta_rows(store, conn):  # noqa: ANN001, ANN202
    meta = store.tables.meta
    return dict(conn.execute(select(meta.c.name, meta.c.value).where(meta.c.name.like("pipe%"))).all())


def test_statements_run_in_order_in_the_callers_transaction(store):
    meta = store.tables.meta
    batch = [
        (insert(meta), {"name": "pipe-a", "value": "1"}),
        (update(meta).where(meta.c.name == "pipe-a").values(value="2"), {}),
        (select(meta.c.name, meta.c.value).where(meta.c.name == "pipe-a"), {}),
        (select(meta.c.value.label("v")).where(meta.c.name == "nothing"), {}),
    ]
    seen: list[tuple[str, str]] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(("before", statement.split(None, 1)[0].upper()))

    def after(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(("after", statement.split(None, 1)[0].upper()))

    with store.engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", before)
        event.listen(conn, "after_cursor_execute", after)
        with conn.begin():
            out = store.driver.pipelined(conn, batch)
            # The engine's listeners see each statement, as SQLAlchemy's own executions.
            verbs = ["INSERT", "UPDATE", "SELECT", "SELECT"]
            if store.driver.pipelines:  # all sent before any answer is read
                assert seen == [("before", v) for v in verbs] + [("after", v) for v in verbs]
            else:
                assert seen == [(when, v) for v in verbs for when in ("before", "after")]
            event.remove(conn, "before_cursor_execute", before)
            event.remove(conn, "after_cursor_execute", after)
            assert [r.keys for r in out] == [[], [], ["name", "value"], ["v"]]
            assert out[2].rows == [("pipe-a", "2")]  # the update before it is seen
            assert out[3].rows == []
        assert _meta_rows(store, conn) == {"pipe-a": "2"}  # committed with the transaction
        conn.rollback()


def test_an_error_is_raised_as_sqlalchemy_raises_it_and_the_batch_rolls_back(store):
    meta = store.tables.meta
    batch = [
        (insert(meta), {"name": "pipe-b", "value": "1"}),
        (insert(meta), {"name": "pipe-b", "value": "again"}),  # the primary key again
        (update(meta).where(meta.c.name == "pipe-b").values(value="3"), {}),
    ]
    with store.engine.connect() as conn:
        with pytest.raises(IntegrityError) as caught:
            with conn.begin():
                store.driver.pipelined(conn, batch)
        assert isinstance(caught.value, DBAPIError) and caught.value.orig is not None
        assert not store.driver.is_transient(caught.value)
        assert _meta_rows(store, conn) == {}
        conn.rollback()
        # The connection is still good for the next transaction.
        with conn.begin():
            assert store.driver.pipelined(conn, [(select(meta.c.value).where(meta.c.name == "vtime"), {})])[0].rows == [("0",)]


def test_one_statement_with_nothing_to_send_with_it_runs_on_its_own(store, monkeypatch):
    """A batch of one, in a transaction already begun (or in autocommit where the store uses it): its rows, its error as SQLAlchemy's.

    On PostgreSQL it goes out past SQLAlchemy's execution (a durable submit's
    one-row insert), the listeners still seeing it.
    """
    from sqlalchemy.engine import Connection

    meta = store.tables.meta
    executed: list[str] = []  # statements SQLAlchemy's execution ran while a batch was sent
    sending = [False]
    original = Connection._execute_context

    def execute_context(self, dialect, constructor, statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        if sending[0]:
            executed.append(str(statement).split(None, 1)[0].upper())
        return original(self, dialect, constructor, statement, *args, **kwargs)

    monkeypatch.setattr(Connection, "_execute_context", execute_context)

    def pipelined(conn, batch):  # type: ignore[no-untyped-def]
        sending[0] = True
        try:
            return store.driver.pipelined(conn, batch)
        finally:
            sending[0] = False

    seen: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(statement.split(None, 1)[0].upper())

    with store.engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", before)
        with conn.begin() as txn:
            pipelined(conn, [(insert(meta), {"name": "pipe-e", "value": "1"})])  # opens the transaction
            out = pipelined(conn, [(select(meta.c.name, meta.c.value).where(meta.c.name == "pipe-e"), {})])
            assert (out[0].keys, out[0].rows) == (["name", "value"], [("pipe-e", "1")])
            with pytest.raises(IntegrityError) as caught:
                pipelined(conn, [(insert(meta), {"name": "pipe-e", "value": "again"})])
            assert caught.value.orig is not None and not store.driver.is_transient(caught.value)
            txn.rollback()
        assert seen == ["INSERT", "SELECT", "INSERT"]
        assert executed == ([] if store.driver.pipelines else seen)
        assert _meta_rows(store, conn) == {}  # all in the caller's transaction
        conn.rollback()
        event.remove(conn, "before_cursor_execute", before)
        if store.driver.autocommits_one_write:  # where the store writes alone in autocommit
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            with auto.begin():
                pipelined(auto, [(insert(meta), {"name": "pipe-f", "value": "1"})])
                with store.engine.connect() as other:  # committed as it ran
                    assert _meta_rows(store, other) == {"pipe-f": "1"}
            assert executed == ([] if store.driver.pipelines else ["INSERT"])


def _running(store, owner: str, n: int, now: float):  # noqa: ANN202
    claimed = store.claim(owner, n, 30.0, now)
    assert len(claimed) == n
    return claimed


def test_a_link_leases_the_next_one_in_its_tick(store, monkeypatch):
    """A chain's link: finishing it releases the next, which the same tick leases (sent ahead on PostgreSQL).

    Once the finished jobs had dependents: a finish of jobs without (the
    other test) goes alone, and the edges out are read after it.
    """
    now = time.time()
    (first,) = store.insert_jobs([NewJob("tests.f", b"1", ())], now)
    (second,) = store.insert_jobs([NewJob("tests.f", b"2", (first.job_id,))], now)
    (c,) = _running(store, "owner-1", 1, now)  # also finds the lone group
    assert c.job_id == first.job_id
    store.ctx.dependents_likely = True  # as after a chain's first link
    sent: list[int] = []
    pipelined = store.driver.pipelined
    monkeypatch.setattr(store.driver, "pipelined", lambda conn, batch, **kw: sent.append(len(batch)) or pipelined(conn, batch, **kw))
    _, done, claimed = store.finish_and_claim(
        [Report(c.job_id, c.attempt, True, b"r1", "ok", ended_at=now)], "owner-1", 1, 30.0, now + 0.1
    )
    assert [f.job_id for f in done.finals] == [first.job_id] and done.released == 1
    assert [x.job_id for x in claimed] == [second.job_id]
    # Where the database pipelines: the finish, the count-down and the lease went together
    # (a batch of one elsewhere is a statement sent alone, or with its transaction's BEGIN).
    assert [n for n in sent if n > 1] == ([3] if store.driver.pipelines else [])
    j = store.tables.jobs
    with store.engine.connect() as conn:
        row = conn.execute(select(j.c.state, j.c.lease_owner, j.c.open_deps).where(j.c.id == second.job_id)).one()
        conn.rollback()
    assert tuple(row) == (schema.LEASED, "owner-1", 0)


def test_a_burst_looks_for_other_work_and_draws_its_ids_in_one_round_trip(store, monkeypatch):
    """A tick's burst of new jobs: the look whether anything else is runnable goes with the ids' draw (PostgreSQL).

    Before, the look was a statement of its own (and psycopg's ``BEGIN``
    before it another round trip), then the ids, then the insert. The rows
    still get ascending ids in submission order, and go in leased when
    nothing else is runnable, as before; where ids are not drawn from a
    sequence nothing is drawn ahead.
    """
    now = time.time()
    sent: list[int] = []
    pipelined = store.driver.pipelined
    monkeypatch.setattr(store.driver, "pipelined", lambda conn, batch, **kw: sent.append(len(batch)) or pipelined(conn, batch, **kw))
    burst = [NewJob("tests.f", str(i).encode(), ()) for i in range(5)]
    inserted, _, claimed = store.finish_and_claim([], "owner-1", 3, 30.0, now, burst)
    ids = [r.job_id for r in inserted]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert [c.job_id for c in claimed] == ids[:3]  # leased on insert: nothing else was runnable
    # The look and the ids together; a sequence's ids drawn ahead are not drawn again.
    assert sent[:1] == ([2] if store.driver.pipelines else [1])
    j = store.tables.jobs
    with store.engine.connect() as conn:
        rows = conn.execute(select(j.c.id, j.c.payload, j.c.state).where(j.c.id.in_(ids)).order_by(j.c.id)).all()
        conn.rollback()
    assert [(bytes(p), st) for _, p, st in rows] == [(str(i).encode(), schema.LEASED if i < 3 else schema.READY) for i in range(5)]
    # Another burst while two of those are runnable: the rows go in ready, after them; the claim takes the oldest first.
    more, _, got = store.finish_and_claim([], "owner-1", 3, 30.0, now, [NewJob("tests.f", b"x", ()) for _ in range(2)])
    assert [r.state for r in more] == [schema.READY] * 2 and min(r.job_id for r in more) > max(ids)
    assert [c.job_id for c in got] == [*ids[3:], more[0].job_id]


def test_when_the_lease_sent_ahead_takes_nothing_the_claim_still_runs(store):
    """The lone group changed between ticks: the lease sent ahead leases nothing, the claim finds the other group."""
    now = time.time()
    (first,) = store.insert_jobs([NewJob("tests.f", b"1", ())], now)
    (c,) = _running(store, "owner-1", 1, now)  # the lone group is "default"
    (other,) = store.insert_jobs([NewJob("tests.f", b"o", (), group="other")], now)
    _, done, claimed = store.finish_and_claim(
        [Report(c.job_id, c.attempt, True, b"r1", "ok", ended_at=now)], "owner-1", 1, 30.0, now + 0.1
    )
    assert [f.job_id for f in done.finals] == [first.job_id]
    assert [x.job_id for x in claimed] == [other.job_id]


def test_a_finish_of_jobs_without_dependents_goes_with_the_read_of_its_edges(store, monkeypatch):
    """No dependents expected: the finish is sent with a read of the edges out of what it won (and the BEGIN, on PostgreSQL).

    Not with the count-down: for jobs without dependents, the read is the
    cheaper statement; any count-down follows it.
    """
    now = time.time()
    (only,) = store.insert_jobs([NewJob("tests.f", b"1", ())], now)
    (c,) = _running(store, "owner-1", 1, now)
    assert not store.ctx.dependents_likely
    sent: list[int] = []
    pipelined = store.driver.pipelined
    monkeypatch.setattr(store.driver, "pipelined", lambda conn, batch, **kw: sent.append(len(batch)) or pipelined(conn, batch, **kw))
    _, done, claimed = store.finish_and_claim(
        [Report(c.job_id, c.attempt, True, b"r1", "ok", ended_at=now)], "owner-1", 1, 30.0, now + 0.1, look=False
    )
    assert [f.job_id for f in done.finals] == [only.job_id] and done.released == 0 and claimed == []
    assert sent == ([2] if store.driver.pipelines else [])
    assert not store.ctx.dependents_likely


def test_a_batch_that_opens_the_transaction_sends_its_begin_with_it(store, tmp_path):
    """The batch is the transaction's first work: on PostgreSQL its BEGIN goes in the pipeline (one sync, one wait).

    psycopg, left to begin the transaction itself, syncs after its BEGIN and
    waits for the answer before the statements go. Everywhere: the batch is
    in the transaction (a rollback undoes it), and the connection is back
    to transactions afterwards (the next transaction's write rolls back too).
    """
    meta = store.tables.meta
    batch = [(insert(meta), {"name": "pipe-c", "value": "1"}), (select(meta.c.value).where(meta.c.name == "pipe-c"), {})]
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        trace = tmp_path / "libpq.trace"
        with trace.open("w") as out:
            if store.driver.pipelines:
                raw.pgconn.trace(out.fileno())
                raw.pgconn.set_trace_flags(3)  # no timestamps
            try:
                conn.begin()
                assert store.driver.pipelined(conn, batch)[1].rows == [("1",)]
                conn.rollback()
            finally:
                if store.driver.pipelines:
                    raw.pgconn.untrace()
        assert _meta_rows(store, conn) == {}
        conn.rollback()
        with conn.begin() as txn:
            conn.execute(insert(meta), {"name": "pipe-d", "value": "1"})
            txn.rollback()
        assert _meta_rows(store, conn) == {}
        conn.rollback()
    if store.driver.pipelines:
        sent = [line.split("\t")[2].strip() for line in trace.read_text().splitlines() if line.startswith("F\t")]
        assert sent.count("Sync") == 1, sent
        parsed = [line for line in trace.read_text().splitlines() if line.startswith("F\t") and "\tParse\t" in line]
        assert "BEGIN" in parsed[0], parsed
        assert not raw.autocommit
