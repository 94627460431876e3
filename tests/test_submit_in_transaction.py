"""Submitting inside the caller's transaction: ``ex.options(connection=conn).submit(...)``, on every database.

The caller's connection comes from an engine of the test's own (as an
application's would), on the same database as the executor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import jobs
from clitools import cli_env
from dbexecutor import ConfigurationError, SubmitRolledBack
from dbexecutor.dialects import resolve
from dbexecutor.store import Store
from test_pgbouncer import bouncer  # noqa: F401 - the fixture

T = 60
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "outbox.py")


@pytest.fixture
def engine(db) -> Any:
    """The application's own engine on the test's database."""
    eng = create_engine(resolve(db.url).url)
    yield eng
    eng.dispose()


def _count(db) -> int:
    return len(db.jobs())


def test_a_rolled_back_submit_leaves_no_row_and_its_future_says_so(db, engine):
    ex = db.executor(2)
    with engine.connect() as conn:
        fut = ex.options(connection=conn).submit(jobs.add, 1, 2)
        assert fut.job_id is not None and not fut.done()
        assert fut.cancel() is False  # nobody can see the job before the commit
        conn.rollback()
    with pytest.raises(SubmitRolledBack, match="rolled back"):
        fut.result(timeout=5)
    assert _count(db) == 0


def test_a_committed_submit_runs(db, engine):
    ex = db.executor(2)
    with engine.connect() as conn:
        fut = ex.options(connection=conn).submit(jobs.add, 1, 2)
        conn.commit()
    assert fut.result(timeout=T) == 3
    assert db.row(fut.job_id).state == "done"


def test_a_session_commit_and_rollback(db, engine):
    ex = db.executor(2)
    with Session(engine) as session:
        kept = ex.options(connection=session).submit(jobs.add, 2, 2)
        session.commit()
        dropped = ex.options(connection=session).submit(jobs.add, 3, 3)
        session.rollback()
    assert kept.result(timeout=T) == 4
    with pytest.raises(SubmitRolledBack):
        dropped.result(timeout=5)
    assert [r.id for r in db.jobs()] == [kept.job_id]


def test_the_callers_own_rows_and_the_job_commit_together(db, engine):
    ex = db.executor(2)
    table = f"{db.prefix}orders"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, job INTEGER)"))
    try:
        for commit in (False, True):
            conn = engine.connect()
            fut = ex.options(connection=conn).submit(jobs.add, 1, 1)
            conn.execute(text(f"INSERT INTO {table} (id, job) VALUES (:i, :j)"), {"i": int(commit), "j": fut.job_id})
            conn.commit() if commit else conn.rollback()
            conn.close()
        assert fut.result(timeout=T) == 2
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT id, job FROM {table}")).all() == [(1, fut.job_id)]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))


def test_dependents_in_the_same_transaction(db, engine):
    ex = db.executor(2)
    with engine.connect() as conn:
        sub = ex.options(connection=conn)
        a = sub.submit(jobs.add, 1, 2)
        b = sub.submit(jobs.add, a, 10)  # a future as an argument
        c = sub.submit(jobs.add, 5, 5, after=[b])  # ordering only
        conn.commit()
    assert (a.result(timeout=T), b.result(timeout=T), c.result(timeout=T)) == (3, 13, 10)
    assert db.row(b.job_id).state == "done"


def test_a_dependent_on_a_job_committed_before(db, engine):
    ex = db.executor(2)
    up = ex.submit(jobs.add, 1, 1)
    ex.flush()
    with engine.connect() as conn:
        down = ex.options(connection=conn).submit(jobs.add, up, 1)
        conn.commit()
    assert down.result(timeout=T) == 3


def test_upstream_rows_are_read_inside_the_callers_transaction(db, engine):
    """The rows a dependent's state is decided by are read where no finish can slip in before the insert.

    On SQLite the caller's driver runs a read outside any transaction (it
    begins one before its first write): once the group was known, the first
    statement of a submit was that read, and an upstream that finished right
    after it left its new dependent waiting forever (seen once in CI). The
    submit now takes the write lock first. PostgreSQL and MariaDB lock the
    upstream rows in the transaction itself.
    """
    ex = db.executor(2)
    up = ex.submit(jobs.add, 1, 1)
    ex.flush()
    outside: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def check(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        # sqlite3's own view (SQLAlchemy's says "in a transaction" from the first statement on).
        raw = conn.connection.dbapi_connection
        if db.kind == "sqlite" and statement.lstrip().upper().startswith("SELECT") and not raw.in_transaction:
            outside.append(statement)

    for round_ in range(2):  # the second time, the group is known and no group row is written first
        with engine.connect() as conn:
            down = ex.options(connection=conn).submit(jobs.add, up, round_)
            conn.commit()
        assert down.result(timeout=T) == 2 + round_
    assert not outside, outside


def test_dependents_rolled_back_with_their_upstream(db, engine):
    ex = db.executor(2)
    with engine.connect() as conn:
        a = ex.options(connection=conn).submit(jobs.add, 1, 2)
        b = ex.options(connection=conn).submit(jobs.add, a, 1)
        conn.rollback()
    for fut in (a, b):
        with pytest.raises(SubmitRolledBack):
            fut.result(timeout=5)
    assert _count(db) == 0


def test_a_savepoint_rolled_back_takes_its_jobs_with_it(db, engine):
    # The outer transaction commits, the savepoint's job is gone: found missing once the commit is over.
    ex = db.executor(2)
    with engine.connect() as conn:
        kept = ex.options(connection=conn).submit(jobs.add, 1, 1)
        savepoint = conn.begin_nested()
        dropped = ex.options(connection=conn).submit(jobs.add, 2, 2)
        savepoint.rollback()
        conn.commit()
    assert kept.result(timeout=T) == 2
    with pytest.raises(SubmitRolledBack):
        dropped.result(timeout=T)
    assert [r.id for r in db.jobs()] == [kept.job_id]


def test_keys_inside_a_transaction(db, engine):
    ex = db.executor(2)
    key = f"k-{uuid.uuid4().hex[:8]}"
    with engine.connect() as conn:
        first = ex.options(connection=conn, key=key).submit(jobs.add, 1, 1)
        again = ex.options(connection=conn, key=key).submit(jobs.add, 9, 9)
        assert again is first  # the same key twice in one transaction: one job
        conn.rollback()
    with pytest.raises(SubmitRolledBack):
        first.result(timeout=5)
    with engine.connect() as conn:
        kept = ex.options(connection=conn, key=key).submit(jobs.add, 2, 2)
        conn.commit()
    assert kept.result(timeout=T) == 4
    with engine.connect() as conn:  # a key committed before: that job's future, as outside a transaction
        found = ex.options(connection=conn, key=key).submit(jobs.add, 7, 7)
        conn.rollback()
    assert found.job_id == kept.job_id and found.result(timeout=T) == 4
    assert ex.future(key=key).result(timeout=T) == 4
    assert _count(db) == 1


def test_map_and_a_batch_inside_a_transaction(db, engine):
    ex = db.executor(2)
    with engine.connect() as conn:
        results = ex.options(connection=conn).map(jobs.add, [1, 2, 3], [10, 20, 30])
        with ex.options(connection=conn).batch() as batch:
            batch.map(jobs.add, [1, 2], [1, 2])
        conn.commit()
    assert list(results) == [11, 22, 33]
    assert batch.result(timeout=T) == [2, 4]
    with pytest.raises(ValueError, match="buffersize"):
        ex.options(connection=engine.connect()).map(jobs.add, [1], [1], buffersize=1)


def test_another_database_is_refused(db, engine, tmp_path):
    ex = db.executor(1)
    if db.kind == "sqlite":
        other = create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    else:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            exists = conn.execute(text(
                "SELECT 1 FROM pg_database WHERE datname = 'test_other'" if db.kind == "postgresql"
                else "SELECT 1 FROM information_schema.schemata WHERE schema_name = 'test_other'"
            )).first()
            if not exists:
                conn.execute(text("CREATE DATABASE test_other"))
        other = create_engine(resolve(db.url).url.set(database="test_other"))
    try:
        with other.connect() as conn:
            with pytest.raises(ConfigurationError, match="another database"):
                ex.options(connection=conn).submit(jobs.add, 1, 1)
            conn.rollback()
    finally:
        other.dispose()
    assert _count(db) == 0


def test_a_connection_through_a_symlinked_path_is_the_same_sqlite_file(db, tmp_path):
    if db.kind != "sqlite":
        pytest.skip("SQLite files only")
    ex = db.executor(1)
    link = tmp_path / "link.db"
    os.symlink(make_url(db.url).database, link)
    other = create_engine(f"sqlite:///{link}")
    try:
        with other.connect() as conn:
            fut = ex.options(connection=conn).submit(jobs.add, 1, 1)
            conn.commit()
        assert fut.result(timeout=T) == 2
    finally:
        other.dispose()


def test_a_submit_only_executor_sees_the_commit_at_once(db, engine):
    # Another executor runs it; the submitting one only follows the row.
    db.executor(2)
    submitter = db.executor(1, run_jobs=False)
    with engine.connect() as conn:
        fut = submitter.options(connection=conn).submit(jobs.add, 20, 22)
        conn.commit()
    assert fut.result(timeout=T) == 42


def test_the_outbox_example_runs(db, tmp_path):
    prefix = db.prefix or "ex_"
    out = subprocess.run(
        [sys.executable, EXAMPLE, db.url, prefix], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
        env=cli_env(),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "order 1 mailed" in out.stdout and "rolled back" in out.stdout, out.stdout
    if db.kind != "sqlite":
        engine = create_engine(resolve(db.url).url)
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {prefix}orders"))
        engine.dispose()
        if not db.prefix:
            Store(db.url, prefix, create=False).drop_schema()


# -- through PgBouncer (transaction pooling) ------------------------------------------------------


def test_both_features_through_pgbouncer(bouncer):
    """A caller's transaction through PgBouncer or directly, and a job transaction through PgBouncer.

    Each is one transaction, so transaction pooling keeps it on one server
    connection; the database identity is the server's, the same either way.
    """
    import txn_jobs

    ex = bouncer.executor(2)
    table = f"{bouncer.prefix}items"
    pooled = create_engine(resolve(bouncer.url).url, connect_args={"prepare_threshold": None})
    direct = create_engine(resolve(bouncer.direct).url)
    try:
        with direct.begin() as conn:
            conn.execute(text(f"CREATE TABLE {table} (v VARCHAR(100))"))
        futures = []
        for engine, value in ((pooled, "pooled"), (direct, "direct")):
            with engine.connect() as conn:
                futures.append(ex.options(connection=conn).submit(txn_jobs.insert, table, value))
                conn.commit()
        with pooled.connect() as conn:
            dropped = ex.options(connection=conn).submit(txn_jobs.insert, table, "dropped")
            conn.rollback()
        assert [f.result(timeout=T) for f in futures] == ["pooled", "direct"]
        with pytest.raises(SubmitRolledBack):
            dropped.result(timeout=5)
        with direct.connect() as conn:
            assert sorted(r[0] for r in conn.execute(text(f"SELECT v FROM {table}"))) == ["direct", "pooled"]
    finally:
        with direct.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        pooled.dispose()
        direct.dispose()
