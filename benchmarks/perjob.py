"""Per-job costs of issue 18: durable submits, cold start, the warm round trip, timeout precision.

durable      ``DBExecutor(url, durable_submit=True)``: N submits one by one, each returning once its
             row is committed, then ``flush()``; against the same server's rate of plain
             single-row ``INSERT``; ``COMMIT`` into a table of our own through SQLAlchemy and the
             same driver (SQLite: WAL, ``synchronous`` as the library leaves it). The two
             alternate in blocks; target: >= 0.8 of the plain rate.
coldstart    In fresh interpreters (``python -c``): (a) ``import dbexecutor`` (<= 0.2 s), beside
             ``from concurrent.futures import ProcessPoolExecutor``; (b) with the modules and the
             driver already imported, constructor -> first result of a trivial job, tables already
             there (<= 0.3 s SQLite, <= 0.5 s servers), beside PPE's; (c) a ``dbexecutor worker``
             subprocess started with one job waiting: process start -> that job done (<= 0.5 s),
             from the row's ``finished_at``. Measures alternate; medians of ``cold_runs``.
roundtrip    Warm round trip on an idle executor: ``submit(noop).result()``, one at a time,
             samples of every executor interleaved (<= 2 ms SQLite, <= 4 ms servers; p50).
timeout      ``options(timeout=2)`` on a job that starts a ``sleep`` subprocess and sleeps: submit ->
             ``TimeoutError`` (<= 2.5 s; ``--quick`` uses timeout=1, <= 1.5 s), and whether the grandchild died; pebble's
             ``schedule(timeout=2)`` beside it (PPE has no timeout). Then ``timeout_kills`` such jobs
             at once on as many workers of an executor with ``workers`` more, while a thread
             keeps submitting 10 ms jobs: every timeout (<= 2.5 s), and the longest gap between
             two short jobs' completions while the kills happen.
"""

from __future__ import annotations

import os
import pickle
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import Future, wait
from typing import Any

import psutil
from sqlalchemy import text

from dbexecutor import DBExecutor

from . import jobs, procs
from .scenarios import OURS, Context, Row, executors, interleave, percentile, split, tables, warm

_DRIVER_MODULE = {"sqlite": "sqlite3", "postgresql": "psycopg", "mariadb": "pymysql"}


# -- durable submits against plain INSERT + COMMIT ----------------------------------------

DURABLE_SHARE = 0.8


def _plain_table(conn: Any, kind: str, name: str) -> None:
    if kind == "sqlite":
        ddl = f"CREATE TABLE {name} (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL, created_at DOUBLE NOT NULL)"
    elif kind == "postgresql":
        ddl = f"CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL)"
    else:
        ddl = (f"CREATE TABLE {name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL, "
               "created_at DOUBLE NOT NULL) ENGINE=InnoDB")
    conn.execute(text(ddl))


def durable(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    blocks = max(1, sz.durable_blocks)
    per = max(1, sz.durable_jobs // blocks)
    payload = pickle.dumps((jobs.noop, (12345,), {}))  # about the size of a stored call
    with tables(kind) as (url, prefix):
        plain = f"{prefix}plain"
        eng = procs.engine(url, pool_size=1) if kind != "sqlite" else procs.engine(url)
        ex = DBExecutor(url, ctx.workers, prefix=prefix, durable_submit=True)
        try:
            warm(ex, ctx.workers)
            with eng.begin() as conn:
                _plain_table(conn, kind, plain)
            insert = text(f"INSERT INTO {plain} (payload, created_at) VALUES (:p, :t)")
            settings: dict[str, Any] = {}
            times: dict[str, list[float]] = {OURS: [], "insert_commit": []}
            with eng.connect() as conn:
                if kind == "sqlite":
                    settings = {"journal_mode": conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                                "synchronous": conn.exec_driver_sql("PRAGMA synchronous").scalar()}
                    conn.rollback()
                for b in range(blocks):
                    for side in ([OURS, "insert_commit"] if b % 2 == 0 else ["insert_commit", OURS]):
                        if side == OURS:
                            t0 = time.perf_counter()
                            futures = [ex.submit(jobs.noop, i) for i in range(per)]
                            ex.flush()
                            times[OURS].append(time.perf_counter() - t0)
                            wait(futures)  # untimed: the executor is idle again before the other side's block
                        else:
                            t0 = time.perf_counter()
                            for _ in range(per):
                                conn.execute(insert, {"p": payload, "t": time.time()})
                                conn.commit()
                            times["insert_commit"].append(time.perf_counter() - t0)
        finally:
            ex.shutdown(wait=True)
            procs.drop_tables(eng, [plain])
            eng.dispose()
    rate = {k: per * len(v) / sum(v) for k, v in times.items()}
    ratio = rate[OURS] / rate["insert_commit"]
    return [Row("durable", kind, f"durable_submit, {per * blocks:,} submits", "/s", rate[OURS],
                {"insert_commit": rate["insert_commit"]}, ratio, ratio_of="dbexecutor / plain INSERT+COMMIT rate",
                target=f"ratio >= {DURABLE_SHARE}", passed=ratio >= DURABLE_SHARE,
                raw={"per_block": per, "blocks": blocks, "seconds": times, "sqlite": settings,
                     "payload_bytes": len(payload), "workers": ctx.workers})]


# -- cold start -------------------------------------------------------------------------------

COLD_IMPORT_S = 0.2
COLD_FIRST_RESULT_S = {"sqlite": 0.3, "postgresql": 0.5, "mariadb": 0.5}
COLD_WORKER_S = 0.5

_IMPORT_OURS = """
import json, time
t = time.perf_counter()
import dbexecutor
print(json.dumps({"s": time.perf_counter() - t}))
"""
_IMPORT_PPE = """
import json, time
t = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
print(json.dumps({"s": time.perf_counter() - t}))
"""
_FIRST_OURS = """
import json, time
import dbexecutor, benchmarks.jobs, sqlalchemy, {driver}
from dbexecutor import DBExecutor
t = time.perf_counter()
ex = DBExecutor({url!r}, 2, prefix={prefix!r})
assert ex.submit(benchmarks.jobs.noop, 1).result() == 1
took = time.perf_counter() - t
ex.shutdown(wait=True)
print(json.dumps({{"s": took}}))
"""
_FIRST_PPE = """
import json, time
import benchmarks.jobs
from concurrent.futures import ProcessPoolExecutor
t = time.perf_counter()
ex = ProcessPoolExecutor(2)
assert ex.submit(benchmarks.jobs.noop, 1).result() == 1
took = time.perf_counter() - t
ex.shutdown(wait=True)
print(json.dumps({"s": took}))
"""


def _worker_first_job(url: str, prefix: str, sub: DBExecutor) -> dict[str, float]:
    fut = sub.submit(jobs.noop, 7)
    job_id = fut.job_id  # stored before the worker starts
    eng = procs.engine(url)
    try:
        worker = procs.Worker(url, prefix, 2)
        try:
            end = time.monotonic() + 60
            while True:
                with eng.connect() as conn:
                    done = conn.execute(text(f"SELECT finished_at FROM {prefix}jobs WHERE id = :i"),
                                        {"i": job_id}).scalar()
                if done is not None:
                    break
                if time.monotonic() > end:
                    raise TimeoutError(f"the worker did not finish job {job_id} in 60 s:\n{worker.output()[-2000:]}")
                time.sleep(0.005)
            serving = worker.wait_serving(10)
        finally:
            worker.stop()
    finally:
        eng.dispose()
    fut.result(30)
    return {"s": done - worker.started, "serving_after_s": serving - worker.started}


def coldstart(ctx: Context, kind: str) -> list[Row]:
    runs = max(1, ctx.sizes.cold_runs)
    with tables(kind) as (url, prefix):
        sub = DBExecutor(url, 1, prefix=prefix, run_jobs=False)  # creates the tables; enqueues for the worker
        try:
            measures = {
                "import/ours": lambda: procs.fresh_python(_IMPORT_OURS)["s"],
                "import/ppe": lambda: procs.fresh_python(_IMPORT_PPE)["s"],
                "first/ours": lambda: procs.fresh_python(
                    _FIRST_OURS.format(driver=_DRIVER_MODULE[kind], url=url, prefix=prefix))["s"],
                "first/ppe": lambda: procs.fresh_python(_FIRST_PPE)["s"],
                "worker": lambda: _worker_first_job(url, prefix, sub),
            }
            got = interleave(measures, lambda m: m(), runs)
        finally:
            sub.shutdown(wait=True)
    med = {k: statistics.median(v) for k, v in got.items() if k != "worker"}
    worker = statistics.median(w["s"] for w in got["worker"])
    first_limit = COLD_FIRST_RESULT_S[kind]
    return [
        Row("coldstart", kind, "import dbexecutor", "s", med["import/ours"], {"ppe": med["import/ppe"]},
            med["import/ours"] / med["import/ppe"], ratio_of="dbexecutor / import of ProcessPoolExecutor",
            target=f"<= {COLD_IMPORT_S:g} s", passed=med["import/ours"] <= COLD_IMPORT_S,
            raw={"runs": runs, "ours": got["import/ours"], "ppe": got["import/ppe"]}),
        Row("coldstart", kind, "constructor -> first result", "s", med["first/ours"], {"ppe": med["first/ppe"]},
            med["first/ours"] / med["first/ppe"], target=f"<= {first_limit:g} s", passed=med["first/ours"] <= first_limit,
            raw={"runs": runs, "ours": got["first/ours"], "ppe": got["first/ppe"],
                 "note": "fresh interpreter, dbexecutor and the driver imported first; tables exist"}),
        Row("coldstart", kind, "worker process start -> first job done", "s", worker, {}, None, ratio_of="",
            target=f"<= {COLD_WORKER_S:g} s", passed=worker <= COLD_WORKER_S,
            raw={"runs": got["worker"], "note": "python -m dbexecutor worker --max-workers 2, one job waiting; "
                 "done = the row's finished_at; serving_after_s = the worker's 'serving' log line"}),
    ]


# -- warm round trip --------------------------------------------------------------------------

ROUNDTRIP_MS = {"sqlite": 2.0, "postgresql": 4.0, "mariadb": 4.0}


def _roundtrip(ex: Any) -> tuple[float, float]:
    """(submit -> result, submit -> the job's first line), seconds."""
    t0 = time.time()
    started = ex.submit(jobs.stamp).result()
    return time.time() - t0, started - t0


def roundtrip(ctx: Context, kind: str) -> list[Row]:
    n = ctx.sizes.roundtrip_samples
    with executors(ctx, kind) as execs:
        for ex in execs.values():  # past the first few jobs: prefetch and statement caches settle
            for _ in range(5):
                _roundtrip(ex)
        samples = interleave(execs, _roundtrip, n)
    total = {k: [s[0] * 1000 for s in v] for k, v in samples.items()}
    to_start = {k: statistics.median(s[1] * 1000 for s in v) for k, v in samples.items()}
    ours, base = split(total)
    p50 = statistics.median(ours)
    b50 = {k: statistics.median(v) for k, v in base.items()}
    limit = ROUNDTRIP_MS[kind]
    return [Row("roundtrip", kind, "submit -> result, idle, p50", "ms", p50, b50, p50 / b50["ppe"] if "ppe" in b50 else None,
                target=f"<= {limit:g} ms", passed=p50 <= limit,
                raw={"samples": n, "p90_ms": percentile(ours, 0.9), "p99_ms": percentile(ours, 0.99),
                     "baselines_p99_ms": {k: percentile(v, 0.99) for k, v in base.items()},
                     "submit_to_start_p50_ms": to_start,
                     "note": "one job at a time, back to back; a sample of each executor in turn"})]


# -- timeout precision ----------------------------------------------------------------------

TIMEOUT_SLACK_S = 0.5  # issue 18: timeout=2 -> TimeoutError within 2.5 s


def _gone(pid: int, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _one_timeout(submit: Any, seconds: float, tmp: str) -> dict[str, Any]:
    pidfile = os.path.join(tmp, f"pid-{random.getrandbits(40):x}")
    t0 = time.perf_counter()
    fut = submit(pidfile)
    try:
        fut.result(seconds + 30)
        error = "none"
    except BaseException as e:  # noqa: BLE001
        error = type(e).__name__
    took = time.perf_counter() - t0
    grandchild = None
    if os.path.exists(pidfile):
        with open(pidfile) as f:
            grandchild = _gone(int(f.read()), 3.0)
    else:
        grandchild = None
    return {"s": took, "error": error, "timeout_error": isinstance(fut.exception(0), TimeoutError),
            "grandchild_killed": grandchild}


def _kills_under_load(ex: DBExecutor, kills: int, seconds: float, tmp: str) -> dict[str, Any]:
    """``kills`` timeout jobs at once while a thread keeps submitting short jobs; the gaps between their ends."""
    done_at: list[float] = []
    latency: list[tuple[float, float]] = []  # (submitted, seconds to done)
    stop = threading.Event()
    lock = threading.Lock()

    def on_done(t_sub: float, _fut: Future[Any]) -> None:
        now = time.monotonic()
        with lock:
            done_at.append(now)
            latency.append((t_sub, now - t_sub))

    def stream() -> None:
        outstanding: list[Future[Any]] = []
        while not stop.is_set():
            t_sub = time.monotonic()
            f = ex.submit(jobs.sleep, 0.01)
            f.add_done_callback(lambda fut, t_sub=t_sub: on_done(t_sub, fut))
            outstanding.append(f)
            time.sleep(0.01)
        wait(outstanding, 60)

    thread = threading.Thread(target=stream, name="bench-short-jobs")
    thread.start()
    try:
        time.sleep(0.5)
        slow = ex.options(timeout=seconds)
        t_kill = time.monotonic()
        futs = [slow.submit(jobs.sleep_tree, 60.0, os.path.join(tmp, f"many-{i}")) for i in range(kills)]
        ends = []
        for f in futs:
            try:
                f.result(seconds + 30)
            except BaseException:  # noqa: BLE001
                pass
            ends.append(time.monotonic() - t_kill)
        t_last = time.monotonic()
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(90)
    window = sorted(t for t in done_at if t_kill <= t <= t_last + 0.5)
    gaps = [b - a for a, b in zip(window, window[1:])]
    during = [lat for sub, lat in latency if t_kill <= sub <= t_last]
    grandchildren = []
    for i in range(kills):
        path = os.path.join(tmp, f"many-{i}")
        if os.path.exists(path):
            with open(path) as fh:
                grandchildren.append(_gone(int(fh.read()), 3.0))
    return {"timeouts_s": ends, "max_timeout_s": max(ends), "short_done_in_window": len(window),
            "max_gap_s": max(gaps) if gaps else None, "window_s": t_last + 0.5 - t_kill,
            "short_latency_max_s": max(during) if during else None,
            "short_latency_p50_s": statistics.median(during) if during else None,
            "errors": [type(f.exception(0)).__name__ if f.exception(0) else "none" for f in futs],
            "grandchildren_killed": grandchildren}


def timeout(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    seconds = sz.timeout_s
    limit = seconds + TIMEOUT_SLACK_S
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dbexecutor-bench-timeout-") as tmp:
        only = ("pebble",)  # the one baseline with a per-job timeout (PPE and loky have none)
        with executors(ctx, kind, only=only) as execs:
            ours_submit = execs[OURS].options(timeout=seconds)
            submitters: dict[str, Any] = {OURS: lambda p: ours_submit.submit(jobs.sleep_tree, 60.0, p)}
            if "pebble" in execs:
                pool = execs["pebble"]._pool  # type: ignore[attr-defined]
                submitters["pebble"] = lambda p: pool.schedule(jobs.sleep_tree, args=(60.0, p), timeout=seconds)
            got = interleave(submitters, lambda s: _one_timeout(s, seconds, tmp), sz.repeats)
        ours, base = split({k: statistics.median(r["s"] for r in v) for k, v in got.items()})
        rows.append(Row("timeout", kind, f"timeout={seconds:g}: submit -> TimeoutError", "s", ours, base, None,
                        ratio_of="", target=f"<= {limit:g} s",
                        passed=ours <= limit and all(r["timeout_error"] for r in got[OURS]),
                        raw={"runs": got}))
        workers = sz.timeout_kills + ctx.workers
        with tables(kind) as (url, prefix):
            ex = DBExecutor(url, workers, prefix=prefix)
            try:
                warm(ex, workers)
                many = _kills_under_load(ex, sz.timeout_kills, seconds, tmp)
            finally:
                ex.shutdown(wait=True)
        rows.append(Row("timeout", kind, f"{sz.timeout_kills} at once: slowest TimeoutError", "s",
                        many["max_timeout_s"], {}, None, ratio_of="", target=f"<= {limit:g} s",
                        passed=many["max_timeout_s"] <= limit and all(e == "JobTimeoutError" for e in many["errors"]),
                        raw={**many, "workers": workers}))
        gap = many["max_gap_s"]
        rows.append(Row("timeout", kind, "short jobs during the kills: max gap", "ms",
                        None if gap is None else gap * 1000, {}, None, ratio_of="",
                        raw={"short_done_in_window": many["short_done_in_window"],
                             "short_latency_max_ms": None if many["short_latency_max_s"] is None else many["short_latency_max_s"] * 1000}))
    return rows
