"""dbexecutor through PgBouncer in transaction pooling mode.

PgBouncer (1.18 here: no support for prepared statements) gives each
transaction whichever server connection is free, so nothing may rely on
session state: no statement prepared on the server (psycopg prepares after a
few runs), no ``SET`` at connect time, no ``LISTEN`` on a pooled connection.
Wake-ups need ``listen_url``, a direct URL for the LISTEN connection; without
it the executor polls.

The PgBouncer URL comes from ``DBEXECUTOR_TEST_PGBOUNCER_URL`` (default
``postgresql://postgres@127.0.0.1:6432/test``, which ``.ci/run`` starts with
``.ci/pgbouncer.ini``), the direct one from ``DBEXECUTOR_TEST_POSTGRESQL_URL``.
An unreachable PgBouncer skips these tests, except under ``CI=true``, where
it fails them. Each test has its own table prefix, dropped afterwards through
the direct URL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

import jobs
from clitools import read, start_worker, stop, wait_for_log
from conftest import FAST, IN_CI, SELECTED, _check, fan_in, server_url
from dbexecutor import DBExecutor, DependencyFailed
from dbexecutor.dialects import resolve
from dbexecutor.errors import ConfigurationError
from dbexecutor.store import Store

T = 60
PGBOUNCER_VAR = "DBEXECUTOR_TEST_PGBOUNCER_URL"
PGBOUNCER_DEFAULT = "postgresql://postgres@127.0.0.1:6432/test"
_unreachable: list[str | None] = []


def pgbouncer_url() -> str:
    return os.environ.get(PGBOUNCER_VAR) or PGBOUNCER_DEFAULT


def _connect(url: str, **kw: Any) -> psycopg.Connection[Any]:
    u = resolve(url).url
    return psycopg.connect(
        host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database, connect_timeout=5, **kw
    )


def _skip(msg: str) -> None:
    """Skip, or fail under ``CI=true``: there, .ci/run set PgBouncer up for every test here."""
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def _check_pgbouncer() -> None:
    if not _unreachable:
        try:
            with _connect(pgbouncer_url(), autocommit=True) as conn:
                conn.execute("SELECT 1")
            _unreachable.append(None)
        except Exception as error:  # noqa: BLE001 - any failure means "not usable here"
            _unreachable.append(f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
    if _unreachable[0] is not None:
        _skip(f"PgBouncer not reachable ({_unreachable[0]}); set {PGBOUNCER_VAR} to a PgBouncer in "
              "transaction pooling mode in front of the PostgreSQL test server to run these tests")


@dataclass
class Bouncer:
    """One test's tables, reached through PgBouncer (``url``) or directly (``direct``)."""

    url: str
    direct: str
    prefix: str
    executors: list[DBExecutor] = field(default_factory=list)

    def executor(self, max_workers: int = 2, **options: Any) -> DBExecutor:
        """A ``DBExecutor`` through PgBouncer on this test's tables, shut down after the test."""
        ex = DBExecutor(self.url, max_workers, prefix=self.prefix, **{**FAST, **options})
        self.executors.append(ex)
        return ex

    def store(self) -> Store:
        """A store on this test's tables, through PgBouncer (it creates them if missing)."""
        return Store(self.url, self.prefix)

    def states(self) -> dict[str, int]:
        store = Store(self.direct, self.prefix)
        try:
            return store.count_states()
        finally:
            store.close()


@pytest.fixture
def bouncer() -> Iterator[Bouncer]:
    if "postgresql" not in SELECTED:
        pytest.skip("PostgreSQL is not among DBEXECUTOR_TEST_DATABASES")
    _check("postgresql")
    _check_pgbouncer()
    handle = Bouncer(pgbouncer_url(), server_url("postgresql"), f"t{uuid.uuid4().hex[:10]}_")
    yield handle
    for ex in handle.executors:
        ex.shutdown(wait=True, cancel_futures=True)
    store = Store(handle.direct, handle.prefix, create=False)
    store.drop_schema()
    store.close()


# -- what transaction pooling breaks ------------------------------------------------------------


def test_many_clients_run_the_same_statements_through_few_server_connections(bouncer):
    """Nothing is prepared on the server: with PgBouncer 1.18 that fails as soon as clients share a connection.

    psycopg prepares a statement on the server at its sixth run (and at once
    for an executemany). In transaction pooling the next transaction of the
    same client may land on a server connection that never saw the statement
    ("prepared statement "_pg3_0" does not exist"), and another client on the
    same server connection prepares its own "_pg3_0" ("already exists").
    """
    # The tables and a few jobs, written directly: what follows is only the repeated reads.
    direct = DBExecutor(bouncer.direct, 1, prefix=bouncer.prefix, **FAST)
    bouncer.executors.append(direct)
    futs = [direct.submit(jobs.square, i) for i in range(5)]
    ids = [f.job_id for f in futs]
    stores = [Store(bouncer.url, bouncer.prefix) for _ in range(4)]
    errors: list[BaseException] = []
    try:

        def hammer(store: Store) -> None:
            try:
                for _ in range(30):
                    for job_id in ids:
                        assert store.job(job_id) is not None
                    assert len(store.finals(ids)) <= len(ids)
                    store.runnable_groups(time.time())
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        # One after another (clients take turns on the same server connection) ...
        for _ in range(3):
            for store in stores:
                for job_id in ids:
                    store.job(job_id)
                store.count_states()
        # ... and all at once (each transaction lands on whichever is free).
        threads = [threading.Thread(target=hammer, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(T)
        assert not errors, errors[0]
        assert [f.result(timeout=T) for f in futs] == [i * i for i in range(5)]
        ex = bouncer.executor(2)
        assert list(ex.map(jobs.square, range(50))) == [i * i for i in range(50)]
    finally:
        for s in stores:
            s.close()


_SETTINGS = "SELECT current_setting('jit'), current_setting('plan_cache_mode')"


def _admin(url: str) -> psycopg.Connection[Any] | None:
    """PgBouncer's admin console (the database "pgbouncer"), or None if this user may not use it."""
    u = resolve(url).url
    try:
        return psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname="pgbouncer",
                               autocommit=True, connect_timeout=5)
    except psycopg.Error:
        return None


def _server_settings(url: str, n: int = 5) -> list[Any]:
    """The settings seen on ``n`` server connections: each client holds its own while in a transaction.

    PgBouncer hands out the most recently used server connection first, so
    these are the ones the test's executor has just used.
    """
    clients = [_connect(url) for _ in range(n)]
    try:
        return [c.execute(_SETTINGS).fetchone() for c in clients]
    finally:
        for c in clients:
            c.rollback()
            c.close()


def test_no_session_settings_reach_other_clients(bouncer):
    """dbexecutor sets nothing on its connections: through PgBouncer a SET lands on a shared server connection.

    (PgBouncer does not reset a server connection between clients in
    transaction mode: ``server_reset_query`` is for session pooling.)
    """
    with _connect(bouncer.direct, autocommit=True) as conn:
        defaults = conn.execute(_SETTINGS).fetchone()
    admin = _admin(bouncer.url)
    if admin is not None:  # fresh server connections: none carries what another client set
        with admin:
            admin.execute(f"RECONNECT {resolve(bouncer.url).url.database}")
    if any(s != defaults for s in _server_settings(bouncer.url)):
        _skip("PgBouncer's server connections carry settings from other clients already "
              "(the test clears them with RECONNECT, which needs the admin console: admin_users)")
    ex = bouncer.executor(2)
    assert list(ex.map(jobs.square, range(20))) == [i * i for i in range(20)]
    seen = _server_settings(bouncer.url)
    assert all(s == defaults for s in seen), (defaults, seen)


def test_a_large_lookup_turns_jit_off_for_its_transaction_only(bouncer):
    """JIT stays the server's, except while the edges out of many finished jobs are read (SET LOCAL).

    On tables never analyzed that lookup's estimate passed jit_above_cost
    and the server compiled for 30-100 ms a statement of 1 ms. Through a
    pooler the setting must end with the transaction: the server
    connection goes to other clients next.
    """
    from dbexecutor.store import dag

    store = bouncer.store()
    try:
        ids = fan_in(store, 40)
        with store.engine.connect() as conn:
            default = conn.exec_driver_sql("SHOW jit").scalar()
            conn.rollback()
            if default == "off":
                _skip("the server (or this role) has JIT off already")
            with conn.begin():
                assert len(dag.dependents(store.ctx, conn, ids[:-1])) == len(ids) - 1
                assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
            with conn.begin():
                assert conn.exec_driver_sql("SHOW jit").scalar() == default
    finally:
        store.close()


# -- the executor through PgBouncer -------------------------------------------------------------


def test_submit_and_run(bouncer):
    ex = bouncer.executor(2)
    assert ex.submit(jobs.square, 7).result(timeout=T) == 49
    assert list(ex.map(jobs.square, range(300))) == [i * i for i in range(300)]
    with pytest.raises(jobs.CustomError, match="through the pooler"):
        ex.submit(jobs.fail, "through the pooler").result(timeout=T)
    keyed = ex.options(key="once").submit(jobs.add, 1, 2)
    assert ex.options(key="once").submit(jobs.add, 1, 2).job_id == keyed.job_id
    assert keyed.result(timeout=T) == 3
    assert bouncer.states() == {"done": 302, "failed": 1}


def test_dependencies(bouncer):
    ex = bouncer.executor(2)
    a = ex.submit(jobs.square, 3)
    b = ex.submit(jobs.add, a, 1)  # a future as an argument: its result is passed in
    c = ex.submit(jobs.sum_list, [a, b, ex.submit(jobs.square, 2)])
    d = ex.submit(jobs.identity, "after", after=[a, b, c])
    assert (a.result(timeout=T), b.result(timeout=T), c.result(timeout=T), d.result(timeout=T)) == (9, 10, 23, "after")
    bad = ex.submit(jobs.fail, "upstream")
    downstream = ex.submit(jobs.add, bad, 1)
    with pytest.raises(DependencyFailed):
        downstream.result(timeout=T)
    with ex.batch() as batch:
        batch.map(jobs.square, range(20))
    assert ex.submit(jobs.sum_list, batch).result(timeout=T) == sum(i * i for i in range(20))


def test_attach_resumes_unfinished_jobs(bouncer):
    first = bouncer.executor(2, run_jobs=False)
    futs = [first.options(key=f"k{i}").submit(jobs.square, i) for i in range(10)]
    tail = first.submit(jobs.sum_list, futs)
    first.flush()
    first.shutdown(wait=False)
    assert bouncer.states() == {"ready": 10, "waiting": 1}

    ex = DBExecutor.attach(bouncer.url, max_workers=2, prefix=bouncer.prefix, **FAST)
    bouncer.executors.append(ex)
    # Every unfinished job is listed; its workers may have finished some before the list was read.
    listed = {f.job_id for f in ex.futures()}
    ours = {f.job_id for f in futs} | {tail.job_id}
    assert listed <= ours and all(ex.future(j).done() for j in ours - listed), (listed, ours)
    assert ex.future(tail.job_id).result(timeout=T) == sum(i * i for i in range(10))
    assert ex.future(key="k3").result(timeout=T) == 9
    assert bouncer.states() == {"done": 11}


# -- cross-process pickup, wake-ups -------------------------------------------------------------


@pytest.mark.parametrize("listen", ["listen_url", "polling"])
def test_a_worker_in_another_process_runs_what_this_one_submits(bouncer, tmp_path, caplog, listen):
    """A submit-only executor here, a ``dbexecutor worker`` there, both through PgBouncer.

    With ``listen_url`` (a direct URL for LISTEN) both sides poll only every
    30 s: the worker can start the jobs, and the futures here resolve, only
    because the NOTIFY sent through PgBouncer by each writing transaction
    reached the other side's LISTEN. Without it both sides see that their
    URL goes through a pooler, do not LISTEN there, and poll.
    """
    caplog.set_level(logging.WARNING, logger="dbexecutor")
    log = str(tmp_path / "worker.log")
    if listen == "listen_url":
        args = ["--poll-interval", "30", "--listen-url", bouncer.direct]
        options: dict[str, Any] = {"poll_interval": 30.0, "listen_url": bouncer.direct}
    else:
        args, options = [], {}
    worker = start_worker(bouncer, log, "--max-workers", "2", *args)  # type: ignore[arg-type]
    try:
        wait_for_log(log, "serving", worker)
        ex = bouncer.executor(1, run_jobs=False, **options)
        ex.submit(jobs.identity, 0).result(timeout=T)  # the worker's children are up
        for _ in range(3):  # idle in between: each submit must wake the worker
            time.sleep(0.3)
            t0 = time.monotonic()
            fut = ex.submit(jobs.square, 12)
            assert fut.result(timeout=T) == 144
            assert time.monotonic() - t0 < 10.0
        a = ex.submit(jobs.square, 5)
        assert ex.submit(jobs.add, a, 1, after=[a]).result(timeout=T) == 26
        assert sorted(ex.map(jobs.square, range(100))) == [i * i for i in range(100)]
        assert stop(worker) == 0, read(log)[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    polling = [r.getMessage() for r in caplog.records if "polls" in r.getMessage()]
    if listen == "listen_url":
        assert not polling, polling
        assert "polls" not in read(log), read(log)[-3000:]
    else:
        assert polling and "pooler" in polling[0], [r.getMessage() for r in caplog.records]
        assert "polls" in read(log), read(log)[-3000:]
    assert bouncer.states() == {"done": 106}


def test_listen_url_is_for_postgresql_only(tmp_path):
    with pytest.raises(ConfigurationError, match="listen_url"):
        DBExecutor(f"sqlite:///{tmp_path / 'jobs.db'}", 1, listen_url="postgresql://postgres@127.0.0.1/test")
    with pytest.raises(ConfigurationError, match="listen_url"):
        DBExecutor(server_url("postgresql"), 1, listen_url="mysql://root@127.0.0.1/test")


# -- an outage --------------------------------------------------------------------------------


def test_jobs_finish_after_pgbouncer_drops_every_connection(bouncer):
    """PgBouncer's ``KILL`` drops every client and server connection and holds new ones until ``RESUME``.

    The scheduler's transactions fail on dead connections, are retried on new
    ones once PgBouncer takes them again, and every job ends exactly once.
    (The held connections go on after ``server_login_retry``, 15 s by
    default: .ci/pgbouncer.ini makes it 1 s.)
    """
    u = resolve(bouncer.url).url
    admin = _admin(bouncer.url)
    if admin is None:
        _skip(f"no PgBouncer admin console for user {u.username!r} (admin_users in .ci/pgbouncer.ini)")
    ex = bouncer.executor(2, lease_ttl=5.0, heartbeat_interval=0.5)
    killed = False
    try:
        futs = [ex.submit(jobs.sleep, 0.01, i) for i in range(300)]
        end = time.monotonic() + T
        while sum(f.done() for f in futs) < 20:
            assert time.monotonic() < end, "jobs did not start"
            time.sleep(0.01)
        assert sum(f.done() for f in futs) < 300, "every job ended before the outage; the test proved nothing"
        admin.execute(f"KILL {u.database}")
        killed = True
        time.sleep(2.0)
    finally:
        if killed:
            admin.execute(f"RESUME {u.database}")
        admin.close()
    later = [ex.submit(jobs.square, i) for i in range(10)]
    assert [f.result(timeout=T) for f in futs] == list(range(300))
    assert [f.result(timeout=T) for f in later] == [i * i for i in range(10)]
    store = Store(bouncer.direct, bouncer.prefix)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(select(store.tables.jobs.c.state)).scalars().all()
    finally:
        store.close()
    assert len(rows) == 310 and set(rows) == {"done"}
