"""PostgreSQL's pipeline: several statements sent together on psycopg's connection, the answers read at one sync.

What :meth:`PostgreSQLDriver.pipelined <dbexecutor.dialects.postgresql.PostgreSQLDriver.pipelined>`
sends once the driver has compiled its statements. SQLAlchemy's execution
reads each result as its statement returns, which a pipeline does not allow:
the statements, compiled by SQLAlchemy once, go out on the DBAPI connection;
an error is raised as SQLAlchemy would raise it (wrapped, and a lost
connection invalidated), for the transaction's retry to judge; the engine's
cursor-execute listeners see each statement, as SQLAlchemy's own executions
outside a statement's context do (context None).

A lone statement with no ``BEGIN`` to go with it (a durable submit's
insert in autocommit) takes the same path without a pipeline: what is
saved then is SQLAlchemy's execution, not a round trip.

A pipeline that opens the transaction sends the ``BEGIN`` itself
(:func:`begin_here`): psycopg, beginning one inside a pipeline, would wait
for its answer first (one more round trip).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .base import Rows

__all__ = ["begin_here", "send", "supported"]


def supported() -> bool:
    """Whether psycopg's libpq has pipeline mode (14 and newer; a psycopg without its binary package may not)."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


def send(conn: Connection, raw: Any, sent: Sequence[tuple[tuple[str, Any], dict[str, Any]]]) -> list[Rows]:
    """Send each ``((text, compiled), parameters)`` of ``sent`` on ``conn``'s psycopg connection ``raw`` in one pipeline; their rows.

    ``compiled``: SQLAlchemy's compiled form of the statement, which fills
    in its parameters (and converts them as SQLAlchemy's own execution would).
    One statement with no ``BEGIN`` to send with it goes as psycopg sends one
    (a pipeline's own messages would cost more than they save).
    """
    import psycopg

    cursors: list[Any] = []
    statement, values = "", {}
    events = conn._has_events or conn.engine._has_events
    executed: list[tuple[str, Any]] = []
    begin = begin_here(raw)
    pipeline = begin is not None or len(sent) > 1
    try:
        try:
            with raw.pipeline() if pipeline else contextlib.nullcontext():
                if begin is not None:
                    raw.execute(begin)
                for (statement, compiled), params in sent:
                    values = compiled.construct_params(params)
                    # SQLAlchemy's own conversions on the way in (its ARRAY's: a sequence to a list).
                    for name, convert in getattr(compiled, "_bind_processors", {}).items():
                        if name in values:
                            values[name] = convert(values[name])
                    cur = raw.cursor()
                    cursors.append(cur)
                    if events:
                        for fn in conn.dispatch.before_cursor_execute:
                            statement, values = fn(conn, cur, statement, values, None, False)
                        executed.append((statement, values))
                    cur.execute(statement, values)
            encoding, tuples_ok = raw.info.encoding, psycopg.pq.ExecStatus.TUPLES_OK
            out = [_rows(cur, encoding, tuples_ok) for cur in cursors]
            for cur, (statement, values) in zip(cursors, executed):
                for fn in conn.dispatch.after_cursor_execute:
                    fn(conn, cur, statement, values, None, False)
            return out
        finally:
            if begin is not None:
                # What psycopg's flag would say had it sent the BEGIN itself
                # (the public setter refuses inside a transaction).
                raw._autocommit = False
            for cur in cursors:
                cur.close()
    except psycopg.Error as error:
        lost = conn.dialect.is_disconnect(cast(Any, error), raw, None)
        if lost:
            conn.invalidate()
        raise DBAPIError.instance(statement, values, error, psycopg.Error, connection_invalidated=lost,
                                  dialect=conn.dialect) from error


def _rows(cur: Any, encoding: str, tuples_ok: Any) -> Rows:
    """The result of psycopg cursor ``cur`` as :class:`Rows`; ``encoding``: its connection's, for the column names; ``tuples_ok``: libpq's status of a result with rows.

    The names are read from the result itself: ``cursor.description`` builds
    a ``Column`` object per column (11 us for a result of eight columns
    here, against 1.2 us this way), and only the names are used.
    """
    res = cur.pgresult
    if not res or not (res.nfields or res.status == tuples_ok):
        return Rows([], [])  # a statement that returns no rows (as description is None)
    return Rows([(res.fname(i) or b"").decode(encoding) for i in range(res.nfields)], cur.fetchall())


def opens_transaction(raw: Any) -> bool:
    """Whether the next statement on psycopg connection ``raw`` begins a transaction (psycopg would send a ``BEGIN``)."""
    import psycopg

    return not raw.autocommit and raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def begin_here(raw: Any) -> bytes | None:
    """The ``BEGIN`` a pipeline on ``raw`` should send itself, with ``raw`` put in autocommit; None if it need not.

    psycopg starts a transaction on a connection's first statement, and in
    a pipeline it follows its ``BEGIN`` with a sync and waits for the
    server's answer (so that it knows the transaction's state): one more
    round trip for a tick whose first statements are the pipeline (a
    chain's link). Sent as the pipeline's first statement, with psycopg in
    autocommit for the while so that it adds none, the ``BEGIN`` costs no
    wait; it is the one psycopg would send (the connection's isolation
    level and access modes). The caller puts psycopg's autocommit flag back
    once the pipeline is over. Not where the transaction has begun, the
    connection is in autocommit, or psycopg has not the flag this relies on.
    """
    if not opens_transaction(raw) or not hasattr(raw, "_autocommit"):  # a psycopg whose internals moved: its own BEGIN
        return None
    parts = [b"BEGIN"]
    if raw.isolation_level is not None:
        parts += [b"ISOLATION LEVEL", raw.isolation_level.name.replace("_", " ").encode()]
    if raw.read_only is not None:
        parts.append(b"READ ONLY" if raw.read_only else b"READ WRITE")
    if raw.deferrable is not None:
        parts.append(b"DEFERRABLE" if raw.deferrable else b"NOT DEFERRABLE")
    raw.autocommit = True  # no I/O: the connection is idle
    return b" ".join(parts)
