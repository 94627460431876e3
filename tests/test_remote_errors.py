"""A job's exception that the parent cannot rebuild still says what it was: RemoteError.

The classic case is a custom exception whose ``__init__`` takes extra required
arguments: it pickles in the child but cannot be unpickled anywhere. Its type
name, message and the child's traceback must reach the caller, on every
database, signed or not; blobs stored by 0.1.0 must still load.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

import jobs
import more_jobs
from dbexecutor import DependencyFailed, PayloadRejected, RemoteError, serialization
from dbexecutor.cli import stored_traceback
from dbexecutor.serialization import RemoteTraceback

T = 60
NAME = "more_jobs.NeedsCode"


def _assert_remote(error: BaseException | None, message: str = "disk full") -> RemoteError:
    assert isinstance(error, RemoteError), repr(error)
    assert error.type_name == NAME
    assert error.message == message
    assert str(error) == f"{NAME}: {message}"
    assert error.reason and "code" in error.reason, error.reason  # the TypeError from __init__
    cause = error.__cause__
    assert isinstance(cause, RemoteTraceback), repr(cause)
    assert "in raise_needs_code" in str(cause) and f"NeedsCode: {message}" in str(cause)
    return error


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_an_exception_that_cannot_be_rebuilt_keeps_type_message_and_traceback(db, secret):
    ex = db.executor(secret=secret)
    fut = ex.submit(more_jobs.raise_needs_code, "disk full", 28)
    with pytest.raises(RemoteError) as info:
        fut.result(timeout=T)
    _assert_remote(info.value)
    _assert_remote(fut.exception(timeout=0))
    # The row's readable error and the command line's traceback are unchanged.
    row = db.row(fut.job_id)
    assert row.state == "failed" and row.error == "NeedsCode: disk full"
    assert "NeedsCode: disk full" in (stored_traceback(row.result) or "")
    # A dependent fails with DependencyFailed, caused by the same account of the upstream error.
    below = ex.submit(jobs.identity, fut)
    with pytest.raises(DependencyFailed) as dep:
        below.result(timeout=T)
    assert f"{NAME}: disk full" in str(dep.value)
    _assert_remote(dep.value.__cause__)
    # A future made later from the row (attach) reads the same thing.
    del fut, info
    _assert_remote(ex.future(row.id).exception(timeout=T))


def test_the_stored_name_and_message_are_signed(db):
    ex = db.executor(secret="s3cret")
    fut = ex.submit(more_jobs.raise_needs_code, "disk full", 28)
    _assert_remote(fut.exception(timeout=T))
    job_id = fut.job_id
    del fut
    blob = bytes(db.row(job_id).result)
    assert blob.count(b"disk full") >= 1
    _write_error(db, job_id, blob.replace(b"disk full", b"disk fine"))
    rejected = ex.future(job_id).exception(timeout=T)
    assert isinstance(rejected, PayloadRejected), repr(rejected)


# -- blobs written by 0.1.0 -------------------------------------------------------------------


class _Box010:
    """Pickles exactly as 0.1.0's ``_ExceptionBox`` did: ``_rebuild_exception(exc, cause)``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.cause = _Box010(exc.__cause__) if exc.__cause__ is not None else None

    def __reduce__(self) -> Any:
        return (serialization._rebuild_exception, (self.exc, self.cause))


def _blob_010(exc: BaseException, signer: serialization.Signer = serialization.UNSIGNED) -> bytes:
    try:
        raise exc
    except BaseException as raised:
        raised.__cause__ = RemoteTraceback(serialization.format_remote_traceback(raised))
        return signer.sign(serialization.dumps(_Box010(raised)), serialization.ERROR_CONTEXT)


def _write_error(db: Any, job_id: int, blob: bytes) -> None:
    store = db.store()
    try:
        jobs_table = store.tables.jobs
        with store.engine.begin() as conn:
            conn.execute(update(jobs_table).where(jobs_table.c.id == job_id).values(result=blob))
    finally:
        store.close()


def test_blobs_of_the_old_format_still_load(db):
    ex = db.executor()
    failed = ex.submit(jobs.fail, "placeholder")
    assert isinstance(failed.exception(timeout=T), jobs.CustomError)
    job_id = failed.job_id
    del failed

    # An old blob whose exception can be rebuilt: itself, with the remote traceback.
    _write_error(db, job_id, _blob_010(jobs.CustomError("from 0.1.0")))
    error = ex.future(job_id).exception(timeout=T)
    assert type(error) is jobs.CustomError and str(error) == "from 0.1.0"
    assert isinstance(error.__cause__, RemoteTraceback)

    # One whose exception cannot: the type and message its traceback names.
    _write_error(db, job_id, _blob_010(more_jobs.NeedsCode("old\nand multi-line", 5)))
    error = ex.future(job_id).exception(timeout=T)
    assert isinstance(error, RemoteError), repr(error)
    assert error.type_name == "more_jobs.NeedsCode" and error.message == "old\nand multi-line"
    assert isinstance(error.__cause__, RemoteTraceback) and "NeedsCode: old" in str(error.__cause__)


def test_loading_without_a_database():
    # Unit level: the cases a row cannot easily hold.
    signer = serialization.Signer("k")
    new = serialization.dump_exception(more_jobs.NeedsCode("x", 1), remote_tb="tb", signer=signer)
    error = serialization.load_exception(new, signer)
    assert isinstance(error, RemoteError) and (error.type_name, error.message) == (NAME, "x")
    assert isinstance(error.__cause__, RemoteTraceback) and str(error.__cause__) == "tb"
    # A RemoteError pickles again, with its attributes (a dependent's cause, a re-raise in a child).
    again = serialization.load_exception(serialization.dump_exception(error))
    assert isinstance(again, RemoteError) and (again.type_name, again.message, again.reason) == (
        error.type_name, error.message, error.reason,
    )
    # Old blob without any traceback, and garbage: still an error that says what happened.
    bare = serialization.dumps(_Box010(more_jobs.NeedsCode("y", 2)))
    for blob in (bare, b"\x80\x05garbage"):
        found = serialization.load_exception(blob)
        assert isinstance(found, RemoteError) and "could not be unpickled" in str(found)
    # A broken __str__ does not lose the exception.
    broken = serialization.load_exception(serialization.dump_exception(_BadStr("z", 3)))
    assert isinstance(broken, RemoteError) and "str() failed" in broken.message
    assert serialization.exception_summary(_BadStr("z", 3)) == "_BadStr: <str() failed: RuntimeError: no>"


class _BadStr(more_jobs.NeedsCode):
    def __str__(self) -> str:
        raise RuntimeError("no")
