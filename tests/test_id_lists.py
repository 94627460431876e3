"""Lists of job ids in statements: the right rows for any length of list.

On SQLite and PostgreSQL a list of ids is one parameter (a JSON text, an
array), so the statement's text is the same for every length: the driver's
cache of prepared statements then holds one entry, not one per length (on
SQLite that cache grew the parent's memory by megabytes).
"""

from __future__ import annotations

from sqlalchemy import event

import jobs


def test_finals_and_results_take_id_lists_of_any_length(db, tmp_path):
    ex = db.executor()
    futures = [ex.submit(jobs.square, i) for i in range(300)]
    assert [f.result(timeout=60) for f in futures] == [i * i for i in range(300)]
    done = [f.job_id for f in futures]
    gate = str(tmp_path / "gate")
    held = ex.submit(jobs.wait_for_file, gate)  # running, not final, until the end
    running = held.job_id
    unknown = max(done + [running]) + 1000
    stored = {int(r.id): r.result for r in db.jobs()}
    store = db.store()
    texts: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            texts.append(statement)

    try:
        seen: dict[str, set[str]] = {"finals": set(), "results": set()}
        for n in (0, 1, 2, 17, 300):
            asked = done[:n] + [running, unknown]
            texts.clear()
            finals = store.finals(asked)
            seen["finals"].update(texts)
            assert sorted(f.job_id for f in finals) == done[:n]
            assert all(f.state == "done" for f in finals)
            texts.clear()
            results = store.results(asked)
            seen["results"].update(texts)
            assert results == {i: stored[i] for i in done[:n]}
    finally:
        store.close()
        open(gate, "w").close()
    assert held.result(timeout=30) is None
    if db.kind in ("sqlite", "postgresql"):
        assert len(seen["finals"]) == 1, seen["finals"]
        assert len(seen["results"]) == 1, seen["results"]
