"""Claim cost against a loaded table, with the SQL that loads it (benchmark code, not library code).

The rows are written set-based, one ``INSERT ... SELECT`` per chunk from a
generated series: ``generate_series`` on PostgreSQL, a cross join of a ten-row
digits table on SQLite and MySQL/MariaDB. Every measured claim runs against the
same table: the claimed rows are put back to ``ready`` (untimed) before the next.
"""

from __future__ import annotations

import pickle
import statistics
import time
import warnings
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    Connection,
    FromClause,
    LargeBinary,
    delete,
    func,
    insert,
    literal,
    literal_column,
    select,
    union_all,
    update,
)

from sqlalchemy.exc import SAWarning

from dbexecutor.store import Store

_CHUNK = 250_000  # rows per INSERT ... SELECT (one transaction each)
_PAYLOAD = pickle.dumps(None)


def _series(conn: Connection, n: int) -> FromClause:
    """A FROM clause with exactly ``n`` rows."""
    if conn.dialect.name == "postgresql":
        return func.generate_series(1, n).alias("s")
    digits = union_all(*[select(literal_column(str(d)).label("d")) for d in range(10)])
    width = max(1, len(str(n - 1)))
    aliases = [digits.subquery(f"d{k}") for k in range(width)]
    joined: Any = aliases[0]
    for a in aliases[1:]:
        joined = joined.join(a, aliases[0].c.d + a.c.d >= 0)  # always true: the cross join is the point
    number = sum((a.c.d * 10**k for k, a in enumerate(aliases)), literal_column("0"))
    return select(aliases[0].c.d).select_from(joined).where(number < n).subquery("s")


def fill(store: Store, state: str, n: int, now: float) -> float:
    """Insert ``n`` rows in ``state`` (done rows carry a result, waiting rows an open dependency); seconds taken."""
    j = store.tables.jobs
    final = state in ("done", "failed", "cancelled")
    columns = {
        "state": literal_column(f"'{state}'"),
        "fn_name": literal_column("'benchmarks.jobs.noop'"),
        "payload": literal(_PAYLOAD, LargeBinary()),
        "result": literal(_PAYLOAD, LargeBinary()) if final else literal_column("NULL"),
        "group_key": literal_column("'default'"),
        "priority": literal_column("0"),
        "retries": literal_column("0"),
        "attempt": literal_column("1" if final else "0"),
        "open_deps": literal_column("0" if final or state != "waiting" else "1"),
        "created_at": literal(now - 3600.0),
        "finished_at": literal(now - 60.0) if final else literal_column("NULL"),
    }
    start = time.perf_counter()
    left = n
    while left > 0:
        size = min(left, _CHUNK)
        with store.engine.begin() as conn, warnings.catch_warnings():
            # SQLAlchemy's FROM linter calls the digits cross join a cartesian product; it is one, on purpose.
            warnings.filterwarnings("ignore", message="SELECT statement has a cartesian product", category=SAWarning)
            source = select(*[c.label(name) for name, c in columns.items()]).select_from(_series(conn, size))
            conn.execute(insert(j).from_select(list(columns), source))
        left -= size
    return time.perf_counter() - start


def analyze(store: Store) -> None:
    """Fresh planner statistics (and a vacuum on PostgreSQL), as autovacuum would give a long-lived table."""
    name = store.tables.jobs.name
    kind = store.engine.dialect.name
    with store.engine.connect() as conn:
        if kind == "postgresql":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"VACUUM ANALYZE {name}")
            # A fill writes hundreds of MB of WAL in seconds, which sets off a
            # checkpoint that would run during the timed claims: a bulk-load
            # artifact, not claim cost. Superusers only; others measure with it.
            if conn.exec_driver_sql("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").scalar():
                conn.exec_driver_sql("CHECKPOINT")
        elif kind == "sqlite":
            conn.exec_driver_sql(f"ANALYZE {name}")
            conn.commit()
        else:
            conn.exec_driver_sql(f"ANALYZE TABLE {name}").all()
            conn.commit()


def count(store: Store) -> dict[str, int]:
    return store.count_states()


def reset_ready(store: Store, n: int, now: float) -> None:
    """Replace the ready rows by ``n`` fresh ones (the newest ids, as in a queue whose old work is done)."""
    j = store.tables.jobs
    with store.engine.begin() as conn:
        conn.execute(delete(j).where(j.c.state.in_(["ready", "leased"])))
    fill(store, "ready", n, now)


def measure(store: Store, claims: int, limit: int, warmup: int = 5) -> list[float]:
    """Seconds per ``Store.claim`` of ``limit`` jobs; the claimed rows go back to ready after each (untimed)."""
    j = store.tables.jobs
    back = update(j).values(state="ready", lease_owner=None, lease_expires=None, started_at=None)
    out: list[float] = []
    for k in range(warmup + claims):
        now = time.time()
        t0 = time.perf_counter()
        got = store.claim("bench:claim", limit, 30.0, now)
        dt = time.perf_counter() - t0
        if len(got) != limit:
            raise RuntimeError(f"claimed {len(got)} jobs, expected {limit}")
        with store.engine.begin() as conn:
            conn.execute(back.where(j.c.id.in_([c.job_id for c in got])))
        if k >= warmup:
            out.append(dt)
    return out


def interleaved(
    loaded: Store, reference: Store, claims: int, limit: int, blocks: int = 10
) -> tuple[list[list[float]], list[list[float]]]:
    """Claim times on ``loaded`` and on ``reference``, per block, measured in alternating blocks.

    The two stores' claims take turns, ``claims / blocks`` at a time, so that
    whatever the machine does meanwhile (other processes, a checkpoint, CPU
    clocks) weighs on both samples alike: the ratio of their medians is the
    table's own effect, not the drift between two measurements minutes apart.
    """
    per = max(1, claims // blocks)
    a: list[list[float]] = []
    b: list[list[float]] = []
    for k in range(blocks):
        warm = 5 if k == 0 else 1
        a.append(measure(loaded, per, limit, warmup=warm))
        b.append(measure(reference, per, limit, warmup=warm))
    return a, b


def quantiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50": statistics.median(s),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "mean": statistics.fmean(s),
        "min": s[0],
        "max": s[-1],
    }


def stages(finished: list[int], waiting: int) -> Iterator[tuple[str, int, int]]:
    """(label, finished rows, waiting rows) in fill order: the empty table first."""
    yield "empty", 0, 0
    for f in finished:
        yield f"{waiting:,} waiting + {f:,} done", f, waiting
