"""What PgBouncer-safe PostgreSQL connections cost: the settings before PgBouncer support against the alternatives.

``python -m benchmarks.pg_session_state [--rounds 5] [--pgbouncer URL]``

Variants (applied to this process's engine only: the jobs here are trivial and
never touch the database from a child):

- ``auto``: prepared after five runs, JIT off, and the server's default plan
  cache mode (a generic plan once it looks no worse than the custom ones);
- ``prepare`` (dbexecutor before it supported PgBouncer): psycopg's default
  ``prepare_threshold`` (5: a statement is prepared on the server at its
  sixth run), and ``SET jit = off; SET plan_cache_mode = force_custom_plan``
  once per connection;
- ``noprep+set``: ``prepare_threshold=None`` (never prepare), ``SET jit = off``
  once per connection (session state: not for a transaction pooler);
- ``noprep`` (dbexecutor since PgBouncer support): ``prepare_threshold=None``
  and no session state at all (a transaction that reads the edges out of
  many finished jobs turns JIT off with ``SET LOCAL``);
- ``noprep+local``: ``prepare_threshold=None`` and ``SET LOCAL jit = off`` at the
  start of every transaction (no session state, one more statement each);
- ``pgbouncer``: ``noprep`` through the PgBouncer URL (with ``--pgbouncer``).

``--micro``: instead, one store per variant on the same tables (2,000 done
jobs), taking turns in blocks of 50 calls; per call, the median over the
blocks: ``claim`` (as below), ``finals`` (the rows of 200 ids, one read),
``job`` (one row by id, one read).

Metrics, each the median over the rounds (the variants alternate within each
round, in a rotating order, so that a noisy neighbour hits them alike):

- ``rtt``: submit-to-result of one trivial job on an idle executor (median of
  ``--samples`` jobs, spaced by a random 10-30 ms);
- ``burst``: 2,000 trivial jobs submitted at once, until every result is in;
- ``dag``: 1,000 jobs, each depending on up to 3 random earlier ones (seeded);
- ``claim``: one claim transaction that finds nothing (``Store.claim`` without
  the probe: the groups and the ready index are read under locks), mean of 300,
  on a store of its own: the database's share of every tick, without the
  scheduler's timing around it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import wait
from typing import Any

from sqlalchemy import event, select

from dbexecutor import DBExecutor
from dbexecutor.dialects.base import Driver as Dialect
from dbexecutor.dialects.postgresql import PostgreSQLDriver as PostgreSQLDialect
from dbexecutor.store import Store

from . import jobs

DIRECT = os.environ.get("DBEXECUTOR_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test")

_ORIGINAL_OPTIONS = PostgreSQLDialect.engine_options
_ORIGINAL_SETUP = PostgreSQLDialect.setup_engine


def _prepare_options(self: PostgreSQLDialect) -> dict[str, Any]:
    return Dialect.engine_options(self)  # psycopg's own prepare_threshold (5)


def _noprep_options(self: PostgreSQLDialect) -> dict[str, Any]:
    return {**Dialect.engine_options(self), "connect_args": {"prepare_threshold": None}}


def _set_both(self: PostgreSQLDialect, engine: Any) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET jit = off; SET plan_cache_mode = force_custom_plan")
        dbapi_conn.commit()


def _set_jit(self: PostgreSQLDialect, engine: Any) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET jit = off")
        dbapi_conn.commit()


def _nothing(self: PostgreSQLDialect, engine: Any) -> None:
    pass


def _set_local(self: PostgreSQLDialect, engine: Any) -> None:
    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("SET LOCAL jit = off")


VARIANTS: dict[str, tuple[Callable[..., Any], Callable[..., Any], bool]] = {
    # name: (engine_options, setup_engine, through PgBouncer)
    "auto": (_prepare_options, _set_jit, False),  # prepared, generic plans allowed (the server's default), no JIT
    "prepare": (_prepare_options, _set_both, False),  # before PgBouncer support (the same settings, always)
    "noprep+set": (_noprep_options, _set_jit, False),
    "noprep": (_noprep_options, _nothing, False),  # dbexecutor since PgBouncer support
    "noprep+local": (_noprep_options, _set_local, False),
    "pgbouncer": (_ORIGINAL_OPTIONS, _ORIGINAL_SETUP, True),  # dbexecutor through PgBouncer
}


def _rtt(ex: DBExecutor, samples: int) -> float:
    rng = random.Random(1)
    out = []
    for _ in range(samples):
        time.sleep(0.01 + rng.random() * 0.02)
        t0 = time.perf_counter()
        ex.submit(jobs.noop, 1).result()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _burst(ex: DBExecutor, n: int) -> float:
    t0 = time.perf_counter()
    futs = [ex.submit(jobs.noop, i) for i in range(n)]
    wait(futs)
    assert all(f.result() == i for i, f in enumerate(futs))
    return time.perf_counter() - t0


def _dag(ex: DBExecutor, n: int, seed: int) -> float:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    futs: list[Any] = []
    for i in range(n):
        lo = max(0, i - 50)
        deps = rng.sample(futs[lo:i], rng.randint(0, min(3, i - lo)))
        futs.append(ex.submit(jobs.noop, i, after=deps))
    wait(futs)
    return time.perf_counter() - t0


def _claim(url: str, prefix: str, n: int = 300) -> float:
    store = Store(url, prefix)
    try:
        for _ in range(20):
            store.claim("bench", 4, 30.0, time.time(), probe=False)
        t0 = time.perf_counter()
        for _ in range(n):
            assert store.claim("bench", 4, 30.0, time.time(), probe=False) == []
        return (time.perf_counter() - t0) / n
    finally:
        store.close()


def measure(name: str, pgbouncer: str | None, samples: int, burst: int, dag: int, seed: int) -> dict[str, float]:
    options, setup, pooled = VARIANTS[name]
    PostgreSQLDialect.engine_options = options  # type: ignore[method-assign]
    PostgreSQLDialect.setup_engine = setup  # type: ignore[method-assign]
    url = pgbouncer if pooled else DIRECT
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    try:
        ex = DBExecutor(url, 2, prefix=prefix)
        try:
            wait([ex.submit(jobs.sleep, 0.02) for _ in range(2)])
            ex.submit(jobs.noop, 0).result()
            out = {"rtt": _rtt(ex, samples), "burst": _burst(ex, burst), "dag": _dag(ex, dag, seed)}
        finally:
            ex.shutdown(wait=True)
        out["claim"] = _claim(url, prefix)
        return out
    finally:
        PostgreSQLDialect.engine_options = _ORIGINAL_OPTIONS  # type: ignore[method-assign]
        PostgreSQLDialect.setup_engine = _ORIGINAL_SETUP  # type: ignore[method-assign]
        store = Store(DIRECT, prefix, create=False)
        store.drop_schema()
        store.close()


def _store(name: str, url: str, prefix: str) -> Store:
    options, setup, _ = VARIANTS[name]
    PostgreSQLDialect.engine_options = options  # type: ignore[method-assign]
    PostgreSQLDialect.setup_engine = setup  # type: ignore[method-assign]
    try:
        return Store(url, prefix)
    finally:
        PostgreSQLDialect.engine_options = _ORIGINAL_OPTIONS  # type: ignore[method-assign]
        PostgreSQLDialect.setup_engine = _ORIGINAL_SETUP  # type: ignore[method-assign]


def micro(names: list[str], pgbouncer: str | None, blocks: int, per_block: int = 50) -> None:
    from .claimcost import fill

    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    stores = {n: _store(n, pgbouncer if VARIANTS[n][2] else DIRECT, prefix) for n in names}
    try:
        any_store = next(iter(stores.values()))
        fill(any_store, "done", 2000, time.time())
        with any_store.engine.connect() as conn:
            ids = [int(i) for i in conn.execute(select(any_store.tables.jobs.c.id)).scalars()]
        calls: dict[str, Callable[[Store], Any]] = {
            "claim": lambda st: st.claim("bench", 4, 30.0, time.time(), probe=False),
            "finals": lambda st: st.finals(ids[:200]),
            "job": lambda st: st.job(ids[7]),
        }
        got = {n: {c: [] for c in calls} for n in names}  # type: dict[str, dict[str, list[float]]]
        for st in stores.values():  # warm: past psycopg's prepare threshold
            for call in calls.values():
                for _ in range(10):
                    call(st)
        for b in range(blocks):
            order = names[b % len(names):] + names[: b % len(names)]
            for c, call in calls.items():
                for n in order:
                    st = stores[n]
                    t0 = time.perf_counter()
                    for _ in range(per_block):
                        call(st)
                    got[n][c].append((time.perf_counter() - t0) / per_block)
        print(f"per call, median over {blocks} blocks of {per_block} (ms; min-max of the blocks)")
        print(f"{'variant':13} " + " ".join(f"{c:>24}" for c in calls))
        for n in names:
            cells = [f"{statistics.median(x) * 1000:.3f} ({min(x) * 1000:.3f}-{max(x) * 1000:.3f})"
                     for x in got[n].values()]
            print(f"{n:13} " + " ".join(f"{c:>24}" for c in cells))
    finally:
        for st in stores.values():
            st.close()
        store = Store(DIRECT, prefix, create=False)
        store.drop_schema()
        store.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--burst", type=int, default=2000)
    p.add_argument("--dag", type=int, default=1000)
    p.add_argument("--pgbouncer", default=os.environ.get("DBEXECUTOR_TEST_PGBOUNCER_URL"))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--micro", type=int, default=0, metavar="BLOCKS", help="the per-call comparison instead")
    args = p.parse_args()
    names = [v for v in args.variants.split(",") if v != "pgbouncer" or args.pgbouncer]
    if args.micro:
        micro(names, args.pgbouncer, args.micro)
        return 0
    got: dict[str, dict[str, list[float]]] = {n: {"rtt": [], "burst": [], "dag": [], "claim": []} for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            m = measure(name, args.pgbouncer, args.samples, args.burst, args.dag, seed=r)
            for k, v in m.items():
                got[name][k].append(v)
            print(f"round {r + 1} {name:13} rtt {m['rtt'] * 1000:6.2f} ms  burst {m['burst']:6.3f} s  "
                  f"dag {m['dag']:6.3f} s  claim {m['claim'] * 1000:6.3f} ms", flush=True)
    print(f"\nmedians over {args.rounds} rounds (min-max)")
    print(f"{'variant':13} {'rtt ms':>22} {'burst s':>22} {'dag s':>22} {'claim ms':>22}")
    for name in names:
        cells = []
        for k, scale in (("rtt", 1000), ("burst", 1), ("dag", 1), ("claim", 1000)):
            xs = got[name][k]
            cells.append(f"{statistics.median(xs) * scale:7.3f} ({min(xs) * scale:.3f}-{max(xs) * scale:.3f})")
        print(f"{name:13} " + " ".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
