"""The claim reads ready rows through the ready index, not by scanning the jobs table."""

from __future__ import annotations

import time

from sqlalchemy import insert, text

from dbexecutor import schema


def test_claim_uses_the_ready_index(db):
    store = db.store()
    j = store.tables.jobs
    now = time.time()
    # Many finished and waiting rows, a few ready ones: a plan that scans the
    # table would show up here, and statistics make the planner choose for real.
    rows = [
        {"state": state, "fn_name": "f", "payload": b"x", "created_at": now}
        for state, n in ((schema.DONE, 3000), (schema.WAITING, 1000), (schema.READY, 20))
        for _ in range(n)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(j), rows)
    with store.engine.connect() as conn:
        conn.execute(text({"sqlite": "ANALYZE", "postgresql": f"ANALYZE {j.name}"}.get(db.kind, f"ANALYZE TABLE {j.name}")))
        conn.commit()
    plan = "\n".join(store.explain_claim())
    index = f"{db.prefix}ix_jobs_ready"
    assert index in plan, plan
    if db.kind == "sqlite":
        assert "USING INDEX" in plan and "TEMP B-TREE" not in plan, plan
    elif db.kind == "postgresql":
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
    else:
        assert " | ALL | " not in plan and "filesort" not in plan, plan
    claimed = store.claim("plan-test", 5, 30.0, time.time())
    assert len(claimed) == 5
    store.close()
