"""The scenarios: each runs dbexecutor and the baselines on the same workload, in the same run.

A scenario is ``fn(ctx, database) -> list[Row]``; one row per metric. The
baselines (``ProcessPoolExecutor``, and loky / pebble when importable) are
alive at the same time as dbexecutor and timed in turn, interleaved: one timed
run of each executor per round (the order rotates from round to round), then
the next round, and the medians are reported. Drift of a shared or noisy
machine touches every executor alike, so the ratio holds even when the
absolute numbers do not. ``benchmarks/catalog.py`` lists every scenario,
these and the ones in ``perjob.py`` and ``scaleout.py``.

What each scenario compares
---------------------------
throughput   N trivial jobs submitted one by one, then every result awaited; under ``python -m benchmarks``
             a second row does the same with a function of the program's ``__main__`` (by value for us).
             On PostgreSQL and MariaDB a row without a target gives the server's CPU a job (its
             processes on this machine, during dbexecutor's runs); the JSON adds the parent's and
             the children's.
map          ``map(noop, range(N), chunksize=1 | 64)``.
efficiency   N jobs of ``time.sleep(0.01)``: wall time against N*0.01/workers and against PPE.
dag          chain: job i takes job i-1's future as its argument (PPE: submit, ``.result()``, submit the next);
             the chain's time against PPE's loop has a target of its own (issue 18: <= 5x).
             fan-out/fan-in: a root, N jobs ``after=[root]``, a sink ``after=`` all N
             (PPE: three waves). random: N nodes, each ``after=`` up to 3 random earlier
             nodes, seeded (PPE: the same nodes in topological waves, one wave at a time).
             Each shape also runs at N/10: ``scale`` = time(N) / time(N/10) (linear is 10).
claim        ``Store.claim`` of 4 jobs against the empty table, then with waiting and done rows added.
latency      submit-to-start on an idle executor, in-process; and cross-process: this process
             submits through a DBExecutor whose only worker is kept busy, a second process
             runs a DBExecutor that only executes (target < 20 ms on every database).
memory       parent RSS growth after N completed jobs whose futures were dropped; child RSS
             over the first ``child_jobs`` of them; the bytes a finished future holds while
             the program keeps it (10,000 kept, by tracemalloc; no target).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, wait
from dataclasses import dataclass, field, fields
from typing import Any

import psutil

from dbexecutor import DBExecutor
from dbexecutor.store import Store

from . import baselines, claimcost, jobs, procs

URLS = {
    "sqlite": None,  # a fresh file per scenario
    "postgresql": os.environ.get("DBEXECUTOR_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("DBEXECUTOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}


@dataclass
class Sizes:
    """Workload sizes; ``quick()`` scales them down so all three databases run in under a minute."""

    jobs: int = 10_000  # throughput and map
    sleep_jobs: int = 400  # efficiency
    sleep_s: float = 0.01
    chain: int = 1_000
    fanout: int = 10_000
    random_dag: int = 10_000
    claim_finished: tuple[int, ...] = (0, 10_000, 1_000_000)
    claim_waiting: int = 100_000
    claims: int = 400
    claim_limit: int = 4
    latency_samples: int = 200
    cross_samples: int = 100
    memory_jobs: int = 100_000
    child_jobs: int = 10_000
    memory_batch: int = 1_000
    repeats: int = 3  # throughput, map, efficiency: at least this many interleaved rounds (a short rate cell runs until 1 s is measured), the median is reported
    dag_rounds: int = 3  # interleaved rounds of each DAG shape and size
    # perjob.py (issue 18)
    durable_jobs: int = 1_000  # durable_submit=True submits, against as many plain INSERT+COMMITs
    durable_blocks: int = 5  # the two alternate in this many blocks
    cold_runs: int = 5  # fresh interpreters per cold-start measure (median)
    roundtrip_samples: int = 200
    timeout_s: float = 2.0
    timeout_kills: int = 4  # jobs killed at once, on as many workers, while short jobs keep coming
    # scaleout.py (issues 16, 18)
    drain_jobs: int = 10_000
    drain_pgqueuer: bool = True  # PGQueuer on the same backlog (PostgreSQL, when pgqueuer and asyncpg import)
    scale_jobs: int = 1_200
    scale_sleep_s: float = 0.05
    scale_executors: int = 6
    scale_slots: int = 4
    scale_rounds: int = 3
    swarm_jobs: int = 5_000
    swarm_executors: int = 20
    swarm_rounds: int = 3
    idle_s: float = 5.0
    connection_workers: tuple[int, ...] = (2, 16)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            jobs=200, sleep_jobs=40, chain=50, fanout=200, random_dag=200,
            claim_finished=(0, 1_000, 10_000), claim_waiting=10_000, claims=30,
            latency_samples=10, cross_samples=5, memory_jobs=300, child_jobs=100, memory_batch=100,
            repeats=1, dag_rounds=1,
            durable_jobs=60, durable_blocks=3, cold_runs=1, roundtrip_samples=20, timeout_s=1.0, timeout_kills=2,
            drain_jobs=500, scale_jobs=48, scale_executors=2, scale_slots=2, scale_rounds=1,
            swarm_jobs=200, swarm_executors=4, swarm_rounds=1, idle_s=2.0, connection_workers=(2, 4),
        )

    def override(self, name: str, value: str) -> None:
        kinds = {f.name: f for f in fields(self)}
        if name not in kinds:
            raise SystemExit(f"unknown size {name!r}; known: {', '.join(kinds)}")
        current = getattr(self, name)
        if isinstance(current, tuple):
            setattr(self, name, tuple(int(v) for v in value.split(",") if v))
        elif isinstance(current, bool):
            setattr(self, name, value.lower() in ("1", "true", "yes", "on"))
        else:
            setattr(self, name, type(current)(value))


@dataclass
class Context:
    sizes: Sizes
    workers: int
    baselines: dict[str, baselines.Factory]
    seed: int = 20240605
    log: Callable[[str], None] = print


@dataclass
class Row:
    """One metric of one scenario on one database; ``ratio`` is dbexecutor over the reference named in ``ratio_of``."""

    scenario: str
    database: str
    metric: str
    unit: str  # "/s", "s", "ms", "MB", "x"
    dbexecutor: float | None
    baselines: dict[str, float | None] = field(default_factory=dict)
    ratio: float | None = None
    ratio_of: str = "dbexecutor / PPE"
    target: str = ""
    passed: bool | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# -- plumbing -----------------------------------------------------------------


@contextlib.contextmanager
def tables(kind: str) -> Iterator[tuple[str, str]]:
    """A URL and a fresh ``bench_`` table prefix, dropped afterwards (SQLite: a temporary file)."""
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    with tempfile.TemporaryDirectory(prefix="dbexecutor-bench-") as tmp:
        url = URLS[kind] or f"sqlite:///{tmp}/bench.db"
        try:
            yield url, prefix
        finally:
            store = Store(url, prefix, create=False)
            store.drop_schema()
            store.close()


@contextlib.contextmanager
def dbexecutor(kind: str, workers: int, **options: Any) -> Iterator[DBExecutor]:
    with tables(kind) as (url, prefix):
        ex = DBExecutor(url, workers, prefix=prefix, **options)
        with ex:
            warm(ex, workers)
            yield ex


def warm(ex: Executor, workers: int) -> None:
    """Every worker started and past its first job (short sleeps, so that each worker takes one)."""
    wait([ex.submit(jobs.sleep, 0.02) for _ in range(workers)])
    ex.submit(jobs.noop, 0).result()


def run_baselines(ctx: Context, fn: Callable[[Executor], Any], only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run ``fn`` on each baseline in turn (one at a time); only the memory scenario still uses this."""
    out: dict[str, Any] = {}
    for name, factory in ctx.baselines.items():
        if only is not None and name not in only:
            continue
        ex = factory(ctx.workers)
        try:
            warm(ex, ctx.workers)
            out[name] = fn(ex)
        finally:
            ex.shutdown(wait=True)
    return out


OURS = "dbexecutor"


@contextlib.contextmanager
def executors(
    ctx: Context, kind: str, workers: int | None = None, only: tuple[str, ...] | None = None, **options: Any
) -> Iterator[dict[str, Executor]]:
    """dbexecutor (key ``"dbexecutor"``) and every baseline, all alive at once and warmed."""
    workers = workers or ctx.workers
    with contextlib.ExitStack() as stack:
        out: dict[str, Executor] = {OURS: stack.enter_context(dbexecutor(kind, workers, **options))}
        for name, factory in ctx.baselines.items():
            if only is not None and name not in only:
                continue
            ex = factory(workers)
            stack.callback(ex.shutdown, wait=True)
            warm(ex, workers)
            out[name] = ex
        yield out


def interleave(
    execs: dict[str, Any], run: Callable[[Any], Any], rounds: int, *,
    min_measured: float = 0.0, max_rounds: int = 25,
) -> dict[str, list[Any]]:
    """One ``run(executor)`` of each executor per round, the order rotating each round; name -> results.

    At least ``rounds`` rounds; with ``min_measured`` (``run`` returns
    seconds), more rounds until every executor has that much measured time,
    at most ``max_rounds``. Alternating, not one block per executor, so
    that a slow minute of a shared machine falls on all of them.
    """
    names = list(execs)
    out: dict[str, list[Any]] = {n: [] for n in names}
    r = 0
    while r < max(1, rounds) or (
        min_measured and r < max_rounds and min(sum(v) for v in out.values()) < min_measured
    ):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            out[name].append(run(execs[name]))
        r += 1
    return out


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in results.items()}


def split(values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(dbexecutor's value, the baselines' values)."""
    return values[OURS], {k: v for k, v in values.items() if k != OURS}


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


# -- 1. throughput and 2. map -------------------------------------------------


_MIN_MEASURED = 1.0  # seconds: a rate cell runs its work at least this long in all (up to _MAX_RUNS runs)
_MAX_RUNS = 25

# Issue 18: one-by-one submits as a share of PPE's rate, per database.
THROUGHPUT_SHARE = {"sqlite": 1.0, "postgresql": 0.8, "mariadb": 0.7}
MAP_SHARE = 1.0  # map, chunksize 1 and 64, every database


def _rates(ctx: Context, execs: dict[str, Executor], n: int, work: Callable[[Executor], Any]) -> dict[str, list[float]]:
    # A cell of well under a second (map with chunksize 64 takes ~20-60 ms)
    # is at the mercy of one scheduling hiccup: the median of a few runs is
    # not. Three runs of 25 ms still gave PPE rates from 112k to 400k items/s
    # on one machine, so a short cell takes more rounds, for every executor alike.
    return interleave(execs, lambda ex: timed(lambda: work(ex)), ctx.sizes.repeats,
                      min_measured=_MIN_MEASURED, max_rounds=_MAX_RUNS)


def _submit_all(ex: Executor, n: int, fn: Callable[[int], int] = jobs.noop) -> None:
    futures = [ex.submit(fn, i) for i in range(n)]
    for f in futures:
        f.result()


def _map_all(ex: Executor, n: int, chunksize: int) -> None:
    assert sum(ex.map(jobs.noop, range(n), chunksize=chunksize)) == n * (n - 1) // 2


def _rate_row(
    scenario: str, kind: str, metric: str, n: int, times: dict[str, list[float]], share: float | None = None,
) -> Row:
    """A rate (``n`` / median time) against PPE's; ``share``: the target, as the least fraction of PPE's rate."""
    ours, base = split({k: n / statistics.median(v) for k, v in times.items()})
    ratio = _ratio(ours, base.get("ppe"))
    target = f"ratio >= {share:.2f}" if share is not None else ""
    passed = None if share is None or ratio is None else ratio >= share
    return Row(scenario, kind, metric, "/s", ours, base, ratio, target=target, passed=passed,
               raw={"jobs": n, "runs": len(times[OURS]), "interleaved": True, "seconds": times})


def script_function() -> Callable[[int], int] | None:
    """The no-op job function of the program's ``__main__`` (``python -m benchmarks``), or None when run otherwise.

    A user's script defines its job functions there: dbexecutor pickles
    them by value, the baselines by reference (their children are forks of,
    or re-import, the same script).
    """
    fn = getattr(sys.modules.get("__main__"), "script_noop", None)
    return fn if callable(fn) and getattr(fn, "__module__", None) == "__main__" else None


def throughput(ctx: Context, kind: str) -> list[Row]:
    n = ctx.sizes.jobs
    script_fn = script_function()
    with executors(ctx, kind) as execs:
        cpu: list[dict[str, float]] = []  # dbexecutor's runs: CPU seconds a job, by process group

        def submit_all(ex: Executor) -> None:
            if ex is not execs[OURS]:
                return _submit_all(ex, n)
            before = procs.cpu_seconds(kind)
            _submit_all(ex, n)
            after = procs.cpu_seconds(kind)
            cpu.append({k: (after[k] - before[k]) / n for k in after})

        times = _rates(ctx, execs, n, submit_all)
        rows = [_rate_row("throughput", kind, f"{n:,} submits", n, times, THROUGHPUT_SHARE[kind])]
        if kind != "sqlite":  # no server: SQLite's work is the parent's
            rows.append(_cpu_row(kind, n, cpu))
        if script_fn is not None:
            times = _rates(ctx, execs, n, lambda ex: _submit_all(ex, n, script_fn))
            rows.append(_rate_row("throughput", kind, f"{n:,} submits, a function of __main__", n, times, THROUGHPUT_SHARE[kind]))
    return rows


def _cpu_row(kind: str, n: int, cpu: list[dict[str, float]]) -> Row:
    """CPU a job of dbexecutor's throughput runs (medians): the database server's (the figure), this process's, its children's.

    No target: what a fleet sharing one server can do is bounded by the
    server's work a job, which a rate on one machine hides (the rate follows
    the busiest process).
    """
    med = {k: statistics.median(c[k] for c in cpu) * 1e6 for k in ("parent", "children", "server")}
    return Row("throughput", kind, f"{n:,} submits: CPU a job, database server", "µs",
               med["server"], ratio_of="",
               raw={"unit": "µs of CPU a job (user + system), median of dbexecutor's runs", "median": med,
                    "runs": [{k: v * 1e6 for k, v in c.items()} for c in cpu]})


def map_scenario(ctx: Context, kind: str) -> list[Row]:
    n = ctx.sizes.jobs
    rows = []
    with executors(ctx, kind) as execs:
        for c in (1, 64):
            times = _rates(ctx, execs, n, lambda ex: _map_all(ex, n, c))
            rows.append(_rate_row("map", kind, f"map {n:,}, chunksize {c}", n, times, MAP_SHARE))
    return rows


# -- 3. efficiency ------------------------------------------------------------


def _sleepers(ex: Executor, n: int, seconds: float) -> float:
    return timed(lambda: wait([ex.submit(jobs.sleep, seconds) for _ in range(n)]))


def efficiency(ctx: Context, kind: str) -> list[Row]:
    n, s = ctx.sizes.sleep_jobs, ctx.sizes.sleep_s
    ideal = n * s / ctx.workers
    with executors(ctx, kind) as execs:
        walls = interleave(execs, lambda ex: _sleepers(ex, n, s), ctx.sizes.repeats)
    ours, base = split(medians(walls))
    ratio = _ratio(ours, base.get("ppe"))
    return [
        Row("efficiency", kind, f"{n} x {s * 1000:g} ms, wall", "s", ours, base, ratio, target="ratio <= 1.10",
            passed=None if ratio is None else ratio <= 1.10,
            raw={"jobs": n, "sleep_s": s, "ideal_s": ideal, "over_ideal": ours / ideal,
                 "baselines_over_ideal": {k: v / ideal for k, v in base.items()}, "walls": walls}),
    ]


# -- 4. DAGs ------------------------------------------------------------------


def _random_deps(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [sorted(rng.sample(range(i), rng.randint(0, min(3, i)))) for i in range(n)]


def _waves(deps: list[list[int]]) -> list[list[int]]:
    level: list[int] = []
    for d in deps:
        level.append(1 + max((level[x] for x in d), default=-1))
    waves: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for i, lv in enumerate(level):
        waves[lv].append(i)
    return waves


def _chain_ours(ex: Executor, n: int) -> None:
    f = ex.submit(jobs.inc, 0)
    for _ in range(n - 1):
        f = ex.submit(jobs.inc, f)
    assert f.result() == n


def _chain_base(ex: Executor, n: int) -> None:
    v = 0
    for _ in range(n):
        v = ex.submit(jobs.inc, v).result()
    assert v == n


def _fan_ours(ex: DBExecutor, n: int) -> None:
    root = ex.submit(jobs.noop, 0)
    middle = [ex.submit(jobs.noop, i, after=[root]) for i in range(n)]
    ex.submit(jobs.noop, -1, after=middle).result()


def _fan_base(ex: Executor, n: int) -> None:
    ex.submit(jobs.noop, 0).result()
    wait([ex.submit(jobs.noop, i) for i in range(n)])
    ex.submit(jobs.noop, -1).result()


def _random_ours(ex: DBExecutor, deps: list[list[int]]) -> None:
    futures: list[Any] = []
    for i, d in enumerate(deps):
        futures.append(ex.submit(jobs.noop, i, after=[futures[x] for x in d]))
    done, _ = wait(futures)
    assert all(f.exception() is None for f in done)


def _random_base(ex: Executor, deps: list[list[int]]) -> None:
    for wave in _waves(deps):
        wait([ex.submit(jobs.noop, i) for i in wave])


CHAIN_VS_PPE = 5.0  # issue 18: the chain of dependent jobs takes at most 5x PPE's submit-result-submit loop


def dag(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    shapes: list[tuple[str, int, Callable[[Any, int], None], Callable[[Any, int], None]]] = [
        ("chain", sz.chain, _chain_ours, _chain_base),
        ("fan-out/fan-in", sz.fanout, _fan_ours, _fan_base),
        ("random", sz.random_dag, lambda ex, n: _random_ours(ex, _random_deps(n, ctx.seed)),
         lambda ex, n: _random_base(ex, _random_deps(n, ctx.seed))),
    ]
    measured: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    with executors(ctx, kind) as execs:
        for name, n, ours_fn, base_fn in shapes:
            def run(ex: Executor, size: int, ours_fn: Any = ours_fn, base_fn: Any = base_fn) -> float:
                fn = ours_fn if isinstance(ex, DBExecutor) else base_fn
                return timed(lambda: fn(ex, size))

            small = medians(interleave(execs, lambda ex: run(ex, max(1, n // 10)), sz.dag_rounds))
            big = medians(interleave(execs, lambda ex: run(ex, n), sz.dag_rounds))
            measured[name] = (big, small)
    rows = []
    for name, n, _, _ in shapes:
        big_all, small_all = measured[name]
        big, b = split(big_all)
        small, _ = split(small_all)
        waves = len(_waves(_random_deps(n, ctx.seed))) if name == "random" else None
        raw: dict[str, Any] = {"n": n, "time_n": big, "time_n_10": small, "rounds": sz.dag_rounds, "interleaved": True,
                               "baselines": {k: {"time_n": big_all[k], "time_n_10": small_all[k]} for k in b}}
        if waves is not None:
            raw["waves"] = waves
        ratio = _ratio(big, b.get("ppe"))
        chain = name == "chain"
        rows.append(Row("dag", kind, f"{name} {n:,}: time", "s", big, b, ratio, raw=raw,
                        target=f"ratio <= {CHAIN_VS_PPE:g}" if chain else "",
                        passed=(ratio is not None and ratio <= CHAIN_VS_PPE) if chain else None))
        scale = big / small
        rows.append(Row("dag", kind, f"{name} {n:,}: t(N)/t(N/10)", "x", scale,
                        {k: big_all[k] / small_all[k] for k in b}, None, ratio_of="",
                        target="<= 12", passed=scale <= 12))
    return rows


# -- 5. claim cost ------------------------------------------------------------


def claim(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    rows: list[Row] = []
    # A second table that stays empty (its 32 ready rows only) is the reference:
    # each stage's claims alternate with claims on it, so the ratio compares
    # two samples taken under the same machine load.
    with tables(kind) as (url, prefix), tables(kind) as (ref_url, ref_prefix):
        store = Store(url, prefix)
        reference = Store(ref_url, ref_prefix)
        try:
            now = time.time()
            claimcost.reset_ready(reference, 8 * sz.claim_limit, now)
            claimcost.analyze(reference)
            have_done = 0
            have_waiting = 0
            fill_s = 0.0
            for label, finished, waiting in claimcost.stages(list(sz.claim_finished), sz.claim_waiting):
                if waiting > have_waiting:
                    fill_s += claimcost.fill(store, "waiting", waiting - have_waiting, now)
                    have_waiting = waiting
                if finished > have_done:
                    took = claimcost.fill(store, "done", finished - have_done, now)
                    fill_s += took
                    ctx.log(f"    claim/{kind}: filled {finished - have_done:,} done rows in {took:.1f} s")
                    have_done = finished
                claimcost.reset_ready(store, 8 * sz.claim_limit, now)
                claimcost.analyze(store)
                here, there = claimcost.interleaved(store, reference, sz.claims, sz.claim_limit)
                q = claimcost.quantiles([t for block in here for t in block])
                ref = claimcost.quantiles([t for block in there for t in block])
                p50 = q["p50"] * 1000
                ratio = q["p50"] / ref["p50"]
                is_empty = label == "empty"
                rows.append(Row(
                    "claim", kind, f"claim {sz.claim_limit}, {label}", "ms", p50, {}, ratio,
                    ratio_of="p50 / p50 on an empty table, claims interleaved",
                    target="" if is_empty else "ratio <= 1.2",
                    passed=None if is_empty else ratio <= 1.2,
                    raw={"finished": finished, "waiting": waiting, "claims": sz.claims,
                         **{k: v * 1000 for k, v in q.items()}, "p90_ms": q["p90"] * 1000,
                         "empty_table_ms": {k: v * 1000 for k, v in ref.items()},
                         "block_p50_ms": [[statistics.median(x) * 1000, statistics.median(y) * 1000]
                                          for x, y in zip(here, there)],
                         "plan": store.explain_claim(sz.claim_limit), "fill_s_so_far": fill_s,
                         "states": store.count_states()},
                ))
        finally:
            store.close()
            reference.close()
    return rows


# -- 6. latency ---------------------------------------------------------------


def _pause(rng: random.Random, spacing: float, jitter: float) -> None:
    # A random pause: a fixed one phase-locks the samples to the executor's poll clock.
    time.sleep(spacing + rng.random() * jitter)


def _latency_sample(ex: Executor) -> float:
    """Seconds from just before ``submit`` to the job's first line."""
    t0 = time.time()
    started = ex.submit(jobs.stamp).result()
    return started - t0


def _latencies(execs: dict[str, Executor], samples: int, spacing: float) -> dict[str, list[float]]:
    """One job at a time on idle executors, one sample of each executor in turn, random pauses between."""
    rng = random.Random(1)

    def one(ex: Executor) -> float:
        _pause(rng, spacing, spacing)
        return _latency_sample(ex)

    return interleave(execs, one, samples)


def _latency_row(kind: str, metric: str, ours: list[float], base: dict[str, list[float]], limit_ms: float | None,
                 note: str) -> list[Row]:
    rows = []
    for q in (0.5, 0.99):
        mine = percentile(ours, q) * 1000
        b = {k: percentile(v, q) * 1000 for k, v in base.items()}
        target = f"< {limit_ms:g} ms" if limit_ms is not None and q == 0.5 else ""
        passed = None if not target else mine < limit_ms  # type: ignore[operator]
        rows.append(Row("latency", kind, f"{metric} p{int(q * 100)}", "ms", mine, b, _ratio(mine, b.get("ppe")),
                        target=target, passed=passed,
                        raw={"samples": len(ours), "note": note, "mean_ms": statistics.fmean(ours) * 1000,
                             "max_ms": max(ours) * 1000} if q == 0.5 else {}))
    return rows


def _runner_main(url: str, prefix: str, workers: int, queue: str, ready: Any, stop: Any) -> None:
    """The executing side of the cross-process latency: a DBExecutor that submits nothing and runs what it finds."""
    # It serves the submitter's queue: a spawned process has no program of its own to
    # name one after, and on its own would serve only "default".
    ex = DBExecutor(url, workers, prefix=prefix, queues=(queue, "default"))
    ready.set()
    stop.wait(600)
    ex.shutdown(wait=True)


def _cross_process(kind: str, workers: int, samples: int, spacing: float) -> list[float]:
    with tables(kind) as (url, prefix), tempfile.TemporaryDirectory() as tmp:
        release = os.path.join(tmp, "release")
        # This process only submits: its one worker is held by a job that waits for a file. Its
        # fast poll only makes it see the results sooner; the runner keeps the library's defaults.
        ex = DBExecutor(url, 1, prefix=prefix, poll_interval=0.02)
        runner = None
        ctx = multiprocessing.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        try:
            blocker = ex.submit(jobs.wait_for_file, release, 600.0)
            while not blocker.running():
                time.sleep(0.01)
            runner = ctx.Process(
                target=_runner_main, args=(url, prefix, workers, ex.queue, ready, stop), name="bench-runner"
            )
            runner.start()
            if not ready.wait(60):
                raise RuntimeError("the runner process did not start")
            warmup = [ex.submit(jobs.stamp) for _ in range(workers)]  # the runner's children start on these
            done, _ = wait(warmup, timeout=60)
            if len(done) < len(warmup):  # else every sample would wait for the blocker, not time a pickup
                raise RuntimeError("the runner process does not run the submitted jobs")
            out = []
            rng = random.Random(1)
            for _ in range(samples):
                _pause(rng, spacing, 0.25)  # beyond the runner's 0.2 s poll interval
                t0 = time.time()
                started = ex.submit(jobs.stamp).result()
                out.append(started - t0)
            return out
        finally:
            open(release, "w").close()
            stop.set()
            if runner is not None:
                runner.join(60)
            ex.shutdown(wait=True)


CROSS_PROCESS_MS = 20.0  # issue 18: cross-process submit-to-start p50, every database


def latency(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    spacing = 0.02
    with executors(ctx, kind) as execs:
        samples = _latencies(execs, sz.latency_samples, spacing)
    ours, base = split(samples)
    rows = _latency_row(kind, "in-process", ours, base, 5.0,
                        "submit() to the job's first line, idle executor; samples of every executor interleaved")
    if sz.cross_samples:
        cross = _cross_process(kind, ctx.workers, sz.cross_samples, spacing)
        rows += _latency_row(
            kind, "cross-process", cross, {}, CROSS_PROCESS_MS,
            "submitted by a DBExecutor whose worker is busy, run by a DBExecutor in another process",
        )
        for r in rows[-2:]:
            r.ratio, r.ratio_of = None, ""
    return rows


# -- 7. memory ----------------------------------------------------------------


def worker_rss() -> dict[int, int]:
    """RSS of this process's worker processes (not the forkserver or the resource tracker)."""
    me = psutil.Process()
    out = {}
    for p in me.children(recursive=True):
        try:
            if p.ppid() == me.pid:
                cmd = " ".join(p.cmdline())
                if "forkserver" in cmd or "resource_tracker" in cmd:
                    continue
            out[p.pid] = p.memory_info().rss
        except psutil.Error:
            pass
    return out


def _memory(ex: Executor, total: int, batch: int, child_jobs: int) -> dict[str, Any]:
    me = psutil.Process()

    def run(n: int) -> None:
        futures = [ex.submit(jobs.noop, i) for i in range(n)]
        wait(futures)
        del futures

    run(batch)  # warm: caches, compiled statements, a first batch of futures come and go
    gc.collect()
    parent0, child0 = me.memory_info().rss, worker_rss()
    child1: dict[int, int] | None = None
    done = 0
    while done < total:
        run(min(batch, total - done))
        done += min(batch, total - done)
        if child1 is None and done >= child_jobs:
            child1 = worker_rss()
    gc.collect()
    parent1 = me.memory_info().rss
    child1 = child1 or worker_rss()
    same = sorted(set(child0) & set(child1))
    growth = [child1[p] - child0[p] for p in same]
    mb = 1024 * 1024
    return {
        "parent_start_mb": parent0 / mb,
        "parent_end_mb": parent1 / mb,
        "parent_growth_mb": (parent1 - parent0) / mb,
        "child_start_mb": [child0[p] / mb for p in same],
        "child_end_mb": [child1[p] / mb for p in same],
        "child_growth_mb": max(growth) / mb if growth else None,
        "children_replaced": sorted(set(child0) ^ set(child1)),
    }


def _held_bytes(ex: Executor, n: int) -> float:
    """Bytes a finished future holds while the program keeps it (with its result), by tracemalloc.

    What dropping ``n`` finished futures gives back, over ``n``: a program
    that keeps what it submitted (``wait`` on a list of futures) holds this
    much a job until it lets go.
    """
    warm = [ex.submit(jobs.noop, i) for i in range(min(n, 100))]
    wait(warm)
    del warm
    tracemalloc.start()
    try:
        futures = [ex.submit(jobs.noop, i) for i in range(n)]
        wait(futures)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del futures
        gc.collect()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return freed / n


HELD_FUTURES = 10_000


def memory(ctx: Context, kind: str) -> list[Row]:
    sz = ctx.sizes
    held_n = min(HELD_FUTURES, sz.memory_jobs)
    # Only ProcessPoolExecutor here: loky and pebble add minutes to a full run and nothing to the question.
    base = run_baselines(ctx, lambda ex: _memory(ex, sz.memory_jobs, sz.memory_batch, sz.child_jobs), only=("ppe",))
    base_held = run_baselines(ctx, lambda ex: _held_bytes(ex, held_n), only=("ppe",))
    with dbexecutor(kind, ctx.workers) as ex:
        ours = _memory(ex, sz.memory_jobs, sz.memory_batch, sz.child_jobs)
        held = _held_bytes(ex, held_n)
    return [
        Row("memory", kind, f"parent RSS growth, {sz.memory_jobs:,} jobs", "MB", ours["parent_growth_mb"],
            {k: v["parent_growth_mb"] for k, v in base.items()}, None, ratio_of="",
            target="< 20 MB", passed=ours["parent_growth_mb"] < 20, raw={"dbexecutor": ours, "baselines": base}),
        Row("memory", kind, f"child RSS growth, {sz.child_jobs:,} jobs", "MB", ours["child_growth_mb"],
            {k: v["child_growth_mb"] for k, v in base.items()}, None, ratio_of="",
            raw={"child_start_mb": ours["child_start_mb"], "child_end_mb": ours["child_end_mb"]}),
        Row("memory", kind, f"{held_n:,} finished futures kept: bytes a future", "B", held, dict(base_held),
            None, ratio_of="", raw={"futures": held_n, "result": "int (noop)"}),
    ]
