"""Test fixtures: every behavioural test runs on SQLite, PostgreSQL and MariaDB/MySQL.

Each test gets its own tables: a fresh SQLite file, or a random table prefix on
the shared PostgreSQL / MySQL test database, dropped afterwards.

Servers are found through ``DBEXECUTOR_TEST_POSTGRESQL_URL`` and
``DBEXECUTOR_TEST_MYSQL_URL`` (defaults: the loopback servers of the project's
machines). ``DBEXECUTOR_TEST_DATABASES=sqlite,postgresql`` picks databases.
An unreachable server skips its tests, except under ``CI=true``, where it fails them.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, event, insert, select, text
from sqlalchemy.engine import Engine

from dbexecutor import DBExecutor
from dbexecutor.store import Store

SERVERS = {
    "postgresql": ("DBEXECUTOR_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": ("DBEXECUTOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}
ALL = ["sqlite", "postgresql", "mariadb"]
_ALIASES = {"mysql": "mariadb", "pg": "postgresql", "postgres": "postgresql"}
SELECTED = [
    _ALIASES.get(x.strip(), x.strip())
    for x in os.environ.get("DBEXECUTOR_TEST_DATABASES", ",".join(ALL)).split(",")
    if x.strip()
]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_reachable: dict[str, str | None] = {}
_PARAM_RE = re.compile(r"\[(?:[^\]]*-)?(sqlite|postgresql|mariadb)(?:-[^\]]*)?\]")

# Settings that keep tests quick: fast polling, short leases.
FAST = {"poll_interval": 0.05, "lease_ttl": 10.0}


def server_url(kind: str) -> str:
    """The URL of the server for ``kind`` (postgresql or mariadb), from the environment or the default."""
    var, default = SERVERS[kind]
    return os.environ.get(var) or default


def _check(kind: str) -> None:
    if kind not in _reachable:
        url = server_url(kind)
        try:
            from dbexecutor.dialects import resolve

            engine = create_engine(resolve(url).url, connect_args={"connect_timeout": 5})
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            engine.dispose()
            _reachable[kind] = None
        except Exception as error:  # noqa: BLE001 - any failure means "not usable here"
            _reachable[kind] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    reason = _reachable[kind]
    if reason is not None:
        var = SERVERS[kind][0]
        msg = f"{kind} server not reachable ({reason}); set {var} to a reachable server to run these tests"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


@dataclass
class DB:
    """One test's database: URL, table prefix, and the executors to clean up."""

    kind: str
    url: str
    prefix: str
    executors: list[DBExecutor] = field(default_factory=list)

    def executor(self, max_workers: int = 2, **options: Any) -> DBExecutor:
        """A ``DBExecutor`` on this test's tables, shut down after the test."""
        ex = DBExecutor(self.url, max_workers, prefix=self.prefix, **{**FAST, **options})
        self.executors.append(ex)
        return ex

    def store(self) -> Store:
        """A store on this test's tables, for checking rows."""
        return Store(self.url, self.prefix)

    def _select(self, build: Any) -> list[Any]:
        store = self.store()
        try:
            with store.engine.connect() as conn:
                return conn.execute(build(store.tables)).all()
        finally:
            store.close()

    def jobs(self) -> list[Any]:
        """Every job row, by id."""
        return self._select(lambda t: select(t.jobs).order_by(t.jobs.c.id))

    def row(self, job_id: int) -> Any:
        """One job row."""
        (found,) = self._select(lambda t: select(t.jobs).where(t.jobs.c.id == job_id))
        return found

    def states(self, futures: Any) -> dict[int, str]:
        """The state of each future's row, by job id."""
        ids = [f.job_id for f in futures]
        rows = self._select(lambda t: select(t.jobs.c.id, t.jobs.c.state).where(t.jobs.c.id.in_(ids)))
        return {int(r.id): r.state for r in rows}

    def attempts(self, job_id: int | None = None) -> list[Any]:
        """Attempt rows (of one job, or all), in the order they were written."""

        def build(t: Any) -> Any:
            stmt = select(t.attempts).order_by(t.attempts.c.id)
            return stmt if job_id is None else stmt.where(t.attempts.c.job_id == job_id)

        return self._select(build)

    def counts(self) -> dict[str, int]:
        """Number of jobs per state."""
        store = self.store()
        try:
            return store.count_states()
        finally:
            store.close()

    @property
    def options(self) -> dict[str, Any]:
        """Keyword arguments that put a ``DBExecutor`` on this test's tables."""
        return {"prefix": self.prefix, **FAST}


@contextmanager
def statements(match: Callable[[str], bool]) -> Iterator[list[str]]:
    """The statements this process runs while inside (one space between words, lower case) that ``match`` accepts."""
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        text = " ".join(statement.split()).lower()
        if match(text):
            seen.append(text)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def insert_done(conn: Connection, store: Store, n: int) -> list[int]:
    """Insert ``n`` finished jobs straight into the table (in ``conn``'s transaction); every job id, ascending."""
    row = {"state": "done", "fn_name": "f", "payload": b"x", "created_at": time.time()}
    jobs = store.tables.jobs
    conn.execute(insert(jobs), [row] * n)
    return [int(i) for i in conn.execute(select(jobs.c.id).order_by(jobs.c.id)).scalars()]


def insert_waiting(conn: Connection, store: Store, n: int, open_deps: int) -> list[int]:
    """Insert ``n`` plain jobs waiting on ``open_deps`` upstreams each (no edges); every waiting job's id, ascending."""
    row = {"state": "waiting", "fn_name": "f", "payload": b"w", "created_at": time.time(), "open_deps": open_deps}
    jobs = store.tables.jobs
    conn.execute(insert(jobs), [row] * n)
    return [int(i) for i in conn.execute(select(jobs.c.id).where(jobs.c.state == "waiting").order_by(jobs.c.id)).scalars()]


def fan_in(store: Store, n: int) -> list[int]:
    """``n`` finished jobs, the last depending on every other one (committed); their ids."""
    with store.engine.begin() as conn:
        ids = insert_done(conn, store, n)
        conn.execute(insert(store.tables.deps), [{"job_id": ids[-1], "depends_on_id": u} for u in ids[:-1]])
    return ids


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("databases")
        kinds = marker.args if marker else ALL
        metafunc.parametrize("db", [k for k in kinds if k in SELECTED], indirect=True)


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[DB]:
    kind = request.param
    if kind == "sqlite":
        handle = DB(kind, f"sqlite:///{tmp_path / 'jobs.db'}", "")
    else:
        _check(kind)
        handle = DB(kind, server_url(kind), f"t{uuid.uuid4().hex[:10]}_")
    yield handle
    for ex in handle.executors:
        ex.shutdown(wait=True, cancel_futures=True)
    if kind != "sqlite":
        store = Store(handle.url, handle.prefix, create=False)
        store.drop_schema()
        store.close()


@pytest.fixture
def store(db: DB) -> Iterator[Store]:
    """A store on the test's tables (made if missing), closed afterwards."""
    s = db.store()
    yield s
    s.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print how many tests passed, failed and skipped on each database."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if outcome == "passed" and getattr(report, "when", "call") != "call":
                continue
            found = _PARAM_RE.search(getattr(report, "nodeid", ""))
            if found:
                per_db = counts.setdefault(found.group(1), {})
                per_db[outcome] = per_db.get(outcome, 0) + 1
    if counts:
        terminalreporter.write_sep("-", "tests per database")
        for kind in ALL:
            if kind in counts:
                parts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts[kind].items()))
                terminalreporter.write_line(f"{kind}: {parts}")
