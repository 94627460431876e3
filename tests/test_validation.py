"""Bad inputs: each gets a clear error, and nothing is written."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import traceback

import pytest
from sqlalchemy import inspect, update

import jobs
from dbexecutor import schema
from dbexecutor import (
    ConfigurationError,
    DatabaseUnavailable,
    DBExecutor,
    DBExecutorError,
    SchemaVersionError,
)
from dbexecutor.store import Store

T = 60
PICKLE_MESSAGE = re.compile(r"pickl|can't|cannot", re.IGNORECASE)


def _construct_must_fail(exc_type, *args, **kwargs):
    """``DBExecutor(*args, **kwargs)`` must raise ``exc_type``; shut it down if it did not."""
    try:
        ex = DBExecutor(*args, **kwargs)
    except exc_type as error:
        return error
    ex.shutdown(wait=True)
    pytest.fail(f"DBExecutor({args}, {kwargs}) did not raise {exc_type.__name__}")


# -- unpicklable submissions --------------------------------------------------------------------


def _assert_pickling_failure(db, fut) -> None:
    assert fut.done(), "an unpicklable submit must fail at once"
    error = fut.exception(timeout=0)
    assert isinstance(error, Exception)
    assert PICKLE_MESSAGE.search(str(error)), str(error)
    with pytest.raises(Exception):
        fut.result(timeout=0)
    assert db.counts() == {}, "an unpicklable job was stored"


def test_submit_lambda(db):
    ex = db.executor()
    _assert_pickling_failure(db, ex.submit(lambda: 1))


def test_submit_local_function(db):
    ex = db.executor()

    def local(x):
        return x

    _assert_pickling_failure(db, ex.submit(local, 1))


def test_submit_unpicklable_argument(db):
    ex = db.executor()
    _assert_pickling_failure(db, ex.submit(jobs.identity, threading.Lock()))
    _assert_pickling_failure(db, ex.submit(jobs.echo_kwargs, lock=threading.Lock()))
    # The executor still works afterwards.
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    assert db.counts() == {"done": 1}


def test_submit_not_callable(db):
    ex = db.executor()
    with pytest.raises(TypeError):
        ex.submit(42)
    assert db.counts() == {}


# -- executor options ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, -1])
def test_bad_max_workers(db, workers):
    _construct_must_fail(ValueError, db.url, workers, **db.options)
    assert db.counts() == {}


def test_bad_max_tasks_per_child(db):
    _construct_must_fail(ValueError, db.url, 1, max_tasks_per_child=0, **db.options)
    assert db.counts() == {}


# -- URLs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["not a url", "://nothing", ""])
def test_malformed_url(url):
    error = _construct_must_fail(ConfigurationError, url, 1)
    assert isinstance(error, ValueError) and isinstance(error, DBExecutorError)
    assert str(error)


def test_unsupported_scheme():
    error = _construct_must_fail(ConfigurationError, "oracle://x/y", 1)
    assert isinstance(error, ValueError)
    assert "oracle" in str(error)


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_in_memory_sqlite_is_refused(url):
    error = _construct_must_fail(ConfigurationError, url, 1)
    assert isinstance(error, ValueError)
    assert "file" in str(error)


@pytest.mark.parametrize(
    "url, label",
    [
        ("postgresql://postgres:s3cretpw@127.0.0.1:1/test", "postgresql"),
        ("mysql://root:s3cretpw@127.0.0.1:1/test", "mysql"),
    ],
)
def test_unreachable_server(url, label):
    error = _construct_must_fail(DatabaseUnavailable, url, 1)
    assert isinstance(error, ConnectionError) and isinstance(error, DBExecutorError)
    message = str(error)
    assert "127.0.0.1" in message, message
    assert re.search(r"(127\.0\.0\.1:|port )1\b", message), message
    assert "s3cretpw" not in message
    assert "s3cretpw" not in repr(error)
    assert "s3cretpw" not in "".join(traceback.format_exception(error))


@pytest.mark.parametrize(
    "module, url, extra",
    [
        ("pymysql", "mysql://root@127.0.0.1:1/test", "mysql"),
        ("psycopg", "postgresql://postgres@127.0.0.1:1/test", "postgresql"),
    ],
)
def test_missing_driver(module, url, extra):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules[{module!r}] = None
        from dbexecutor import ConfigurationError, DBExecutor
        try:
            DBExecutor({url!r}, 1)
        except ConfigurationError as error:
            print("CONFIGURATION", error)
        except BaseException as error:
            print("OTHER", type(error).__name__, error)
        else:
            print("NO ERROR")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("CONFIGURATION"), proc.stdout + proc.stderr
    assert f"pip install 'dbexecutor[{extra}]'" in proc.stdout, proc.stdout


# -- schema ---------------------------------------------------------------------------------------


def test_newer_schema_version_is_refused(db):
    ex = db.executor()
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    ex.shutdown(wait=True)
    store = db.store()
    meta = store.tables.meta
    try:
        with store.engine.begin() as conn:
            n = conn.execute(update(meta).where(meta.c.name == "schema_version").values(value="999")).rowcount
        assert n == 1
    finally:
        store.close()
    error = _construct_must_fail(SchemaVersionError, db.url, 1, **db.options)
    assert "999" in str(error)
    with pytest.raises(SchemaVersionError):
        Store(db.url, db.prefix).close()


def test_concurrent_creation_is_idempotent(db):
    n = 4
    barrier = threading.Barrier(n)
    made: list = []
    errors: list = []

    def create() -> None:
        try:
            barrier.wait(30)
            made.append(db.executor(1))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert len(made) == n
    futs = [ex.submit(jobs.add, i, 1) for i, ex in enumerate(made)]
    assert [f.result(timeout=T) for f in futs] == [1, 2, 3, 4]
    store = db.store()
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(store.tables.meta.select()).all()
        assert sorted((r.name, r.value) for r in rows) == [("schema_version", str(schema.SCHEMA_VERSION)), ("vtime", "0")]
    finally:
        store.close()


def test_table_prefix(db):
    prefix = f"{db.prefix}pfx_"
    ex = DBExecutor(db.url, 1, prefix=prefix, poll_interval=0.05)
    try:
        assert ex.submit(jobs.add, 2, 2).result(timeout=T) == 4
        ex.shutdown(wait=True)
        store = Store(db.url, prefix, create=False)
        try:
            names = set(inspect(store.engine).get_table_names())
            assert {f"{prefix}{t}" for t in ("jobs", "job_deps", "attempts", "meta")} <= names, names
            assert store.count_states() == {"done": 1}
        finally:
            store.close()
        # The test's own prefix holds nothing.
        assert db.counts() == {}
    finally:
        ex.shutdown(wait=True)
        s = Store(db.url, prefix, create=False)
        s.drop_schema()
        s.close()


@pytest.mark.parametrize("prefix", ["bad-prefix;", "1starts_with_digit", "x" * 31, "drop table;--"])
def test_invalid_prefix(db, prefix):
    error = _construct_must_fail(ValueError, db.url, 1, prefix=prefix, poll_interval=0.05)
    assert "prefix" in str(error)
    store = db.store()
    try:
        names = inspect(store.engine).get_table_names()
    finally:
        store.close()
    assert not [n for n in names if n.startswith(prefix[:3]) and not n.startswith(db.prefix or "\0")], names
