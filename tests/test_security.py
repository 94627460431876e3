"""Signed pickles (a tampered or unsigned payload never runs) and credentials that never show."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import traceback
import uuid

import pytest
from sqlalchemy import create_engine, text, update
from sqlalchemy.engine import make_url

import jobs
from clitools import cli, cli_env, read, start_worker, stop, wait_for_log
from dbexecutor import DatabaseUnavailable, DBExecutor, PayloadRejected
from dbexecutor.dialects import resolve
from dbexecutor.serialization import MAGIC

T = 60
SECRET = "correct horse battery staple"


def _set(db, job_id: int, **values) -> None:
    store = db.store()
    try:
        j = store.tables.jobs
        with store.engine.begin() as conn:
            conn.execute(update(j).where(j.c.id == job_id).values(**values))
    finally:
        store.close()


def _tamper_and_release(db, job_id: int, old: bytes, new: bytes) -> None:
    """Rewrite bytes inside the stored payload with SQL, then make the (delayed) job runnable."""
    payload = bytes(db.row(job_id).payload)
    assert payload.count(old) == 1
    _set(db, job_id, payload=payload.replace(old, new))
    _set(db, job_id, run_after=None)


@pytest.mark.parametrize("secret", [SECRET, None], ids=["signed", "control"])
def test_a_tampered_payload_never_runs(db, tmp_path, secret):
    a, b = str(tmp_path / "side-a.txt"), str(tmp_path / "side-b.txt")
    ex = db.executor(1, secret=secret)
    fut = ex.options(delay=3600).submit(jobs.record, a, "x")
    _tamper_and_release(db, fut.job_id, b"side-a.txt", b"side-b.txt")
    if secret is None:
        # Control: without a secret the altered payload runs as altered.
        assert fut.result(timeout=T) == "x"
        assert os.path.exists(b) and not os.path.exists(a)
        return
    with pytest.raises(PayloadRejected, match="signature that does not match"):
        fut.result(timeout=T)
    assert not os.path.exists(a) and not os.path.exists(b)
    row = db.row(fut.job_id)
    assert row.state == "failed" and row.error.startswith("PayloadRejected: the payload of job")
    (attempt,) = db.attempts(fut.job_id)
    assert attempt.outcome == "exception" and attempt.detail.startswith("PayloadRejected")
    shown = cli(db, "show", str(fut.job_id), env=cli_env(DBEXECUTOR_SECRET=SECRET))
    assert "signature: REJECTED" in shown.stdout


def test_an_unsigned_payload_is_refused_when_a_secret_is_set(db, tmp_path):
    side = str(tmp_path / "side.txt")
    unsigned = db.executor(1, run_jobs=False)
    fut = unsigned.submit(jobs.record, side, "x")
    assert not bytes(db.row(fut.job_id).payload).startswith(MAGIC)
    db.executor(1, secret=SECRET)  # runs it, and refuses
    with pytest.raises(PayloadRejected, match="not signed"):
        fut.result(timeout=T)
    assert not os.path.exists(side)
    assert db.row(fut.job_id).error.startswith("PayloadRejected")


def test_results_are_checked_and_bound_to_their_job(db, tmp_path):
    ex = db.executor(2, secret=SECRET)
    r1, r2 = ex.submit(jobs.identity, "alpha"), ex.submit(jobs.identity, "omega")
    assert ex.submit(jobs.add, r1, r2).result(timeout=T) == "alphaomega"  # signed all the way
    assert bytes(db.row(r1.job_id).payload).startswith(MAGIC) and bytes(db.row(r1.job_id).result).startswith(MAGIC)

    # r1's (validly signed) result copied into r2's row: bound to job r1, so refused for r2.
    _set(db, r2.job_id, result=bytes(db.row(r1.job_id).result))
    fresh = db.executor(1, secret=SECRET)
    with pytest.raises(PayloadRejected, match=f"result of job {r2.job_id}"):
        fresh.future(r2.job_id).result(timeout=T)

    # r1's result altered: a dependent submitted now fails before its function runs.
    side = str(tmp_path / "side.txt")
    _set(db, r1.job_id, result=bytes(db.row(r1.job_id).result).replace(b"alpha", b"alphx"))
    dep = ex.submit(jobs.record, side, r1)
    with pytest.raises(PayloadRejected):
        dep.result(timeout=T)
    assert not os.path.exists(side)
    assert db.row(dep.job_id).error.startswith(f"PayloadRejected: the result of job {r1.job_id}")


def test_a_worker_with_a_secret_from_the_environment(db, tmp_path):
    log = str(tmp_path / "w.log")
    w = start_worker(db, log, "--max-workers", "1", env=cli_env(DBEXECUTOR_SECRET=SECRET))
    try:
        wait_for_log(log, "payloads must be signed", w)
        signed = db.executor(1, run_jobs=False, secret=SECRET)
        assert signed.submit(jobs.add, 2, 3).result(timeout=T) == 5
        unsigned = db.executor(1, run_jobs=False)
        with pytest.raises(PayloadRejected):
            unsigned.submit(jobs.add, 2, 3).result(timeout=T)
        assert stop(w) == 0
    finally:
        if w.poll() is None:
            w.kill()
    assert SECRET not in read(log)


# -- credentials --------------------------------------------------------------------


def _user_with_password(db):
    """Create a login with a password on the test server; yield its URL; drop it afterwards."""
    name = f"dbx_{uuid.uuid4().hex[:8]}"
    password = f"Pw{uuid.uuid4().hex}"
    admin = create_engine(resolve(db.url).url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if db.kind == "postgresql":
            conn.execute(text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
            conn.execute(text(f"GRANT ALL ON SCHEMA public TO {name}"))
        else:
            conn.execute(text(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'"))
            conn.execute(text(f"GRANT ALL ON {make_url(db.url).database}.* TO '{name}'@'%'"))
    url = make_url(db.url).set(username=name, password=password).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            if db.kind == "postgresql":
                conn.execute(text(f"DROP OWNED BY {name}"))
                conn.execute(text(f"DROP ROLE {name}"))
            else:
                conn.execute(text(f"DROP USER '{name}'@'%'"))
        admin.dispose()

    return url, password, drop


@pytest.mark.databases("postgresql", "mariadb")
def test_a_password_never_shows(db, tmp_path):
    """The password is in the URL of every step; it must be in no output, log line, repr or error.

    On this machine PostgreSQL trusts 127.0.0.1, so there the password is not
    checked, but it is still in the URL that every component handles. MariaDB
    checks it (and a wrong one is refused, also without being shown).
    """
    url, password, drop = _user_with_password(db)
    user_db = type(db)(db.kind, url, db.prefix)
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # SQLAlchemy's engine and pool logs included
    seen: list[str] = []
    try:
        ex = DBExecutor(url, 1, prefix=db.prefix, poll_interval=0.05, lease_ttl=10.0)
        ok, bad = ex.submit(jobs.add, 1, 2), ex.submit(jobs.fail, "boom")
        assert ok.result(timeout=T) == 3
        with pytest.raises(jobs.CustomError):
            bad.result(timeout=T)
        seen += [repr(ex), repr(ex._store), repr(ok), repr(bad), str(ex._store.identity), repr(ex._store.url)]
        ex.shutdown()

        for args in (("status",), ("list",), ("show", str(bad.job_id)), ("status", "--json")):
            proc = cli(user_db, *args)
            assert proc.returncode == 0, proc.stderr
            seen += [proc.stdout, proc.stderr]
        log = str(tmp_path / "w.log")
        w = start_worker(user_db, log, "--max-workers", "1")
        wait_for_log(log, "serving", w)
        assert stop(w) == 0
        assert "***" in read(log)  # the worker names its database, masked
        seen.append(read(log))

        # Errors: a port where nothing listens, with the same password.
        dead = make_url(url).set(port=1).render_as_string(hide_password=False)
        with pytest.raises(DatabaseUnavailable) as info:
            DBExecutor(dead, 1, prefix=db.prefix)
        seen += [str(info.value), repr(info.value), "".join(traceback.format_exception(info.value))]
        proc = subprocess.run([sys.executable, "-m", "dbexecutor", "status", dead], capture_output=True, text=True,
                              env=cli_env(), timeout=T)
        assert proc.returncode == 3
        seen += [proc.stdout, proc.stderr]
        proc = subprocess.run([sys.executable, "-m", "dbexecutor", "list"], capture_output=True, text=True,
                              env=cli_env(DBEXECUTOR_URL=dead), timeout=T)
        assert proc.returncode == 3 and "***" in proc.stderr
        seen += [proc.stdout, proc.stderr]
        if db.kind == "mariadb":
            wrong = make_url(url).set(password=password[::-1]).render_as_string(hide_password=False)
            with pytest.raises(DatabaseUnavailable, match="Access denied") as info:
                DBExecutor(wrong, 1, prefix=db.prefix)
            shown = str(info.value) + "".join(traceback.format_exception(info.value))
            assert password[::-1] not in shown and "***" in shown
            seen.append(shown)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        drop()
    seen.append(captured.getvalue())
    assert captured.getvalue(), "nothing was logged: the check would be empty"
    leaks = [s for s in seen if password in s]
    assert not leaks, leaks[0][:2000]
