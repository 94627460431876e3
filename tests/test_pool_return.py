"""A connection going back to the store's pool: an open transaction is rolled back, a committed one costs nothing.

The pool's stock reset is a ROLLBACK on every return. PyMySQL sends it to the
server even after a COMMIT (psycopg and sqlite3 know when nothing is open), a
round trip per transaction; on MySQL/MariaDB the store asks the server's
status flags instead.
"""

from __future__ import annotations

import ssl

from sqlalchemy import func, insert, select, text

import pytest


def _rows(store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(store.tables.jobs)).scalar_one())


def test_a_connection_returned_with_an_open_write_is_rolled_back(db, store):
    raw = store.engine.raw_connection()  # the pool's connection, past SQLAlchemy's own transaction handling
    cur = raw.cursor()
    if db.kind == "sqlite":
        cur.execute("BEGIN")  # this store's sqlite3 connections leave BEGIN to the caller
    jobs = store.tables.jobs
    stmt = insert(jobs).values(state="done", fn_name="f", payload=b"x", created_at=0.0)
    compiled = stmt.compile(store.engine)
    cur.execute(str(compiled), compiled.params if db.kind != "sqlite" else tuple(compiled.params.values()))
    cur.close()
    raw.close()  # back to the pool, uncommitted
    assert _rows(store) == 0
    with store.engine.begin() as conn:  # the same pooled connection: nothing left open on it
        conn.execute(insert(jobs).values(state="done", fn_name="f", payload=b"x", created_at=0.0))
    assert _rows(store) == 1


@pytest.mark.databases("mariadb")
def test_no_rollback_after_a_commit_on_mysql(db, store):
    def rollbacks(conn) -> int:
        # The pool holds one connection here, so each block below gets the same session.
        assert conn.execute(text("SELECT CONNECTION_ID()")).scalar_one() == session
        return int(conn.execute(text("SHOW SESSION STATUS LIKE 'Com_rollback'")).one()[1])

    assert store.engine.pool.checkedin() == 1
    with store.engine.connect() as conn:
        session = conn.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        conn.commit()

    with store.engine.connect() as conn:
        before = rollbacks(conn)
        conn.commit()
    for _ in range(3):
        with store.engine.begin() as conn:
            conn.execute(insert(store.tables.jobs).values(state="done", fn_name="f", payload=b"x", created_at=0.0))
    with store.engine.connect() as conn:
        assert rollbacks(conn) == before, "a committed transaction was rolled back again on its way to the pool"
        conn.commit()
    # A transaction that did go wrong still ends in a ROLLBACK on the server.
    with pytest.raises(ZeroDivisionError):
        with store.engine.connect() as conn:
            conn.execute(insert(store.tables.jobs).values(state="done", fn_name="f", payload=b"x", created_at=0.0))
            raise ZeroDivisionError
    with store.engine.connect() as conn:
        assert rollbacks(conn) == before + 1
        conn.commit()
    assert _rows(store) == 3


@pytest.mark.databases("mariadb")
def test_new_mysql_connections_share_one_tls_context_and_keep_their_own_options(db, store):
    """PyMySQL's "preferred" TLS context (no TLS options) is made once per process, not per connection.

    Each one loaded the system's CA bundle (about 20 ms of CPU a connection).
    Explicit TLS options still get a context of their own, built by PyMySQL.
    """
    first = store.engine.raw_connection()
    second = store.engine.raw_connection()  # a second pooled connection: a new session
    try:
        a, b = first.driver_connection, second.driver_connection
        assert a.thread_id() != b.thread_id()
        assert a.ctx is b.ctx  # made for the first connection the process opened, kept since
        cur = a.cursor()
        cur.execute("SELECT 1")
        assert cur.fetchall() == ((1,),)
        cur.close()
    finally:
        first.close()
        second.close()
    kind = type(a)
    own = kind._create_ssl_ctx(a, {"verify_mode": "required"})
    assert own is not a.ctx and own.verify_mode == ssl.CERT_REQUIRED
    assert kind._create_ssl_ctx(a, {}) is a.ctx
