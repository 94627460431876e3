"""A burst of submits that name stored futures is written with a few statements.

The upstream rows of every job in the burst are locked by one statement, the
jobs go in as one multi-row insert and their edges as one more, whatever the
number of jobs; each new row's state still follows its own upstream rows
(done, failed, cancelled or still running) exactly as a lone submit's would.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

import jobs
from dbexecutor import DependencyFailed
from dbexecutor.store import submit

T = 60


@pytest.fixture
def insert_statements(monkeypatch: Any) -> Iterator[list[tuple[int, int]]]:
    """(jobs, statements) of every insert of queued submits (the store's ``submit.insert_many``) once armed."""
    real = submit.insert_many
    inside = threading.local()
    calls: list[tuple[int, int]] = []

    # Every engine of this process: the only one inserting jobs is the executor's.
    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if getattr(inside, "n", None) is not None:
            inside.n += 1

    def counted(ctx: Any, conn: Any, new: Any, now: Any, *args: Any, **kwargs: Any) -> Any:
        inside.n = 0
        try:
            return real(ctx, conn, new, now, *args, **kwargs)
        finally:
            calls.append((len(new), inside.n))
            inside.n = None

    monkeypatch.setattr(submit, "insert_many", counted)
    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield calls
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def test_a_burst_of_dependent_submits_costs_a_few_statements(db, tmp_path, insert_statements):
    ex = db.executor(2)
    gate = str(tmp_path / "gate")
    done = ex.submit(jobs.identity, 5)
    failed = ex.submit(jobs.fail, "upstream")
    running = ex.submit(jobs.wait_for_file, gate, 7)
    cancelled = ex.submit(jobs.identity, 0, after=[running])
    assert done.result(timeout=T) == 5
    assert isinstance(failed.exception(timeout=T), jobs.CustomError)
    assert cancelled.cancel()
    for f in (done, failed, running, cancelled):
        assert f.job_id is not None  # stored: the burst below only names stored jobs
    calls = insert_statements
    calls.clear()  # the upstream jobs' own inserts above do not count
    try:
        burst = []
        for i in range(60):
            burst += [
                ex.submit(jobs.add, done, i),
                ex.submit(jobs.add, failed, i),
                ex.submit(jobs.identity, i, after=[cancelled]),
                ex.submit(jobs.add, running, i),
                ex.submit(jobs.add, done, running),
                ex.submit(jobs.identity, i, after=[done, failed, running]),
            ]
        ex.flush()
        # Before the gate opens: each row got the state its upstream rows gave it.
        states = db.states(burst)
        expected = ["ready|leased|running|done", "failed", "cancelled", "waiting", "waiting", "failed"] * 60
        for fut, allowed in zip(burst, expected):
            assert states[fut.job_id] in allowed.split("|"), (fut, states[fut.job_id], allowed)
        rows = {r.id: r for r in db.jobs()}
        assert [rows[f.job_id].open_deps for f in burst[3:5]] == [1, 1]
    finally:
        open(gate, "w").close()
    assert sum(n for n, _ in calls) == len(burst)
    # Lock, jobs, edges (plus an id reservation on PostgreSQL and an
    # occasional group lookup): never one statement per job.
    assert all(s <= 5 for n, s in calls), calls
    assert running.result(timeout=T) == 7
    for i in range(60):
        add_done, add_failed, after_cancelled, add_running, both, three = burst[6 * i : 6 * i + 6]
        assert add_done.result(timeout=T) == 5 + i
        with pytest.raises(DependencyFailed) as info:
            add_failed.result(timeout=T)
        assert info.value.upstream_job_id == failed.job_id
        assert isinstance(info.value.__cause__, jobs.CustomError)
        with pytest.raises(cf.CancelledError):
            after_cancelled.result(timeout=T)
        assert add_running.result(timeout=T) == 7 + i
        assert both.result(timeout=T) == 12
        assert isinstance(three.exception(timeout=T), DependencyFailed)
    ran = {r.job_id for r in db.attempts()}
    assert not {f.job_id for f in burst[1::6] + burst[2::6] + burst[5::6]} & ran
