"""The program's functions stored once in the ``functions`` table and named by digest in payloads.

The functions are built with ``exec`` in a namespace named ``__main__`` (a
script's top level), as in ``test_by_value``: they can only travel by value.
"""

from __future__ import annotations

import hashlib
import textwrap
import time
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from dbexecutor import blobs, byvalue, serialization
from dbexecutor.errors import CannotRunHere
from dbexecutor.store import functions as stored

T = 60


def _program(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the test's own source
    return namespace


def _function_rows(db: Any) -> list[Any]:
    return db._select(lambda t: select(t.functions).order_by(t.functions.c.digest))


def test_a_function_used_again_is_stored_once_and_each_later_payload_names_it(db):
    ns = _program("""
        def job(x):
            return x * 3
    """)
    ex = db.executor(2)
    futures = [ex.submit(ns["job"], i) for i in range(6)]
    assert [f.result(timeout=T) for f in futures] == [0, 3, 6, 9, 12, 15]
    pickled = byvalue.embedded(ns["job"])
    assert pickled is not None
    digest = hashlib.sha256(pickled.data).hexdigest()
    (row,) = _function_rows(db)
    assert row.digest == digest and bytes(row.data) == pickled.data
    payloads = [bytes(r.payload) for r in db.jobs()]
    # The first payload took the pickle (a function pickled for one call stays in its payload);
    # every later one names it, in a tenth of the size or less.
    assert pickled.data in payloads[0] and byvalue.stored_in(payloads[0]) == []
    for p in payloads[1:]:
        assert pickled.data not in p and byvalue.stored_in(p) == [digest]
        assert len(p) < len(payloads[0]) // 4
    assert blobs.pickle_summary(payloads[1])["globals"] == ["dbexecutor.byvalue.load_stored"]


def test_another_executor_reads_the_pickle_and_each_new_child_is_sent_it(db):
    ns = _program("""
        import os
        def job(x):
            return x + 1, os.getpid()
    """)
    submitter = db.executor(1, run_jobs=False)
    futures = [submitter.submit(ns["job"], i) for i in range(5)]
    [f.job_id for f in futures]  # noqa: B018 - every row written before a runner starts
    # Another executor (its own store: nothing cached) whose children run one job each.
    runner = db.executor(1, max_tasks_per_child=1)
    results = [f.result(timeout=T) for f in futures]
    assert [r[0] for r in results] == [1, 2, 3, 4, 5]
    assert len({r[1] for r in results}) == 5, "a new child for every job"
    assert runner._store.functions.cached(hashlib.sha256(byvalue.embedded(ns["job"]).data).hexdigest())
    assert {r.state for r in db.jobs()} == {"done"}


@pytest.mark.parametrize("damage", ["deleted", "altered"])
def test_a_job_whose_stored_pickle_is_missing_or_altered_is_put_back_not_run(db, damage):
    ns = _program("""
        def job(x):
            return -x
    """)
    submitter = db.executor(1, run_jobs=False)
    first, second = submitter.submit(ns["job"], 1), submitter.submit(ns["job"], 2)
    [f.job_id for f in (first, second)]  # noqa: B018
    pickled = byvalue.embedded(ns["job"])
    assert pickled is not None
    store = db.store()
    try:
        f = store.tables.functions
        with store.engine.begin() as conn:
            if damage == "deleted":
                conn.execute(delete(f))
            else:
                conn.execute(update(f).values(data=pickled.data + b"."))
    finally:
        store.close()
    db.executor(1)
    assert first.result(timeout=T) == -1  # its payload holds the pickle itself
    deadline = time.monotonic() + T
    while not [a for a in db.attempts(second.job_id) if a.outcome == "refused"]:
        assert time.monotonic() < deadline, db.attempts(second.job_id)
        time.sleep(0.05)
    (refused,) = [a for a in db.attempts(second.job_id) if a.outcome == "refused"]
    assert "functions table" in refused.detail
    assert db.row(second.job_id).state in ("ready", "leased")  # put back for an executor that has it
    assert not second.done()
    # Stored again as it should be: another executor runs it.
    store = db.store()
    try:
        with store.engine.begin() as conn:
            conn.execute(delete(store.tables.functions))
        store.transaction(lambda conn: stored.save(store.ctx, conn, pickled.stored.digest, pickled.data, store.now()))
    finally:
        store.close()
    db.executor(1)
    assert second.result(timeout=T) == -2


def test_retention_deletes_only_the_pickles_no_job_left_can_name(db):
    store = db.store()
    try:
        now = store.now()
        keep, renew = stored.KEEP_FOR, stored.RENEW_AFTER

        def save(name: str, used: float) -> str:
            digest = hashlib.sha256(name.encode()).hexdigest()
            store.transaction(lambda conn: stored.save(store.ctx, conn, digest, name.encode(), used))
            return digest

        def left() -> set[str]:
            with store.engine.connect() as conn:
                return set(conn.execute(select(store.tables.functions.c.digest)).scalars())

        # No job in the table: a pickle named within the margin stays.
        recent = save("recent", now - keep / 2)
        save("stale", now - keep - 60)
        assert store.sweep_functions() == 1
        assert left() == {recent}
        # The oldest job left was submitted long ago: a pickle it may name (renewed at most
        # RENEW_AFTER before its submit) stays; one renewed long before it goes.
        created = now - 10 * keep
        with store.engine.begin() as conn:
            conn.execute(store.tables.jobs.insert().values(state="done", fn_name="f", payload=b"x", created_at=created))
        named, older = save("named", created - renew), save("older", created - keep - 60)
        save("stale again", now - keep - 60)  # kept too: older than now's bound, not than the oldest job's
        assert store.sweep_functions() == 1
        assert left() == {recent, named, hashlib.sha256(b"stale again").hexdigest()}
        assert older not in left()
    finally:
        store.close()


def test_a_process_renews_a_pickle_it_names_once_its_last_renewal_is_old(db):
    store = db.store()
    try:
        ns = _program("""
            def job():
                return 1
        """)
        made = byvalue.embedded(ns["job"])
        assert made is not None and not made.reused
        table = store.functions
        assert table.reference(made) is None, "a pickle taken by one payload stays in it"
        assert _function_rows(db) == []
        made = byvalue.embedded(ns["job"])
        ref = table.reference(made)
        assert ref is not None and ref.digest == hashlib.sha256(made.data).hexdigest()
        (row,) = _function_rows(db)
        f = store.tables.functions
        with store.engine.begin() as conn:
            conn.execute(update(f).values(used_at=row.used_at - 10 * stored.RENEW_AFTER))
        assert table.reference(made) is ref and _function_rows(db)[0].used_at < row.used_at  # renewed recently
        table._renewed[ref.digest] -= stored.RENEW_AFTER + 1
        assert table.reference(made) is ref
        assert _function_rows(db)[0].used_at >= row.used_at
    finally:
        store.close()


def test_a_submit_in_the_callers_transaction_keeps_the_pickle_in_its_payload(db):
    ns = _program("""
        def job(x):
            return x
    """)
    ex = db.executor(1)
    store = db.store()
    try:
        payloads = []
        for i in range(3):
            with store.engine.begin() as conn:
                fut = ex.options(connection=conn).submit(ns["job"], i)
            payloads.append(fut)
        assert [f.result(timeout=T) for f in payloads] == [0, 1, 2]
    finally:
        store.close()
    assert _function_rows(db) == []
    assert all(byvalue.stored_in(bytes(r.payload)) == [] for r in db.jobs())


# -- without a database -------------------------------------------------------------------------


def test_names_are_found_in_a_payload_and_loaded_from_what_the_child_was_sent():
    ns = _program("""
        def job(x, f):
            return f(x)
        def square(x):
            return x * x
    """)
    for fn in ("job", "square"):
        byvalue.embedded(ns[fn])
    refs: dict[str, Any] = {}

    def reference(made: byvalue.FunctionByValue) -> byvalue.StoredFunction | None:
        refs[made.stored.digest] = made.data
        return made.stored

    payload = serialization.dump_payload(ns["job"], (7, ns["square"]), {}, reference=reference)
    assert byvalue.stored_in(payload) == list(refs) and len(refs) == 2
    assert byvalue.stored_in(payload[: payload.index(b"dbexecutor.fn:") + 20]) == []  # cut short: no name
    byvalue._registry.clear()
    with pytest.raises(CannotRunHere, match="functions table"):
        serialization.load_payload(payload)
    byvalue.register(refs.items())
    fn, args, kwargs = serialization.load_payload(payload)
    assert fn(*args, **kwargs) == 49
