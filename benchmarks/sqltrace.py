"""Count and time the SQL of an unchanged dbexecutor process, from outside the library.

::

    python -m benchmarks.sqltrace OUT.json -- worker URL --prefix P --max-workers N ...   # the CLI's worker
    python -m benchmarks.sqltrace OUT.json -- idle URL PREFIX SETTLE SECONDS               # an idle DBExecutor

Before the library makes its first engine, this wrapper installs SQLAlchemy
event listeners on the ``Engine`` class (so every engine of the process is
seen): each statement's start and duration (``before/after_cursor_execute``),
each transaction from SQLAlchemy's ``begin`` to the end of the dialect's
``do_commit`` / ``do_rollback`` (SQLite: from ``BEGIN IMMEDIATE``, so the time
waiting for the write lock counts), and on SQLite every statement the
``sqlite3`` module runs (``set_trace_callback``: ``BEGIN``, ``COMMIT`` and
``PRAGMA`` included). Only this process is traced, not the job children
(their heartbeat is the only SQL they send). At exit it writes ``OUT.json``.
Nothing under ``src/`` knows about it.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
import threading
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.pool import Pool

_lock = threading.Lock()
statements: list[tuple[float, float, int, str]] = []  # (start, seconds, thread, first 80 characters)
# (begin, end, thread, statements, outcome, labels, lease statements' seconds or None if it leased nothing)
transactions: list[tuple[float, float, int, int, str, list[str], float | None]] = []
sqlite_statements: list[float] = []  # the wall clock of every statement the sqlite3 module ran
marks: dict[str, float] = {}
_open: dict[int, list[Any]] = {}  # thread -> [begin, statements, labels, lease seconds]

# The statement that leases rows to an executor: an UPDATE of the jobs table that
# bumps ``attempt`` (the fencing token). Nothing else in a worker's life does.
LEASE = re.compile(r"^\s*UPDATE\s+\S*jobs\s+SET\b.*\battempt\s*=\s*\(?\s*\S*attempt\s*\+", re.IGNORECASE | re.DOTALL)


def label(sql: str) -> str:
    return " ".join(sql.split())[:80]


def _begin(conn: Any) -> None:
    _open[threading.get_ident()] = [time.time(), 0, [], None]


def _before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
    conn.info.setdefault("bench_t0", []).append(time.perf_counter())


def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
    # First in, first out: statements sent together in a pipeline all start
    # before any ends (each is timed from its send to the pipeline's answers).
    t0 = conn.info["bench_t0"].pop(0)
    took = time.perf_counter() - t0
    text = label(statement)
    with _lock:
        statements.append((time.time() - took, took, threading.get_ident(), text))
    txn = _open.get(threading.get_ident())
    if txn is not None:
        txn[1] += 1
        txn[2].append(text[:40])
        if LEASE.match(statement):
            txn[3] = (txn[3] or 0.0) + took


def _ending(outcome: str, original: Any) -> Any:
    def wrapped(self: Any, dbapi_connection: Any) -> None:
        try:
            original(self, dbapi_connection)
        finally:
            txn = _open.pop(threading.get_ident(), None)
            if txn is not None:
                with _lock:
                    transactions.append((txn[0], time.time(), threading.get_ident(), txn[1], outcome, txn[2], txn[3]))

    return wrapped



def _connect(dbapi_conn: Any, record: Any) -> None:
    if hasattr(dbapi_conn, "set_trace_callback"):  # sqlite3
        dbapi_conn.set_trace_callback(lambda _sql: sqlite_statements.append(time.time()))


def install() -> None:
    """The listeners, in this process only (a forkserver that imports this module as ``__mp_main__`` gets none)."""
    event.listen(Engine, "begin", _begin)
    event.listen(Engine, "before_cursor_execute", _before)
    event.listen(Engine, "after_cursor_execute", _after)
    event.listen(Pool, "connect", _connect)
    DefaultDialect.do_commit = _ending("commit", DefaultDialect.do_commit)  # type: ignore[method-assign]
    DefaultDialect.do_rollback = _ending("rollback", DefaultDialect.do_rollback)  # type: ignore[method-assign]


def _write(path: str) -> None:
    with _lock:
        data = {"marks": marks, "statements": statements, "transactions": transactions,
                "sqlite_statements": sqlite_statements}
    with open(path, "w") as f:
        json.dump(data, f)


def _idle(url: str, prefix: str, settle: float, seconds: float) -> int:
    from dbexecutor import DBExecutor

    marks["constructing"] = time.time()
    ex = DBExecutor(url, 2, prefix=prefix)
    marks["constructed"] = time.time()
    time.sleep(settle)
    marks["window_start"] = time.time()
    print("window", flush=True)
    time.sleep(seconds)
    marks["window_end"] = time.time()
    ex.shutdown(wait=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(__doc__)
    out, mode, rest = argv[0], argv[2], argv[3:]
    install()
    atexit.register(_write, out)
    if mode == "idle":
        url, prefix, settle, seconds = rest
        return _idle(url, prefix, float(settle), float(seconds))
    from dbexecutor.cli import main as cli_main

    return cli_main([mode, *rest])


# -- reading a trace --------------------------------------------------------------------


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def in_window(times: list[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t < end)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
