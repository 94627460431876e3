"""Checked by mypy (tests/test_typing.py), never run: what the public API's types promise.

Each ``assert_type`` fails the type check if the inferred type differs, and
each ``# type: ignore[...]`` line is a call that must be refused (with
``warn_unused_ignores``, a call that type-checks makes its ignore an error).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from typing_extensions import assert_type

from dbexecutor import Batch, DBExecutor, JobFuture


def load(path: str, *, retries: int = 0) -> bytes:
    return path.encode()


def count(data: bytes) -> int:
    return len(data)


def promises(ex: DBExecutor) -> None:
    raw = ex.submit(load, "a.csv")
    assert_type(raw, JobFuture[bytes])
    assert_type(raw.result(), bytes)
    assert_type(ex.submit(load, "a.csv", retries=2).result(timeout=1), bytes)
    # The arguments are checked against fn's parameters, as for ProcessPoolExecutor: a
    # future in place of its result is refused, unless the call names after= (then
    # nothing is checked but the result type).
    ex.submit(count, raw)  # type: ignore[call-overload]
    assert_type(ex.submit(count, raw, after=[raw]), JobFuture[int])
    assert_type(ex.submit(count, b"x", after=[raw]), JobFuture[int])
    assert_type(ex.options(timeout="30m", retry_delay=2).submit(load, "b.csv"), JobFuture[bytes])
    assert_type(ex.map(count, [b"a", b"bc"]), Iterator[int])
    assert_type(ex.map(count, [b"a"], chunksize=2, buffersize=4), Iterator[int])
    assert_type(ex.options(group="io").map(count, [b"a"]), Iterator[int])
    with ex.batch() as batch:
        assert_type(batch, Batch)
        assert_type(batch.submit(load, "c.csv"), JobFuture[bytes])
        assert_type(batch.map(count, [b"a"]), list[JobFuture[int]])
    assert_type(batch.result(), list[Any])
    ex.submit(load, 42)  # type: ignore[call-overload]
    ex.submit(load, "a.csv", retries="2")  # type: ignore[arg-type]
    ex.submit(load)  # type: ignore[call-overload]
    batch.submit(load, 42)  # type: ignore[call-overload]
    ex.options(priority=1).submit(load, 42)  # type: ignore[call-overload]
