"""Multi-row inserts store each row's own values, whatever repeats across rows.

PostgreSQL binds a column whose value is the same in every row once, as a
scalar, and the others as arrays; these tests write rows where some, all or
none of the columns repeat (None, text, numbers, bytes) and read them back.
"""

from __future__ import annotations

import time

import pytest

from sqlalchemy import delete, insert, select

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


def test_a_column_is_bound_once_only_when_every_value_is_the_same_and_of_one_type():
    from dbexecutor.dialects.postgresql import _constant

    assert _constant([None, None, None]) and _constant([b"p", b"p"]) and _constant(["w"] * 300)
    # Equal is not enough: bound once as the first row's value, 1 would stand for True and 1.0.
    assert not _constant([1, True]) and not _constant([1, 1.0]) and not _constant([0, False, 0])
    assert not _constant([None, 0]) and not _constant([b"p", b"q"]) and not _constant(["w"] * 299 + ["x"])


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


def test_a_burst_gets_new_ascending_ids_never_those_of_purged_rows(store):
    # SQLite counts a burst's ids on from the table's sequence instead of
    # reading each back: they must be the ids the rows got, in order, and
    # never those of rows deleted since (a purged job's id names no other job).
    j = store.tables.jobs
    first = store.insert_jobs([NewJob("tests.f", b"a%d" % i, ()) for i in range(5)], time.time())
    with store.engine.begin() as conn:
        conn.execute(delete(j).where(j.c.id.in_([r.job_id for r in first[2:]])))
    second = store.insert_jobs([NewJob("tests.f", b"b%d" % i, ()) for i in range(4)], time.time())
    ids = [r.job_id for r in second]
    assert ids == sorted(ids) and len(set(ids)) == 4 and ids[0] > first[-1].job_id
    third = store.insert_jobs([NewJob("tests.f", b"c", ())], time.time())  # one row: the database's own id
    assert third[0].job_id > ids[-1]
    with store.engine.connect() as conn:
        got = dict(conn.execute(select(j.c.id, j.c.payload)).all())
    assert [got[i] for i in ids] == [b"b%d" % i for i in range(4)]


def test_sqlite_burst_ids_in_a_table_made_without_autoincrement(tmp_path):
    # Databases made before jobs.id had AUTOINCREMENT have no sequence to read
    # (and, with no such table, no sqlite_sequence): the largest id decides.
    from sqlalchemy import create_engine
    from sqlalchemy.schema import CreateTable

    from dbexecutor.dialects.sqlite import SQLiteDriver
    from dbexecutor.schema import make_tables

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    j = make_tables("").jobs
    driver = SQLiteDriver(engine.url)
    row = {"state": "ready", "fn_name": "tests.f", "group_key": "default", "created_at": 1.0}
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(str(CreateTable(j).compile(engine)).replace("AUTOINCREMENT", ""))
            assert conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").first() is None
            conn.execute(insert(j), [{**row, "id": 41, "payload": b"old"}])
            ids = driver.insert_job_rows(conn, j, [{**row, "payload": b"p%d" % i} for i in range(3)])
            assert ids == [42, 43, 44]
            assert conn.execute(select(j.c.payload).where(j.c.id == 43)).scalar_one() == b"p1"
    finally:
        engine.dispose()


def test_sqlite_rows_of_a_converting_type_are_refused_not_bound_raw(tmp_path):
    # The SQLite driver binds rows as plain tuples, skipping SQLAlchemy's type
    # processing: a column whose type converts its values must be refused,
    # not written unconverted.
    import datetime

    from sqlalchemy import Column, DateTime, Integer, MetaData, Table, create_engine

    from dbexecutor.dialects.sqlite import SQLiteDriver

    engine = create_engine(f"sqlite:///{tmp_path / 'types.db'}")
    t = Table("stamps", MetaData(), Column("id", Integer, primary_key=True), Column("at", DateTime))
    t.create(engine)
    driver = SQLiteDriver(engine.url)
    try:
        with engine.begin() as conn:
            driver.insert_rows(conn, t, [{"id": 1}, {"id": 2}])  # plain columns go
            with pytest.raises(TypeError, match="'at'"):
                driver.insert_rows(conn, t, [{"id": 3, "at": datetime.datetime(2026, 12, 4)}])
    finally:
        engine.dispose()


def test_values_that_need_escaping_in_an_array_read_back_as_written(db):
    # Several rows with differing values, so every column goes as an array:
    # bytes with NUL, quotes, backslashes and braces; text that looks like
    # array syntax or NULL; ints at both ends of 32 bits; None among values.
    store = db.store()
    try:
        (owner,) = store.insert_jobs([NewJob("tests.f", b"x", ())], time.time())
        j = owner.job_id
        texts = ['a,b', '"q"', "{x}", "NULL", "back\\slash", "é ü 中", "", "it's 50%, %s %(x)s", "\\'; --", None]
        rows = [
            {"job_id": j, "attempt": n, "worker": t, "started_at": -1.5e300 if n == 3 else 1e16 if n == 4 else -0.0 if n == 5 else n / 3,
             "ended_at": float(n), "outcome": f"o{n}", "detail": texts[-1 - n]}
            for n, t in enumerate(texts)
        ]
        with store.engine.begin() as conn:
            store.driver.insert_rows(conn, store.tables.attempts, [dict(r) for r in rows])
        a = store.tables.attempts
        with store.engine.connect() as conn:
            got = conn.execute(select(*[a.c[c] for c in rows[0]]).order_by(a.c.id)).all()
        assert [dict(r._mapping) for r in got] == rows

        payloads = [b"\x00\x01", b'"\\{}', b"", b"NULL", bytes(range(256)), b"x" * 5000]
        burst = [NewJob("tests.g", p, (), priority=-(2**31) + i if i % 2 else 2**31 - 1 - i) for i, p in enumerate(payloads)]
        written = store.insert_jobs(burst, time.time())
        jobs_t = store.tables.jobs
        with store.engine.connect() as conn:
            back = conn.execute(
                select(jobs_t.c.payload, jobs_t.c.priority).where(jobs_t.c.id.in_([r.job_id for r in written])).order_by(jobs_t.c.id)
            ).all()
        assert [(r.payload, r.priority) for r in back] == [(job.payload, job.priority) for job in burst]
    finally:
        store.close()


@pytest.mark.databases("postgresql")
def test_lists_go_to_postgresql_in_binary(store):
    # psycopg dumps a list in text by default, escaping element by element in
    # Python (a bytea element ~3 us); the store's connections take the binary
    # array dumper for lists, ~0.15 us an element.
    from psycopg.adapt import PyFormat
    from psycopg.types.array import ListBinaryDumper

    with store.engine.connect() as conn:
        adapters = conn.connection.dbapi_connection.adapters
        assert adapters.get_dumper(list, PyFormat.AUTO) is ListBinaryDumper
    import psycopg

    assert psycopg.adapters.get_dumper(list, PyFormat.AUTO) is not ListBinaryDumper  # nothing changed for the application


@pytest.mark.databases("mariadb")
def test_values_written_into_mysql_statements_are_spelled_as_pymysql_spells_them(store):
    # Multi-row statements carry their values as literals (dialects.mysql._inline):
    # each must read as PyMySQL's own escaping of it, under either quoting mode.
    from dbexecutor.dialects.mysql import _literal

    values = [0, -(2**63), 2**64, None, 0.1, -0.0, 1e16, 1.5e-300, 2.0, b"", bytes(range(256)), "", "it's",
              "back\\slash", '"q" %s %%', "é ü 中", "\x00nul", True, False]
    with store.engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        for mode in ("", "NO_BACKSLASH_ESCAPES"):
            conn.exec_driver_sql(f"SET SESSION sql_mode = '{mode}'")
            for v in values:
                assert _literal(v, dbapi.escape) == dbapi.escape(v), v
                # and the server reads back what was meant
                if v is not None and not isinstance(v, bool):
                    got = conn.exec_driver_sql("SELECT " + _literal(v, dbapi.escape), execution_options={"no_parameters": True}).scalar()
                    assert (float(got) if isinstance(v, float) else got) == v, v
        conn.invalidate()  # the session's sql_mode goes with it
