"""Scale-out and resources (issues 16 and 18): several processes on one database.

drain        A ``run_jobs=False`` executor enqueues ``drain_jobs`` no-op jobs one by one and
             ``flush()``es; the tables are analyzed; then ONE real ``dbexecutor worker URL
             --max-workers 2`` subprocess starts. Rate: jobs / (enqueue time + worker start ->
             last job's ``finished_at``), target >= 4,500/s on PostgreSQL; and worker start ->
             first job done. On PostgreSQL, PGQueuer (``benchmarks/pgq_peer.py``: batched enqueue,
             two worker processes, asyncpg) on the same backlog in the same run.
scaleout     ``scale_executors`` worker subprocesses x ``scale_slots`` slots, jobs of
             ``scale_sleep_s`` submitted by this process through a ``run_jobs=False`` executor:
             efficiency = ideal (jobs x sleep / slots) / wall (first submit -> last ``finished_at``),
             target >= 0.9; one in-process executor with as many slots (>= 0.9), and
             ``ProcessPoolExecutor`` with as many, timed in turn with them.
swarm        ``swarm_executors`` workers x 1 slot against 1 worker x as many slots, draining
             ``swarm_jobs`` no-op jobs enqueued while their group was paused (``configure_group(limit=0)``),
             timed from the release to the last ``finished_at``; rounds alternate the two. The
             workers run under ``benchmarks.sqltrace``, which times every transaction from outside:
             p50/p99 of the transactions that leased jobs (a tick claims in the transaction that
             records results), and of the lease statement alone.
idle         An executor with nothing to do, over ``idle_s`` seconds: statements it sends per second
             (client side, ``benchmarks.sqltrace`` in a subprocess; on SQLite the ``sqlite3`` trace),
             and the server's own counters: PostgreSQL ``pg_stat_database`` (a database of its own,
             so nobody else's transactions count), MariaDB ``SHOW GLOBAL STATUS`` deltas (global:
             the same window without the executor is subtracted).
connections  A subprocess runs ``DBExecutor(url, max_workers=w)`` with w jobs running at once;
             connections of that process tree counted from the server (``pg_stat_activity`` /
             ``information_schema.PROCESSLIST``, matched by the tree's client ports); on SQLite the
             handles open on the database file. Target <= 3 (servers). The executor's heartbeat
             interval is 1 s (default 5 s), so every child has renewed its lease before the count.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from dbexecutor import DBExecutor

from . import jobs, procs, sqltrace
from .scenarios import URLS, Context, Row, percentile, tables, warm

# -- helpers -----------------------------------------------------------------------


def analyze(eng: Any, kind: str, tables_: list[str]) -> float:
    """What autovacuum would do after a bulk insert (the PostgreSQL here runs without it); seconds taken."""
    t0 = time.perf_counter()
    with eng.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for t in tables_:
            if kind == "postgresql":
                conn.execute(text(f"ANALYZE {t}"))
            elif kind == "mariadb":
                conn.execute(text(f"ANALYZE TABLE {t}")).all()
            else:
                conn.execute(text(f"ANALYZE {t}"))
    return time.perf_counter() - t0


def _max_id(eng: Any, prefix: str) -> int:
    with eng.connect() as conn:
        return int(conn.execute(text(f"SELECT coalesce(max(id), 0) FROM {prefix}jobs")).scalar())


def _round_times(eng: Any, prefix: str, after_id: int) -> dict[str, float]:
    with eng.connect() as conn:
        row = conn.execute(text(
            f"SELECT count(*), min(started_at), max(finished_at) FROM {prefix}jobs "
            f"WHERE id > :a AND state = 'done'"), {"a": after_id}).one()
    return {"done": int(row[0]), "first_leased": row[1], "last_done": row[2]}


def _wait_round(eng: Any, prefix: str, after_id: int, n: int, limit: float) -> dict[str, float]:
    end = time.monotonic() + limit
    while True:
        got = _round_times(eng, prefix, after_id)
        if got["done"] >= n:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"{got['done']} of {n} jobs done after {limit:g} s")
        time.sleep(0.02)


@contextlib.contextmanager
def workers(url: str, prefix: str, count: int, slots: int, trace_dir: str | None = None) -> Iterator[list[procs.Worker]]:
    started: list[procs.Worker] = []
    try:
        for i in range(count):
            trace = None if trace_dir is None else os.path.join(trace_dir, f"w{i}.json")
            started.append(procs.Worker(url, prefix, slots, trace=trace))
        for w in started:
            w.wait_serving(120)
        yield started
    finally:
        procs.stop_all(started)


# -- drain -------------------------------------------------------------------------

DRAIN_TARGET = {"postgresql": 4500.0}


def _drain_ours(kind: str, n: int) -> dict[str, Any]:
    with tables(kind) as (url, prefix):
        eng = procs.engine(url)
        sub = DBExecutor(url, 1, prefix=prefix, run_jobs=False)
        try:
            t0 = time.time()
            futures = [sub.submit(jobs.noop, i) for i in range(n)]
            sub.flush()
            enqueue_s = time.time() - t0
            analyze_s = analyze(eng, kind, [f"{prefix}jobs", f"{prefix}groups"])
            worker = procs.Worker(url, prefix, 2)
            try:
                got = procs.wait_done(eng, prefix, n, limit=max(120.0, n / 50))
            finally:
                worker.stop()
            wait(futures, 60)
            failed = sum(1 for f in futures if not f.done() or f.exception(0) is not None)
        finally:
            sub.shutdown(wait=False, cancel_futures=True)
            eng.dispose()
    drain_s = got["last_done"] - worker.started
    return {"enqueue_s": enqueue_s, "analyze_s": analyze_s, "drain_s": drain_s,
            "rate": n / (enqueue_s + drain_s), "drain_rate": n / drain_s,
            "first_done_s": got["first_done"] - worker.started, "futures_not_done_or_failed": failed,
            "states": got["states"]}


def _pgq(*args: str, prefix: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.pgq_peer", *args], env=procs.env(PGQUEUER_PREFIX=prefix),
                         cwd=str(procs.ROOT), capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"pgq_peer {args[0]} exited with {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _drain_pgqueuer(n: int) -> dict[str, Any]:
    dsn = URLS["postgresql"]
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    eng = procs.engine(dsn)
    _pgq("install", dsn, prefix=prefix)
    try:
        put = _pgq("enqueue", dsn, str(n), prefix=prefix)
        analyze_s = analyze(eng, "postgresql", [f"{prefix}pgqueuer"])
        started = time.time()
        env = procs.env(PGQUEUER_PREFIX=prefix)
        procs_ = [subprocess.Popen([sys.executable, "-m", "benchmarks.pgq_peer", "worker", dsn], env=env,
                                   cwd=str(procs.ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for _ in range(2)]
        outs = []
        for p in procs_:
            stdout, stderr = p.communicate(timeout=max(120.0, n / 50))
            if p.returncode != 0:
                raise RuntimeError(f"pgqueuer worker exited with {p.returncode}: {stderr[-2000:]}")
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        _pgq("uninstall", dsn, prefix=prefix)
        eng.dispose()
    count = sum(o["count"] for o in outs)
    last = max(o["last_done"] for o in outs if o["last_done"])
    first = min(o["first_done"] for o in outs if o["first_done"])
    enqueue_s = put["end"] - put["start"]
    drain_s = last - started
    return {"enqueue_s": enqueue_s, "analyze_s": analyze_s, "drain_s": drain_s, "rate": n / (enqueue_s + drain_s),
            "drain_rate": n / drain_s, "first_done_s": first - started, "count": count, "workers": outs,
            "note": "PGQueuer defaults (batch size 10), asyncpg, async no-op handler, drain mode"}


def _pgqueuer_available() -> bool:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def drain(ctx: Context, kind: str) -> list[Row]:
    n = ctx.sizes.drain_jobs
    peer = kind == "postgresql" and ctx.sizes.drain_pgqueuer and _pgqueuer_available()
    runs: dict[str, list[dict[str, Any]]] = {"dbexecutor": []}
    if peer:
        runs["pgqueuer"] = []
    for r in range(max(1, ctx.sizes.repeats)):  # alternate, starting with each side in turn
        for side in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            runs[side].append(_drain_ours(kind, n) if side == "dbexecutor" else _drain_pgqueuer(n))
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("rate", "first_done_s", "drain_rate")}
           for k, v in runs.items()}
    ours = med["dbexecutor"]
    base_rate = {"pgqueuer": med["pgqueuer"]["rate"]} if peer else {}
    target = DRAIN_TARGET.get(kind)
    return [
        Row("drain", kind, f"backlog {n:,}: enqueue + drain, 1 worker x 2", "/s", ours["rate"], base_rate,
            ours["rate"] / base_rate["pgqueuer"] if peer else None,
            ratio_of="dbexecutor / PGQueuer (2 worker processes)" if peer else "",
            target=f">= {target:,.0f}/s" if target else "", passed=None if target is None else ours["rate"] >= target,
            raw={"runs": runs, "medians": med}),
        Row("drain", kind, "worker start -> first job done", "s", ours["first_done_s"],
            {"pgqueuer": med["pgqueuer"]["first_done_s"]} if peer else {}, None, ratio_of=""),
    ]


# -- scale-out: many executors x few slots -----------------------------------------------

SCALE_EFFICIENCY = 0.9


def scaleout(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    count, slots_each, n, s = sz.scale_executors, sz.scale_slots, sz.scale_jobs, sz.scale_sleep_s
    slots = count * slots_each
    ideal = n * s / slots
    walls: dict[str, list[float]] = {"many": [], "one": [], "ppe": []}
    extra: dict[str, list[Any]] = {"many_futures_s": []}
    with tables(kind) as (url_a, prefix_a), tables(kind) as (url_b, prefix_b):
        eng_a = procs.engine(url_a)
        sub = DBExecutor(url_a, 1, prefix=prefix_a, run_jobs=False)
        one = DBExecutor(url_b, slots, prefix=prefix_b)
        ppe = ProcessPoolExecutor(slots)
        try:
            with workers(url_a, prefix_a, count, slots_each):
                for ex in (sub, one, ppe):  # every child started, and past the first short jobs
                    wait([ex.submit(jobs.sleep, s) for _ in range(2 * slots)], 120)

                def many() -> float:
                    after = _max_id(eng_a, prefix_a)
                    t0 = time.time()
                    futures = [sub.submit(jobs.sleep, s) for _ in range(n)]
                    got = _wait_round(eng_a, prefix_a, after, n, max(120.0, 20 * ideal))
                    wait(futures, 60)
                    extra["many_futures_s"].append(time.time() - t0)
                    return got["last_done"] - t0

                def local(ex: Any) -> float:
                    t0 = time.perf_counter()
                    wait([ex.submit(jobs.sleep, s) for _ in range(n)])
                    return time.perf_counter() - t0

                setups = {"many": many, "one": lambda: local(one), "ppe": lambda: local(ppe)}
                for r in range(max(1, sz.scale_rounds)):
                    names = list(setups)
                    for i in range(len(names)):
                        name = names[(r + i) % len(names)]
                        walls[name].append(setups[name]())
        finally:
            sub.shutdown(wait=False, cancel_futures=True)
            one.shutdown(wait=True)
            ppe.shutdown(wait=True)
            eng_a.dispose()
    eff = {k: ideal / statistics.median(v) for k, v in walls.items()}
    raw = {"jobs": n, "sleep_s": s, "slots": slots, "ideal_s": ideal, "walls_s": walls, **extra}
    return [
        Row("scaleout", kind, f"{count} executors x {slots_each}, {n:,} x {s * 1000:g} ms: ideal/wall", "x",
            eff["many"], {"ppe": eff["ppe"]}, eff["many"] / eff["ppe"], ratio_of="efficiency / PPE's efficiency",
            target=f">= {SCALE_EFFICIENCY}", passed=eff["many"] >= SCALE_EFFICIENCY, raw=raw),
        Row("scaleout", kind, f"1 executor x {slots}, same jobs: ideal/wall", "x",
            eff["one"], {"ppe": eff["ppe"]}, eff["one"] / eff["ppe"], ratio_of="efficiency / PPE's efficiency",
            target=f">= {SCALE_EFFICIENCY}", passed=eff["one"] >= SCALE_EFFICIENCY),
    ]


# -- swarm: many single-slot executors draining trivial jobs --------------------------------


def _claim_stats(trace_dir: str, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Transactions that leased jobs, inside the drain windows, over every traced worker."""
    txn_ms: list[float] = []
    lease_ms: list[float] = []
    all_ms: list[float] = []
    for name in sorted(os.listdir(trace_dir)):
        if not name.endswith(".json"):
            continue
        data = sqltrace.load(os.path.join(trace_dir, name))
        for begin, end, _thread, _n, outcome, _labels, lease in data["transactions"]:
            if not any(a <= begin <= b for a, b in windows):
                continue
            all_ms.append((end - begin) * 1000)
            if lease is not None:
                txn_ms.append((end - begin) * 1000)
                lease_ms.append(lease * 1000)
    out: dict[str, Any] = {"claims": len(txn_ms), "transactions": len(all_ms)}
    for label, xs in (("claim_txn", txn_ms), ("lease_stmt", lease_ms), ("any_txn", all_ms)):
        if xs:
            out[f"{label}_p50_ms"] = percentile(xs, 0.5)
            out[f"{label}_p99_ms"] = percentile(xs, 0.99)
    return out


def swarm(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    count, n = sz.swarm_executors, sz.swarm_jobs
    shapes = {"many": (count, 1), "one": (1, count)}
    rates: dict[str, list[float]] = {k: [] for k in shapes}
    drains: dict[str, list[float]] = {k: [] for k in shapes}
    windows: dict[str, list[tuple[float, float]]] = {k: [] for k in shapes}
    stats: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        setups: dict[str, Any] = {}
        for name, (procs_n, slots) in shapes.items():
            url, prefix = stack.enter_context(tables(kind))
            trace_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="dbexecutor-bench-trace-"))
            eng = procs.engine(url)
            stack.callback(eng.dispose)
            sub = DBExecutor(url, 1, prefix=prefix, run_jobs=False)
            stack.callback(sub.shutdown, wait=False, cancel_futures=True)
            setups[name] = (url, prefix, eng, sub, trace_dir, procs_n, slots)
        for name, (url, prefix, eng, sub, trace_dir, procs_n, slots) in setups.items():
            started = stack.enter_context(workers(url, prefix, procs_n, slots, trace_dir))
            wait([sub.submit(jobs.sleep, 0.02) for _ in range(2 * count)], 120)  # every child started
            setups[name] = (*setups[name], started)

        def one_round(name: str) -> None:
            url, prefix, eng, sub, *_ = setups[name]
            sub.configure_group("default", limit=0)  # paused: the backlog builds up untouched
            after = _max_id(eng, prefix)
            futures = [sub.submit(jobs.noop, i) for i in range(n)]
            sub.flush()
            analyze(eng, kind, [f"{prefix}jobs", f"{prefix}groups"])
            t0 = time.time()
            sub.configure_group("default", limit=None)
            got = _wait_round(eng, prefix, after, n, max(120.0, n / 20))
            windows[name].append((t0, got["last_done"]))
            rates[name].append(n / (got["last_done"] - t0))
            drains[name].append(n / (got["last_done"] - got["first_leased"]))
            wait(futures, 60)

        for r in range(max(1, sz.swarm_rounds)):
            for name in (list(shapes) if r % 2 == 0 else list(shapes)[::-1]):
                one_round(name)
        # Stopping the workers writes their traces.
        for name in shapes:
            procs.stop_all(setups[name][-1])
            stats[name] = _claim_stats(setups[name][4], windows[name])
    rate = {k: statistics.median(v) for k, v in rates.items()}
    raw = {"jobs": n, "rates": rates, "drain_rates_first_lease_to_last_done": drains, "claims": stats}
    rows = [
        Row("swarm", kind, f"{count} executors x 1, {n:,} jobs", "/s", rate["many"], {f"1x{count}": rate["one"]},
            rate["many"] / rate["one"], ratio_of=f"{count} x 1 / 1 x {count}", raw=raw),
    ]
    for name, label in (("many", f"{count} x 1"), ("one", f"1 x {count}")):
        st = stats[name]
        if "claim_txn_p50_ms" in st:
            rows.append(Row("swarm", kind, f"{label}: claiming transaction p50", "ms", st["claim_txn_p50_ms"], {}, None,
                            ratio_of="", raw=st))
            rows.append(Row("swarm", kind, f"{label}: claiming transaction p99", "ms", st["claim_txn_p99_ms"], {}, None,
                            ratio_of=""))
    return rows


# -- idle: what an executor with nothing to do costs the database ------------------------------


def _private_pg_database() -> tuple[str, str]:
    """(URL of a new database of our own, its name): its pg_stat_database row counts only us."""
    name = f"bench_idle_{uuid.uuid4().hex[:8]}"
    admin = procs.engine(URLS["postgresql"], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        # template0 takes no connections: another session on template1 cannot make this fail.
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE template0"))
    admin.dispose()
    url = make_url(URLS["postgresql"]).set(database=name).render_as_string(hide_password=False)
    return url, name


def _drop_pg_database(name: str) -> None:
    admin = procs.engine(URLS["postgresql"], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


def _server_counters(kind: str, eng: Any, dbname: str | None) -> dict[str, float]:
    with eng.connect() as conn:
        if kind == "postgresql":
            row = conn.execute(text("SELECT xact_commit, xact_rollback, tup_returned, tup_fetched "
                                    "FROM pg_stat_database WHERE datname = :d"), {"d": dbname}).one()
            return {"xact": float(row[0] + row[1]), "tup_returned": float(row[2]), "tup_fetched": float(row[3])}
        got = dict(conn.execute(text(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select', 'Com_commit', 'Com_update')")).all())
        return {k: float(v) for k, v in got.items()}


def _delta(a: dict[str, float], b: dict[str, float], seconds: float) -> dict[str, float]:
    return {k: (b[k] - a[k]) / seconds for k in a}


# PostgreSQL's backends report their counters at most about once a second: read
# the server's counters this long after each end of the window, so both reads
# see the window's edges equally late.
_PG_STATS_LAG = 1.2


def idle(ctx: Context, kind: str) -> list[Row]:
    seconds = ctx.sizes.idle_s
    settle = 1.0
    dbname = None
    with contextlib.ExitStack() as stack:
        url, prefix = stack.enter_context(tables(kind))
        if kind == "postgresql":
            url, dbname = _private_pg_database()
            stack.callback(_drop_pg_database, dbname)
        counter_eng = procs.engine(URLS[kind]) if kind != "sqlite" else None
        if counter_eng is not None:
            stack.callback(counter_eng.dispose)
        control: dict[str, float] = {}
        if kind == "mariadb":  # the same window without the executor: the rest of the server's traffic
            a = _server_counters(kind, counter_eng, None)
            time.sleep(seconds)
            control = _delta(a, _server_counters(kind, counter_eng, None), seconds)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="dbexecutor-bench-idle-"))
        out = os.path.join(tmp, "trace.json")
        proc = subprocess.Popen(
            # It idles _PG_STATS_LAG longer than the server's window, which starts that late.
            [sys.executable, "-m", "benchmarks.sqltrace", out, "--", "idle", url, prefix, str(settle),
             str(seconds + _PG_STATS_LAG + 0.3)],
            env=procs.env(), cwd=str(procs.ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "window": the executor is constructed and settled
        if "window" not in line:
            proc.wait(60)
            raise RuntimeError(f"the idle executor did not start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        server: dict[str, float] = {}
        if kind == "postgresql":
            # Both reads _PG_STATS_LAG late: each sees what the backends did up to about then.
            time.sleep(_PG_STATS_LAG)
            a = _server_counters(kind, counter_eng, dbname)
            time.sleep(seconds)
            server = _delta(a, _server_counters(kind, counter_eng, dbname), seconds)
        elif kind == "mariadb":
            a = _server_counters(kind, counter_eng, None)
            time.sleep(seconds * 0.98)
            b = _server_counters(kind, counter_eng, None)
            server = _delta(a, b, seconds * 0.98)
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"the idle executor exited with {proc.returncode}: {err[-2000:]}")
        trace = sqltrace.load(out)
    m = trace["marks"]
    start, end = m["window_start"], m["window_end"]
    span = end - start
    stmts = sqltrace.in_window([s[0] for s in trace["statements"]], start, end)
    txns = [t for t in trace["transactions"] if start <= t[0] < end]
    client = {"statements_per_s": stmts / span, "commits_per_s": sum(1 for t in txns if t[4] == "commit") / span,
              "rollbacks_per_s": sum(1 for t in txns if t[4] == "rollback") / span,
              "transactions_per_s": len(txns) / span}
    round_trips = client["statements_per_s"] + client["commits_per_s"] + client["rollbacks_per_s"]
    raw: dict[str, Any] = {"seconds": span, "client": client, "labels": sorted({s[3][:60] for s in trace["statements"]
                                                                                if start <= s[0] < end})}
    rows = [Row("idle", kind, "idle executor: statements + commits /s (client)", "/s", round_trips, {}, None,
                ratio_of="", raw=raw)]
    if kind == "sqlite":
        traced = sqltrace.in_window(trace["sqlite_statements"], start, end) / span
        raw["sqlite_trace_per_s"] = traced
        rows.append(Row("idle", kind, "idle executor: statements /s (sqlite3 trace)", "/s", traced, {}, None,
                        ratio_of="", raw={"note": "every statement the sqlite3 module ran: BEGIN, SELECT, COMMIT"}))
    elif kind == "postgresql":
        rows.append(Row("idle", kind, "idle executor: transactions /s (server)", "/s", server["xact"], {}, None,
                        ratio_of="", raw={"pg_stat_database_per_s": server, "database": dbname,
                                          "note": "a database of its own; counters read over idle_s seconds, starting 1.2 s into the "
                                                  "executor's idle window (backends report about once a second)"}))
    else:
        net = server.get("Questions", 0.0) - control.get("Questions", 0.0)
        rows.append(Row("idle", kind, "idle executor: Questions /s (server, net)", "/s", net, {}, None, ratio_of="",
                        raw={"with_executor_per_s": server, "without_per_s": control,
                             "note": "global counters: other clients' traffic is in both windows"}))
    return rows


# -- connections ---------------------------------------------------------------------------

CONNECTIONS_LIMIT = 3

_HOLD = """
import json, os, sys, time
from concurrent.futures import wait
from dbexecutor import DBExecutor
import benchmarks.jobs as jobs
url, prefix, workers, release = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
# A heartbeat every second (default: every 5 s) so that, within the wait below, every
# child has renewed its lease and holds what it holds in the steady state.
ex = DBExecutor(url, workers, prefix=prefix, heartbeat_interval=1.0)
futures = [ex.submit(jobs.wait_for_file, release, 300.0) for _ in range(workers)]
end = time.monotonic() + 120
while not all(f.running() for f in futures):
    if time.monotonic() > end:
        raise SystemExit("the jobs did not all start")
    time.sleep(0.02)
time.sleep(1.6)  # heartbeats and the scheduler's next ticks, with every job running
print(json.dumps({"pid": os.getpid()}), flush=True)
wait(futures)
ex.shutdown(wait=True)
print(json.dumps({"done": True}), flush=True)
"""


def _count_connections(kind: str, eng: Any, pids: set[int], db_file: str | None) -> dict[str, Any]:
    if kind == "sqlite":
        assert db_file is not None
        return {"total": procs.open_handles(pids, db_file), "by": "handles open on the database file"}
    port = make_url(procs.sa_url(URLS[kind])).port or (5432 if kind == "postgresql" else 3306)
    ports = procs.tcp_ports(pids, port)
    with eng.connect() as conn:
        if kind == "postgresql":
            rows = conn.execute(text("SELECT pid, client_port, application_name, state, left(query, 60) "
                                     "FROM pg_stat_activity WHERE client_port IS NOT NULL")).all()
            mine = [dict(pid=r[0], port=r[1], app=r[2], state=r[3], query=r[4]) for r in rows if r[1] in ports]
        else:
            rows = conn.execute(text("SELECT ID, HOST, DB, COMMAND, STATE FROM information_schema.PROCESSLIST")).all()
            mine = []
            for r in rows:
                host = str(r[1] or "")
                if ":" in host and int(host.rsplit(":", 1)[1]) in ports:
                    mine.append(dict(id=r[0], host=host, db=r[2], command=r[3], state=r[4]))
    return {"total": len(mine), "client_ports": len(ports), "server_rows": mine}


def _wait_running(url: str, prefix: str, n: int, limit: float = 120.0) -> None:
    """Until ``n`` rows are ``running``: a child's heartbeat (over its own connection, if it has one) sets that."""
    eng = procs.engine(url)
    try:
        end = time.monotonic() + limit
        while True:
            with eng.connect() as conn:
                got = conn.execute(text(f"SELECT count(*) FROM {prefix}jobs WHERE state = 'running'")).scalar()
            if got >= n:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{got} of {n} jobs running after {limit:g} s")
            time.sleep(0.1)
    finally:
        eng.dispose()


def connections(ctx: Context, kind: str) -> list[Row]:
    rows = []
    for w in ctx.sizes.connection_workers:
        with tables(kind) as (url, prefix), tempfile.TemporaryDirectory(prefix="dbexecutor-bench-conn-") as tmp:
            release = os.path.join(tmp, "release")
            eng = procs.engine(URLS[kind]) if kind != "sqlite" else None
            proc = subprocess.Popen([sys.executable, "-c", _HOLD, url, prefix, str(w), release], env=procs.env(),
                                    cwd=str(procs.ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if not line.strip():
                    proc.wait(30)
                    raise RuntimeError(f"the executor process failed: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
                pid = json.loads(line)["pid"]
                _wait_running(url, prefix, w)
                time.sleep(0.5)
                pids = procs.tree_pids(pid)
                db_file = make_url(url).database if kind == "sqlite" else None
                got = _count_connections(kind, eng, pids, db_file)
                per_process: dict[str, int] = {}
                if kind != "sqlite":
                    port = make_url(procs.sa_url(URLS[kind])).port or (5432 if kind == "postgresql" else 3306)
                    per_process = {("parent" if p == pid else f"child {p}"): len(procs.tcp_ports({p}, port))
                                   for p in sorted(pids)}
                    per_process = {k: v for k, v in per_process.items() if v}
            finally:
                open(release, "w").close()
                try:
                    proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    procs.kill_tree(proc.pid)
                    proc.communicate(timeout=30)
                if eng is not None:
                    eng.dispose()
        limited = kind != "sqlite"
        rows.append(Row("connections", kind, f"max_workers={w}, {w} jobs running", "", float(got["total"]), {}, None,
                        ratio_of="", target=f"<= {CONNECTIONS_LIMIT}" if limited else "",
                        passed=got["total"] <= CONNECTIONS_LIMIT if limited else None,
                        raw={**got, "per_process": per_process, "processes": len(pids)}))
    return rows
